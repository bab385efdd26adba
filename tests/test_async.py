"""AsyncMemory: the Memory API awaited off the event loop, and the background door from asyncio."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from test_background import CLOCK, WAIT, GateLLM, live_homes, make_memory, moves

from tkg import (
    AsyncMemory,
    BackgroundIngestor,
    ConfigurationError,
    EpisodeError,
    EpisodeInput,
    EpisodeStatus,
    FactInput,
    FixedClock,
    HashEmbedder,
    IngestorClosedError,
    Kind,
    LLMError,
    Memory,
    NotFoundError,
    RulesLLM,
    TimestampError,
    ValidationError,
    WaitTimeoutError,
)


class Ticker:
    """A coroutine that counts event-loop turns: if a call blocked the loop, the count would stand still."""

    def __init__(self) -> None:
        self.ticks = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            self.ticks += 1
            await asyncio.sleep(0.001)

    def __enter__(self) -> Ticker:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def entered(llm: GateLLM) -> None:
    """Await (without blocking the loop) an extraction call reaching the gate."""
    assert await asyncio.to_thread(llm.entered.acquire, True, WAIT), "no extraction call reached the gate"


async def turns_while_blocked(ticker: Ticker, llm: GateLLM, task: asyncio.Future[Any]) -> None:
    """While an extraction is held at the gate, other coroutines keep running; then the gate opens."""
    loop = asyncio.get_running_loop()
    start, deadline = ticker.ticks, loop.time() + WAIT
    while ticker.ticks - start < 20 and loop.time() < deadline:
        await asyncio.sleep(0.001)
    assert ticker.ticks - start >= 20 and not task.done()
    llm.gate.set()


def test_the_event_loop_keeps_running_while_an_extraction_is_in_flight() -> None:
    llm = GateLLM()

    async def main() -> None:
        async with AsyncMemory(make_memory(llm)) as amem:
            with Ticker() as ticker:
                adding = asyncio.create_task(amem.add_episode("Ann: I LIVES_IN Paris.", group_id="g"))
                await entered(llm)
                await turns_while_blocked(ticker, llm, adding)
                result = await adding
                assert [f.fact for f in result.facts] == ["Ann lives in Paris"]

                llm.gate.clear()
                episode_id = await amem.submit("Ann: I LIVES_IN Rome.", group_id="g")  # back before extraction
                await entered(llm)
                assert amem.status(episode_id).state == "running"
                assert (await amem.get(Kind.EPISODE, episode_id)).status is EpisodeStatus.QUEUED
                waiting = asyncio.create_task(amem.wait(episode_id))
                await turns_while_blocked(ticker, llm, waiting)
                status = await asyncio.wait_for(waiting, WAIT)
                assert status.state == "done" and status.result is not None
            assert live_homes(amem.memory, "g") == ["Rome"]

    asyncio.run(main())


def test_the_async_api_mirrors_memory(tmp_path: Path) -> None:
    async def main() -> None:
        memory = make_memory(RulesLLM())
        async with AsyncMemory(memory, threads=2) as amem:
            first = await amem.add_episode("Ann: I LIVES_IN Paris.", group_id="g")
            batch = await amem.add_episodes(
                [{"content": "Ann: I LIVES_IN Rome.", "group_id": "g"}, {"content": "Bo: hi Ann", "group_id": "h"}]
            )
            assert [r.status for r in batch] == [EpisodeStatus.EXTRACTED] * 2
            structured = await amem.add_facts(
                (FactInput("Ann", "WORKS_AT", "Acme") for _ in range(1)), group_id="g"
            )  # a generator is fine: it is read before the call leaves the loop
            assert [f.relation for f in structured.facts] == ["WORKS_AT"]

            found = await amem.search("where does Ann live?", group_ids=["g"], limit=3)
            assert found.facts and found.facts[0].record.fact == "Ann lives in Rome"
            assert "Ann lives in Rome" in await amem.context("Ann", group_ids=["g"])
            assert (await amem.retrieve("Ann", group_ids=["g"], max_chars=2000)).facts
            ann = next(e for e in first.entities if e.name == "Ann")
            assert {f.fact for f in await amem.facts_about(ann.id)} >= {"Ann lives in Paris", "Ann lives in Rome"}
            assert (await amem.stats()) == memory.stats()
            removal = await amem.remove_episode(batch[1].episode.id)
            assert removal.episode_id == batch[1].episode.id
            with pytest.raises(NotFoundError):
                await amem.get(Kind.EPISODE, batch[1].episode.id)
            with pytest.raises(EpisodeError):
                await amem.add_episode("   ", group_id="g")
            assert await amem.failed_episodes() == []
            size = await amem.save(tmp_path / "m.tkg")
            assert size > 0 and amem.usage.calls >= 3
        loaded = await AsyncMemory.load(
            tmp_path / "m.tkg", embedder=HashEmbedder(dim=64), llm=RulesLLM(), clock=FixedClock(CLOCK)
        )
        async with loaded:
            assert await loaded.stats() == memory.stats()

    asyncio.run(main())


def test_failed_extraction_awaits_as_failed_and_retries() -> None:
    down = {"on": True}
    llm = GateLLM(fail=lambda p: LLMError("HTTP 503", retryable=True) if down["on"] else None)
    llm.gate.set()

    async def main() -> None:
        async with AsyncMemory(make_memory(llm)) as amem:
            with pytest.raises(LLMError):
                await amem.add_episode("Ann: I LIVES_IN Paris.", group_id="g")
            [failed] = await amem.failed_episodes()
            queued = await amem.submit("Ann: I LIVES_IN Rome.", group_id="g")
            status = await amem.wait(queued, timeout=WAIT)
            assert status.state == "failed" and status.retryable and "HTTP 503" in (status.error or "")
            down["on"] = False
            assert (await amem.retry(failed.id)).status is EpisodeStatus.EXTRACTED
            await amem.submit_retry(queued)
            assert (await amem.wait(queued, timeout=WAIT)).state == "done"
            assert live_homes(amem.memory, "g") == ["Rome"]

    asyncio.run(main())


def test_wait_timeout_leaves_the_work_going() -> None:
    llm = GateLLM()

    async def main() -> None:
        async with AsyncMemory(make_memory(llm)) as amem:
            episode_id = await amem.submit("Ann: I LIVES_IN Paris.", group_id="g")
            await entered(llm)
            with pytest.raises(WaitTimeoutError):
                await amem.wait(episode_id, timeout=0.01)
            with pytest.raises(WaitTimeoutError):
                await amem.wait_all(timeout=0.01)
            llm.gate.set()
            assert (await amem.wait(episode_id, timeout=WAIT)).state == "done"  # the timed-out wait cancelled nothing
            await amem.wait_all(timeout=WAIT)

    asyncio.run(main())


def test_bad_input_through_submit_changes_nothing() -> None:
    async def main() -> None:
        memory = make_memory(RulesLLM())
        async with AsyncMemory(memory) as amem:
            before = memory.stats()
            with pytest.raises(TimestampError):
                await amem.submit("Ann: hi", group_id="g", reference_time="2024-01-01T00:00:00")  # naive
            with pytest.raises(EpisodeError):
                await amem.submit("", group_id="g")
            with pytest.raises(EpisodeError):
                await amem.submit("Ann: hi", group_id="g", source="video")
            assert memory.stats() == before and amem.background.pending == 0
            with pytest.raises(NotFoundError):
                amem.status("nope")

    asyncio.run(main())


def test_aclose_without_drain_then_load_and_resume(tmp_path: Path) -> None:
    llm = GateLLM()

    async def main() -> list[str]:
        amem = AsyncMemory(make_memory(llm), workers=1)
        ids = [await amem.submit(text, group_id="g") for text in moves("g")]
        await entered(llm)
        closing = asyncio.create_task(amem.aclose(drain=False))
        while not amem.background.closed:
            await asyncio.sleep(0.001)
        assert not closing.done()  # it waits for the running extraction
        llm.gate.set()
        await asyncio.wait_for(closing, WAIT)
        assert [amem.status(i).state for i in ids] == ["done", "queued", "queued", "queued"]
        with pytest.raises(IngestorClosedError):
            await amem.submit("Ann: late", group_id="g")
        with pytest.raises(IngestorClosedError):
            await amem.stats()
        amem.memory.save(tmp_path / "killed.tkg")

        loaded = await AsyncMemory.load(
            tmp_path / "killed.tkg", embedder=HashEmbedder(dim=64), llm=RulesLLM(), clock=FixedClock(CLOCK)
        )
        async with loaded:
            assert await loaded.resume() == ids[1:]
            await loaded.wait_all(timeout=WAIT)
            assert [loaded.status(i).state for i in ids] == ["done"] * len(ids)
        assert loaded.memory.queued_episodes() == []
        assert live_homes(loaded.memory, "g") == ["Oslo"]
        return ids

    asyncio.run(main())


def test_async_with_an_error_inside_does_not_drain() -> None:
    llm = GateLLM()
    memory = make_memory(llm)
    ids: list[str] = []

    async def main() -> None:
        async with AsyncMemory(memory, workers=1) as amem:
            ids.extend([await amem.submit(text, group_id="g") for text in moves("g")[:2]])
            await entered(llm)
            threading.Timer(0.05, llm.gate.set).start()
            raise RuntimeError("the agent crashed")

    with pytest.raises(RuntimeError, match="agent crashed"):
        asyncio.run(main())
    assert [memory.get(Kind.EPISODE, i).status for i in ids] == [EpisodeStatus.EXTRACTED, EpisodeStatus.QUEUED]


def test_configuration_errors() -> None:
    memory = make_memory(RulesLLM())
    bad: list[dict[str, Any]] = [{"threads": 0}, {"threads": True}]
    for args in bad:
        with pytest.raises(ConfigurationError):
            AsyncMemory(memory, **args)
    with pytest.raises(ConfigurationError):
        AsyncMemory("not a memory")  # type: ignore[arg-type]


def test_metadata_goes_through_every_door_of_an_episode() -> None:
    """Memory.add_episode and queue_episode took metadata; AsyncMemory.add_episode, AsyncMemory.submit and
    BackgroundIngestor.submit raised TypeError."""
    memory = Memory(embedder=HashEmbedder(dim=32))

    async def main() -> list[str]:
        async with AsyncMemory(memory) as doors:
            added = await doors.add_episode("Ann: hi.", group_id="g", extract=False, metadata={"door": "async"})
            queued = await doors.submit("Ann: bye.", group_id="g", metadata={"door": "submit"})
            await doors.wait(queued, timeout=30)
            return [added.episode.id, queued]

    ids = asyncio.run(main())
    with BackgroundIngestor(memory, workers=1) as ingestor:
        ids.append(ingestor.submit("Ann: again.", group_id="g", metadata={"door": "ingestor"}))
        ingestor.wait(ids[-1], timeout=30)
    doors = [memory.get(Kind.EPISODE, i).attributes["metadata"]["door"] for i in ids]  # type: ignore[attr-defined]
    assert doors == ["async", "submit", "ingestor"]


def test_a_batch_is_refused_as_the_memory_refuses_it() -> None:
    """A string, a mapping or one input is not a batch: the awaited calls refuse them with the memory's own error
    (the string is not split into one episode per character), and nothing is stored."""
    memory = make_memory(RulesLLM())

    async def main() -> None:
        async with AsyncMemory(memory) as amem:
            for episodes in ("hello", {"content": "Ann: I LIVES_IN Rome.", "group_id": "g"}, EpisodeInput("hi"), 5):
                with pytest.raises(ValidationError, match="add_episodes takes an iterable"):
                    await amem.add_episodes(episodes)  # type: ignore[arg-type]
            for facts in (None, 5, FactInput("Ann", "LIKES", "Tea"), "Ann likes tea", {"source": "Ann"}):
                with pytest.raises(ValidationError, match="add_facts takes an iterable"):
                    await amem.add_facts(facts, group_id="g")  # type: ignore[arg-type]

    asyncio.run(main())
    assert memory.records(Kind.EPISODE) == []


def test_every_aclose_returns_once_the_close_is_done() -> None:
    """aclose is idempotent, and every call returns only once the ingestor has drained and the pool is shut down:
    one made while another closes, and one made after a close whose wait was cancelled (a timeout)."""
    llm = GateLLM()

    async def main() -> None:
        amem = AsyncMemory(make_memory(llm), workers=1)
        ids = [await amem.submit(text, group_id="g") for text in moves("g")]
        await entered(llm)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(amem.aclose(), 0.01)  # the wait is cancelled, not the close
        seen: list[list[str]] = []

        async def close() -> None:
            await amem.aclose()
            seen.append([amem.status(i).state for i in ids])

        both = asyncio.gather(close(), close())
        await asyncio.sleep(0.02)
        assert not both.done()  # the extraction still waits at the gate: neither returns
        llm.gate.set()
        await asyncio.wait_for(both, WAIT)
        assert seen == [["done"] * len(ids)] * 2
        with pytest.raises(IngestorClosedError):
            await amem.stats()

    asyncio.run(main())


def test_threads_and_loops_sharing_an_async_memory_share_one_ingestor() -> None:
    """Several threads, each with an event loop of its own, submitting at once through one AsyncMemory: one
    background ingestor takes every episode (each awaited to done through it), and the close ends it."""
    memory = make_memory(RulesLLM())
    amem = AsyncMemory(memory)
    start = threading.Barrier(6)
    ingestors: list[BackgroundIngestor] = []
    states: list[str] = []

    def run(i: int) -> None:
        async def one() -> None:
            start.wait(WAIT)
            episode_id = await amem.submit(f"Ann: I LIKES tea number {i}.", group_id="g")
            ingestors.append(amem.background)
            states.append((await amem.wait(episode_id, timeout=WAIT)).state)

        asyncio.run(one())

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert states == ["done"] * 6 and len({id(b) for b in ingestors}) == 1
    asyncio.run(amem.aclose())
    assert ingestors[0].closed


def test_the_async_memory_has_every_call_of_memory(tmp_path: Path) -> None:
    """Every public call of Memory has its awaited form (a property reads through ``amem.memory``), and the awaited
    reads and writes give what the memory's own give."""
    kept_sync = {"clock", "config", "embedder", "llm", "ontology", "with_config", "open"}
    missing = {n for n in dir(Memory) if not n.startswith("_")} - {n for n in dir(AsyncMemory)} - kept_sync
    assert missing == set()
    memory = make_memory(RulesLLM())

    async def main() -> None:
        async with AsyncMemory(memory) as amem:
            first = await amem.add_episode("Ann: I LIVES_IN Paris. I met Bob.", group_id="g")
            ann = next(e for e in first.entities if e.name == "Ann")
            fact = first.facts[0]
            assert await amem.get_all(["g"]) == memory.get_all(["g"])
            assert await amem.get_many(Kind.FACT, [fact.id, "nope"]) == [fact, None]
            assert await amem.records(Kind.ENTITY, "g") == memory.records(Kind.ENTITY, "g")
            assert await amem.episodes("g", last=1) == [first.episode]
            assert await amem.episode_mentions(first.episode.id) == memory.episode_mentions(first.episode.id)
            assert await amem.find_entities("Ann", group_ids="g") == [ann]
            assert (await amem.neighbourhood(ann.id)).facts == memory.neighbourhood(ann.id).facts
            assert await amem.groups() == ["g"]
            queued = await amem.queue_episode("Ann: I LIVES_IN Rome.", group_id="g")
            assert await amem.queued_episodes("g") == [queued]
            assert (await amem.process_queued(queued.id)).status is EpisodeStatus.EXTRACTED
            ended = await amem.invalidate_fact(fact.id, "2030-01-01T00:00:00Z")
            assert ended == memory.get(Kind.FACT, fact.id) and ended.invalid_at is not None
            await amem.refresh_communities("g")
            assert await amem.community_drift("g") == memory.community_drift("g")
            assert await amem.export(tmp_path / "g.jsonl") > 0
            assert (await amem.delete_group("g"))["episode"] == 2
            assert (await amem.import_jsonl(tmp_path / "g.jsonl"))["episode"] == 2
            assert len(await amem.episodes("g")) == 2
            with pytest.raises(NotFoundError):
                await amem.requeue("no-such-episode")

    asyncio.run(main())
