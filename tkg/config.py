"""Immutable configuration, passed explicitly. Nothing is read from the environment."""

from __future__ import annotations

from dataclasses import dataclass, field

from tkg.community_tier import CommunityConfig
from tkg.errors import ConfigurationError
from tkg.llm.guard import LLMPolicy
from tkg.resolution import ResolutionRules
from tkg.search_config import SearchConfig


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    """How a :class:`tkg.Memory` behaves.

    >>> MemoryConfig(search_limit=5).search_limit
    5
    """

    #: Group used when a call names none.
    default_group: str = "default"
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
    #: summarise the communities that changed. None: no communities unless :meth:`Memory.refresh_communities`.
    communities: CommunityConfig | None = field(default_factory=lambda: CommunityConfig(summarize_on_extend=False))

    def __post_init__(self) -> None:
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
