"""Who am I: the connection's role, whether a superuser, the server's version."""

from __future__ import annotations

from sqlsink.core.admin import RoleInfo
from sqlsink.postgres.connection import Connection


def role_info(conn: Connection) -> RoleInfo:
    row = conn.execute(
        "SELECT current_user::text, current_setting('is_superuser') = 'on', current_database(), "
        "current_setting('server_version'), current_setting('server_version_num')::int"
    ).fetchone()
    assert row is not None
    role, superuser, database, version, version_num = row
    return RoleInfo(str(role), bool(superuser), str(database), str(version), int(str(version_num)))
