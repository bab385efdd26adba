"""Threads hammering one memory (issue 15): writers, removals, searches and the doors' reads at once, then the
invariants over every record, and a snapshot of the end state that loads back equal."""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tkg import EpisodeStatus, FactInput, FixedClock, HashEmbedder, Kind, Memory, MemoryConfig
from tkg.backends.memory import InMemoryStore
from tkg.errors import NotFoundError, ValidationError
from tkg.llm import LLMPolicy, ScriptedLLM
from tkg.llm.prompts import RESOLVE
from tkg.llm.rules import RulesLLM
from tkg.models import Entity, Episode, Fact, Membership, Mention
from tkg.ontology import Ontology, RelationType
from tkg.storage import Store

EMB = HashEmbedder(dim=32)
PEOPLE = ["Ann", "Bob", "Cy", "Dee"]
CITIES = ["Paris", "Rome", "Oslo", "Lima", "Kyiv"]
SECONDS = 3.0


def new_memory(store: Store | None = None) -> Memory:
    return Memory(
        store,
        embedder=EMB,
        llm=RulesLLM(),
        clock=FixedClock("2024-01-01T00:00:00Z", tick=__import__("datetime").timedelta(seconds=1)),
        config=MemoryConfig(llm_policy=LLMPolicy(backoff_initial=0.0)),
        ontology=Ontology(relations={"LIVES_IN": RelationType(single_valued=True)}),
    )


def check_invariants(memory: Memory) -> None:
    entities = {e.id for e in memory.records(Kind.ENTITY) if isinstance(e, Entity)}
    episodes = {e.id for e in memory.records(Kind.EPISODE) if isinstance(e, Episode)}
    facts = [f for f in memory.records(Kind.FACT) if isinstance(f, Fact)]
    ids = {f.id for f in facts}
    for f in facts:
        assert {f.source_id, f.target_id} <= entities and set(f.episodes) <= episodes and f.episodes
        assert (f.expired_at is None) == (f.invalidated_by is None)
        assert f.invalidated_by is None or f.invalidated_by in ids
    for m in memory.records(Kind.MENTION):
        assert isinstance(m, Mention) and m.episode_id in episodes and m.entity_id in entities
    communities = {c.id for c in memory.records(Kind.COMMUNITY)}
    for m in memory.records(Kind.MEMBERSHIP):
        assert isinstance(m, Membership) and m.community_id in communities and m.entity_id in entities
    homes: dict[str, list[Fact]] = {}
    for f in facts:
        if f.relation == "LIVES_IN":
            homes.setdefault(f.source_id, []).append(f)
    for held in homes.values():  # one home at a time, over every fact
        for i, a in enumerate(held):
            for b in held[i + 1 :]:
                if a.target_id != b.target_id and a.valid_at and b.valid_at:
                    end_a, end_b = a.invalid_at, b.invalid_at
                    assert not ((end_b is None or a.valid_at < end_b) and (end_a is None or b.valid_at < end_a))


def test_threads_hammering_one_memory_keep_every_invariant(make_store: Callable[[int], Store], tmp_path: Path) -> None:
    memory = new_memory(make_store(EMB.dim))
    memory.add_episode("Ann: I LIVES_IN Paris since 2010.", group_id="g")
    stop = time.monotonic() + SECONDS
    errors: list[BaseException] = []
    counts: dict[str, int] = {}
    lock = threading.Lock()

    def loop(name: str, step: Callable[[random.Random], Any]) -> None:
        rng = random.Random(name)
        done = 0
        try:
            while done == 0 or time.monotonic() < stop:  # each at least once, however busy the machine
                # a record another thread removed meanwhile: the answer a caller gets
                with contextlib.suppress(NotFoundError, ValidationError):
                    step(rng)
                done += 1
        except BaseException as exc:
            errors.append(exc)
        with lock:
            counts[name] = done

    def episode(rng: random.Random) -> None:
        who, city = rng.choice(PEOPLE), rng.choice(CITIES)
        memory.add_episode(f"{who}: I LIVES_IN {city} since {rng.randint(2000, 2024)}.", group_id="g")

    def facts(rng: random.Random) -> None:
        memory.add_facts([FactInput(rng.choice(PEOPLE), "LIKES", rng.choice(CITIES))], group_id="g")

    def remove(rng: random.Random) -> None:
        found = memory.episodes("g")
        if len(found) > 3:
            memory.remove_episode(rng.choice(found).id)

    def search(rng: random.Random) -> None:
        memory.search(f"{rng.choice(PEOPLE)} lives in", group_ids="g", include_invalidated=rng.random() < 0.5)
        memory.context(rng.choice(CITIES), group_ids="g", max_chars=500)

    def doors(rng: random.Random) -> None:
        memory.groups()
        memory.stats("g")
        memory.get_all("g", limit=5)
        for entity in memory.find_entities(rng.choice(PEOPLE), group_ids="g"):
            memory.facts_about(entity.id)
            memory.neighbourhood(entity.id, depth=2)
        ids = [e.id for e in memory.episodes("g")[-3:]]
        memory.get_many(Kind.EPISODE, ids)
        memory.records(Kind.FACT, "g")

    def save(rng: random.Random) -> None:
        memory.save(tmp_path / f"s{rng.randint(0, 1)}.tkg")

    workers = {
        "episode": episode,
        "facts": facts,
        "remove": remove,
        "search": search,
        "doors-1": doors,
        "doors-2": doors,
        "save": save,
    }
    threads = [threading.Thread(target=loop, args=(name, step)) for name, step in workers.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=SECONDS + 120)
    assert not errors, errors
    assert all(counts.get(name, 0) > 0 for name in workers), counts
    check_invariants(memory)
    path = tmp_path / "end.tkg"
    memory.save(path)
    loaded = Memory.load(path, embedder=EMB)
    for kind in Kind:
        assert sorted(r.id for r in loaded.records(kind)) == sorted(r.id for r in memory.records(kind))


