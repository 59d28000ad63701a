"""Password sources (passwordCommand / passwordProvider) without a server: the cache,
failures and their messages, the options. The server side (rotation, 28P01, recover)
is tests/pg/test_credentials.py."""

from __future__ import annotations

import shlex
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from sqlsink.conninfo import secrets_of
from sqlsink.credentials import PasswordProviderError, PasswordSource
from sqlsink.errors import ConfigError
from sqlsink.options import SinkOptions
from sqlsink.postgres.connection import auth_failed, scrub

SECRET = "Sup3r-secret-pw"

# the value providers below return (tests set it)
CURRENT: dict[str, Any] = {"password": SECRET, "calls": 0}


def provide() -> str:
    CURRENT["calls"] += 1
    return str(CURRENT["password"])


def provide_badly() -> str:
    raise RuntimeError(f"vault said no; by the way the password is {SECRET}")


def provide_nothing() -> object:
    return None


def script(tmp_path: Path, body: str) -> str:
    """A passwordCommand running a Python script; a unique one (the cache is per process
    and keyed by the command)."""
    path = tmp_path / f"cmd_{uuid.uuid4().hex[:8]}.py"
    path.write_text(body)
    return shlex.join([sys.executable, str(path)])


def counting(tmp_path: Path) -> tuple[str, Path, Path]:
    secret, count = tmp_path / "secret", tmp_path / "count"
    secret.write_text(SECRET + "\n")
    body = f"open({str(count)!r}, 'a').write('x\\n')\nprint(open({str(secret)!r}).read().strip())\n"
    return script(tmp_path, body), secret, count


def calls(count: Path) -> int:
    return len(count.read_text().splitlines()) if count.exists() else 0


def test_a_command_is_asked_once_per_cache_lifetime(tmp_path: Path) -> None:
    command, secret, count = counting(tmp_path)
    source = PasswordSource.from_command(command, cache_s=300)
    assert source.get() == SECRET  # the trailing newline is not part of it
    assert source.get() == SECRET
    assert calls(count) == 1
    secret.write_text("rotated-pw\n")
    assert source.get() == SECRET  # still cached
    assert source.get(fresh=True) == "rotated-pw"  # after a refused login
    assert calls(count) == 2
    assert source.get() == "rotated-pw"  # the fresh one is cached
    assert calls(count) == 2


def test_an_expired_cache_asks_again(tmp_path: Path) -> None:
    command, secret, count = counting(tmp_path)
    source = PasswordSource.from_command(command, cache_s=0.3)
    source.get()
    secret.write_text("rotated-pw\n")
    time.sleep(0.4)
    assert source.get() == "rotated-pw"
    assert calls(count) == 2
    never = PasswordSource.from_command(command, cache_s=0)
    never.get(), never.get()
    assert calls(count) == 4


def test_the_cache_is_per_process_not_pickled(tmp_path: Path) -> None:
    import pickle

    command, _, count = counting(tmp_path)
    source = PasswordSource.from_command(command)
    source.get()
    copy = pickle.loads(pickle.dumps(source))
    assert copy == source and SECRET.encode() not in pickle.dumps(source)
    copy.get()  # same process, same command: the cache answers
    assert calls(count) == 1


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (f"import sys; print({SECRET!r}); sys.exit(3)", "failed (exit status 3"),
        ("pass", "printed no password"),
        ("print()", "printed no password"),
    ],
)
def test_a_failing_command_names_its_first_word_only(
    tmp_path: Path, body: str, expected: str
) -> None:
    command = script(tmp_path, body) + " --token tok-Secret-arg"
    with pytest.raises(PasswordProviderError) as err:
        PasswordSource.from_command(command).get()
    text = str(err.value)
    assert expected in text
    assert f"passwordCommand {sys.executable!r}" in text
    assert "Fix:" in text
    assert SECRET not in text and "tok-Secret-arg" not in text and "cmd_" not in text
    assert err.value.__cause__ is None  # nothing chained that could quote it


def test_a_command_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(PasswordProviderError, match="'no-such-vault-cli' cannot be run: not "):
        PasswordSource.from_command("no-such-vault-cli read secret/pg").get()
    with pytest.raises(PasswordProviderError, match="cannot be run"):
        PasswordSource.from_command(str(tmp_path)).get()  # a directory: not executable


