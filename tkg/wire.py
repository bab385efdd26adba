"""What the agent-facing doors speak: JSON shapes, strict request values, and one tenant-scoped view of a Memory.

The MCP server (:mod:`tkg.mcp_server`), the HTTP service (:mod:`tkg.http_service`) and ``tkg search --json`` all
build their answers here, so the three cannot drift apart:

* **Shapes.** Records (facts, entities, episodes, communities), search results, context, ingestion and removal
  results as pydantic models (:class:`FactOut`, :class:`SearchOut`, ...) whose ``model_dump(mode="json")`` is plain
  JSON: timestamps are ISO-8601 UTC strings ending in ``Z``, scores are floats. The models double as the MCP tools'
  output schemas and the HTTP service's response models.
* **Request values.** Timestamps must carry a UTC offset (a naive one is a :class:`~tkg.errors.TimestampError`,
  never silently UTC), limits are bounded, group ids are validated. The annotated types (:data:`Timestamp`,
  :data:`Limit`, :data:`GroupId`, ...) carry the descriptions both doors publish.
* **Scope.** :class:`ScopedMemory` is a Memory seen through the groups one caller may touch. Every read is
  filtered to those groups; naming another group, or the id of a record in one, is a
  :class:`~tkg.errors.NotFoundError` whose text is the same whether the thing exists elsewhere or not at all.
  Writes are serialised with the ``after_write`` hook (a snapshot save), so a saved file is never half a write.

>>> from tkg import FixedClock, HashEmbedder, Memory
>>> scoped = ScopedMemory(Memory(embedder=HashEmbedder(), clock=FixedClock("2024-05-01T00:00:00Z")), {"u1"})
>>> _ = scoped.add_facts([{"subject": "Ann", "relation": "LIVES_IN", "object": "Oslo"}], group_id="u1")
>>> scoped.search("where does Ann live?", targets=("facts",)).facts[0].valid_at
'2024-05-01T00:00:00Z'
>>> scoped.search("Ann", group_ids=["u2"])
Traceback (most recent call last):
...
tkg.errors.NotFoundError: group 'u2' not found
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, WithJsonSchema

from tkg.background import IngestionStatus
from tkg.context import Context
from tkg.errors import (
    ConfigurationError,
    ExtractionFailedError,
    NotFoundError,
    TimestampError,
    ValidationError,
)
from tkg.ingest import EpisodeResult, RemovalResult
from tkg.memory import FactInput, Memory
from tkg.models import Community, Entity, Episode, Fact, Kind, check_group_id, check_id
from tkg.search import Scored, SearchResults
from tkg.timeutil import iso, to_utc

if TYPE_CHECKING:
    from tkg.background import BackgroundIngestor

__all__ = [
    "DEFAULT_CONTEXT_CHARS",
    "DEFAULT_LIMIT",
    "MAX_CONTEXT_CHARS",
    "MAX_FACTS",
    "MAX_LIMIT",
    "CommunityOut",
    "ContextOut",
    "EntityOut",
    "EpisodeListOut",
    "EpisodeOut",
    "ErrorOut",
    "FactIn",
    "FactOut",
    "GroupOut",
    "GroupsOut",
    "HistoryOut",
    "IngestOut",
    "IngestionOut",
    "RemovalOut",
    "ScopedMemory",
    "SearchOut",
    "check_content",
    "describe_errors",
    "parse_groups",
    "parse_limit",
    "parse_time",
    "results_json",
]

#: Results per kind a search returns when the caller names no limit, and the most one call may ask for.
DEFAULT_LIMIT = 10
MAX_LIMIT = 100
#: Episodes a listing returns by default, and the most one page may hold.
DEFAULT_PAGE = 20
MAX_PAGE = 200
#: The context string's default budget in characters, and the largest budget a caller may ask for.
DEFAULT_CONTEXT_CHARS = 4_000
MAX_CONTEXT_CHARS = 200_000
#: Structured facts one call may add (they become one JSON episode, itself bounded by max_episode_chars).
MAX_FACTS = 1_000

_GROUP_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$"
_ID_PATTERN = r"^[A-Za-z0-9_.:\-]{1,128}$"
_TIME_EXAMPLE = "2024-05-01T12:00:00Z"
_TARGETS = ("facts", "entities", "episodes", "communities")


# ----------------------------------------------------------------------------------------------------------
# request values


def parse_time(value: object, what: str = "timestamp") -> datetime | None:
    """A request timestamp as aware UTC; ``None`` stays ``None``.

    Only ISO-8601 with a UTC offset is accepted (``Z`` or ``+02:00``): a naive timestamp or a bare date is refused
    with a :class:`~tkg.errors.TimestampError` that says how to fix it, because guessing UTC would silently move
    facts by hours for callers in other zones.

    >>> parse_time("2024-05-01T14:00:00+02:00", "as_of").isoformat()
    '2024-05-01T12:00:00+00:00'
    >>> parse_time("2024-05-01T12:00:00", "as_of")
    Traceback (most recent call last):
    ...
    tkg.errors.TimestampError: as_of '2024-05-01T12:00:00' has no UTC offset; add one, e.g. 2024-05-01T12:00:00Z
    """
    if value is None:
        return None
    if isinstance(value, datetime):
        return to_utc(value, what)
    if not isinstance(value, str):
        raise TimestampError(
            f"{what} must be an ISO-8601 string with a UTC offset, e.g. {_TIME_EXAMPLE}; got {type(value).__name__}"
        )
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise TimestampError(f"{what} {value!r} is not an ISO-8601 timestamp; use e.g. {_TIME_EXAMPLE}") from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        example = text + "Z" if "T" in text else f"{text}T00:00:00Z"
        raise TimestampError(f"{what} {value!r} has no UTC offset; add one, e.g. {example}")
    try:
        return to_utc(parsed, what)
    except TimestampError:
        raise TimestampError(f"{what} {value!r} is outside the supported range (years 1 to 9999, in UTC)") from None


def parse_limit(value: object, what: str = "limit", *, default: int, maximum: int, minimum: int = 1) -> int:
    """A bounded integer request value (``None``: the default).

    >>> parse_limit(None, default=10, maximum=100)
    10
    >>> parse_limit(500, default=10, maximum=100)
    Traceback (most recent call last):
    ...
    tkg.errors.ValidationError: limit must be an integer from 1 to 100, got 500
    """
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValidationError(f"{what} must be an integer from {minimum} to {maximum}, got {value!r}")
    return value


def parse_groups(value: object) -> list[str] | None:
    """A list of group ids (a single string is one group; ``None``: no narrowing). Each is validated."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ValidationError(f"group_ids must be a non-empty list of group ids, got {value!r}")
    return list(dict.fromkeys(check_group_id(g) for g in items))


