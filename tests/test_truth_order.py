"""Truth maintenance that holds whatever the order (issue 14), on every backend.

Random histories of statements about a few people -- homes (single-valued by the ontology), moves and jobs
(contradictions judged by the LLM double, across relation names for moves), likes (never contradicting) --
ingested in random permutations and batches, with random removals. Asserted over every fact, superseded ones
included: the same valid-time history for any arrival order (only transaction times differ; statements said at
one time arrive in their order of saying: the later one is the newer word), "add then remove"
equal to "never added", and at most one home or job per person at every instant of valid time.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from helpers_truth import held, settling_last_checked
from hypothesis import HealthCheck, example, given, note, settings
from hypothesis import strategies as st

import tkg.ingest as ingest_module
from tkg import FactInput, FixedClock, HashEmbedder, Kind, Memory, MemoryConfig, RulesLLM, ScriptedLLM
from tkg.extraction import PlanSettings
from tkg.invalidation import own_end, text_key
from tkg.llm import LLMPolicy, Prompt
from tkg.llm.rules import extract
from tkg.llm.schema import FactDecision, GraphExtraction, Resolution
from tkg.models import Entity, Episode, Fact
from tkg.ontology import Ontology, RelationType
from tkg.revisions import revisions_of
from tkg.storage import Store

PEOPLE = ["Ann", "Bob"]
OBJECTS = ["Paris", "Rome", "Oslo"]
RELATIONS = ["LIVES_IN", "MOVED_TO", "WORKS_AT", "LIKES", "ENJOYS"]
#: What the LLM double judges: two facts of one person in the same group, about different objects, contradict.
GROUPS = {"LIVES_IN": "home", "MOVED_TO": "home", "WORKS_AT": "job"}
#: ... and two facts of one person and object under these relations are the same ("Ann enjoys Paris" is "Ann likes
#: Paris"), so that a new fact can be the same as several statements at once.
LIKING = {"LIKES", "ENJOYS", "LOVES"}
ONTOLOGY = Ontology(relations={"LIVES_IN": RelationType(single_valued=True)})
EMB = HashEmbedder(dim=32)

Statement = tuple[str, str, str, int, int | None, int]
statements = st.tuples(
    st.sampled_from(PEOPLE),
    st.sampled_from(RELATIONS),
    st.sampled_from(OBJECTS),
    st.integers(2010, 2016),  # valid from (ties are common)
    st.one_of(st.none(), st.integers(0, 3)),  # years until it ended (None: still holds)
    st.integers(0, 3),  # the day it was said (ties too)
)


@pytest.fixture(autouse=True, scope="module")
def _settling_last_as_the_whole_component() -> Iterator[list[str]]:
    """A new fact settled from the statements it contradicts alone changes what settling its whole component
    would (checked on every one, in every test here)."""
    with settling_last_checked() as taken:
        yield taken


def message(statement: Statement) -> tuple[str, datetime]:
    who, rel, what, year, span, said = statement
    until = "" if span is None else f" until {year + span}"
    return f"{who}: I {rel} {what} since {year}{until}.", datetime(2024, 1, 1 + said, tzinfo=UTC)


def said_in_order(arrival: Sequence[int], history: Sequence[Statement]) -> list[int]:
    """``arrival`` (positions in ``history``) with the statements said at one time in their order in ``history``:
    between those, the one the memory learns later is the newer word, so only the others may arrive in any order
    (a statement said twice at one time: its first saying arrives first)."""
    queues: dict[datetime, list[int]] = {}
    for i, statement in enumerate(history):
        queues.setdefault(message(statement)[1], []).append(i)
    return [queues[message(history[i])[1]].pop(0) for i in arrival]


def judge(prompt: Prompt, model: Any) -> Any:
    """The LLM double: extraction by tkg's rules; a fact contradicts a candidate of the same person and group
    with another object, and duplicates those with the same sentence, or of the same person and object with both
    relations among LIKING (the answer names every duplicate). A pairwise judgement: never order-dependent."""
    if model is GraphExtraction:
        return extract(str(prompt.inputs["content"]), prompt.inputs.get("speaker"))
    decisions = []
    for number, item in enumerate(prompt.inputs.get("facts", []), start=1):
        duplicates, contradicts = [], []
        for c in item["candidates"]:
            liking = {c["relation"], item["relation"]} <= LIKING
            if text_key(c["fact"]) == text_key(item["fact"]) or (
                liking and (c["source"], c["target"]) == (item["source"], item["target"])
            ):
                duplicates.append(c["number"])
            elif (
                c["source"] == item["source"]
                and GROUPS.get(c["relation"]) is not None
                and GROUPS.get(c["relation"]) == GROUPS.get(item["relation"])
                and c["target"] != item["target"]
            ):
                contradicts.append(c["number"])
        decisions.append(FactDecision(new=number, duplicates=duplicates, contradicts=contradicts))
    return Resolution(facts=decisions)


def new_memory(
    store: Store, embedder: Any = EMB, handler: Callable[[Prompt, Any], Any] = judge, bounds: tuple[int, int] = (30, 30)
) -> Memory:
    """A memory judged by ``judge`` (or ``handler``). Every fact under another relation that shares an endpoint is
    a candidate (the hash embedder's similarities are noise), and by default the bounds on candidates per new
    fact (``bounds``: statements, related statements) never bite in this small world: the history is then
    order-independent exactly (past the bounds, only the closest statements are asked)."""
    return Memory(
        store,
        embedder=embedder,
        llm=ScriptedLLM(handler=handler),
        clock=FixedClock(datetime(2025, 1, 1, tzinfo=UTC), tick=timedelta(seconds=1)),
        ontology=ONTOLOGY,
        config=MemoryConfig(
            llm_policy=LLMPolicy(backoff_initial=0.0),
            communities=None,
            max_fact_candidates=bounds[0],
            related_fact_candidates=bounds[1],
            related_min_similarity=-1.0,
        ),
    )


def ingest(memory: Memory, history: Sequence[Statement], batch: bool = False) -> list[str]:
    items = [message(s) for s in history]
    if batch:
        results = memory.add_episodes([{"content": c, "reference_time": t, "group_id": "g"} for c, t in items])
    else:
        results = [memory.add_episode(c, reference_time=t, group_id="g") for c, t in items]
    assert all(r.status.value == "extracted" for r in results)
    return [r.episode.id for r in results]


def canonical(memory: Memory) -> list[tuple[Any, ...]]:
    """Every fact by what it says (ids and transaction times differ between runs): its statement, valid interval,
    the statement that superseded it, whether it is current, and the episodes that state it."""
    names = {e.id: e.name for e in memory.records(Kind.ENTITY) if isinstance(e, Entity)}
    said = {e.id: (e.content, e.reference_time) for e in memory.records(Kind.EPISODE) if isinstance(e, Episode)}
    facts = {f.id: f for f in memory.records(Kind.FACT) if isinstance(f, Fact)}

    def when(t: datetime | None) -> str:
        return "-" if t is None else t.isoformat()  # sortable, None included

    def key(f: Fact) -> tuple[Any, ...]:
        return (
            names[f.source_id],
            f.relation,
            names[f.target_id],
            text_key(f.fact),
            when(f.valid_at),
            when(own_end(f)),
        )

    return sorted(
        (
            key(f),
            when(f.invalid_at),
            () if f.invalidated_by is None else key(facts[f.invalidated_by]),
            f.expired_at is None,
            tuple(sorted((c, when(t)) for c, t in (said[e] for e in f.episodes))),
        )
        for f in facts.values()
    )


def check_invariants(memory: Memory) -> None:
    """Over every fact, superseded or not."""
    facts = [f for f in memory.records(Kind.FACT) if isinstance(f, Fact)]
    ids = {f.id for f in facts}
    for f in facts:
        if f.valid_at is not None and f.invalid_at is not None:
            assert f.invalid_at >= f.valid_at, f
        assert (f.expired_at is None) == (f.invalidated_by is None), f
        if f.invalidated_by is not None:
            assert f.invalidated_by in ids and f.invalidated_by != f.id, f
            assert f.expired_at is not None and f.expired_at >= f.created_at
            end = own_end(f)
            assert f.invalid_at is not None and (end is None or f.invalid_at <= end), f
        # earlier supersessions (tkg.revisions): each by a fact still here, learnt in turn, before the record's own
        earlier = revisions_of(f)
        for r, after in zip(earlier, [*earlier[1:], None][: len(earlier)], strict=True):
            assert r.invalidated_by in ids and r.invalidated_by != f.id, f
            assert f.created_at <= r.expired_at < r.until, f
            if after is not None or f.expired_at is not None:
                assert r.until <= (after.expired_at if after is not None else f.expired_at), f  # type: ignore[operator]
            assert f.valid_at is None or r.invalid_at >= f.valid_at, f
    # at every instant of valid time, at most one home (LIVES_IN or MOVED_TO) and one job per person
    names = {e.id: e.name for e in memory.records(Kind.ENTITY) if isinstance(e, Entity)}
    slots: dict[tuple[str, str], list[Fact]] = {}
    for f in facts:
        group = GROUPS.get(f.relation)
        if group is not None:
            slots.setdefault((f.source_id, group), []).append(f)
    for in_slot in slots.values():
        for i, a in enumerate(in_slot):
            for b in in_slot[i + 1 :]:
                if names[a.target_id] != names[b.target_id]:
                    assert not _share_an_instant(a, b), (a, b)


def _share_an_instant(a: Fact, b: Fact) -> bool:
    lo = [t for t in (a.valid_at, b.valid_at) if t is not None]
    hi = [t for t in (a.invalid_at, b.invalid_at) if t is not None]
    start = max(lo) if lo else None
    end = min(hi) if hi else None
    return start is None or end is None or start < end


#: A step: an episode, sometimes followed by an end given by hand to one fact (which, and how long after it starts).
steps = st.tuples(statements, st.none() | st.tuples(st.integers(0, 20), st.integers(0, 2000)))


def take_steps(
    memory: Memory, history: Sequence[tuple[Statement, tuple[int, int] | None]]
) -> list[tuple[datetime, dict[str, tuple[Any, ...]]]]:
    """Takes the steps in group "g"; after each, the time and what the memory then held (:func:`held`)."""
    seen = []
    for statement, ending in history:
        content, said = message(statement)
        memory.add_episode(content, reference_time=said, group_id="g")
        if ending is not None:
            facts = sorted(memory.get_all("g", include_invalidated=True), key=lambda f: f.created_at)  # ids: random
            fact = facts[ending[0] % len(facts)]
            at = (fact.valid_at or datetime(2009, 1, 1, tzinfo=UTC)) + timedelta(days=ending[1])
            end = own_end(fact)
            if end is None or at < end:
                memory.invalidate_fact(fact.id, at=at)
        seen.append((memory.clock.now(), held(memory)))
    return seen


SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


@SETTINGS
@given(history=st.lists(statements, min_size=1, max_size=7), data=st.data())
def test_any_arrival_order_gives_the_same_history(
    make_store: Callable[[int], Store], history: list[Statement], data: st.DataObject
) -> None:
    note(f"history: {history!r}")
    in_order = new_memory(make_store(EMB.dim))
    ingest(in_order, history)
    check_invariants(in_order)
    arrival = said_in_order(data.draw(st.permutations(range(len(history)))), history)
    shuffled = [history[i] for i in arrival]
    other = new_memory(make_store(EMB.dim))
    ingest(other, shuffled, batch=data.draw(st.booleans()))
    check_invariants(other)
    assert canonical(other) == canonical(in_order)


@SETTINGS
@given(history=st.lists(steps, min_size=1, max_size=7))
@example(  # a restatement superseded by one fact, then another; an end by hand makes the first cover it again
    history=[
        (("Bob", "MOVED_TO", "Rome", 2010, 1, 0), None),
        (("Ann", "LIVES_IN", "Paris", 2014, None, 1), (0, 1)),
        (("Ann", "LIVES_IN", "Paris", 2012, None, 2), None),
        (("Ann", "LIVES_IN", "Paris", 2010, None, 0), None),
        (("Ann", "LIVES_IN", "Paris", 2010, None, 0), (3, 46)),
    ]
)
def test_a_view_known_at_a_past_time_shows_what_the_memory_held_then(
    make_store: Callable[[int], Store], history: list[tuple[Statement, tuple[int, int] | None]]
) -> None:
    """Transaction time: after each step -- an episode, sometimes followed by ending one fact by hand -- what the
    memory holds (every fact, superseded ones included, with its end, what ended it and when that was learnt) is
    noted; at the end, a view known at each of those times shows exactly that, however often a fact was
    superseded or ended since (late facts about the past end facts again; an end by hand can make a superseded
    fact hold again)."""
    note(f"history: {history!r}")
    memory = new_memory(make_store(EMB.dim))
    seen = take_steps(memory, history)
    check_invariants(memory)
    for at, then in seen:
        assert held(memory, at) == then, at


@SETTINGS
@given(history=st.lists(steps, max_size=6), added=statements)
@example(  # the second Rome restates the first and ends at once; Paris ends the first, so the second holds again
    history=[(("Ann", "LIVES_IN", "Rome", 2010, None, 0), None), (("Ann", "LIVES_IN", "Rome", 2011, None, 0), None)],
    added=("Ann", "LIVES_IN", "Paris", 2010, None, 1),
)
def test_an_episode_added_then_removed_leaves_no_trace_in_any_view(
    make_store: Callable[[int], Store], history: list[tuple[Statement, tuple[int, int] | None]], added: Statement
) -> None:
    """Remove is as if never added, on the transaction timeline too: after an episode is added and removed, a view
    known at any time before it was added shows what it showed, and one known while it was there shows what the
    memory held before it (its supersessions, or its letting superseded facts hold again, leave no revision)."""
    note(f"history: {history!r}")
    memory = new_memory(make_store(EMB.dim))
    seen = take_steps(memory, history)
    before = held(memory)
    content, said = message(added)
    episode = memory.add_episode(content, reference_time=said, group_id="g").episode
    meanwhile = memory.clock.now()
    memory.remove_episode(episode.id)
    check_invariants(memory)
    assert held(memory) == before
    assert held(memory, meanwhile) == before
    for at, then in seen:
        assert held(memory, at) == then, at


@SETTINGS
@given(history=st.lists(statements, min_size=2, max_size=7), data=st.data())
def test_adding_then_removing_an_episode_is_never_adding_it(
    make_store: Callable[[int], Store], history: list[Statement], data: st.DataObject
) -> None:
    note(f"history: {history!r}")
    removed = data.draw(st.integers(0, len(history) - 1))
    rest = history[:removed] + history[removed + 1 :]
    never = new_memory(make_store(EMB.dim))
    ingest(never, rest)
    both = new_memory(make_store(EMB.dim))
    arrival = said_in_order(data.draw(st.permutations(range(len(history)))), history)
    ids = ingest(both, [history[i] for i in arrival])
    # the saying removed: of a statement said twice at one time, which one matters (the later is the newer word)
    both.remove_episode(ids[arrival.index(removed)])
    check_invariants(both)
    assert canonical(both) == canonical(never)


def test_a_late_fact_shortens_a_superseded_one(make_store: Callable[[int], Store]) -> None:
    """Issue 14, case 1: Oslo (2000), Rome (2002), then Lima (2001) arriving last: as of mid-2001 one home."""
    memory = new_memory(make_store(EMB.dim))
    for city, year in (("Oslo", 2000), ("Rome", 2002), ("Lima", 2001)):
        memory.add_episode(f"Ann: I LIVES_IN {city} since {year}.", group_id="g", reference_time="2024-01-01T00:00Z")
    homes = memory.search("Ann lives in", group_ids="g", as_of="2001-06-01T00:00:00Z", targets=["facts"])
    assert [s.record.fact for s in homes.facts] == ["Ann lives in Lima"]
    oslo = next(f for f in memory.get_all("g", include_invalidated=True) if f.fact == "Ann lives in Oslo")
    assert oslo.invalid_at == datetime(2001, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("judged_by", ["llm", "ontology"])
def test_removing_the_middle_of_a_chain_leaves_one_current_fact(
    make_store: Callable[[int], Store], judged_by: str
) -> None:
    """Issue 14, case 2: A, then B contradicts A, then C contradicts B; removing B leaves C current, A ended by
    C, whether the contradictions were judged by the LLM (WORKS_AT) or the ontology (LIVES_IN)."""
    relation = "WORKS_AT" if judged_by == "llm" else "LIVES_IN"
    memory = new_memory(make_store(EMB.dim))
    ids = [
        memory.add_episode(f"Ann: I {relation} {place} since {year}.", group_id="g").episode.id
        for place, year in (("Acme", 2010), ("Globex", 2012), ("Initech", 2014))
    ]
    memory.remove_episode(ids[1])
    current = [f.fact for f in memory.get_all("g")]
    assert len(current) == 1 and current[0].endswith("Initech")
    facts = {f.fact.rsplit(" ", 1)[-1]: f for f in memory.get_all("g", include_invalidated=True)}
    assert facts["Acme"].invalidated_by == facts["Initech"].id and facts["Acme"].invalid_at.year == 2014  # type: ignore[union-attr]


def test_removal_never_leaves_two_identical_current_facts(make_store: Callable[[int], Store]) -> None:
    """Issue 14, case 2b: Paris, Rome, Paris again; removing Rome leaves one current Paris fact."""
    memory = new_memory(make_store(EMB.dim))
    ids = [
        memory.add_episode(f"Ann: I LIVES_IN {city} since {year}.", group_id="g").episode.id
        for city, year in (("Paris", 2010), ("Rome", 2012), ("Paris", 2014))
    ]
    memory.remove_episode(ids[1])
    current = memory.get_all("g")
    assert [f.fact for f in current] == ["Ann lives in Paris"] and current[0].valid_at.year == 2010  # type: ignore[union-attr]
    check_invariants(memory)


def test_contradictions_are_found_across_relation_names(make_store: Callable[[int], Store]) -> None:
    """Issue 14, case 3: "Ann LIVES_IN Paris" then "Ann MOVED_TO Berlin" meet as candidates, in the one batched
    resolution call, and the LLM's verdict ends the old home."""
    memory = new_memory(make_store(EMB.dim))
    memory.add_episode("Ann: I LIVES_IN Paris since 2010.", group_id="g")
    moved = memory.add_episode("Ann: I MOVED_TO Berlin since 2020.", group_id="g")
    assert moved.usage.by_prompt.get("resolve") == 1
    paris = next(f for f in memory.get_all("g", include_invalidated=True) if f.relation == "LIVES_IN")
    assert paris.invalid_at == datetime(2020, 1, 1, tzinfo=UTC) and paris.invalidated_by is not None


class PerText:
    """A seeded random unit vector per exact text (case and punctuation count)."""

    dim = 32
    name = "per-text-test"

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = [np.random.default_rng(zlib.crc32(t.encode())).standard_normal(self.dim) for t in texts]
        matrix = np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)
        return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(history=st.lists(st.tuples(statements, st.booleans()), min_size=2, max_size=10))
