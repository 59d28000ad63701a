"""The operator's commands on a MariaDB URL are not built yet (issue 31 item 4): each
refuses it with a clear "not built yet" error, its exit code 2, the --json document's
fields as for any error, and no secret shown. No server: refused before connecting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
URL = "mariadb://app:s3cret@127.0.0.1:9/shop"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqlsink", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


@pytest.mark.parametrize(
    "command", [["status"], ["recover", "--dry-run"], ["recover"], ["forget", "--sink-id", "x"]]
)
def test_a_command_refuses_a_mariadb_url_as_not_built_yet(command: list[str]) -> None:
    done = cli(*command, "--url", URL)
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"sqlsink {command[0]} on a MariaDB or MySQL url is not built yet" in done.stderr
    assert "s3cret" not in done.stdout + done.stderr


def test_the_json_document_says_so_in_its_error() -> None:
    done = cli("status", "--json", "--url", URL.replace("mariadb:", "jdbc:mysql:"))
    assert done.returncode == 2
    doc = json.loads(done.stdout)
    assert doc["command"] == "status" and doc["exit_code"] == 2
    assert "not built yet" in doc["error"]["message"]
    assert doc["url"] == "mysql://app:***@127.0.0.1:9/shop"
    assert doc["sinks"] == [] and "s3cret" not in done.stdout + done.stderr


def test_check_refuses_it_for_want_of_the_server_checks() -> None:
    done = cli("check", "--url", URL)
    assert done.returncode == 2
    assert "judging the server's settings" in done.stderr and "MariaDB" in done.stderr
    assert "s3cret" not in done.stdout + done.stderr
