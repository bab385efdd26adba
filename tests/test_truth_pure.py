"""Pure truth-maintenance logic: invalidation rules, resolution passes, profiles, ontology, drafts."""

from __future__ import annotations

import dataclasses
import enum
from datetime import UTC, datetime, timedelta, timezone

import pytest
from helpers_truth import state
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, Field, model_validator

from tkg import invalidation
from tkg.drafts import from_extraction, time_mentions
from tkg.errors import ConfigurationError, TimestampError
from tkg.llm.schema import ExtractedEntity, ExtractedFact, GraphExtraction
from tkg.models import Entity, Fact, Mention, Verdict
from tkg.ontology import Ontology, RelationType
from tkg.profiles import ALSO_NAMED, fold, merge_summary
from tkg.resolution import is_weak, judge
from tkg.revisions import Revision, revisions_of, with_revisions
from tkg.temporal import resolve_time
from tkg.timeutil import to_utc


def day(y: int, m: int = 1, d: int = 1) -> datetime:
    return datetime(y, m, d, tzinfo=UTC)


NOW = day(2024, 6, 1)


def fact(fid: str, s: str, rel: str, t: str, start: datetime | None, end: datetime | None = None) -> Fact:
    return Fact(
        id=fid,
        group_id="g",
        source_id=s,
        target_id=t,
        relation=rel,
        fact=f"{s} {rel} {t}",
        created_at=day(2024),
        valid_at=start,
        invalid_at=end,
    )


# -- invalidation -----------------------------------------------------------------------------------------------
LIVES_IN_ONCE = {"LIVES_IN", "WORKS_AT"}.__contains__  # single-valued in these tests


def settled(*facts: Fact, stated: dict[str, datetime] | None = None, now: datetime = NOW) -> dict[str, Fact]:
    when = {f.id: (stated or {}).get(f.id, day(2024)) for f in facts}
    return invalidation.history(list(facts), when, LIVES_IN_ONCE, now)


def test_history_gives_back_the_facts_it_does_not_change() -> None:
    """The planner skips the facts history() returns as given (the same object): a holding fact comes back as it
    was stored, whatever else it carries; one whose supersession is already recorded comes back too; a change of
    any temporal field is a new fact."""
    old = fact("a", "alice", "LIVES_IN", "paris", day(2019))
    odd = dataclasses.replace(fact("c", "alice", "LIKES", "tea", day(2018)), prior_invalid_at=day(2020))
    new = fact("b", "alice", "LIVES_IN", "berlin", day(2023))
    out = settled(old, odd, new)
    assert out["b"] is new and out["c"] is odd
    ended = out["a"]
    assert ended is not old and ended.invalidated_by == "b"
    again = settled(ended, odd, new, now=day(2025))
    assert again["a"] is ended and again["b"] is new and again["c"] is odd
    assert settled(ended, odd)["a"] == old  # its cause gone: holding again, a new value


def test_newer_fact_closes_the_older_one_at_its_start() -> None:
    old = fact("a", "alice", "LIVES_IN", "paris", day(2019))
    new = fact("b", "alice", "LIVES_IN", "berlin", day(2023))
    out = settled(old, new)
    assert out["b"] == new
    old2 = out["a"]
    assert old2.invalid_at == day(2023) and old2.expired_at == NOW and old2.invalidated_by == "b"
    assert old2.prior_invalid_at is None
    assert invalidation.as_stated(old2) == old
    # settling again changes nothing, not even the transaction time
    assert settled(out["a"], out["b"], now=day(2030)) == out


def test_late_arriving_fact_about_the_past_is_stored_already_invalidated() -> None:
    current = fact("a", "alice", "LIVES_IN", "berlin", day(2023))
    late = fact("b", "alice", "LIVES_IN", "paris", day(2019))
    out = settled(current, late)
    assert out["a"] == current
    late2 = out["b"]
    assert late2.invalid_at == day(2023) and late2.expired_at == NOW and late2.invalidated_by == "a"


def test_a_late_fact_inside_a_superseded_one_shortens_it() -> None:
    """Oslo (2000), then Rome (2002), then, arriving last, Lima (2001): Oslo ends in 2001, Lima in 2002."""
    oslo = fact("o", "ann", "LIVES_IN", "oslo", day(2000))
    rome = fact("r", "ann", "LIVES_IN", "rome", day(2002))
    before = settled(oslo, rome)
    lima = fact("l", "ann", "LIVES_IN", "lima", day(2001))
    out = settled(before["o"], before["r"], lima, now=day(2025))
    assert (out["o"].invalid_at, out["o"].invalidated_by) == (day(2001), "l")
    assert (out["l"].invalid_at, out["l"].invalidated_by) == (day(2002), "r")
    assert out["r"].invalid_at is None and out["r"].expired_at is None
    assert out["o"].expired_at == day(2025)  # learnt again: its end changed


