"""Index maintenance off the writer's path: one background thread per store folds vector tails into the HNSW graph
and merges BM25 tails into a rebuilt main index.

A task runs in three steps: it begins under the store's lock (a snapshot: tail rows copied, the record list
copied), runs without it (the costly part: HNSW inserts, tokenizing and indexing every document), and finishes
under it again (the result installed, with what changed in between accounted for). Searches stay exact
throughout: what a task has not finished is still searched as tail. The indexes decide what is due and what a
step does (:class:`~.vectors.VectorIndex`, :class:`~.text.TextIndex`); this module only runs the steps.

The thread starts when an index reports work due and ends when none is left, so an idle store holds no thread.
Should it fall behind, the indexes fold on the writer's path again once their tails reach a few times their
limits (never an unbounded tail).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger("tkg")


class Task(Protocol):
    def run(self) -> None:
        """The costly step, without the store's lock."""

    def finish(self) -> None:
        """Install the result (the store's lock held)."""


class Maintenance:
    """Runs the tasks ``begin`` hands out (it is called with ``lock`` held and returns None when nothing is due)."""

    def __init__(self, lock: threading.RLock, begin: Callable[[], Task | None]) -> None:
        self._lock = lock
        self._begin = begin
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None
        self._kicked = False
        self._failed = False
        self._idle = threading.Event()
        self._idle.set()

    def kick(self) -> None:
        """Work may be due: make sure the thread is running (cheap; safe with the store's lock held)."""
        with self._guard:
            self._kicked = True
            if self._thread is None and not self._failed:
                self._idle.clear()
                # Not a daemon: at exit the interpreter waits for the running task (milliseconds; the thread ends
                # when nothing is due). A daemon thread stopped inside hnswlib's insert aborted the process.
                self._thread = threading.Thread(target=self._run, name="tkg-index-maintenance")
                self._thread.start()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no task is under way or due (for tests and benchmarks); False on timeout."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        try:
            while True:
                with self._guard:
                    self._kicked = False
                while True:
                    with self._lock:
                        task = self._begin()
                    if task is None:
                        break
                    task.run()
                    with self._lock:
                        task.finish()
                    time.sleep(0)  # let a writer waiting for the store's lock take it before the next task
                with self._guard:
                    if not self._kicked:
                        self._thread = None
                        self._idle.set()
                        return
        except Exception:  # the writers fold on their own path once the tails run far ahead
            log.exception("tkg: background index maintenance failed; indexes are folded on the writer's path")
            with self._guard:
                self._thread, self._failed = None, True
                self._idle.set()
