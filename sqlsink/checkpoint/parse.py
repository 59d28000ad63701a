"""Spark's checkpoint logs parsed: ``metadata``, ``offsets/`` and ``commits/``.

``read_checkpoint`` reads all three (for ``sqlsink recover`` and ``status``);
``read_commits`` only the batch ids in ``commits/`` (by name), and
``checkpoint_policy`` makes of it the reader the sink's own check calls at commit
time (``sqlsink.core.checkpoint_check``). Only names that are a batch number count:
``.crc`` files and hidden temporary files are passed over, and an entry without its
``v1`` header is reported as a problem, not read.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from sqlsink.checkpoint.files import (
    Files,
    LocalFiles,
    display_location,
    first_line,
    join,
    open_files,
)
from sqlsink.core.checkpoint_check import CheckpointMode, CheckpointPolicy, Unreadable
from sqlsink.errors import ConfigError

_BATCH_FILE = re.compile(r"0|[1-9][0-9]{0,18}")


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


def read_checkpoint(location: str, *, filesystem: Any = None) -> Checkpoint:
    """Read ``metadata``, ``offsets/`` and ``commits/``; a ConfigError if it is not a checkpoint."""
    files, root = open_files(location, filesystem)
    shown = root if isinstance(files, LocalFiles) else display_location(location)
    try:
        query_id = _query_id(files, root, shown)
    except OSError as exc:
        detail = first_line(exc, location)
        raise ConfigError(f"checkpoint {shown!r} cannot be read: {detail}") from None
    checkpoint = Checkpoint(shown, query_id)
    for batch_id, file in _entries(files, join(root, "offsets"), checkpoint):
        entry = _read_offsets(batch_id, files, file, checkpoint)
        if entry is not None:
            checkpoint.offsets[batch_id] = entry
    for batch_id, file in _entries(files, join(root, "commits"), checkpoint):
        if _read_lines(files, file, checkpoint) is not None:
            checkpoint.commits.add(batch_id)
    return checkpoint


def read_commits(location: str, *, filesystem: Any = None) -> frozenset[int]:
    """The batch ids in ``commits/`` (by name: Spark renames a complete file into place).

    A ConfigError when the location is not readable as a checkpoint (no directory, no
    ``metadata``): an empty answer must mean "nothing committed", never "not found"."""
    files, root = open_files(location, filesystem)
    shown = root if isinstance(files, LocalFiles) else display_location(location)
    try:
        if not files.is_dir(root):
            raise ConfigError(f"checkpoint {shown!r} is not a directory (or is not readable)")
        if not files.is_file(join(root, "metadata")):
            raise ConfigError(
                f"{shown!r} is not a Spark streaming checkpoint here: it has no 'metadata' file"
            )
        names = files.names(join(root, "commits")) or []
    except OSError as exc:
        detail = first_line(exc, location)
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


def _query_id(files: Files, root: str, shown: str) -> str:
    if not files.is_dir(root):
        raise ConfigError(f"checkpoint {shown!r} is not a directory (or is not readable)")
    metadata = join(root, "metadata")
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


def _entries(files: Files, folder: str, checkpoint: Checkpoint) -> list[tuple[int, str]]:
    try:
        names = files.names(folder)
    except OSError as exc:
        checkpoint.problems.append(f"{folder}: {exc.strerror or exc}")
        return []
    # .crc files, hidden temporary files (.N.<uuid>.tmp) and anything else are ignored
    found = [(int(n), join(folder, n)) for n in names or () if _BATCH_FILE.fullmatch(n)]
    return sorted(found)


def _read_lines(files: Files, file: str, checkpoint: Checkpoint) -> list[str] | None:
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
    batch_id: int, files: Files, file: str, checkpoint: Checkpoint
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