def test_non_overlapping_facts_do_not_invalidate_each_other() -> None:
    old = fact("a", "alice", "LIVES_IN", "paris", day(2010), day(2012))
    new = fact("b", "alice", "LIVES_IN", "berlin", day(2015))
    assert settled(old, new) == {"a": old, "b": new}


def test_a_tie_in_world_time_goes_to_the_newer_statement() -> None:
    old = fact("a", "alice", "LIVES_IN", "paris", day(2020))
    new = fact("b", "alice", "LIVES_IN", "berlin", day(2020))
    out = settled(old, new, stated={"a": day(2021), "b": day(2022)})
    assert out["a"].invalid_at == day(2020) and out["a"].invalidated_by == "b" and out["b"].expired_at is None
    swapped = settled(old, new, stated={"a": day(2022), "b": day(2021)})
    assert swapped["b"].invalidated_by == "a" and swapped["a"].expired_at is None


@pytest.mark.parametrize("berlin_learnt_later", [True, False])
def test_a_tie_in_world_and_statement_time_goes_to_the_fact_learnt_later(berlin_learnt_later: bool) -> None:
    """Two homes from one start, stated at one time (messages of one session, stamped with its date): the fact the
    memory learnt later is the newer word. The sentence decided, so "lives in Paris" always beat "lives in Berlin"."""
    paris = dataclasses.replace(fact("a", "alice", "LIVES_IN", "paris", day(2020)), created_at=day(2024, 1, 1))
    berlin = dataclasses.replace(fact("b", "alice", "LIVES_IN", "berlin", day(2020)), created_at=day(2024, 1, 2))
    if not berlin_learnt_later:
        paris, berlin = dataclasses.replace(paris, created_at=day(2024, 1, 3)), berlin
    out = settled(paris, berlin)
    newer, older = ("b", "a") if berlin_learnt_later else ("a", "b")
    assert out[newer].invalidated_by is None and out[older].invalidated_by == newer


def test_an_older_fact_with_its_own_end_keeps_it_for_restoring() -> None:
    old = fact("a", "alice", "WORKS_AT", "acme", day(2010), day(2030))
    new = fact("b", "alice", "WORKS_AT", "initech", day(2020))
    old2 = settled(old, new)["a"]
    assert old2.invalid_at == day(2020) and old2.prior_invalid_at == day(2030)
    assert invalidation.own_end(old2) == day(2030)
    assert settled(old2)["a"] == old  # without its cause, it is as stated again


def test_a_restatement_while_the_statement_holds_is_kept_empty_and_linked() -> None:
    first = fact("a", "alice", "LIKES", "tea", day(2019))
    again = fact("b", "alice", "LIKES", "tea", day(2021))
    out = settled(again, first)
    assert out["a"] == first
    assert (out["b"].valid_at, out["b"].invalid_at, out["b"].invalidated_by) == (day(2021), day(2021), "a")
    # once something ends the first statement before it, the restatement holds again
    gone = fact("c", "alice", "LIKES", "coffee", day(2020))
    gone = dataclasses.replace(gone, verdicts={"a": Verdict.CONTRADICTS})
    out = settled(first, again, gone)
    assert out["a"].invalidated_by == "c" and out["c"].invalidated_by == "b" and out["b"].expired_at is None


def test_verdicts_carry_over_within_a_statement() -> None:
    paris = fact("p", "ann", "LIVES_IN_CITY", "paris", day(2000))
    berlin = dataclasses.replace(fact("b", "ann", "MOVED_TO", "berlin", day(2005)), verdicts={"p": Verdict.CONTRADICTS})
    paris_again = fact("p2", "ann", "LIVES_IN_CITY", "paris", day(2008))  # verbatim: the same statement as p
    out = settled(paris, berlin, paris_again)
    assert out["p"].invalidated_by == "b" and out["b"].invalidated_by == "p2" and out["p2"].expired_at is None


def _changed(before: list[Fact], after: dict[str, Fact]) -> dict[str, tuple[object, ...]]:
    """What history() changed, fact by fact (it gives back the others as the same objects)."""
    given = {f.id: f for f in before}
    return {i: state(f) for i, f in after.items() if f is not given[i]}


def _holds(fact: Fact, at: datetime) -> bool:
    end = invalidation.own_end(fact)
    return end is None or end > at


SPANS = st.lists(
    st.tuples(st.integers(0, 4), st.integers(2000, 2010), st.one_of(st.none(), st.integers(0, 4))), max_size=8
)


