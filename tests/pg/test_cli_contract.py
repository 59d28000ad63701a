"""The ``--json`` output of every command against its contract, ``sqlsink.cli.contract``.

Each command runs as a user runs it (a new process), in a database of the test's own
that holds every kind of thing the documents describe: decided and undecided gids,
another application's gid, a connected task, a held sink lock, a data loss, a
checkpoint. Each document is then walked against its ``TypedDict``: every required key
present, no unknown key, every value of its declared type. The walk records which
``TypedDict``s it met with at least one real object, so an empty list cannot pass for
a checked one.
"""

from __future__ import annotations

import contextlib
import os
import time
import types
import typing
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, Union

import psycopg
import pytest
from psycopg import sql

from sqlsink.cli import contract
from sqlsink.cli.contract import (
    CheckDocument,
    Envelope,
    ErrorJson,
    ForgetDocument,
    RecoverDocument,
    StatusDocument,
)
from sqlsink.core.checkpoint_check import Verdict
from sqlsink.core.model import BatchFigures, PartitionFigures
from sqlsink.postgres import checkpoint_records, run_registry, views
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.locks import sink_lock
from sqlsink.postgres.schema import ensure_schema
from sqlsink.tablename import TableName
from tests.fix_pg import PgServer, prepared_transactions, rollback_all_prepared
from tests.pg.test_cli import (
    RUN,
    Db,
    Result,
    decide,
    make_checkpoint,
    prepare,
    prepare_foreign,
    sqlsink,
)

SINK = "contract-a"  # decided, undecided and orphan gids; a task connected; its lock held
LOSSY = "contract-d"  # a decided gid rolled back by someone: data loss
ENDED = "contract-e"  # its run's end recorded by its driver: failed, with the error
QUERY = "contract-query"
DOCUMENTS: dict[str, type[Any]] = {
    "recover": RecoverDocument,
    "status": StatusDocument,
    "check": CheckDocument,
    "forget": ForgetDocument,
}
# the TypedDicts each test meets with real objects (together: every one of the contract)
RECOVER_TYPES = {
    RecoverDocument, contract.RecoverSinkJson, contract.ActionJson, contract.SessionJson,
    contract.DataLossJson, contract.CheckpointJson, contract.CheckpointBatchJson,
    contract.NoticeJson, contract.RunJson,
}  # fmt: skip
STATUS_TYPES = {
    StatusDocument, contract.StatusSinkJson, contract.RecentBatchJson, contract.PreparedJson,
    contract.OtherPreparedJson, contract.SessionJson, contract.DataLossJson, contract.NoticeJson,
    contract.RunJson, contract.CheckpointCheckJson, contract.ConsistentViewJson,
    contract.HiddenBatchJson, contract.LastBatchJson, contract.BatchFiguresJson,
    contract.PartitionWriteJson, contract.RunEndJson, contract.InDoubtJson,
}  # fmt: skip
CHECK_TYPES = {CheckDocument, contract.FindingJson}
FORGET_TYPES = {ForgetDocument}
FAILURE_TYPES = {Envelope, ErrorJson, *DOCUMENTS.values()}


# -- the walk -----------------------------------------------------------------------------


class Shape:
    """Checks JSON values against the contract's types; remembers the TypedDicts it met."""

    def __init__(self) -> None:
        self.seen: set[type[Any]] = set()

    def check(self, value: object, hint: Any, path: str = "$") -> None:
        origin = typing.get_origin(hint)
        if typing.is_typeddict(hint):
            self._typed_dict(value, hint, path)
        elif origin is typing.Annotated or _is_required_marker(origin):
            self.check(value, typing.get_args(hint)[0], path)
        elif origin is Literal:
            assert value in typing.get_args(hint), f"{path}: {value!r} is not one of {hint}"
        elif origin in (Union, types.UnionType):
            self._union(value, hint, path)
        elif origin is list:
            assert isinstance(value, list), f"{path}: {value!r} is not a list"
            (item,) = typing.get_args(hint)
            for i, v in enumerate(value):
                self.check(v, item, f"{path}[{i}]")
        else:
            _scalar(value, hint, path)

    def _typed_dict(self, value: object, hint: Any, path: str) -> None:
        assert isinstance(value, dict), f"{path}: {value!r} is not an object"
        fields = typing.get_type_hints(hint, include_extras=True)
        missing = hint.__required_keys__ - set(value)
        unknown = set(value) - set(fields)
        assert not missing, f"{path}: {hint.__name__} misses {sorted(missing)}"
        assert not unknown, f"{path}: {hint.__name__} has no {sorted(unknown)}"
        for key, v in value.items():
            self.check(v, fields[key], f"{path}.{key}")
        self.seen.add(hint)

    def _union(self, value: object, hint: Any, path: str) -> None:
        errors = []
        for option in typing.get_args(hint):
            attempt = Shape()
            try:
                attempt.check(value, option, path)
            except AssertionError as exc:
                errors.append(str(exc))
                continue
            self.seen |= attempt.seen
            return
        raise AssertionError(f"{path}: {value!r} matches none of {hint}: {errors}")

    def document(self, result: Result, command: str) -> dict[str, Any]:
        """The output of a --json run: its document, or (error set) the bare envelope."""
        doc = result.json
        assert doc["command"] == command and doc["version"] == contract.JSON_VERSION
        assert doc["exit_code"] == result.code, result.err
        bare = doc.get("error") is not None and set(doc) == set(Envelope.__annotations__)
        self.check(doc, Envelope if bare else DOCUMENTS[command])
        return doc


