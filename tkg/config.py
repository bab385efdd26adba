"""Immutable configuration, passed explicitly. Nothing is read from the environment."""

from __future__ import annotations

from dataclasses import dataclass, field

from tkg.config_fields import check_field_types
from tkg.errors import ConfigurationError
from tkg.llm.guard import LLMPolicy
from tkg.resolution import ResolutionRules
from tkg.search_config import SearchConfig


@dataclass(frozen=True, slots=True)
class CommunityConfig:
    """How communities are detected, summarised and refreshed.

    >>> CommunityConfig(refresh_after_changes=50).refresh_after_changes
    50
    """

    #: Seed of label propagation's tie-breaking and visiting order (and of the extension's tie-breaking).
    seed: int = 0
    #: Bound on label propagation sweeps; a run that hits it keeps its last labels (the report says so).
    max_iterations: int = 100
    #: Sweeps that break ties at random before retention sets in (see :func:`tkg.communities.label_propagation`).
    explore_sweeps: int = 10
    #: Best-connected members whose summaries feed a community's LLM summary.
    summary_members: int = 100
    #: Characters per LLM summarisation call (map-reduce chunk size).
    chunk_chars: int = 6_000
    #: Without an LLM, a community is named after this many of its best-connected members.
    name_members: int = 3
    #: Without an LLM, the member list that serves as summary is cut at this many characters.
    summary_chars: int = 1_000
    #: With an LLM, update a community's summary (one call) when :meth:`CommunityTier.extend` adds members.
    summarize_on_extend: bool = True
    #: Refresh a group after this many graph changes seen by :meth:`CommunityTier.extend` (None: never by count;
    #: see also ``policy_fraction``).
    refresh_after_changes: int | None = 1_000
    #: Refresh a group when its drift exceeds this (None: never by drift).
    refresh_drift: float | None = 0.1
    #: Changes between two drift checks (each check is a detection run, without summaries).
    drift_check_every: int = 200
    #: The policy scales with the group: a refresh by count waits for at least this fraction of the group's
    #: entities in changes, and so does a drift check (each is a full detection run, whose cost grows with the
    #: group). 0 disables the scaling.
    policy_fraction: float = 0.02
    #: Refreshes (also those of the policy) re-converge from the stored communities instead of starting over.
    warm_refresh: bool = False

    def __post_init__(self) -> None:
        check_field_types(self)
        for name in ("max_iterations", "summary_members", "name_members", "summary_chars", "drift_check_every"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"CommunityConfig.{name} must be at least 1")
        if self.explore_sweeps < 0:
            raise ConfigurationError("CommunityConfig.explore_sweeps must be >= 0")
        if self.chunk_chars < 200:
            raise ConfigurationError("CommunityConfig.chunk_chars must be at least 200")
        if self.refresh_after_changes is not None and self.refresh_after_changes < 1:
            raise ConfigurationError("CommunityConfig.refresh_after_changes must be at least 1 (or None)")
        if self.refresh_drift is not None and not 0.0 <= self.refresh_drift <= 1.0:
            raise ConfigurationError("CommunityConfig.refresh_drift must be between 0 and 1 (or None)")
        if not 0.0 <= self.policy_fraction <= 1.0:
            raise ConfigurationError("CommunityConfig.policy_fraction must be between 0 and 1")


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """How a :class:`tkg.Memory` behaves.

    >>> MemoryConfig(search_limit=5).search_limit
    5
    """

    #: Group used when a call names none.
    default_group: str = "default"
    #: A search naming a group that holds nothing finds nothing (as for a user not seen yet). True: it raises
    #: :class:`tkg.errors.UnknownGroupError` instead, a guard against a misspelt group id.
    strict_groups: bool = False
    #: Episodes longer than this are refused (split them); an LLM prompt cannot hold arbitrarily much.
    max_episode_chars: int = 100_000
    #: Earlier episodes of the same group given to the extraction prompt as context.
    context_episodes: int = 4
    #: Results per target that :meth:`Memory.search` returns by default.
    search_limit: int = 10
    #: Each search method fetches ``limit * candidate_factor`` candidates before fusion.
    candidate_factor: int = 3
    #: Reciprocal rank fusion constant.
    rrf_k: int = 60
    #: The search a call without ``config=`` runs; None: the ``hybrid`` preset with the three numbers above.
    search: SearchConfig | None = None
    #: Longer queries are refused (an embedder truncates them anyway, and BM25 would score thousands of terms).
    max_query_chars: int = 10_000
    #: Languages passed to dateparser (auto-detection can take seconds per phrase).
    date_languages: tuple[str, ...] = ("en",)
    #: A second extraction call per episode asking what the first one missed (off: one call fewer per episode).
    reflection: bool = False
    #: Retries, back-off, concurrency and rate limits of every LLM call.
    llm_policy: LLMPolicy = field(default_factory=LLMPolicy)
    #: Thresholds of deterministic entity resolution.
    resolution: ResolutionRules = field(default_factory=ResolutionRules)
    #: Existing facts per new fact shown to the LLM when deciding duplicates and contradictions.
    max_fact_candidates: int = 6
    #: Of those, facts under another relation that share an endpoint and whose sentence is close (cosine at least
    #: ``related_min_similarity``), so that "Ann MOVED_TO Berlin" meets "Ann LIVES_IN Paris" (0: off).
    related_fact_candidates: int = 2
    related_min_similarity: float = 0.3
    #: Entity summaries keep their newest sentences within this many characters.
    max_summary_chars: int = 600
    #: The community tier: new entities join their neighbours' community as episodes arrive, and the refresh
    #: policy re-runs detection when due (a refresh it triggers runs inside that ingestion call). Summaries are
    #: not re-asked of the LLM on every extension by default (that would cost calls per episode); refreshes
    #: summarise the communities whose members changed since their summary was written (by extension or a
    #: removal too: :attr:`tkg.models.Community.summarised`). None: no communities unless
    #: :meth:`Memory.refresh_communities`.
    communities: CommunityConfig | None = field(default_factory=lambda: CommunityConfig(summarize_on_extend=False))

    def __post_init__(self) -> None:
        check_field_types(self)
        for name in (
            "max_episode_chars",
            "search_limit",
            "candidate_factor",
            "rrf_k",
            "max_query_chars",
            "max_fact_candidates",
            "max_summary_chars",
        ):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"MemoryConfig.{name} must be at least 1")
        if self.context_episodes < 0:
            raise ConfigurationError("MemoryConfig.context_episodes must be >= 0")
        if self.related_fact_candidates < 0:
            raise ConfigurationError("MemoryConfig.related_fact_candidates must be >= 0")
        if not -1.0 <= self.related_min_similarity <= 1.0:
            raise ConfigurationError("MemoryConfig.related_min_similarity must be within [-1, 1]")
