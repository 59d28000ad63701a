"""The MariaDB (and MySQL) backend as the adapters see it
(:class:`sqlsink.core.database.Database`), for ``mariadb://`` and ``mysql://`` URLs.

Its capabilities are what is built and tested on MariaDB 10.11: the bulk load (LOAD
DATA LOCAL INFILE from a FIFO into an XA branch); upsert (a session's temporary staging
table, then INSERT ... ON DUPLICATE KEY UPDATE in the branch: ``upsert.py``). Not built
yet, so refused before anything is written (``sqlsink.core.database.require``): schema
evolution, the consistent view, the server checks (``sqlsink check``), the operator's
commands (status, recover, forget, metrics), a pooler's detection. MariaDB cannot keep a
partition's session after XA PREPARE (another session cannot finish the branch until
that one ends), so that capability is absent by nature."""

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
    capabilities: frozenset[Capability] = frozenset({Capability.BULK_LOAD, Capability.UPSERT})

    def open_admin(self, url: str, command: str, password_command: str | None) -> AdminSession:
        """Refused: the operator's commands on MariaDB are not built yet (issue 31)."""
        from sqlsink.errors import ConfigError

        raise ConfigError(
            f"sqlsink {command} on a MariaDB or MySQL url is not built yet (sqlsink's "
            "MariaDB backend writes with format('sqlsink') and the foreachBatch writer; "
            "the operator's commands come later). Nothing was read or changed. Meanwhile: "
            "restarting the query (or the foreachBatch writer with the same sink_id) "
            "finishes every branch its commit log decided and rolls back the rest; "
            "XA RECOVER lists what is prepared"
        )

    def driver_error(self, exc: BaseException) -> DriverError | None:
        return None  # no admin session: the CLI never meets PyMySQL's errors

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