def test_candidates_read_closest_first_are_those_of_the_whole_neighbourhood(
    make_store: Callable[[int], Store], history: list[tuple[Statement, bool]]
) -> None:
    """The planner reads the facts around a new one from the store closest first, a batch at a time, and stops once
    the statements it shows are certain. One fact per batch must ask the LLM exactly what one batch holding the
    whole neighbourhood asks, and give the same graph (two per batch too: one per batch reads one fact, then the
    most a read may, here all of them), with bounds that bite (one candidate, two related
    statements, any similarity). Objects are sometimes written in capitals: the same statement then has sentences
    with other vectors (each text its own), so a statement met through one restatement must be read whole."""
    note(f"history: {history!r}")
    items = []
    for statement, shout in history:
        content, said = message(statement)
        items.append((content.replace(statement[2], statement[2].upper()) if shout else content, said))
    outcomes = []
    for batch in (1, 2, 10**6):
        asked: list[tuple[str, tuple[str, ...]]] = []

        def recording(prompt: Prompt, model: Any, asked: list[tuple[str, tuple[str, ...]]] = asked) -> Any:
            for item in prompt.inputs.get("facts", []):
                asked.append((item["fact"], tuple(c["fact"] for c in item["candidates"])))
            return judge(prompt, model)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(ingest_module, "PlanSettings", functools.partial(PlanSettings, candidate_batch=batch))
            memory = new_memory(make_store(PerText.dim), PerText(), recording, bounds=(1, 2))
            for content, said in items:
                assert memory.add_episode(content, reference_time=said, group_id="g").status.value == "extracted"
            assert memory._ingestor.settings.candidate_batch == batch
        outcomes.append((asked, canonical(memory)))
    assert outcomes[0] == outcomes[1] == outcomes[2]