def _is_required_marker(origin: object) -> bool:
    names = {"Required", "NotRequired"}
    return getattr(origin, "_name", None) in names or getattr(origin, "__name__", "") in names


def _scalar(value: object, hint: Any, path: str) -> None:
    if hint is type(None):
        assert value is None, f"{path}: {value!r} is not null"
    elif hint is datetime:  # an ISO-8601 string in the JSON
        assert isinstance(value, str), f"{path}: {value!r} is not a timestamp"
        datetime.fromisoformat(value)
    elif hint is float:  # a JSON number
        assert isinstance(value, (int, float)) and not isinstance(value, bool), path
    elif hint in (int, str, bool):
        assert type(value) is hint, f"{path}: {value!r} is not {hint.__name__}"
    else:
        raise AssertionError(f"{path}: the walk does not know the type {hint!r}")


# -- the database -------------------------------------------------------------------------


@pytest.fixture
def db(pg_server: PgServer) -> Iterator[Db]:
    """A database of the test's own, with the sqlsink schema and a target table ``t``."""
    with pg_server.database("cli_contract") as url:
        name = str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])
        with psycopg.connect(url, autocommit=True) as conn:
            ensure_schema(conn)
            conn.execute("CREATE TABLE t (id bigint PRIMARY KEY)")
        try:
            yield Db(name, url, pg_server)
        finally:  # a database with prepared transactions cannot be dropped
            left = [t for t in prepared_transactions(pg_server.admin_url) if t[1] == name]
            rollback_all_prepared(pg_server, left)


FIGURES = BatchFigures(
    partitions=1,
    rows=2,
    bytes_sent=None,
    writes=(PartitionFigures(0, 2, 12.5),),
    prepare_to_decision_ms=20.0,
    decision_ms=2.0,
    commit_prepared_ms=1.0,
    completion_ms=0.5,
    commit_ms=1.5,
    orphans=0,
)  # SINK's batch 3's, as its commit recorded them


def leftovers(db: Db) -> None:
    """Batch 3 of SINK complete; batch 4 decided, one of its gids committed (its consistent
    view hides it), with an orphan attempt; batch 5 undecided. LOSSY's batch 2 decided,
    one of its gids rolled back by someone. Another application's prepared transaction.
    SINK's run is live (a fresh heartbeat)."""
    with db.connect() as conn:
        run_registry.register_run(conn, SINK, RUN, 300.0, holds_lock=False)
        verdict = Verdict("verified", "commits/ 0-2 all decided", ())
        checkpoint_records.record_checkpoint_check(conn, SINK, RUN, 3, "/chk/q", verdict)
    done = prepare(db, SINK, 3, 0, range(0, 2))
    decide(db, SINK, 3, [done], 2, query=QUERY)
    with db.connect() as conn:
        PostgresBackend(conn).commit_prepared(done)
        PostgresBackend(conn).mark_complete(SINK, [3])
        PostgresBackend(conn).record_metrics(SINK, 3, 1.5, 0, figures=FIGURES)
    decided = [prepare(db, SINK, 4, p, range(10 + 5 * p, 15 + 5 * p)) for p in (0, 1)]
    prepare(db, SINK, 4, 0, range(100, 105), attempt=777)
    decide(db, SINK, 4, decided, 10, query=QUERY)
    with db.connect() as conn:
        views.keep_view(conn, TableName("public", "v"), TableName("public", "t"), SINK)
        PostgresBackend(conn).commit_prepared(decided[0])
    prepare(db, SINK, 5, 0, range(200, 205))
    lossy = [prepare(db, LOSSY, 2, p, range(300 + 5 * p, 305 + 5 * p)) for p in (0, 1)]
    decide(db, LOSSY, 2, lossy, 10, query="another-query")
    with db.connect() as conn:
        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(lossy[1])))
    prepare_foreign(db, f"app_tx_{uuid.uuid4().hex[:6]}")


