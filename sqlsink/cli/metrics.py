"""``sqlsink metrics``: the commit log's figures for Prometheus, read at each scrape.

``--listen HOST:PORT`` serves the Prometheus text format (and OpenMetrics, when the
scraper asks for it) on ``/metrics``; ``--once`` prints one exposition on stdout. Each
scrape reads the log through ``metrics_survey.read`` on one connection kept open
between scrapes (reopened after a failure), every statement bounded by
``--query-timeout``. A scrape that fails says so on stderr and serves ``sqlsink_up 0``;
the server keeps running. No background polling: an idle exporter runs no query.

Every series is named ``sqlsink_...`` with its unit in the name; the per-sink ones carry
one label, ``sink``. ``METRICS`` lists them (docs/alerts.md and the Grafana dashboard in
docs/grafana/ use only these). Dead letters (issue 29) are not built yet: no series.

``prometheus_client`` is the optional extra ``sqlsink[metrics]``: imported here only
when the command runs, so the other commands work without it.
"""

from __future__ import annotations

import argparse
import signal
import threading
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlsink.backends import open_database
from sqlsink.cli.connect import open_connection, require_schema
from sqlsink.cli.contract import Envelope
from sqlsink.cli.metrics_survey import Histogram, Reading, SinkReading, Totals, read
from sqlsink.cli.output import EXIT_ERROR, EXIT_OK, CliError, Output
from sqlsink.core.admin import AdminSession, DriverFault
from sqlsink.errors import ConfigError, SqlsinkError
from sqlsink.options import parse_duration

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

# The Prometheus project's list of default ports has no free one left in 9100-9999;
# 9187 is postgres_exporter's, which often runs beside a PostgreSQL: take the next one.
DEFAULT_LISTEN = "127.0.0.1:9188"
INSTALL_FIX = "pip install 'sqlsink[metrics]' (or: pip install prometheus_client)"


@dataclass(frozen=True)
class Series:
    name: str  # as exposed; a counter's samples add _total, a histogram's _bucket/_sum/_count
    kind: str  # gauge | counter | histogram
    help: str


METRICS = (
    Series("sqlsink_up", "gauge", "1 if this scrape read the commit log, 0 if it failed"),
    Series("sqlsink_scrape_duration_seconds", "gauge", "time this scrape spent reading the log"),
    Series(
        "sqlsink_batches_committed",
        "counter",
        "batches decided (committed) since the exporter started, plus the decisions the "
        "log held then",
    ),
    Series("sqlsink_rows_committed", "counter", "rows of those batches"),
    Series(
        "sqlsink_dead_letters",
        "counter",
        "rows those batches sent to their dead-letter table (deadLetterTable), counted with "
        "the batch's figures",
    ),
    Series("sqlsink_last_batch_id", "gauge", "the highest batch with a decision"),
    Series(
        "sqlsink_last_batch_age_seconds",
        "gauge",
        "seconds since the newest decision was written (server clock)",
    ),
    Series("sqlsink_last_batch_rows", "gauge", "rows of the newest decided batch"),
    Series(
        "sqlsink_commit_seconds",
        "histogram",
        "a batch's commit: the commits of its prepared transactions and its completion "
        "(the figures' commit_ms)",
    ),
    Series(
        "sqlsink_partition_write_seconds",
        "histogram",
        "a partition's write, from its first row to its PREPARE (the figures' write_ms)",
    ),
    Series(
        "sqlsink_prepare_to_decision_seconds",
        "histogram",
        "from a batch's last PREPARE to its decision written",
    ),
    Series(
        "sqlsink_prepared_transactions",
        "gauge",
        "the sink's prepared transactions open in this database",
    ),
    Series(
        "sqlsink_prepared_oldest_age_seconds",
        "gauge",
        "age of the sink's oldest prepared transaction (0 when none)",
    ),
    Series(
        "sqlsink_stranded_transactions",
        "gauge",
        "prepared transactions no live run will finish: sqlsink recover does",
    ),
    Series(
        "sqlsink_incomplete_batches",
        "gauge",
        "decided batches not yet known committed in every partition",
    ),
    Series(
        "sqlsink_incomplete_oldest_age_seconds",
        "gauge",
        "seconds since the oldest incomplete batch was decided (0 when none)",
    ),
    Series(
        "sqlsink_lost_transactions",
        "gauge",
        "data loss: decided transactions neither prepared nor committed",
    ),
    Series(
        "sqlsink_checkpoint_lost_batches",
        "gauge",
        "data loss: batches Spark's checkpoint records as committed that the log lacks",
    ),
    Series("sqlsink_live_runs", "gauge", "runs heard from within their timeout"),
    Series(
        "sqlsink_run_timeout_seconds",
        "gauge",
        "the newest live run's timeout (else the newest run's): past it, a silent run is dead",
    ),
)


