"""Independent reads run at once: the calling thread and a few helper threads each take the next read not yet
begun, until none is left. A search's candidate lists are such reads (one per target and method): PostgreSQL
answers them on several connections, the in-memory store on two cores (numpy and hnswlib release the interpreter
lock inside their loops).

The backend owns the threads (:func:`run_together` only asks it to start helpers), so it decides what a helper
holds while it reads: a connection of its own on PostgreSQL, nothing in memory. Pure: no state of its own.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")

#: ``start(drain, pending, count)``: begin ``count`` helpers on the backend's threads, each calling ``drain()``
#: (which reads until no read is left) and returning their futures; ``pending()`` tells a helper, before it
#: takes anything costly, whether any read is left for it.
Start = Callable[[Callable[[], None], Callable[[], bool], int], Sequence[Future[Any]]]


def run_together(reads: Sequence[Callable[[], T]], helpers: int, start: Start) -> list[T]:
    """The results of ``reads``, in order, with up to ``helpers`` helper threads (started by ``start``) reading
    beside the calling thread; each takes the next read not yet begun. Once all have ended, the error of the first
    read in order that failed is raised (the reads not begun by then are not begun at all). With no helper, the
    reads run one after the other on the calling thread. A helper that has not begun when the calling thread has
    finished (its thread busy with another caller's reads) is cancelled, not waited for."""
    helpers = min(helpers, len(reads) - 1)
    if helpers <= 0:
        return [read() for read in reads]
    todo = deque(range(len(reads)))
    results: list[Any] = [None] * len(reads)
    errors: dict[int, BaseException] = {}
    guard = threading.Lock()

    def pending() -> bool:
        with guard:
            return bool(todo) and not errors

    def drain() -> None:
        while True:
            with guard:
                if errors or not todo:
                    return
                i = todo.popleft()
            try:
                results[i] = reads[i]()
            except BaseException as exc:
                with guard:
                    errors[i] = exc

    started = start(drain, pending, helpers)
    drain()
    for future in started:
        if not future.cancel():
            future.result()
    if errors:
        raise errors[min(errors)]
    return results
