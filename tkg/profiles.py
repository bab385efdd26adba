"""An entity's profile (name, aliases, labels, summary, attributes) as a fold over what its mentions said.

Every episode that names an entity leaves a :class:`tkg.models.Mention` carrying the name as written, a type
label, a one-line summary and typed attributes. The entity's profile is the left fold of :func:`absorb` over its
mentions in ingestion order, so adding an episode is one :func:`absorb`, and removing one is a fresh fold over the
mentions that remain: the entity comes back exactly as it was before the episode. No LLM is involved.

Rules of one step:

* name: the most complete form seen (more words, then more characters; the earlier one on a tie); every other
  distinct form becomes an alias;
* labels: ``Entity`` first, then specific labels in the order first seen;
* summary: the distinct summary sentences, oldest first, trimmed from the oldest so the whole stays within
  ``max_summary_chars`` (the newest information always survives);
* attributes: later values overwrite earlier ones, key by key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from tkg.models import Entity, Mention
from tkg.names import normalize_name

#: The default cap on an entity summary's length, in characters.
MAX_SUMMARY_CHARS = 600


def completeness(name: str) -> tuple[int, int]:
    """How complete a name is: (words, characters). ``"Alice Smith"`` beats ``"Alice"``.

    >>> completeness("Alice Smith") > completeness("Alice")
    True
    """
    return (len(name.split()), len(name))


def absorb(entity: Entity, mention: Mention, max_summary_chars: int = MAX_SUMMARY_CHARS) -> Entity:
    """The entity's profile after one more mention (see the module docstring for the rules)."""
    name, aliases = entity.name, list(entity.aliases)
    written = " ".join(mention.name.split())
    if written and normalize_name(written) != normalize_name(name):
        if completeness(written) > completeness(name):
            aliases.append(name)
            name = written
        else:
            aliases.append(written)
    key = normalize_name(name)
    seen: set[str] = set()
    unique_aliases = []
    for alias in aliases:
        norm = normalize_name(alias)
        if norm != key and norm not in seen:
            seen.add(norm)
            unique_aliases.append(alias)
    labels = list(entity.labels) or ["Entity"]
    if mention.label and mention.label not in labels:
        labels.append(mention.label)
    summary = merge_summary(entity.summary, mention.summary, max_summary_chars)
    attributes = {**entity.attributes, **mention.attributes}
    if (
        name == entity.name
        and tuple(unique_aliases) == entity.aliases
        and tuple(labels) == entity.labels
        and summary == entity.summary
        and attributes == dict(entity.attributes)
    ):
        return entity
    return dataclasses.replace(
        entity,
        name=name,
        aliases=tuple(unique_aliases),
        labels=tuple(labels),
        summary=summary,
        attributes=attributes,
    )


def merge_summary(summary: str, sentence: str, max_chars: int = MAX_SUMMARY_CHARS) -> str:
    """Append ``sentence`` to ``summary`` unless it is already there; drop the oldest sentences beyond ``max_chars``.

    >>> merge_summary("Alice is a nurse.", "Alice lives in Paris.")
    'Alice is a nurse. Alice lives in Paris.'
    >>> merge_summary("Alice is a nurse.", "alice is a nurse")
    'Alice is a nurse.'
    """
    sentence = " ".join(sentence.split())
    if not sentence:
        return summary
    if not sentence.endswith((".", "!", "?")):
        sentence += "."
    parts = _sentences(summary)
    if sentence.casefold().rstrip(".!?") in {p.casefold().rstrip(".!?") for p in parts}:
        return summary
    parts.append(sentence)
    while len(parts) > 1 and len(" ".join(parts)) > max_chars:
        parts.pop(0)
    text = " ".join(parts)
    return text if len(text) <= max_chars else text[: max_chars - 3].rstrip() + "..."


def _sentences(summary: str) -> list[str]:
    out: list[str] = []
    current: list[str] = []
    for word in summary.split():
        current.append(word)
        if word.endswith((".", "!", "?")) and not word.endswith("..."):
            out.append(" ".join(current))
            current = []
    if current:
        out.append(" ".join(current))
    return out


def fold(base: Entity, mentions: Iterable[Mention], max_summary_chars: int = MAX_SUMMARY_CHARS) -> Entity:
    """The entity's profile from its mentions, oldest first. ``base`` gives the identity (id, group, created_at);
    its profile fields are reset before folding."""
    first = True
    entity = base
    for mention in mentions:
        if first:
            entity = dataclasses.replace(
                base,
                name=" ".join(mention.name.split()) or base.name,
                aliases=(),
                labels=("Entity",),
                summary="",
                attributes={},
            )
            first = False
        entity = absorb(entity, mention, max_summary_chars)
    return entity
