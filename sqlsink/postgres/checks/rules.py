"""The rules: one finding per setting checked (see the package's docstring)."""

from __future__ import annotations

from sqlsink.core.admin import Finding
from sqlsink.postgres.checks.durations import (
    Required,
    format_seconds,
    recommended,
    required_time,
)
from sqlsink.postgres.checks.fixes import describe_source, fix_statement, role_alternative
from sqlsink.postgres.checks.model import (
    DEFAULT_SAFETY_FACTOR,
    ERROR,
    LOCK_WAIT_FLOOR_S,
    MIN_PREPARED_SLOTS,
    OK,
    SINK_LOCK_TIMEOUT_DEFAULT,
    WARNING,
    ServerSettings,
    Setting,
)
from sqlsink.postgres.versions import has_transaction_timeout

_EFFECTS = {
    "statement_timeout": (
        "cancels any statement that runs longer, including a partition's COPY, one "
        "statement that streams all of the partition's rows"
    ),
    "idle_in_transaction_session_timeout": (
        "ends a partition's session that sits idle inside its transaction for longer: between "
        "BEGIN, the COPY, the marker row and PREPARE TRANSACTION (not while the COPY streams)"
    ),
    "transaction_timeout": (
        "ends a partition's transaction that lasts longer before it reaches PREPARE TRANSACTION"
    ),
}


def analyse(
    settings: ServerSettings,
    *,
    trigger_interval_s: float | None,
    partitions: int | None,
    slowest_write_s: float | None,
    safety_factor: float = DEFAULT_SAFETY_FACTOR,
    exactly_once: bool = True,
) -> list[Finding]:
    """One finding per setting checked (transaction_timeout from PostgreSQL 17 on).

    ``trigger_interval_s``: the query's trigger interval (None, or 0 for "as fast as
    possible", when unknown); ``partitions``: partitions per batch; ``slowest_write_s``:
    the longest a partition's write (BEGIN to PREPARE) has taken.
    """
    out: list[Finding] = []
    mpt = settings.settings.get("max_prepared_transactions")
    if mpt is not None:
        out.append(prepared_slots(mpt, settings, partitions, exactly_once))
    required = required_time(trigger_interval_s, slowest_write_s, safety_factor)
    for name in ("statement_timeout", "idle_in_transaction_session_timeout", "transaction_timeout"):
        setting = settings.settings.get(name)
        if setting is None or (
            name == "transaction_timeout"
            and not has_transaction_timeout(settings.server_version_num)
        ):
            continue
        out.append(_transaction_timeout(setting, settings, required))
    lock = settings.settings.get("lock_timeout")
    if lock is not None:
        out.append(_lock_timeout(lock, settings))
    idle = settings.settings.get("idle_session_timeout")
    if idle is not None:
        out.append(_idle_session(idle, settings, trigger_interval_s))
    names = settings.settings.get("synchronous_standby_names")
    if names is not None:
        out.append(_synchronous_standbys(names, settings))
    most = settings.settings.get("max_connections")
    if most is not None:
        out.append(_connections(most, settings, partitions))
    return out


def _connections(s: Setting, settings: ServerSettings, partitions: int | None) -> Finding:
    """Each running task of a batch holds a connection while it writes (until PREPARE),
    and the driver holds one to plan and one to commit: up to partitions + 2 at once."""
    source = describe_source(s, settings)
    reserved = sum(
        int(settings.settings[name].setting)
        for name in ("superuser_reserved_connections", "reserved_connections")
        if name in settings.settings
    )
    usable = int(s.setting) - reserved
    in_use = settings.connections_in_use
    now = f"{in_use} in use now, cluster-wide, of {usable} open to roles without reserved slots"
    fix = (
        "ALTER SYSTEM SET max_connections = {n}; -- then restart PostgreSQL (or cap a "
        "batch's partitions with the option maxPartitions)"
    )
    if not partitions:
        return Finding(
            OK,
            s.name,
            s.value,
            source,
            "each running task of a batch holds one connection while it writes, the driver "
            f"one to plan and one to commit: at most partitions + 2 at once ({now})",
        )
    need = partitions + 2
    if need > usable:
        return Finding(
            WARNING,
            s.name,
            s.value,
            source,
            f"a batch of {partitions} partitions may hold {need} connections at once (one per "
            f"running task, plus the driver's two) but only {usable} are open to roles "
            f"without reserved slots: when as many tasks run at once, those beyond it fail "
            f"to connect and the batch fails; cap it with the option "
            f"maxPartitions={max(usable - 2, 1)}, or raise max_connections",
            fix.format(n=need + reserved + in_use),
        )
    if need > usable - in_use:
        return Finding(
            WARNING,
            s.name,
            s.value,
            source,
            f"only {max(usable - in_use, 0)} connections are free now ({now}) for the up to "
            f"{need} that a batch of {partitions} partitions holds at once: tasks beyond "
            "them fail to connect and the batch fails",
            fix.format(n=need + reserved + in_use),
        )
    return Finding(
        OK,
        s.name,
        s.value,
        source,
        f"room for the up to {need} connections a batch of {partitions} partitions holds at "
        f"once ({now})",
    )


