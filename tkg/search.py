"""The search function of the paper, φ then ρ: candidates by cosine, BM25 and breadth-first search per target,
reranked by RRF, MMR, episode mentions, node distance, a cross-encoder, or (episodes) their conversation context.

Everything a search does is named by a :class:`tkg.search_config.SearchConfig` passed in; the store only answers
the narrow calls of :class:`tkg.storage.Store`, so this module runs unchanged on every backend.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, Literal, TypeVar

import numpy as np

from tkg.cosines import inverse_norms
from tkg.episode_context import rerank_episodes
from tkg.errors import NotFoundError, ValidationError
from tkg.invalidation import statement_episodes, statements
from tkg.models import Community, Entity, Episode, Fact, Kind, Record, Vector, vector_of
from tkg.ranking import mmr, reorder, rrf
from tkg.rerankers import CrossEncoder, TermOverlapScorer
from tkg.search_config import TARGET_KINDS, BfsOrigin, Method, Reranker, SearchConfig, TargetConfig
from tkg.storage import Candidates, Hit, Store
from tkg.timeline import Scope

R = TypeVar("R", bound=Record)
#: A view of the past reads up to this many times the recent episodes it wants, where later ones crowd them.
_RECENT_MOST = 64


@dataclass(frozen=True, slots=True)
class Scored(Generic[R]):
    """A search result and its score from the target's reranker (higher is better)."""

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


@dataclass(slots=True)
class _Search:
    """One search's inputs and the records it has loaded."""

    store: Store
    query: str
    vector: Vector
    scope: Scope
    center: str | None
    origins: tuple[str, ...]
    cross_encoder: CrossEncoder
    reference_time: datetime
    single_valued: Callable[[str], bool]
    records: dict[tuple[Kind, str], Record | None] = field(default_factory=dict)

    def load(self, kind: Kind, ids: Sequence[str]) -> list[Record | None]:
        return self.load_together([(kind, ids)])[0]

    def load_together(self, asks: Sequence[tuple[Kind, Sequence[str]]]) -> list[list[Record | None]]:
        """The records of each ``(kind, ids)``, in order; those not read yet in one store call."""
        missing = [(kind, todo) for kind, ids in asks if (todo := [i for i in ids if (kind, i) not in self.records])]
        if missing:
            for (kind, ids), records in zip(missing, self.store.get_together(missing), strict=True):
                self.records.update(((kind, i), record) for i, record in zip(ids, records, strict=True))
        return [[self.records[(kind, i)] for i in ids] for kind, ids in asks]


def search(
    store: Store,
    query: str,
    vector: Vector,
    scope: Scope,
    config: SearchConfig,
    *,
    center: str | None = None,
    origins: Sequence[str] = (),
    cross_encoder: CrossEncoder | None = None,
    reference_time: datetime | None = None,
    single_valued: Callable[[str], bool] = lambda relation: False,
) -> SearchResults:
    """Run ``config`` for ``query`` (and its embedding ``vector``) within ``scope``.

    ``center`` is the entity the node-distance reranker measures from (and a BFS origin when ``bfs_origin`` is
    ``given`` and no ``origins`` are passed); it must exist and be visible in ``scope``, else
    :class:`tkg.errors.NotFoundError`. ``reference_time`` (default: the scope's time) anchors time phrases in
    the query for the episode-context reranker. ``cross_encoder`` defaults to :class:`TermOverlapScorer`.
    ``single_valued``: the ontology's rule, by which the episode-mentions reranker knows one statement's facts.
    """
    if center is not None:
        _check_visible(store, scope, center, "center entity")
    for origin in origins:
        _check_visible(store, scope, origin, "BFS origin entity")
    run = _Search(
        store=store,
        query=query,
        vector=vector,
        scope=scope,
        center=center,
        origins=tuple(origins),
        cross_encoder=cross_encoder or TermOverlapScorer(),
        reference_time=reference_time or scope.as_of or scope.known_at,
        single_valued=single_valued,
    )
    candidates = _candidates(run, config)
    ranked: dict[str, list[Hit]] = {}
    for target in config.targets:
        target_config = getattr(config, target)
        hits = _rank(run, TARGET_KINDS[target], target_config, candidates[target])
        if target_config.min_score is not None:
            hits = [h for h in hits if h.score >= target_config.min_score]
        ranked[target] = hits[: target_config.limit]
    shown = run.load_together([(TARGET_KINDS[target], [h.id for h in hits]) for target, hits in ranked.items()])
    found: dict[str, list[Scored[Record]]] = {
        target: [Scored(run.scope.shown(r), h.score) for r, h in zip(records, hits, strict=True) if r is not None]
        for (target, hits), records in zip(ranked.items(), shown, strict=True)
    }
    return SearchResults(query=query, **found)  # type: ignore[arg-type]


