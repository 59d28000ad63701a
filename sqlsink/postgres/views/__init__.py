"""The consistent view (option ``consistentView``; docs/DESIGN.md invariant 13).

Readers of the bare table may see a batch committed in part: the driver commits its
partitions one ``COMMIT PREPARED`` after the other, and a driver that dies in that
loop leaves it so until the next run or ``sqlsink recover``. The view shows whole
batches only. Every partition transaction inserts its marker row in the same
transaction as its rows, and the marker records that transaction's id (``xid``,
schema version 5), which is also the ``xmin`` of every row it inserted. A batch's
markers are deleted in one statement once every partition is committed
(``commit_log.mark_complete``). So, in any one snapshot: a committed partition of an
incomplete batch has a visible marker; a complete batch has none; a prepared one is
invisible anyway. The view hides the rows whose ``xmin`` is the ``xid`` of a visible
marker of its sink (format 2, ``definition``)::

    SELECT <columns> FROM <table>
    WHERE NOT EXISTS (<a visible marker of the sink>)
       OR xmin <> ALL (ARRAY(<the xids of the sink's visible markers>))

One scan of the table, the table's own plan (parallel aggregates, key lookups, quals
pushed down as on the table), with one filter ``(NOT $0) OR xmin <> ALL ($1)`` whose
two InitPlans run at most once per query in the query's snapshot: with nothing in
flight the filter is one boolean per row and the xids are never read. Its costs, with
nothing in flight (``benchmarks/view_cost.py``, docs/DESIGN.md invariant 13): that
boolean per row, the planning and one probe of ``sqlsink.markers`` per query, and no
index-only scan (the filter reads ``xmin`` from the heap). Format 1, a ``UNION ALL``
of the table under a one-time filter and the table filtered by the xids, kept
index-only scans but cost twice as much per row (a Result and an Append node), three
times as much to plan a key lookup, and doubled the planner's row estimate.

The view is the sink's: its comment names the sink and the table (``comment_text``).
The committer creates it when missing and replaces it when its columns or its format
are out of date, under the sink lock before each decision (``ConsistentView.keep``);
any other object of that name is refused. Readers need SELECT on the view only: a view
reads its tables with its owner's rights.
"""

from __future__ import annotations

from sqlsink.core.admin import HiddenBatch
from sqlsink.postgres.views.definition import (
    FORMAT,
    SCHEMA_VERSION,
    ViewMark,
    comment_text,
    definition,
    parse_comment,
    quoted,
)
from sqlsink.postgres.views.keeping import (
    REPLACE_LOCK_TIMEOUT_S,
    ConsistentView,
    ConsistentViews,
    State,
    check_before_writing,
    delete_stale_markers,
    keep_view,
    lock_holders,
    read_state,
    refusal,
    sql_name,
)
from sqlsink.postgres.views.rewrites import check_rewrite, rewrite_refusal, sharing_rows, shown_by
from sqlsink.postgres.views.status import ViewInfo, find_views, hidden_batches
from sqlsink.postgres.views.triggers import Trigger

__all__ = [
    "FORMAT",
    "REPLACE_LOCK_TIMEOUT_S",
    "SCHEMA_VERSION",
    "ConsistentView",
    "ConsistentViews",
    "HiddenBatch",
    "State",
    "Trigger",
    "ViewInfo",
    "ViewMark",
    "check_before_writing",
    "check_rewrite",
    "comment_text",
    "definition",
    "delete_stale_markers",
    "find_views",
    "hidden_batches",
    "keep_view",
    "lock_holders",
    "parse_comment",
    "quoted",
    "read_state",
    "refusal",
    "rewrite_refusal",
    "sharing_rows",
    "shown_by",
    "sql_name",
]
