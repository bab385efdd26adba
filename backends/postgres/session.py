"""One PostgreSQL session of a store: the connection (shared by threads, taking turns), the reader connections a
search's candidate lists are read on at once, reads retried once on a new connection, write transactions, cached
statements, the cross-process group lock and closing.

:class:`Session` is the base of :class:`~tkg.backends.postgres.PostgresStore`; its reads, searches and writes
live in :mod:`.reads`, :mod:`.search` and :mod:`.writes`.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, ClassVar, Self, TypeVar

import psycopg

from tkg.errors import BackendError, ConfigurationError, ValidationError
from tkg.models import Kind
from tkg.storage import Store
from tkg.together import run_together

from .connection import ITERATIVE_SCAN_PGVECTOR, connect, describe, ensure_vector_extension
from .pack_cache import PackCache
from .schema import Statements, ensure_schema, quote_ident
from .terms import index_all, pack_all, postings_lock
from .vectors import INDEX_BATCH, index_steps, register_vector, sketch_all
from .worker import Worker

T = TypeVar("T")

log = logging.getLogger(__name__)

#: How long a write whose commit failed on the client's side waits for the server to settle it (its old
#: connection's process ending) before the outcome is reported unknown.
_SETTLING_S = 5.0

_SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


class _Reader(threading.local):
    """The connection a search worker thread reads on (None: the thread reads on the store's own connection)."""

    conn: psycopg.Connection[Any] | None = None


class _HeldGroups(threading.local):
    """The group locks this thread holds: each group and the server process of the connection holding its lock."""

    def __init__(self) -> None:
        self.held: dict[str, int] = {}


class Session(Store):
    """The connection and coordination of a PostgreSQL store (see :class:`~tkg.backends.postgres.PostgresStore`
    for the arguments)."""

    shared: ClassVar[bool] = True

    def __init__(
        self,
        dsn: str,
        dim: int,
        *,
        schema: str = "tkg",
        text_config: str = "english",
        ef_search: int = 64,
        connect_timeout: int = 10,
        build_memory_mb: int = 1024,
        search_connections: int = 2,
        pack_cache_mb: int = 64,
    ) -> None:
        if not isinstance(dim, int) or dim < 1 or dim > 16000:
            raise ValidationError("dim must be a positive integer (pgvector indexes up to 2000 dimensions)")
        if not isinstance(search_connections, int) or not 1 <= search_connections <= 16:
            raise ValidationError("search_connections must be an integer from 1 to 16")
        self._search_connections = search_connections
        if not isinstance(build_memory_mb, int) or not 64 <= build_memory_mb <= 2**21:
            raise ValidationError("build_memory_mb must be an integer from 64 to 2097152 (PostgreSQL's limit, 2 TB)")
        self._build_memory_mb = build_memory_mb
        if not isinstance(pack_cache_mb, int) or not 0 <= pack_cache_mb <= 2**20:
            raise ValidationError("pack_cache_mb must be an integer from 0 to 1048576")
        self._pack_cache = PackCache(pack_cache_mb * 2**20)  # .pack_cache: text searches' packed postings, decoded
        if not _SCHEMA_RE.match(schema):
            raise ValidationError(f"schema {schema!r} is invalid: use 1-63 lower-case letters, digits and _")
        self.dim = dim
        self.schema = schema
        self._dsn = dsn
        self._ef_search = int(ef_search)
        self._connect_timeout = connect_timeout
        self._lock = threading.RLock()
        self._q = Statements(schema)  # a statement with {s} standing for this schema, rendered once
        self._group_locks: dict[str, threading.Lock] = {}
        self._lock_conn: psycopg.Connection[Any] | None = None
        self._lock_conn_guard = threading.Lock()
        self._held_groups = _HeldGroups()
        # Reader connections beyond the store's own, kept between searches, and the threads that use them.
        self._reader = _Reader()
        self._spare: list[psycopg.Connection[Any]] = []
        self._workers: ThreadPoolExecutor | None = None
        self._readers_guard = threading.Lock()  # over the two above (not the store's lock, which reads hold)
        self._packs_lock = postings_lock(schema)  # .terms: writes hold it shared, a repack exclusively
        self._postings_since: Counter[Kind] = Counter()  # postings written or dropped since the last repack check
        self._packs_checked: set[Kind] = set()  # kinds whose packs this store has checked
        self._unindexed_since: Counter[Kind] = Counter()  # rows put unindexed since the worker was last asked
        # The worker that repacks the packs and indexes the vectors, on a connection of its own (opened at its first
        # task).
        worker_connection = functools.partial(connect, dsn, connect_timeout=connect_timeout)
        self._worker = Worker(worker_connection, schema)
        conn = connect(dsn, connect_timeout=connect_timeout)
        try:
            self._ext_schema, self._pgvector = ensure_vector_extension(conn)
            settings = ensure_schema(
                conn, schema, dim, text_config, {3: index_all, 6: sketch_all, 9: pack_all}, build_memory_mb
            )
        except psycopg.Error as exc:
            conn.close()
            raise BackendError(f"cannot open the tkg schema {schema!r} at {describe(dsn)}: {exc}") from None
        except BaseException:
            conn.close()
            raise
        if int(settings["dim"]) != dim:
            conn.close()
            raise ConfigurationError(
                f"the tkg schema {schema!r} at {describe(dsn)} holds {settings['dim']}-d vectors; this store was "
                f"opened with dim={dim}. Use the same embedder, or another schema"
            )
        self.text_config = settings["text_config"]
        self._conn: psycopg.Connection[Any] | None = None
        self._conn = self._set_up(conn)

    # ------------------------------------------------------------------------------------------------------
    # connections
    def _setup(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            "SELECT set_config('search_path', %s, false)",
            [f"{quote_ident(self.schema)}, {quote_ident(self._ext_schema)}"],
        )
        register_vector(conn)
        # tkg's reads are short: starting a parallel plan's workers took 3-6 ms, more than the read itself (the
        # postings of a search's terms at 1M facts: 0.3 ms of execution without them, 6.3 with).
        conn.execute("SELECT set_config('max_parallel_workers_per_gather', '0', false)")
        conn.execute("SELECT set_config('hnsw.ef_search', %s, false)", [str(max(1, min(1000, self._ef_search)))])
        if self._pgvector >= ITERATIVE_SCAN_PGVECTOR:
            # Filtered k-NN keeps walking the graph until k admitted rows are found (pgvector >= 0.8).
            conn.execute("SELECT set_config('hnsw.iterative_scan', 'strict_order', false)")

    def _usable(self, conn: psycopg.Connection[Any] | None) -> psycopg.Connection[Any]:
        """``conn`` if it is open and sound, else a new connection set up like it (the old one closed)."""
        if conn is not None and not conn.closed and not conn.broken:
            return conn
        if conn is not None and not conn.closed:
            conn.close()
        return self._set_up(connect(self._dsn, connect_timeout=self._connect_timeout))

    def _set_up(self, conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        """``conn`` made ready for tkg (:meth:`_setup`); closed, and the failure a BackendError, if that fails."""
        try:
            self._setup(conn)
        except psycopg.Error as exc:
            conn.close()
            raise BackendError(f"cannot set up the connection to PostgreSQL at {describe(self._dsn)}: {exc}") from None
        except BaseException:
            conn.close()
            raise
        return conn

    def _connection(self) -> psycopg.Connection[Any]:
        self._conn = self._usable(self._conn)
        return self._conn

    def _reader_connection(self) -> psycopg.Connection[Any]:
        self._reader.conn = self._usable(self._reader.conn)
        return self._reader.conn

    def _read(self, fn: Callable[[psycopg.Cursor[Any]], T]) -> T:
        """Run a read on the connection (a search worker's own, else the store's); once more on a new connection if
        the old one dropped."""
        if self._reader.conn is not None:
            return self._read_on(self._reader_connection, fn)
        with self._lock:
            return self._read_on(self._connection, fn)

    @staticmethod
    def _read_on(connection: Callable[[], psycopg.Connection[Any]], fn: Callable[[psycopg.Cursor[Any]], T]) -> T:
        for attempt in (0, 1):
            conn = connection()
            try:
                with conn.cursor(binary=True) as cur:
                    return fn(cur)
            except psycopg.OperationalError as exc:
                if conn.broken and attempt == 0:
                    continue
                raise BackendError(f"PostgreSQL read failed: {exc}") from None
            except psycopg.Error as exc:
                raise BackendError(f"PostgreSQL read failed: {exc}") from None
        raise AssertionError("unreachable")

    def _together(self, reads: Sequence[Callable[[], T]]) -> list[T]:
        """Run ``reads`` (each a call of this store's read methods) on up to ``search_connections`` connections at
        once (:func:`tkg.together.run_together`): the calling thread on the store's connection, worker threads each
        on a reader connection of their own."""
        return run_together(reads, self._search_connections - 1, self._start_readers)

    def _start_readers(self, drain: Callable[[], None], pending: Callable[[], bool], count: int) -> list[Future[None]]:
        """Start ``count`` helpers of :meth:`_together` on the store's reader threads (the pool made at the first)."""
        with self._readers_guard:  # not after close(), which shuts the pool down under this guard
            if self._workers is None:
                self._workers = ThreadPoolExecutor(self._search_connections - 1, thread_name_prefix="tkg-pg-read")
            pool = self._workers
            return [pool.submit(self._read_beside, pool, drain, pending) for _ in range(count)]

    def _read_beside(self, pool: ThreadPoolExecutor, drain: Callable[[], None], pending: Callable[[], bool]) -> None:
        """A worker thread's part of :meth:`_together`: ``drain()`` on a reader connection (a spare one, else a new
        one), kept for the next search unless the store was closed meanwhile."""
        if not pending():
            return  # the other connections read it all already: no connection taken or opened
        with self._readers_guard:
            conn = self._spare.pop() if self._spare else None
        self._reader.conn = conn
        try:
            try:
                self._reader_connection()  # opened here, so a read's retry is only for a connection that dropped
            except (BackendError, psycopg.Error) as exc:  # (the server's connection limit): the others read it
                log.warning("no reader connection for a search, it reads on fewer: %s", exc)
                return
            drain()
        finally:
            conn, self._reader.conn = self._reader.conn, None
            if conn is not None:
                with self._readers_guard:
                    keep = self._workers is pool and not conn.closed  # else the store was closed meanwhile
                    if keep:
                        self._spare.append(conn)
                if not keep:
                    conn.close()

    def _transaction(self, body: Callable[[psycopg.Cursor[Any]], None]) -> None:
        """Run ``body`` in one transaction: all of it is written, or nothing. In psycopg's pipeline mode: the
        statements whose results ``body`` does not read go to the server together, not a round trip each.

        A failure once the commit was sent (the connection lost as it went, or the pipeline's end failing) does not
        tell whether the server committed: the transaction's id, read with the body's first results, is then looked
        up on a new connection (``pg_xact_status``). Committed: the write stands and this returns; else the
        failure is raised, and nothing was written; unknown: a BackendError that says so."""
        with self._lock:
            conn = self._connection()
            xid: str | None = None
            try:
                with conn.pipeline(), conn.transaction(), conn.cursor(binary=True) as cur, conn.cursor() as mark:
                    mark.execute("SELECT pg_current_xact_id()::text")  # read along with the body's first results
                    body(cur)
                    row = mark.fetchone()
                    xid = str(row[0]) if row else None
            except psycopg.Error as exc:
                if xid is not None and self._committed(xid, exc):
                    return
                if isinstance(exc, psycopg.OperationalError) and (conn.broken or conn.closed):
                    reason = " ".join(str(exc).split())  # libpq's reasons span lines
                    raise BackendError(
                        f"the connection to PostgreSQL was lost during a write ({reason}); the server rolls back the "
                        "unfinished transaction, so nothing of this batch was written. tkg reconnects on the next call"
                    ) from None
                raise BackendError(f"PostgreSQL refused the write, nothing was written: {exc}") from None

    def _committed(self, xid: str, failure: psycopg.Error) -> bool:
        """Whether the transaction ``xid``, whose commit failed with ``failure`` on the client's side, was committed
        by the server (looked up on a sound connection; the caller holds the store's lock)."""
        deadline = time.monotonic() + _SETTLING_S
        while True:
            try:
                status = self._connection().execute("SELECT pg_xact_status(%s::xid8)", [xid]).fetchone()
            except (psycopg.Error, BackendError) as exc:
                raise BackendError(
                    f"a write to PostgreSQL failed as it committed ({failure}), and whether the server committed it "
                    f"is unknown: it could not be asked ({exc}). Check the memory before writing it again"
                ) from None
            if status is None or status[0] != "in progress" or time.monotonic() >= deadline:
                break
            time.sleep(0.05)  # the old connection's server process is still ending
        if status is not None and status[0] == "committed":
            log.warning("a write to PostgreSQL failed as it committed (%s), but the server had committed it", failure)
            return True
        if status is not None and status[0] == "in progress":
            raise BackendError(
                f"a write to PostgreSQL failed as it committed ({failure}), and the server is still running it: "
                "whether it commits is unknown. Check the memory before writing it again"
            ) from None
        return False

    def claim_embedder(self, name: str) -> None:
        """Record the embedder that writes this schema's vectors (the first to claim it), and refuse another."""

        def claim(cur: psycopg.Cursor[Any]) -> None:
            cur.execute(
                self._q("INSERT INTO {s}.meta (key, value) VALUES ('embedder', %s) ON CONFLICT (key) DO NOTHING"),
                [name],
            )

        self._transaction(claim)
        row = self._read(
            lambda cur: cur.execute(self._q("SELECT value FROM {s}.meta WHERE key = 'embedder'")).fetchone()
        )
        recorded = row[0] if row else name
        if recorded != name:
            raise ConfigurationError(
                f"the tkg schema {self.schema!r} at {describe(self._dsn)} holds vectors of the embedder {recorded!r}, "
                f"not {name!r}: their similarities would mean nothing. Use that embedder, or another schema"
            )

    def close(self) -> None:
        """Close the connections (the data stays in the database). The rows this store put that its worker was not
        asked to index yet (fewer than ``INDEX_EVERY`` of a kind, .writes) are indexed first, on the store's own
        connection, so that short-lived processes leave none behind; the worker's step under way is cancelled."""
        with self._lock:
            left = {kind: n for kind, n in self._unindexed_since.items() if n}
            self._unindexed_since.clear()
            conn = self._conn
            if left and conn is not None and not conn.closed and not conn.broken:
                with contextlib.suppress(psycopg.Error):  # a server gone: the next store that writes indexes them
                    for kind, n in left.items():
                        with contextlib.closing(index_steps(conn, self._q, kind)) as steps:
                            for _ in itertools.islice(steps, -(-n // INDEX_BATCH)):  # at most the steps it left
                                pass
        self._worker.close()
        with self._readers_guard:
            workers, self._workers = self._workers, None
        if workers is not None:
            workers.shutdown(wait=True)  # searches in flight end first
        with self._readers_guard:
            spare, self._spare = self._spare, []
        with self._lock:
            for conn in (self._conn, self._lock_conn, *spare):
                if conn is not None and not conn.closed:
                    conn.close()
            self._conn = self._lock_conn = None

    def __del__(self) -> None:
        # A store dropped without close() gives its connections back at once (servers limit connections).
        worker = getattr(self, "_worker", None)
        if worker is not None:
            worker.close()
        for conn in (getattr(self, "_conn", None), getattr(self, "_lock_conn", None), *getattr(self, "_spare", ())):
            if conn is not None and not conn.closed:
                conn.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------------------
    # cross-process coordination
    @contextmanager
    def group_lock(self, group_id: str, *, poll: float = 0.01) -> Iterator[None]:
        """Hold the lock of ``group_id`` across processes (a PostgreSQL advisory lock) and threads.

        Hold it around a read-modify-write cycle of one group, such as ingesting one episode, so that two
        processes never plan from the same state and overwrite each other's changes.
        """
        with self._lock:
            local = self._group_locks.setdefault(group_id, threading.Lock())
        with local:
            key = self._group_key(group_id)
            delay = poll
            while not (holder := self._lock_call("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", key)):
                time.sleep(delay)  # polling keeps one waiting group from blocking the lock connection
                delay = min(delay * 2, 0.2)
            self._held_groups.held[group_id] = holder  # checked by each write meanwhile (:meth:`_send_lock_checks`)
            try:
                yield
            finally:
                self._held_groups.held.pop(group_id, None)
                try:
                    self._lock_call("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", key)
                except BackendError as exc:  # its connection dropped, which let the lock go already
                    log.warning("could not release the lock of group %r: %s", group_id, exc)

    def _send(self, cur: psycopg.Cursor[Any], statement: str, params: Any) -> psycopg.Cursor[Any]:
        """Send ``statement`` (of this schema) in ``cur``'s transaction on a cursor of its own, whose results are
        read when needed: in pipeline mode, reads sent one after the other share one round trip."""
        sent = cur.connection.cursor(binary=True)
        sent.execute(self._q(statement), params)
        return sent

    def _group_key(self, group_id: str) -> str:
        """The key of a group's advisory lock (its hash is the lock's id)."""
        return f"tkg-group:{self.schema}:{group_id}"

    def _lock_call(self, statement: str, key: str) -> int:
        """Run ``statement`` (true or false) on the lock connection: the server process holding it when true, else
        0."""
        with self._lock_conn_guard:
            conn = self._lock_conn
            if conn is None or conn.closed or conn.broken:
                self._lock_conn = conn = connect(self._dsn, connect_timeout=self._connect_timeout)
            try:
                row = conn.execute(statement, [key]).fetchone()  # type: ignore[arg-type]
            except psycopg.Error as exc:
                raise BackendError(f"PostgreSQL group lock failed: {exc}") from None
            return conn.info.backend_pid if row and row[0] else 0

    def _send_lock_checks(self, cur: psycopg.Cursor[Any]) -> Callable[[], None]:
        """Send, in ``cur``'s transaction, the check that the group locks this thread holds are still held (a lock
        connection that dropped meanwhile, during an LLM call say, let its locks go: another process may be writing
        the group); returns what raises, once the results are in, if one is not. Nothing is sent when none is held."""
        held = dict(self._held_groups.held)
        if not held:
            return lambda: None
        check = self._send(
            cur,
            "SELECT k.i FROM unnest(%s::text[], %s::int4[]) WITH ORDINALITY AS k(key, pid, i) WHERE NOT EXISTS ("
            "SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted AND l.pid = k.pid "
            "AND l.objsubid = 1 AND ((l.classid::int8 << 32) | l.objid::int8) = hashtextextended(k.key, 0))",
            [[self._group_key(g) for g in held], list(held.values())],
        )

        def raise_if_lost() -> None:
            groups = list(held)
            lost = [groups[int(i) - 1] for (i,) in check.fetchall()]
            if lost:
                raise BackendError(
                    f"the PostgreSQL lock of group(s) {lost} was lost while held (its connection dropped), so another "
                    "process may have written the group meanwhile: nothing of this write was written; run it again"
                )

        return raise_if_lost
