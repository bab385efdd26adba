"""The context constructor χ: search results -> the text an agent puts in its prompt, and the same as typed data.

The string follows the paper's template: facts with the date range in which they held, entities with their
summaries, community summaries, and (on request) the source episodes. A budget in characters or tokens is filled
best-first across the sections: the best fact, the best entity, the best community (the best episode), then
the second of each, and so on, so a tight budget keeps the top of every list rather than one list whole.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from tkg.errors import ValidationError
from tkg.models import Community, Entity, Episode, Fact
from tkg.search import Scored, SearchResults
from tkg.timeutil import calendar_text

#: The section tags of the string; user text that holds one (any case) has its angle brackets escaped, so that no
#: record can close its section or open another.
_TAGS = re.compile(r"<(/?\s*(?:FACTS|ENTITIES|COMMUNITIES|EPISODES)\s*)>", re.IGNORECASE)

TokenCounter = Callable[[str], int]


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate: about four characters per token for English text."""
    return math.ceil(len(text) / 4)


@dataclass(frozen=True, slots=True)
class Context:
    """What :meth:`tkg.Memory.retrieve` returns: the context string and the results it holds, by type."""

    text: str
    facts: list[Scored[Fact]] = field(default_factory=list)
    entities: list[Scored[Entity]] = field(default_factory=list)
    communities: list[Scored[Community]] = field(default_factory=list)
    episodes: list[Scored[Episode]] = field(default_factory=list)
    #: results left out to fit the budget
    dropped: int = 0

    def __str__(self) -> str:
        return self.text


def _when(value: datetime | None, missing: str) -> str:
    return missing if value is None else calendar_text(value) + " UTC"


def _text(value: str) -> str:
    """User text as one entry of a section: its section tags escaped, its further lines indented under it."""
    return _TAGS.sub(r"&lt;\1&gt;", value).replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\n  ")


def fact_line(fact: Fact) -> str:
    return f"- {_text(fact.fact)} ({_when(fact.valid_at, 'unknown')} - {_when(fact.invalid_at, 'present')})"


def entity_line(entity: Entity) -> str:
    """``- Alice Smith (Person; also Alice): summary`` -- the type and other names help an agent match mentions.

    >>> from datetime import UTC, datetime
    >>> entity_line(Entity(id="a", group_id="g", name="Acme", created_at=datetime(2024, 1, 1, tzinfo=UTC)))
    '- Acme'
    """
    notes = [label for label in entity.labels if label != "Entity"]
    if entity.aliases:
        notes.append("also " + ", ".join(entity.aliases))
    head = f"- {_text(entity.name)}" + (f" ({_text('; '.join(notes))})" if notes else "")
    return f"{head}: {_text(entity.summary)}" if entity.summary else head


_SECTIONS = (
    ("facts", "FACTS (each with the period it held: from - to; 'present' means it still holds)"),
    ("entities", "ENTITIES (name: summary)"),
    ("communities", "COMMUNITIES (name: summary)"),
    ("episodes", "EPISODES (source material, with its time)"),
)


def _line(target: str, scored: Scored) -> str:  # type: ignore[type-arg]
    record = scored.record
    if target == "facts":
        return fact_line(record)
    if target == "entities":
        return entity_line(record)
    if target == "communities":
        return f"- {_text(record.name)}: {_text(record.summary)}"
    return f"- [{_when(record.reference_time, '')}] {_text(record.content)}"


def construct(
    results: SearchResults,
    *,
    max_chars: int | None = None,
    max_tokens: int | None = None,
    count_tokens: TokenCounter = approx_tokens,
    include_episodes: bool | None = None,
) -> Context:
    """Build the context from search results, within the budget (characters, tokens, or both). Episodes are
    included when ``include_episodes`` is True, or when it is None (the default) and the results hold no fact:
    a memory whose messages were stored without extraction then still shows what it has."""
    if include_episodes is None:
        include_episodes = not results.facts
    for name, value in (("max_chars", max_chars), ("max_tokens", max_tokens)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ValidationError(f"{name} must be a non-negative integer, got {value!r}")
    lists: dict[str, list[Scored]] = {  # type: ignore[type-arg]
        "facts": list(results.facts),
        "entities": list(results.entities),
        "communities": list(results.communities),
        "episodes": list(results.episodes) if include_episodes else [],
    }
    kept: dict[str, list[Scored]] = {t: [] for t in lists}  # type: ignore[type-arg]
    lines: dict[str, list[str]] = {t: [] for t in lists}
    shown: dict[str, set[str]] = {t: set() for t in lists}

    def fits(text: str) -> bool:
        return (max_chars is None or len(text) <= max_chars) and (
            max_tokens is None or count_tokens(text) <= max_tokens
        )

    dropped = 0
    full = {t: False for t in lists}
    for rank in range(max((len(v) for v in lists.values()), default=0)):
        for target, items in lists.items():
            if rank >= len(items):
                continue
            line = _line(target, items[rank])
            if line in shown[target]:  # one statement between several pairs (a hyper-edge): its line once
                kept[target].append(items[rank])
                continue
            if full[target]:
                dropped += 1
                continue
            lines[target].append(line)
            if fits(_render(lines)):
                shown[target].add(line)
                kept[target].append(items[rank])
            else:
                lines[target].pop()
                full[target] = True  # keep best-first: nothing below a line that did not fit
                dropped += 1
    return Context(
        text=_render(lines),
        facts=kept["facts"],
        entities=kept["entities"],
        communities=kept["communities"],
        episodes=kept["episodes"],
        dropped=dropped,
    )


def _render(sections: dict[str, list[str]]) -> str:
    blocks = []
    for target, title in _SECTIONS:
        lines = sections.get(target)
        if lines:
            tag = title.split(" ", 1)[0]
            blocks.append("\n".join([f"# {title}", f"<{tag}>", *lines, f"</{tag}>"]))
    return "\n\n".join(blocks)