def _check_visible(store: Store, scope: Scope, entity_id: str, what: str) -> None:
    record = store.get(Kind.ENTITY, [entity_id])[0] if isinstance(entity_id, str) else None
    # Another tenant's entity is reported exactly like a missing one: its existence is not revealed.
    if record is None or not scope.unfiltered().admits(record):
        raise NotFoundError(f"{what} {entity_id!r} does not exist in the searched groups at the searched time")


#: How far below ``min_similarity`` a cosine may come and still count as reaching it: float32 rounding, which
#: differs between backends (pgvector computes a distance, 1 - cosine), must not decide what is found.
COSINE_TOLERANCE = 1e-6


# -- φ: candidates --------------------------------------------------------------------------------------------
#: The methods a store answers (:meth:`tkg.storage.Store.candidates`), in the order their lists are fused.
_STORE_METHODS: dict[Method, Literal["cosine", "bm25"]] = {Method.COSINE: "cosine", Method.BM25: "bm25"}


def _candidates(run: _Search, config: SearchConfig) -> dict[str, dict[Method, list[Hit]]]:
    """Every target's cosine and BM25 lists, asked of the store in one call (a database answers them at once)."""
    asks = [
        (target, Candidates(name, TARGET_KINDS[target], getattr(config, target).fetch))
        for target in config.targets
        for method, name in _STORE_METHODS.items()
        if method in getattr(config, target).methods
    ]
    answers = run.store.candidates([ask for _, ask in asks], run.query, run.vector, run.scope)
    lists: dict[str, dict[Method, list[Hit]]] = {target: {} for target in config.targets}
    for (target, ask), hits in zip(asks, answers, strict=True):
        if ask.method == Method.COSINE:
            # compared with a float32 tolerance: an orthogonal record scores 0.0 in one backend and -1e-8 in another
            floor = getattr(config, target).min_similarity - COSINE_TOLERANCE
            hits = [h for h in hits if h.score >= floor]
        lists[target][Method(ask.method)] = hits
    return lists


def _rank(run: _Search, kind: Kind, config: TargetConfig, lists: dict[Method, list[Hit]]) -> list[Hit]:
    if Method.BFS in config.methods:
        lists[Method.BFS] = _bfs(run, kind, config, lists)
    return _rerank(run, kind, config, lists)


def _bfs(run: _Search, kind: Kind, config: TargetConfig, lists: dict[Method, list[Hit]]) -> list[Hit]:
    """Records within ``bfs_depth`` hops of the origins, nearest first (score ``1 / (1 + hops)``)."""
    origins = _bfs_origins(run, kind, config, lists)
    if not origins:
        return []
    fetch = config.fetch
    # Only the nearest entities are needed: the walk stops after enough of them (hubs make neighbourhoods huge).
    reach = len(origins) + (fetch if kind is Kind.ENTITY else config.limit)
    hops = run.store.bfs(origins, config.bfs_depth, run.scope.unfiltered(), limit=reach)
    by_hop = sorted(hops, key=lambda e: (hops[e], e))  # by id within a hop: deterministic
    skip_origins = config.bfs_origin is BfsOrigin.HITS  # the hits are ranked by their own methods already
    if kind is Kind.ENTITY:
        ids = [e for e in by_hop if not (skip_origins and hops[e] == 0)]
        return _admitted(run, Kind.ENTITY, ids, hops)[:fetch]
    if kind is Kind.FACT:
        found: dict[str, int] = {}
        for entity in by_hop:  # nearest first, so a big neighbourhood stops as soon as enough facts are found
            if hops[entity] >= config.bfs_depth or len(found) >= fetch:
                break
            for fact in run.store.facts_of([entity], run.scope):
                found.setdefault(fact.id, hops[entity])
        return [Hit(f, 1.0 / (1 + d)) for f, d in found.items()][:fetch]
    if kind is Kind.COMMUNITY:
        nearest: dict[str, int] = {}
        for membership in run.store.memberships(entity_ids=by_hop):
            hop = hops[membership.entity_id]
            if membership.community_id not in nearest or hop < nearest[membership.community_id]:
                nearest[membership.community_id] = hop
        return _admitted(run, Kind.COMMUNITY, sorted(nearest, key=nearest.__getitem__), nearest)[:fetch]
    return []


