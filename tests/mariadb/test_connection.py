"""Every wait on the network ends (docs/DESIGN.md invariant 11): the MariaDB backend's
sessions carry the same TCP bounds as PostgreSQL's (keepalives after 30 s, every 10 s,
three probes; unacknowledged data for a minute ends the connection), read back from the
socket of a real session."""

from __future__ import annotations

import socket

from sqlsink.mariadb.connection import connect
from tests.fix_mariadb import MariaServer


def test_a_session_finds_a_vanished_server_within_about_a_minute(
    mariadb_server: MariaServer,
) -> None:
    conn = connect(mariadb_server.url())
    try:
        sock = conn._sock
        assert sock.family in (socket.AF_INET, socket.AF_INET6)
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 30
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 10
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 60_000
    finally:
        conn.close()
