"""Passwords that rotate: a command or a callable that gives the current password.

``PasswordSource`` is what the options ``passwordCommand`` / ``passwordProvider`` (and
the CLI's ``--password-command``) become. It is a small frozen value of no backend: it
pickles to the executors with the options, and each process asks it for the password
when a backend connects (``sqlsink.postgres.connection.connect``). The answer is cached
per process for ``cache_s`` seconds; a connection refused for its password (PostgreSQL's
SQLSTATE 28P01, ``connection.auth_failed``) asks again, bypassing the cache, and retries
once.

The password is never shown: errors name the command's first word (or the callable's
import path), never its arguments or output; every password a source returned in this
process is in ``known_passwords()``, which ``connection.scrub`` and the CLI's output
remove from any text.
"""

from __future__ import annotations

import importlib
import os
import shlex
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import Literal

from sqlsink.errors import ConfigError

DEFAULT_CACHE_S = 300.0
COMMAND_TIMEOUT_S = 30.0


class PasswordProviderError(ConfigError):
    """The password command or callable failed; the message names it and the fix."""


@dataclass(frozen=True)
class PasswordSource:
    """A command (run without a shell, its stdout the password) or a callable given by
    import path ``module:function`` (called without arguments, returning a str)."""

    kind: Literal["command", "callable"]
    spec: str
    cache_s: float = DEFAULT_CACHE_S
    timeout_s: float = COMMAND_TIMEOUT_S

    @classmethod
    def from_command(cls, text: str, cache_s: float = DEFAULT_CACHE_S) -> PasswordSource:
        try:
            words = shlex.split(text)
        except ValueError as exc:  # unbalanced quotes: say where, not what
            raise PasswordProviderError(
                f"option passwordCommand cannot be split into words ({exc}): quote it "
                'as a shell would, e.g. passwordCommand="vault kv get -field=password '
                'secret/pg"'
            ) from None
        if not words:
            raise PasswordProviderError("option passwordCommand is empty")
        return cls("command", text, cache_s)

    @classmethod
    def from_callable(cls, text: str, cache_s: float = DEFAULT_CACHE_S) -> PasswordSource:
        module, _, name = text.strip().partition(":")
        if not module or not name:
            raise PasswordProviderError(
                f"option passwordProvider: {text.strip()!r} is not an import path of the "
                "form module:function (e.g. passwordProvider=mycompany.secrets:pg_password)"
            )
        return cls("callable", text.strip(), cache_s)

    def describe(self) -> str:
        """What messages call it: the command's first word only (its arguments may hold
        a token), or the callable's import path."""
        if self.kind == "command":
            return f"passwordCommand {shlex.split(self.spec)[0]!r}"
        return f"passwordProvider {self.spec!r}"

    def __repr__(self) -> str:
        return f"PasswordSource({self.describe()}, cache {self.cache_s:g} s)"

    def get(self, *, fresh: bool = False) -> str:
        """The password: cached for ``cache_s`` seconds in this process, unless ``fresh``."""
        key = (self.kind, self.spec)
        with _LOCK:
            lock = _KEY_LOCKS.setdefault(key, threading.Lock())
        with lock:  # one fetch at a time per source: concurrent connects share it
            cached = _CACHE.get(key)
            if not fresh and cached is not None and time.monotonic() - cached[1] < self.cache_s:
                return cached[0]
            password = self._fetch()
            with _LOCK:
                _KNOWN.add(password)
                _CACHE[key] = (password, time.monotonic())
            return password

    def forget(self) -> None:
        """Drop this process's cached password (the next ``get`` asks again)."""
        with _LOCK:
            _CACHE.pop((self.kind, self.spec), None)

    def _fetch(self) -> str:
        if self.kind == "command":
            return self._run_command()
        return self._call()

    def _run_command(self) -> str:
        words = shlex.split(self.spec)
        name = self.describe()
        fix = (
            "Fix: run the command by hand as the user the query (or sqlsink) runs as, on "
            "the same machine: it must print the password on stdout and exit 0 within "
            f"{self.timeout_s:g} s (it runs without a shell: for pipes, use sh -c '...')"
        )
        try:
            proc = subprocess.Popen(
                words,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=None,  # its own diagnostics go where ours go; its stdout is the secret
                start_new_session=True,  # on a timeout its whole process group is killed
            )
        except OSError as exc:
            why = "not found" if isinstance(exc, FileNotFoundError) else exc.strerror
            raise PasswordProviderError(
                f"{name} cannot be run: {why}. {fix}; give its full path if it is not "
                "on the PATH of every executor"
            ) from None
        try:
            out, _ = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise PasswordProviderError(
                f"{name} did not finish within {self.timeout_s:g} s (killed). {fix}"
            ) from None
        if proc.returncode != 0:
            raise PasswordProviderError(
                f"{name} failed (exit status {proc.returncode}; its output is not shown, "
                f"its error output is in this process's log). {fix}"
            )
        password = out.decode("utf-8", errors="replace").rstrip("\r\n")
        if not password:
            raise PasswordProviderError(f"{name} printed no password. {fix}")
        return password

    def _call(self) -> str:
        module_name, _, attr = self.spec.partition(":")
        name = self.describe()
        fix = (
            "Fix: the module must be importable by the driver's and the executors' Python "
            "(installed, or shipped with --py-files / addPyFile), and the function must "
            "take no argument and return the password as a str"
        )
        try:
            target: object = importlib.import_module(module_name)
            for part in attr.split("."):
                target = getattr(target, part)
        except Exception as exc:
            raise PasswordProviderError(
                f"{name} cannot be imported ({type(exc).__name__}). {fix}"
            ) from None
        if not callable(target):
            raise PasswordProviderError(f"{name} is not callable. {fix}")
        try:
            password = target()
        except Exception as exc:  # its message may quote what it read: only its type
            raise PasswordProviderError(
                f"{name} raised {type(exc).__name__} (its message is not shown). {fix}"
            ) from None
        if not isinstance(password, str) or not password:
            got = "an empty str" if isinstance(password, str) else type(password).__name__
            raise PasswordProviderError(f"{name} returned {got}, not a password. {fix}")
        return password


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except OSError:
        proc.kill()
    try:
        proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:  # a grandchild outside the group holds the pipe
        if proc.stdout is not None:
            proc.stdout.close()
        proc.wait()


def known_passwords() -> frozenset[str]:
    """Every password a source returned in this process (for scrubbing messages)."""
    with _LOCK:
        return frozenset(_KNOWN)


_LOCK = threading.Lock()
_KEY_LOCKS: dict[tuple[str, str], threading.Lock] = {}
_CACHE: dict[tuple[str, str], tuple[str, float]] = {}
_KNOWN: set[str] = set()
