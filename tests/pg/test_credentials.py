"""Credentials that rotate, against a server that checks passwords (scram-sha-256).

The role's password is changed (ALTER ROLE ... PASSWORD) between connections; the sink
connects with a ``passwordCommand`` that reads a secret store (a file here). A password
cached in this process from before the change is refused (28P01) and a fresh one is
asked for; tasks, the committer and ``sqlsink recover`` all get through, and no
password shows up in any message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import pytest

from sqlsink import cli
from sqlsink.core.model import NewDecision
from sqlsink.credentials import PasswordSource
from sqlsink.errors import TransientError
from sqlsink.options import SinkOptions
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.connection import connect
from sqlsink.postgres.partition import write_partition
from tests.fix_auth import (
    PasswordServer,
    commit,
    ids_of,
    password_server,
    prepare_table,
    rows,
    task,
)
from tests.programs import REPO

__all__ = ["password_server"]

PASSWORDS = ["first-Pa55word", "second-Pa55word", "third-Pa55word", "wrong-Pa55word"]


def options(server: PasswordServer, **extra: str) -> SinkOptions:
    return SinkOptions.parse(
        {
            "url": server.url,
            "table": f"t_{uuid.uuid4().hex[:8]}",
            "sinkId": f"cred-{uuid.uuid4().hex[:8]}",
            "passwordCommand": server.command,
            **extra,
        }
    )


def no_password_in(*texts: str) -> None:
    for text in texts:
        for password in PASSWORDS:
            assert password not in text


@pytest.fixture(autouse=True)
def first_password(password_server: PasswordServer) -> None:
    """Each test starts with the first password, and nothing cached in this process."""
    password_server.rotate(PASSWORDS[0])
    PasswordSource.from_command(password_server.command).forget()


def test_a_rotated_password_is_fetched_again_when_refused(password_server: PasswordServer) -> None:
    opts = options(password_server)
    before = password_server.calls()
    with connect(opts.url, opts.password, application_name="t") as conn:
        assert conn.execute("SELECT current_user").fetchone() == ("sink_app",)
    with connect(opts.url, opts.password, application_name="t"):
        pass
    assert password_server.calls() == before + 1  # the second connect used the cache
    password_server.rotate(PASSWORDS[1])
    with connect(opts.url, opts.password, application_name="t") as conn:  # refused, refetched
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert password_server.calls() == before + 2
    # without a provider the stale password would have been refused for the cache's lifetime
    with pytest.raises(TransientError, match="password authentication failed") as err:
        connect(opts.url, PASSWORDS[0], application_name="t")
    no_password_in(str(err.value))


def test_a_password_the_server_refuses_even_fresh_is_a_clear_error(
    password_server: PasswordServer,
) -> None:
    opts = options(password_server)
    password_server.rotate(PASSWORDS[3], store=False)  # the store still has the old one
    before = password_server.calls()
    with pytest.raises(TransientError) as err:
        connect(opts.url, opts.password, application_name="t")
    text = str(err.value)
    assert "password authentication failed" in text
    assert "was refused, a freshly fetched one too" in text
    assert f"passwordCommand {sys.executable!r}" in text
    assert "print_password.py" not in text  # only the command's first word
    assert password_server.calls() == before + 2  # nothing was cached: asked, asked again
    no_password_in(text, repr(err.value))


def test_tasks_and_the_committer_across_a_password_change(
    password_server: PasswordServer,
) -> None:
    opts = options(password_server)
    target = prepare_table(opts)
    run = uuid.uuid4().hex
    first = write_partition(opts, target, task(opts, 0, run), rows(range(0, 10)))
    password_server.rotate(PASSWORDS[1])  # between the task and its commit
    commit(opts, 0, [first], run)
    second = write_partition(opts, target, task(opts, 1, run), rows(range(10, 20)))
    password_server.rotate(PASSWORDS[2])  # between the tasks of a batch
    third = write_partition(opts, target, task(opts, 1, run, partition=1), rows(range(20, 30)))
    commit(opts, 1, [second, third], run)
    assert ids_of(opts) == list(range(30))


def test_recover_with_a_password_command_after_a_password_change(
    password_server: PasswordServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run prepared a partition and decided its batch, then died; the password changed
    before the on-call person runs recover: it connects with --password-command (once
    in this process, whose cached password is stale; once in a process of its own with
    $SQLSINK_PASSWORD_COMMAND) and commits the transaction."""
    opts = options(password_server, runTimeout="1s")
    assert opts.sink_id is not None
    target = prepare_table(opts)
    run = uuid.uuid4().hex
    outcome = write_partition(opts, target, task(opts, 0, run), rows(range(5)))
    assert outcome.gid is not None
    with connect(opts.url, opts.password, application_name="t") as conn:
        PostgresBackend(conn).insert_decision(
            NewDecision(opts.sink_id, 0, [outcome.gid], 5, None, run)
        )
    password_server.rotate(PASSWORDS[1])
    time.sleep(1.5)  # the run is dead: no longer heard from within its timeout
    env = {
        **os.environ,
        "SQLSINK_PASSWORD_COMMAND": password_server.command,
        "PYTHONPATH": str(REPO),
    }
    status = subprocess.run(
        [sys.executable, "-m", "sqlsink", "status", "--url", opts.url, "--sink-id", opts.sink_id],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert status.returncode == 1, status.stderr  # a stranded transaction: something to do
    assert outcome.gid in status.stdout
    no_password_in(status.stdout, status.stderr)
    code = cli.main(
        [
            *("recover", "--url", opts.url, "--sink-id", opts.sink_id, "--json"),
            *("--password-command", password_server.command),
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, out + err
    doc = json.loads(out)
    assert doc["role"] == "sink_app"
    no_password_in(out, err)
    assert ids_of(opts) == list(range(5))
    with connect(opts.url, opts.password, application_name="t") as conn:
        left = conn.execute("SELECT gid FROM pg_prepared_xacts WHERE gid = %s", (outcome.gid,))
        assert left.fetchall() == []


def test_the_cli_says_which_command_failed(
    password_server: PasswordServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(
        ["check", "--url", password_server.url, "--password-command", "no-such-vault-cli get pg"]
    )
    _, err = capsys.readouterr()
    assert code == 2
    assert "passwordCommand 'no-such-vault-cli' cannot be run: not found" in err
    assert "get pg" not in err