def allowed_groups(groups: Collection[str] | None) -> list[str] | None:
    """The groups a door's caller may use, validated, in the order given (``None``: every group). A single string
    is refused: as a collection it is its characters, so ``"ab"`` would allow groups ``a`` and ``b``."""
    if groups is None:
        return None
    if isinstance(groups, str):
        raise ConfigurationError(f"groups must be a collection of group ids, not one string; use [{groups!r}]")
    return [check_group_id(g) for g in groups]


def check_content(content: object, what: str = "content") -> None:
    """Refuse episode content that is not storable text: lone UTF-16 surrogates (JSON allows ``\\ud800``, UTF-8
    does not), and for JSON documents NaN or Infinity (not JSON at all)."""
    if isinstance(content, str):
        text = content
    else:
        try:
            text = json.dumps(content, ensure_ascii=False, allow_nan=False)
        except ValueError:
            raise ValidationError(f"{what} holds NaN or Infinity, which JSON does not have") from None
        except (TypeError, RecursionError):
            raise ValidationError(f"{what} is not a JSON value tkg can store") from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(f"{what} holds a lone surrogate (\\ud800-\\udfff), which is not text") from None


def describe_errors(errors: Sequence[Mapping[str, Any]], *, skip: Collection[str] = ("body",)) -> str:
    """pydantic's validation errors as one line a person or an agent can act on."""
    parts = []
    for error in errors[:5]:
        where = ".".join(str(p) for p in error.get("loc", ()) if p not in skip)
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        # tkg's own messages already name the field ("as_of '...' has no UTC offset"): do not say it twice.
        named = where and message.startswith(f"{where.rsplit('.', 1)[-1]} ")
        parts.append(f"{where}: {message}" if where and not named else message)
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


def _time_value(value: Any, info: ValidationInfo) -> Any:
    # TimestampError is a ValueError, so pydantic reports its message as the field's error.
    return parse_time(value, info.field_name or "timestamp")


_TIME_SCHEMA = {"type": "string", "format": "date-time", "examples": [_TIME_EXAMPLE]}

