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
import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from tkg.background import BackgroundIngestor, IngestionStatus
from tkg.clock import Clock
from tkg.config import MemoryConfig
from tkg.context import Context
from tkg.embedders.base import Embedder
from tkg.errors import ConfigurationError, IngestorClosedError, WaitTimeoutError
from tkg.ingest import EpisodeResult, RemovalResult
from tkg.llm.base import LLMClient, LLMUsage
from tkg.memory import EpisodeInput, FactInput, Memory
from tkg.models import Episode, EpisodeSource, Fact, Kind, Record
from tkg.ontology import Ontology
from tkg.search import SearchResults
from tkg.storage import Store

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

    @property
    def background(self) -> BackgroundIngestor:
        """The background ingestor behind :meth:`submit` (made on first use)."""
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
        return await self._call(self.memory.add_episodes, list(episodes), extract=extract)

    async def add_facts(
        self,
        facts: Iterable[FactInput | Mapping[str, Any]],
        *,
        group_id: str | None = None,
        reference_time: datetime | str | None = None,
        source_description: str = "structured facts",
    ) -> EpisodeResult:
        """:meth:`tkg.Memory.add_facts`, awaited."""
        items = facts if isinstance(facts, (str, bytes, Mapping)) else list(facts)  # Memory rejects a single value
        return await self._call(
            self.memory.add_facts,
            items,
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

    # ------------------------------------------------------------------------------------------------------
    # snapshots
    async def save(self, path: str | Path) -> int:
        """:meth:`tkg.Memory.save`, awaited. Episodes still queued are saved as ``queued``."""
        return await self._call(self.memory.save, path)

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
        pool. The memory itself is left open. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._background is not None:  # kept: its statuses stay readable
            await asyncio.to_thread(self._background.close, drain)
        await asyncio.to_thread(self._executor.shutdown, True)

    async def close(self, drain: bool = True) -> None:
        """The same as :meth:`aclose`."""
        await self.aclose(drain)

    async def __aenter__(self) -> AsyncMemory:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose(drain=exc_type is None)