@pytest.mark.parametrize("writers", [2])
def test_a_durable_memory_under_concurrent_writes_reopens_whole(tmp_path: Path, writers: int) -> None:
    path = tmp_path / "m.tkg"
    memory = Memory.open(path, embedder=EMB, config=MemoryConfig(communities=None))
    done: list[str] = []
    lock = threading.Lock()

    def write(n: int) -> None:
        for i in range(40):
            memory.add_facts([FactInput(f"W{n}P{i}", "LIKES", "Tea")], group_id="g")
            with lock:
                done.append(f"W{n}P{i} likes Tea")
            if i % 13 == 0:
                memory.compact()

    threads = [threading.Thread(target=write, args=(n,)) for n in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    memory.close()
    reopened = Memory.open(path, embedder=EMB, config=MemoryConfig(communities=None))
    assert {f.fact for f in reopened.records(Kind.FACT) if isinstance(f, Fact)} == set(done)


@pytest.mark.parametrize("other", ["add in another group", "queue"])
def test_an_episode_id_stored_by_another_writer_while_this_one_was_planned_is_refused(other: str) -> None:
    """Two adds of one episode id in two groups, the second stored while the first waited for its resolution
    call: the first is refused when it comes to write (as it is when the two run one after the other), and the
    stored episode, its facts and the other group stay as the second add left them."""
    rules = RulesLLM()
    nested: list[str] = []

    def answer(prompt: Any, model: Any) -> Any:
        if prompt.name == RESOLVE and not nested:  # the first add waits for its LLM: another writer stores ep-1
            nested.append(other)
            if other == "queue":  # what BackgroundIngestor.submit does
                memory.queue_episode("Bob: I live in Rome.", group_id="g2", episode_id="ep-1")
            else:
                memory.add_episode("Bob: I live in Rome.", group_id="g2", episode_id="ep-1")
        return rules.generate(prompt, model)

    memory = Memory(embedder=EMB, llm=ScriptedLLM(handler=answer), clock=FixedClock("2024-01-01T00:00:00Z"))
    memory.add_episode("Ann: I live in Oslo.", group_id="g1", episode_id="ep-0")
    with pytest.raises(ValidationError, match="already exists"):
        memory.add_episode("Ann: I live in Paris.", group_id="g1", episode_id="ep-1")
    assert nested  # the window was open
    episode = memory.get(Kind.EPISODE, "ep-1")
    assert isinstance(episode, Episode)
    assert (episode.group_id, episode.content) == ("g2", "Bob: I live in Rome.")
    assert episode.status is (EpisodeStatus.QUEUED if other == "queue" else EpisodeStatus.EXTRACTED)
    facts = sorted((f.group_id, f.episodes, f.expired_at) for f in memory.records(Kind.FACT) if isinstance(f, Fact))
    made = [("g2", ("ep-1",), None)] if other != "queue" else []
    assert facts == [("g1", ("ep-0",), None), *made]  # Oslo is not ended by the refused episode
    check_invariants(memory)


def test_an_import_waits_for_an_episode_of_its_group_being_planned(tmp_path: Path) -> None:
    """import_jsonl of a group while an episode of that (empty) group is planned: the import waits for the group,
    then finds it taken and is refused (it landed between the plan and its write, and the group held two Anns)."""
    source = Memory(embedder=EMB, clock=FixedClock("2024-01-01T00:00:00Z"))
    source.add_facts([FactInput("Ann", "LIVES_IN", "Rome")], group_id="g")
    export = tmp_path / "g.jsonl"
    source.export(export)
    outcome: list[BaseException | None] = []

    def run_import() -> None:
        try:
            memory.import_jsonl(export)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    class Slow(InMemoryStore):
        importer: threading.Thread | None = None

        def entities_by_name(self, group_id: str, names: Any) -> Any:
            if self.importer is None:  # the episode is being planned: an import of its group starts now
                self.importer = threading.Thread(target=run_import)
                self.importer.start()
                self.importer.join(0.5)
            return super().entities_by_name(group_id, names)

    store = Slow(dim=EMB.dim)
    memory = Memory(store, embedder=EMB, llm=RulesLLM(), clock=FixedClock("2024-01-01T00:00:00Z"))
    memory.add_episode("Ann: I live in Paris.", group_id="g")
    assert store.importer is not None
    store.importer.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], ValidationError)
    assert [e.name for e in memory.find_entities("Ann", group_ids=["g"])] == ["Ann"]
    check_invariants(memory)


