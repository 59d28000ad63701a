"""The PostgreSQL backend as the adapters see it (:class:`sqlsink.core.database.Database`)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlsink.core.database import Capability


@dataclass(frozen=True)
class PostgreSQL:
    name: str = "PostgreSQL"
    capabilities: frozenset[Capability] = frozenset(Capability)


POSTGRESQL = PostgreSQL()
