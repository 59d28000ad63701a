"""The PostgreSQL backend as the adapters see it (:class:`sqlsink.core.database.Database`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlsink.core.database import Capability

if TYPE_CHECKING:  # imported when called: the Spark side's workers never load the CLI's
    from sqlsink.core.admin import AdminSession, DriverError
    from sqlsink.postgres.loading import PostgresLoading


@dataclass(frozen=True)
class PostgreSQL:
    name: str = "PostgreSQL"
    capabilities: frozenset[Capability] = frozenset(Capability)

    # the CLI's (sqlsink.core.admin, sqlsink.postgres.admin)
    def open_admin(self, url: str, command: str, password_command: str | None) -> AdminSession:
        from sqlsink.postgres import admin

        return admin.PostgresAdmin.open(url, command, password_command)

    def driver_error(self, exc: BaseException) -> DriverError | None:
        from sqlsink.postgres import admin

        return admin.driver_error(exc)

    @property
    def schema_fix(self) -> str:
        from sqlsink.postgres import admin

        return admin.schema_fix()

    def loading(self) -> PostgresLoading:
        from sqlsink.postgres.loading import LOADING

        return LOADING


POSTGRESQL = PostgreSQL()
