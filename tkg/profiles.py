"""An entity's profile (name, aliases, labels, summary, attributes) as a fold over what its mentions said.

Every episode that names an entity leaves a :class:`tkg.models.Mention` carrying the name as written, a type
label, a one-line summary and typed attributes. The entity's profile is the left fold of :func:`absorb` over its
mentions in ingestion order, so adding an episode is one :func:`absorb`, and removing one is a fresh fold over the
mentions that remain: the entity comes back exactly as it was before the episode. No LLM is involved.

Rules of one step:

* name: the most complete form seen (more words, then more characters; the earlier one on a tie); every other
  distinct form becomes an alias, the other names one episode gave the entity too (:data:`ALSO_NAMED`);
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
#: A mention's attribute listing the other names the episode gave the entity (two names of one episode resolved
#: to one entity make one mention): each is absorbed as a name, none becomes an attribute of the entity.
ALSO_NAMED = "tkg.also_named"
#: Words ending in a full stop that end no sentence: titles and common abbreviations (a single capital letter and
#: a word with a full stop inside, "J." or "U.S.", neither).
_ABBREVIATIONS = frozenset(
    "mr. mrs. ms. dr. prof. st. jr. sr. mt. vs. etc. inc. ltd. co. corp. no. fig. approx. dept. gen. gov. "
    "sen. rev.".split()
)


def completeness(name: str) -> tuple[int, int]:
    """How complete a name is: (words, characters). ``"Alice Smith"`` beats ``"Alice"``.

    >>> completeness("Alice Smith") > completeness("Alice")
    True
    """
    return (len(name.split()), len(name))


def absorb(entity: Entity, mention: Mention, max_summary_chars: int = MAX_SUMMARY_CHARS) -> Entity:
    """The entity's profile after one more mention (see the module docstring for the rules)."""
    name, aliases = entity.name, list(entity.aliases)
    also = mention.attributes.get(ALSO_NAMED) or ()
    for given in (mention.name, *also):
        written = " ".join(str(given).split())
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
    attributes = {**entity.attributes, **{k: v for k, v in mention.attributes.items() if k != ALSO_NAMED}}
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
    """Append each sentence of ``sentence`` (one or more) to ``summary`` unless it is already there; drop the
    oldest sentences beyond ``max_chars``. Appending two texts one after the other gives what appending them
    together does.

    >>> merge_summary("Alice is a nurse.", "Alice lives in Paris.")
    'Alice is a nurse. Alice lives in Paris.'
    >>> merge_summary("Alice is a nurse.", "alice is a nurse")
    'Alice is a nurse.'
    >>> merge_summary("Alice is a nurse. She lives in Paris.", "Alice is a nurse. She lives in Paris.")
    'Alice is a nurse. She lives in Paris.'
    >>> merge_summary("Mr. Smith is a nurse.", "Mr. Jones lives in Oslo.")
    'Mr. Smith is a nurse. Mr. Jones lives in Oslo.'
    """
    given = _sentences(" ".join(sentence.split()))
    if not given:  # most mentions bring no summary: the entity's is not split for nothing
        return summary
    parts = _sentences(summary)
    known = {_sentence_key(p) for p in parts}
    added = False
    for new in given:
        new = new if new.endswith((".", "!", "?")) else new + "."
        key = _sentence_key(new)
        if key not in known:
            known.add(key)
            parts.append(new)
            added = True
    if not added:
        return summary
    while len(parts) > 1 and len(" ".join(parts)) > max_chars:
        parts.pop(0)
    text = " ".join(parts)
    return text if len(text) <= max_chars else text[: max_chars - 3].rstrip() + "..."


def _sentence_key(sentence: str) -> str:
    return sentence.casefold().rstrip(".!?")


def _sentences(summary: str) -> list[str]:
    out: list[str] = []
    current: list[str] = []
    for word in summary.split():
        current.append(word)
        if word.endswith((".", "!", "?")) and not word.endswith("...") and not _abbreviation(word):
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


def _abbreviation(word: str) -> bool:
    """Whether ``word``, ending in a full stop, is an abbreviation rather than a sentence's end."""
    if not word.endswith("."):
        return False
    bare = word.rstrip(".")
    return word.casefold() in _ABBREVIATIONS or (len(bare) == 1 and bare.isupper()) or "." in bare
