"""Prompt builders. An episode costs one extraction call, plus one batched resolution call only when some name
or fact is ambiguous (and one reflection call when that optional pass is switched on)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tkg.llm.base import Prompt
from tkg.llm.schema import GraphExtraction
from tkg.models import Entity, Episode, EpisodeSource, Fact

EXTRACT_GRAPH = "extract_graph"
REFLECT = "reflect"
RESOLVE = "resolve"

_SYSTEM = """You turn one new episode of a conversation or document into knowledge-graph data.
Return the entities the NEW EPISODE names and the facts it states between them.
Entities: people, organisations, places, products, events and other specific things; never dates, \
pronouns, or abstract feelings. Use each entity's most complete name. {speaker_rule}
Facts: only between two listed entities, stated or clearly implied by the NEW EPISODE (the earlier \
episodes are context only). relation is SCREAMING_SNAKE_CASE. fact is one self-contained sentence. \
When one fact holds between several pairs (e.g. "A, B and C founded D"), give it once with extra_sources \
or extra_targets.
Time: copy the phrase that says when a fact began (valid_from) or ended (valid_until) exactly as written, \
e.g. "two weeks ago", "in 2019", "last summer"; write "now" for something true at the time of the episode \
(present tense); leave null when the text gives no time. Do not compute dates.{types}"""

_TYPES = """
Types to use where they fit (label an entity with its type, fill the attributes the text states):
{described}"""


def _kind(episode: Episode) -> str:
    return {EpisodeSource.MESSAGE: "message", EpisodeSource.TEXT: "text", EpisodeSource.JSON: "JSON document"}[
        episode.source
    ]


def _episode_block(episode: Episode, previous: Sequence[Episode]) -> str:
    context = "\n".join(f"[{p.local_reference.date().isoformat()}] {p.content}" for p in previous) or "(none)"
    return (
        f"EARLIER EPISODES:\n{context}\n\n"
        f"NEW EPISODE ({_kind(episode)}"
        + (f", {episode.source_description}" if episode.source_description else "")
        + f", at {episode.local_reference.isoformat()}):\n{episode.content}"
    )


def extraction_prompt(episode: Episode, previous: Sequence[Episode], speaker: str | None, types: str = "") -> Prompt:
    speaker_rule = f'The speaker, "{speaker}", is always an entity.' if speaker else "There is no speaker to include."
    return Prompt(
        name=EXTRACT_GRAPH,
        system=_SYSTEM.format(speaker_rule=speaker_rule, types=_TYPES.format(described=types) if types else ""),
        user=_episode_block(episode, previous),
        inputs={
            "content": episode.content,
            "source": episode.source.value,
            "speaker": speaker,
            "reference_time": episode.reference_time,
            "previous": [p.content for p in previous],
        },
    )


def reflection_prompt(episode: Episode, previous: Sequence[Episode], found: GraphExtraction) -> Prompt:
    """The optional second look: what did the first extraction miss?"""
    names = ", ".join(e.name for e in found.entities) or "(none)"
    facts = "\n".join(f"- {f.fact}" for f in found.facts) or "(none)"
    return Prompt(
        name=REFLECT,
        system=(
            "You check a knowledge-graph extraction of the NEW EPISODE for omissions. Return ONLY entities and "
            "facts that the episode states and that are missing from the lists below, in the same form as the "
            "extraction (time phrases copied as written). Return empty lists if nothing is missing."
        ),
        user=f"{_episode_block(episode, previous)}\n\nEXTRACTED ENTITIES: {names}\nEXTRACTED FACTS:\n{facts}",
        inputs={"content": episode.content, "entities": [e.name for e in found.entities], "facts": len(found.facts)},
    )


@dataclass(frozen=True, slots=True)
class AmbiguousName:
    """A new name and the existing entities it might be."""

    name: str
    label: str
    summary: str
    candidates: Sequence[Entity]


@dataclass(frozen=True, slots=True)
class OpenFact:
    """A new fact and the existing facts it might repeat or contradict."""

    fact: Fact
    source: str
    target: str
    candidates: Sequence[Fact]


def candidate_numbers(groups: Sequence[Sequence[Entity | Fact]]) -> dict[int, str]:
    """Number the candidates of a list of questions 1, 2, ... in order of first appearance (E1.. or X1..)."""
    ids: dict[str, int] = {}
    for group in groups:
        for record in group:
            ids.setdefault(record.id, len(ids) + 1)
    return {number: record_id for record_id, number in ids.items()}


def _span(fact: Fact) -> str:
    start = fact.valid_at.date().isoformat() if fact.valid_at else "unknown"
    end = fact.invalid_at.date().isoformat() if fact.invalid_at else "present"
    return f"{start} to {end}"


def resolution_prompt(
    episode: Episode, names: Sequence[AmbiguousName], facts: Sequence[OpenFact], entity_names: dict[str, str]
) -> Prompt:
    """One batched call for an episode's ambiguous names and facts. Existing entities are numbered E1.., existing
    facts X1.., across the whole prompt; ``entity_names`` maps entity ids to display names."""
    entity_no = {i: n for n, i in candidate_numbers([n.candidates for n in names]).items()}
    fact_no = {i: n for n, i in candidate_numbers([f.candidates for f in facts]).items()}
    lines = [f"EPISODE (at {episode.local_reference.isoformat()}):\n{episode.content}"]
    if names:
        lines.append("\nNEW ENTITIES and the existing entities each might be:")
        for i, item in enumerate(names, start=1):
            lines.append(f"N{i}: {item.name} ({item.label}) {item.summary}".rstrip())
            for c in item.candidates:
                number = entity_no[c.id]
                label = next((x for x in c.labels if x != "Entity"), "Entity")
                also = f"; also called {', '.join(c.aliases)}" if c.aliases else ""
                lines.append(f"   E{number}: {c.name} ({label}{also}) {c.summary[:160]}".rstrip())
    if facts:
        lines.append("\nNEW FACTS and the existing facts each might repeat or contradict:")
        for i, open_fact in enumerate(facts, start=1):
            lines.append(f"F{i}: {open_fact.fact.fact} [{open_fact.fact.relation}, {_span(open_fact.fact)}]")
            for old in open_fact.candidates:
                ends = f"{entity_names.get(old.source_id, '?')} -> {entity_names.get(old.target_id, '?')}"
                lines.append(f"   X{fact_no[old.id]}: {old.fact} [{old.relation}, {ends}, {_span(old)}]")
    system = (
        "You maintain a knowledge graph. For each NEW ENTITY, say which listed existing entity it is the same "
        "real-world thing as (same_as = the E number), or null if none: only merge names for the same thing, "
        "not merely similar ones. For each NEW FACT, say which listed existing facts state the same information "
        "(duplicates = X numbers) and which listed existing facts cannot be true at the same time as it "
        "(contradicts = X numbers), e.g. a new home, employer or relationship status replacing the old one. "
        "Facts that can hold together (two hobbies, two friends) do not contradict. Write a brief reasoning first. "
        "Leave out items you have nothing to say about."
    )
    return Prompt(
        name=RESOLVE,
        system=system,
        user="\n".join(lines),
        inputs={
            "names": [
                {
                    "name": n.name,
                    "candidates": [
                        {"number": entity_no[c.id], "id": c.id, "name": c.name, "aliases": list(c.aliases)}
                        for c in n.candidates
                    ],
                }
                for n in names
            ],
            "facts": [
                {
                    "fact": f.fact.fact,
                    "relation": f.fact.relation,
                    "source": f.source,
                    "target": f.target,
                    "candidates": [
                        {
                            "number": fact_no[c.id],
                            "id": c.id,
                            "fact": c.fact,
                            "relation": c.relation,
                            "source": entity_names.get(c.source_id, ""),
                            "target": entity_names.get(c.target_id, ""),
                        }
                        for c in f.candidates
                    ],
                }
                for f in facts
            ],
        },
    )
