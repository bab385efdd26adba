"""Immutable configuration, passed explicitly. Nothing is read from the environment."""

from __future__ import annotations

from dataclasses import dataclass

from tkg.errors import ConfigurationError


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
    #: Languages passed to dateparser (auto-detection can take seconds per phrase).
    date_languages: tuple[str, ...] = ("en",)

    def __post_init__(self) -> None:
        for name in ("max_episode_chars", "search_limit", "candidate_factor", "rrf_k"):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"MemoryConfig.{name} must be at least 1")
        if self.context_episodes < 0:
            raise ConfigurationError("MemoryConfig.context_episodes must be >= 0")
