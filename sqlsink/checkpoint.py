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

``relate`` compares those logs with the sink's decisions, batch by batch, and says
what Spark and the sink will do on restart (DESIGN.md section 3).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from sqlsink.errors import ConfigError

_BATCH_FILE = re.compile(r"0|[1-9][0-9]{0,18}")


@dataclass(frozen=True)
class OffsetEntry:
    batch_id: int
    timestamp_ms: int | None  # batchTimestampMs: when Spark planned the batch
    sources: int  # number of source offset lines


@dataclass
class Checkpoint:
    path: Path
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


def local_path(location: str) -> Path:
    """The local directory of a checkpoint location (a path or a file: URI)."""
    parsed = urlparse(location)
    if parsed.scheme in ("", "file") or re.fullmatch(r"[A-Za-z]", parsed.scheme):
        return Path(unquote(parsed.path) if parsed.scheme == "file" else location)
    raise ConfigError(
        f"checkpoint {location!r}: only a local directory can be read here (scheme "
        f"{parsed.scheme!r}); copy its metadata, offsets/ and commits/ to a local "
        "directory (e.g. hdfs dfs -get, aws s3 cp --recursive) and pass that"
    )


def read_checkpoint(location: str) -> Checkpoint:
    """Read ``metadata``, ``offsets/`` and ``commits/``; a ConfigError if it is not a checkpoint."""
    path = local_path(location)
    if not path.is_dir():
        raise ConfigError(f"checkpoint {str(path)!r} is not a directory (or is not readable)")
    metadata = path / "metadata"
    try:
        first_line = metadata.read_text(encoding="utf-8").splitlines()[0]
        query_id = json.loads(first_line)["id"]
        if not isinstance(query_id, str) or not query_id:
            raise TypeError(query_id)
    except FileNotFoundError:
        raise ConfigError(
            f"{str(path)!r} is not a Spark streaming checkpoint: it has no 'metadata' file "
            "(pass the query's checkpointLocation, the directory holding metadata, offsets/ "
            "and commits/)"
        ) from None
    except (OSError, IndexError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(
            f"cannot read the query id from {str(metadata)!r} (expected a first line like "
            f'{{"id":"<uuid>"}}): {type(exc).__name__}: {exc}'
        ) from None
    checkpoint = Checkpoint(path, query_id)
    for batch_id, file in _entries(path / "offsets", checkpoint):
        entry = _read_offsets(batch_id, file, checkpoint)
        if entry is not None:
            checkpoint.offsets[batch_id] = entry
    for batch_id, file in _entries(path / "commits", checkpoint):
        if _read_lines(file, checkpoint) is not None:
            checkpoint.commits.add(batch_id)
    return checkpoint


def _entries(folder: Path, checkpoint: Checkpoint) -> list[tuple[int, Path]]:
    if not folder.is_dir():
        return []
    try:
        files = list(folder.iterdir())
    except OSError as exc:
        checkpoint.problems.append(f"{folder}: {exc.strerror or exc}")
        return []
    # .crc files, hidden temporary files (.N.<uuid>.tmp) and anything else are ignored
    return sorted((int(f.name), f) for f in files if _BATCH_FILE.fullmatch(f.name) and f.is_file())


def _read_lines(file: Path, checkpoint: Checkpoint) -> list[str] | None:
    try:
        lines = file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        checkpoint.problems.append(f"{file}: unreadable ({type(exc).__name__}: {exc})")
        return None
    if not lines or not re.fullmatch(r"v\d+", lines[0].strip()):
        checkpoint.problems.append(f"{file}: not a Spark log entry (no 'v1' header); ignored")
        return None
    return lines


def _read_offsets(batch_id: int, file: Path, checkpoint: Checkpoint) -> OffsetEntry | None:
    lines = _read_lines(file, checkpoint)
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