@settings(max_examples=300, deadline=None)
@given(said=SPANS, value=st.integers(0, 6), year=st.integers(2006, 2013))
def test_a_value_coming_last_ends_in_its_slot_what_the_whole_history_would(
    said: list[tuple[int, int, int | None]], value: int, year: int
) -> None:
    """ended_in_slot (a value of a single-valued relation, settled from its slot alone) changes what settling the
    slot with it changes, and applies whenever the value comes after every fact of the slot, unless it restates a
    value holding at its start with an end of its own."""
    slot = [
        fact(f"f{i}", "ann", "LIVES_IN", f"city{c}", day(y), None if span is None else day(y + span))
        for i, (c, y, span) in enumerate(said)
    ]
    stored = list(settled(*slot, now=day(2024, 3)).values())
    new = fact("new", "ann", "LIVES_IN", f"city{value}", day(year, 7))
    fast = invalidation.ended_in_slot(new, stored, [], LIVES_IN_ONCE, NOW)
    start = new.valid_at
    assert start is not None
    holding = [f for f in stored if f.invalidated_by is None and _holds(f, start)]
    restated = [f for f in holding if f.target_id == new.target_id]
    last = all(f.valid_at is not None and f.valid_at < start for f in stored)
    assert (fast is not None) == (
        last and (not restated or (len(holding) == 1 and invalidation.own_end(holding[0]) is None))
    )
    if fast is not None:
        expected = _changed([*stored, new], settled(*stored, new))
        assert {i: state(f) for i, f in fast.items()} == expected


@settings(max_examples=300, deadline=None)
@given(said=SPANS, year=st.integers(2006, 2013))
def test_a_statement_said_again_last_is_settled_from_its_facts_as_the_whole_history_would(
    said: list[tuple[int, int, int | None]], year: int
) -> None:
    """restated_last (a verbatim restatement settled from its statement's facts alone) changes what settling the
    statement with it changes, and applies whenever it comes after every saying and at most one saying holds at
    its start, without an end of its own."""
    statement = [
        fact(f"f{i}", "ann", "KNOWS", "bob", day(y), None if span is None else day(y + span))
        for i, (_, y, span) in enumerate(said)
    ]
    stored = list(settled(*statement, now=day(2024, 3)).values())
    new = fact("new", "ann", "KNOWS", "bob", day(year, 7))
    fast = invalidation.restated_last(new, stored, [], LIVES_IN_ONCE, NOW)
    start = new.valid_at
    assert start is not None
    holding = [f for f in stored if f.invalidated_by is None and _holds(f, start)]
    plain = stored and all(f.valid_at is not None and f.valid_at < start for f in stored)
    assert (fast is not None) == bool(
        plain and (not holding or (len(holding) == 1 and invalidation.own_end(holding[0]) is None))
    )
    if fast is not None:
        expected = _changed([*stored, new], settled(*stored, new))
        assert {i: state(f) for i, f in fast.items()} == expected
        assert [f.invalidated_by for f in fast.values()] == [h.id for h in holding]  # restated, or holds


def test_settling_from_the_slot_or_the_statement_gives_way_to_the_whole_history() -> None:
    """Each case ended_in_slot and restated_last leave to the whole history: a value or saying that does not come
    after every other, a value restated while it holds with an end of its own, a verdict linking the slot or
    statement to another fact (held by one of its facts, by the new one, or naming one of its facts), a fact
    ended by one outside it, a new fact without a start."""
    paris = fact("p", "ann", "LIVES_IN", "paris", day(2010))
    rome = fact("r", "ann", "LIVES_IN", "rome", day(2015))
    ended = settled(paris, rome)
    slot = [ended["p"], ended["r"]]
    oslo = fact("o", "ann", "LIVES_IN", "oslo", day(2020))
    assert invalidation.ended_in_slot(oslo, slot, [], LIVES_IN_ONCE, NOW) == {
        "r": settled(ended["p"], ended["r"], oslo)["r"]
    }
    early = fact("o", "ann", "LIVES_IN", "oslo", day(2012))
    until = list(settled(paris, fact("r", "ann", "LIVES_IN", "rome", day(2015), day(2030))).values())
    again = fact("o", "ann", "LIVES_IN", "rome", day(2020))  # restating a value that holds with an end of its own
    judged = dataclasses.replace(oslo, verdicts={"x": Verdict.CONTRADICTS})
    judging = fact("x", "ann", "LIKES", "rome", day(2016))
    judging = dataclasses.replace(judging, verdicts={"r": Verdict.SAME})
    outside = dataclasses.replace(ended["p"], invalidated_by="x")
    for new, facts, judges in [
        (early, slot, []),
        (again, until, []),
        (judged, slot, []),
        (oslo, slot, [judging]),
        (oslo, [outside, ended["r"]], []),
        (dataclasses.replace(oslo, valid_at=None), slot, []),
    ]:
        assert invalidation.ended_in_slot(new, facts, judges, LIVES_IN_ONCE, NOW) is None
    knows = [fact("k1", "ann", "KNOWS", "bob", day(2010)), fact("k2", "ann", "KNOWS", "bob", day(2012))]
    stored = list(settled(*knows).values())
    again = fact("k3", "ann", "KNOWS", "bob", day(2014))
    assert invalidation.restated_last(again, stored, [], LIVES_IN_ONCE, NOW)["k3"].invalidated_by == "k1"  # type: ignore[index]
    for new, facts, judges in [
        (dataclasses.replace(again, valid_at=day(2011)), stored, []),
        (dataclasses.replace(again, verdicts={"z": Verdict.SAME}), stored, []),
        (again, stored, [dataclasses.replace(judging, verdicts={"k2": Verdict.CONTRADICTS})]),
        (again, [dataclasses.replace(stored[0], verdicts={"z": Verdict.CONTRADICTS}), stored[1]], []),
        (dataclasses.replace(again, relation="LIVES_IN"), stored, []),
    ]:
        assert invalidation.restated_last(new, facts, judges, LIVES_IN_ONCE, NOW) is None


