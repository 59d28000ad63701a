"""A Spark streaming checkpoint, read without Spark, and how it relates to the commit log.

A checkpoint directory holds (among other things):

- ``metadata``: one JSON line, ``{"id": "<query id>"}`` (the id survives restarts);
- ``offsets/<N>``: written before batch N runs: ``v1``, a JSON line of batch metadata
  (``batchTimestampMs``, ``batchWatermarkMs``, ``conf``), then one line per source;
- ``commits/<N>``: written after the sink's ``commit`` of batch N returned: ``v1`` and
  a JSON line (``nextBatchWatermarkMs``).

Spark writes each file to a hidden temporary file and renames it, and keeps ``.crc``
files beside them (``.<N>.crc``); only names that are a batch number count. Spark
deletes old entries (``spark.sql.streaming.minBatchesToRetain``, default 100), so
the checkpoint shows only its most recent batches.

A local path or a ``file:`` URI is read directly; any other URI through
``pyarrow.fs`` (``s3a://`` and ``s3n://`` as ``s3://``), where pyarrow supports the
scheme and finds credentials in the environment; otherwise it cannot be read here.

``relate`` compares those logs with the sink's decisions, batch by batch, and says
what Spark and the sink will do on restart (DESIGN.md section 3); the sink itself
compares ``commits/`` with its decisions at commit time (``checkpoint_policy``, and
``sqlsink.core.checkpoint_check``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlparse, urlunparse

from sqlsink.core.checkpoint_check import CheckpointMode, CheckpointPolicy, Unreadable
from sqlsink.errors import ConfigError

_BATCH_FILE = re.compile(r"0|[1-9][0-9]{0,18}")
_ARROW_SCHEMES = {"s3a": "s3", "s3n": "s3"}  # Hadoop's names for what pyarrow calls s3


@dataclass(frozen=True)
class OffsetEntry:
    batch_id: int
    timestamp_ms: int | None  # batchTimestampMs: when Spark planned the batch
    sources: int  # number of source offset lines


@dataclass
class Checkpoint:
    path: str  # the directory, or the URI as shown (no secrets)
    query_id: str
    offsets: dict[int, OffsetEntry] = field(default_factory=dict)
    commits: set[int] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)  # unreadable entries, with the file

    @property
    def last_offsets(self) -> int | None:
        return max(self.offsets) if self.offsets else None

    @property
    def last_commit(self) -> int | None:
        return max(self.commits) if self.commits else None


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


class _Files(Protocol):
    def is_dir(self, path: str) -> bool: ...

    def is_file(self, path: str) -> bool: ...

    def names(self, folder: str) -> list[str] | None:
        """Names of the plain files in ``folder``; None when it does not exist."""
        ...

    def read_text(self, path: str) -> str: ...


class _LocalFiles:
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


class _ArrowFiles:
    """A ``pyarrow.fs.FileSystem`` seen as ``_Files``."""

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


def _open(location: str, filesystem: Any = None) -> tuple[_Files, str]:
    """The files of a checkpoint and its root path among them. ``filesystem``: a
    ``pyarrow.fs.FileSystem`` to read ``location`` (a path inside it) through."""
    if filesystem is not None:
        return _ArrowFiles(filesystem), location.rstrip("/") or "/"
    if is_local(location):
        return _LocalFiles(), str(local_path(location))
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
            f"({type(exc).__name__}: {_first_line(exc, location)})"
        ) from None
    return _ArrowFiles(fs), str(root).rstrip("/") or "/"


def _first_line(exc: BaseException, location: str) -> str:
    """The error's first line, without the URI's password or query (pyarrow echoes it)."""
    text = str(exc).strip()
    line = text.splitlines()[0][:300] if text else "no detail"
    parsed = urlparse(location)
    for secret in (parsed.password, parsed.query):
        if secret:
            line = line.replace(secret, "***")
    return line


def _join(root: str, *parts: str) -> str:
    return "/".join([root.rstrip("/"), *parts]) if root != "/" else "/" + "/".join(parts)


def read_checkpoint(location: str, *, filesystem: Any = None) -> Checkpoint:
    """Read ``metadata``, ``offsets/`` and ``commits/``; a ConfigError if it is not a checkpoint."""
    files, root = _open(location, filesystem)
    shown = root if isinstance(files, _LocalFiles) else display_location(location)
    try:
        query_id = _query_id(files, root, shown)
    except OSError as exc:
        detail = _first_line(exc, location)
        raise ConfigError(f"checkpoint {shown!r} cannot be read: {detail}") from None
    checkpoint = Checkpoint(shown, query_id)
    for batch_id, file in _entries(files, _join(root, "offsets"), checkpoint):
        entry = _read_offsets(batch_id, files, file, checkpoint)
        if entry is not None:
            checkpoint.offsets[batch_id] = entry
    for batch_id, file in _entries(files, _join(root, "commits"), checkpoint):
        if _read_lines(files, file, checkpoint) is not None:
            checkpoint.commits.add(batch_id)
    return checkpoint


def read_commits(location: str, *, filesystem: Any = None) -> frozenset[int]:
    """The batch ids in ``commits/`` (by name: Spark renames a complete file into place).

    A ConfigError when the location is not readable as a checkpoint (no directory, no
    ``metadata``): an empty answer must mean "nothing committed", never "not found"."""
    files, root = _open(location, filesystem)
    shown = root if isinstance(files, _LocalFiles) else display_location(location)
    try:
        if not files.is_dir(root):
            raise ConfigError(f"checkpoint {shown!r} is not a directory (or is not readable)")
        if not files.is_file(_join(root, "metadata")):
            raise ConfigError(
                f"{shown!r} is not a Spark streaming checkpoint here: it has no 'metadata' file"
            )
        names = files.names(_join(root, "commits")) or []
    except OSError as exc:
        detail = _first_line(exc, location)
        raise ConfigError(f"checkpoint {shown!r} cannot be read: {detail}") from None
    return frozenset(int(n) for n in names if _BATCH_FILE.fullmatch(n))


def checkpoint_policy(
    location: str | None, mode: CheckpointMode, *, filesystem: Any = None
) -> CheckpointPolicy:
    """How the sink relates this checkpoint to its log at commit time."""

    def read() -> frozenset[int] | Unreadable:
        assert location is not None
        try:
            return read_commits(location, filesystem=filesystem)
        except ConfigError as exc:
            return Unreadable(str(exc))

    shown = None if location is None else display_location(location)
    return CheckpointPolicy(shown, read, mode)


def _query_id(files: _Files, root: str, shown: str) -> str:
    if not files.is_dir(root):
        raise ConfigError(f"checkpoint {shown!r} is not a directory (or is not readable)")
    metadata = _join(root, "metadata")
    if not files.is_file(metadata):
        raise ConfigError(
            f"{shown!r} is not a Spark streaming checkpoint: it has no 'metadata' file "
            "(pass the query's checkpointLocation, the directory holding metadata, offsets/ "
            "and commits/)"
        )
    try:
        first_line = files.read_text(metadata).splitlines()[0]
        query_id = json.loads(first_line)["id"]
        if not isinstance(query_id, str) or not query_id:
            raise TypeError(query_id)
    except (OSError, IndexError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"cannot read the query id from {shown}/metadata (expected a first line like "
            f'{{"id":"<uuid>"}}): {type(exc).__name__}: {exc}'
        ) from None
    return str(query_id)


def _entries(files: _Files, folder: str, checkpoint: Checkpoint) -> list[tuple[int, str]]:
    try:
        names = files.names(folder)
    except OSError as exc:
        checkpoint.problems.append(f"{folder}: {exc.strerror or exc}")
        return []
    # .crc files, hidden temporary files (.N.<uuid>.tmp) and anything else are ignored
    found = [(int(n), _join(folder, n)) for n in names or () if _BATCH_FILE.fullmatch(n)]
    return sorted(found)


def _read_lines(files: _Files, file: str, checkpoint: Checkpoint) -> list[str] | None:
    try:
        lines = files.read_text(file).splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        checkpoint.problems.append(f"{file}: unreadable ({type(exc).__name__}: {exc})")
        return None
    if not lines or not re.fullmatch(r"v\d+", lines[0].strip()):
        checkpoint.problems.append(f"{file}: not a Spark log entry (no 'v1' header); ignored")
        return None
    return lines


def _read_offsets(
    batch_id: int, files: _Files, file: str, checkpoint: Checkpoint
) -> OffsetEntry | None:
    lines = _read_lines(files, file, checkpoint)
    if lines is None:
        return None
    timestamp: int | None = None
    if len(lines) > 1:
        try:
            meta = json.loads(lines[1])
            raw = meta.get("batchTimestampMs") if isinstance(meta, dict) else None
            timestamp = int(raw) if isinstance(raw, (int, float)) else None
        except ValueError:
            pass
    return OffsetEntry(batch_id, timestamp, max(len(lines) - 2, 0))


# -- the relation with the commit log -----------------------------------------------------


@dataclass(frozen=True)
class DecisionState:
    """What the commit log says of one batch (the CLI fills it from sqlsink.decisions)."""

    complete: bool
    rows: int
    gids: int  # how many gids the decision names
    prepared: int  # how many of them are still prepared


@dataclass(frozen=True)
class BatchRelation:
    batch_id: int
    offsets: bool
    spark_committed: bool
    decision: str  # "complete" | "incomplete" | "none"
    rows: int | None
    state: str  # see STATES
    level: str  # "ok" | "info" | "warning"
    message: str


STATES = {
    "consistent": "committed in Spark's commit log and in PostgreSQL",
    "finishing": "committed in Spark; decided in PostgreSQL, some transactions still prepared",
    "replay_skip": "decided in PostgreSQL, not in Spark's commit log: replayed and skipped",
    "rerun": "offsets but no decision: Spark re-runs it",
    "no_decision": "committed in Spark but no decision in PostgreSQL",
    "ahead": "decided in PostgreSQL beyond the checkpoint's last offsets",
    "commit_without_offsets": "a commit entry without offsets (partly purged checkpoint)",
    "undecided": "prepared transactions, neither offsets nor a decision: rolled back",
    "purged": "decided in PostgreSQL, no longer in the checkpoint",
}


def relate(
    checkpoint: Checkpoint,
    decisions: Mapping[int, DecisionState],
    *,
    undecided_prepared: Mapping[int, int] | None = None,
    first_decided: int | None = None,
) -> list[BatchRelation]:
    """Per batch, how Spark's logs relate to the sink's decisions, and what happens next.

    ``decisions``: the sink's decisions from the checkpoint's oldest batch on.
    ``undecided_prepared``: per batch, prepared gids of the sink without a decision.
    ``first_decided``: the sink's first decided batch (default: the first in ``decisions``).
    """
    undecided_prepared = undecided_prepared or {}
    known = set(checkpoint.offsets) | checkpoint.commits
    oldest = min(known) if known else 0
    last_offsets = checkpoint.last_offsets if checkpoint.last_offsets is not None else -1
    if first_decided is None and decisions:
        first_decided = min(decisions)
    batches = sorted(known | {b for b in decisions if b >= oldest} | set(undecided_prepared))
    out: list[BatchRelation] = []
    for batch in batches:
        has_offsets = batch in checkpoint.offsets
        committed = batch in checkpoint.commits
        decision = decisions.get(batch)
        kind = "none" if decision is None else "complete" if decision.complete else "incomplete"
        rows = decision.rows if decision else None
        state, level, message = _relation(
            batch,
            has_offsets,
            committed,
            decision,
            last_offsets,
            first_decided,
            undecided_prepared.get(batch, 0),
        )
        out.append(BatchRelation(batch, has_offsets, committed, kind, rows, state, level, message))
    return out


def _relation(
    batch: int,
    has_offsets: bool,
    committed: bool,
    decision: DecisionState | None,
    last_offsets: int,
    first_decided: int | None,
    undecided_prepared: int,
) -> tuple[str, str, str]:
    rest = ""
    if decision is not None and decision.prepared:
        rest = (
            f"; {decision.prepared} of its {decision.gids} transaction(s) are still prepared: "
            "recovery commits them"
        )
    if committed and decision is not None:
        if decision.complete:
            return "consistent", "ok", f"batch {batch} is committed in Spark and in PostgreSQL"
        return (
            "finishing",
            "warning",
            f"batch {batch} is committed in Spark's commit log and decided in PostgreSQL, "
            f"but not every transaction of it is committed yet{rest}",
        )
    if committed:
        if first_decided is None or batch < first_decided:
            return (
                "no_decision",
                "info",
                f"batch {batch} is in Spark's commit log but has no decision in PostgreSQL: "
                "older than the sink's first decision (the sink wrote nothing then, or the "
                "log was reset)",
            )
        return (
            "no_decision",
            "warning",
            f"batch {batch} is in Spark's commit log but has no decision in PostgreSQL: an "
            "empty batch committed without a sink id, or its decision row was deleted; if "
            "it wrote rows, they are not in PostgreSQL",
        )
    if has_offsets and decision is not None:
        return (
            "replay_skip",
            "info",
            f"batch {batch} is committed in PostgreSQL but not in Spark's commit log; Spark "
            f"will replay it and the sink will skip it{rest}",
        )
    if has_offsets:
        extra = (
            f"; its {undecided_prepared} prepared transaction(s) are rolled back by recovery"
            if undecided_prepared
            else ""
        )
        level = "info" if batch == last_offsets else "warning"
        note = "" if batch == last_offsets else " (not the last batch: unusual)"
        return (
            "rerun",
            level,
            f"batch {batch} has offsets but no decision: Spark will re-run it{note}{extra}",
        )
    if decision is not None and batch > last_offsets:
        return (
            "ahead",
            "warning",
            f"batch {batch} is decided in PostgreSQL but the checkpoint has no offsets for "
            f"it (its last offsets are for batch {last_offsets}): the checkpoint is behind the "
            "commit log (restored from an older copy?). When Spark reaches this batch id the "
            "sink skips it as already written, whatever rows it holds then",
        )
    if decision is not None:
        return (
            "purged",
            "info",
            f"batch {batch} is decided in PostgreSQL; Spark's checkpoint no longer holds it{rest}",
        )
    if undecided_prepared:
        return (
            "undecided",
            "info",
            f"batch {batch} has prepared transactions but neither offsets nor a decision: "
            f"recovery rolls back its {undecided_prepared} prepared transaction(s)",
        )
    return (
        "commit_without_offsets",
        "info",
        f"batch {batch}: a commit entry without offsets (Spark purged part of the checkpoint)",
    )
