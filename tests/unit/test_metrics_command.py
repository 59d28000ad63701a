"""``sqlsink metrics`` without a database: its arguments, the error when the optional
``prometheus_client`` is missing, and the exposition of a scrape that failed."""

from __future__ import annotations

import sys

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sqlsink import cli
from sqlsink.cli import metrics
from sqlsink.cli.parser import build_parser


def test_listen_takes_host_and_port_ipv6_and_any_interface() -> None:
    assert metrics.listen_address("127.0.0.1:9188") == ("127.0.0.1", 9188)
    assert metrics.listen_address("[::1]:0") == ("::1", 0)
    assert metrics.listen_address(":9188") == ("0.0.0.0", 9188)
    args = build_parser().parse_args(["metrics", "--url", "postgresql://x/y"])
    assert args.listen == ("127.0.0.1", 9188) and args.query_timeout == 5.0
    assert args.once is False and args.json is False


@pytest.mark.parametrize("text", ["9188", "host:", "host:port", "host:70000"])
def test_a_malformed_listen_is_a_usage_error(text: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["metrics", "--listen", text])
    assert exit_.value.code == 2
    assert "is not HOST:PORT" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["0s", "-1s", "soon"])
def test_the_query_timeout_must_be_positive(text: str) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["metrics", "--query-timeout", text])


def test_without_prometheus_client_the_command_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails
    assert cli.main(["metrics", "--url", "postgresql://nobody@127.0.0.1:1/x", "--once"]) == 2
    err = capsys.readouterr().err
    assert "needs the Python package prometheus_client" in err
    assert "pip install 'sqlsink[metrics]'" in err


def test_a_failed_scrape_exposes_only_up_0_and_its_duration() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    class Failed:
        def collect(self) -> list[object]:
            return metrics.families(None, 0.25)  # type: ignore[return-value]

    registry = CollectorRegistry()
    registry.register(Failed())  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples == {"sqlsink_up": 0.0, "sqlsink_scrape_duration_seconds": 0.25}


def test_every_series_is_prefixed_and_says_its_unit() -> None:
    for series in metrics.METRICS:
        assert series.name.startswith("sqlsink_")
        assert series.kind in ("gauge", "counter", "histogram")
        if series.kind == "histogram" or "age" in series.name or "timeout" in series.name:
            assert series.name.endswith("_seconds"), series.name
    names = metrics.exposed_names()
    assert "sqlsink_rows_committed_total" in names and "sqlsink_commit_seconds_bucket" in names


def test_each_sink_has_a_value_for_every_labelled_series() -> None:
    from datetime import datetime, timezone

    from sqlsink.cli.metrics_survey import Reading, SinkReading, SinkTotals

    sink = SinkReading("orders", SinkTotals(), 3, 1.5, 10, 0, 0.0, 0, 0, 0.0, 0, 0, 1, 300.0)
    labelled = {s.name for s in metrics.METRICS} - set(metrics.SCRAPE_SERIES)
    assert set(metrics._values(sink)) == labelled
    reading = Reading("db", datetime.now(timezone.utc), [sink])
    exposed = {f.name for f in metrics.families(reading, 0.1) if f.samples}
    assert exposed == {s.name for s in metrics.METRICS}