def test_ending_from_the_contradicted_facts_gives_way_when_a_revision_names_a_fact_outside_them() -> None:
    """ended_by_last settles the facts a new one contradicts from them alone; a revision of one of them (an earlier
    supersession) whose cause is none of the facts it was given may name a fact no longer linked to it (what linked
    them was removed): the whole history drops such a revision, whether or not the new fact ends the fact holding
    it, so the sweep is left to it. A revision by a fact it was given is kept, as the whole history keeps it."""
    tea = fact("t", "ann", "LIKES", "tea", day(2010))
    once = fact("o", "ann", "DISLIKES", "tea", day(2008), day(2009))  # contradicted too, long over
    hates = dataclasses.replace(
        fact("n", "ann", "HATES", "tea", day(2018)), verdicts={"t": Verdict.CONTRADICTS, "o": Verdict.CONTRADICTS}
    )
    said = {f.id: (f.valid_at or day(2000), f.created_at) for f in (tea, once, hates)}
    for cause, kept in (("gone", False), ("o", True)):
        revised = dataclasses.replace(
            tea, attributes=with_revisions({}, [Revision(day(2015), cause, day(2020), day(2021))])
        )
        whole = settled(revised, once, hates)
        assert bool(revisions_of(whole["t"])) is kept
        fast = invalidation.ended_by_last(hates, [revised, once], {}, said, LIVES_IN_ONCE, NOW)
        assert (fast is None) if not kept else (fast == {"t": whole["t"]})
    # the same revision on a contradicted fact the new one does not end (over before it starts)
    over = dataclasses.replace(
        once, attributes=with_revisions({}, [Revision(day(2008, 6), "gone", day(2020), day(2021))])
    )
    assert not revisions_of(settled(tea, over, hates)["o"])
    assert invalidation.ended_by_last(hates, [tea, over], {}, said, LIVES_IN_ONCE, NOW) is None


def test_candidates_share_the_pair_or_an_endpoint_and_the_relation_and_overlap() -> None:
    new = fact("n", "alice", "LIVES_IN", "berlin", day(2023))
    assert invalidation.may_concern(new, fact("1", "alice", "LIVES_IN", "paris", None))
    assert invalidation.may_concern(new, fact("2", "berlin", "LIKES", "alice", None))  # same pair, reversed
    assert not invalidation.may_concern(new, fact("3", "alice", "LIKES", "pizza", None))
    assert invalidation.may_concern(new, fact("3", "alice", "LIKES", "pizza", None), similar=True)
    assert not invalidation.may_concern(new, fact("4", "bob", "LIVES_IN", "rome", None))
    assert not invalidation.may_concern(new, fact("5", "alice", "LIVES_IN", "rome", day(2010), day(2012)))
    superseded = settled(
        fact("6", "alice", "LIVES_IN", "oslo", day(2020)), fact("7", "alice", "LIVES_IN", "x", day(2021))
    )
    assert invalidation.may_concern(new, superseded["6"])  # superseded, but its own interval is open


# -- resolution -------------------------------------------------------------------------------------------------
def entity(eid: str, name: str, *aliases: str) -> Entity:
    return Entity(id=eid, group_id="g", name=name, created_at=day(2024), aliases=aliases)


def test_exact_and_alias_matches_resolve_without_asking() -> None:
    bob = entity("b", "Robert Smith", "Bob")
    assert judge("robert  SMITH", [bob]).match == "b"
    assert judge("Bob", [bob]).reason == "exact"


