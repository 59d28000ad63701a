"""The MariaDB (and MySQL) backend as the adapters see it
(:class:`sqlsink.core.database.Database`), for ``mariadb://`` and ``mysql://`` URLs.

Its capabilities are what is built and tested on MariaDB 10.11: the bulk load (LOAD
DATA LOCAL INFILE from a FIFO into an XA branch); upsert (a session's temporary staging
table, then INSERT ... ON DUPLICATE KEY UPDATE in the branch: ``upsert.py``); the
operator's commands (status, recover, forget, metrics: ``sqlsink.mariadb.admin``) and
the server's checks (``sqlsink check``: ``sqlsink.mariadb.checks``). Not built, so
refused before anything is written (``sqlsink.core.database.require``): schema
evolution, the consistent view (MariaDB's rows carry no transaction id a view could
match against the markers, as PostgreSQL's xmin does), a pooler's detection. MariaDB
cannot keep a partition's session after XA PREPARE (another session cannot finish the
branch until that one ends), so that capability is absent by nature."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlsink.core.database import Capability

if TYPE_CHECKING:
    from sqlsink.core.admin import AdminSession, DriverError
    from sqlsink.core.loading import Loading


@dataclass(frozen=True)
class MariaDB:
    name: str = "MariaDB"
    capabilities: frozenset[Capability] = frozenset(
        {
            Capability.BULK_LOAD,
            Capability.UPSERT,
            Capability.ADMIN_COMMANDS,
            Capability.SERVER_CHECKS,
        }
    )

    def open_admin(self, url: str, command: str, password_command: str | None) -> AdminSession:
        from sqlsink.mariadb.admin import MariaDBAdmin

        return MariaDBAdmin.open(url, command, password_command)

    def driver_error(self, exc: BaseException) -> DriverError | None:
        from sqlsink.mariadb.admin import driver_error

        return driver_error(exc)

    @property
    def schema_fix(self) -> str:
        return (
            "run the sink once (its planning creates database `sqlsink` and its tables), "
            "as a user that may create databases"
        )

    def loading(self) -> Loading:
        from sqlsink.mariadb.loading import LOADING

        return LOADING


MARIADB = MariaDB()
