"""A PostgreSQL store's maintenance, off the writers' path: a worker thread with a connection of its own that

- checks the text kinds the writes asked about (:func:`.terms.behind`) and repacks those far behind
  (:func:`.terms.repack_steps`, during which the writers go on). Before, the write that noticed repacked after it
  committed, while every writer of the schema waited: 0.4 s for the facts at 100,000, 6.6 s at a million.
- enters the rows the writes put into the HNSW index of their kind (:func:`.vectors.index_steps`): a write puts its
  rows unindexed, so that no HNSW insert runs inside its transaction, and searches score the rows not indexed yet
  exactly (schema version 10);
- vacuums a vector kind's table once the writes deleted rows of it (a removed episode, an erased group) and a share
  of its rows is dead (:data:`DEAD_SHARE`): pgvector's HNSW walk keeps meeting the index entries of dead rows until
  a vacuum drops them, and a cosine search then missed live rows it should have found (at 1,200 facts with half
  removed, for ~20 s, until autovacuum came); a vacuum also frees the erased rows' data.

A task that fails is logged and tried again when next asked; the writes it followed are committed already.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
from collections.abc import Callable, Generator, Iterable
from typing import Any

import psycopg

from tkg.models import Kind

from . import terms
from .schema import TABLES, Statements
from .vectors import index_steps

log = logging.getLogger(__name__)


class Task(enum.Enum):
    REPACK = "repacking the {} postings"
    INDEX = "indexing the {} vectors"
    VACUUM = "vacuuming the {} rows removed"


#: A table is vacuumed once at least this share of its rows is dead (autovacuum waits for 20%, and its next round).
DEAD_SHARE = 0.02
#: ... and at least this many.
DEAD_LEAST = 32
#: The records of a kind, every group's (the counts the writes keep).
_LIVE = "SELECT coalesce(sum(n), 0) FROM {s}.counts WHERE kind = %s"


class Worker:
    """One store's worker: :meth:`ask` hands it tasks, each a (:class:`Task`, kind) (it starts on first use),
    :meth:`wait` returns once it has done all it was asked, :meth:`close` stops it (cancelling a step under
    way)."""

    def __init__(self, connect: Callable[[], psycopg.Connection[Any]], schema: str) -> None:
        self._connect = connect
        self._schema = schema
        self._q = Statements(schema)
        self._cond = threading.Condition()
        self._asked: list[tuple[Task, Kind]] = []  # in the order asked, each once
        self._deleted: dict[Kind, int] = {}  # rows the writes deleted since each table was last vacuumed
        self._busy = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection[Any] | None = None

    def ask(self, tasks: Iterable[tuple[Task, Kind]]) -> None:
        """Do ``tasks`` on the worker; returns at once."""
        tasks = list(tasks)
        with self._cond:
            if self._closed or not tasks:
                return
            self._asked.extend(t for t in tasks if t not in self._asked)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"tkg-maintain-{self._schema}", daemon=True)
                self._thread.start()
            self._cond.notify_all()

    def deleted(self, counts: dict[Kind, int]) -> None:
        """The writes deleted these many rows of each kind: vacuum its table once enough are (returns at once)."""
        with self._cond:
            for kind, n in counts.items():
                self._deleted[kind] = self._deleted.get(kind, 0) + n
        self.ask((Task.VACUUM, kind) for kind in counts)

    def wait(self, timeout: float | None = None) -> bool:
        """Return once every task asked so far is done: True, or False if ``timeout`` seconds passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: not (self._asked or self._busy) or self._closed, timeout)

    def close(self) -> None:
        """Stop the worker: a step under way is cancelled (a repack's current packs stay in use and the next store
        to check repacks; rows left unindexed are indexed by the next store that writes, and searched exactly
        until then)."""
        with self._cond:
            self._closed = True
            self._asked.clear()
            conn, thread = self._conn, self._thread
            self._cond.notify_all()
        while thread is not None and thread.is_alive():
            if conn is not None and not conn.closed:
                with contextlib.suppress(psycopg.Error):  # a server gone cancels every statement
                    conn.cancel_safe()  # a statement under way ends at once; the worker then sees it is closed
            thread.join(0.1)
            with self._cond:
                conn = self._conn

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._asked and not self._closed:
                        self._cond.wait()
                    if self._closed:
                        return
                    task, kind = self._asked.pop(0)
                    self._busy = True
                try:
                    self._do(task, kind)
                except Exception as exc:  # the worker goes on: a later ask tries again
                    if not self._closed:
                        log.warning("%s failed (the write was committed): %s", task.value.format(kind.value), exc)
                finally:
                    with self._cond:
                        self._busy = False
                        self._cond.notify_all()
        finally:
            with self._cond:
                conn, self._conn = self._conn, None
                self._closed = True
                self._cond.notify_all()
            if conn is not None and not conn.closed:
                conn.close()

    def _do(self, task: Task, kind: Kind) -> None:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None and not conn.closed:
                conn.close()
            conn = self._connect()
            with self._cond:
                if self._closed:
                    conn.close()
                    return
                self._conn = conn
        if task is Task.VACUUM:
            with self._cond:
                dead = self._deleted.get(kind, 0)
            with conn.cursor() as cur:
                live = int((cur.execute(self._q(_LIVE), [kind.value]).fetchone() or (0,))[0])
                if dead < max(DEAD_LEAST, DEAD_SHARE * (live + dead)):
                    return
                cur.execute(self._q(f"VACUUM {{s}}.{TABLES[kind].name}"))
            with self._cond:
                self._deleted[kind] -= dead
            return
        steps: Generator[object, None, None]
        if task is Task.INDEX:
            steps = index_steps(conn, self._q, kind)
        else:
            with conn.cursor() as cur:
                if not terms.behind(cur, self._q, kind):
                    return
            steps = terms.repack_steps(conn, self._q, kind, self._schema)
        with contextlib.closing(steps):
            for _ in steps:
                if self._closed:
                    return  # closing the steps rolls back the step under way