#: An ISO-8601 timestamp with a UTC offset (``Z`` or ``+hh:mm``); naive timestamps are refused.
Timestamp = Annotated[
    datetime | None,
    BeforeValidator(_time_value),
    WithJsonSchema({"anyOf": [_TIME_SCHEMA, {"type": "null"}]}),
]
GroupId = Annotated[
    str,
    Field(
        pattern=_GROUP_PATTERN,
        description="A group (tenant) id: 1-128 characters from letters, digits and _ . : - "
        "(starting with a letter or digit).",
    ),
]
RecordId = Annotated[str, Field(pattern=_ID_PATTERN, description="A record id as returned by tkg.")]
Query = Annotated[
    str,
    Field(min_length=1, max_length=10_000, description="What to look for, in natural language."),
]
GroupIds = Annotated[
    list[GroupId] | None,
    Field(
        min_length=1,
        max_length=100,
        description="Groups to search; omitted or null: every group this caller may use.",
    ),
]
Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT, description=f"Results to return, best first (1-{MAX_LIMIT}).")]
AsOf = Annotated[
    Timestamp,
    Field(
        description="Valid time: return what held in the world at this moment (ISO-8601 with offset). "
        "Omitted: what holds now.",
    ),
]
KnownAt = Annotated[
    Timestamp,
    Field(
        description="Transaction time: answer as the memory stood at this moment, ignoring what it learnt later "
        "(ISO-8601 with offset). Omitted: everything known now.",
    ),
]
IncludeInvalidated = Annotated[
    bool, Field(description="Also return facts that have ended or were superseded (the history).")
]
Source = Literal["message", "text", "json"]


# ----------------------------------------------------------------------------------------------------------
# response shapes

IsoTime = Annotated[str, Field(json_schema_extra={"format": "date-time"})]


class _Out(BaseModel):
    # extra="forbid" publishes additionalProperties: false, so clients (and schemathesis) see the exact shape.
    model_config = ConfigDict(extra="forbid")


class FactOut(_Out):
    """A fact (an edge between two entities) with both timelines."""

    id: str
    group_id: str
    fact: str = Field(description="The fact as a sentence.")
    relation: str = Field(description="Relation type, SCREAMING_SNAKE_CASE (e.g. WORKS_AT).")
    source_id: str = Field(description="Id of the subject entity.")
    target_id: str = Field(description="Id of the object entity.")
    source: str | None = Field(description="Name of the subject entity.")
    target: str | None = Field(description="Name of the object entity.")
    valid_at: IsoTime | None = Field(description="When it started to hold in the world (null: unknown).")
    invalid_at: IsoTime | None = Field(description="When it stopped holding (null: still holds / unknown).")
    created_at: IsoTime = Field(description="When the memory recorded it.")
    expired_at: IsoTime | None = Field(description="When the memory learnt that it had ended (null: not superseded).")
    invalidated_by: str | None = Field(description="Id of the fact whose arrival ended this one.")
    episodes: list[str] = Field(description="Ids of the episodes it came from (provenance).")
    score: float | None = Field(
        default=None, description="Relevance to the query (higher is better); null outside search."
    )


class EntityOut(_Out):
    """An entity: a person, place, organisation or concept the episodes talk about."""

    id: str
    group_id: str
    name: str
    labels: list[str]
    aliases: list[str]
    summary: str
    attributes: dict[str, Any]
    created_at: IsoTime
    score: float | None = None


class EpisodeOut(_Out):
    """An episode: raw input kept verbatim (a message, a text, a JSON document)."""

    id: str
    group_id: str
    name: str
    content: str
    source: Source
    source_description: str
    reference_time: IsoTime = Field(description="When the episode happened; relative dates in it count from here.")
    created_at: IsoTime = Field(description="When the memory stored it.")
    status: str = Field(description="extracted, stored (no LLM), failed (extraction failed; retryable) or queued.")
    error: str
    score: float | None = None


class CommunityOut(_Out):
    """A community: a cluster of closely connected entities, with a summary."""

    id: str
    group_id: str
    name: str
    summary: str
    created_at: IsoTime
    score: float | None = None


class SearchOut(_Out):
    """Search results, one list per kind, best first."""

    query: str
    facts: list[FactOut] = Field(default_factory=list)
    entities: list[EntityOut] = Field(default_factory=list)
    episodes: list[EpisodeOut] = Field(default_factory=list)
    communities: list[CommunityOut] = Field(default_factory=list)