# every non-empty partition of a batch holds a connection while it writes and a
# prepared-transaction slot until the batch commits: what to do about it
PER_PARTITION = (
    "each non-empty partition of a batch takes a connection while it writes and a "
    "prepared-transaction slot until the batch commits (200 shuffle partitions: 200 of "
    "each); cap them with the option maxPartitions=N (the foreachBatch writer coalesces "
    "each batch to N partitions; format('sqlsink') refuses a batch with more, so write "
    "df.coalesce(N)) or lower spark.sql.shuffle.partitions, and keep N below "
    "max_prepared_transactions / 2 and max_connections"
)


def prepared_slots_needed(partitions: int | None) -> int:
    return max(MIN_PREPARED_SLOTS, 2 * (partitions or 0))


def prepared_slots(
    s: Setting, settings: ServerSettings, partitions: int | None, exactly_once: bool
) -> Finding:
    source = describe_source(s, settings)
    slots = int(s.setting)
    needed = prepared_slots_needed(partitions)
    in_use = settings.prepared_in_use
    if not exactly_once:
        return Finding(
            OK,
            s.name,
            s.value,
            source,
            "not needed: only semantic=exactly_once prepares transactions",
        )
    if slots == 0:
        return Finding(
            ERROR,
            s.name,
            s.value,
            source,
            "prepared transactions are disabled on this server: set max_prepared_transactions "
            f"to at least {needed} and restart PostgreSQL (exactly-once writes end each "
            "partition's transaction with PREPARE TRANSACTION, which fails while it is 0; "
            "or use the option semantic=at_least_once)",
            _slots_fix(s, needed),
        )
    if partitions:
        short = _slots_short_of(s, source, slots, partitions, in_use)
        if short is not None:
            return short
    usage = f"{in_use} of {slots} in use now, cluster-wide"
    compared = f"at least 2 x the {partitions} partitions of a batch" if partitions else "above 0"
    return Finding(
        OK,
        s.name,
        s.value,
        source,
        f"prepared transactions are enabled: {compared} ({usage}); {PER_PARTITION}",
    )


def _slots_fix(s: Setting, n: int) -> str:
    """The fix that gives max_prepared_transactions ``n`` slots, where ``s`` is set."""
    if s.source == "command line":
        return (
            f"restart PostgreSQL with -c max_prepared_transactions={n} (it is set on the "
            "server's command line, which ALTER SYSTEM does not override)"
        )
    return f"ALTER SYSTEM SET max_prepared_transactions = {n}; -- then restart PostgreSQL"


def _slots_short_of(
    s: Setting, source: str, slots: int, partitions: int, in_use: int
) -> Finding | None:
    """Too few prepared-transaction slots (or too few free) for a batch's partitions."""
    needed = prepared_slots_needed(partitions)
    if slots < partitions:
        return Finding(
            ERROR,
            s.name,
            s.value,
            source,
            f"max_prepared_transactions = {slots} is fewer than the {partitions} partitions of a "
            "batch, which all stay prepared until the batch commits: no batch can ever "
            f"commit; set it to at least {needed} (2 x partitions) and restart PostgreSQL, "
            f"or write fewer partitions per batch (option maxPartitions={slots // 2 or 1}, "
            "or df.coalesce(n))",
            _slots_fix(s, needed),
        )
    usage = f"{in_use} of {slots} in use now, cluster-wide"
    if slots < 2 * partitions:
        return Finding(
            WARNING,
            s.name,
            s.value,
            source,
            f"max_prepared_transactions = {slots} ({usage}) is fewer than 2 x the {partitions} "
            f"partitions of a batch = {2 * partitions}: retried and speculative attempts, "
            "leftovers and other users of the cluster-wide slots need headroom, and a "
            "partition that finds no free slot fails its batch; or cap a batch's "
            f"partitions with the option maxPartitions={max(slots // 2, 1)}",
            _slots_fix(s, needed),
        )
    if slots - in_use < partitions:
        return Finding(
            WARNING,
            s.name,
            s.value,
            source,
            f"only {slots - in_use} of {slots} prepared-transaction slots are free (cluster-wide) "
            f"for the {partitions} partitions of a batch: leftover prepared transactions hold "
            "the others",
            "sqlsink status / sqlsink recover to resolve the sink's leftovers (others: see "
            "pg_prepared_xacts)",
        )
    return None


def _transaction_timeout(s: Setting, settings: ServerSettings, required: Required) -> Finding:
    source = describe_source(s, settings)
    effect = _EFFECTS[s.name]
    seconds = s.seconds()
    if seconds == 0:
        return Finding(OK, s.name, s.value, source, "off: it cannot end a partition's transaction")
    if seconds >= required.seconds:
        return Finding(
            OK,
            s.name,
            s.value,
            source,
            f"{s.value} is at least {required.text}; it {effect} (prepared transactions are "
            "not affected)",
        )
    value = recommended(required.seconds)
    return Finding(
        WARNING,
        s.name,
        s.value,
        source,
        f"{s.name} = {s.value}, from {source}, is shorter than {required.text}: it {effect}, "
        "before the transaction is prepared; the partition then fails and its batch is "
        f"retried, and may fail again the same way{role_alternative(s, value, settings)}",
        fix_statement(s, value, settings),
    )


