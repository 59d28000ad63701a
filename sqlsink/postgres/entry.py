"""The PostgreSQL backend as the adapters see it (:class:`sqlsink.core.database.Database`)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlsink.core.admin import AdminSession, DriverError
from sqlsink.core.database import Capability
from sqlsink.postgres import admin


@dataclass(frozen=True)
class PostgreSQL:
    name: str = "PostgreSQL"
    capabilities: frozenset[Capability] = frozenset(Capability)

    # the CLI's (sqlsink.core.admin, sqlsink.postgres.admin)
    def open_admin(self, url: str, command: str, password_command: str | None) -> AdminSession:
        return admin.PostgresAdmin.open(url, command, password_command)

    def driver_error(self, exc: BaseException) -> DriverError | None:
        return admin.driver_error(exc)

    @property
    def schema_fix(self) -> str:
        return admin.schema_fix()


POSTGRESQL = PostgreSQL()
