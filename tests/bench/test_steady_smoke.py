"""``benchmarks/run.py --only steady`` still runs end to end at its tiny size: the sink, the
COPY and ``noop`` once each, every figure present. Numbers are never asserted, only the
structure, that the sink loaded exactly the rows (counted on the server after its run) and
left nothing prepared, and that the package measured is this tree's."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.programs import REPO, run_program

QUICK_ROWS = 8_000  # run.py's --quick size of the measure


def test_quick_steady_runs_sink_copy_and_noop(tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    env = {k: v for k, v in os.environ.items() if k != "SQLSINK_TEST_URL"}
    log = tmp_path / "bench.log"  # the whole output, to read after a failure
    args = ("benchmarks/run.py", "--quick", "--only", "steady", "--no-plot", "--out", str(out))
    done = run_program(*args, timeout=480, env=env, log=log)
    results = json.loads(out.read_text())
    assert results["errors"] == {}
    steady = results["measures"]["steady"]
    assert steady["rows"] == QUICK_ROWS
    assert steady["shared_buffers"] == "1GB"
    package = str(REPO / "sqlsink" / "__init__.py")
    assert steady["sqlsink_imported"] == {"driver": package, "worker": package}
    [one] = steady["rounds"]
    assert one["order"] == ["sink", "copy", "noop"]
    assert set(one["runs"]) == {"sink", "copy", "noop"}
    sink = one["runs"]["sink"]
    assert sink["rows_in_table"] == QUICK_ROWS
    assert sink["prepared_left"] == 0
    assert sink["batches"] == 4  # 8 files, 2 per batch
    assert sink["partitions_per_batch"] == 2
    assert sorted((w["batch"], w["partition"]) for w in sink["partition_writes"]) == [
        (b, p) for b in range(4) for p in range(2)
    ]
    assert len(sink["commit_ms"]) == 4
    summary = steady["summary"]
    for name in (
        "cpu s/Mrow: jvm",
        "cpu s/Mrow: python_workers",
        "cpu s/Mrow: driver",
        "cpu s/Mrow: postgres",
        "partition write ms: median",
        "partition write s/Mrow",
        "ms/batch: addBatch",
        "ms/batch: walCommit",
        "ms/batch: commitOffsets",
        "ms/batch: commit log commit_ms",
        "ms/batch: gap between batches",
        "rows/s: server, first to last commit",
    ):
        figure = summary["sink"][name]
        assert figure["n"] == 1 and figure["min"] <= figure["median"] <= figure["max"], name
    assert "rows/s: COPY, wall" in summary["copy"]
    assert "rows/s: Spark, first to last batch end" in summary["noop"]
    assert set(summary["ratio"]) == {
        "sink (server) / COPY",
        "sink (server) / noop",
        "sink (Spark) / noop",
    }
    assert "sink: partition write s/Mrow" in done.stdout