# -- one statement said over several intervals; facts with no start ----------------------------------------------

YEAR = functools.partial(datetime, tzinfo=UTC)
#: (start year, years it lasts (None: open), whether its start is said): a span of unknown start is only its end.
spans = st.lists(
    st.tuples(st.integers(2010, 2020), st.one_of(st.none(), st.integers(1, 4)), st.booleans()), min_size=1, max_size=5
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(said=spans, order=st.randoms(use_true_random=False))
def test_a_statement_said_over_several_intervals_holds_over_their_union_once(said: list, order: Any) -> None:
    """A restatement reaching past the end of the fact it restated was kept empty: "Ann knows Bob" said for
    2019-2020 and again for 2020-2022 held for neither 2021 nor any later year (with no start said, "until 2020"
    then "until 2022": the same). At every instant the statement holds (in one fact, never two) exactly when one
    of the intervals it was said for covers it, whatever the order they arrive in."""
    # said and learnt at one instant (a clock standing still): no fact is the newer word on when it ended
    memory = Memory(embedder=EMB, clock=FixedClock("2025-01-01T00:00:00Z"))
    said = [(start, 1 if years is None and not known else years, known) for start, years, known in said]
    arrivals = list(said)
    order.shuffle(arrivals)
    for start, years, known in arrivals:
        end = None if years is None else YEAR(start + years, 1, 1)
        since = YEAR(start, 1, 1) if known else None
        # all stated at one time: which one is the newer word is not the point here (see the test below)
        memory.add_facts(
            [FactInput("Ann", "KNOWS", "Bob", valid_at=since, invalid_at=end)],
            group_id="g",
            reference_time="2025-01-01T00:00:00Z",
        )
    for year in range(2000, 2027):
        at = YEAR(year, 7, 1)
        covered = any(
            (start <= year or not known) and (years is None or year < start + years) for start, years, known in said
        )
        holding = memory.get_all("g", as_of=at)
        assert len(holding) == int(covered), (year, holding)


@pytest.mark.parametrize("order", [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)])
def test_a_superseded_fact_with_no_start_ends_no_later_than_its_own_end(order: tuple[int, ...]) -> None:
    """Two homes with no start: the one stated later ended the other when it was stated, even after the other's
    own end -- "in Rome until 2023" stated in 2023 was pushed to April 2024 by "in Oslo until 2020", so "in Lima
    since 2021" no longer ended it, and Ann had two homes in 2022."""
    memory = Memory(
        embedder=EMB, clock=FixedClock("2025-01-01T00:00:00Z", tick=timedelta(seconds=1)), ontology=ONTOLOGY
    )
    said = [
        (FactInput("Ann", "LIVES_IN", "Rome", invalid_at="2023-01-01T00:00:00Z"), "2023-06-01T00:00:00Z"),
        (FactInput("Ann", "LIVES_IN", "Oslo", invalid_at="2020-01-01T00:00:00Z"), "2024-04-01T00:00:00Z"),
        (FactInput("Ann", "LIVES_IN", "Lima", valid_at="2021-01-01T00:00:00Z"), "2024-05-01T00:00:00Z"),
    ]
    for i in order:
        memory.add_facts([said[i][0]], group_id="g", reference_time=said[i][1])
    names = {e.id: e.name for e in memory.records(Kind.ENTITY) if isinstance(e, Entity)}
    ends = {names[f.target_id]: f.invalid_at for f in memory.get_all("g", include_invalidated=True)}
    assert ends == {"Rome": YEAR(2021, 1, 1), "Oslo": YEAR(2020, 1, 1), "Lima": None}
    assert [f.fact for f in memory.get_all("g", as_of="2022-06-01T00:00:00Z")] == ["Ann lives in Lima"]
    for f in memory.records(Kind.FACT):
        assert isinstance(f, Fact)
        end = own_end(f)
        assert end is None or f.invalid_at is None or f.invalid_at <= end, f


