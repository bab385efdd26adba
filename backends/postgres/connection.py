"""Opening a connection to PostgreSQL, with tkg errors that say what went wrong and what to do."""

from __future__ import annotations

import re
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tkg.errors import BackendError

#: pgvector releases: HNSW needs 0.5; iterative index scans (complete filtered k-NN) came in 0.8.
MIN_PGVECTOR = (0, 5)
ITERATIVE_SCAN_PGVECTOR = (0, 8)

_CREDENTIALS = re.compile(
    r"password authentication failed|no password supplied|role \".*\" does not exist|authentication failed",
    re.IGNORECASE,
)
_NO_DATABASE = re.compile(r"database \".*\" does not exist", re.IGNORECASE)


def describe(dsn: str) -> str:
    """The DSN without its password, for messages."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.Error:
        return "<unparseable DSN>"
    params.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in params.items() if v is not None)


def connect(dsn: str, *, connect_timeout: int = 10) -> psycopg.Connection[Any]:
    """An autocommit connection in UTC, or a :class:`BackendError` naming the cause."""
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise BackendError(f"the PostgreSQL DSN is malformed: {exc}") from None
    extra = {
        k: v for k, v in (("connect_timeout", str(connect_timeout)), ("application_name", "tkg")) if k not in params
    }
    try:
        conn = psycopg.connect(make_conninfo(dsn, **extra), autocommit=True)
    except psycopg.OperationalError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        where = describe(dsn)
        if _CREDENTIALS.search(str(exc)):
            raise BackendError(
                f"PostgreSQL refused the credentials for {where}: {reason}. Check the user name and password in "
                "the DSN (or PGPASSWORD / ~/.pgpass)"
            ) from None
        if _NO_DATABASE.search(str(exc)):
            raise BackendError(f"PostgreSQL at {where} has no such database: {reason}. Create it first") from None
        raise BackendError(
            f"cannot connect to PostgreSQL at {where}: {reason}. Is the server running, and are host, port and "
            "database in the DSN right?"
        ) from None
    conn.execute("SET TIME ZONE 'UTC'")
    return conn


def _has_vector(conn: psycopg.Connection[Any]) -> bool:
    return conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is not None


def ensure_vector_extension(conn: psycopg.Connection[Any]) -> tuple[str, tuple[int, ...]]:
    """Make sure pgvector is enabled in this database (enabling it when allowed); returns its schema and version."""
    row = conn.execute(
        "SELECT n.nspname, e.extversion FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
        "WHERE e.extname = 'vector'"
    ).fetchone()
    if row is None:
        available = conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone()
        database, user = conn.info.dbname, conn.info.user
        if available is None:
            raise BackendError(
                f"the PostgreSQL server has no pgvector extension, which tkg needs for vector search (database "
                f"{database!r}). Install pgvector >= 0.5 on the server (e.g. the postgresql-NN-pgvector package), or "
                "use the embedded server: tkg.backends.postgres.EmbeddedPostgres"
            )
        try:
            # Processes opening one database at once would race on the catalog (a unique violation, even with
            # IF NOT EXISTS): one creates it at a time, under a lock held across the check and the creation.
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('tkg:create-extension', 0))")
                if not _has_vector(conn):
                    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except psycopg.errors.InsufficientPrivilege:
            raise BackendError(
                f"pgvector is installed on the server but not enabled in database {database!r}, and role {user!r} "
                f"may not enable it. Ask an administrator to run CREATE EXTENSION vector; in database {database!r}"
            ) from None
        return ensure_vector_extension(conn)
    version = tuple(int(p) for p in re.findall(r"\d+", str(row[1]))[:3])
    if version < MIN_PGVECTOR:
        raise BackendError(
            f"pgvector {row[1]} is too old: tkg needs >= {'.'.join(map(str, MIN_PGVECTOR))} (HNSW). Run "
            "ALTER EXTENSION vector UPDATE after upgrading pgvector on the server"
        )
    return str(row[0]), version