def test_a_command_that_hangs_is_killed(tmp_path: Path) -> None:
    pid_file = tmp_path / "child"
    body = (
        "import os, subprocess, sys, time\n"  # a grandchild holding stdout, too
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "time.sleep(60)\n"
    )
    source = PasswordSource("command", script(tmp_path, body), timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(PasswordProviderError, match=r"did not finish within 1 s \(killed\)"):
        source.get()
    assert time.monotonic() - started < 10
    time.sleep(0.2)
    status = Path(f"/proc/{pid_file.read_text()}/status")
    if status.exists():  # the whole group went: gone, or a zombie nobody reaped yet
        assert "\tZ (zombie)" in status.read_text()


def test_a_callable_provider() -> None:
    CURRENT.update(password=SECRET, calls=0)
    source = PasswordSource.from_callable(f"{__name__}:provide", cache_s=300)
    assert source.get() == SECRET
    CURRENT["password"] = "rotated"
    assert source.get() == SECRET and source.get(fresh=True) == "rotated"
    assert CURRENT["calls"] == 2
    source.forget()
    CURRENT["password"] = SECRET


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (f"{__name__}:provide_badly", "raised RuntimeError (its message is not shown)"),
        (f"{__name__}:provide_nothing", "returned NoneType, not a password"),
        (f"{__name__}:SECRET", "is not callable"),
        (f"{__name__}:no_such_function", "cannot be imported (AttributeError)"),
        ("no_such_module_xyz:get", "cannot be imported (ModuleNotFoundError)"),
    ],
)
def test_a_failing_callable_provider(spec: str, expected: str) -> None:
    with pytest.raises(PasswordProviderError) as err:
        PasswordSource.from_callable(spec).get()
    assert expected in str(err.value) and spec in str(err.value)
    assert SECRET not in str(err.value) and "vault said no" not in str(err.value)


def test_options() -> None:
    base = {"url": "postgresql://app@db/shop", "table": "t"}
    opts = SinkOptions.parse({**base, "passwordCommand": "vault kv get -field=pw secret/pg"})
    assert opts.password == PasswordSource.from_command("vault kv get -field=pw secret/pg")
    assert "secret/pg" not in repr(opts) and "secret/pg" not in repr(opts.password)
    assert "'vault'" in repr(opts.password)
    opts = SinkOptions.parse(
        {**base, "passwordprovider": "mycompany.secrets:pg", "passwordCacheSeconds": "2min"}
    )
    assert opts.password == PasswordSource("callable", "mycompany.secrets:pg", 120.0)
    with pytest.raises(ConfigError, match="password and passwordCommand: give one"):
        SinkOptions.parse({**base, "password": "x", "passwordCommand": "vault"})
    with pytest.raises(ConfigError, match="passwordCacheSeconds needs passwordCommand"):
        SinkOptions.parse({**base, "passwordCacheSeconds": "10"})
    with pytest.raises(ConfigError, match="not an import path"):
        SinkOptions.parse({**base, "passwordProvider": "mycompany.secrets"})
    with pytest.raises(ConfigError, match="cannot be split"):
        SinkOptions.parse({**base, "passwordCommand": "vault 'unclosed"})


def test_tls_options_pass_through_to_libpq() -> None:
    opts = SinkOptions.parse(
        {
            "url": "jdbc:postgresql://app:pw@db:5433/shop?sslmode=require",
            "table": "t",
            "SSLMODE": "verify-full",
            "sslrootcert": "/etc/ssl/ca.crt",
            "sslcert": "/etc/ssl/client.crt",
            "sslkey": "/etc/ssl/client key.pem",
        }
    )
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(opts.url)
    assert params["sslmode"] == "verify-full"  # the option wins over the URL's
    assert params["sslrootcert"] == "/etc/ssl/ca.crt"
    assert params["sslkey"] == "/etc/ssl/client key.pem"
    assert (params["host"], params["port"], params["password"]) == ("db", "5433", "pw")
    url = "postgresql://app@db/shop?sslmode=verify-full&sslrootcert=/ca.crt"
    assert SinkOptions.parse({"url": url, "table": "t"}).url == url  # untouched


def test_provided_passwords_are_scrubbed(tmp_path: Path) -> None:
    command, _, _ = counting(tmp_path)
    source = PasswordSource.from_command(command)
    source.get()
    assert SECRET in secrets_of("postgresql://db/x", source)
    text = scrub(f"FATAL: something quoted {SECRET}", "postgresql://db/x", source)
    assert SECRET not in text and "***" in text


def test_auth_failed() -> None:
    assert auth_failed('FATAL:  password authentication failed for user "app"')
    assert auth_failed("whatever", "28P01")
    assert not auth_failed('FATAL:  database "x" does not exist')
    assert not auth_failed("Connection refused")