def test_fuzzy_match_merges_strong_names_only() -> None:
    assert judge("Katherine Johnson", [entity("k", "Katherine Johnsen")]).reason in {"fuzzy", "ambiguous"}
    assert judge("Bartholomew Simpson", [entity("b", "Bartholomew Simpsons")]).match == "b"
    # a weak name is never merged by fuzzy similarity alone
    assert is_weak("Al") and judge("Al", [entity("a", "Al.")]).match == "a"  # exact after normalisation
    assert judge("Ann", [entity("a", "Anne")]).match is None
    # names whose numbers differ are distinct entities as often as not: related (the LLM decides), never merged
    for name, other in [
        ("Robert Smith12", "Robert Smith1"),
        ("Flight BA1170", "Flight BA117"),
        ("Agent 007", "Agent 7"),
    ]:
        verdict = judge(name, [entity("r", other)])
        assert verdict.match is None and [c.id for c in verdict.ambiguous] == ["r"], (name, other)
    assert judge("Constantinople Bartholomew 42nd", [entity("b", "Constantinople Bartholomew 42")]).match == "b"
    # the same numbers in another script; a form with the same numbers that is not the closest form
    assert judge("Flight ＢＡ１１７ London Heathrowe", [entity("f", "Flight BA117 London Heathrow")]).match == "f"
    # Roman numerals are numbers too (as their value), words that only look like one are not
    assert judge("Jonathan Smithson III", [entity("j", "Jonathan Smithson II")]).match is None
    henry = entity("h", "Constantinople Bartholomew Henry VIII")
    assert judge("Constantinople Bartholomew Henryy VIII", [henry]).match == "h"
    assert judge("Constantinople MIXER Hall", [entity("m", "Constantinople MIXER Halls")]).match == "m"
    station = entity("s", "Constantinople Bartholomew Station 12 Old", "Constantinople Bartholomew Station 1")
    assert judge("Constantinople Bartholomew Station 12", [station]).match == "s"


def test_related_names_are_ambiguous_and_unrelated_ones_new() -> None:
    verdict = judge("Alice", [entity("a", "Alice Smith"), entity("c", "Carol")])
    assert verdict.match is None and [c.id for c in verdict.ambiguous] == ["a"]
    assert judge("Zanzibar", [entity("a", "Alice Smith")]).reason == "new"


# -- profiles ---------------------------------------------------------------------------------------------------
def mention(ep: str, name: str, summary: str = "", label: str = "") -> Mention:
    return Mention(ep, "e", "g", day(2024), name=name, summary=summary, label=label)


def test_profile_keeps_the_most_complete_name_and_every_other_form_as_alias() -> None:
    base = entity("e", "x")
    profile = fold(base, [mention("1", "Alice", "Alice is a nurse."), mention("2", "Alice Smith", "", "Person")])
    assert profile.name == "Alice Smith" and profile.aliases == ("Alice",)
    assert profile.labels == ("Entity", "Person") and profile.summary == "Alice is a nurse."


def test_summary_drops_the_oldest_sentences_beyond_the_cap() -> None:
    text = ""
    for i in range(50):
        text = merge_summary(text, f"Sentence number {i} about Alice.", max_chars=120)
    assert len(text) <= 120 and text.endswith("Sentence number 49 about Alice.")


# -- ontology ---------------------------------------------------------------------------------------------------
class Person(BaseModel):
    """A human being."""

    age: int | None = Field(None, description="Age in years")


def test_ontology_validates_attributes_and_declarations() -> None:
    onto = Ontology(entities={"Person": Person}, relations={"LIVES_IN": RelationType(single_valued=True)})
    kept, warnings = onto.entity_attributes("Person", {"age": "41", "shoe": 9})
    assert kept == {"age": 41} and len(warnings) == 1
    kept, warnings = onto.entity_attributes("Person", {"age": "old"})
    assert kept == {} and "invalid" in warnings[0]
    with pytest.raises(ConfigurationError):
        Ontology(relations={"lives in": RelationType()})
    with pytest.raises(ConfigurationError):
        Ontology(entities={"Person": dict})  # type: ignore[dict-item]
    with pytest.raises(ConfigurationError):
        Ontology(relations={"LIVES_IN": RelationType(sources=("Robot",))})


class Colour(enum.Enum):
    RED = "red"


class Address(BaseModel):
    city: str


class Job(BaseModel):
    """A job, whose own validator reads two attributes."""

    title: str
    level: int | None = None
    colour: Colour | None = None
    address: Address | None = None
    tags: set[str] | None = None
    since: datetime | None = None

    @model_validator(mode="after")
    def senior(self) -> Job:
        if self.level and self.level > 5 and not self.title.startswith("Senior"):
            raise ValueError("a level above 5 needs a Senior title")
        return self


def test_attributes_are_validated_together_and_kept_in_their_json_form() -> None:
    """The model's own validators see every attribute given (one at a time, a validator reading another attribute
    crashed the episode); values are kept as pydantic writes them in JSON (an enum's value, a model's fields, a
    set as a list, a date in ISO form), not as Python's text of them; and when all together fail, the valid ones
    are kept one at a time, the rest dropped with a warning."""
    onto = Ontology(entities={"Job": Job})
    given = {
        "title": "Senior Nurse",
        "level": 7,
        "colour": "red",
        "address": {"city": "Oslo"},
        "tags": ["x"],
        "since": "1990-01-02T03:04:05Z",
    }
    kept, warnings = onto.entity_attributes("Job", given)
    assert warnings == []
    assert kept == {**given, "since": "1990-01-02T03:04:05Z"}
    assert Job.model_validate(kept).level == 7  # what is kept validates again
    kept, warnings = onto.entity_attributes("Job", {"level": 7, "colour": "blue"})  # no title: checked one by one
    assert kept == {} and len(warnings) == 2 and "level=7" in warnings[0] and "colour='blue'" in warnings[1]
    kept, _ = onto.entity_attributes("Job", {"level": 3, "colour": "blue"})
    assert kept == {"level": 3}


