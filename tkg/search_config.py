"""What a search does, as immutable values passed per call: methods, limits and rerankers per target, and presets.

A :class:`SearchConfig` holds one :class:`TargetConfig` per target (facts, entities, episodes, communities;
``None`` leaves a target out). Nothing here is mutated by a search: change a copy with :meth:`SearchConfig.with_limit`
or :func:`dataclasses.replace`.

>>> config = preset("hybrid").with_limit(5)
>>> config.facts.limit, config.facts.methods
(5, (<Method.COSINE: 'cosine'>, <Method.BM25: 'bm25'>))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from types import MappingProxyType

from tkg.config_fields import check_field_types
from tkg.errors import ConfigurationError, ValidationError
from tkg.models import Kind


class Method(StrEnum):
    """Search methods φ: cosine similarity, BM25 full text, breadth-first search over the graph."""

    COSINE = "cosine"
    BM25 = "bm25"
    BFS = "bfs"


class Reranker(StrEnum):
    """Rerankers ρ. ``episode_context`` is tkg's own, for episodes: see :class:`EpisodeContext`."""

    RRF = "rrf"
    MMR = "mmr"
    EPISODE_MENTIONS = "episode_mentions"
    NODE_DISTANCE = "node_distance"
    CROSS_ENCODER = "cross_encoder"
    EPISODE_CONTEXT = "episode_context"


class BfsOrigin(StrEnum):
    """Where breadth-first search starts: the other methods' hits, the entities of the most recent episodes, or
    the entity ids given to the search call (``origins=``, else its ``center``)."""

    HITS = "hits"
    RECENT_EPISODES = "recent_episodes"
    GIVEN = "given"


_ALLOWED: dict[str, tuple[frozenset[Method], frozenset[Reranker]]] = {
    "facts": (frozenset(Method), frozenset(Reranker) - {Reranker.EPISODE_CONTEXT}),
    "entities": (frozenset(Method), frozenset(Reranker) - {Reranker.EPISODE_CONTEXT}),
    "episodes": (
        frozenset({Method.COSINE, Method.BM25}),
        frozenset({Reranker.RRF, Reranker.MMR, Reranker.CROSS_ENCODER, Reranker.EPISODE_CONTEXT}),
    ),
    "communities": (frozenset(Method), frozenset({Reranker.RRF, Reranker.MMR, Reranker.CROSS_ENCODER})),
}

#: The kind of record each target returns.
TARGET_KINDS: MappingProxyType[str, Kind] = MappingProxyType(
    {"facts": Kind.FACT, "entities": Kind.ENTITY, "episodes": Kind.EPISODE, "communities": Kind.COMMUNITY}
)


@dataclass(frozen=True, slots=True)
class EpisodeContext:
    """Parameters of the ``episode_context`` reranker, which ranks episodes (conversation turns) with what the
    memory knows beyond their text.

    * base score: BM25 and cosine, each min-max normalised over the candidates, weighted and summed;
    * session: episodes of a group whose reference times follow each other within ``session_gap`` form a
      session; each candidate gains ``session_weight`` times its session's score relative to the best session's:
      the sum of its three best candidates' base scores. A session longer than the reranker's scan (48
      episodes either side) gains nothing: its bounds are not known (episodes imported without times of their
      own are all stamped within seconds, and would otherwise make one endless session). With
      ``session_document`` (off by default: it costs a tokenisation of every candidate session) a session is
      scored as one document instead: BM25 of the query over the candidates' sessions taken as documents, and
      the cosine of the session's mean vector with the query's, each normalised over the sessions and averaged
      (an answer spread over several turns of one session counts as one match);
    * neighbours: the ``neighbours`` episodes on either side within the session lend ``neighbour_weight``
      times their best base score (a reply inherits relevance from the question it answers); neighbours of
      the best candidates join the candidates even when no method found them;
    * entities: episodes that mention an entity named in the query (a speaker, with no LLM) gain
      ``entity_weight``;
    * time: when the query names a time ("last week", "in May 2023", "3 days ago"), resolved against the
      search's reference time, episodes within ``time_window`` of it gain ``time_weight``.

    Two more mechanisms, off by default because they lowered recall on the benchmark's dev sets (measured in
    ``benchmarks/bench_retrieval.py``; kept for memories unlike those):

    * ``expansion_terms`` (pseudo-relevance feedback): the words shared by at least two of the
      ``expansion_docs`` best candidates and absent from the query are searched with BM25, and the episodes they
      find gain ``expansion_weight`` times that normalised score (the vocabulary of the answer, not the question's);
    * ``session_decay``: the n-th candidate of one session (by score, from 0) loses ``n * session_decay``, so
      that evidence spread over several sessions is not crowded out by one strong session.
    """

    bm25_weight: float = 1.0
    cosine_weight: float = 1.0
    session_weight: float = 0.3
    session_gap: timedelta = timedelta(minutes=30)
    neighbours: int = 1
    neighbour_weight: float = 0.15
    entity_weight: float = 0.1
    time_weight: float = 0.2
    time_window: timedelta = timedelta(days=3)
    expansion_terms: int = 0
    expansion_docs: int = 3
    expansion_weight: float = 0.5
    session_document: bool = False
    session_decay: float = 0.0

    def __post_init__(self) -> None:
        for name in (
            "bm25_weight",
            "cosine_weight",
            "session_weight",
            "neighbour_weight",
            "entity_weight",
            "expansion_weight",
            "session_decay",
        ):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"EpisodeContext.{name} must be >= 0")
        if self.time_weight < 0 or self.neighbours < 0 or self.expansion_terms < 0:
            raise ConfigurationError("EpisodeContext.time_weight, neighbours and expansion_terms must be >= 0")
        if self.expansion_docs < 2:
            raise ConfigurationError("EpisodeContext.expansion_docs must be >= 2 (a term must be in two of them)")
        if self.session_gap < timedelta(0) or self.time_window < timedelta(0):
            raise ConfigurationError("EpisodeContext.session_gap and time_window must not be negative")