@contextlib.contextmanager
def sink_is_live(db: Db) -> Iterator[None]:
    """A task of SINK connected, and another session holding SINK's lock; both gone after."""
    name = f"sqlsink sink {SINK}, batch 6, partition 0"
    with (
        psycopg.connect(db.url, autocommit=True, application_name=name) as task,
        psycopg.connect(db.url, autocommit=True) as holder,
        sink_lock(holder, SINK, 5.0),
    ):
        pids = [task.info.backend_pid, holder.info.backend_pid]
        yield
    with db.connect() as conn:  # a closed session leaves pg_stat_activity soon after
        for _ in range(100):
            query = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)"
            row = conn.execute(query, (pids,)).fetchone()
            if row is not None and row[0] == 0:
                return
            time.sleep(0.1)
    pytest.fail(f"sessions {pids} still connected")


# -- the commands -------------------------------------------------------------------------


def test_recover_documents_follow_the_contract(db: Db, tmp_path: Path) -> None:
    leftovers(db)
    checkpoint = make_checkpoint(tmp_path / "chk", QUERY, [3, 4, 5], [3])
    shape = Shape()
    with sink_is_live(db):
        dry = sqlsink("recover", "--url", db.url, "--dry-run", "--json")
        assert dry.code == 3, dry.err  # LOSSY's loss
        doc = shape.document(dry, "recover")
        assert doc["dry_run"] is True and doc["data_loss"] and doc["warnings"]
        sink = next(s for s in doc["sinks"] if s["sink_id"] == SINK)
        assert sink["lock"] == "held" and sink["lock_holders"] and sink["sessions"]

        refused = sqlsink(
            "recover", "--url", db.url, "--sink-id", SINK, "--lock-timeout", "0.5s", "--json"
        )
        assert shape.document(refused, "recover")["sinks"][0]["status"] == "refused"

    with_checkpoint = sqlsink(
        "recover", "--url", db.url, "--sink-id", SINK, "--checkpoint", str(checkpoint), "--json"
    )
    doc = shape.document(with_checkpoint, "recover")
    assert doc["checkpoint"]["batches"] and doc["sinks"][0]["status"] == "recovered"
    assert {a["result"] for a in doc["actions"]} >= {"committed", "rolled back", None}

    every_sink = sqlsink("recover", "--url", db.url, "--json")
    assert every_sink.code == 3
    shape.document(every_sink, "recover")
    assert shape.seen >= RECOVER_TYPES


def test_status_documents_follow_the_contract(db: Db) -> None:
    leftovers(db)
    with db.connect() as conn:
        run_registry.register_run(conn, ENDED, RUN, 300.0, holds_lock=False)
        assert run_registry.record_end(conn, ENDED, RUN, "failed", "ValueError: bad row")
    shape = Shape()
    with sink_is_live(db):
        result = sqlsink("status", "--url", db.url, "--max-age", "0s", "--json")
        assert result.code == 3, result.err
        doc = shape.document(result, "status")
        sink = next(s for s in doc["sinks"] if s["sink_id"] == SINK)
        assert sink["recent_batches"] and sink["prepared"]
        # the newest decision (4) is not complete: no figures yet; batch 3's are there
        assert sink["last_batch"] is not None and sink["last_batch"]["batch_id"] == 4
        assert sink["last_batch"]["figures"] is None and sink["last_batch"]["line"] is None
        [three] = [b for b in sink["recent_batches"] if b["batch_id"] == 3]
        assert BatchFigures.from_json(three["figures"]) == FIGURES
        assert [v["view"] for v in sink["consistent_views"]] == ["public.v"]
        [hidden] = sink["hidden_batches"]
        assert (hidden["batch_id"], hidden["partitions_hidden"], hidden["prepared"]) == (4, 1, 1)
        assert sink["sessions"] and sink["lock_holders"]
        assert doc["other_prepared"] and doc["data_loss"] and doc["warnings"]
        one = sqlsink("status", "--url", db.url, "--sink-id", SINK, "--batches", "1", "--json")
        assert len(shape.document(one, "status")["sinks"]) == 1
        assert sink["state"] == "live" and sink["in_doubt"] is None  # its task is connected
        ended = next(s for s in doc["sinks"] if s["sink_id"] == ENDED)
        assert ended["state"] == "failed" and ended["ended"]["error"] == "ValueError: bad row"
    # nothing of SINK connected now, batch 4 committed in part: its driver may be gone
    doubt = sqlsink("status", "--url", db.url, "--sink-id", SINK, "--json")
    assert doubt.code == 1, doubt.err  # never "all well"
    [sink] = shape.document(doubt, "status")["sinks"]
    assert sink["state"] == "quiet" and sink["in_doubt"]["partial_batches"] == [4]
    assert shape.seen >= STATUS_TYPES