def test_a_relation_type_is_checked_when_declared() -> None:
    with pytest.raises(ConfigurationError, match="tuple of entity type names"):
        RelationType(sources="Person")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="True or False"):
        RelationType(single_valued="no")  # type: ignore[arg-type]
    assert RelationType(targets=["Person"]).targets == ("Person",)  # type: ignore[arg-type]


def test_ontology_reports_data_that_breaks_a_single_valued_relation() -> None:
    onto = Ontology(relations={"LIVES_IN": RelationType(single_valued=True)})
    both = [fact("a", "alice", "LIVES_IN", "paris", day(2019)), fact("b", "alice", "LIVES_IN", "rome", day(2020))]
    assert len(onto.conflicts(both)) == 1
    apart = [fact("a", "alice", "LIVES_IN", "paris", day(2019), day(2020)), both[1]]
    assert onto.conflicts(apart) == []


# -- drafts -----------------------------------------------------------------------------------------------------
def test_draft_repairs_what_the_extraction_got_wrong() -> None:
    extraction = GraphExtraction(
        entities=[ExtractedEntity(name="Alice"), ExtractedEntity(name="  ")],
        facts=[
            ExtractedFact(source="Alice", target="Acme", relation="works at", fact="Alice works at Acme"),
            ExtractedFact(source="", target="Acme", relation="X", fact="nothing"),
            ExtractedFact(
                source="Alice",
                target="Rome",
                relation="LIVED_IN",
                fact="Alice lived in Rome",
                valid_from="2020-05-01",
                valid_until="2019-01-01",
            ),
            ExtractedFact(
                source="Ann",
                target="Initech",
                relation="FOUNDED",
                fact="Ann, Bo and Cy founded Initech",
                extra_sources=["Bo", "Cy"],
                valid_from="the day after never",
            ),
        ],
    )
    draft = from_extraction(extraction, "Zed", day(2024, 5, 1))
    names = [e.name for e in draft.entities]
    assert names[:2] == ["Zed", "Alice"] and {"Acme", "Rome", "Ann", "Bo", "Cy", "Initech"} <= set(names)
    assert [f.relation for f in draft.facts] == ["WORKS_AT", "LIVED_IN", "FOUNDED", "FOUNDED", "FOUNDED"]
    assert draft.facts[0].valid_at == day(2024, 5, 1)  # present tense: the reference time
    assert draft.facts[1].valid_at == day(2020, 5, 1) and draft.facts[1].invalid_at is None
    text = " ".join(draft.warnings)
    for expected in ("empty name", "empty source", "not extracted", "before its start", "could not date"):
        assert expected in text


def test_a_missing_or_unreadable_date_never_makes_a_fact_hold_forever_back() -> None:
    """An empty or unreadable end is no end: the fact is true as of the episode, as with none (it lost its start,
    and held in every past view). An unreadable start is the episode's time, as its warning says, unless the end
    comes before the episode. An end naming the same period as the start ends with that period (it was an empty
    interval, a fact that never held)."""
    ref = datetime(2024, 6, 30, 20, tzinfo=timezone(timedelta(hours=-4)))

    def dated(start: str | None, end: str | None) -> tuple[datetime | None, datetime | None, list[str]]:
        said = ExtractedFact(
            source="Bob",
            target="Oslo",
            relation="LIVES_IN",
            fact="Bob lives in Oslo",
            valid_from=start,
            valid_until=end,
        )
        draft = from_extraction(GraphExtraction(entities=[], facts=[said]), "Bob", ref)
        return draft.facts[0].valid_at, draft.facts[0].invalid_at, draft.warnings

    now = to_utc(ref)
    assert dated(None, "")[:2] == dated(None, "   ")[:2] == (now, None)
    assert dated(None, "never")[:2] == dated(None, "not sure")[:2] == (now, None)
    assert any("could not date the end 'not sure'" in w for w in dated(None, "not sure")[2])
    assert dated("a while back", "2030")[:2] == (now, day(2030))
    assert "used the episode time" in " ".join(dated("a while back", "2030")[2])
    start, end, warnings = dated("a while back", "2019")
    assert (start, end) == (None, day(2019)) and "left it unknown" in " ".join(warnings)
    assert dated(None, "2019")[:2] == (None, day(2019))  # no start said, an end: since forever, as before
    assert dated("2019", "2019")[:2] == (day(2019), day(2020))
    assert dated("in March 2020", "March 2020")[:2] == (day(2020, 3, 1), day(2020, 4, 1))
    assert dated("2019-05-01", "May 2019")[:2] == (day(2019, 5, 1), day(2019, 6, 1))
    assert dated("2019", "2021")[:2] == (day(2019), day(2021))  # another period: as said
    assert dated("Q3 2021", "Q3 2021")[:2] == (day(2021, 7, 1), day(2021, 10, 1))
    assert dated("2019-03", "2019-03")[:2] == (day(2019, 3, 1), day(2019, 4, 1))


