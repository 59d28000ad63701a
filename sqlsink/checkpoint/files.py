"""Where a checkpoint is, and how its files are read: locally or through ``pyarrow.fs``.

A local path or a ``file:`` URI is read directly; any other URI through
``pyarrow.fs`` (``s3a://`` and ``s3n://`` as ``s3://``), where pyarrow supports the
scheme and finds credentials in the environment; otherwise it cannot be read here.
A location as shown (in messages, in the commit log) has a URI's password and query
string replaced by ``***``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse, urlunparse

from sqlsink.errors import ConfigError

_ARROW_SCHEMES = {"s3a": "s3", "s3n": "s3"}  # Hadoop's names for what pyarrow calls s3


def is_local(location: str) -> bool:
    """A plain path (also ``C:\\...``) or a ``file:`` URI: read without pyarrow."""
    scheme = urlparse(location).scheme
    return scheme in ("", "file") or re.fullmatch(r"[A-Za-z]", scheme) is not None


def local_path(location: str) -> Path:
    """The local directory of a checkpoint location (a path or a file: URI)."""
    parsed = urlparse(location)
    if not is_local(location):
        raise ConfigError(
            f"checkpoint {display_location(location)!r} is not a local directory (scheme "
            f"{parsed.scheme!r})"
        )
    return Path(unquote(parsed.path) if parsed.scheme == "file" else location)


def display_location(location: str) -> str:
    """The location for messages and the commit log: a password or a query string
    (a signed URL's token) in a URI is replaced by ``***``."""
    parsed = urlparse(location)
    if is_local(location) or (parsed.password is None and not parsed.query):
        return location
    netloc = parsed.netloc
    if parsed.password is not None:
        netloc = f"{parsed.username or ''}:***@{netloc.rsplit('@', 1)[1]}"
    return urlunparse(parsed._replace(netloc=netloc, query="***" if parsed.query else ""))


# -- file access: local, or through pyarrow.fs ---------------------------------------------


class Files(Protocol):
    """The files of a checkpoint, wherever they are."""

    def is_dir(self, path: str) -> bool: ...

    def is_file(self, path: str) -> bool: ...

    def names(self, folder: str) -> list[str] | None:
        """Names of the plain files in ``folder``; None when it does not exist."""
        ...

    def read_text(self, path: str) -> str: ...


class LocalFiles:
    """A local directory seen as ``Files``."""

    def is_dir(self, path: str) -> bool:
        return Path(path).is_dir()

    def is_file(self, path: str) -> bool:
        return Path(path).is_file()

    def names(self, folder: str) -> list[str] | None:
        if not Path(folder).is_dir():
            return None
        return [f.name for f in Path(folder).iterdir() if f.is_file()]

    def read_text(self, path: str) -> str:
        return Path(path).read_text(encoding="utf-8")


class ArrowFiles:
    """A ``pyarrow.fs.FileSystem`` seen as ``Files``."""

    def __init__(self, filesystem: Any) -> None:
        self.fs = filesystem

    def _type(self, path: str) -> Any:
        return self.fs.get_file_info(path).type

    def is_dir(self, path: str) -> bool:
        from pyarrow.fs import FileType

        return bool(self._type(path) == FileType.Directory)

    def is_file(self, path: str) -> bool:
        from pyarrow.fs import FileType

        return bool(self._type(path) == FileType.File)

    def names(self, folder: str) -> list[str] | None:
        from pyarrow.fs import FileSelector, FileType

        if not self.is_dir(folder):
            return None
        infos = self.fs.get_file_info(FileSelector(folder, allow_not_found=True))
        return [str(i.base_name) for i in infos if i.type == FileType.File]

    def read_text(self, path: str) -> str:
        with self.fs.open_input_stream(path) as stream:
            return bytes(stream.read()).decode("utf-8")


def open_files(location: str, filesystem: Any = None) -> tuple[Files, str]:
    """The files of a checkpoint and its root path among them. ``filesystem``: a
    ``pyarrow.fs.FileSystem`` to read ``location`` (a path inside it) through."""
    if filesystem is not None:
        return ArrowFiles(filesystem), location.rstrip("/") or "/"
    if is_local(location):
        return LocalFiles(), str(local_path(location))
    parsed = urlparse(location)
    uri = location
    if parsed.scheme.lower() in _ARROW_SCHEMES:
        uri = urlunparse(parsed._replace(scheme=_ARROW_SCHEMES[parsed.scheme.lower()]))
    shown = display_location(location)
    try:
        from pyarrow.fs import FileSystem

        fs, root = FileSystem.from_uri(uri)
    except (ImportError, OSError, ValueError, NotImplementedError, RuntimeError) as exc:
        raise ConfigError(
            f"checkpoint {shown!r} cannot be read here: pyarrow.fs does not open it "
            f"({type(exc).__name__}: {first_line(exc, location)})"
        ) from None
    return ArrowFiles(fs), str(root).rstrip("/") or "/"


def first_line(exc: BaseException, location: str) -> str:
    """The error's first line, without the URI's password or query (pyarrow echoes it)."""
    text = str(exc).strip()
    line = text.splitlines()[0][:300] if text else "no detail"
    parsed = urlparse(location)
    for secret in (parsed.password, parsed.query):
        if secret:
            line = line.replace(secret, "***")
    return line


def join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts]) if root != "/" else "/" + "/".join(parts)