def test_a_second_retry_of_an_episode_is_refused_before_its_llm_call_and_a_late_failure_says_what_stays() -> None:
    """Two retry() calls of one failed episode: the second paid for an LLM call that could only be thrown away, and
    when that call failed it said the episode was stored as failed, while it stayed extracted."""
    from tkg.errors import ExtractionFailedError, LLMError
    from tkg.llm.schema import GraphExtraction

    answer = {"entities": [{"name": "Ann"}, {"name": "Oslo"}], "facts": []}
    mode = {"now": "fail"}
    entered, release = threading.Event(), threading.Event()

    def handler(prompt: Any, model: Any) -> Any:
        if model is not GraphExtraction:
            return {}
        if mode["now"] == "block":
            entered.set()
            release.wait(10)
            raise LLMError("HTTP 500: down", retryable=False)
        if mode["now"] == "fail":
            raise LLMError("HTTP 500: down", retryable=False)
        return answer

    llm = ScriptedLLM(handler=handler)
    store = InMemoryStore(dim=EMB.dim)
    config = MemoryConfig(communities=None, llm_policy=LLMPolicy(max_attempts=1))
    memory = Memory(store, embedder=EMB, llm=llm, clock=FixedClock("2024-01-01T00:00:00Z"), config=config)
    with pytest.raises(ExtractionFailedError):
        memory.add_episode("Ann: I live in Oslo.", group_id="g", episode_id="e1")
    mode["now"] = "block"
    outcome: dict[str, Any] = {}

    def first() -> None:
        try:
            memory.retry("e1")
        except Exception as exc:
            outcome["first"] = exc

    thread = threading.Thread(target=first)
    thread.start()
    assert entered.wait(10)
    calls = len(llm.calls)
    with pytest.raises(ValidationError, match="being retried already"):
        memory.retry("e1")
    assert len(llm.calls) == calls  # refused before any call
    # another process (a second memory on the same store) retries it meanwhile, and succeeds
    mode["now"] = "answer"
    other = Memory(store, embedder=EMB, llm=ScriptedLLM(handler=handler), clock=memory.clock, config=config)
    done = other.retry("e1")
    assert done.episode.status is EpisodeStatus.EXTRACTED
    mode["now"] = "block"
    release.set()
    thread.join(10)
    failed = outcome["first"]
    assert isinstance(failed, ExtractionFailedError) and "extracted by another run meanwhile" in str(failed)
    assert "stored (status 'failed')" not in str(failed)
    assert store.get(Kind.EPISODE, ["e1"])[0].status is EpisodeStatus.EXTRACTED  # type: ignore[union-attr]


def test_a_retry_that_read_the_episode_failed_before_another_retry_ended_makes_no_llm_call() -> None:
    """The second retry read the episode (failed) while the first ran, and checked for a retry under way only
    after the first had ended: it paid for an extraction whose answer could only be refused."""
    from tkg.errors import ExtractionFailedError
    from tkg.llm.schema import GraphExtraction

    answer = {"entities": [{"name": "Ann"}, {"name": "Oslo"}], "facts": []}
    gate = {"fail": True}
    entered, release = threading.Event(), threading.Event()
    extractions: list[str] = []

    def handler(prompt: Any, model: Any) -> Any:
        if model is not GraphExtraction:
            return {}
        extractions.append(threading.current_thread().name)
        if gate["fail"]:
            raise __import__("tkg").errors.LLMError("HTTP 500: down", retryable=False)
        if threading.current_thread().name == "first":
            entered.set()
            release.wait(10)
        return answer

    config = MemoryConfig(communities=None, llm_policy=LLMPolicy(max_attempts=1))
    memory = Memory(
        embedder=EMB, llm=ScriptedLLM(handler=handler), clock=FixedClock("2024-01-01T00:00:00Z"), config=config
    )
    with pytest.raises(ExtractionFailedError):
        memory.add_episode("Ann: I live in Oslo.", group_id="g", episode_id="e1")
    gate["fail"] = False
    read = threading.Event()
    real_get = memory.get

    def get(*args: Any, **kwargs: Any) -> Any:  # the second retry reads the episode, then waits for the first
        found = real_get(*args, **kwargs)
        if threading.current_thread().name == "second":
            read.set()
            assert first.join(10) is None
        return found

    memory.get = get  # type: ignore[method-assign]
    outcome: dict[str, Any] = {}

    def run(name: str) -> None:
        try:
            outcome[name] = memory.retry("e1").episode.status
        except Exception as exc:
            outcome[name] = exc

    first = threading.Thread(target=run, args=("first",), name="first")
    first.start()
    assert entered.wait(10)
    second = threading.Thread(target=run, args=("second",), name="second")
    second.start()
    read.wait(2)  # it reads (before the fix) or is refused at once (after)
    release.set()
    first.join(10)
    second.join(10)
    assert outcome["first"] is EpisodeStatus.EXTRACTED and isinstance(outcome["second"], ValidationError)
    assert extractions.count("second") == 0, extractions
