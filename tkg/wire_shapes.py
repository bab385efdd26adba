"""What the agent-facing doors answer: JSON shapes for records, search results, context, ingestion and removal.

The MCP server (:mod:`tkg.mcp_server`), the HTTP service (:mod:`tkg.http_service`) and ``tkg search --json`` all
build their answers here, so the three cannot drift apart. The shapes are pydantic models (:class:`FactOut`,
:class:`SearchOut`, ...) whose ``model_dump(mode="json")`` is plain JSON: timestamps are ISO-8601 UTC strings ending
in ``Z``, scores are floats. They double as the MCP tools' output schemas and the HTTP service's response models.
The ``*_out`` functions turn tkg's records and results into them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tkg.background import IngestionStatus
from tkg.context import Context
from tkg.ingest import EpisodeResult, RemovalResult
from tkg.memory import Memory
from tkg.models import Community, Entity, Episode, Fact, Kind
from tkg.search import Scored, SearchResults
from tkg.timeutil import iso
from tkg.wire_requests import Source

__all__ = [
    "CommunityOut",
    "ContextOut",
    "EntityOut",
    "EpisodeListOut",
    "EpisodeOut",
    "ErrorOut",
    "FactOut",
    "GroupOut",
    "GroupsOut",
    "HistoryOut",
    "IngestOut",
    "IngestionOut",
    "RemovalOut",
    "SearchOut",
    "community_out",
    "context_out",
    "entity_names",
    "entity_out",
    "episode_out",
    "fact_out",
    "ingest_out",
    "ingestion_out",
    "removal_out",
    "results_json",
    "search_out",
]

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
    reference_time: IsoTime = Field(
        description="When the episode happened, in the UTC offset it was given in; relative dates in it count from "
        "here, on that calendar."
    )
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


# ----------------------------------------------------------------------------------------------------------
# from records and results


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
        reference_time=iso(episode.local_reference) or "",  # with the offset it was given in
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
