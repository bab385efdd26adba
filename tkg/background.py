"""Background ingestion: add an episode and get its id back at once, while extraction runs behind a bounded queue.

A submitted episode is stored at once with status ``queued`` (:meth:`tkg.Memory.queue_episode`): it is visible,
searchable as an episode and saved in snapshots, so nothing accepted is lost, even if the process stops before
its extraction runs. Worker threads then extract it (:meth:`tkg.Memory.process_queued`, the path that
:meth:`tkg.Memory.retry` takes too), and it ends ``extracted``, ``stored`` or ``failed`` in the memory.

Episodes of one group apply one at a time, in submission order, so a group's facts invalidate each other as they
would under sequential :meth:`tkg.Memory.add_episode` calls; different groups proceed in parallel, up to
``workers`` at once. However many workers there are, LLM calls stay within the memory's one
:class:`~tkg.llm.guard.GuardedLLM` (``MemoryConfig.llm_policy``). The community refresh policy runs on the worker,
after the episode is written; a refresh that fails only adds a warning to the episode's result.

>>> from tkg import BackgroundIngestor, FixedClock, HashEmbedder, Memory, RulesLLM
>>> memory = Memory(embedder=HashEmbedder(), llm=RulesLLM(), clock=FixedClock("2024-05-01T00:00:00Z"))
>>> with BackgroundIngestor(memory, workers=2) as ingestor:
...     episode_id = ingestor.submit("Ann: I LIVES_IN Paris.", group_id="demo")
...     ingestor.wait(episode_id, timeout=30).state
'done'
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, InvalidStateError
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import dataclass
from datetime import datetime
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from tkg.errors import (
    ConfigurationError,
    ExtractionFailedError,
    IngestorClosedError,
    LLMError,
    QueueFullError,
    TkgError,
    ValidationError,
    WaitTimeoutError,
)
from tkg.ingest import EpisodeResult
from tkg.models import Episode, EpisodeSource, EpisodeStatus, Kind, check_id, check_lookup_id, new_id

if TYPE_CHECKING:
    from tkg.memory import Memory

__all__ = ["BackgroundIngestor", "IngestionStatus", "State"]

State = Literal["queued", "running", "done", "failed"]
_FINISHED = frozenset({"done", "failed"})
_EXIT_POLL = 0.2  # seconds between an idle worker's checks that the program's main thread still runs

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IngestionStatus:
    """Where one background ingestion stands.

    ``state``: ``queued`` (stored, waiting for a worker), ``running``, ``done`` (extracted, or stored without an
    LLM) or ``failed``. For a failed one, ``error`` says why and ``retryable`` whether trying again may help (the
    LLM was unreachable, rate-limited or answered badly after its retries) rather than being futile (the LLM
    refused the request itself, or the episode was removed meanwhile). ``result`` is what the ingestion wrote;
    it is kept for the ingestor's most recent episodes only (see ``keep_finished``).
    """

    episode_id: str
    state: State
    error: str | None = None
    retryable: bool = False
    result: EpisodeResult | None = None

    @property
    def finished(self) -> bool:
        """Whether the ingestion is over (``done`` or ``failed``)."""
        return self.state in _FINISHED

    @classmethod
    def of(cls, episode: Episode) -> IngestionStatus:
        """The status an episode's stored record tells (no result; for one no ingestor tracks): ``queued``,
        ``failed`` (retryable: the failure's class is not stored, and a stored failure is what
        :meth:`tkg.Memory.retry` exists for), else ``done``."""
        if episode.status is EpisodeStatus.QUEUED:
            return cls(episode.id, "queued")
        if episode.status is EpisodeStatus.FAILED:
            return cls(episode.id, "failed", error=episode.error, retryable=True)
        return cls(episode.id, "done")


class BackgroundIngestor:
    """Ingests episodes on worker threads behind a bounded queue; see the module docstring.

    ``max_queue`` bounds the episodes accepted and not yet started (a full queue refuses new ones with
    :class:`~tkg.errors.QueueFullError`); ``workers`` is the number of threads, hence of groups extracted at once.
    ``resume=True`` queues at once every episode the memory holds as ``queued`` (see :meth:`resume`).
    ``keep_finished`` is how many finished statuses (with their results) are kept; an older one is answered from
    the memory, without its result.

    Use it as a context manager, or call :meth:`close`: leaving the ``with`` block normally drains the queue;
    leaving it with an exception stops after the running work (the rest stays queued in the memory). When the
    program's main thread ends without a close, the workers stop likewise after the running work (they notice
    within ``_EXIT_POLL`` seconds) and the process exits.
    """

    def __init__(
        self,
        memory: Memory,
        *,
        max_queue: int = 1000,
        workers: int = 4,
        resume: bool = False,
        keep_finished: int = 1000,
    ) -> None:
        for what, value in (("max_queue", max_queue), ("workers", workers), ("keep_finished", keep_finished)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"BackgroundIngestor {what} must be a positive integer, got {value!r}")
        self.memory = memory
        self.max_queue = max_queue
        self.workers = workers
        self.keep_finished = keep_finished
        self._cond = threading.Condition()
        # Per group, the ids accepted and not yet started, in submission order.
        self._waiting: dict[str, deque[str]] = {}
        # Groups with waiting work and no running episode, first come first served: a group is in here at most
        # once and never while one of its episodes runs, which is what keeps each group in order.
        self._ready: deque[str] = deque()
        self._busy: set[str] = set()
        self._queued = 0
        self._running = 0
        self._reserved: set[str] = set()  # ids being stored by submit/retry right now
        self._states: dict[str, IngestionStatus] = {}
        self._finished: OrderedDict[str, None] = OrderedDict()  # finished ids, oldest first
        self._watchers: dict[str, list[Future[IngestionStatus]]] = {}
        self._accepting = True
        self._stopping = False
        # Not daemon threads: a daemon worker cut off at exit inside a native library (hnswlib) aborts the process
        # ("terminate called without an active exception"). When the program's main thread ends without a
        # close(), the workers finish the episodes they are running and stop (see _work).
        self._threads = [threading.Thread(target=self._work, name=f"tkg-ingest-{i}") for i in range(workers)]
        self._live = workers  # workers that have not stopped
        for thread in self._threads:
            thread.start()
        if resume:
            try:
                self.resume()
            except BaseException:
                self.close(drain=False)  # no threads left behind; what was resumed stays queued in the memory
                raise

    # ------------------------------------------------------------------------------------------------------
    # accepting work
    def submit(
        self,
        content: str | Mapping[str, Any] | list[Any],
        *,
        group_id: str | None = None,
        source: EpisodeSource | str = EpisodeSource.MESSAGE,
        reference_time: datetime | str | None = None,
        source_description: str = "",
        name: str = "",
        episode_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> str:
        """Store an episode as ``queued`` and return its id at once; a worker extracts it later.

        Arguments are those of :meth:`tkg.Memory.add_episode`. Bad input raises the same errors as there, and a
        full queue raises :class:`~tkg.errors.QueueFullError`; either way nothing is stored or queued.
        """
        # The id is settled first: the queue slot is reserved under it before the episode is stored.
        episode_id = check_id(episode_id, "episode_id") if episode_id is not None else new_id()
        self._accept(
            episode_id,
            lambda: self.memory.queue_episode(
                content,
                group_id=group_id,
                source=source,
                reference_time=reference_time,
                source_description=source_description,
                name=name,
                episode_id=episode_id,
                metadata=metadata,
            ),
        )
        return episode_id

    def retry(self, episode_id: str) -> None:
        """Queue a failed episode again (it is marked ``queued`` in the memory until a worker takes it).

        Raises :class:`~tkg.errors.NotFoundError` for an unknown id, :class:`~tkg.errors.ValidationError` for an
        episode that is queued, running or done, and :class:`~tkg.errors.QueueFullError` when the queue is full.
        """
        self._accept(check_id(episode_id, "episode_id"), lambda: self._requeue(episode_id))

    def _requeue(self, episode_id: str) -> Episode:
        episode = self.memory.get(Kind.EPISODE, episode_id)
        assert isinstance(episode, Episode)
        if episode.status is EpisodeStatus.FAILED:
            return self.memory.requeue(episode_id)
        if episode.status is not EpisodeStatus.QUEUED:  # queued in the memory: an unexpected error left it there
            raise ValidationError(f"episode {episode_id} has status {episode.status.value!r}; only failed ones retry")
        return episode

    def resume(self) -> list[str]:
        """Queue every episode the memory holds as ``queued`` that this ingestor is not already handling (after
        :meth:`tkg.Memory.load`, say, or after another ingestor was closed with ``drain=False``), each group in
        reference-time, then creation order. Returns their ids in that order. Resumed episodes were accepted
        before, so they are queued even beyond ``max_queue``."""
        with self._cond:
            self._check_open()
        episodes = self.memory.queued_episodes()
        with self._cond:
            self._check_open()
            fresh = [e for e in episodes if e.id not in self._reserved and not self._active(e.id)]
            # One that finished here since the read above may no longer be queued (it was extracted, or failed):
            # its record is final now (a status is settled after the write), so ask the memory again.
            fresh = [e for e in fresh if e.id not in self._states or self._still_queued(e.id)]
            for episode in fresh:
                self._enqueue(episode)
            self._cond.notify_all()
        return [e.id for e in fresh]

    def _accept(self, episode_id: str, store: Callable[[], Episode]) -> None:
        """Reserve a queue slot for ``episode_id``, run ``store`` (which leaves the episode ``queued`` in the
        memory) and queue what it returns. If ``store`` fails, the slot is given back and nothing is queued."""
        self._reserve(episode_id)
        try:
            episode = store()
        except BaseException:
            with self._cond:
                self._reserved.discard(episode_id)
                self._cond.notify_all()  # close() and wait_all() count reservations
            raise
        self._admit([episode])

    def _reserve(self, episode_id: str) -> None:
        with self._cond:
            self._check_open()
            if episode_id in self._reserved or self._active(episode_id):
                raise ValidationError(f"episode {episode_id} is already queued or running in this ingestor")
            if self._queued + len(self._reserved) >= self.max_queue:
                raise QueueFullError(
                    f"the background ingestion queue holds {self.max_queue} episodes waiting (max_queue); nothing "
                    "was stored. Wait for it to drain (wait_all), or create the ingestor with a larger max_queue"
                )
            self._reserved.add(episode_id)

    def _admit(self, episodes: list[Episode]) -> None:
        with self._cond:
            for episode in episodes:
                self._reserved.discard(episode.id)
                self._enqueue(episode)
            self._cond.notify_all()

    def _enqueue(self, episode: Episode) -> None:
        """Under the lock: put a stored, queued episode at the end of its group's line."""
        group = episode.group_id
        self._states[episode.id] = IngestionStatus(episode.id, "queued")
        self._finished.pop(episode.id, None)
        if group not in self._waiting:
            self._waiting[group] = deque()
            if group not in self._busy:
                self._ready.append(group)
        self._waiting[group].append(episode.id)
        self._queued += 1

    def _still_queued(self, episode_id: str) -> bool:
        current = self.memory.get_many(Kind.EPISODE, [episode_id])[0]
        return isinstance(current, Episode) and current.status is EpisodeStatus.QUEUED

    def _active(self, episode_id: str) -> bool:
        known = self._states.get(episode_id)
        return known is not None and not known.finished

    def _check_open(self) -> None:
        if not self._accepting:
            raise IngestorClosedError("this background ingestor is closed; create a new one (and resume())")

    # ------------------------------------------------------------------------------------------------------
    # the workers
    def _work(self) -> None:
        main = threading.main_thread()
        while True:
            with self._cond:
                while not self._ready and not self._stopping and main.is_alive():
                    self._cond.wait(_EXIT_POLL)
                if not main.is_alive() and not self._stopping:
                    # The program is ending without close(): as close(drain=False), what waits stays queued in the
                    # memory (a saved memory resumes it), and the process exits once the running episodes are done.
                    self._accepting = False
                    self._stopping = True
                    self._cond.notify_all()
                if self._stopping:
                    self._live -= 1
                    last = not self._live
                    break
                group = self._ready.popleft()
                line = self._waiting[group]
                episode_id = line.popleft()
                if not line:
                    del self._waiting[group]
                self._busy.add(group)
                self._queued -= 1
                self._running += 1
                self._states[episode_id] = IngestionStatus(episode_id, "running")
                self._cond.notify_all()
            status = self._process(episode_id)
            with self._cond:
                self._busy.discard(group)
                self._running -= 1
                if group in self._waiting:
                    self._ready.append(group)
                watchers = self._settle(status)
                self._cond.notify_all()
            for future in watchers:
                _resolve(future, status)
        if last:  # every episode that ran is settled: fail the waits on what stays queued
            self._fail_watchers()

    def _process(self, episode_id: str) -> IngestionStatus:
        try:
            result = self.memory.process_queued(episode_id)
        except ExtractionFailedError as exc:
            cause = exc.__cause__
            llm_error = cause if isinstance(cause, LLMError) else exc
            return IngestionStatus(episode_id, "failed", error=str(llm_error), retryable=llm_error.retryable)
        except TkgError as exc:  # removed meanwhile, the embedder or the store failed: the episode stays queued
            retryable = isinstance(exc, LLMError) and exc.retryable
            return IngestionStatus(episode_id, "failed", error=str(exc), retryable=retryable)
        except BaseException as exc:
            # A worker must outlive any one episode, whatever its client raises (an LLM client's
            # asyncio.CancelledError is no Exception: it ended the worker with the episode "running" and its group
            # busy, and close() waited forever); the episode stays queued in the memory
            log.exception("background ingestion of episode %s failed unexpectedly; it stays queued", episode_id)
            return IngestionStatus(episode_id, "failed", error=f"{type(exc).__name__}: {exc}")
        return IngestionStatus(episode_id, "done", result=result)

    def _settle(self, status: IngestionStatus) -> list[Future[IngestionStatus]]:
        """Under the lock: record a finished ingestion, forget the oldest beyond ``keep_finished``, and hand back
        the futures waiting for it (resolved by the caller, outside the lock)."""
        self._states[status.episode_id] = status
        self._finished[status.episode_id] = None
        while len(self._finished) > self.keep_finished:
            old, _ = self._finished.popitem(last=False)
            del self._states[old]
        return self._watchers.pop(status.episode_id, [])

    # ------------------------------------------------------------------------------------------------------
    # reading and awaiting
    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the ingestor accepts no more work)."""
        with self._cond:
            return not self._accepting

    @property
    def pending(self) -> int:
        """Episodes accepted and not finished yet (queued or running)."""
        with self._cond:
            return self._queued + self._running + len(self._reserved)

    def status(self, episode_id: str) -> IngestionStatus:
        """Where an episode stands. Episodes this ingestor did not handle (or handled long ago) are answered from
        the memory. Raises :class:`~tkg.errors.NotFoundError` for an id the memory does not hold."""
        episode_id = check_lookup_id(episode_id)
        with self._cond:
            known = self._states.get(episode_id)
        if known is not None:
            return known
        episode = self.memory.get(Kind.EPISODE, episode_id)
        assert isinstance(episode, Episode)
        return IngestionStatus.of(episode)

    def future(self, episode_id: str) -> Future[IngestionStatus]:
        """A :class:`concurrent.futures.Future` that resolves to the episode's final status (``done`` or
        ``failed``); for asyncio, wrap it with :func:`asyncio.wrap_future`. It fails with
        :class:`~tkg.errors.IngestorClosedError` if the ingestor is closed with the episode still queued."""
        future: Future[IngestionStatus] = Future()
        stored = self.status(episode_id)  # NotFoundError first; the memory is read outside the lock
        with self._cond:
            current = self._states.get(episode_id, stored)
            if current.finished:
                _resolve(future, current)
            elif self._stopping:
                future.set_exception(self._closed_with(episode_id))
            elif episode_id not in self._states and episode_id not in self._reserved:
                # queued in the memory (by another ingestor or process, or before a load) but never taken on
                # here: nothing would ever resolve the wait
                future.set_exception(
                    ValidationError(
                        f"episode {episode_id} is {current.state} in the memory but not in this ingestor's queue: "
                        "call resume() to take it on, then wait"
                    )
                )
            else:
                self._watchers.setdefault(episode_id, []).append(future)
        return future

    def wait(self, episode_id: str, timeout: float | None = None) -> IngestionStatus:
        """Block until the episode is done or failed and return its status. Raises
        :class:`~tkg.errors.WaitTimeoutError` after ``timeout`` seconds (the work goes on)."""
        try:
            return self.future(episode_id).result(timeout)
        except FutureTimeoutError:
            raise WaitTimeoutError(
                f"episode {episode_id} is not finished after {timeout} s; it is still {self.status(episode_id).state}"
            ) from None

    def wait_all(self, timeout: float | None = None) -> None:
        """Block until everything accepted so far is finished. Raises :class:`~tkg.errors.WaitTimeoutError`
        after ``timeout`` seconds, and :class:`~tkg.errors.IngestorClosedError` if the ingestor was closed
        without draining (what is left stays queued in the memory)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            # Once stopped, what is still queued will not run here: wait only for the running episodes.
            while self._running or (self._queued + len(self._reserved) and not self._stopping):
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise WaitTimeoutError(
                        f"background ingestion is not finished after {timeout} s: {self._queued} episodes "
                        f"queued, {self._running} running"
                    )
                self._cond.wait(remaining)
            if self._queued + len(self._reserved):
                raise IngestorClosedError(
                    f"the ingestor was closed without draining; {self._queued} episodes stay queued in the memory "
                    "(save it, and resume() them with a new ingestor)"
                )

    # ------------------------------------------------------------------------------------------------------
    # shutting down
    def close(self, drain: bool = True) -> None:
        """Stop accepting work. ``drain=True`` finishes everything accepted first; ``drain=False`` stops once
        the running episodes are done and leaves the rest ``queued`` in the memory, where saving a snapshot
        keeps them and :meth:`resume` (of a new ingestor) picks them up. Idempotent."""
        with self._cond:
            self._accepting = False
            if drain and not self._stopping:
                # (or until the workers stop on their own: the program's main thread ended, see _work)
                self._cond.wait_for(lambda: self._stopping or not (self._queued + self._running + len(self._reserved)))
            self._stopping = True
            self._cond.notify_all()
        current = threading.current_thread()
        for thread in self._threads:
            if thread is not current:
                thread.join()
        self._fail_watchers()

    def _fail_watchers(self) -> None:
        """Fail the futures still waiting for an episode (the ingestor stopped with it queued)."""
        with self._cond:
            left = {i: self._watchers.pop(i) for i in list(self._watchers)}
        for episode_id, futures in left.items():
            for future in futures:
                with contextlib.suppress(InvalidStateError):
                    future.set_exception(self._closed_with(episode_id))

    @staticmethod
    def _closed_with(episode_id: str) -> IngestorClosedError:
        return IngestorClosedError(
            f"the ingestor was closed before episode {episode_id} was extracted; it stays queued in the memory "
            "(save it, and resume() it with a new ingestor)"
        )

    def __enter__(self) -> BackgroundIngestor:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(drain=exc_type is None)


def _resolve(future: Future[IngestionStatus], status: IngestionStatus) -> None:
    with contextlib.suppress(InvalidStateError):  # a waiter may have cancelled it
        future.set_result(status)