def _admitted(run: _Search, kind: Kind, ids: list[str], hops: dict[str, int]) -> list[Hit]:
    records = run.load(kind, ids)
    return [Hit(i, 1.0 / (1 + hops[i])) for i, r in zip(ids, records, strict=True) if r and run.scope.admits(r)]


def _bfs_origins(run: _Search, kind: Kind, config: TargetConfig, lists: dict[Method, list[Hit]]) -> list[str]:
    if config.bfs_origin is BfsOrigin.GIVEN:
        origins = list(run.origins) or ([run.center] if run.center else [])
        if not origins:
            raise ValidationError("BFS from given nodes needs origins=[entity ids] or center=entity id")
        return origins
    if config.bfs_origin is BfsOrigin.RECENT_EPISODES:
        scope = run.scope
        groups = sorted(scope.group_ids if scope.group_ids is not None else run.store.groups())
        before = scope.as_of if scope.explicit_as_of and scope.as_of is not None else scope.known_at
        episodes = [e.id for g in groups for e in _recent_seen(run.store, g, before, config.recent_episodes, scope)]
        return list(dict.fromkeys(m.entity_id for m in run.store.mentions(episode_ids=episodes))) if episodes else []
    # The best hits of the other methods (a wider start makes a neighbourhood of everything).
    top = list(dict.fromkeys(h.id for hits in lists.values() for h in hits[: config.bfs_seeds]))
    if kind is Kind.ENTITY:
        return top
    if kind is Kind.FACT:
        facts = [f for f in run.load(Kind.FACT, top) if isinstance(f, Fact)]
        return list(dict.fromkeys(e for f in facts for e in (f.source_id, f.target_id)))
    if kind is Kind.COMMUNITY:
        return list(dict.fromkeys(m.entity_id for m in run.store.memberships(community_ids=top))) if top else []
    return []


def _recent_seen(store: Store, group_id: str, before: datetime, n: int, scope: Scope) -> list[Episode]:
    """The ``n`` latest episodes of a group up to ``before`` that the view sees, oldest first. A view of the past
    reads further back where episodes recorded later (a backfill of earlier turns) crowd the latest, up to
    :data:`_RECENT_MOST` times ``n``."""
    sees = scope.unfiltered().admits
    want = n
    while True:
        found = store.recent_episodes(group_id, before, want)
        seen = [e for e in found if sees(e)]
        if len(seen) >= n or len(found) < want or want >= n * _RECENT_MOST:
            return seen[-n:] if n > 0 else []
        want *= 4


# -- ρ: rerankers ---------------------------------------------------------------------------------------------
def _rerank(run: _Search, kind: Kind, config: TargetConfig, lists: dict[Method, list[Hit]]) -> list[Hit]:
    reranker = config.reranker
    if reranker is Reranker.EPISODE_CONTEXT:
        assert config.context is not None
        return rerank_episodes(
            run.store,
            run.query,
            run.scope,
            config.context,
            lists,
            config.limit,
            run.reference_time,
            run.load,
            run.vector,
        )
    fused = rrf(list(lists.values()), config.rrf_k)
    if reranker is Reranker.RRF:
        return fused
    if reranker is Reranker.MMR:
        return _mmr(run, kind, config, fused)
    if reranker is Reranker.EPISODE_MENTIONS:
        return reorder(fused, _mention_counts(run, kind, [h.id for h in fused]))
    if reranker is Reranker.NODE_DISTANCE:
        return reorder(fused, _closeness(run, kind, config, [h.id for h in fused]))
    if reranker is Reranker.CROSS_ENCODER:
        head = fused[: config.fetch]
        texts = [_passage(r) for r in run.load(kind, [h.id for h in head])]
        scores = run.cross_encoder.score(run.query, texts)
        if len(scores) != len(head):
            raise ValidationError(f"the cross-encoder returned {len(scores)} scores for {len(head)} passages")
        given = {h.id: float(s) for h, s in zip(head, scores, strict=True)}
        if any(math.isnan(score) for score in given.values()):
            raise ValidationError("the cross-encoder returned NaN for a passage (a score orders nothing)")
        return reorder(head, given)
    raise ValidationError(f"unknown reranker {reranker!r}")  # pragma: no cover - the config validates it


