"""The package's public names as tools list them (the lazy ForeachBatchWriter included)."""

from __future__ import annotations

import sqlsink


def test_dir_of_the_package_lists_every_name_of_all() -> None:
    """IPython/Jupyter completion and help() list dir(module): without a module
    ``__dir__``, the lazy ForeachBatchWriter (the README's first example) is missing
    from it until something imported it."""
    import subprocess
    import sys

    listed = subprocess.run(
        [sys.executable, "-c", "import sqlsink; print(sorted(dir(sqlsink)))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    missing = [n for n in sqlsink.__all__ if f"'{n}'" not in listed]
    assert missing == [], f"dir(sqlsink) in a fresh process lacks {missing}"