def test_time_phrases_resolve_against_the_reference_time() -> None:
    ref = day(2024, 5, 15)  # a Wednesday
    assert resolve_time("two weeks ago", ref) == day(2024, 5, 1)
    assert resolve_time("in 2019", ref) == day(2019)
    assert resolve_time("last summer", ref) == day(2023, 6, 1)
    assert resolve_time("next Thursday", ref) == day(2024, 5, 16)
    assert resolve_time("now", ref) == ref
    assert resolve_time("March 3rd, 2021", ref) == day(2021, 3, 3)
    assert resolve_time("the day after never", ref) is None
    with pytest.raises(TimestampError):
        resolve_time("two weeks ago", None)  # type: ignore[arg-type]
    found = {m["phrase"]: m["at"][:10] for m in time_mentions("Yesterday I saw Bob; in 2019 too.", ref)}
    assert found == {"Yesterday": "2024-05-14", "in 2019": "2019-01-01"}


def test_common_relative_phrases_use_exact_calendar_arithmetic() -> None:
    ref = datetime(2024, 3, 31, 13, 45, tzinfo=UTC)
    assert resolve_time("a month ago", ref) == day(2024, 2, 29)  # clamped to the month's last day
    assert resolve_time("one year ago", ref) == day(2023, 3, 31)
    assert resolve_time("in 2 weeks", ref) == day(2024, 4, 14)
    assert resolve_time("3 hours ago", ref) == datetime(2024, 3, 31, 10, 45, tzinfo=UTC)  # keeps the time of day
    assert resolve_time("last month", ref) == day(2024, 2, 1) and resolve_time("next year", ref) == day(2025)
    assert resolve_time("yesterday", ref) == day(2024, 3, 30) and resolve_time("a couple of days ago", ref) == day(
        2024, 3, 29
    )
    assert resolve_time("9999 years ago", ref) is None  # out of the calendar: nothing, not a crash


def _component_by_pairs(seeds: list[str], facts: list[Fact], single: set[str]) -> set[str]:
    """The definition of invalidation.component, pair by pair (quadratic; the oracle)."""

    def linked(a: Fact, b: Fact) -> bool:
        if (a.verdicts.get(b.id) not in (None, Verdict.COMPATIBLE)) or (
            b.verdicts.get(a.id) not in (None, Verdict.COMPATIBLE)
        ):
            return True
        if (a.source_id, a.relation) != (b.source_id, b.relation):
            return False
        return a.relation in single or (
            a.target_id == b.target_id and invalidation.text_key(a.fact) == invalidation.text_key(b.fact)
        )

    seen = {s for s in seeds if any(f.id == s for f in facts)}
    grew = True
    while grew:
        grew = False
        for f in facts:
            if f.id not in seen and any(linked(f, g) for g in facts if g.id in seen):
                seen.add(f.id)
                grew = True
    return seen


def test_component_links_the_same_facts_as_the_pairwise_definition() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    fact_st = st.tuples(
        st.sampled_from("ab"),
        st.sampled_from(["LIKES", "LIVES_IN"]),
        st.sampled_from("xyz"),
        st.sampled_from(["Ann likes tea", "ann likes tea.", "Ann likes coffee"]),
    )

    @settings(max_examples=200, deadline=None)
    @given(
        rows=st.lists(fact_st, min_size=1, max_size=9),
        verdicts=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8), st.sampled_from(list(Verdict))), max_size=6),
        single=st.sets(st.sampled_from(["LIKES", "LIVES_IN"])),
        seed=st.integers(0, 8),
    )
    def check(rows, verdicts, single, seed) -> None:  # type: ignore[no-untyped-def]
        judged: dict[int, dict[str, Verdict]] = {}
        for a, b, v in verdicts:
            if a < len(rows) and b < len(rows) and a != b:
                judged.setdefault(a, {})[f"f{b}"] = v
        facts = [
            Fact(
                id=f"f{i}",
                group_id="g",
                source_id=s,
                target_id=t,
                relation=r,
                fact=text,
                created_at=NOW,
                verdicts=judged.get(i, {}),
            )
            for i, (s, r, t, text) in enumerate(rows)
        ]
        found = {f.id for f in invalidation.component([f"f{seed}"], facts, single.__contains__)}
        assert found == _component_by_pairs([f"f{seed}"], facts, single)

    check()


