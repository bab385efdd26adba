"""What callers hand the memory, checked at the door: episodes and structured facts.

Every way in (``add_episode``, ``add_episodes``, ``queue_episode``, ``add_facts``, the servers) builds its records
here, so a bad argument is refused with a :class:`tkg.errors.TkgError` before anything is stored.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tkg.config import MemoryConfig
from tkg.drafts import Draft, add_fact
from tkg.errors import EpisodeError, TimestampError, ValidationError
from tkg.models import (
    LABEL_SEPARATOR,
    Episode,
    EpisodeSource,
    check_group_id,
    check_id,
    check_name,
    check_nesting,
    check_storable,
    check_text,
    has_relation_name,
    loads_checked,
    new_id,
)
from tkg.temporal import resolve_time
from tkg.timeutil import optional_utc, to_utc, utc_offset

__all__ = ["EpisodeInput", "FactInput", "make_episode", "resolve_when", "structured_facts"]


@dataclass(frozen=True, slots=True)
class FactInput:
    """A structured fact for :meth:`tkg.Memory.add_facts` (no LLM involved).

    ``valid_at`` / ``invalid_at`` take datetimes, ISO-8601 strings, or time phrases ("two weeks ago", "in 2019")
    resolved against the call's reference time.

    >>> FactInput("Alice", "WORKS_AT", "Acme", valid_at="2021-01-01T00:00:00Z").relation
    'WORKS_AT'
    """

    subject: str
    relation: str
    object: str
    fact: str | None = None
    valid_at: datetime | str | None = None
    invalid_at: datetime | str | None = None
    subject_label: str = "Entity"
    object_label: str = "Entity"

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> FactInput:
        if not isinstance(data, Mapping):
            raise ValidationError(f"a fact must be a FactInput or a mapping, got {type(data).__name__}")
        unknown = sorted(map(str, set(data) - set(cls.__dataclass_fields__)))
        if unknown:  # e.g. another library's "valid_from": dropping it would date the fact wrongly
            raise ValidationError(f"unknown fact fields {unknown}; a fact takes {list(cls.__dataclass_fields__)}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValidationError(f"a fact needs subject, relation and object: {exc}") from None

    @classmethod
    def of(cls, item: FactInput | Mapping[str, Any]) -> FactInput:
        fact = item if isinstance(item, FactInput) else cls.from_mapping(item)
        for name in ("subject", "relation", "object"):
            part = getattr(fact, name)
            if not isinstance(part, str) or not part.strip():
                raise ValidationError(f"a fact's {name} must be a non-empty string, got {part!r}")
            (check_text if name == "relation" else check_name)(part, f"a fact's {name}")  # a relation has its rule
        if not has_relation_name(fact.relation):  # it would be stored as RELATES_TO, the fact's meaning lost
            raise ValidationError(
                f"a fact's relation {fact.relation!r} has no letter or digit A-Z, 0-9: write it as WORKS_AT or "
                "'works at'"
            )
        for name in ("subject_label", "object_label"):
            label = getattr(fact, name)
            if not isinstance(label, str) or not label.strip():
                raise ValidationError(f"a fact's {name} (an entity label) must be a non-empty string, got {label!r}")
            check_text(label, "an entity label")
            if LABEL_SEPARATOR in label:  # the exports list labels with it (GraphML, Neo4j's :LABEL column)
                raise ValidationError(f"a fact's {name} {label!r} holds {LABEL_SEPARATOR!r}: give one label")
        if fact.fact is not None:
            if not isinstance(fact.fact, str):
                raise ValidationError(f"fact text must be a string, got {type(fact.fact).__name__}")
            check_text(fact.fact, "fact text")
        return fact

    def as_document(self) -> dict[str, Any]:
        """The fact as the JSON its episode keeps (provenance): set fields only, datetimes in ISO-8601."""
        return {
            f.name: (v.isoformat() if isinstance(v, datetime) else v)
            for f in dataclasses.fields(self)
            if (v := getattr(self, f.name)) is not None
        }


@dataclass(frozen=True, slots=True)
class EpisodeInput:
    """One episode for :meth:`tkg.Memory.add_episodes` (the arguments of :meth:`tkg.Memory.add_episode`)."""

    content: str | Mapping[str, Any] | list[Any]
    group_id: str | None = None
    source: EpisodeSource | str = EpisodeSource.MESSAGE
    reference_time: datetime | str | None = None
    source_description: str = ""
    name: str = ""
    episode_id: str | None = None
    metadata: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, item: EpisodeInput | Mapping[str, Any] | str) -> EpisodeInput:
        if isinstance(item, EpisodeInput):
            return item
        if isinstance(item, str):
            return cls(item)
        if isinstance(item, Mapping):
            unknown = sorted(set(item) - set(cls.__dataclass_fields__))
            if unknown:
                raise ValidationError(f"unknown episode fields {unknown}")
            try:
                return cls(**item)
            except TypeError as exc:
                raise ValidationError(f"an episode needs content: {exc}") from None
        raise ValidationError(f"an episode must be an EpisodeInput, a mapping or a string, not {type(item).__name__}")


def check_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` as stored with an episode: a mapping with string keys whose values JSON can hold."""
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) for k in metadata):
        raise ValidationError("metadata must be a mapping with string keys")
    check_nesting(metadata, "metadata")
    try:
        text = json.dumps(dict(metadata), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            f"metadata must hold JSON values (strings, numbers, booleans, lists, maps): {exc}"
        ) from None
    parsed: dict[str, Any] = json.loads(text)
    check_storable(parsed, "metadata")  # its text, and integers a snapshot can hold
    return parsed


