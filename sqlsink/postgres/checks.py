"""Server checks the sink cannot work without (run on the driver before data is written)."""

from __future__ import annotations

from sqlsink.errors import ConfigError
from sqlsink.postgres.connection import Connection


def max_prepared_transactions(conn: Connection) -> int:
    row = conn.execute("SELECT current_setting('max_prepared_transactions')::int").fetchone()
    return int(row[0]) if row else 0


def require_prepared_transactions(conn: Connection, partitions: int | None = None) -> None:
    """Exactly-once needs PREPARE TRANSACTION: fail before any data is written if it is off."""
    if max_prepared_transactions(conn) == 0:
        needed = max(2 * (partitions or 0), 64)
        raise ConfigError(
            "prepared transactions are disabled on this server (max_prepared_transactions = 0), "
            "and exactly-once writes need them: set max_prepared_transactions to at least "
            f"{needed} (ALTER SYSTEM SET max_prepared_transactions = {needed}) and restart "
            "PostgreSQL; or use the option semantic=at_least_once"
        )
