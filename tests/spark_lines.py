"""One Python environment per supported PySpark line, built by the test command and cached
outside the clone (CI always starts from a fresh clone; the next run reuses them).

    python -m tests.spark_lines [LINE ...]     # build (or find) them, print their pythons

The newest line is the project's own venv (the whole suite runs there); the others get
a venv each under ``$SQLSINK_CACHE`` (default ``~/.cache/sqlsink``)/``spark-lines``,
holding that PySpark and sqlsink's runtime dependencies but not sqlsink itself: the
tests put the clone first on PYTHONPATH, so every line runs the code under test. An
environment is rebuilt when its requirement list changes (its name carries a hash).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

# the newest patch of each line the README claims; 4.3 is the project's venv
LINES = {"3.5": "3.5.9", "4.0": "4.0.5", "4.1": "4.1.4", "4.2": "4.2.1"}
# sqlsink's runtime dependencies, as a Spark environment would hold them: those the
# installed package declares (pyproject.toml's), without the extras
RUNTIME = [r.replace(" ", "") for r in metadata.requires("sqlsink") or [] if "extra ==" not in r]
BUILD_TIMEOUT_S = 1200  # a fresh machine downloads ~400 MB per line


def cache_root() -> Path:
    base = os.environ.get("SQLSINK_CACHE") or str(Path.home() / ".cache" / "sqlsink")
    return Path(base) / "spark-lines"


def requirements(version: str) -> list[str]:
    return [f"pyspark=={version}", *RUNTIME]


def env_dir(version: str) -> Path:
    reqs = "\n".join([sys.version.split()[0], *requirements(version)])
    digest = hashlib.sha256(reqs.encode()).hexdigest()[:10]
    return cache_root() / f"pyspark-{version}-py{sys.version_info[0]}{sys.version_info[1]}-{digest}"


def ensure_env(version: str) -> Path:
    """The python of the environment for ``version``, built once (under a lock)."""
    target = env_dir(version)
    python = target / "bin" / "python"
    done = target / ".complete"
    if done.exists():
        return python
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / f".lock-{version}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another run building the same line: wait for it
        if done.exists():
            return python
        started = time.monotonic()
        building = target.with_name(target.name + ".building")
        shutil.rmtree(building, ignore_errors=True)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(building)], check=True, timeout=120)
        subprocess.run(
            [
                str(building / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                *requirements(version),
            ],
            check=True,
            timeout=BUILD_TIMEOUT_S,
        )
        shutil.rmtree(target, ignore_errors=True)
        building.rename(target)
        # a venv's scripts name its directory: the renamed one runs as python -m only
        done.write_text(f"built in {time.monotonic() - started:.0f} s\n")
    return python


def main() -> int:
    for line in sys.argv[1:] or list(LINES):
        started = time.monotonic()
        python = ensure_env(LINES[line])
        print(f"PySpark {LINES[line]}: {python} ({time.monotonic() - started:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
