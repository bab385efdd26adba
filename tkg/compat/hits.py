"""One ranked list from a tkg search's facts and episodes, as the adapters return it (they take one list)."""

from __future__ import annotations

from collections.abc import Callable

from tkg.models import Episode, Fact
from tkg.search import SearchResults

__all__ = ["merged"]


def merged(found: SearchResults, keep: Callable[[Episode], bool] | None = None) -> list[tuple[float, Fact | Episode]]:
    """(score, record) of the facts and the episodes (those ``keep`` accepts) of a search, best first; each list's
    scores come from the same fused ranking, so they interleave."""
    scored: list[tuple[float, Fact | Episode]] = [(hit.score, hit.record) for hit in found.facts]
    scored += [(hit.score, hit.record) for hit in found.episodes if keep is None or keep(hit.record)]
    scored.sort(key=lambda pair: -pair[0])
    return scored