def test_a_fact_given_only_its_end_has_an_unknown_start() -> None:
    """add_facts with only invalid_at took the reference time as the start, found the end before it and dropped
    the end: a job that ended in 2020 was stored as holding now. Extraction reads "until 2020" so already."""
    memory = Memory(embedder=EMB, clock=FixedClock("2025-01-01T00:00:00Z"))
    result = memory.add_facts([FactInput("Ann", "WORKS_AT", "Acme", invalid_at="2020-01-01T00:00:00Z")], group_id="g")
    [fact] = result.facts
    assert (fact.valid_at, fact.invalid_at, result.warnings) == (None, YEAR(2020, 1, 1), [])
    assert memory.get_all("g") == [] and [f.id for f in memory.get_all("g", as_of="2019-01-01T00:00:00Z")] == [fact.id]


@pytest.mark.parametrize("third", ["Oslo", "Paris"])
@pytest.mark.parametrize("order", [(0, 1, 2), (0, 2, 1), (1, 0, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0)])
def test_a_fact_with_no_start_ended_when_another_was_stated_still_meets_what_starts_before_then(
    order: tuple[int, ...], third: str
) -> None:
    """ "In Paris until 2020" (stated 2011), then "in Rome until 2020" (stated 2013): Paris ends in 2013, when
    Rome was stated. The sweep let go of Paris at once, so a home from 2012 never ended it (Oslo: two homes in
    2012) nor carried it on (Paris again from 2012: one statement in two facts at once)."""
    memory = Memory(
        embedder=EMB, clock=FixedClock("2025-01-01T00:00:00Z", tick=timedelta(seconds=1)), ontology=ONTOLOGY
    )
    said = [
        (FactInput("Ann", "LIVES_IN", "Paris", invalid_at="2020-01-01T00:00:00Z"), "2011-01-01T00:00:00Z"),
        (FactInput("Ann", "LIVES_IN", "Rome", invalid_at="2020-01-01T00:00:00Z"), "2013-01-01T00:00:00Z"),
        (FactInput("Ann", "LIVES_IN", third, valid_at="2012-01-01T00:00:00Z"), "2024-01-01T00:00:00Z"),
    ]
    for i in order:
        memory.add_facts([said[i][0]], group_id="g", reference_time=said[i][1])
    assert [f.fact for f in memory.get_all("g", as_of="2012-06-01T00:00:00Z")] == [f"Ann lives in {third}"]
    assert sorted(f.invalid_at for f in memory.get_all("g", include_invalidated=True) if f.valid_at is None) == [
        YEAR(2012, 1, 1),
        YEAR(2012, 1, 1),
    ]


