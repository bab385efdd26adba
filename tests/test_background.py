"""Background ingestion: ids back at once, per-group order, a bounded queue, failures, shutdown and resume."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import run_script_to_the_end

from tkg import (
    BackendError,
    BackgroundIngestor,
    ConfigurationError,
    Episode,
    EpisodeError,
    EpisodeStatus,
    FixedClock,
    HashEmbedder,
    IngestorClosedError,
    Kind,
    LLMError,
    LLMPolicy,
    Memory,
    MemoryConfig,
    NotFoundError,
    QueueFullError,
    RulesLLM,
    TimestampError,
    ValidationError,
    WaitTimeoutError,
    WriteBatch,
)
from tkg.backends.memory import InMemoryStore
from tkg.config import CommunityConfig
from tkg.llm.base import Prompt, T
from tkg.llm.schema import GraphExtraction

CLOCK = "2024-05-01T00:00:00Z"
WAIT = 30.0  # generous: a wait that hits it means the test failed, never that it was slow


class GateLLM:
    """RulesLLM whose extraction calls wait at a gate the test opens. Records the order of extraction calls
    and the threads they ran on; ``entered`` is released once per extraction call that reached the gate."""

    def __init__(self, *, fail: Callable[[Prompt], LLMError | None] | None = None) -> None:
        self.inner = RulesLLM()
        self.gate = threading.Event()
        self.entered = threading.Semaphore(0)
        self.contents: list[str] = []
        self.threads: list[str] = []
        self.fail = fail
        self._lock = threading.Lock()

    def generate(self, prompt: Prompt, response_model: type[T]) -> T:
        with self._lock:
            self.threads.append(threading.current_thread().name)
        if self.fail is not None and (error := self.fail(prompt)) is not None:
            raise error
        if response_model is GraphExtraction and prompt.name == "extract_graph":
            with self._lock:
                self.contents.append(prompt.inputs["content"])
            self.entered.release()
            if not self.gate.wait(WAIT):
                raise RuntimeError("the test never opened the gate")
        return self.inner.generate(prompt, response_model)

    def wait_entered(self, n: int = 1) -> None:
        for _ in range(n):
            assert self.entered.acquire(timeout=WAIT), "no extraction call reached the gate"


def make_memory(llm: Any, store: InMemoryStore | None = None, **config: Any) -> Memory:
    return Memory(
        store,
        embedder=HashEmbedder(dim=64),
        llm=llm,
        clock=FixedClock(CLOCK),
        config=MemoryConfig(llm_policy=LLMPolicy(max_attempts=2, backoff_initial=0.0, jitter=0.0), **config),
    )


def records(memory: Memory) -> dict[str, list[Any]]:
    return {kind.value: list(memory.records(kind)) for kind in Kind}


def graph(memory: Memory) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """The graph as comparable values: facts by entity names and both timelines, and the episodes."""
    names = {e.id: e.name for e in memory.records(Kind.ENTITY)}
    facts = sorted(
        (f.group_id, names[f.source_id], f.relation, names[f.target_id], f.fact, f.valid_at, f.invalid_at, f.expired_at)
        for f in memory.records(Kind.FACT)
    )
    episodes = sorted((e.group_id, e.content, e.status.value) for e in memory.records(Kind.EPISODE))
    return facts, episodes


CITIES = ["Paris", "Berlin", "Rome", "Oslo"]


def moves(group: str) -> list[str]:
    """A group's episodes: one person moving from city to city, a year apart (each move ends the previous home;
    with the same reference time for all, the years are what orders them)."""
    return [f"Ann: I LIVES_IN {city} since {2020 + i}. I met {group.upper()}Bob." for i, city in enumerate(CITIES)]


def live_homes(memory: Memory, group: str) -> list[str]:
    names = {e.id: e.name for e in memory.records(Kind.ENTITY)}
    return [
        names[f.target_id]
        for f in memory.records(Kind.FACT, group)
        if f.relation == "LIVES_IN" and f.expired_at is None
    ]


def test_submit_returns_the_id_before_extraction_and_the_episode_is_durable(tmp_path: Path) -> None:
    llm = GateLLM()
    memory = make_memory(llm)
    with BackgroundIngestor(memory, workers=1) as ingestor:
        first = ingestor.submit("Ann: I LIVES_IN Paris.", group_id="g", reference_time="2024-04-01T00:00:00Z")
        second = ingestor.submit("Ann: I LIVES_IN Berlin.", group_id="g", reference_time="2024-04-02T00:00:00Z")
        llm.wait_entered()  # the first extraction is in flight and held at the gate
        assert ingestor.status(first).state == "running"
        assert ingestor.status(second).state == "queued"
        assert ingestor.pending == 2
        for episode_id in (first, second):
            stored = memory.get(Kind.EPISODE, episode_id)
            assert stored.status is EpisodeStatus.QUEUED and stored.embedding is not None
        assert len(memory.records(Kind.FACT)) == 0
        found = memory.search("Berlin", group_ids=["g"], targets=["episodes"])
        assert found.episodes[0].record.id == second  # searchable as an episode at once
        memory.save(tmp_path / "mid.tkg")
        loaded = Memory.load(tmp_path / "mid.tkg", embedder=HashEmbedder(dim=64))
        assert {e.id: e.status for e in loaded.queued_episodes("g")} == {
            first: EpisodeStatus.QUEUED,
            second: EpisodeStatus.QUEUED,
        }
        llm.gate.set()
        done = ingestor.wait(second, timeout=WAIT)
    assert done.state == "done" and done.error is None and done.result is not None
    assert [f.fact for f in done.result.facts if f.expired_at is None] == ["Ann lives in Berlin"]
    assert ingestor.status(first).state == "done"
    assert memory.get(Kind.EPISODE, first).status is EpisodeStatus.EXTRACTED
    assert live_homes(memory, "g") == ["Berlin"]
    assert ingestor.pending == 0 and memory.queued_episodes() == []
    assert all(name.startswith("tkg-ingest-") for name in llm.threads)  # never on the submitter's thread


def test_per_group_order_under_concurrency_gives_the_sequential_graph() -> None:
    groups = ["g0", "g1", "g2"]
    rules = RulesLLM()
    sequential = make_memory(rules)
    for i in range(len(CITIES)):
        for group in groups:
            sequential.add_episode(moves(group)[i], group_id=group)

    # g0's first extraction waits until g1's first has started: the test deadlocks (and fails) unless groups
    # really run in parallel. Every other call sleeps a little, differently, to shuffle the interleaving.
    g1_started = threading.Event()
    calls = iter(range(10_000))

    class Shuffling(GateLLM):
        def generate(self, prompt: Prompt, response_model: type[T]) -> T:
            if response_model is GraphExtraction:
                content = prompt.inputs["content"]
                with self._lock:
                    self.contents.append(content)
                    n = next(calls)
                if "G1Bob" in content:
                    g1_started.set()
                if content == moves("g0")[0]:
                    assert g1_started.wait(WAIT), "groups did not run in parallel"
                time.sleep((n * 7 % 5) / 1000)
            return self.inner.generate(prompt, response_model)

    llm = Shuffling()
    memory = make_memory(llm)
    with BackgroundIngestor(memory, workers=3) as ingestor:
        ids = [ingestor.submit(moves(group)[i], group_id=group) for i in range(len(CITIES)) for group in groups]
        ingestor.wait_all(timeout=WAIT)
    assert all(ingestor.status(i).state == "done" for i in ids)
    for group in groups:  # each group was extracted in submission order
        assert [c for c in llm.contents if f"{group.upper()}Bob" in c] == moves(group)
        assert live_homes(memory, group) == [CITIES[-1]]
    assert graph(memory) == graph(sequential)

    def context(calls: list[Prompt]) -> dict[str, list[str]]:
        return {c.inputs["content"]: c.inputs["previous"] for c in calls if c.name == "extract_graph"}

    # each extraction saw the context sequential ingestion gives: earlier episodes, never the queued later ones
    assert context(llm.inner.calls) == context(rules.calls)
    assert context(rules.calls)[moves("g2")[-1]] == moves("g2")[:-1]


def test_a_group_runs_one_episode_at_a_time_while_other_groups_proceed() -> None:
    llm = GateLLM()
    memory = make_memory(llm)
    with BackgroundIngestor(memory, workers=4) as ingestor:
        line = [ingestor.submit(text, group_id="g") for text in moves("g")[:3]]
        llm.wait_entered()
        other = ingestor.submit("Cy: I WORKS_AT Acme.", group_id="h")
        llm.wait_entered()  # an idle worker took group h, not g's next episode
        assert [ingestor.status(i).state for i in [*line, other]] == ["running", "queued", "queued", "running"]
        llm.gate.set()
        ingestor.wait_all(timeout=WAIT)
    assert llm.contents == [moves("g")[0], "Cy: I WORKS_AT Acme.", *moves("g")[1:3]]


def test_full_queue_refuses_and_stores_nothing() -> None:
    llm = GateLLM()
    memory = make_memory(llm)
    with BackgroundIngestor(memory, max_queue=2, workers=1) as ingestor:
        running = ingestor.submit("Ann: I LIVES_IN Paris since 2020.", group_id="g")
        llm.wait_entered()  # running work does not count against max_queue
        waiting = [
            ingestor.submit(f"Ann: I LIVES_IN {c} since {y}.", group_id="g")
            for c, y in (("Rome", 2021), ("Oslo", 2022))
        ]
        before = records(memory)
        with pytest.raises(QueueFullError, match="max_queue"):
            ingestor.submit("Ann: I LIVES_IN Lima.", group_id="g")
        with pytest.raises(QueueFullError):
            ingestor.submit("Bob: I LIVES_IN Lima.", group_id="other")  # the bound is global, not per group
        assert records(memory) == before and ingestor.pending == 3
        llm.gate.set()
        ingestor.wait_all(timeout=WAIT)
        later = ingestor.submit("Ann: I LIVES_IN Lima since 2023.", group_id="g")  # room again
        assert ingestor.wait(later, timeout=WAIT).state == "done"
    assert [ingestor.status(i).state for i in (running, *waiting)] == ["done"] * 3
    assert live_homes(memory, "g") == ["Lima"]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"content": "Ann: hi", "reference_time": datetime(2024, 1, 1)}, TimestampError),  # naive
        ({"content": "   "}, EpisodeError),
        ({"content": "Ann: hi", "source": "video"}, EpisodeError),
        ({"content": "Ann: hi", "group_id": "no spaces allowed"}, ValidationError),
        ({"content": "Ann: hi", "episode_id": "bad id!"}, ValidationError),
        ({"content": "Ann: hi", "episode_id": "taken"}, ValidationError),  # ids are unique
    ],
)
def test_bad_input_changes_nothing(args: dict[str, Any], error: type[Exception]) -> None:
    memory = make_memory(RulesLLM())
    with BackgroundIngestor(memory, workers=1) as ingestor:
        ingestor.wait(ingestor.submit("Ann: I LIVES_IN Paris.", group_id="g", episode_id="taken"), timeout=WAIT)
        before = records(memory)
        with pytest.raises(error):
            ingestor.submit(**{"group_id": "g", **args})
        assert records(memory) == before and ingestor.pending == 0


def test_failed_extraction_reports_reason_and_retryable_then_retry_requeues() -> None:
    down: dict[str, LLMError | None] = {"error": LLMError("HTTP 503: overloaded", retryable=True)}

    def fail(prompt: Prompt) -> LLMError | None:
        return down["error"] if prompt.name == "extract_graph" else None

    llm = GateLLM(fail=fail)
    llm.gate.set()
    memory = make_memory(llm)
    with BackgroundIngestor(memory, workers=2) as ingestor:
        flaky = ingestor.submit("Ann: I LIVES_IN Paris since 2020.", group_id="g")
        status = ingestor.wait(flaky, timeout=WAIT)
        assert status.state == "failed" and status.retryable and status.result is None
        assert "HTTP 503: overloaded" in (status.error or "") and "2 attempts" in (status.error or "")
        stored = memory.get(Kind.EPISODE, flaky)
        assert stored.status is EpisodeStatus.FAILED and "overloaded" in stored.error
        assert len(memory.records(Kind.FACT)) == 0

        down["error"] = LLMError("HTTP 401: bad key", retryable=False)
        refused = ingestor.submit("Bob: I LIVES_IN Rome.", group_id="h")
        status = ingestor.wait(refused, timeout=WAIT)
        assert status.state == "failed" and not status.retryable and "bad key" in (status.error or "")

        with pytest.raises(NotFoundError):
            ingestor.retry("no-such-episode")
        down["error"] = None
        ingestor.retry(flaky)
        assert memory.get(Kind.EPISODE, flaky).status is EpisodeStatus.QUEUED  # durable while it waits
        again = ingestor.wait(flaky, timeout=WAIT)
        assert again.state == "done" and again.result is not None
        with pytest.raises(ValidationError, match="only failed ones retry"):
            ingestor.retry(flaky)
    assert memory.get(Kind.EPISODE, flaky).status is EpisodeStatus.EXTRACTED
    assert live_homes(memory, "g") == ["Paris"]
    assert [e.id for e in memory.failed_episodes()] == [refused]


def test_a_worker_outlives_an_llm_client_that_raises_what_is_no_exception() -> None:
    """An LLM client that raises asyncio.CancelledError (a BaseException: an async SDK whose request was cancelled)
    ended its worker, with the episode "running" and its group busy for ever: nothing more of that group ran, and
    close() waited for ever. The episode fails (it stays queued in the memory) and the worker goes on."""
    import asyncio

    class Cancelled:
        def generate(self, prompt: Prompt, response_model: type[T]) -> T:
            raise asyncio.CancelledError

    memory = Memory(embedder=HashEmbedder(dim=32), llm=Cancelled())
    ingestor = BackgroundIngestor(memory, workers=1)
    first = ingestor.submit("Ann: I moved to Oslo.", group_id="g")
    second = ingestor.submit("Ann: I moved to Rome.", group_id="g")
    for episode_id in (first, second):
        status = ingestor.wait(episode_id, timeout=WAIT)
        assert status.state == "failed" and "CancelledError" in (status.error or "")
    assert [e.status for e in memory.queued_episodes()] == [EpisodeStatus.QUEUED] * 2  # kept for a retry
    closing = threading.Thread(target=ingestor.close)
    closing.start()
    closing.join(WAIT)
    assert not closing.is_alive()


def test_without_an_llm_episodes_are_stored_and_retry_is_refused() -> None:
    llm = GateLLM(fail=lambda prompt: LLMError("down"))
    memory = make_memory(llm)
    with BackgroundIngestor(memory) as ingestor:
        failed = ingestor.wait(ingestor.submit("Ann: hello Paris", group_id="g"), timeout=WAIT)
        assert failed.state == "failed"
        memory.llm = None
        stored = ingestor.wait(ingestor.submit("Ann: hello again", group_id="g"), timeout=WAIT)
        assert stored.state == "done"  # without an LLM the episode is stored and linked, as add_episode does
        assert memory.get(Kind.EPISODE, stored.episode_id).status is EpisodeStatus.STORED
        with pytest.raises(ConfigurationError, match="needs an LLM"):
            ingestor.retry(failed.episode_id)
        assert ingestor.pending == 0 and ingestor.status(failed.episode_id).state == "failed"
    assert memory.get(Kind.EPISODE, failed.episode_id).status is EpisodeStatus.FAILED


def test_close_without_drain_persists_the_queue_and_resume_finishes_it(tmp_path: Path) -> None:
    sequential = make_memory(RulesLLM())
    for text in moves("g"):
        sequential.add_episode(text, group_id="g")
    sequential.add_episode("Cy: I WORKS_AT Acme.", group_id="h")

    llm = GateLLM()
    memory = make_memory(llm)
    ingestor = BackgroundIngestor(memory, workers=1)
    ids = [ingestor.submit(text, group_id="g") for text in moves("g")]
    other = ingestor.submit("Cy: I WORKS_AT Acme.", group_id="h")
    llm.wait_entered()
    closer = threading.Thread(target=ingestor.close, kwargs={"drain": False})
    closer.start()
    deadline = time.monotonic() + WAIT
    while not ingestor.closed and time.monotonic() < deadline:
        time.sleep(0.001)
    assert ingestor.closed and closer.is_alive()  # it waits for the running episode
    with pytest.raises(IngestorClosedError):
        ingestor.submit("Ann: too late", group_id="g")
    llm.gate.set()
    closer.join(WAIT)
    assert not closer.is_alive()

    assert ingestor.status(ids[0]).state == "done"
    left = [*ids[1:], other]
    assert [ingestor.status(i).state for i in left] == ["queued"] * len(left)
    with pytest.raises(IngestorClosedError):
        ingestor.wait(ids[-1], timeout=WAIT)
    with pytest.raises(IngestorClosedError):
        ingestor.wait_all(timeout=WAIT)
    assert {e.id for e in memory.queued_episodes()} == set(left)
    memory.save(tmp_path / "killed.tkg")

    loaded = Memory.load(
        tmp_path / "killed.tkg", embedder=HashEmbedder(dim=64), llm=RulesLLM(), clock=FixedClock(CLOCK)
    )
    with BackgroundIngestor(loaded, workers=2, resume=True) as resumed:
        assert resumed.resume() == []  # already queued: nothing is queued twice
        resumed.wait_all(timeout=WAIT)
        assert [resumed.status(i).state for i in [*ids, other]] == ["done"] * (len(ids) + 1)
    assert loaded.queued_episodes() == []
    assert graph(loaded) == graph(sequential)


_EXIT_WITH_WORK_QUEUED = """
import sys, threading, time
from tkg import BackgroundIngestor, HashEmbedder, Memory, MemoryConfig, RulesLLM

