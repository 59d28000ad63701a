"""``sqlsink metrics`` against a real PostgreSQL: the exposition of committed batches and
of leftovers, totals that retention does not lower, bounded scrapes that fail without
stopping the server, ``--once``, and a real Prometheus server (Debian's, started by
``tests/fix_prometheus.py``) scraping the exporter while batches commit, queried through
its HTTP API.

Batches are committed by the sink's own committer (``tests/pg/protocol.py``'s
``Writer``: the tasks and the commit Spark would call), in a database of the test's
own so that the exposition holds the test's sinks only.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import sys
from collections.abc import Iterator

import psycopg
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from psycopg import sql

from sqlsink import cli
from sqlsink.cli.metrics import Exporter
from sqlsink.cli.output import Output
from sqlsink.core.gid import Gid
from sqlsink.core.model import NewDecision
from sqlsink.postgres import commit_log, retention
from sqlsink.postgres.schema import ensure_schema
from tests.fix_pg import PgServer
from tests.fix_prometheus import exporter, prometheus, stop
from tests.pg.protocol import Writer, make_table, prepare_by_hand

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@pytest.fixture
def log_url(pg_server: PgServer) -> Iterator[str]:
    """A database of the test's own with the commit log and a table ``t``; whatever the
    test leaves prepared there is rolled back before it is dropped."""
    with pg_server.database("metrics") as url:
        make_table(url, "t")
        try:
            yield url
        finally:
            with psycopg.connect(url, autocommit=True) as conn:
                gids = conn.execute(
                    "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()"
                ).fetchall()
                for (gid,) in gids:
                    conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid)))


def parse(text: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


class Scraper:
    """The exporter's collector in this process, scraped as Prometheus scrapes it."""

    def __init__(self, url: str, timeout_s: float = 5.0) -> None:
        self.errors: list[str] = []
        out = Output(False, url, sys.stdout, _Lines(self.errors))
        self.exporter = Exporter(url, None, timeout_s, out)
        self.registry = CollectorRegistry()
        self.registry.register(self.exporter)

    def scrape(self) -> Samples:
        return parse(generate_latest(self.registry).decode())


