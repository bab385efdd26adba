"""Pure core logic, no backend: fusion, time phrases, names, the bi-temporal visibility rules, seams."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import numpy as np
import pytest

from tkg import FixedClock, HashEmbedder, MemoryConfig, ScriptedLLM
from tkg.config import CommunityConfig
from tkg.drafts import speaker_of
from tkg.errors import BackendError, ConfigurationError, LLMError, TimestampError, ValidationError
from tkg.integrity import check_write, references
from tkg.journal import JournalPolicy
from tkg.llm import GraphExtraction, LLMPolicy, Prompt
from tkg.models import Entity, Fact, Kind, Mention, Verdict, relation_name
from tkg.names import normalize_name
from tkg.ranking import rrf
from tkg.resolution import ResolutionRules
from tkg.search_config import TargetConfig
from tkg.storage import Hit
from tkg.temporal import resolve_time
from tkg.timeline import fact_holds, make_scope
from tkg.timeutil import from_micros, to_micros, to_utc
from tkg.together import run_together

REF = datetime(2024, 3, 15, 12, 0, tzinfo=UTC)


def test_rrf_sums_reciprocal_ranks_with_constant():
    fused = rrf([[Hit("a", 0.9), Hit("b", 0.5)], [Hit("b", 3.0), Hit("c", 2.0)]], k=60)
    assert [h.id for h in fused] == ["b", "a", "c"]
    assert fused[0].score == pytest.approx(1 / 62 + 1 / 61)
    assert fused[1].score == pytest.approx(1 / 61)
    assert rrf([]) == []
    assert [h.id for h in rrf([[Hit("x", 1)], [Hit("y", 1)]])] == ["x", "y"]  # ties: first seen first


@pytest.mark.parametrize(
    ("phrase", "expected"),
    [
        ("two weeks ago", datetime(2024, 3, 1, tzinfo=UTC)),  # a day-granular phrase: midnight, not 12:00
        ("in 2019", datetime(2019, 1, 1, tzinfo=UTC)),
        ("2019", datetime(2019, 1, 1, tzinfo=UTC)),
        ("2023-05-01", datetime(2023, 5, 1, tzinfo=UTC)),
        ("now", REF),
        ("yesterday", datetime(2024, 3, 14, tzinfo=UTC)),
        ("next Thursday", datetime(2024, 3, 21, tzinfo=UTC)),
        ("last summer", datetime(2023, 6, 1, tzinfo=UTC)),
        ("2024-01-02T10:00:00Z", datetime(2024, 1, 2, 10, tzinfo=UTC)),
        ("not a date at all", None),
        ("", None),
        (None, None),
    ],
)
def test_time_phrases_resolve_against_reference(phrase, expected):
    assert resolve_time(phrase, REF) == expected


def test_last_season_said_during_that_season_is_the_previous_years():
    assert resolve_time("last summer", datetime(2024, 6, 1, 12, tzinfo=UTC)) == datetime(2023, 6, 1, tzinfo=UTC)
    assert resolve_time("last summer", datetime(2024, 10, 1, tzinfo=UTC)) == datetime(2024, 6, 1, tzinfo=UTC)


def test_timestamps_must_be_aware_and_sane():
    assert to_utc("2024-01-01T01:00:00+01:00") == datetime(2024, 1, 1, tzinfo=UTC)
    with pytest.raises(TimestampError, match="naive"):
        to_utc(datetime(2024, 1, 1))
    with pytest.raises(TimestampError):
        to_utc("2024-13-01T00:00:00Z")
    with pytest.raises(TimestampError):
        to_utc(12345)  # type: ignore[arg-type]
    # year 1 at +05:00 is before year 1 in UTC: named in ISO-8601, as a user wrote it (not a Python repr)
    with pytest.raises(TimestampError, match=r"reference_time 0001-01-01T00:00:00\+05:00 is outside the supported"):
        to_utc(datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=5))), "reference_time")
    t = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    assert from_micros(to_micros(t)) == t


def test_names_relations_speakers():
    assert normalize_name("  Dr.  ALICE   Smith ") == "dr. alice smith"
    assert normalize_name("Ｆｕｌｌｗｉｄｔｈ") == "fullwidth"
    assert relation_name("works at") == "WORKS_AT" and relation_name("!!") == "RELATES_TO"
    assert relation_name("3 times") == "R_3_TIMES"
    assert speaker_of("Caroline: hey!") == "Caroline" and speaker_of("no speaker here") is None
    assert speaker_of("Dr. Zoë Martin: hello") == "Dr. Zoë Martin" and speaker_of("assistant: hi") == "assistant"
    for label in ("Note: the meeting moved", "TODO: buy milk", "Step 2: boil water", "PS: bring snacks", "10: ten"):
        assert speaker_of(label) is None, label


def _fact(**kw) -> Fact:
    return Fact(
        id="f",
        group_id="g",
        source_id="a",
        target_id="b",
        relation="R",
        fact="x",
        created_at=datetime(2024, 1, 1, tzinfo=UTC),
        **kw,
    )


def test_bitemporal_visibility_rules():
    d = lambda m: datetime(2024, m, 1, tzinfo=UTC)  # noqa: E731
    # invalidated in world at March, the memory learnt it in May
    f = _fact(valid_at=d(1), invalid_at=d(3), expired_at=d(5))
    assert fact_holds(f, d(2), known_at=d(6))
    assert not fact_holds(f, d(4), known_at=d(6))
    assert fact_holds(f, d(4), known_at=d(4))  # in April the memory did not know it had ended
    # a historical fact recorded with both ends is known closed from the start
    g = _fact(valid_at=d(1), invalid_at=d(3))
    assert not fact_holds(g, d(4), known_at=d(1))
    now = d(7)
    assert not make_scope(now, ["g"]).admits(f)
    assert make_scope(now, ["g"], include_invalidated=True).admits(f)
    assert make_scope(now, ["g"], as_of=d(2)).admits(f)
    assert not make_scope(now, ["h"], include_invalidated=True).admits(f)
    assert not make_scope(now, ["g"], known_at=datetime(2023, 12, 1, tzinfo=UTC), include_invalidated=True).admits(f)


def test_records_validate_their_fields():
    with pytest.raises(ValidationError):
        _fact(valid_at=None).__class__(
            id="bad id!", group_id="g", source_id="a", target_id="b", relation="R", fact="x", created_at=REF
        )
    with pytest.raises(ValidationError, match="SCREAMING"):
        Fact(id="f", group_id="g", source_id="a", target_id="b", relation="works at", fact="x", created_at=REF)
    with pytest.raises(TimestampError):
        _fact(valid_at=REF, invalid_at=REF - timedelta(days=1))
    with pytest.raises(ValidationError):
        Entity(id="e", group_id="g", name="  ", created_at=REF)
    # A verdict is one of the three words (or the member itself); anything else is tkg's own error.
    fields = {"id": "f", "group_id": "g", "source_id": "a", "target_id": "b", "relation": "R", "fact": "x"}
    fact = Fact(**fields, created_at=REF, verdicts={"o1": "same", "o2": Verdict.CONTRADICTS})
    assert fact.verdicts == {"o1": Verdict.SAME, "o2": Verdict.CONTRADICTS}
    assert all(type(v) is Verdict for v in fact.verdicts.values())
    for bad in ("nope", ["same"], 3, None, "SAME"):
        with pytest.raises(ValidationError, match="verdict"):
            Fact(**fields, created_at=REF, verdicts={"o": bad})


def test_seams_are_deterministic():
    a, b = HashEmbedder(dim=32), HashEmbedder(dim=32)
    texts = ["Alice works at Acme", "Bob lives in Paris"]
    assert np.array_equal(a.embed(texts), b.embed(texts))
    assert np.allclose(np.linalg.norm(a.embed(texts), axis=1), 1.0)
    clock = FixedClock("2024-01-01T00:00:00Z", tick=timedelta(seconds=1))
    assert clock.now() < clock.now()
    llm = ScriptedLLM(handler=lambda p, m: {"entities": [{"name": p.inputs["who"]}]})
    out = llm.generate(Prompt("t", "", "", {"who": "Zoe"}), GraphExtraction)
    assert out.entities[0].name == "Zoe" and llm.calls[0].name == "t"
    with pytest.raises(LLMError):
        ScriptedLLM().generate(Prompt("t", "", ""), GraphExtraction)


# -- reads run together (tkg.together) -------------------------------------------------------------------------
def _pool_start(pool: ThreadPoolExecutor) -> Any:
    def start(drain: Callable[[], None], pending: Callable[[], bool], count: int) -> list[Future[None]]:
        return [pool.submit(drain) for _ in range(count)]

    return start


def test_reads_run_together_answer_in_order_on_the_caller_and_its_helpers():
    """Two reads that wait for each other pass only when read at once; the answers come in the order asked, and
    with no helper every read runs on the calling thread, one after the other."""
    barrier = threading.Barrier(2, timeout=10)
    threads: list[str] = []

    def read(value: int) -> Callable[[], int]:
        def run() -> int:
            threads.append(threading.current_thread().name)
            if value < 2:
                barrier.wait()
            return value

        return run

    with ThreadPoolExecutor(1, thread_name_prefix="helper") as pool:
        assert run_together([read(i) for i in range(5)], 1, _pool_start(pool)) == [0, 1, 2, 3, 4]
        assert len(set(threads)) == 2
        threads.clear()
        assert run_together([read(i) for i in range(2, 6)], 0, _pool_start(pool)) == [2, 3, 4, 5]
        assert set(threads) == {threading.current_thread().name}


def test_reads_run_together_raise_the_first_failure_in_order_and_begin_none_after_it():
    """Once a read has failed, no read not yet begun is begun; all begun ones end first; the error raised is the
    failed read earliest in order. A helper whose thread is busy elsewhere is not waited for."""
    begun: list[int] = []

    def read(i: int, fails: bool = False) -> Callable[[], int]:
        def run() -> int:
            begun.append(i)
            if fails:
                raise ValueError(f"read {i}")
            return i

        return run

    release = threading.Event()
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(release.wait, 30)  # the one helper thread, held up by another caller
        with pytest.raises(ValueError, match="read 1"):
            run_together([read(0), read(1, fails=True), read(2), read(3, fails=True)], 1, _pool_start(pool))
        assert begun == [0, 1]  # on the calling thread alone: the helper never began
        assert not busy.done()  # and was not waited for
        release.set()
        busy.result()


def test_the_integrity_check_asks_its_lookup_for_exactly_the_references_a_backend_may_read_ahead():
    """A backend that pays a round trip per lookup reads ``references`` before the check and answers from them
    (PostgreSQL): the check must ask for those ids and no others, once per kind, and still refuse what dangles."""
    now = datetime(2024, 1, 1, tzinfo=UTC)
    entity = Entity(id="c", group_id="g", name="C", created_at=now)
    puts = [
        _fact(),
        dataclasses.replace(_fact(), id="f2", source_id="c", target_id="d"),
        entity,
        Mention(episode_id="e1", entity_id="a", group_id="g", created_at=now),
    ]
    deletes = [(Kind.ENTITY, "c")]  # put and deleted in one write: deleted, so looked up like any other
    wanted = references(puts, deletes)
    assert wanted == {Kind.ENTITY: ["a", "b", "c", "d"], Kind.EPISODE: ["e1"]}
    asked: list[tuple[Kind, list[str]]] = []
    held = {"a": "g", "b": "g", "c": "g", "d": "g", "e1": "g"}

    def lookup(kind: Kind, ids):
        asked.append((kind, list(ids)))
        return {i: held[i] for i in ids if i in held}

    with pytest.raises(BackendError, match="entity 'c'"):  # c is deleted by the write: f2 would dangle
        check_write(puts, deletes, lookup)
    assert sorted(asked) == sorted(wanted.items())
    asked.clear()
    check_write(puts[:1] + puts[2:], deletes, lookup)
    assert sorted(asked) == sorted(references(puts[:1] + puts[2:], deletes).items())


@pytest.mark.parametrize(
    ("make", "field_value"),
    [
        ("MemoryConfig", {"context_episodes": float("nan")}),  # add_episode looped for ever (want *= 2)
        ("MemoryConfig", {"context_episodes": 2.5}),  # a raw TypeError from a slice
        ("MemoryConfig", {"max_fact_candidates": float("nan")}),
        ("MemoryConfig", {"max_episode_chars": float("nan")}),  # the limit was silently off
        ("MemoryConfig", {"search_limit": None}),
        ("MemoryConfig", {"strict_groups": "yes"}),
        ("MemoryConfig", {"llm_policy": {"max_attempts": 2}}),
        ("MemoryConfig", {"communities": 5}),
        ("MemoryConfig", {"date_languages": ("en", 3)}),
        ("LLMPolicy", {"max_attempts": float("nan")}),  # a failing LLM was retried for ever
        ("LLMPolicy", {"max_attempts": "3"}),
        ("LLMPolicy", {"backoff_max": float("inf")}),
        ("CommunityConfig", {"refresh_drift": float("nan")}),
        ("CommunityConfig", {"refresh_after_changes": 10.0}),
        ("ResolutionRules", {"fuzzy_threshold": float("nan")}),
        ("ResolutionRules", {"max_candidates": 0}),
        ("TargetConfig", {"min_score": float("nan")}),
        ("JournalPolicy", {"compact_bytes": float("nan")}),
    ],
)
def test_a_configuration_field_of_the_wrong_type_is_refused(make: str, field_value: dict[str, Any]) -> None:
    """NaN, a float for a count, None, text for a flag: refused when the configuration is made, naming the field,
    not found later by a loop that never ends or a raw TypeError."""
    classes = {c.__name__: c for c in (MemoryConfig, LLMPolicy, CommunityConfig, ResolutionRules, TargetConfig)}
    cls: Any = {**classes, "JournalPolicy": JournalPolicy}[make]
    (name,) = field_value
    with pytest.raises(ConfigurationError, match=rf"{make}\.{name}"):
        cls(**field_value)
    cls()  # the defaults hold
