"""Prompt builders. One extraction call per episode covers entities, facts and their time phrases."""

from __future__ import annotations

from collections.abc import Sequence

from tkg.llm.base import Prompt
from tkg.models import Episode, EpisodeSource

EXTRACT_GRAPH = "extract_graph"

_SYSTEM = """You turn one new episode of a conversation or document into knowledge-graph data.
Return the entities the NEW EPISODE names and the facts it states between them.
Entities: people, organisations, places, products, events and other specific things; never dates, \
pronouns, or abstract feelings. Use each entity's most complete name. {speaker_rule}
Facts: only between two listed entities, stated or clearly implied by the NEW EPISODE (the earlier \
episodes are context only). relation is SCREAMING_SNAKE_CASE. fact is one self-contained sentence.
Time: copy the phrase that says when a fact began (valid_from) or ended (valid_until) exactly as written, \
e.g. "two weeks ago", "in 2019", "last summer"; write "now" for something true at the time of the episode \
(present tense); leave null when the text gives no time. Do not compute dates."""


def extraction_prompt(episode: Episode, previous: Sequence[Episode], speaker: str | None) -> Prompt:
    speaker_rule = f'The speaker, "{speaker}", is always an entity.' if speaker else "There is no speaker to include."
    context = "\n".join(f"[{p.reference_time.date().isoformat()}] {p.content}" for p in previous) or "(none)"
    kind = {EpisodeSource.MESSAGE: "message", EpisodeSource.TEXT: "text", EpisodeSource.JSON: "JSON document"}[
        episode.source
    ]
    user = (
        f"EARLIER EPISODES:\n{context}\n\n"
        f"NEW EPISODE ({kind}"
        + (f", {episode.source_description}" if episode.source_description else "")
        + f", at {episode.reference_time.isoformat()}):\n{episode.content}"
    )
    return Prompt(
        name=EXTRACT_GRAPH,
        system=_SYSTEM.format(speaker_rule=speaker_rule),
        user=user,
        inputs={
            "content": episode.content,
            "source": episode.source.value,
            "speaker": speaker,
            "reference_time": episode.reference_time,
            "previous": [p.content for p in previous],
        },
    )