class _Lines:
    """A stderr that keeps what was written."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines

    def write(self, text: str) -> int:
        self.lines.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def of(samples: Samples, name: str, sink: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"sink": sink, **labels}.items())))]


def test_the_exposition_of_a_sinks_committed_batches(log_url: str) -> None:
    writer = Writer(log_url, "t", "orders", query_id="q1")
    writer.batch(0, range(0, 3), range(3, 10))
    writer.batch(1, range(10, 15))
    got = Scraper(log_url).scrape()
    assert got[("sqlsink_up", ())] == 1
    assert of(got, "sqlsink_batches_committed_total", "orders") == 2
    assert of(got, "sqlsink_rows_committed_total", "orders") == 15
    assert of(got, "sqlsink_last_batch_id", "orders") == 1
    assert of(got, "sqlsink_last_batch_rows", "orders") == 5
    assert 0 <= of(got, "sqlsink_last_batch_age_seconds", "orders") < 60
    # the histograms, from the per-batch figures: a commit per batch, a write per partition
    for name, count in (
        ("sqlsink_commit_seconds", 2),
        ("sqlsink_partition_write_seconds", 3),
        ("sqlsink_prepare_to_decision_seconds", 2),
    ):
        assert of(got, f"{name}_count", "orders") == count
        assert of(got, f"{name}_bucket", "orders", le="+Inf") == count
        assert of(got, f"{name}_sum", "orders") > 0
    for name in (
        "sqlsink_prepared_transactions",
        "sqlsink_prepared_oldest_age_seconds",
        "sqlsink_stranded_transactions",
        "sqlsink_incomplete_batches",
        "sqlsink_lost_transactions",
        "sqlsink_checkpoint_lost_batches",
    ):
        assert of(got, name, "orders") == 0, name
    assert of(got, "sqlsink_live_runs", "orders") == 1
    assert of(got, "sqlsink_run_timeout_seconds", "orders") == 300  # runTimeout's default


def test_retention_does_not_lower_the_totals(log_url: str) -> None:
    writer = Writer(log_url, "t", "orders", query_id="q1")
    writer.batch(0, range(0, 4))
    writer.batch(1, range(4, 6))
    scraper = Scraper(log_url)
    assert of(scraper.scrape(), "sqlsink_rows_committed_total", "orders") == 6
    with psycopg.connect(log_url, autocommit=True) as conn:
        assert retention.prune_decisions(conn, "orders", 0) == 1  # type: ignore[arg-type]
    writer.batch(2, range(6, 9))
    got = scraper.scrape()
    assert of(got, "sqlsink_batches_committed_total", "orders") == 3
    assert of(got, "sqlsink_rows_committed_total", "orders") == 9
    assert of(got, "sqlsink_commit_seconds_count", "orders") == 3
    # a new exporter counts what the log still holds: Prometheus sees a counter reset
    fresh = Scraper(log_url).scrape()
    assert of(fresh, "sqlsink_batches_committed_total", "orders") == 2
    assert of(fresh, "sqlsink_rows_committed_total", "orders") == 5


def test_leftovers_stranded_incomplete_and_lost(log_url: str) -> None:
    # stranded: prepared by a run the log does not know, which nobody but recover finishes
    prepare_by_hand(log_url, "t", Gid("gone", 0, 0, "run-unknown", 1), range(100, 102))
    # incomplete: decided, its transaction still prepared, its run live
    live = Writer(log_url, "t", "live", query_id="q-live")
    live.batch(0, range(0, 2))
    outcome = live.write(1, range(2, 5))
    assert outcome.gid is not None
    # lost: decided, then rolled back by someone: neither prepared nor committed
    lossy = Writer(log_url, "t", "lossy", query_id="q-lossy")
    rolled = lossy.write(0, range(10, 12))
    assert rolled.gid is not None
    with psycopg.connect(log_url, autocommit=True) as conn:
        commit_log.insert_decision(
            conn,  # type: ignore[arg-type]
            NewDecision("live", 1, (outcome.gid,), 3, "q-live", live.run),
        )
        commit_log.insert_decision(
            conn,  # type: ignore[arg-type]
            NewDecision("lossy", 0, (rolled.gid,), 2, "q-lossy", lossy.run),
        )
        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(rolled.gid)))
    got = Scraper(log_url).scrape()
    assert of(got, "sqlsink_prepared_transactions", "gone") == 1
    assert of(got, "sqlsink_stranded_transactions", "gone") == 1
    assert of(got, "sqlsink_prepared_oldest_age_seconds", "gone") >= 0
    assert ("sqlsink_last_batch_id", (("sink", "gone"),)) not in got  # no decision yet
    assert of(got, "sqlsink_prepared_transactions", "live") == 1
    assert of(got, "sqlsink_stranded_transactions", "live") == 0
    assert of(got, "sqlsink_incomplete_batches", "live") == 1
    assert of(got, "sqlsink_incomplete_oldest_age_seconds", "live") >= 0
    assert of(got, "sqlsink_batches_committed_total", "live") == 2
    assert of(got, "sqlsink_lost_transactions", "lossy") == 1
    assert of(got, "sqlsink_lost_transactions", "live") == 0
    assert of(got, "sqlsink_incomplete_batches", "lossy") == 1


def test_a_scrape_is_bounded_and_a_failed_one_serves_up_0(log_url: str) -> None:
    writer = Writer(log_url, "t", "orders", query_id="q1")
    writer.batch(0, range(0, 4))
    scraper = Scraper(log_url, timeout_s=0.5)
    assert scraper.scrape()[("sqlsink_up", ())] == 1
    with psycopg.connect(log_url) as blocker:  # a lock the scrape's reads wait for
        blocker.execute("LOCK TABLE sqlsink.decisions IN ACCESS EXCLUSIVE MODE")
        got = scraper.scrape()
        blocker.rollback()
    assert got[("sqlsink_up", ())] == 0
    assert "sqlsink_rows_committed_total" not in {name for name, _ in got}
    error = "".join(scraper.errors)
    assert "scrape failed" in error and "--query-timeout (0.5s)" in error
    again = scraper.scrape()  # a new connection, and the totals kept
    assert again[("sqlsink_up", ())] == 1
    assert of(again, "sqlsink_rows_committed_total", "orders") == 4
    assert "readable again" in "".join(scraper.errors)


def test_the_server_keeps_serving_while_the_database_is_unreachable() -> None:
    with socket_closed() as port:
        url = f"postgresql://sink:s3cret-pw@127.0.0.1:{port}/nowhere?connect_timeout=2"
        with exporter(url) as served:
            for _ in range(2):
                got = parse(served.get())
                assert got[("sqlsink_up", ())] == 0
            assert stop(served.process) == 0  # SIGTERM: a clean stop
            err = served.stderr()
    assert "scrape failed" in err and "stopped" in err
    assert "s3cret-pw" not in err and "sink:***@" in err  # the URL shown redacted


def test_ctrl_c_stops_the_server_cleanly(log_url: str) -> None:
    with exporter(log_url) as served:
        assert parse(served.get())[("sqlsink_up", ())] == 1
        served.process.send_signal(signal.SIGINT)
        # about 0.6 s here; once over 10 s with three test processes on two cores
        assert served.process.wait(30) == 0
        assert "stopped" in served.stderr()


def test_once_prints_one_exposition(log_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    Writer(log_url, "t", "orders", query_id="q1").batch(0, range(0, 7))
    assert cli.main(["metrics", "--url", log_url, "--once"]) == 0
    got = parse(capsys.readouterr().out)
    assert of(got, "sqlsink_rows_committed_total", "orders") == 7


def test_once_without_the_commit_log_fails_with_up_0(
    pg_server: PgServer, capsys: pytest.CaptureFixture[str]
) -> None:
    with pg_server.database("metrics_bare") as url:
        assert cli.main(["metrics", "--url", url, "--once"]) == 2
    captured = capsys.readouterr()
    assert parse(captured.out)[("sqlsink_up", ())] == 0
    assert "the sqlsink schema (the commit log) is not installed" in captured.err


def test_the_commit_log_of_an_older_schema_without_figures(log_url: str) -> None:
    """A decision without figures (written before schema 9): counted, its commit timed
    from commit_ms, no partition writes."""
    writer = Writer(log_url, "t", "old", query_id="q1")
    writer.batch(0, range(0, 3))
    with psycopg.connect(log_url, autocommit=True) as conn:
        ensure_schema(conn)  # type: ignore[arg-type]
        conn.execute("UPDATE sqlsink.decisions SET figures = NULL WHERE sink_id = 'old'")
    got = Scraper(log_url).scrape()
    assert of(got, "sqlsink_rows_committed_total", "old") == 3
    assert of(got, "sqlsink_commit_seconds_count", "old") == 1
    assert of(got, "sqlsink_partition_write_seconds_count", "old") == 0


@contextlib.contextmanager
def socket_closed() -> Iterator[int]:
    """A port nothing listens on (bound, not listening, while the test runs)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        yield int(sock.getsockname()[1])
    finally:
        sock.close()