@pytest.mark.parametrize("since", [None, "2020-01-01T00:00:00Z", "2021-01-01T00:00:00Z"])
@pytest.mark.parametrize("end_said_later", [True, False])
@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_an_end_said_later_of_a_statement_ends_it(order: tuple[int, ...], end_said_later: bool, since: str) -> None:
    """ "Ann works at Acme" since 2020 (said then), then "Ann works at Acme" until May 2024 (said in June 2024),
    with no start or the same start: the statement ended in May. The restatement rule carried the open fact on past
    that end, as if the later word had not been said (with a start said: the later fact was kept empty); said
    before it, the open fact does carry the statement on, and so it does past a later stint ("from 2021")."""
    memory = Memory(embedder=EMB, clock=FixedClock("2025-01-01T00:00:00Z", tick=timedelta(seconds=1)))
    said = [
        (FactInput("Ann", "WORKS_AT", "Acme", valid_at="2020-01-01T00:00:00Z"), "2020-01-01T00:00:00Z"),
        (
            FactInput("Ann", "WORKS_AT", "Acme", valid_at=since, invalid_at="2024-05-01T00:00:00Z"),
            "2024-06-01T00:00:00Z" if end_said_later else "2019-06-01T00:00:00Z",
        ),
    ]
    for i in order:
        memory.add_facts([said[i][0]], group_id="g", reference_time=said[i][1])
    now = [f.fact for f in memory.get_all("g")]
    # said later and covering the open fact's start (the same start, or none said): the newer word on the end; a
    # later stint ("from 2021 to May") says nothing of when the stint since 2020 ended
    newer_word = end_said_later and since != "2021-01-01T00:00:00Z"
    assert now == ([] if newer_word else ["Ann works at Acme"])
    for year in (2020, 2022, 2024):
        assert [f.fact for f in memory.get_all("g", as_of=f"{year}-02-01T00:00:00Z")] == ["Ann works at Acme"]
    before = [f.fact for f in memory.get_all("g", as_of="2019-02-01T00:00:00Z")]
    assert before == ([] if since else ["Ann works at Acme"])  # with no start said: since forever


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_of_two_contradicting_facts_said_at_one_time_the_later_one_holds(
    make_store: Callable[[int], Store], order: tuple[int, ...]
) -> None:
    """Messages of one session stamped with its date: "I live in Paris", then "I live in Berlin". The sentence
    broke the tie, so Paris held whichever came last."""
    memory = new_memory(make_store(EMB.dim))
    cities = ["Paris", "Berlin"]
    for i in order:
        memory.add_episode(f"Ann: I LIVES_IN {cities[i]}.", reference_time="2024-03-01T00:00:00Z", group_id="g")
    assert [f.fact for f in memory.get_all("g")] == [f"Ann lives in {cities[order[-1]]}"]
    check_invariants(memory)


def test_a_later_stint_said_later_does_not_end_the_statement(make_store: Callable[[int], Store]) -> None:
    """ "Alice lives in Paris" since 2010, then "lived in Paris during 2015" said in 2024: a stint inside the
    statement, not its end (a first form of the newer-word rule ended Paris in 2016); and from 2010 to 2020, then
    in 2015, the same."""
    for first_end in (None, "2020-01-01T00:00:00Z"):
        memory = new_memory(make_store(EMB.dim))
        since = FactInput("Alice", "LIVES_IN", "Paris", valid_at="2010-01-01T00:00:00Z", invalid_at=first_end)
        stint = FactInput(
            "Alice", "LIVES_IN", "Paris", valid_at="2015-01-01T00:00:00Z", invalid_at="2016-01-01T00:00:00Z"
        )
        memory.add_facts([since], group_id="g", reference_time="2010-06-01T00:00:00Z")
        memory.add_facts([stint], group_id="g", reference_time="2024-01-01T00:00:00Z")
        held = [f.fact for f in memory.get_all("g", as_of="2017-06-01T00:00:00Z")]
        assert held == ["Alice lives in Paris"]
        check_invariants(memory)


