"""The target's triggers that the view cannot follow (docs/DESIGN.md invariant 13).

The view relates a row to its batch by the row's ``xmin``: the id of the transaction
that inserted it, which the partition's marker records. A row inserted by a trigger
inside a subtransaction (a PL/pgSQL block with ``EXCEPTION``, as the classic routing of
rows into inheritance children does to create a missing child) carries the
subtransaction's id instead, which no marker names: the view would show it while its
batch is committed in part. Nothing in the catalog tells a trigger that writes rows in
a subtransaction from one that does not (the function may call others, in any
language), so every enabled trigger that fires on the sink's inserts into the table or
into any of its inheritance children or partitions (``pg_inherits``, recursively) is
refused: row or statement level, BEFORE, AFTER or INSTEAD OF, user constraint triggers
included. Internal triggers (foreign keys) write nothing; triggers on UPDATE, DELETE or
TRUNCATE only never fire (the view takes mode=append: COPY inserts, and COPY fires no
rules). A partition's copy of its partitioned table's trigger is named once, as the
partitioned table's.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# A subquery of views.keeping's state query: the triggers of table ``t`` (the query's
# alias) and of its descendants, one JSON object each, as ``Trigger.of`` reads them.
INSERT_TRIGGERS = """
WITH RECURSIVE tree(oid) AS (
    SELECT t.oid WHERE t.oid IS NOT NULL
    UNION SELECT i.inhrelid FROM pg_inherits i JOIN tree ON i.inhparent = tree.oid)
SELECT g.tgname::text AS name,
       quote_ident(n.nspname) || '.' || quote_ident(c.relname) AS relation,
       g.tgtype::int AS type, g.tgenabled::text AS enabled,
       g.tgfoid::regprocedure::text AS function
FROM tree JOIN pg_trigger g ON g.tgrelid = tree.oid
JOIN pg_class c ON c.oid = g.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE NOT g.tgisinternal AND g.tgenabled <> 'D' AND g.tgtype & 4 <> 0
  AND NOT EXISTS (SELECT FROM pg_trigger p JOIN tree pt ON pt.oid = p.tgrelid
                  WHERE p.oid = g.tgparentid)
"""

_ROW, _BEFORE, _INSTEAD = 1, 2, 64  # bits of pg_trigger.tgtype
_EVENTS = ((4, "INSERT"), (8, "DELETE"), (16, "UPDATE"), (32, "TRUNCATE"))
_ENABLED = {"O": "", "A": ", ENABLE ALWAYS", "R": ", ENABLE REPLICA"}


@dataclass(frozen=True)
class Trigger:
    """An enabled trigger that fires on inserts into the table or one of its children."""

    name: str
    relation: str  # schema.table, quoted where needed
    type: int  # pg_trigger.tgtype
    enabled: str  # pg_trigger.tgenabled: O, A or R
    function: str  # the function's signature, as regprocedure shows it

    @classmethod
    def of(cls, found: dict[str, Any]) -> Trigger:
        return cls(
            str(found["name"]),
            str(found["relation"]),
            int(found["type"]),
            str(found["enabled"]),
            str(found["function"]),
        )

    def describe(self) -> str:
        """``trigger route on public.events (BEFORE INSERT FOR EACH ROW, public.route())``."""
        timing = (
            "INSTEAD OF" if self.type & _INSTEAD else "BEFORE" if self.type & _BEFORE else "AFTER"
        )
        events = " OR ".join(name for bit, name in _EVENTS if self.type & bit)
        level = "ROW" if self.type & _ROW else "STATEMENT"
        name = _ident(self.name)
        return (
            f"trigger {name} on {self.relation} ({timing} {events} FOR EACH {level}"
            f"{_ENABLED.get(self.enabled, '')}, function {self.function})"
        )


def refusal(option: str, table: str, triggers: Sequence[Trigger], outcome: str) -> str:
    """Why the view is refused over a table with such triggers, each named, and the fix;
    ``outcome``: what became of the batch ("Nothing was written", ...)."""
    named = "; ".join(t.describe() for t in triggers)
    return (
        f"{option}: table {table} has {len(triggers)} enabled trigger(s) that fire on the "
        f"sink's inserts: {named}. A trigger may insert the table's rows itself inside a "
        "subtransaction (a PL/pgSQL block with EXCEPTION, as the usual routing into "
        "inheritance children does): those rows carry the subtransaction's id, which the "
        "view cannot relate to their batch, so its readers would see a batch committed in "
        f"part. {outcome}. Fix: drop the option consistentView (readers of the table then "
        "see each batch as it is committed), or move the routing to declarative "
        "partitioning (CREATE TABLE ... PARTITION BY: the server routes each row to its "
        "partition, without a trigger)"
    )


def _ident(name: str) -> str:
    plain = re.fullmatch(r"[a-z_][a-z0-9_$]*", name) is not None
    return name if plain else '"' + name.replace('"', '""') + '"'