def _mmr(run: _Search, kind: Kind, config: TargetConfig, fused: list[Hit]) -> list[Hit]:
    records = run.load(kind, [h.id for h in fused])
    pairs = [(r.id, v) for r in records if r is not None and (v := vector_of(r)) is not None]
    if not pairs:
        return []
    vectors = np.stack([v for _, v in pairs]).astype(np.float32)
    # unit rows: a store may hand back vectors that are not quite (reduced precision rounds them)
    return mmr(
        run.vector, [i for i, _ in pairs], vectors * inverse_norms(vectors)[:, None], config.mmr_lambda, config.fetch
    )


def _mention_counts(run: _Search, kind: Kind, ids: list[str]) -> dict[str, float]:
    """Facts: the episodes that stated them, as the view knows them (a restatement recorded after ``known_at`` is
    not counted) -- with those of the other facts of the same statement between the same two entities, as the
    history decides it (:func:`tkg.invalidation.statements`: verbatim, one single-valued slot, or judged the same
    by the LLM): a statement said again later is a fact of its own, superseded by the one that holds, and its
    saying counts for it. It reads every fact between the shown facts' ends. Entities: the visible episodes that
    mention them."""
    if kind is Kind.FACT:
        scope = run.scope
        facts = [scope.shown(r) for r in run.load(Kind.FACT, ids) if isinstance(r, Fact)]
        pairs = sorted({(f.source_id, f.target_id) for f in facts})
        known = {f.id: scope.shown(f) for f in run.store.facts_between(pairs) if f.created_at <= scope.known_at}
        known.update((f.id, f) for f in facts)
        classes, _ = statements(list(known.values()), run.single_valued)
        said = statement_episodes(list(known.values()), {i: classes.find(i) for i in known})
        return {fact.id: float(len(said[classes.find(fact.id)])) for fact in facts}
    if kind is Kind.ENTITY and ids:
        mentions = run.store.mentions(entity_ids=ids)
        visible = {
            e.id
            for e in run.load(Kind.EPISODE, list(dict.fromkeys(m.episode_id for m in mentions)))
            if e is not None and run.scope.unfiltered().admits(e)
        }
        counts: dict[str, float] = {}
        for m in mentions:
            if m.episode_id in visible:
                counts[m.entity_id] = counts.get(m.entity_id, 0.0) + 1.0
        return counts
    return {}


def _closeness(run: _Search, kind: Kind, config: TargetConfig, ids: list[str]) -> dict[str, float]:
    """``1 / (1 + shortest-path hops)`` from the centre over visible facts (a fact: its nearer end); 0 when out of
    reach."""
    if run.center is None:
        raise ValidationError("the node_distance reranker needs a center entity (center=entity id)")
    hops = run.store.bfs([run.center], config.max_distance, run.scope.unfiltered())
    if kind is Kind.ENTITY:
        return {i: 1.0 / (1 + hops[i]) for i in ids if i in hops}
    out: dict[str, float] = {}
    if kind is Kind.FACT:
        for fact in run.load(Kind.FACT, ids):
            if isinstance(fact, Fact):
                near = [hops[e] for e in (fact.source_id, fact.target_id) if e in hops]
                if near:
                    out[fact.id] = 1.0 / (1 + min(near))
    return out


def _passage(record: Record | None) -> str:
    if isinstance(record, Fact):
        return record.fact
    if isinstance(record, Entity | Community):
        return f"{record.name}: {record.summary}" if record.summary else record.name
    if isinstance(record, Episode):
        return record.content
    return ""