def test_a_statement_said_again_at_the_same_time_is_the_latest_word(make_store: Callable[[int], Store]) -> None:
    """Paris, Berlin, then Paris again, all said at one time: the second Paris is a verbatim repeat kept in the
    first's provenance, and the statement was said last: Paris holds (it was ordered by its first learning)."""
    memory = new_memory(make_store(EMB.dim))
    for city in ("Paris", "Berlin", "Paris"):
        memory.add_facts(
            [FactInput("Alice", "LIVES_IN", city, valid_at="2024-03-01T00:00:00Z")],
            group_id="g",
            reference_time="2024-03-01T00:00:00Z",
        )
    assert [f.fact for f in memory.get_all("g")] == ["Alice lives in Paris"]
    check_invariants(memory)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_of_two_words_said_at_one_time_the_later_says_when_the_statement_ended(
    make_store: Callable[[int], Store], order: tuple[int, ...]
) -> None:
    """ "Ann works at Acme since 2020", then in the same session (one reference time) "from 2020 to May 2024": the
    second is the newer word, so the job ended in May. The newer-word rule compared statement times alone, which
    tie, and the job held on; said the other way round, the open word is the newer one and it holds."""
    memory = new_memory(make_store(EMB.dim))
    words = [
        FactInput("Ann", "WORKS_AT", "Acme", valid_at="2020-01-01T00:00:00Z"),
        FactInput("Ann", "WORKS_AT", "Acme", valid_at="2020-01-01T00:00:00Z", invalid_at="2024-05-01T00:00:00Z"),
    ]
    for i in order:
        memory.add_facts([words[i]], group_id="g", reference_time="2024-06-01T00:00:00Z")
    held = [f.fact for f in memory.get_all("g", as_of="2024-07-01T00:00:00Z")]
    assert held == ([] if order[-1] == 1 else ["Ann works at Acme"])
    check_invariants(memory)


def test_a_word_said_again_later_is_the_newer_word(make_store: Callable[[int], Store]) -> None:
    """Acme since 2020 (said 2020), 2020-2022 (said 2023), then since 2020 again word for word (said 2024): the
    latest word keeps the job. The repeat went into the first fact's provenance, which kept its first statement
    time, so the 2023 word won; and adding the oldest word overturned the newest. Removing the repeat is as if it
    had never been said."""
    memory = new_memory(make_store(EMB.dim))
    open_word = FactInput("Ann", "WORKS_AT", "Acme", valid_at="2020-01-01T00:00:00Z")
    ended = FactInput("Ann", "WORKS_AT", "Acme", valid_at="2020-01-01T00:00:00Z", invalid_at="2022-01-01T00:00:00Z")
    memory.add_facts([open_word], group_id="g", reference_time="2020-06-01T00:00:00Z")
    memory.add_facts([ended], group_id="g", reference_time="2023-06-01T00:00:00Z")
    before = [f.fact for f in memory.get_all("g", as_of="2025-01-01T00:00:00Z")]
    again = memory.add_facts([open_word], group_id="g", reference_time="2024-06-01T00:00:00Z")
    assert [f.fact for f in memory.get_all("g", as_of="2025-01-01T00:00:00Z")] == ["Ann works at Acme"]
    check_invariants(memory)
    memory.remove_episode(again.episode.id)
    assert [f.fact for f in memory.get_all("g", as_of="2025-01-01T00:00:00Z")] == before == []
    check_invariants(memory)


def test_a_fact_with_no_start_said_again_ends_the_other_when_said_again(make_store: Callable[[int], Store]) -> None:
    """Paris until 2030 (said 2020), Rome until 2030 (said 2022), then Paris again word for word (said 2024): Paris
    is the newer word, and ends Rome when it was said again -- it ended Rome in 2020, when Paris was first said,
    two years before Rome was said at all."""
    memory = new_memory(make_store(EMB.dim))
    for city, said in (("Paris", "2020-06-01"), ("Rome", "2022-06-01"), ("Paris", "2024-06-01")):
        memory.add_episode(f"Ann: I LIVES_IN {city} until 2030.", group_id="g", reference_time=f"{said}T00:00:00Z")
    names = {e.id: e.name for e in memory.records(Kind.ENTITY) if isinstance(e, Entity)}
    ends = {names[f.target_id]: f.invalid_at for f in memory.get_all("g", include_invalidated=True)}
    assert ends == {"Paris": YEAR(2030, 1, 1), "Rome": datetime(2024, 6, 1, tzinfo=UTC)}
    # (two facts with no start both hold before their ends: each says "since forever"; not checked here)
    assert "Ann lives in Rome" in [f.fact for f in memory.get_all("g", as_of="2023-01-01T00:00:00Z")]


def test_a_statement_an_episode_says_beside_another_is_compatible_with_it_whichever_episode_came_first(
    make_store: Callable[[int], Store],
) -> None:
    """One message says "I work at Cid since 2017. I work at Rome since 2019." (both hold: one episode said both,
    and facts of one episode are not judged against each other); another says "I work at Rome since 2022". When
    that one came first, Cid was judged against its Rome and ended in 2019; the other way round, the restatement
    rule kept Cid. Now the history is the same either way, as when the message is retried after a failure or a
    queue is processed in another order."""
    said = [
        ("Ann: I WORKS_AT Rome since 2022.", "2024-01-03T00:00:00Z"),
        ("Ann: I WORKS_AT Cid since 2017. I WORKS_AT Rome since 2019.", "2024-01-01T00:00:00Z"),
    ]
    histories = []
    for order in ((0, 1), (1, 0)):
        memory = new_memory(make_store(EMB.dim))
        for i in order:
            memory.add_episode(said[i][0], reference_time=said[i][1], group_id="g")
        assert sorted(f.fact for f in memory.get_all("g")) == ["Ann works at Cid", "Ann works at Rome"]
        histories.append(
            sorted((f.fact, f.valid_at, f.invalid_at) for f in memory.get_all("g", include_invalidated=True))
        )
    assert histories[0] == histories[1]


def _without_subject(found: GraphExtraction) -> GraphExtraction:
    """Sentences without their subject ("works at Rome"): one person's fact reads as another's would."""
    for fact in found.facts:
        fact.fact = f"{fact.relation.lower().replace('_', ' ')} {fact.target}"
    return found


