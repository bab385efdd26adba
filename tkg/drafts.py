"""What one episode says, before resolution: named entities and dated facts, from an LLM extraction or from
structured input. Pure: no store, no LLM (dates are computed by :mod:`tkg.temporal`).

Everything an extraction gets wrong is repaired or reported here, never silently dropped: a fact naming an entity
that was not extracted adds that entity (with a warning); a fact with an empty end or sentence is skipped with a
warning; an end before the start drops the end; a time phrase that cannot be dated falls back to the episode time
for a start (and to "still holds" for an end), with a warning; attributes a type does not declare are dropped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tkg.llm.schema import GraphExtraction
from tkg.models import LABEL_SEPARATOR, has_relation_name, relation_name
from tkg.names import normalize_name
from tkg.ontology import Ontology
from tkg.temporal import period_end, resolve_time
from tkg.time_phrases import find_time_phrases
from tkg.timeutil import SUPPORTED_RANGE, to_utc

_SPEAKER = re.compile(r"^\s*([^:\n]{1,80}?)\s*:\s+\S")
#: Words that label a line rather than name who says it ("Note: the meeting moved"): never a speaker.
LABELS = frozenset(
    {
        "note", "notes", "nb", "ps", "p.s.", "fyi", "todo", "to do", "to-do", "reminder", "warning", "caution",
        "important", "tip", "hint", "update", "edit", "summary", "tl;dr", "tldr", "example", "e.g", "i.e",
        "question", "answer", "q", "a", "re", "subject", "title", "date", "time", "location", "status", "result",
        "results", "source", "sources", "context", "background", "goal", "goals", "task", "tasks",
        "step", "action", "agenda", "output", "input", "error", "info", "details", "description", "definition",
    }
)  # fmt: skip


def speaker_of(content: str) -> str | None:
    """The speaker of a ``"Speaker: text"`` message, if it has one. A label (``Note:``, ``TODO:``, ``Step 2:``, a
    URL scheme, a time of day) is not a speaker."""
    match = _SPEAKER.match(content)
    if not match:
        return None
    speaker = match.group(1).strip()
    folded = speaker.casefold()
    if folded in LABELS or folded.split(" ", 1)[0] in {"step", "part", "section", "chapter", "item", "question"}:
        return None
    if not any(c.isalpha() for c in speaker):  # "10", "2024-05-01"
        return None
    return speaker


def one_label(label: str) -> str:
    """An entity's label as kept: one label (what an LLM lists after a ``;`` is left out), "Entity" if none."""
    return label.split(LABEL_SEPARATOR)[0].strip() or "Entity"


@dataclass(slots=True)
class DraftEntity:
    name: str
    label: str = "Entity"
    summary: str = ""
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class DraftFact:
    source: str
    relation: str
    target: str
    sentence: str
    valid_at: datetime | None
    invalid_at: datetime | None
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Draft:
    """Entities (unique by normalised name, in order of appearance) and facts of one episode."""

    entities: list[DraftEntity] = field(default_factory=list)
    facts: list[DraftFact] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    _by_key: dict[str, DraftEntity] = field(default_factory=dict, repr=False)

    def add_entity(
        self, name: str, label: str = "Entity", summary: str = "", attributes: dict[str, Any] | None = None
    ) -> str:
        """Add (or enrich) the entity called ``name``; returns the name as kept. A label is one label: what an LLM
        lists after a ``;`` is left out."""
        name = " ".join(name.split())
        label = one_label(label)
        key = normalize_name(name)
        entity = self._by_key.get(key)
        if entity is not None:
            if label and label != "Entity" and entity.label == "Entity":
                entity.label = label
            if summary.strip() and not entity.summary:
                entity.summary = summary.strip()
            entity.attributes.update(attributes or {})
            return entity.name
        entity = DraftEntity(name, label or "Entity", summary.strip(), dict(attributes or {}))
        self.entities.append(entity)
        self._by_key[key] = entity
        return name

    def has_entity(self, name: str) -> bool:
        return normalize_name(name) in self._by_key


def from_extraction(
    extraction: GraphExtraction,
    speaker: str | None,
    reference: datetime,
    languages: tuple[str, ...] = ("en",),
    ontology: Ontology | None = None,
) -> Draft:
    """A draft from the LLM's extraction, repaired as described in the module docstring. Time phrases resolve
    against ``reference`` as given (:func:`tkg.temporal.resolve_time`): pass the speaker's local time."""
    ontology = ontology or Ontology()
    draft = Draft()
    if speaker:
        draft.add_entity(speaker, "Person")
    for named in extraction.entities:
        if not named.name.strip():
            draft.warnings.append("skipped an entity with an empty name")
            continue
        attributes: dict[str, Any] = {}
        label = one_label(named.label)  # the attributes are those of the label kept
        if named.attributes or label in ontology.entities:
            attributes, problems = ontology.entity_attributes(label, named.attributes)
            draft.warnings.extend(problems)
        draft.add_entity(named.name, label, named.summary, attributes)
    for item in extraction.facts:
        if not item.source.strip() or not item.target.strip() or not item.fact.strip():
            draft.warnings.append(f"skipped a fact with an empty source, target or sentence: {item.fact!r}")
            continue
        relation = relation_name(item.relation)
        if item.relation.strip() and not has_relation_name(item.relation):
            draft.warnings.append(f"fact {item.fact!r}: relation {item.relation!r} has no letter A-Z; read {relation}")
        valid_at, invalid_at = _interval(draft, item.valid_from, item.valid_until, reference, languages)
        attributes = {}
        if item.attributes:
            attributes, problems = ontology.relation_attributes(relation, item.attributes)
            draft.warnings.extend(problems)
        sources = [item.source, *item.extra_sources]
        targets = [item.target, *item.extra_targets]
        for source in sources:
            for target in targets:
                if not source.strip() or not target.strip():
                    continue
                add_fact(draft, source, relation, target, item.fact, valid_at, invalid_at, attributes)
    return draft


