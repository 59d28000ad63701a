"""The sink's handler of last resort (sqlsink/driver_log.py), each case in a fresh Python
process (pytest itself sets up logging): INFO on standard error when nothing is set up,
nothing when the user has set logging up, and stepping aside when they do so later."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(script: str) -> tuple[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return done.stdout, done.stderr


def test_with_nothing_set_up_the_sinks_info_reaches_standard_error() -> None:
    _, err = run(
        """
        import logging
        from sqlsink import driver_log
        assert driver_log.install() and driver_log.install()  # once
        logging.getLogger("sqlsink").info("sqlsink s: batch 3: the line")
        logging.getLogger("sqlsink.postgres").debug("not at INFO")
        logging.getLogger("other").info("not the sink's")
        assert not logging.getLogger().handlers  # the root logger untouched
        """
    )
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].endswith(" INFO sqlsink: sqlsink s: batch 3: the line")


def test_a_users_set_up_is_left_alone() -> None:
    for setup in (
        "logging.basicConfig(level=logging.WARNING)",
        "logging.getLogger('sqlsink').setLevel(logging.WARNING)",
        "logging.getLogger('sqlsink').addHandler(logging.NullHandler())",
    ):
        _, err = run(
            f"""
            import logging
            from sqlsink import driver_log
            {setup}
            assert not driver_log.install()
            logging.getLogger("sqlsink").info("the line")
            """
        )
        assert "the line" not in err, setup


def test_it_steps_aside_once_the_user_sets_logging_up() -> None:
    _, err = run(
        """
        import logging
        from sqlsink import driver_log
        assert driver_log.install()
        logging.getLogger("sqlsink").info("before")
        logging.basicConfig(level=logging.WARNING, format="USER %(message)s")
        logging.getLogger("sqlsink").info("after, at INFO")
        logging.getLogger("sqlsink").warning("after, a warning")
        assert driver_log.installed() is None
        assert logging.getLogger("sqlsink").level == logging.NOTSET
        """
    )
    lines = err.splitlines()
    assert lines[0].endswith(" INFO sqlsink: before")
    assert lines[1:] == ["USER after, a warning"]  # once, by the user's handler only


def test_the_layout_says_warn_as_spark_does_and_leaves_the_record_alone() -> None:
    import logging

    from sqlsink import driver_log

    record = logging.LogRecord("sqlsink", logging.WARNING, __file__, 1, "careful", None, None)
    layout = driver_log._DriverLog(sys.stderr).formatter
    assert layout is not None
    assert " WARN sqlsink: careful" in layout.format(record)
    assert record.levelname == "WARNING"  # other handlers see Python's own name
    info = logging.LogRecord("sqlsink", logging.INFO, __file__, 1, "batch 0", None, None)
    assert " INFO sqlsink: batch 0" in layout.format(info)