def _named_histories(
    make_store: Callable[[int], Store],
    handler: Callable[[Prompt, Any], Any],
    said: dict[str, tuple[str, str]],
    orders: Sequence[Sequence[str]],
) -> list[tuple[list[str], list[tuple[Any, ...]]]]:
    """For each arrival order of the messages ``said`` (key -> text, reference time): the entity names, and every
    fact as (subject name, sentence, valid from, valid until)."""
    out = []
    for order in orders:
        memory = new_memory(make_store(EMB.dim), handler=handler)
        for key in order:
            memory.add_episode(said[key][0], reference_time=said[key][1], group_id="g")
        names = {e.id: e.name for e in memory.records(Kind.ENTITY) if isinstance(e, Entity)}
        facts = memory.get_all("g", include_invalidated=True)
        out.append(
            (sorted(names.values()), sorted((names[f.source_id], f.fact, f.valid_at, f.invalid_at) for f in facts))
        )
    return out


def test_a_name_that_may_be_a_known_one_does_not_make_a_statement_said_together(
    make_store: Callable[[int], Store],
) -> None:
    """ "Ann Smyth works at Rome" beside "Ann Smith works at Cid": Smyth may be Smith (a near name), but the LLM
    finds a new person in the same call that judges the facts, so the episode did not say Smith's Rome again, and
    Smith's Cid is judged against Smith's Rome in either order and ends."""

    def handler(prompt: Prompt, model: Any) -> Any:
        found = judge(prompt, model)
        return _without_subject(found) if model is GraphExtraction else found  # Smyth's Rome reads as Smith's

    said = {
        "tea": ("Ann Smith LIKES Tea.", "2023-12-01T00:00:00Z"),
        "rome": ("Ann Smith WORKS_AT Rome since 2022.", "2024-01-03T00:00:00Z"),
        "both": ("Ann Smith WORKS_AT Cid since 2017. Ann Smyth WORKS_AT Rome since 2019.", "2024-01-01T00:00:00Z"),
    }
    histories = [
        h for _, h in _named_histories(make_store, handler, said, [("tea", "rome", "both"), ("tea", "both", "rome")])
    ]
    assert histories[0] == histories[1]
    cid = next(h for h in histories[0] if h[1] == "works at Cid")
    assert cid[3] == datetime(2022, 1, 1, tzinfo=UTC)  # ended by Smith's Rome


@pytest.mark.parametrize("first", ["Ann Smith", "Ann"])
def test_a_statement_said_together_counts_once_the_llm_has_resolved_the_names(
    make_store: Callable[[int], Store], first: str
) -> None:
    """ "Ann Smith works at Cid since 2017. Ann Smith works at Rome since 2019." in one message, and "works at Rome
    since 2022" in another whose speaker is named "Ann" or "Ann Smith". "Ann" may be Ann Smith: the planner asks,
    and the LLM says she is, in the call that also judges the facts; the episode then restated the Rome that was
    said beside Cid. Cid holds in either order (it was ended in 2019 when the "Ann" message came second)."""
    rules = RulesLLM()

    def handler(prompt: Prompt, model: Any) -> Any:
        if model is GraphExtraction:  # Ann's Rome reads as Ann Smith's
            return _without_subject(extract(str(prompt.inputs["content"]), prompt.inputs.get("speaker")))
        return rules.generate(prompt, model)  # names and facts judged by tkg's rules

    said = {
        "tea": ("Ann Smith LIKES Tea.", "2023-12-01T00:00:00Z"),
        "rome": (f"{first} WORKS_AT Rome since 2022.", "2024-01-03T00:00:00Z"),
        "both": ("Ann Smith WORKS_AT Cid since 2017. Ann Smith WORKS_AT Rome since 2019.", "2024-01-01T00:00:00Z"),
    }
    runs = _named_histories(make_store, handler, said, [("tea", "rome", "both"), ("tea", "both", "rome")])
    assert all(names == ["Ann Smith", "Cid", "Rome", "Tea"] for names, _ in runs)
    histories = [h for _, h in runs]
    assert histories[0] == histories[1]
    assert ("Ann Smith", "works at Cid", datetime(2017, 1, 1, tzinfo=UTC), None) in histories[0]


def _history(memory: Memory) -> list[tuple[Any, ...]]:
    facts = memory.get_all("g", include_invalidated=True)
    return sorted((f.fact, f.valid_at, f.invalid_at, f.expired_at is not None) for f in facts)


def test_statements_said_together_and_apart_settle_alike_in_any_order_and_after_a_removal(
    make_store: Callable[[int], Store],
) -> None:
    """Cid said alone, and beside Rome in another message: while one message says both, both hold, whichever
    came first (the contradiction judged when Cid came alone does not count); removing that message is never
    having added it (Cid said alone is judged against Rome and ends). When the message saying both was not asked
    about (known as said together), a removal left Cid holding where never adding it ended it."""
    rome = ("Ann Smith WORKS_AT Rome since 2022.", "2024-01-01T00:00:00Z")
    cid = ("Ann Smith WORKS_AT Cid since 2017.", "2024-01-03T00:00:00Z")
    for together in (
        ("Ann Smith WORKS_AT Cid since 2017. Ann Smith WORKS_AT Rome since 2022.", "2024-01-02T00:00:00Z"),
        ("Ann Smith WORKS_AT Cid since 2017. Ann Smith WORKS_AT Rome since 2019.", "2024-01-02T00:00:00Z"),
    ):
        said = [rome, together, cid]
        histories = []
        for order in ((0, 1, 2), (0, 2, 1), (1, 2, 0), (2, 1, 0)):
            memory = new_memory(make_store(EMB.dim))
            for i in order:
                memory.add_episode(said[i][0], reference_time=said[i][1], group_id="g")
            histories.append(_history(memory))
            assert ("Ann Smith works at Cid", datetime(2017, 1, 1, tzinfo=UTC), None, False) in histories[-1]
        assert all(h == histories[0] for h in histories)
        removed = new_memory(make_store(EMB.dim))
        for i in (0, 1, 2):
            episode = removed.add_episode(said[i][0], reference_time=said[i][1], group_id="g").episode
            if i == 1:
                both = episode.id
        removed.remove_episode(both)
        never = new_memory(make_store(EMB.dim))
        for i in (0, 2):
            never.add_episode(said[i][0], reference_time=said[i][1], group_id="g")
        assert _history(removed) == _history(never)
        assert (
            "Ann Smith works at Cid",
            datetime(2017, 1, 1, tzinfo=UTC),
            datetime(2022, 1, 1, tzinfo=UTC),
            True,
        ) in _history(never)


