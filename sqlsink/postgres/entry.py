"""The PostgreSQL backend as the adapters see it (:class:`sqlsink.core.database.Database`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlsink.core.database import Capability

if TYPE_CHECKING:
    from sqlsink.postgres.loading import PostgresLoading


@dataclass(frozen=True)
class PostgreSQL:
    name: str = "PostgreSQL"
    capabilities: frozenset[Capability] = frozenset(Capability)

    def loading(self) -> PostgresLoading:
        from sqlsink.postgres.loading import LOADING

        return LOADING


POSTGRESQL = PostgreSQL()
