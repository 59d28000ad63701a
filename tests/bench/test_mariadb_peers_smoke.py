"""The MariaDB peers benchmark's harness still runs (``benchmarks/mariadb_peers.py``, its
floors only, 2,000 rows): its own private mariadbd restarted with the benchmark's
settings, the rows encoded for LOAD DATA, both plain ``LOAD DATA LOCAL INFILE`` floors
checked row by row (the benchmark refuses a run whose table is wrong), the slow-log
profile parsed, the JSON and the plot written. Numbers are never asserted. The Spark
methods (the sink, the JDBC writer, the upserts) are not run here: a SparkSession, its
warm-up and six streaming queries take minutes, past this smoke's 30 s; they are run by
hand (benchmarks/results/mariadb_peers.md). About 10 s."""

from __future__ import annotations

import json
from pathlib import Path

from tests.programs import run_program


def test_mariadb_peers_floors_run_and_are_profiled(tmp_path: Path) -> None:
    out = tmp_path / "mariadb_peers.json"
    run_program(
        "benchmarks/mariadb_peers.py", "--rows", "2000", "--files", "2", "--repeat", "1",
        "--only", "floor", "--out", str(out), timeout=120,
    )  # fmt: skip
    results = json.loads(out.read_text())
    floors = {m["method"]: m for m in results["methods"]}
    assert set(floors) == {
        "LOAD DATA LOCAL INFILE, mariadb client (C), 1 process",
        "LOAD DATA LOCAL INFILE, PyMySQL, 1 process",
        "LOAD DATA LOCAL INFILE, mariadb client (C), 2 processes at once, half the keys each",
    }
    assert all(m["rows_per_s"] > 0 and len(m["runs"]) == 1 for m in floors.values())
    assert results["errors"] == {}
    for name in floors:  # per process one session, one LOAD DATA, one COMMIT
        processes = 2 if "2 processes" in name else 1
        profile = results["profile"][name]
        assert profile["sessions"] == processes
        assert profile["by_kind"]["LOAD DATA"]["count"] == processes
        assert profile["by_kind"]["COMMIT"]["count"] == processes
    assert results["machine"]["mariadb_settings"]["innodb_buffer_pool_size"] == str(2**30)
    assert out.with_suffix(".png").stat().st_size > 10_000
