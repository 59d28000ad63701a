"""Attack (atk-fixes) on the redaction of 42c636e (urlparts._passwords, redact,
userinfo_problem): secrets printed, valid URLs refused, messages eaten. Run through the
real CLI against a closed local port (no server is reached)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sqlsink.conninfo import scheme_problem
from sqlsink.urlparts import redact

ROOT = Path(__file__).resolve().parents[2]
SECRET = "SEKRIT"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sqlsink", "status", "--url", url, *extra],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


# A password ending in a newline (postgresql://u:$(cat pwfile)@host/db) or holding a
# tab, a carriage return or a no-break space: libpq reads it as the password, but
# _passwords' URL is '://' and \S*, so the URL stops at the whitespace before its '@' and
# nothing is redacted; the CLI prints it (text and --json).
@pytest.mark.parametrize("gap", ["\n", "\t", "\r", "\x0b", "\u00a0x"])
def test_pg_password_with_whitespace_is_not_printed(gap: str) -> None:
    url = f"postgresql://u:{SECRET}{gap}@127.0.0.1:{_closed_port()}/db"
    for extra in ((), ("--json",)):
        done = _cli(url, *extra)
        assert SECRET not in done.stdout + done.stderr, (done.stdout, done.stderr)


def test_redact_whitespace_password() -> None:
    assert SECRET not in redact(f"postgresql://u:{SECRET}\n@h/db")


# Valid URLs refused since 42c636e: libpq reads postgresql://h/db@x as dbname 'db@x'
# (its user info ends at the first '/'), urllib the same for mariadb://; an '@' in the
# path is not user info. userinfo_problem refuses them, saying the user or password
# holds an unencoded '/' (there is no user or password) and printing 'h:***@x'.
@pytest.mark.parametrize(
    "url",
    [
        "postgresql://127.0.0.1:{port}/db@x",
        "postgresql:///db@x?host=/nonexistent-dir",
        "mariadb://127.0.0.1:{port}/db@x",
        # a query value with two '@': _QUERY_VALUE stops at the first
        "postgresql:///db?host=/nonexistent-dir&application_name=a@b@c",
    ],
)
def test_valid_url_with_at_outside_userinfo_is_not_refused(url: str) -> None:
    assert scheme_problem(url.format(port=_closed_port())) is None


# A password given as a query parameter: redact's [?&]password=[^&#]* runs to the next
# '&' or '#' of the whole text, so on a message quoting the URL at its end it eats the
# reason and the fix: the CLI prints 'cannot connect to PostgreSQL at ...&password=***'
# and nothing else.
def test_query_password_keeps_the_reason_and_fix() -> None:
    done = _cli(f"postgresql://127.0.0.1:{_closed_port()}/db?user=u&password={SECRET}")
    assert SECRET not in done.stderr
    assert "fix" in done.stderr.lower(), done.stderr
    assert "connection refused" in done.stderr.lower(), done.stderr


def test_redact_query_password_keeps_following_text() -> None:
    text = f"cannot connect at postgresql://h/db?password={SECRET}: nothing listens; fix: start it"
    assert redact(text).endswith("nothing listens; fix: start it"), redact(text)
