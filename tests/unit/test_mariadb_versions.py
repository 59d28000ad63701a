"""The planner's version gate (``sqlsink.mariadb.loading.server_verdict``), which
``sqlsink check`` shares: MariaDB before 10.5 rolls a prepared XA branch back when its
session ends (MDEV-742), MySQL before 8.0.30 is not crash-safe with the binary log."""

from __future__ import annotations

import pytest

from sqlsink.errors import ConfigError
from sqlsink.mariadb.loading import judge_version, server_verdict


@pytest.mark.parametrize(
    "version",
    ["10.4.32-MariaDB", "10.3.39-MariaDB-0+deb10u2", "5.5.5-10.4.32-MariaDB", "10.0.38-MariaDB"],
)
def test_mariadb_before_10_5_is_refused(version: str) -> None:
    refusal, warning = server_verdict(version)
    assert refusal is not None and warning is None
    assert "older than 10.5" in refusal
    assert "MDEV-742" in refusal
    assert "disconnects after XA PREPARE" in refusal
    assert "upgrade to MariaDB 10.11" in refusal
    with pytest.raises(ConfigError, match="MDEV-742"):
        judge_version(version)


def test_mariadb_10_11_passes_silently() -> None:
    assert server_verdict("10.11.19-MariaDB-0+deb12u1") == (None, None)


@pytest.mark.parametrize("version", ["10.5.0-MariaDB", "10.6.18-MariaDB", "11.4.2-MariaDB"])
def test_mariadb_from_10_5_passes_untested(version: str) -> None:
    refusal, warning = server_verdict(version)
    assert refusal is None
    assert warning is not None and "tested on MariaDB 10.11 only" in warning


def test_mysql() -> None:
    refusal, warning = server_verdict("8.0.29")
    assert refusal is not None and "older than 8.0.30" in refusal
    refusal, warning = server_verdict("8.0.30")
    assert refusal is None and warning is not None and "untested" in warning