def _lock_timeout(s: Setting, settings: ServerSettings) -> Finding:
    """Replaced on every session of the sink's tasks and commit (``PostgresBackend`` sets
    the option lockTimeout when it opens) and in every wait for the sink lock
    (``locks.acquire_sink_lock`` sets its own bound); it still applies to the planner's
    session (``plan_write``, before any data), whose one wait on another session is
    createTable's CREATE TABLE: for locks on the target's schema, or for another session
    creating the same table."""
    source = describe_source(s, settings)
    replaced = (
        "the sink's tasks and commit set their own lock_timeout on every session (option "
        f"lockTimeout, default {SINK_LOCK_TIMEOUT_DEFAULT}), and every wait for the sink's "
        "lock sets its own bound, so this value is replaced there"
    )
    planner = (
        "it still applies to the planner's session, which checks the target before any data "
        "and, with the option createTable, creates it: that CREATE TABLE waits at most this "
        "long for locks on the target's schema or for another session creating the same table"
    )
    seconds = s.seconds()
    if seconds == 0:
        off = planner.replace("waits at most this long", "waits as long as it takes")
        return Finding(OK, s.name, s.value, source, f"off; {replaced}; {off}")
    floor = format_seconds(LOCK_WAIT_FLOOR_S)
    if seconds >= LOCK_WAIT_FLOOR_S:
        return Finding(
            OK,
            s.name,
            s.value,
            source,
            f"{replaced}; {planner}, and {s.value} is at least the {floor} such a wait may take",
        )
    value = recommended(LOCK_WAIT_FLOOR_S)
    return Finding(
        WARNING,
        s.name,
        s.value,
        source,
        f"{s.name} = {s.value}, from {source}, is shorter than {floor}: {replaced}, but {planner}; "
        "a wait that gives up fails the query at its start (nothing written): two queries "
        "with createTable on one new table started together, or a transaction holding DDL on "
        f"the target's schema{role_alternative(s, value, settings)}",
        fix_statement(s, value, settings),
    )


def _synchronous_standbys(s: Setting, settings: ServerSettings) -> Finding:
    """Waits at commit time for a standby: what bounds them (invariant 11, syncrep)."""
    source = describe_source(s, settings)
    commit = settings.settings.get("synchronous_commit")
    level = commit.value if commit is not None else "on"
    if not s.value.strip():
        return Finding(OK, s.name, "''", source, "commits do not wait for a standby")
    waits = (
        "the sink's decisions (written with synchronous_commit = on)"
        if level in ("off", "local")
        else "every PREPARE TRANSACTION, COMMIT PREPARED and commit-log write of the sink "
        f"(synchronous_commit = {level})"
    )
    bound = (
        f"{waits} waits until a standby confirms it; neither lock_timeout nor "
        "statement_timeout ends that wait, so the sink cancels each of its writes after its "
        "lockTimeout plus a second: the transaction is then committed on this server but not "
        "confirmed, and the sink fails the batch with an error naming this setting (the "
        "restart finds the batch committed)"
    )
    if settings.sync_standbys == 0:
        return Finding(
            WARNING,
            s.name,
            s.value,
            source,
            f"no synchronous standby is connected (pg_stat_replication): {bound}",
            "start or reconnect the standby, or ALTER SYSTEM SET synchronous_standby_names = "
            "''; SELECT pg_reload_conf();",
        )
    seen = (
        "this role cannot see pg_stat_replication's sync_state (GRANT pg_monitor to see it)"
        if settings.sync_standbys is None
        else f"{settings.sync_standbys} synchronous standby(s) connected"
    )
    return Finding(OK, s.name, s.value, source, f"{seen}; {bound}")


def _idle_session(
    s: Setting, settings: ServerSettings, trigger_interval_s: float | None
) -> Finding:
    source = describe_source(s, settings)
    effect = "closes a connection idle for longer"
    seconds = s.seconds()
    if seconds == 0:
        return Finding(OK, s.name, s.value, source, "off: no idle connection is closed")
    if trigger_interval_s and trigger_interval_s > 0:
        required = Required(
            trigger_interval_s, f"the trigger interval ({format_seconds(trigger_interval_s)})"
        )
    else:
        required = required_time(None, None, DEFAULT_SAFETY_FACTOR)
    if seconds >= required.seconds:
        return Finding(
            OK, s.name, s.value, source, f"{s.value} is at least {required.text}; it {effect}"
        )
    value = recommended(required.seconds)
    return Finding(
        WARNING,
        s.name,
        s.value,
        source,
        f"{s.name} = {s.value}, from {source}, is shorter than {required.text}: it {effect}, so a "
        "connection kept open between batches (the driver's) is closed under it"
        f"{role_alternative(s, value, settings)}",
        fix_statement(s, value, settings),
    )
