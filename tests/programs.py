"""Programs of this repository run as a user runs them: ``python ARGS`` from its root."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_program(
    *args: str,
    timeout: float,
    env: Mapping[str, str] | None = None,
    log: Path | None = None,
    python: str = sys.executable,
) -> subprocess.CompletedProcess[str]:
    """Run it to its end and require exit 0; the output's tails are the failure message,
    and ``log`` (when given) gets the whole output first, to read after a failure.
    ``python``: another interpreter (tests/lines runs each PySpark line's)."""
    done = subprocess.run(
        [python, *args],
        cwd=REPO,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if log is not None:
        log.write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done