class ContextOut(_Out):
    """The context string for a query and the records it holds."""

    query: str
    text: str = Field(description="The text to put in an agent's prompt (empty when nothing is relevant).")
    facts: list[FactOut] = Field(default_factory=list)
    entities: list[EntityOut] = Field(default_factory=list)
    communities: list[CommunityOut] = Field(default_factory=list)
    episodes: list[EpisodeOut] = Field(default_factory=list)
    dropped: int = Field(default=0, description="Results left out to fit the budget.")


class IngestOut(_Out):
    """What adding an episode or facts wrote."""

    episode: EpisodeOut
    entities: list[EntityOut] = Field(description="Entities created or changed.")
    facts: list[FactOut] = Field(description="Facts created or changed (invalidated ones included).")
    warnings: list[str]
    decisions: dict[str, int] = Field(description="How resolution decisions were made, by kind.")
    llm_calls: int
    seconds: float


class IngestionOut(_Out):
    """Where a background ingestion stands."""

    episode_id: str
    state: Literal["queued", "running", "done", "failed"] = Field(
        description="queued (stored, waiting for extraction), running, done, or failed (see error, retryable)."
    )
    error: str | None = None
    retryable: bool = Field(description="For a failed one: whether trying again may help.")
    result: IngestOut | None = Field(description="What the ingestion wrote, once done (kept for recent episodes only).")


class RemovalOut(_Out):
    """What deleting an episode changed (as if it had never been added)."""

    episode_id: str
    deleted_facts: list[str]
    deleted_entities: list[str]
    restored_facts: list[str] = Field(description="Facts this episode had ended, now holding again.")
    updated_facts: list[str]
    updated_entities: list[str]


class EpisodeListOut(_Out):
    """One page of episodes, newest first (by reference time)."""

    episodes: list[EpisodeOut]
    total: int = Field(description="Episodes in the listed groups.")
    offset: int
    limit: int


class HistoryOut(_Out):
    """An entity and every fact about it, ended and superseded ones included, oldest first."""

    entity: EntityOut
    facts: list[FactOut]


class GroupOut(_Out):
    group_id: str
    episodes: int
    entities: int
    facts: int


class GroupsOut(_Out):
    """The groups this caller may use, with what each holds."""

    groups: list[GroupOut]


class ErrorOut(_Out):
    """Why a request failed. ``error`` names the kind of problem; ``detail`` says what to do."""

    error: str
    detail: str
    episode_id: str | None = None


class FactIn(BaseModel):
    """A structured fact to add with no LLM."""

    model_config = ConfigDict(extra="forbid")

    subject: str = Field(min_length=1, max_length=500, description="The subject entity's name, e.g. Alice.")
    relation: str = Field(
        min_length=1, max_length=100, description="The relation, e.g. WORKS_AT or 'works at' (normalised)."
    )
    object: str = Field(min_length=1, max_length=500, description="The object entity's name, e.g. Acme.")
    fact: str | None = Field(
        None, max_length=2_000, description="The fact as a sentence; default: built from the three parts."
    )
    valid_at: Timestamp = Field(
        None, description="When it started to hold (ISO-8601 with offset); default: the reference time."
    )
    invalid_at: Timestamp = Field(None, description="When it stopped holding (ISO-8601 with offset); default: open.")
    subject_label: str = Field("Entity", min_length=1, max_length=100, description="Type of the subject, e.g. Person.")
    object_label: str = Field(
        "Entity", min_length=1, max_length=100, description="Type of the object, e.g. Organization."
    )


def _common(record: Fact | Entity | Episode | Community, scored: Scored[Any] | None) -> dict[str, Any]:
    """The fields every record shape has: ids, when the memory stored it, and its search score (if any)."""
    return {
        "id": record.id,
        "group_id": record.group_id,
        "created_at": iso(record.created_at) or "",
        "score": None if scored is None else float(scored.score),
    }


def fact_out(fact: Fact, names: Mapping[str, str], scored: Scored[Fact] | None = None) -> FactOut:
    return FactOut(
        **_common(fact, scored),
        fact=fact.fact,
        relation=fact.relation,
        source_id=fact.source_id,
        target_id=fact.target_id,
        source=names.get(fact.source_id),
        target=names.get(fact.target_id),
        valid_at=iso(fact.valid_at),
        invalid_at=iso(fact.invalid_at),
        expired_at=iso(fact.expired_at),
        invalidated_by=fact.invalidated_by,
        episodes=list(fact.episodes),
    )


def entity_out(entity: Entity, scored: Scored[Entity] | None = None) -> EntityOut:
    return EntityOut(
        **_common(entity, scored),
        name=entity.name,
        labels=list(entity.labels),
        aliases=list(entity.aliases),
        summary=entity.summary,
        attributes=_plain(entity.attributes),
    )


