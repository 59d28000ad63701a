"""The metrics' documents: the Grafana dashboard names only series the exporter
serves, docs/alerts.md lists every series, and the alert rules pass ``promtool check
rules`` and their own ``promtool test rules`` (promtool from Debian's prometheus
package, installed by scripts/ensure-prometheus.sh when missing)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sqlsink.cli import metrics
from tests.fix_prometheus import binary

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "sqlsink-dashboard.json"
RULES = ROOT / "docs" / "prometheus" / "sqlsink-alerts.yml"
RULE_TESTS = ROOT / "docs" / "prometheus" / "sqlsink-alerts.test.yml"
ALERTS_PAGE = ROOT / "docs" / "alerts.md"

# PromQL words that are not series: aggregations' clauses, set operators, modifiers
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or"}
KEYWORDS |= {"unless", "bool", "offset"}


def dashboard_exprs() -> list[str]:
    doc = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in doc["panels"] if p["type"] != "row" for t in p["targets"]]
    exprs += [v["query"]["query"] for v in doc["templating"]["list"] if v["type"] == "query"]
    return exprs


def series_named(expr: str) -> set[str]:
    """The series an expression names: identifiers outside label matchers, strings,
    clause label lists and ranges that are neither a function's name nor a keyword."""
    text = re.sub(r'"[^"]*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"label_values\(([a-z_:][a-z0-9_:]*),\s*[a-z_]+\)", r"(\1)", text)
    names = set(re.findall(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()", text))
    return {n for n in names if n not in KEYWORDS and not n.startswith("$")}


def test_the_dashboard_names_only_series_the_exporter_serves() -> None:
    exposed = metrics.exposed_names()
    exprs = dashboard_exprs()
    assert len(exprs) > 10
    named: set[str] = set()
    for expr in exprs:
        found = series_named(expr)
        assert found, expr
        assert found <= exposed, (expr, found - exposed)
        named |= found
    # each series of the exporter appears on the dashboard
    shown = {n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for n in named}
    assert {s.name + ("_total" if s.kind == "counter" else "") for s in metrics.METRICS} <= shown


def test_the_series_finder_sees_a_misspelt_series() -> None:
    assert series_named('sum by (sink) (rate(sqlsnk_rows_total{sink=~"$sink"}[5m]))') == {
        "sqlsnk_rows_total"
    }
    assert series_named("histogram_quantile(0.5, sum by (sink, le) (rate(x_bucket[1m])))") == {
        "x_bucket"
    }


def test_the_alerts_page_lists_every_series() -> None:
    page = ALERTS_PAGE.read_text()
    for series in metrics.METRICS:
        name = series.name + ("_total" if series.kind == "counter" else "")
        assert f"| `{name}` | {series.kind} |" in page, name


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *args], capture_output=True, text=True, cwd=cwd, timeout=60
    )


def test_promtool_accepts_the_alert_rules_and_they_fire_as_documented() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 10 rules found" in checked.stdout
    rules = [
        line.split(": ", 1)[1] for line in RULES.read_text().splitlines() if "- alert:" in line
    ]
    for alert in rules:
        assert f"`{alert}`" in ALERTS_PAGE.read_text(), alert
    tested = promtool("test", "rules", RULE_TESTS.name, cwd=RULE_TESTS.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    exercised = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert exercised == set(rules)  # each rule has a case that fires it


def test_promtool_parses_every_dashboard_expression(tmp_path: Path) -> None:
    """As recording rules, with Grafana's variables replaced by what they stand for."""
    exprs = [e for e in dashboard_exprs() if not e.startswith("label_values(")]
    rules: dict[str, Any] = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {
                        "record": f"dashboard:expr{i}",
                        "expr": e.replace("$__rate_interval", "5m").replace("$sink", ".*"),
                    }
                    for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard.rules.json"  # JSON is YAML
    path.write_text(json.dumps(rules))
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("expr", ["sum(rate(sqlsink_commit_seconds_bucket[5m])) >"])
def test_promtool_refuses_a_broken_expression(tmp_path: Path, expr: str) -> None:
    path = tmp_path / "broken.rules.json"
    path.write_text(
        json.dumps({"groups": [{"name": "g", "rules": [{"record": "r", "expr": expr}]}]})
    )
    assert promtool("check", "rules", str(path)).returncode != 0