def _conflicts_by_pairs(facts: list[Fact], classes: object, single: set[str]) -> set[tuple[str, str]]:
    """The contradicting pairs of statements listed pair by pair (quadratic; the oracle of Conflicts): judged
    contradictions between statements no episode says both of, and two objects of one single-valued subject."""
    find = classes.find  # type: ignore[attr-defined]
    said: dict[str, set[str]] = {}
    for f in facts:
        said.setdefault(find(f.id), set()).update(f.episodes)
    known = {f.id: f for f in facts}
    pairs = [
        (a.id, b_id)
        for a in facts
        for b_id in a.verdicts
        if b_id in known
        and invalidation.verdict_between(a, known[b_id]) == Verdict.CONTRADICTS
        and said[find(a.id)].isdisjoint(said[find(b_id)])
    ]
    pairs += [
        (a.id, b.id)
        for a in facts
        for b in facts
        if a.relation in single
        and (a.source_id, a.relation) == (b.source_id, b.relation)
        and a.target_id != b.target_id
    ]
    return {(find(a), find(b)) for a, b in pairs if find(a) != find(b)} | {
        (find(b), find(a)) for a, b in pairs if find(a) != find(b)
    }


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.sampled_from("ab"), st.sampled_from(["LIKES", "LIVES_IN"]), st.sampled_from("xyz"),
                  st.sampled_from(["Ann likes tea", "Ann likes coffee"]), st.sets(st.sampled_from(["e1", "e2", "e3"]))),
        min_size=1,
        max_size=9,
    ),
    verdicts=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8), st.sampled_from(list(Verdict))), max_size=8),
    single=st.sets(st.sampled_from(["LIKES", "LIVES_IN"])),
)  # fmt: skip
def test_statements_conflict_as_the_pairwise_definition(
    rows: list[tuple[str, str, str, str, set[str]]], verdicts: list[tuple[int, int, Verdict]], single: set[str]
) -> None:
    """Conflicts answers for every pair of statements what listing the contradicting pairs one by one gives (a
    single-valued relation's conflicts are not listed: a value changed N times would be N^2 / 2 pairs)."""
    judged: dict[int, dict[str, Verdict]] = {}
    for a, b, v in verdicts:
        if a < len(rows) and b < len(rows) and a != b:
            judged.setdefault(a, {})[f"f{b}"] = v
    facts = [
        Fact(id=f"f{i}", group_id="g", source_id=s, target_id=t, relation=r, fact=text, created_at=NOW,
             episodes=tuple(sorted(eps)), verdicts=judged.get(i, {}))
        for i, (s, r, t, text, eps) in enumerate(rows)
    ]  # fmt: skip
    classes, conflicts = invalidation.statements(facts, single.__contains__)
    roots = {classes.find(f.id) for f in facts}
    expected = _conflicts_by_pairs(facts, classes, single)
    assert {(a, b) for a in roots for b in roots if (a, b) in conflicts} == expected


SENTENCES = st.lists(
    st.sampled_from(
        ["Alice is a nurse.", "alice is a nurse!", "She lives in Paris.", "Mr. Smith is her boss.", "Dr. Who?",
         "Bob moved to the U.S. last year.", "J. R. R. Tolkien wrote it!", "She likes tea."]
    ),
    max_size=6,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(first=SENTENCES, second=SENTENCES)
def test_a_summary_takes_several_sentences_as_it_takes_them_one_by_one(first: list[str], second: list[str]) -> None:
    """merge_summary of a text of several sentences gives what merging its sentences one after the other does, so
    a summary given again is not appended again (each repeat of a two-sentence summary was appended whole), and
    a title's full stop ends no sentence."""
    base = " ".join(first)
    together = merge_summary(base, " ".join(second))
    one_by_one = base
    for sentence in second:
        one_by_one = merge_summary(one_by_one, sentence)
    assert together == one_by_one
    assert merge_summary(together, " ".join(second)) == together
    assert merge_summary(together, " ".join(first)) == together


def test_two_names_of_one_episode_for_one_entity_both_stay_in_its_profile() -> None:
    """One mention of an episode that named an entity twice keeps both names (ALSO_NAMED): the second becomes
    an alias (or the name), as when it comes alone, and none of it becomes an attribute."""
    merged = Mention(
        "1", "e", "g", day(2024), name="Robert", summary="Robert is a chef. Bob moved to Oslo.",
        attributes={ALSO_NAMED: ["Bob Smith"], "age": 41},
    )  # fmt: skip
    profile = fold(entity("e", "x"), [mention("0", "Robert", "Robert is a chef."), merged])
    assert (profile.name, profile.aliases) == ("Bob Smith", ("Robert",))
    assert profile.summary == "Robert is a chef. Bob moved to Oslo." and dict(profile.attributes) == {"age": 41}
