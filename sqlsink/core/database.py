"""What a database the sink writes to offers, as the adapters (the Spark entry points,
the CLI) see it: its name, its capabilities, and the interfaces they work through.

The entry that opens one for a URL is :mod:`sqlsink.backends`; the adapters reach a
database only through these interfaces (the layers' contract in pyproject.toml)."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Protocol

from sqlsink.core.admin import AdminSession, DriverError
from sqlsink.errors import ConfigError

if TYPE_CHECKING:
    from sqlsink.core.loading import Loading


class Capability(enum.Enum):
    """What one database has and another may lack. A feature that needs a capability
    the database lacks is refused before anything is written (:func:`require`)."""

    # a partition's rows streamed into its prepared transaction in one statement
    # (PostgreSQL's binary COPY FROM STDIN, MariaDB's LOAD DATA LOCAL INFILE from a FIFO)
    BULK_LOAD = "a bulk load of a partition into a prepared transaction"
    CONSISTENT_VIEW = "a consistent view of whole batches (consistentView)"
    UPSERT = "upsert (mode=upsert)"
    SCHEMA_EVOLUTION = "additive schema evolution (schemaEvolution)"
    POOLER_DETECTION = "detecting a transaction pooler in front of the server"
    SERVER_CHECKS = "judging the server's settings (sqlsink check)"
    SESSION_KEPT_AFTER_PREPARE = "keeping a partition's session after it prepares"
    ADMIN_COMMANDS = "the operator's commands (sqlsink status, recover, forget, metrics)"


class Database(Protocol):
    """A database kind, as :func:`sqlsink.backends.open_database` gives it for a URL."""

    @property
    def name(self) -> str:
        """Its name in messages: ``PostgreSQL``."""
        ...

    @property
    def capabilities(self) -> frozenset[Capability]: ...

    # the CLI's (sqlsink.core.admin)
    def open_admin(self, url: str, command: str, password_command: str | None) -> AdminSession:
        """A command's session (``command``: its name in the server's application_name)."""
        ...

    def driver_error(self, exc: BaseException) -> DriverError | None:
        """The driver's error as the CLI tells it apart; None for any other exception."""
        ...

    @property
    def schema_fix(self) -> str:
        """How to install the commit log's schema, for the error that says it is missing."""
        ...

    def loading(self) -> Loading:
        """The Spark adapters' interface (planning, the partition writer, the committer's
        backend); cheap to get, its methods import what they need when called."""
        ...


def require(database: Database, capability: Capability, wanted_by: str) -> None:
    """Refuse, before anything is written, what ``database`` cannot do."""
    if capability not in database.capabilities:
        raise ConfigError(
            f"{wanted_by} needs {capability.value}, which sqlsink's {database.name} backend "
            f"does not have; nothing was written. Use {wanted_by} with a database that has "
            "it, or go without it on this one"
        )