running = threading.Event()

class SlowLLM(RulesLLM):  # each extraction takes half a second
    def generate(self, prompt, response_model):
        if prompt.name == "extract_graph":
            running.set()
            time.sleep(0.5)
        return super().generate(prompt, response_model)

memory = Memory.open(sys.argv[1], embedder=HashEmbedder(dim=64), llm=SlowLLM(), config=MemoryConfig(communities=None))
ingestor = BackgroundIngestor(memory, workers=1)
for i in range(20):
    ingestor.submit(f"Ann: I LIVES_IN City{i}.", group_id="g", episode_id=f"ep{i:02d}")
running.wait(30)
sys.stdout.write("written")
"""


def test_a_program_that_ends_without_closing_finishes_the_running_episode_and_keeps_the_queue(
    tmp_path: Path,
) -> None:
    """A script that submits and ends without close(): its process exits by itself (the workers are not daemon
    threads, which could abort the process at exit inside native code) once the running episode is done, as
    close(drain=False) would, not after the whole queue. The episode that was running is extracted, not cut off
    half-way; the rest stays queued in the saved memory, and resume() finishes it."""
    path = tmp_path / "m.tkg"
    run_script_to_the_end(_EXIT_WITH_WORK_QUEUED, str(path))
    memory = Memory.open(path, embedder=HashEmbedder(dim=64), llm=RulesLLM(), config=MemoryConfig(communities=None))
    statuses = {e.id: e.status for e in memory.records(Kind.EPISODE)}  # type: ignore[attr-defined]
    assert statuses["ep00"] is not EpisodeStatus.QUEUED  # a daemon worker was cut off inside it
    # the process did not drain the queue (20 episodes of half a second each) before it ended
    assert len(statuses) == 20 and list(statuses.values()).count(EpisodeStatus.QUEUED) >= 15
    with BackgroundIngestor(memory, workers=1, resume=True) as resumed:
        resumed.wait_all(timeout=WAIT)
    assert memory.queued_episodes() == []
    facts = memory.records(Kind.FACT)  # type: ignore[attr-defined]
    assert sorted(f.fact for f in facts) == sorted(f"Ann lives in City{i}" for i in range(20))
    memory.close()


def test_resume_orders_each_group_by_reference_time() -> None:
    memory = make_memory(RulesLLM())
    # queued directly, out of reference order; resume applies them in reference order
    late = memory.queue_episode("Ann: I LIVES_IN Rome.", group_id="g", reference_time="2024-03-01T00:00:00Z")
    early = memory.queue_episode("Ann: I LIVES_IN Paris.", group_id="g", reference_time="2024-01-01T00:00:00Z")
    with BackgroundIngestor(memory, workers=2) as ingestor:
        assert ingestor.resume() == [early.id, late.id]
    assert live_homes(memory, "g") == ["Rome"]


def test_waiting_on_a_queued_episode_this_ingestor_never_took_on_fails_at_once() -> None:
    """An episode queued in the memory before this ingestor started would never finish here: no silent hang."""
    memory = make_memory(RulesLLM())
    queued = memory.queue_episode("Ann: I LIVES_IN Rome.", group_id="g", reference_time="2024-03-01T00:00:00Z")
    with BackgroundIngestor(memory, workers=1) as ingestor:
        with pytest.raises(ValidationError, match="resume"):
            ingestor.wait(queued.id, timeout=WAIT)
        assert ingestor.status(queued.id).state == "queued"
        ingestor.resume()
        assert ingestor.wait(queued.id, timeout=WAIT).state == "done"


def test_resume_does_not_queue_again_what_finished_while_it_read_the_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    llm = GateLLM()
    memory = make_memory(llm)
    with BackgroundIngestor(memory, workers=1) as ingestor:
        episode_id = ingestor.submit("Ann: I LIVES_IN Paris since 2020.", group_id="g")
        llm.wait_entered()  # running: its record is still queued in the memory
        read = memory.queued_episodes

        def read_then_finish(group_ids: Any = None) -> list[Any]:
            found = read(group_ids)
            assert [e.id for e in found] == [episode_id]
            llm.gate.set()
            assert ingestor.wait(episode_id, timeout=WAIT).state == "done"  # finished before resume looks again
            return found

        monkeypatch.setattr(memory, "queued_episodes", read_then_finish)
        assert ingestor.resume() == []
        ingestor.wait_all(timeout=WAIT)
        status = ingestor.status(episode_id)
        assert status.state == "done" and status.result is not None, status
    episode = memory.get(Kind.EPISODE, episode_id)
    assert isinstance(episode, Episode) and episode.status is EpisodeStatus.EXTRACTED


def test_close_with_drain_finishes_everything_accepted() -> None:
    llm = GateLLM()
    memory = make_memory(llm)
    ingestor = BackgroundIngestor(memory, workers=2)
    ids = [ingestor.submit(text, group_id=group) for group in ("a", "b") for text in moves(group)]
    llm.wait_entered()
    threading.Timer(0.05, llm.gate.set).start()
    ingestor.close()  # drain=True
    assert [ingestor.status(i).state for i in ids] == ["done"] * len(ids)
    assert memory.queued_episodes() == [] and ingestor.pending == 0
    ingestor.close()  # idempotent
    with pytest.raises(IngestorClosedError):
        ingestor.resume()


def test_episode_removed_while_queued_fails_cleanly_and_stays_removed() -> None:
    memory: Memory

    def vanish(prompt: Prompt) -> LLMError | None:
        """Content starting "Gone" is deleted from the store while its extraction runs (another process
        removing it); "Gone, failing" then also fails its LLM call."""
        content = prompt.inputs.get("content", "")
        if prompt.name == "extract_graph" and content.startswith("Gone"):
            episode = next(e for e in memory.records(Kind.EPISODE) if e.content == content)
            store.write(WriteBatch(deletes=[(Kind.EPISODE, episode.id)]))
            return LLMError("down", retryable=True) if "failing" in content else None
        return None

    llm = GateLLM(fail=vanish)
    store = InMemoryStore(dim=64)
    memory = make_memory(llm, store)
    with BackgroundIngestor(memory, workers=1) as ingestor:
        ingestor.submit("Ann: I LIVES_IN Paris.", group_id="a")
        doomed = ingestor.submit("Bob: I LIVES_IN Rome.", group_id="b")
        llm.wait_entered()  # the one worker is busy with group a; doomed waits
        memory.remove_episode(doomed)
        llm.gate.set()
        before = ingestor.wait(doomed, timeout=WAIT)
        during = ingestor.wait(ingestor.submit("Gone: I LIVES_IN Oslo.", group_id="b"), timeout=WAIT)
        failing = ingestor.wait(ingestor.submit("Gone, failing: I LIVES_IN Lima.", group_id="b"), timeout=WAIT)
    assert before.state == "failed" and not before.retryable and "no episode" in (before.error or "")
    assert during.state == "failed" and not during.retryable and "was removed" in (during.error or "")
    assert failing.state == "failed"
    for status in (before, during, failing):
        with pytest.raises(NotFoundError):
            memory.get(Kind.EPISODE, status.episode_id)  # none came back
    assert live_homes(memory, "a") == ["Paris"] and len(memory.records(Kind.FACT, "b")) == 0


def test_community_refresh_runs_on_the_worker_and_a_failure_only_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    llm = GateLLM()
    llm.gate.set()
    communities = CommunityConfig(refresh_after_changes=1, summarize_on_extend=False, policy_fraction=0.0)
    memory = make_memory(llm, communities=communities)
    tier = memory._communities
    assert tier is not None
    refreshes: list[str] = []
    original = tier.maybe_refresh
    failure: list[Exception] = []

    def refresh(store: Any, group_id: str) -> Any:
        refreshes.append(threading.current_thread().name)
        if failure:
            raise failure[0]
        return original(store, group_id)

    monkeypatch.setattr(tier, "maybe_refresh", refresh)
    with BackgroundIngestor(memory, workers=1) as ingestor:
        ok = ingestor.wait(ingestor.submit("Ann: I met Bob and Cy in Paris.", group_id="g"), timeout=WAIT)
        assert ok.state == "done" and ok.result is not None and ok.result.warnings == []
        assert len(memory.records(Kind.COMMUNITY)) >= 1
        outcomes = []
        for error in (LLMError("summaries are down"), BackendError("the store went away mid-refresh")):
            failure[:] = [error]
            outcomes.append(ingestor.wait(ingestor.submit(f"Ann: I met Dee about {error}.", group_id="g"), WAIT))
    assert refreshes == ["tkg-ingest-0"] * 3  # after each episode, on the worker, never on the submitter
    for status, words in zip(outcomes, ("summaries are down", "went away mid-refresh"), strict=True):
        assert status.state == "done" and status.result is not None
        assert [w for w in status.result.warnings if "community refresh of group g failed" in w and words in w]
        assert memory.get(Kind.EPISODE, status.episode_id).status is EpisodeStatus.EXTRACTED
    assert outcomes[0].result is not None and outcomes[0].result.usage.failures == 1


def test_status_wait_and_configuration_errors() -> None:
    llm = GateLLM()
    memory = make_memory(llm)
    for bad in ({"max_queue": 0}, {"workers": 0}, {"keep_finished": -1}, {"workers": True}):
        with pytest.raises(ConfigurationError):
            BackgroundIngestor(memory, **bad)
    with BackgroundIngestor(memory, workers=1, keep_finished=1) as ingestor:
        with pytest.raises(NotFoundError):
            ingestor.status("nope")
        first = ingestor.submit("Ann: I LIVES_IN Paris since 2020.", group_id="g")
        with pytest.raises(ValidationError, match="already queued"):
            ingestor.retry(first)
        with pytest.raises(WaitTimeoutError):
            ingestor.wait(first, timeout=0.01)
        with pytest.raises(WaitTimeoutError):
            ingestor.wait_all(timeout=0.01)
        llm.gate.set()
        assert ingestor.wait(first, timeout=WAIT).result is not None
        second = ingestor.wait(ingestor.submit("Ann: I LIVES_IN Rome.", group_id="g"), timeout=WAIT)
        assert second.result is not None
    forgotten = ingestor.status(first)  # beyond keep_finished: answered from the memory, without its result
    assert forgotten.state == "done" and forgotten.result is None
    stranger = memory.queue_episode("Bob: hi", group_id="g")  # queued, never handed to this ingestor
    assert ingestor.status(stranger.id).state == "queued"
