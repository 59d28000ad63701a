"""The data of the settings checks: the levels, the settings read, a finding."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

ERROR, WARNING, OK = "error", "warning", "ok"

FLOOR_S = 600.0  # required time when neither the trigger interval nor the slowest write is known
LOCK_WAIT_FLOOR_S = 10.0  # below this, a server lock_timeout may end createTable's wait (planner)
DEFAULT_SAFETY_FACTOR = 3.0
MIN_PREPARED_SLOTS = 64
SINK_LOCK_TIMEOUT_DEFAULT = "60s"  # option lockTimeout's default (sqlsink.options)

TIMEOUTS = (
    "statement_timeout",
    "idle_in_transaction_session_timeout",
    "transaction_timeout",
    "lock_timeout",
    "idle_session_timeout",
)
SYNC_REP = ("synchronous_standby_names", "synchronous_commit")
CONNECTIONS = ("max_connections", "superuser_reserved_connections", "reserved_connections")
SETTINGS = ("max_prepared_transactions", *TIMEOUTS, *SYNC_REP, *CONNECTIONS)


# -- the data -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Setting:
    """A row of pg_settings, as the reading session sees it."""

    name: str
    value: str  # current_setting(name): '5s', '0', '64'
    setting: str  # pg_settings.setting: '5000'
    unit: str | None  # pg_settings.unit: 'ms', 's', 'min' or None
    source: str  # pg_settings.source: 'default', 'configuration file', 'user', ...
    sourcefile: str | None = None  # visible to superusers and pg_read_all_settings only

    def seconds(self) -> float:
        """A time setting in seconds (0 when off)."""
        factor = {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
        return float(self.setting) * factor.get(self.unit or "", 1.0)


@dataclass(frozen=True)
class ServerSettings:
    """What ``analyse`` judges: effective values and where they come from."""

    role: str  # the login role (session_user), whose ALTER ROLE settings apply
    database: str
    server_version_num: int
    settings: Mapping[str, Setting]
    # values stored by ALTER ROLE/DATABASE for this role and database, keyed by
    # (setting, the pg_settings.source they produce: 'user', 'database', 'database user',
    # 'global'); pg_settings.source names the one in effect
    stored: Mapping[tuple[str, str], str] = field(default_factory=dict)
    prepared_in_use: int = 0  # pg_prepared_xacts, cluster-wide
    connections_in_use: int = 0  # client sessions (pg_stat_activity), cluster-wide
    server_version: str = ""
    # standbys connected as synchronous (pg_stat_replication.sync_state sync or quorum);
    # None when this role may not see it (pg_read_all_stats or pg_monitor may)
    sync_standbys: int | None = None
    # the role and database names as SQL, quoted by the server (quote_ident()); None
    # when these settings were not read from a server (see checks.idents)
    role_ident: str | None = None
    database_ident: str | None = None