def exposed_names() -> set[str]:
    """Every sample name the exporter can expose (what a PromQL expression may name)."""
    suffixes = {"gauge": ("",), "counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    return {s.name + x for s in METRICS for x in suffixes[s.kind]}


# -- arguments (parser.py's metrics subcommand) -------------------------------------------


def listen_address(text: str) -> tuple[str, int]:
    """HOST:PORT, [IPV6]:PORT or :PORT (every interface); port 0 takes a free one."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. {DEFAULT_LISTEN})")
    host = host.removeprefix("[").removesuffix("]") or "0.0.0.0"
    return host, int(port)


def query_timeout(text: str) -> float:
    try:
        seconds = parse_duration("query-timeout", text)
    except ConfigError:
        seconds = 0.0
    if seconds < 0.001:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration (e.g. 5s, 500ms)")
    return seconds


# -- the collector ------------------------------------------------------------------------


class Exporter:
    """A Prometheus collector over one connection: ``collect`` reads the log (one scrape
    at a time) and never raises; a failure closes the connection, says why on stderr
    and serves ``sqlsink_up 0``."""

    def __init__(
        self, url: str, password_command: str | None, timeout_s: float, out: Output
    ) -> None:
        self.url = url
        self.password_command = password_command
        self.timeout_s = timeout_s
        self.out = out
        self.totals = Totals()
        self.conn: AdminSession | None = None
        self.lock = threading.Lock()
        self.failing = False

    def collect(self) -> Iterable[Metric]:
        with self.lock:
            started = time.monotonic()
            reading = self._read()
            return families(reading, time.monotonic() - started)

    def close(self) -> None:
        with self.lock:
            self._close()

    def _read(self) -> Reading | None:
        try:
            if self.conn is None:
                self.conn = self._connect()
            reading = read(self.conn, self.totals)
        except Exception as exc:
            self._close()
            self.failing = True
            self.out.error(f"sqlsink metrics: scrape failed: {self._explain(exc)}")
            return None
        if self.failing:
            self.out.error("sqlsink metrics: the commit log is readable again")
        self.failing = False
        return reading

    def _connect(self) -> AdminSession:
        conn = open_connection(self.url, "metrics", self.password_command)
        try:
            conn.set_statement_timeout(self.timeout_s)
            require_schema(conn, conn.role_info())
        except BaseException:
            conn.close()
            raise
        return conn

    def _close(self) -> None:
        if self.conn is not None:
            conn, self.conn = self.conn, None
            try:
                conn.close()
            except Exception as exc:
                if open_database(self.url).driver_error(exc) is None:
                    raise

    def _explain(self, exc: Exception) -> str:
        if isinstance(exc, CliError):
            return f"{exc.message}. Fix: {exc.fix}" if exc.fix else exc.message
        if isinstance(exc, SqlsinkError):
            return exc.message
        database = open_database(self.url)
        failed = database.driver_error(exc)
        if failed is not None and failed.fault is DriverFault.QUERY_CANCELED:
            return (
                f"a query ran longer than --query-timeout ({self.timeout_s:g}s): "
                f"{failed.diag}; the next scrape tries again"
            )
        if failed is not None and failed.fault is DriverFault.CONNECTION:
            return (
                f"lost the connection to {database.name}: {failed.diag}; the next scrape reconnects"
            )
        if failed is not None:
            return f"{database.name} error: {failed.diag}"
        return "internal error (please report it):\n" + traceback.format_exc()


def families(reading: Reading | None, elapsed_s: float) -> list[Metric]:
    """The exposition of one scrape: ``sqlsink_up`` and its duration always, each
    series of ``METRICS`` per sink when the log was read."""
    from prometheus_client.metrics_core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    made: dict[str, Metric] = {}
    for series in METRICS:
        labels = [] if series.name in SCRAPE_SERIES else ["sink"]
        unit = "seconds" if series.name.endswith("_seconds") else ""
        if series.kind == "counter":
            made[series.name] = CounterMetricFamily(series.name, series.help, labels=labels)
        elif series.kind == "histogram":
            made[series.name] = HistogramMetricFamily(
                series.name, series.help, labels=labels, unit=unit
            )
        else:
            made[series.name] = GaugeMetricFamily(
                series.name, series.help, labels=labels, unit=unit
            )
    up, took = (made[name] for name in SCRAPE_SERIES)
    assert isinstance(up, GaugeMetricFamily) and isinstance(took, GaugeMetricFamily)
    up.add_metric([], 0.0 if reading is None else 1.0)
    took.add_metric([], elapsed_s)
    if reading is None:
        return [up, took]
    for sink in reading.sinks:
        for name, value in _values(sink).items():
            metric = made[name]
            if isinstance(value, Histogram):
                assert isinstance(metric, HistogramMetricFamily)
                metric.add_metric([sink.sink_id], value.cumulative(), value.total)
            elif value is not None:  # a sink without decisions has no last batch
                assert isinstance(metric, (CounterMetricFamily, GaugeMetricFamily))
                metric.add_metric([sink.sink_id], float(value))
    return list(made.values())


SCRAPE_SERIES = ("sqlsink_up", "sqlsink_scrape_duration_seconds")  # the only unlabelled ones


def _values(s: SinkReading) -> dict[str, float | Histogram | None]:
    """Each per-sink series of ``METRICS`` and its value for the sink."""
    return {
        "sqlsink_batches_committed": s.totals.batches,
        "sqlsink_rows_committed": s.totals.rows,
        "sqlsink_dead_letters": s.totals.dead_letters,
        "sqlsink_last_batch_id": s.last_batch_id,
        "sqlsink_last_batch_age_seconds": s.last_batch_age_s,
        "sqlsink_last_batch_rows": s.last_batch_rows,
        "sqlsink_commit_seconds": s.totals.commit,
        "sqlsink_partition_write_seconds": s.totals.partition_write,
        "sqlsink_prepare_to_decision_seconds": s.totals.prepare_to_decision,
        "sqlsink_prepared_transactions": s.prepared,
        "sqlsink_prepared_oldest_age_seconds": s.prepared_oldest_age_s,
        "sqlsink_stranded_transactions": s.stranded,
        "sqlsink_incomplete_batches": s.incomplete,
        "sqlsink_incomplete_oldest_age_seconds": s.incomplete_oldest_age_s,
        "sqlsink_lost_transactions": s.lost_transactions,
        "sqlsink_checkpoint_lost_batches": s.checkpoint_lost_batches,
        "sqlsink_live_runs": s.live_runs,
        "sqlsink_run_timeout_seconds": s.run_timeout_s,
    }


# -- the command --------------------------------------------------------------------------


def start(args: argparse.Namespace, envelope: Envelope) -> Envelope:
    return envelope


def run(args: argparse.Namespace, out: Output, doc: Envelope) -> int:
    registry = _registry()
    exporter = Exporter(args.url, args.password_command, args.query_timeout, out)
    registry.register(exporter)
    if args.once:
        from prometheus_client.exposition import generate_latest

        try:
            text = generate_latest(registry).decode()
        finally:
            exporter.close()
        out.line(text.rstrip("\n"))
        return EXIT_ERROR if exporter.failing else EXIT_OK
    return _serve(registry, exporter, args.listen, out)


def _registry() -> CollectorRegistry:
    try:
        from prometheus_client import CollectorRegistry
    except ImportError:
        raise CliError(
            "the metrics command needs the Python package prometheus_client, which is "
            "not installed",
            INSTALL_FIX,
        ) from None
    return CollectorRegistry(auto_describe=False)


def _serve(
    registry: CollectorRegistry, exporter: Exporter, listen: tuple[str, int], out: Output
) -> int:
    """Serve until Ctrl-C or SIGTERM; the first read says at once whether the log can be
    read (a failure is reported and served as ``sqlsink_up 0``, as at any scrape)."""
    from prometheus_client.exposition import start_http_server

    host, port = listen
    try:
        httpd, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise CliError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            "choose another --listen HOST:PORT, or stop what listens there",
        ) from None
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        shown = f"[{host}]" if ":" in host else host
        out.note(
            f"sqlsink metrics: serving http://{shown}:{httpd.server_address[1]}/metrics from "
            f"{out.shown_url}, read at each scrape (Ctrl-C or SIGTERM stops)"
        )
        exporter.collect()  # the first read, for its error if any
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        httpd.shutdown()
        httpd.server_close()
        thread.join(5.0)
        exporter.close()
    out.note("sqlsink metrics: stopped")
    return EXIT_OK
