"""What differs between PostgreSQL versions, in one place.

Versions are ``server_version_num`` values (``current_setting('server_version_num')``:
170000 is 17.0). The sink's protocol needs nothing version-specific; the server
checks (``sqlsink.postgres.checks``) do.
"""

from __future__ import annotations

TRANSACTION_TIMEOUT = 170000  # the setting transaction_timeout exists from 17 on


def has_transaction_timeout(server_version_num: int) -> bool:
    """Whether the server has ``transaction_timeout`` (PostgreSQL 17 and later)."""
    return server_version_num >= TRANSACTION_TIMEOUT
