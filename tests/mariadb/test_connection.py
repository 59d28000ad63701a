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


def test_a_password_beyond_latin1_and_an_accented_one_log_in(mariadb_server: MariaServer) -> None:
    """A password is the user's UTF-8 text, as the server stored it from CREATE USER over
    a utf8mb4 session. PyMySQL sends a text password as latin1: an accented one (in
    latin1) reached the server as other bytes (access denied) and one beyond latin1 was a
    UnicodeEncodeError before any connection."""
    import urllib.parse

    import pymysql

    root = mariadb_server.connect(root=True)
    try:
        for user, password in (("acc_user", "pässwört"), ("sym_user", "пароль✓🔑")):
            with root.cursor() as cur:
                cur.execute("SET NAMES utf8mb4")
                cur.execute(f"DROP USER IF EXISTS '{user}'@'%'")
                cur.execute(f"CREATE USER '{user}'@'%%' IDENTIFIED BY %s", (password,))
            url = (
                f"mariadb://{user}:{urllib.parse.quote(password)}"
                f"@{mariadb_server.host}:{mariadb_server.port}/"
            )
            for conn in (connect(url), connect(url, password=password)):
                try:
                    with conn.cursor() as cur:
                        cur.execute("SELECT CURRENT_USER()")
                        assert cur.fetchone()[0] == f"{user}@%"
                finally:
                    conn.close()
            try:  # the wrong password is still refused
                connect(url, password=password + "x").close()
            except pymysql.err.OperationalError as exc:
                assert exc.args[0] == 1045, exc
            else:
                raise AssertionError("a wrong password logged in")
    finally:
        root.close()