#: A message of one person saying one to three things on one day: (who, [(relation, object, from, years), ...], day).
said_together = st.tuples(
    st.sampled_from(PEOPLE),
    st.lists(
        st.tuples(
            st.sampled_from(RELATIONS),
            st.sampled_from(OBJECTS),
            st.integers(2010, 2016),
            st.one_of(st.none(), st.integers(0, 3)),
        ),
        min_size=1,
        max_size=3,
    ),
    st.integers(0, 3),
)


def together_message(said: Any) -> tuple[str, datetime]:
    who, parts, day = said
    sentences = [
        f"I {rel} {what} since {year}" + ("" if span is None else f" until {year + span}")
        for rel, what, year, span in parts
    ]
    return f"{who}: " + ". ".join(sentences) + ".", datetime(2024, 1, 1 + day, tzinfo=UTC)


@SETTINGS
@given(history=st.lists(said_together, min_size=1, max_size=4), data=st.data())
def test_any_arrival_order_of_messages_saying_several_things_gives_the_same_history(
    make_store: Callable[[int], Store], history: list[Any], data: st.DataObject
) -> None:
    """Messages that say several things at once (facts said together, compatible while a message says both),
    in any arrival order (those of one day in their order: the later one is the newer word), and any one of them
    removed afterwards: the same history as in order, and as never having added the removed one."""
    note(f"history: {history!r}")
    items = [together_message(said) for said in history]

    def run(order: Sequence[int]) -> tuple[Memory, list[str]]:
        memory = new_memory(make_store(EMB.dim))
        ids = [memory.add_episode(items[i][0], reference_time=items[i][1], group_id="g").episode.id for i in order]
        for fact in memory.records(Kind.FACT):  # over every record
            assert isinstance(fact, Fact)
            assert fact.valid_at is None or fact.invalid_at is None or fact.invalid_at >= fact.valid_at, fact
            assert (fact.expired_at is None) == (fact.invalidated_by is None), fact
        return memory, ids

    queues: dict[datetime, list[int]] = {}
    for i, (_, when) in enumerate(items):
        queues.setdefault(when, []).append(i)
    arrival = [queues[items[i][1]].pop(0) for i in data.draw(st.permutations(range(len(items))))]
    in_order, ids = run(range(len(items)))
    shuffled, _ = run(arrival)
    assert canonical(shuffled) == canonical(in_order)
    gone = data.draw(st.integers(0, len(items) - 1))
    in_order.remove_episode(ids[gone])
    _, parts, _ = history[gone]
    others = [part for j, (_, said, _) in enumerate(history) if j != gone for part in said]
    if len(parts) > 1 and any(part in others for part in parts):
        # Known limit (README): a message saying two things together, each restated by a later message on its
        # own; once it is removed, the restatements were never judged against each other (a verbatim restatement
        # inherits its statement's verdicts), so both may hold where never adding it would have ended one.
        return
    never, _ = run([i for i in range(len(items)) if i != gone])
    assert canonical(in_order) == canonical(never)


def test_two_facts_of_one_message_shown_one_statement_each_keep_the_verdict_on_what_concerns_them(
    make_store: Callable[[int], Store],
) -> None:
    """ "Ann moved to Paris" said for 2011 only, then since 2010; then one message: Ann lives in Rome since 2010 and
    in Paris since 2012. Both new facts are shown the "moved to Paris" statement; Rome's contradiction must hold
    against both of its facts (both overlap Rome), though Paris-since-2012 concerns only the one since 2010. The
    facts a verdict applies to were kept per shown fact for the whole episode, so the second new fact's list
    replaced the first's: Rome's verdict named only the 2010 saying, and removing that message left Rome holding
    until 2012 where never adding it ends Rome in 2011 (found by the property test above in CI)."""
    history = [
        ("Ann", [("MOVED_TO", "Paris", 2011, 0)], 0),
        ("Ann", [("MOVED_TO", "Paris", 2010, None)], 0),
        ("Ann", [("LIVES_IN", "Rome", 2010, None), ("LIVES_IN", "Paris", 2012, None)], 0),
    ]
    items = [together_message(said) for said in history]

    def run(order: Sequence[int]) -> tuple[Memory, list[str]]:
        memory = new_memory(make_store(EMB.dim))
        return memory, [
            memory.add_episode(items[i][0], reference_time=items[i][1], group_id="g").episode.id for i in order
        ]

    removed, ids = run(range(3))
    removed.remove_episode(ids[1])
    never, _ = run([0, 2])
    assert canonical(removed) == canonical(never)
    rome = next(f for f in never.get_all("g", include_invalidated=True) if f.fact.lower() == "ann lives in rome")
    assert rome.invalid_at == datetime(2011, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("order", [(0, 1), (1, 0)], ids=["loves-last", "loves-first"])
def test_a_fact_the_same_as_two_statements_said_together_joins_both_in_any_arrival_order(
    make_store: Callable[[int], Store], order: tuple[int, int]
) -> None:
    """One message says Ann likes Paris and enjoys Paris (two statements: one message said both), another, a day
    later, that she loves Paris; the LLM double finds "loves" the same as each (LIKING). Arriving last, "loves" is
    shown both and the answer names both; arriving first, each of the others is asked about it. Either way the
    three are one statement. With one duplicate per answer (the old ``duplicate_of``), "loves" arriving last was
    joined to one of them only, and the history depended on the arrival order (135 of 1,500 histories of a
    differential fuzzer whose judge finds several candidates the same; 0 with every duplicate named)."""
    items = [
        together_message(("Ann", [("LIKES", "Paris", 2010, None), ("ENJOYS", "Paris", 2010, None)], 0)),
        together_message(("Ann", [("LOVES", "Paris", 2010, None)], 1)),
    ]
    memories = []
    for arrival in ((0, 1), order):
        memory = new_memory(make_store(EMB.dim))
        for i in arrival:
            memory.add_episode(items[i][0], reference_time=items[i][1], group_id="g")
        memories.append(memory)
    assert canonical(memories[0]) == canonical(memories[1])
    facts = memories[1].get_all("g", include_invalidated=True)
    assert len(facts) == 3 and sum(f.invalid_at is None for f in facts) == 1  # one statement, held by one fact