def _not_json(name: str) -> Any:
    """``json.loads``' hook for NaN and Infinity, which Python reads but JSON (RFC 8259) does not have."""
    raise ValueError(f"{name} is not a JSON value")


def make_episode(item: EpisodeInput, config: MemoryConfig, now: datetime) -> Episode:
    """The validated episode for ``item``, recorded at ``now`` (the one place episode arguments are checked)."""
    try:
        kind = EpisodeSource(item.source)
    except ValueError:
        raise EpisodeError(f"source {item.source!r} is unknown; use one of message, text, json") from None
    content = item.content
    if kind is EpisodeSource.JSON and not isinstance(content, str):
        check_nesting(content, "JSON episode content", text_keys=True)
        try:  # keys in the order given: the document as it was written
            content = json.dumps(content, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise EpisodeError(f"JSON episode content is not serialisable: {exc}") from None
    if not isinstance(content, str):
        raise EpisodeError(
            f"episode content must be a string (or a JSON value for source='json'), got {type(content).__name__}"
        )
    if not content.strip():
        raise EpisodeError("episode content is empty or whitespace; nothing to remember")
    if len(content) > config.max_episode_chars:
        raise EpisodeError(
            f"episode has {len(content):,} characters, more than MemoryConfig.max_episode_chars "
            f"({config.max_episode_chars:,}); split it into several episodes"
        )
    check_text(content, "episode content")
    if kind is EpisodeSource.JSON:
        try:
            loads_checked(content, "JSON episode content", parse_constant=_not_json)
        except ValidationError as exc:  # too deep
            raise EpisodeError(str(exc)) from None
        except ValueError as exc:
            raise EpisodeError(f"source='json' but the content is not valid JSON: {exc}") from None
    for value, what in ((item.source_description, "source_description"), (item.name, "name")):
        if not isinstance(value, str):
            raise ValidationError(f"{what} must be a string, got {type(value).__name__}")
        check_text(value, what)
    return Episode(
        attributes={"metadata": check_metadata(item.metadata)} if item.metadata else {},
        id=check_id(item.episode_id, "episode_id") if item.episode_id is not None else new_id(),
        group_id=check_group_id(item.group_id if item.group_id is not None else config.default_group),
        content=content,
        source=kind,
        reference_time=to_utc(item.reference_time, "reference_time") if item.reference_time is not None else now,
        reference_offset=utc_offset(item.reference_time, "reference_time") if item.reference_time is not None else 0,
        created_at=now,
        source_description=item.source_description,
        name=item.name,
    )


def resolve_when(value: datetime | str | None, what: str, reference: datetime) -> datetime | None:
    """A datetime, an ISO-8601 string, or a time phrase resolved against ``reference``."""
    if value is None or isinstance(value, datetime):
        return optional_utc(value, what)
    try:
        return optional_utc(value, what)
    except TimestampError:
        resolved = resolve_time(value, reference) if isinstance(value, str) else None
        if resolved is None:
            raise TimestampError(f"{what} {value!r} is neither a date nor a time phrase tkg can resolve") from None
        return resolved


def not_a_batch(items: object) -> bool:
    """Whether ``items``, given where a batch of inputs is wanted, is none: a string, bytes, a mapping, one input, or
    not iterable at all (each a common slip for a list of one)."""
    return isinstance(items, str | bytes | Mapping | EpisodeInput | FactInput) or not isinstance(items, Iterable)


def structured_facts(
    facts: Iterable[FactInput | Mapping[str, Any]], reference: datetime
) -> tuple[list[dict[str, Any]], Draft]:
    """The JSON document an :meth:`tkg.Memory.add_facts` episode keeps, and the draft of its entities and facts.
    A fact without ``valid_at`` holds from ``reference`` (one given only ``invalid_at``: from an unknown start);
    time phrases resolve against it."""
    if not_a_batch(facts):
        raise ValidationError(f"add_facts takes an iterable of facts (FactInput or mappings), not {facts!r}")
    items = [FactInput.of(f) for f in facts]
    if not items:
        raise ValidationError("add_facts needs at least one fact")
    parsed = [
        (
            item,
            resolve_when(item.valid_at, "valid_at", reference),
            resolve_when(item.invalid_at, "invalid_at", reference),
        )
        for item in items
    ]
    for item, start, end in parsed:
        if start is not None and end is not None and end < start:
            raise TimestampError(f"fact {item.subject} {item.relation} {item.object}: invalid_at is before valid_at")
    draft = Draft()
    for item, start, end in parsed:
        draft.add_entity(item.subject, item.subject_label)
        draft.add_entity(item.object, item.object_label)
        # without a start, a fact holds from the reference time; one given only its end has an unknown start (as
        # extraction reads "until 2020")
        since = start if start is not None else reference if end is None else None
        add_fact(draft, item.subject, item.relation, item.object, item.fact, since, end)
    return [item.as_document() for item in items], draft