def episode_out(episode: Episode, scored: Scored[Episode] | None = None) -> EpisodeOut:
    return EpisodeOut(
        **_common(episode, scored),
        name=episode.name,
        content=episode.content,
        source=episode.source.value,
        source_description=episode.source_description,
        reference_time=iso(episode.reference_time) or "",
        status=episode.status.value,
        error=episode.error,
    )


def community_out(community: Community, scored: Scored[Community] | None = None) -> CommunityOut:
    return CommunityOut(**_common(community, scored), name=community.name, summary=community.summary)


def _plain(value: Any) -> Any:
    """Attribute values as JSON: datetimes as ISO strings, tuples as lists, anything else odd as its text."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return iso(value) if value.tzinfo is not None else value.isoformat()
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def entity_names(memory: Memory, facts: Iterable[Fact]) -> dict[str, str]:
    """Entity id -> name for both ends of the given facts (one store read)."""
    ids = sorted({i for f in facts for i in (f.source_id, f.target_id)})
    return {e.id: e.name for e in memory.get_many(Kind.ENTITY, ids) if isinstance(e, Entity)}


def _ranked(memory: Memory, found: SearchResults | Context) -> dict[str, Any]:
    """The four ranked lists of search results or a context, as their shapes (scores kept)."""
    names = entity_names(memory, (s.record for s in found.facts))
    return {
        "facts": [fact_out(s.record, names, s) for s in found.facts],
        "entities": [entity_out(s.record, s) for s in found.entities],
        "episodes": [episode_out(s.record, s) for s in found.episodes],
        "communities": [community_out(s.record, s) for s in found.communities],
    }


def search_out(memory: Memory, results: SearchResults) -> SearchOut:
    return SearchOut(query=results.query, **_ranked(memory, results))


def results_json(memory: Memory, results: SearchResults) -> dict[str, Any]:
    """Search results as plain JSON values (timestamps in ISO-8601 UTC); what ``tkg search --json`` prints."""
    return search_out(memory, results).model_dump(mode="json")


def context_out(memory: Memory, query: str, context: Context) -> ContextOut:
    return ContextOut(query=query, text=context.text, dropped=context.dropped, **_ranked(memory, context))


def ingest_out(memory: Memory, result: EpisodeResult) -> IngestOut:
    names = entity_names(memory, result.facts)
    return IngestOut(
        episode=episode_out(result.episode),
        entities=[entity_out(e) for e in result.entities],
        facts=[fact_out(f, names) for f in result.facts],
        warnings=list(result.warnings),
        decisions=dict(result.decisions),
        llm_calls=result.usage.calls,
        seconds=float(result.seconds),
    )


def ingestion_out(memory: Memory, status: IngestionStatus) -> IngestionOut:
    return IngestionOut(
        episode_id=status.episode_id,
        state=status.state,
        error=status.error,
        retryable=status.retryable,
        result=ingest_out(memory, status.result) if status.result is not None else None,
    )


def removal_out(result: RemovalResult) -> RemovalOut:
    return RemovalOut(
        episode_id=result.episode_id,
        deleted_facts=list(result.deleted_facts),
        deleted_entities=list(result.deleted_entities),
        restored_facts=list(result.restored_facts),
        updated_facts=list(result.updated_facts),
        updated_entities=list(result.updated_entities),
    )


# ----------------------------------------------------------------------------------------------------------
# one caller's view of a memory


class ScopedMemory:
    """A :class:`~tkg.Memory` seen through the groups one caller may touch (``groups=None``: all of them).

    Every operation takes plain request values, validates them strictly (:func:`parse_time`, :func:`parse_limit`,
    group and record ids) before anything is read or written, and returns one of this module's shapes. Reads see
    only the allowed groups; a group outside them, and a record id whose record lives outside them, raise
    :class:`~tkg.errors.NotFoundError` with the same text as a group or id that does not exist at all, so a
    caller learns nothing about other tenants. Writes hold one lock across the write and ``after_write`` (e.g.
    saving a snapshot), which views made by :meth:`narrow` share.

    ``default_group`` is where a write that names no group goes; without one, a caller allowed exactly one group
    writes there and any other must name the group. With an ``ingestor`` (:class:`tkg.BackgroundIngestor`),
    :meth:`queue_episode` returns at once and extraction runs behind its queue.
    """

    def __init__(
        self,
        memory: Memory,
        groups: Collection[str] | None = None,
        *,
        default_group: str | None = None,
        after_write: Callable[[], object] | None = None,
        write_lock: AbstractContextManager[Any] | None = None,
        ingestor: BackgroundIngestor | None = None,
    ) -> None:
        allowed = allowed_groups(groups)
        self.memory = memory
        self.ingestor = ingestor
        self.groups: frozenset[str] | None = None if allowed is None else frozenset(allowed)
        if default_group is not None:
            check_group_id(default_group)
        self.default_group = default_group
        self._after_write = after_write
        self._write_lock: AbstractContextManager[Any] = write_lock if write_lock is not None else threading.RLock()

    def narrow(self, groups: Collection[str], *, default_group: str | None = None) -> ScopedMemory:
        """The same memory, lock and ``after_write`` hook, for a caller allowed only ``groups``."""
        named = frozenset(allowed_groups(groups) or ())
        allowed = named if self.groups is None else named & self.groups
        return ScopedMemory(
            self.memory,
            allowed,
            default_group=default_group,
            after_write=self._after_write,
            write_lock=self._write_lock,
            ingestor=self.ingestor,
        )

    # -- scope -------------------------------------------------------------------------------------------
    def _not_found_group(self, group: str) -> NotFoundError:
        return NotFoundError(f"group {group!r} not found")

    def readable(self, group_ids: object = None) -> frozenset[str] | None:
        """The groups a read may see: ``None`` means every group (only for an unrestricted view).

        Named groups must be allowed; an allowed group that holds nothing yet is simply empty.
        """
        named = parse_groups(group_ids)
        if named is None:
            return None if self.groups is None else self.groups
        if self.groups is not None:
            for group in named:
                if group not in self.groups:
                    raise self._not_found_group(group)
            return frozenset(named)
        existing = set(self.memory.groups())
        for group in named:
            if group not in existing:
                raise self._not_found_group(group)
        return frozenset(named)

    def writable(self, group_id: object = None) -> str:
        """The group a write goes to."""
        if group_id is None:
            if self.default_group is not None and (self.groups is None or self.default_group in self.groups):
                return self.default_group
            if self.groups is not None and len(self.groups) == 1:
                return next(iter(self.groups))
            if self.groups is None:
                return self.memory.config.default_group
            raise ValidationError(f"name the group_id to write to; this caller may use {sorted(self.groups)}")
        group = check_group_id(group_id)
        if self.groups is not None and group not in self.groups:
            raise self._not_found_group(group)
        return group

    def _searchable(self, group_ids: object) -> list[str] | None:
        """Groups to hand to Memory.search: never an empty list (that would not mean "nothing")."""
        visible = self.readable(group_ids)
        if visible is None:
            return None
        return sorted(visible & set(self.memory.groups()))

    def _owned(self, kind: Kind, record_id: object) -> Any:
        what = f"{kind.value}_id"
        check_id(record_id, what)
        assert isinstance(record_id, str)
        record = self.memory.get_many(kind, [record_id])[0]
        if record is None or (self.groups is not None and record.group_id not in self.groups):
            raise NotFoundError(f"no {kind.value} with id {record_id!r}")
        return record

    def _write(self, action: Callable[[], Any]) -> Any:
        with self._write_lock:
            try:
                result = action()
            except ExtractionFailedError:
                # The episode is stored, marked failed (Memory's contract): persist it so a retry can find it.
                self._saved()
                raise
            self._saved()
            return result

    def _saved(self) -> None:
        if self._after_write is not None:
            self._after_write()

    # -- writes ------------------------------------------------------------------------------------------
    def add_episode(
        self,
        content: str | Mapping[str, Any] | list[Any],
        *,
        group_id: str | None = None,
        source: str = "message",
        reference_time: object = None,
        source_description: str = "",
        name: str = "",
    ) -> IngestOut:
        """Store an episode and extract what it says (with the memory's LLM; without one it is stored, indexed
        and linked to entities already known by name)."""
        args = self._episode_args(content, group_id, source, reference_time, source_description, name)
        result = self._write(lambda: self.memory.add_episode(content, **args))
        return ingest_out(self.memory, result)

    def queue_episode(
        self,
        content: str | Mapping[str, Any] | list[Any],
        *,
        group_id: str | None = None,
        source: str = "message",
        reference_time: object = None,
        source_description: str = "",
        name: str = "",
    ) -> IngestionOut:
        """Store an episode as ``queued`` and return at once; the background ingestor extracts it later (see
        :meth:`ingestion_status`). The queued episode is persisted by ``after_write`` before this returns, so an
        accepted episode survives a restart; ``after_write`` runs again once its extraction has finished."""
        ingestor = self.ingestor
        if ingestor is None:
            raise ValidationError("this server runs without background ingestion; add the episode synchronously")
        args = self._episode_args(content, group_id, source, reference_time, source_description, name)
        episode_id: str = self._write(lambda: ingestor.submit(content, **args))
        # Saved again when the worker is done (on its thread; a finished one calls back at once).
        ingestor.future(episode_id).add_done_callback(lambda _: self._write(lambda: None))
        return ingestion_out(self.memory, ingestor.status(episode_id))

    def _episode_args(
        self,
        content: object,
        group_id: object,
        source: str,
        reference_time: object,
        source_description: object,
        name: object,
    ) -> dict[str, Any]:
        """The keyword arguments an episode is stored with (by add_episode and queue_episode alike), validated:
        the group this caller writes to, an aware reference time, and storable text. ``source`` and the content's
        shape are left to :meth:`tkg.Memory.add_episode`, which checks them for every way in."""
        group = self.writable(group_id)
        when = parse_time(reference_time, "reference_time")
        check_content(content)
        for what, value in (("source_description", source_description), ("name", name)):
            if not isinstance(value, str):
                raise ValidationError(f"{what} must be a string")
            check_content(value, what)
        return {
            "group_id": group,
            "source": source,
            "reference_time": when,
            "source_description": source_description,
            "name": name,
        }

    def ingestion_status(self, episode_id: object) -> IngestionOut:
        """Where an episode's extraction stands: from the background ingestor while it tracks the episode, else
        from the stored record (extracted or stored: done)."""
        episode = self._owned(Kind.EPISODE, episode_id)
        status = self.ingestor.status(episode.id) if self.ingestor is not None else IngestionStatus.of(episode)
        return ingestion_out(self.memory, status)

    def add_facts(
        self,
        facts: Sequence[FactIn | Mapping[str, Any]],
        *,
        group_id: str | None = None,
        reference_time: object = None,
    ) -> IngestOut:
        """Add structured facts with no LLM; they are kept together as one JSON episode (their provenance)."""
        group = self.writable(group_id)
        when = parse_time(reference_time, "reference_time")
        if isinstance(facts, str | bytes | Mapping) or not isinstance(facts, Sequence):
            raise ValidationError("facts must be a list of facts")
        if not 1 <= len(facts) <= MAX_FACTS:
            raise ValidationError(f"facts must hold 1 to {MAX_FACTS} facts, got {len(facts)}")
        parsed = [f if isinstance(f, FactIn) else _model(FactIn, f, f"facts[{i}]") for i, f in enumerate(facts)]
        inputs = [
            FactInput(
                f.subject,
                f.relation,
                f.object,
                fact=f.fact,
                valid_at=f.valid_at,
                invalid_at=f.invalid_at,
                subject_label=f.subject_label,
                object_label=f.object_label,
            )
            for f in parsed
        ]
        for i, f in enumerate(parsed):
            if f.valid_at is not None and f.invalid_at is not None and f.invalid_at < f.valid_at:
                raise TimestampError(f"facts[{i}]: invalid_at is before valid_at")
        result = self._write(lambda: self.memory.add_facts(inputs, group_id=group, reference_time=when))
        return ingest_out(self.memory, result)

    def delete_episode(self, episode_id: object) -> RemovalOut:
        """Remove an episode as if it had never been added (facts only it supported go, invalidations it caused
        are reverted, orphaned entities go)."""
        episode = self._owned(Kind.EPISODE, episode_id)
        return removal_out(self._write(lambda: self.memory.remove_episode(episode.id)))

    # -- reads -------------------------------------------------------------------------------------------
    def search(
        self,
        query: str,
        *,
        targets: Sequence[str] = ("facts", "entities", "episodes"),
        group_ids: object = None,
        limit: object = None,
        as_of: object = None,
        known_at: object = None,
        include_invalidated: bool = False,
    ) -> SearchOut:
        """Hybrid search over the chosen kinds of record, within the caller's groups."""
        args = self._search_args(query, targets, group_ids, limit, as_of, known_at, include_invalidated)
        if args is None:
            return SearchOut(query=query)
        return search_out(self.memory, self.memory.search(query, **args))

    def context(
        self,
        query: str,
        *,
        group_ids: object = None,
        limit: object = None,
        max_chars: object = None,
        include_episodes: bool = False,
        as_of: object = None,
        known_at: object = None,
    ) -> ContextOut:
        """The context string for a query (facts with their date ranges, entities, communities), within a
        character budget (default :data:`DEFAULT_CONTEXT_CHARS`)."""
        budget = parse_limit(
            max_chars, "max_chars", default=DEFAULT_CONTEXT_CHARS, maximum=MAX_CONTEXT_CHARS, minimum=0
        )
        if not isinstance(include_episodes, bool):
            raise ValidationError("include_episodes must be true or false")
        targets = ("facts", "entities", "communities") + (("episodes",) if include_episodes else ())
        args = self._search_args(query, targets, group_ids, limit, as_of, known_at, False)
        if args is None:
            return ContextOut(query=query, text="")
        context = self.memory.retrieve(query, max_chars=budget, include_episodes=include_episodes, **args)
        return context_out(self.memory, query, context)

    def _search_args(
        self,
        query: object,
        targets: Sequence[str],
        group_ids: object,
        limit: object,
        as_of: object,
        known_at: object,
        include_invalidated: object,
    ) -> dict[str, Any] | None:
        """Validated arguments for Memory.search, or None when the caller's groups hold nothing yet."""
        if not isinstance(query, str) or not query.strip():
            raise ValidationError("query is empty; say what to look for")
        if len(query) > self.memory.config.max_query_chars:
            raise ValidationError(
                f"query has {len(query):,} characters, more than {self.memory.config.max_query_chars:,}"
            )
        unknown = [t for t in targets if t not in _TARGETS]
        if unknown or not targets:
            raise ValidationError(f"unknown search targets {unknown}; choose from {list(_TARGETS)}")
        if not isinstance(include_invalidated, bool):
            raise ValidationError("include_invalidated must be true or false")
        args: dict[str, Any] = {
            "limit": parse_limit(limit, default=DEFAULT_LIMIT, maximum=MAX_LIMIT),
            "as_of": parse_time(as_of, "as_of"),
            "known_at": parse_time(known_at, "known_at"),
            "include_invalidated": include_invalidated,
            "targets": tuple(targets),
        }
        groups = self._searchable(group_ids)
        if groups is not None and not groups:
            return None
        args["group_ids"] = groups
        return args

    def list_episodes(self, *, group_ids: object = None, limit: object = None, offset: object = None) -> EpisodeListOut:
        """Episodes of the caller's groups, newest first by reference time."""
        size = parse_limit(limit, default=DEFAULT_PAGE, maximum=MAX_PAGE)
        start = parse_limit(offset, "offset", default=0, maximum=10**9, minimum=0)
        groups = self._searchable(group_ids)
        if groups is not None and not groups:
            return EpisodeListOut(episodes=[], total=0, offset=start, limit=size)
        found = sorted(self.memory.episodes(groups), key=lambda e: (e.reference_time, e.created_at, e.id), reverse=True)
        page = found[start : start + size]
        return EpisodeListOut(episodes=[episode_out(e) for e in page], total=len(found), offset=start, limit=size)

    def get_episode(self, episode_id: object) -> EpisodeOut:
        """One episode by id."""
        return episode_out(self._owned(Kind.EPISODE, episode_id))

    def entity_history(self, entity_id: object) -> HistoryOut:
        """An entity and every fact touching it, ended and superseded ones included, oldest first."""
        entity = self._owned(Kind.ENTITY, entity_id)
        facts = self.memory.facts_about(entity.id, include_invalidated=True)
        # A fact never crosses groups, but filter anyway: this is the tenant boundary.
        facts = [f for f in facts if self.groups is None or f.group_id in self.groups]
        names = entity_names(self.memory, facts)
        return HistoryOut(entity=entity_out(entity), facts=[fact_out(f, names) for f in facts])

    def list_groups(self) -> GroupsOut:
        """The groups this caller may use (for an unrestricted view: every group that holds something)."""
        groups = sorted(self.groups if self.groups is not None else self.memory.groups())
        counts = {g: self.memory.stats(g)["records"] for g in groups}
        return GroupsOut(
            groups=[
                GroupOut(group_id=g, episodes=c["episode"], entities=c["entity"], facts=c["fact"])
                for g, c in counts.items()
            ]
        )


def _model(model: type[FactIn], data: object, what: str) -> FactIn:
    if not isinstance(data, Mapping):
        raise ValidationError(f"{what} must be an object with subject, relation and object")
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ValidationError(f"{what}: {describe_errors(exc.errors())}") from None
