"""Hybrid search, the φ and ρ of the paper in their first form: cosine + BM25 per target, fused by RRF."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from tkg.models import Community, Entity, Episode, Fact, Kind, Record, Vector
from tkg.ranking import rrf
from tkg.storage import Store
from tkg.timeline import Scope

R = TypeVar("R", bound=Record)

TARGETS: dict[str, Kind] = {
    "facts": Kind.FACT,
    "entities": Kind.ENTITY,
    "episodes": Kind.EPISODE,
    "communities": Kind.COMMUNITY,
}


@dataclass(frozen=True, slots=True)
class Scored(Generic[R]):
    """A search result and its fused score."""

    record: R
    score: float


@dataclass(frozen=True, slots=True)
class SearchResults:
    """What :meth:`tkg.Memory.search` returns: one ranked list per target, best first."""

    query: str
    facts: list[Scored[Fact]] = field(default_factory=list)
    entities: list[Scored[Entity]] = field(default_factory=list)
    episodes: list[Scored[Episode]] = field(default_factory=list)
    communities: list[Scored[Community]] = field(default_factory=list)


def hybrid_search(
    store: Store,
    query: str,
    vector: Vector,
    scope: Scope,
    *,
    limit: int,
    targets: Sequence[str],
    candidate_factor: int = 3,
    rrf_k: int = 60,
) -> SearchResults:
    fetch = limit * candidate_factor
    found: dict[str, list[Scored[Record]]] = {}
    for target in targets:
        kind = TARGETS[target]
        fused = rrf(
            [store.vector_search(kind, vector, fetch, scope), store.text_search(kind, query, fetch, scope)], rrf_k
        )[:limit]
        records = store.get(kind, [hit.id for hit in fused])
        found[target] = [Scored(r, hit.score) for r, hit in zip(records, fused, strict=True) if r is not None]
    return SearchResults(query=query, **found)  # type: ignore[arg-type]