_NUMERIC_DATE = re.compile(r"^(?:[+-]\d+|\d{4,})(?:-\d{1,2}(?:-\d{1,2}(?:[T ].*)?)?)?$")


def _interval(
    draft: Draft,
    start: str | None,
    end: str | None,
    reference: datetime,
    languages: tuple[str, ...],
) -> tuple[datetime | None, datetime | None]:
    """A fact's (valid_at, invalid_at) from its phrases. No start phrase and no end: true as of the episode
    (present tense); no start phrase but an end: since forever. A start that cannot be dated is the episode's
    time, unless the end comes before that (then unknown); an end that cannot be dated (or an empty one) is no
    end. An end naming the same period as the start ("in 2019", "until 2019") is that period's end."""
    now = to_utc(reference, "reference")
    valid_at, start_said = _date(start, reference, languages, "start")
    invalid_at, end_said = _date(end, reference, languages, "end")
    unknown_start = start_said and valid_at is None
    if valid_at is None and (invalid_at is None or (unknown_start and now <= invalid_at)):
        valid_at = now  # stated without a time, or with one tkg cannot read: true as of the episode
    if unknown_start:
        used = "used the episode time" if valid_at is not None else "left it unknown (the end comes before the episode)"
        draft.warnings.append(f"could not date the start {start!r}; {used}")
    if end_said and invalid_at is None:
        draft.warnings.append(f"could not date the end {end!r}; kept it open-ended")
    if valid_at is not None and invalid_at == valid_at:
        invalid_at = period_end(end, reference, languages) or invalid_at
    return valid_at, invalid_at


def _date(
    phrase: str | None, reference: datetime, languages: tuple[str, ...], which: str
) -> tuple[datetime | None, bool]:
    """The date of a phrase, and whether one was given (not None, not blank)."""
    if phrase is None or not str(phrase).strip():
        return None, False
    value = resolve_time(phrase, reference, languages)
    if value is None and _NUMERIC_DATE.match(str(phrase).strip()):
        # A date written in digits that is none (year 0, past 9999-12-30, month 13): malformed output, not a
        # vague phrase; the caller turns it into an LLM failure.
        raise ValueError(f"the {which} date {phrase!r} is not a date tkg can store ({SUPPORTED_RANGE})")
    return value, True


def add_fact(
    draft: Draft,
    source: str,
    relation: str,
    target: str,
    sentence: str | None,
    valid_at: datetime | None,
    invalid_at: datetime | None,
    attributes: dict[str, Any] | None = None,
) -> None:
    """Add one fact, adding its ends as entities if they are not in the draft yet (with a warning)."""
    for end in (source, target):
        if not draft.has_entity(end):
            draft.warnings.append(f"fact names {end!r}, which was not extracted as an entity; added it")
            draft.add_entity(end)
    source, target = " ".join(source.split()), " ".join(target.split())
    relation = relation_name(relation)
    text = " ".join((sentence or f"{source} {relation.replace('_', ' ').lower()} {target}").split())
    if valid_at is not None and invalid_at is not None and invalid_at < valid_at:
        draft.warnings.append(
            f"fact {text!r}: its end ({invalid_at.isoformat()}) is before its start ({valid_at.isoformat()}); "
            "the end was dropped"
        )
        invalid_at = None
    draft.facts.append(DraftFact(source, relation, target, text, valid_at, invalid_at, dict(attributes or {})))


# -- time phrases in free text (the extraction-free path) -------------------------------------------------------
def time_mentions(text: str, reference: datetime, languages: tuple[str, ...] = ("en",)) -> list[dict[str, str]]:
    """Time phrases found in free text (:func:`tkg.time_phrases.find_time_phrases`) and the dates they denote
    against ``reference`` (ISO-8601 UTC), each phrase once. ``reference`` goes to :func:`tkg.temporal.resolve_time`
    as given: pass the speaker's local time so calendar phrases fall on the speaker's dates.

    >>> from datetime import UTC, datetime
    >>> time_mentions("I met Bob two weeks ago in Paris.", datetime(2024, 5, 15, tzinfo=UTC))
    [{'phrase': 'two weeks ago', 'at': '2024-05-01T00:00:00+00:00'}]
    """
    mentions: list[dict[str, str]] = []
    seen: set[str] = set()
    for phrase in (found.text for found in find_time_phrases(text[:20_000])):
        if phrase.casefold() in seen:
            continue
        seen.add(phrase.casefold())
        value = resolve_time(phrase, reference, languages)
        if value is not None:
            mentions.append({"phrase": phrase, "at": value.isoformat()})
    return mentions


def name_grams(text: str, longest: int = 5, limit: int = 20_000) -> Iterable[str]:
    """Word n-grams of a text (up to ``longest`` words), candidate names for linking to known entities."""
    words = re.findall(r"[\w][\w'.&-]*", text)[:limit]
    words = [w.rstrip(".") for w in words]
    seen: set[str] = set()
    for n in range(1, longest + 1):
        for i in range(len(words) - n + 1):
            gram = " ".join(words[i : i + n])
            key = gram.casefold()
            if key not in seen:
                seen.add(key)
                yield gram