def test_check_documents_follow_the_contract(db: Db) -> None:
    shape = Shape()
    result = sqlsink("check", "--url", db.url, "--trigger-interval", "10s", "--json")
    assert result.code == 0, result.err
    assert shape.document(result, "check")["findings"]
    assert shape.seen >= CHECK_TYPES


def test_forget_documents_follow_the_contract(db: Db) -> None:
    shape = Shape()  # refusals and removals: tests/pg/test_forget.py
    nothing = sqlsink("forget", "--url", db.url, "--sink-id", "never-written", "--json")
    assert nothing.code == 2 and shape.document(nothing, "forget")["forgotten"] is False
    assert nothing.json["error"]["message"].startswith("unknown sink never-written in database")
    assert shape.seen >= FORGET_TYPES


def test_failed_commands_still_follow_the_contract(db: Db) -> None:
    unreachable = psycopg.conninfo.make_conninfo(db.url, host="127.0.0.1", port=1)
    shape = Shape()
    for command in DOCUMENTS:
        needs = ["--sink-id", "x"] if command == "forget" else []
        failed = sqlsink(command, "--url", unreachable, "--json", *needs)
        assert failed.code == 2
        doc = shape.document(failed, command)
        assert doc["error"]["message"].startswith("cannot connect")
        assert set(doc) == set(typing.get_type_hints(DOCUMENTS[command]))  # a whole document

    env = {k: v for k, v in os.environ.items() if k != "SQLSINK_URL"}
    no_url = sqlsink("status", "--json", env=env)
    assert no_url.code == 2
    assert set(shape.document(no_url, "status")) == set(Envelope.__annotations__)
    assert shape.seen >= FAILURE_TYPES


# -- the walk can fail --------------------------------------------------------------------


def test_every_typed_dict_of_the_contract_is_met_by_a_test() -> None:
    typed_dicts = {v for v in vars(contract).values() if typing.is_typeddict(v)}
    assert typed_dicts == RECOVER_TYPES | STATUS_TYPES | CHECK_TYPES | FORGET_TYPES | FAILURE_TYPES


def _error_doc() -> dict[str, Any]:
    return {
        "version": 1, "command": "check", "url": None, "database": "d", "role": "r",
        "superuser": True, "warnings": [], "error": None, "exit_code": 0,
        "server_version": "16.4", "trigger_interval_seconds": 10, "partitions": None,
        "findings": [
            {"level": "ok", "setting": "s", "value": None, "source": "default",
             "message": "m", "fix": None},
        ],
    }  # fmt: skip


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda d: d.update(extra=1), id="an unknown key"),
        pytest.param(lambda d: d.pop("server_version"), id="a missing key"),
        pytest.param(lambda d: d["findings"][0].pop("fix"), id="a nested missing key"),
        pytest.param(lambda d: d["findings"][0].update(level="fine"), id="a literal"),
        pytest.param(lambda d: d.update(superuser="yes"), id="a scalar"),
        pytest.param(lambda d: d.update(exit_code=True), id="a bool for an int"),
        pytest.param(lambda d: d.update(findings={}), id="an object for a list"),
        pytest.param(lambda d: d.update(error={"message": 1, "fix": None}), id="in an optional"),
    ],
)
def test_the_walk_rejects(change: Any) -> None:
    Shape().check(_error_doc(), CheckDocument)  # the sample itself is valid
    doc = _error_doc()
    change(doc)
    with pytest.raises(AssertionError):
        Shape().check(doc, CheckDocument)
