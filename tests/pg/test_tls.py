"""TLS: libpq's parameters (sslmode, sslrootcert, sslcert, sslkey), in the URL or as
options, reach libpq unchanged, against a server that accepts TLS connections only
(``hostssl`` lines, a CA and certificates made by the fixture)."""

from __future__ import annotations

import json
import uuid
from urllib.parse import quote

import pytest

from sqlsink import cli
from sqlsink.errors import TransientError
from sqlsink.options import SinkOptions
from sqlsink.postgres.connection import connect
from sqlsink.postgres.partition import write_partition
from tests.fix_auth import (
    APP_DB,
    CERT_ROLE,
    TlsServer,
    commit,
    ids_of,
    prepare_table,
    rows,
    task,
    tls_server,
)

__all__ = ["tls_server"]


def verify_full_url(server: TlsServer, user: str = "postgres", db: str = "postgres") -> str:
    root = quote(str(server.ca), safe="/")
    return (
        f"postgresql://{user}@127.0.0.1:{server.embedded.port}/{db}"
        f"?sslmode=verify-full&sslrootcert={root}"
    )


def test_check_over_verify_full(tls_server: TlsServer, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["check", "--url", verify_full_url(tls_server), "--json"])
    out, err = capsys.readouterr()
    assert code in (0, 1), out + err  # 1: warnings about the server's settings
    assert json.loads(out)["role"] == "postgres"
    with connect(verify_full_url(tls_server), application_name="t") as conn:
        assert conn.pgconn.ssl_in_use
        ssl = conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        assert ssl.fetchone() == (True,)


def test_without_tls_the_server_refuses_clearly(
    tls_server: TlsServer, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"{tls_server.host_url}?sslmode=disable"
    code = cli.main(["check", "--url", url])
    _, err = capsys.readouterr()
    assert code == 2
    assert "no pg_hba.conf entry" in err and "no encryption" in err
    opts = SinkOptions.parse({"url": tls_server.host_url, "table": "t", "sslmode": "disable"})
    with pytest.raises(TransientError, match=r"cannot connect to PostgreSQL at .*no encryption"):
        connect(opts.url, opts.password, application_name="t")


def test_verify_full_refuses_a_certificate_of_another_ca(tls_server: TlsServer) -> None:
    """sslrootcert really is used: the client certificate is no CA of the server's."""
    opts = SinkOptions.parse(
        {
            "url": tls_server.host_url,
            "table": "t",
            "sslmode": "verify-full",
            "sslrootcert": str(tls_server.client_cert),
        }
    )
    with pytest.raises(TransientError, match="certificate verify failed"):
        connect(opts.url, opts.password, application_name="t")


def test_a_batch_with_tls_options_and_a_client_certificate(tls_server: TlsServer) -> None:
    """Tasks and the committer connect with the options sslmode, sslrootcert, sslcert,
    sslkey; the role logs in by its certificate (``cert`` in pg_hba.conf)."""
    url = f"postgresql://{CERT_ROLE}@127.0.0.1:{tls_server.embedded.port}/{APP_DB}"
    opts = SinkOptions.parse(
        {
            "url": url,
            "table": f"t_{uuid.uuid4().hex[:8]}",
            "sinkId": f"tls-{uuid.uuid4().hex[:8]}",
            "sslmode": "verify-full",
            "sslrootcert": str(tls_server.ca),
            "sslcert": str(tls_server.client_cert),
            "sslkey": str(tls_server.client_key),
        }
    )
    target = prepare_table(opts)
    run = uuid.uuid4().hex
    outcomes = [
        write_partition(opts, target, task(opts, 0, run, p), rows(range(p * 10, p * 10 + 10)))
        for p in range(2)
    ]
    assert all(o.gid for o in outcomes)  # prepared
    commit(opts, 0, outcomes, run)
    assert ids_of(opts) == list(range(20))
    with connect(opts.url, opts.password, application_name="t") as conn:
        who = conn.execute("SELECT current_user, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        assert who.fetchone() == (CERT_ROLE, True)
    # without the client certificate the role cannot log in
    bare = SinkOptions.parse({"url": url, "table": "t", "sslmode": "require"})
    with pytest.raises(TransientError, match="requires a valid client certificate"):
        connect(bare.url, bare.password, application_name="t")