@dataclass(frozen=True, slots=True)
class TargetConfig:
    """How one target is searched and reranked.

    ``min_similarity`` drops cosine candidates below it (before fusion); ``min_score`` drops reranked results
    whose score is below it (scores are returned with the results, so the scale is the reranker's own).
    """

    methods: tuple[Method, ...] = (Method.COSINE, Method.BM25)
    reranker: Reranker = Reranker.RRF
    limit: int = 10
    #: each method fetches ``limit * candidate_factor`` candidates before reranking
    candidate_factor: int = 3
    min_similarity: float = 0.0
    min_score: float | None = None
    rrf_k: int = 60
    mmr_lambda: float = 0.5
    bfs_depth: int = 2
    bfs_origin: BfsOrigin = BfsOrigin.HITS
    #: BfsOrigin.HITS: how many of each other method's best hits the walk starts from
    bfs_seeds: int = 5
    #: BfsOrigin.RECENT_EPISODES: how many of each group's latest episodes give their entities
    recent_episodes: int = 3
    #: node_distance: how far from the centre distances are computed (farther counts as unreachable)
    max_distance: int = 4
    context: EpisodeContext | None = None

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "methods", tuple(dict.fromkeys(Method(m) for m in self.methods)))
            object.__setattr__(self, "reranker", Reranker(self.reranker))
            object.__setattr__(self, "bfs_origin", BfsOrigin(self.bfs_origin))
        except ValueError as exc:
            raise ConfigurationError(f"TargetConfig: {exc}") from None
        check_field_types(self)
        if not self.methods:
            raise ConfigurationError("TargetConfig.methods is empty; name at least one of cosine, bm25, bfs")
        for name in ("limit", "candidate_factor", "rrf_k", "bfs_depth", "bfs_seeds", "recent_episodes", "max_distance"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigurationError(f"TargetConfig.{name} must be a positive integer, got {value!r}")
        if not 0.0 <= self.mmr_lambda <= 1.0:
            raise ConfigurationError(f"TargetConfig.mmr_lambda must be within [0, 1], got {self.mmr_lambda}")
        if not -1.0 <= self.min_similarity <= 1.0:
            raise ConfigurationError(f"TargetConfig.min_similarity must be within [-1, 1], got {self.min_similarity}")
        if self.reranker is Reranker.EPISODE_CONTEXT and self.context is None:
            object.__setattr__(self, "context", EpisodeContext())

    @property
    def fetch(self) -> int:
        return self.limit * self.candidate_factor


@dataclass(frozen=True, slots=True)
class SearchConfig:
    """One search: a :class:`TargetConfig` per target searched (``None``: not searched)."""

    facts: TargetConfig | None = None
    entities: TargetConfig | None = None
    episodes: TargetConfig | None = None
    communities: TargetConfig | None = None

    def __post_init__(self) -> None:
        for target, (methods, rerankers) in _ALLOWED.items():
            config = getattr(self, target)
            if config is None:
                continue
            if not isinstance(config, TargetConfig):
                raise ConfigurationError(f"SearchConfig.{target} must be a TargetConfig or None")
            bad = [m.value for m in config.methods if m not in methods]
            if bad:
                raise ConfigurationError(
                    f"{target} cannot be searched by {bad}; use {sorted(m.value for m in methods)}"
                )
            if config.reranker not in rerankers:
                raise ConfigurationError(
                    f"{target} cannot be reranked by {config.reranker.value!r}; "
                    f"use {sorted(r.value for r in rerankers)}"
                )
        if not self.targets:
            raise ConfigurationError("SearchConfig searches nothing; configure at least one target")

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(t for t in TARGET_KINDS if getattr(self, t) is not None)

    def with_limit(self, limit: int) -> SearchConfig:
        """A copy with every target's ``limit`` set to ``limit``."""
        return SearchConfig(
            **{t: dataclasses.replace(getattr(self, t), limit=limit) for t in self.targets}  # type: ignore[arg-type]
        )

    def only(self, targets: Sequence[str]) -> SearchConfig:
        """A copy that searches only ``targets`` (those of them this config has)."""
        unknown = [t for t in targets if t not in TARGET_KINDS]
        if unknown:
            raise ConfigurationError(f"unknown search targets {unknown}; choose from {list(TARGET_KINDS)}")
        return SearchConfig(**{t: getattr(self, t) for t in targets if getattr(self, t) is not None})


_HYBRID = TargetConfig()
_WITH_BFS = TargetConfig(methods=(Method.COSINE, Method.BM25, Method.BFS))

#: Named presets. ``hybrid`` is what :meth:`tkg.Memory.search` does when given no config.
PRESETS: MappingProxyType[str, SearchConfig] = MappingProxyType(
    {
        "hybrid": SearchConfig(facts=_HYBRID, entities=_HYBRID, episodes=_HYBRID),
        "hybrid_bfs": SearchConfig(facts=_WITH_BFS, entities=_WITH_BFS, episodes=_HYBRID),
        "hybrid_mmr": SearchConfig(
            facts=TargetConfig(reranker=Reranker.MMR),
            entities=TargetConfig(reranker=Reranker.MMR),
            episodes=TargetConfig(reranker=Reranker.MMR),
        ),
        "cross_encoder": SearchConfig(
            facts=TargetConfig(methods=_WITH_BFS.methods, reranker=Reranker.CROSS_ENCODER),
            entities=TargetConfig(methods=_WITH_BFS.methods, reranker=Reranker.CROSS_ENCODER),
            episodes=TargetConfig(reranker=Reranker.CROSS_ENCODER),
            communities=TargetConfig(reranker=Reranker.CROSS_ENCODER, limit=3),
        ),
        "node_distance": SearchConfig(
            facts=TargetConfig(methods=_WITH_BFS.methods, reranker=Reranker.NODE_DISTANCE, bfs_origin=BfsOrigin.GIVEN),
            entities=TargetConfig(
                methods=_WITH_BFS.methods, reranker=Reranker.NODE_DISTANCE, bfs_origin=BfsOrigin.GIVEN
            ),
        ),
        "episode_mentions": SearchConfig(
            facts=TargetConfig(reranker=Reranker.EPISODE_MENTIONS),
            entities=TargetConfig(reranker=Reranker.EPISODE_MENTIONS),
        ),
        "recent": SearchConfig(
            facts=TargetConfig(methods=_WITH_BFS.methods, bfs_origin=BfsOrigin.RECENT_EPISODES),
            entities=TargetConfig(methods=_WITH_BFS.methods, bfs_origin=BfsOrigin.RECENT_EPISODES),
            episodes=_HYBRID,
        ),
        "full": SearchConfig(facts=_WITH_BFS, entities=_WITH_BFS, episodes=_HYBRID, communities=_WITH_BFS),
        "facts": SearchConfig(facts=_HYBRID),
        "entities": SearchConfig(entities=_HYBRID),
        "episodes": SearchConfig(episodes=_HYBRID),
        "communities": SearchConfig(communities=TargetConfig(limit=3)),
        "conversation": SearchConfig(
            episodes=TargetConfig(reranker=Reranker.EPISODE_CONTEXT, candidate_factor=5),
        ),
    }
)


def preset(name: str) -> SearchConfig:
    """The named preset (see :data:`PRESETS`)."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigurationError(f"no search preset {name!r}; choose from {sorted(PRESETS)}") from None


def choose(
    config: SearchConfig | str | None,
    limit: int | None,
    targets: Sequence[str] | str | None,
    *,
    default: SearchConfig | None,
    target_default: TargetConfig,
) -> SearchConfig:
    """The configuration one search call runs: ``config`` (a preset name; None: ``default``, or when that is None
    ``target_default`` for facts, entities and episodes), narrowed to ``targets`` and ``limit`` when given. Raises
    :class:`tkg.errors.ValidationError` for a bad limit or target, or targets the configuration does not search."""
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ValidationError(f"limit must be a positive integer, got {limit!r}")
    if targets is not None:
        targets = [targets] if isinstance(targets, str) else list(targets)
        unknown = [t for t in targets if t not in TARGET_KINDS]
        if unknown or not targets:
            raise ValidationError(f"unknown search targets {unknown}; choose from {list(TARGET_KINDS)}")
    if config is None and default is None:
        chosen = SearchConfig(**{t: target_default for t in targets or ("facts", "entities", "episodes")})
    else:
        if isinstance(config, str):
            chosen = preset(config)
        elif config is None:
            chosen = default  # type: ignore[assignment]
        elif isinstance(config, SearchConfig):
            chosen = config
        else:
            raise ValidationError(f"config must be a SearchConfig or a preset name, got {type(config).__name__}")
        if targets is not None:
            missing = [t for t in targets if getattr(chosen, t) is None]
            if missing:
                raise ValidationError(f"the search config does not search {missing}; add them to it or drop them")
            chosen = chosen.only(targets)
    return chosen if limit is None else chosen.with_limit(limit)
