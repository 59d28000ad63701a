"""What ``sqlsink metrics`` reads from the commit log at each scrape, without Prometheus.

Per sink, what ``sqlsink status`` shows, read with the same functions: the newest
decision, the open prepared transactions (sorted as status sorts them), which of them
no live run will finish (``runs.stranded_reason``), the decisions not yet complete,
confirmed data loss (``loss.confirmed_losses`` on the committer's own plan) and the
newest checkpoint check's verdict.

The totals (batches and rows committed, and the time histograms from the per-batch
figures) are counters, which must never go down; retention prunes old decisions
(``keepBatches``), so summing what the log holds would. ``Totals`` therefore counts each
decision once, when a scrape first sees it: the first scrape counts every decision the
log holds, each later one only the decisions above the highest batch counted. A sink
whose newest batch falls below that (forgotten and written again from batch 0) starts
over, as a counter reset, and so does every total when the exporter restarts.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from datetime import datetime

from sqlsink.cli.connect import checks_recorded
from sqlsink.cli.loss import confirmed_losses
from sqlsink.cli.runs import stranded_reason
from sqlsink.cli.status_json import sink_names, sort_prepared
from sqlsink.core.admin import AdminSession, DecisionRow
from sqlsink.core.committer import Committer
from sqlsink.core.resolution import Scope

# upper bounds in seconds: a batch's commit (COMMIT PREPAREDs and completion) is
# milliseconds to seconds; a partition's write (first row to PREPARE) can take minutes
COMMIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
WRITE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


@dataclass
class Histogram:
    """Observations counted into buckets by upper bound (not cumulative here)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)  # one per bound, then one for +Inf
    total: float = 0.0

    def __post_init__(self) -> None:
        self.counts = self.counts or [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """(le, count of observations <= le) for each bound and +Inf, as Prometheus has it."""
        out: list[tuple[str, float]] = []
        running = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += n
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


@dataclass
class SinkTotals:
    """One sink's counters since the exporter started (see the module's documentation)."""

    counted_through: int = -1  # the highest batch counted in batches and rows
    timed_through: int = -1  # the highest batch counted in the histograms
    batches: int = 0
    rows: int = 0
    dead_letters: int = 0  # rows the batches sent to their dead-letter table (the figures')
    commit: Histogram = field(default_factory=lambda: Histogram(COMMIT_BUCKETS))
    partition_write: Histogram = field(default_factory=lambda: Histogram(WRITE_BUCKETS))
    prepare_to_decision: Histogram = field(default_factory=lambda: Histogram(COMMIT_BUCKETS))

    def add(self, decisions: list[DecisionRow]) -> None:
        """Count the decisions (in batch order) not counted yet. A decision's times are
        written by its commit after the decision itself: one without them is timed at a
        later scrape, or never once a later decision exists (its commit did not finish)."""
        newest = max((d.batch_id for d in decisions), default=-1)
        for d in decisions:
            if d.batch_id > self.counted_through:
                self.batches += 1
                self.rows += d.rows
                self.counted_through = d.batch_id
            if d.batch_id <= self.timed_through:
                continue
            if d.commit_ms is None and d.batch_id == newest:
                break  # its commit is under way, or its driver died before recording it
            self.timed_through = d.batch_id
            if d.commit_ms is not None:
                self.commit.observe(d.commit_ms / 1000)
            if d.figures is not None:
                self.dead_letters += d.figures.dead_letters
                for write in d.figures.writes:
                    self.partition_write.observe(write.write_ms / 1000)
                if d.figures.prepare_to_decision_ms is not None:
                    self.prepare_to_decision.observe(d.figures.prepare_to_decision_ms / 1000)


@dataclass(frozen=True)
class SinkReading:
    """One sink at one scrape; ages in seconds on the server's clock."""

    sink_id: str
    totals: SinkTotals
    last_batch_id: int | None
    last_batch_age_s: float | None
    last_batch_rows: int | None
    prepared: int  # its open prepared transactions in this database
    prepared_oldest_age_s: float  # 0 when none
    stranded: int  # of those, the ones no live run will finish
    incomplete: int  # decisions some of whose transactions are not known committed
    incomplete_oldest_age_s: float  # since the oldest such decision; 0 when none
    lost_transactions: int  # decided transactions neither prepared nor committed
    checkpoint_lost_batches: int  # batches the newest checkpoint check found missing
    live_runs: int
    run_timeout_s: float | None  # the newest live run's (else the newest run's) timeout


@dataclass(frozen=True)
class Reading:
    database: str
    server_time: datetime
    sinks: list[SinkReading]


class Totals:
    """Every sink's counters, kept across scrapes by the exporter."""

    def __init__(self) -> None:
        self.sinks: dict[str, SinkTotals] = {}

    def update(self, conn: AdminSession, sink_id: str, newest: int | None) -> SinkTotals:
        totals = self.sinks.get(sink_id)
        if totals is None or newest is None or newest < totals.counted_through:
            totals = self.sinks[sink_id] = SinkTotals()  # new, or its log started over
        first = min(totals.counted_through, totals.timed_through) + 1
        if newest is not None and newest >= first:
            totals.add(list(conn.decisions_from(sink_id, first).values()))
        return totals

    def keep_only(self, sink_ids: set[str]) -> None:
        """Forget the totals of sinks the log no longer has (``sqlsink forget``)."""
        for gone in set(self.sinks) - sink_ids:
            del self.sinks[gone]


def read(conn: AdminSession, totals: Totals) -> Reading:
    """Every sink of the connection's database, as status sees it now."""
    me = conn.role_info()
    now = conn.server_now()
    rows = conn.sinks()
    ours, _ = sort_prepared(conn.all_prepared(), me.database, None)
    incomplete = conn.incomplete_decisions()
    names = sink_names(rows, ours, incomplete, None, me.database)
    runs = conn.runs(None)  # newest first within each sink
    backend = conn.two_phase()
    checks = checks_recorded(conn)
    readings = []
    for sink_id in sorted(names):
        recent = conn.recent_decisions(sink_id, 1)
        last = recent[0] if recent else None
        sink_totals = totals.update(conn, sink_id, None if last is None else last.batch_id)
        sink_runs = [r for r in runs if r.sink_id == sink_id]
        by_run = {r.run_id: r for r in sink_runs}
        prepared = ours.get(sink_id, [])
        ages = [(now - txn.prepared_at).total_seconds() for txn, _ in prepared]
        open_decisions = [d for d in incomplete if d.sink_id == sink_id]
        live = [r for r in sink_runs if r.live]
        timed = live or sink_runs
        lost = confirmed_losses(conn, Committer(backend, sink_id).plan(Scope.everything()))
        readings.append(
            SinkReading(
                sink_id=sink_id,
                totals=sink_totals,
                last_batch_id=None if last is None else last.batch_id,
                last_batch_age_s=None if last is None else (now - last.decided_at).total_seconds(),
                last_batch_rows=None if last is None else last.rows,
                prepared=len(prepared),
                prepared_oldest_age_s=max(ages, default=0.0),
                stranded=sum(1 for _, gid in prepared if stranded_reason(gid, by_run)),
                incomplete=len(open_decisions),
                incomplete_oldest_age_s=max(
                    ((now - d.decided_at).total_seconds() for d in open_decisions), default=0.0
                ),
                lost_transactions=len(lost),
                checkpoint_lost_batches=_checkpoint_lost(conn, sink_id) if checks else 0,
                live_runs=len(live),
                run_timeout_s=timed[0].timeout_s if timed else None,
            )
        )
    totals.keep_only(names)
    return Reading(me.database, now, readings)


def _checkpoint_lost(conn: AdminSession, sink_id: str) -> int:
    """The batches the newest run's checkpoint check found committed by Spark and
    missing from the log (what status reports as DATA LOSS)."""
    newest = [c for c in conn.checkpoint_checks(sink_id, 1) if c.newest]
    return len(newest[0].lost) if newest and newest[0].verdict == "loss" else 0