# -- a real Prometheus scraping the exporter ----------------------------------------------


def test_prometheus_scrapes_the_rows_committed_while_the_sink_commits(log_url: str) -> None:
    writer = Writer(log_url, "t", "orders", query_id="q1")
    writer.batch(0, range(0, 5), range(5, 12))
    rows = 'sqlsink_rows_committed_total{job="sqlsink", sink="orders"}'
    with exporter(log_url) as served, prometheus(f"127.0.0.1:{served.port}") as server:
        server.wait_for_value('up{job="sqlsink"}', 1)  # the target scraped, and up
        server.wait_for_value("sqlsink_up", 1)
        server.wait_for_value(rows, 12)
        for batch in range(1, 4):  # batches go on committing while Prometheus scrapes
            writer.batch(batch, range(100 * batch, 100 * batch + 3 * batch))
        server.wait_for_value(rows, 12 + 3 + 6 + 9)
        server.wait_for_value('sqlsink_batches_committed_total{sink="orders"}', 4)
        server.wait_for_value('sqlsink_commit_seconds_count{sink="orders"}', 4)
        median = server.query(
            'histogram_quantile(0.5, sum by (le) (sqlsink_commit_seconds_bucket{sink="orders"}))'
        )
        assert len(median) == 1 and 0 < median[0][1] < 60
        assert server.target_health() == "up"
