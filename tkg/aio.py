"""The async door: :class:`AsyncMemory`, the public :class:`tkg.Memory` API for asyncio code.

Each call runs the synchronous one on a private thread pool, so the event loop keeps running while an extraction
waits for its LLM (the memory serialises store access itself and bounds LLM calls with its
:class:`~tkg.llm.guard.GuardedLLM`). Cancelling an ``await`` does not undo its call: the call completes on its
thread. Background ingestion (:class:`tkg.BackgroundIngestor`) is one ``await amem.submit(...)`` away.

>>> import asyncio
>>> from tkg import AsyncMemory, FixedClock, HashEmbedder, Memory, RulesLLM
>>> async def main() -> str:
...     memory = Memory(embedder=HashEmbedder(), llm=RulesLLM(), clock=FixedClock("2024-05-01T00:00:00Z"))
...     async with AsyncMemory(memory) as amem:
...         episode_id = await amem.submit("Ann: I LIVES_IN Paris.", group_id="demo")
...         await amem.wait(episode_id, timeout=30)
...         found = await amem.search("where does Ann live?", group_ids=["demo"])
...         return found.facts[0].record.fact
>>> asyncio.run(main())
'Ann lives in Paris'
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from tkg.background import BackgroundIngestor, IngestionStatus
from tkg.clock import Clock
from tkg.community_tier import CommunityReport
from tkg.config import MemoryConfig
from tkg.context import Context
from tkg.embedders.base import Embedder
from tkg.errors import ConfigurationError, IngestorClosedError, WaitTimeoutError
from tkg.ingest import EpisodeResult, RemovalResult
from tkg.inputs import not_a_batch
from tkg.llm.base import LLMClient, LLMUsage
from tkg.memory import EpisodeInput, FactInput, Memory
from tkg.memory_reads import Groups
from tkg.models import Entity, Episode, EpisodeSource, EpisodeStatus, Fact, Kind, Mention, Record
from tkg.ontology import Ontology
from tkg.reads import Neighbourhood
from tkg.search import SearchResults
from tkg.storage import Store
from tkg.timeline import Filters

__all__ = ["AsyncMemory"]

P = ParamSpec("P")
R = TypeVar("R")


class AsyncMemory:
    """An async form of :class:`tkg.Memory`: the same calls, awaited, plus background ingestion.

    ``threads`` is the size of the private pool the calls run on. ``max_queue`` and ``workers`` configure the
    :class:`~tkg.BackgroundIngestor` behind :meth:`submit`, made on first use. Use ``async with`` or
    ``await amem.aclose()``; the wrapped memory itself stays usable (and is not closed) afterwards.
    """

    def __init__(self, memory: Memory, *, threads: int = 8, max_queue: int = 1000, workers: int = 4) -> None:
        if not isinstance(memory, Memory):
            raise ConfigurationError(f"AsyncMemory wraps a tkg.Memory, not {type(memory).__name__}")
        if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
            raise ConfigurationError(f"AsyncMemory threads must be a positive integer, got {threads!r}")
        self.memory = memory
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="tkg-async")
        self._max_queue = max_queue
        self._workers = workers
        self._background: BackgroundIngestor | None = None
        self._closed = False
        # Guards the ingestor's making and the close: calls may come from several threads and event loops.
        self._guard = threading.Lock()
        self._closing: concurrent.futures.Future[None] | None = None  # the close, once begun (every aclose awaits it)

    @property
    def background(self) -> BackgroundIngestor:
        """The background ingestor behind :meth:`submit` (made on first use; one, whichever thread asks first)."""
        with self._guard:
            if self._background is None:
                self._check_open()
                self._background = BackgroundIngestor(self.memory, max_queue=self._max_queue, workers=self._workers)
            return self._background

    @property
    def usage(self) -> LLMUsage:
        """LLM cost of everything the memory has ingested so far (a copy)."""
        return self.memory.usage

    def _check_open(self) -> None:
        if self._closed:
            raise IngestorClosedError("this AsyncMemory is closed; wrap the memory in a new AsyncMemory")

    async def _call(self, fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """Run ``fn(*args, **kwargs)`` on the pool and await it: the methods forward through here, and mypy checks
        each forwarded argument against the synchronous method's signature."""
        self._check_open()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    # ------------------------------------------------------------------------------------------------------
    # ingestion (awaiting the extraction)
    async def add_episode(
        self,
        content: str | Mapping[str, Any] | list[Any],
        *,
        group_id: str | None = None,
        source: EpisodeSource | str = EpisodeSource.MESSAGE,
        reference_time: datetime | str | None = None,
        source_description: str = "",
        name: str = "",
        episode_id: str | None = None,
        extract: bool | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> EpisodeResult:
        """:meth:`tkg.Memory.add_episode`, awaited: returns once the episode is extracted."""
        return await self._call(
            self.memory.add_episode,
            content,
            group_id=group_id,
            source=source,
            reference_time=reference_time,
            source_description=source_description,
            name=name,
            episode_id=episode_id,
            extract=extract,
            metadata=metadata,
        )

    async def add_episodes(
        self, episodes: Iterable[EpisodeInput | Mapping[str, Any] | str], *, extract: bool | None = None
    ) -> list[EpisodeResult]:
        """:meth:`tkg.Memory.add_episodes`, awaited."""
        return await self._call(self.memory.add_episodes, _batch(episodes), extract=extract)

    async def add_facts(
        self,
        facts: Iterable[FactInput | Mapping[str, Any]],
        *,
        group_id: str | None = None,
        reference_time: datetime | str | None = None,
        source_description: str = "structured facts",
    ) -> EpisodeResult:
        """:meth:`tkg.Memory.add_facts`, awaited."""
        return await self._call(
            self.memory.add_facts,
            _batch(facts),
            group_id=group_id,
            reference_time=reference_time,
            source_description=source_description,
        )

    async def remove_episode(self, episode_id: str) -> RemovalResult:
        """:meth:`tkg.Memory.remove_episode`, awaited."""
        return await self._call(self.memory.remove_episode, episode_id)

    async def retry(self, episode_id: str) -> EpisodeResult:
        """:meth:`tkg.Memory.retry`, awaited (extracts now; :meth:`submit_retry` queues it instead)."""
        return await self._call(self.memory.retry, episode_id)

    async def failed_episodes(self, group_ids: Sequence[str] | str | None = None) -> list[Episode]:
        """:meth:`tkg.Memory.failed_episodes`, awaited."""
        return await self._call(self.memory.failed_episodes, group_ids)

    async def queue_episode(
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
    ) -> Episode:
        """:meth:`tkg.Memory.queue_episode`, awaited (:meth:`submit` also extracts it in the background)."""
        return await self._call(
            self.memory.queue_episode,
            content,
            group_id=group_id,
            source=source,
            reference_time=reference_time,
            source_description=source_description,
            name=name,
            episode_id=episode_id,
            metadata=metadata,
        )

    async def process_queued(self, episode_id: str) -> EpisodeResult:
        """:meth:`tkg.Memory.process_queued`, awaited."""
        return await self._call(self.memory.process_queued, episode_id)

    async def requeue(self, episode_id: str) -> Episode:
        """:meth:`tkg.Memory.requeue`, awaited."""
        return await self._call(self.memory.requeue, episode_id)

    async def queued_episodes(self, group_ids: Groups = None) -> list[Episode]:
        """:meth:`tkg.Memory.queued_episodes`, awaited."""
        return await self._call(self.memory.queued_episodes, group_ids)

    async def invalidate_fact(
        self, fact_id: str, at: datetime | str | None = None, *, note: Mapping[str, Any] | None = None
    ) -> Fact:
        """:meth:`tkg.Memory.invalidate_fact`, awaited."""
        return await self._call(self.memory.invalidate_fact, fact_id, at, note=note)

    async def delete_group(self, group_id: str) -> dict[str, int]:
        """:meth:`tkg.Memory.delete_group`, awaited."""
        return await self._call(self.memory.delete_group, group_id)

    async def refresh_communities(self, group_id: str | None = None, *, warm: bool | None = None) -> CommunityReport:
        """:meth:`tkg.Memory.refresh_communities`, awaited."""
        return await self._call(self.memory.refresh_communities, group_id, warm=warm)

    async def community_drift(self, group_id: str | None = None) -> float:
        """:meth:`tkg.Memory.community_drift`, awaited."""
        return await self._call(self.memory.community_drift, group_id)

    # ------------------------------------------------------------------------------------------------------
    # retrieval and reads
    async def search(self, query: str, **search_args: Any) -> SearchResults:
        """:meth:`tkg.Memory.search`, awaited; ``search_args`` are its keyword arguments."""
        return await self._call(self.memory.search, query, **search_args)

    async def context(self, query: str, **context_args: Any) -> str:
        """:meth:`tkg.Memory.context`, awaited; ``context_args`` are its keyword arguments."""
        return await self._call(self.memory.context, query, **context_args)

    async def retrieve(self, query: str, **retrieve_args: Any) -> Context:
        """:meth:`tkg.Memory.retrieve`, awaited; ``retrieve_args`` are its keyword arguments."""
        return await self._call(self.memory.retrieve, query, **retrieve_args)

    async def get(self, kind: Kind | str, record_id: str) -> Record:
        """:meth:`tkg.Memory.get`, awaited."""
        return await self._call(self.memory.get, kind, record_id)

    async def facts_about(self, entity_id: str, *, include_invalidated: bool = True) -> list[Fact]:
        """:meth:`tkg.Memory.facts_about`, awaited."""
        return await self._call(self.memory.facts_about, entity_id, include_invalidated=include_invalidated)

    async def stats(self) -> dict[str, Any]:
        """:meth:`tkg.Memory.stats`, awaited."""
        return await self._call(self.memory.stats)

    async def get_many(self, kind: Kind | str, ids: Sequence[str]) -> list[Record | None]:
        """:meth:`tkg.Memory.get_many`, awaited."""
        return await self._call(self.memory.get_many, kind, ids)

    async def get_all(
        self,
        group_ids: Groups = None,
        *,
        as_of: datetime | str | None = None,
        known_at: datetime | str | None = None,
        include_invalidated: bool = False,
        filters: Filters | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Fact]:
        """:meth:`tkg.Memory.get_all`, awaited."""
        return await self._call(
            self.memory.get_all,
            group_ids,
            as_of=as_of,
            known_at=known_at,
            include_invalidated=include_invalidated,
            filters=filters,
            limit=limit,
            offset=offset,
        )

    async def records(self, kind: Kind | str, group_ids: Groups = None) -> list[Record]:
        """:meth:`tkg.Memory.records`, awaited."""
        return await self._call(self.memory.records, kind, group_ids)

    async def episodes(
        self,
        group_ids: Groups = None,
        *,
        status: EpisodeStatus | str | None = None,
        before: datetime | str | None = None,
        last: int | None = None,
    ) -> list[Episode]:
        """:meth:`tkg.Memory.episodes`, awaited."""
        return await self._call(self.memory.episodes, group_ids, status=status, before=before, last=last)

    async def episode_mentions(self, episode_id: str) -> list[Mention]:
        """:meth:`tkg.Memory.episode_mentions`, awaited."""
        return await self._call(self.memory.episode_mentions, episode_id)

    async def find_entities(self, name: str, *, group_ids: Groups = None) -> list[Entity]:
        """:meth:`tkg.Memory.find_entities`, awaited."""
        return await self._call(self.memory.find_entities, name, group_ids=group_ids)

    async def neighbourhood(
        self,
        entity_id: str,
        *,
        depth: int = 1,
        as_of: datetime | str | None = None,
        known_at: datetime | str | None = None,
        limit: int = 100,
    ) -> Neighbourhood:
        """:meth:`tkg.Memory.neighbourhood`, awaited."""
        return await self._call(
            self.memory.neighbourhood, entity_id, depth=depth, as_of=as_of, known_at=known_at, limit=limit
        )

    async def groups(self) -> list[str]:
        """:meth:`tkg.Memory.groups`, awaited."""
        return await self._call(self.memory.groups)

    # ------------------------------------------------------------------------------------------------------
    # snapshots
    async def save(self, path: str | Path) -> int:
        """:meth:`tkg.Memory.save`, awaited. Episodes still queued are saved as ``queued``."""
        return await self._call(self.memory.save, path)

    async def compact(self) -> None:
        """:meth:`tkg.Memory.compact`, awaited."""
        await self._call(self.memory.compact)

    async def export(self, path: str | Path, format: str = "jsonl", group_ids: Sequence[str] | None = None) -> int:
        """:meth:`tkg.Memory.export`, awaited."""
        return await self._call(self.memory.export, path, format, group_ids)

    async def import_jsonl(self, path: str | Path) -> dict[str, int]:
        """:meth:`tkg.Memory.import_jsonl`, awaited."""
        return await self._call(self.memory.import_jsonl, path)

    @classmethod
    async def load(
        cls,
        path: str | Path,
        *,
        embedder: Embedder,
        llm: LLMClient | None = None,
        clock: Clock | None = None,
        config: MemoryConfig | None = None,
        store: Store | None = None,
        check_embedder: bool = True,
        ontology: Ontology | None = None,
        threads: int = 8,
        max_queue: int = 1000,
        workers: int = 4,
    ) -> AsyncMemory:
        """:meth:`tkg.Memory.load`, awaited, wrapped in a new AsyncMemory. Episodes the snapshot holds as
        ``queued`` wait for :meth:`resume`."""
        memory = await asyncio.to_thread(
            Memory.load,
            path,
            embedder=embedder,
            llm=llm,
            clock=clock,
            config=config,
            store=store,
            check_embedder=check_embedder,
            ontology=ontology,
        )
        return cls(memory, threads=threads, max_queue=max_queue, workers=workers)

    # ------------------------------------------------------------------------------------------------------
    # background ingestion
    async def submit(
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
        """:meth:`tkg.BackgroundIngestor.submit`: store the episode as ``queued`` and return its id without
        waiting for its extraction."""
        background = self.background
        return await self._call(
            background.submit,
            content,
            metadata=metadata,
            group_id=group_id,
            source=source,
            reference_time=reference_time,
            source_description=source_description,
            name=name,
            episode_id=episode_id,
        )

    async def submit_retry(self, episode_id: str) -> None:
        """:meth:`tkg.BackgroundIngestor.retry`: queue a failed episode again."""
        await self._call(self.background.retry, episode_id)

    async def resume(self) -> list[str]:
        """:meth:`tkg.BackgroundIngestor.resume`: queue the episodes the memory holds as ``queued``."""
        return await self._call(self.background.resume)

    def status(self, episode_id: str) -> IngestionStatus:
        """:meth:`tkg.BackgroundIngestor.status` (a quick read; not awaited)."""
        return self.background.status(episode_id)

    async def wait(self, episode_id: str, timeout: float | None = None) -> IngestionStatus:
        """Await an episode's final status (``done`` or ``failed``) without blocking the event loop. Raises
        :class:`~tkg.errors.WaitTimeoutError` after ``timeout`` seconds (the work goes on)."""
        future = await self._call(self.background.future, episode_id)
        try:
            # Each wait has a future of its own: a timeout cancels only this one, never the ingestion.
            return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
        except TimeoutError:
            raise WaitTimeoutError(
                f"episode {episode_id} is not finished after {timeout} s; it is still {self.status(episode_id).state}"
            ) from None

    async def wait_all(self, timeout: float | None = None) -> None:
        """:meth:`tkg.BackgroundIngestor.wait_all`, awaited (on a thread of its own, so it never holds up the
        pool the other calls run on)."""
        await asyncio.to_thread(self.background.wait_all, timeout)

    # ------------------------------------------------------------------------------------------------------
    # shutting down
    async def aclose(self, drain: bool = True) -> None:
        """Close the background ingestor (``drain``: see :meth:`tkg.BackgroundIngestor.close`) and the thread
        pool, and return once both are done. The memory itself is left open. Idempotent: a later call (or one made
        meanwhile, from any thread or loop) waits for the first one's close; cancelling an ``aclose`` cancels the
        wait, not the close."""
        with self._guard:
            if self._closing is None:
                self._closed = True
                self._closing = concurrent.futures.Future()
                self._closing.set_running_or_notify_cancel()  # a waiter's cancellation cannot cancel it
                threading.Thread(
                    target=_close, args=(self._closing, self._background, self._executor, drain), name="tkg-async-close"
                ).start()
            closing = self._closing
        await asyncio.wrap_future(closing)

    async def close(self, drain: bool = True) -> None:
        """The same as :meth:`aclose`."""
        await self.aclose(drain)

    async def __aenter__(self) -> AsyncMemory:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose(drain=exc_type is None)


def _batch(items: Any) -> Any:
    """``items`` (the inputs of one call) as a list, read now, when it is a batch of inputs; else as it is, for the
    memory to refuse with its own error (:func:`tkg.inputs.not_a_batch`)."""
    return items if not_a_batch(items) else list(items)


def _close(
    done: concurrent.futures.Future[None],
    background: BackgroundIngestor | None,
    executor: ThreadPoolExecutor,
    drain: bool,
) -> None:
    """An :meth:`AsyncMemory.aclose`'s work, on a thread of its own: the ingestor (kept: its statuses stay
    readable), then the pool; ``done`` says when it is over."""
    try:
        if background is not None:
            background.close(drain)
        executor.shutdown(wait=True)
    except BaseException as exc:  # handed to every waiter
        done.set_exception(exc)
    else:
        done.set_result(None)
