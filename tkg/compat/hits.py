"""What the framework adapters hand back from a tkg search: one ranked list of its facts and episodes, and each
record as a passage (its text and the metadata a framework keeps beside it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tkg.models import Episode, EpisodeStatus, Fact
from tkg.search import SearchResults
from tkg.timeutil import iso_offset

__all__ = ["merged", "passage", "unextracted"]


def merged(found: SearchResults, keep: Callable[[Episode], bool] | None = None) -> list[tuple[float, Fact | Episode]]:
    """(score, record) of the facts and the episodes (those ``keep`` accepts) of a search, best first; each list's
    scores come from the same fused ranking, so they interleave."""
    scored: list[tuple[float, Fact | Episode]] = [(hit.score, hit.record) for hit in found.facts]
    scored += [(hit.score, hit.record) for hit in found.episodes if keep is None or keep(hit.record)]
    scored.sort(key=lambda pair: -pair[0])
    return scored


def unextracted(episode: Episode) -> bool:
    """An episode whose facts do not stand for it (stored without extraction, or failed): what an adapter shows
    beside the facts. An extracted episode is shown by its facts, which say when each held (its raw text, or the
    JSON of an ``add_facts`` batch, would state as current what has ended since)."""
    return episode.status is not EpisodeStatus.EXTRACTED


def passage(record: Fact | Episode) -> tuple[str, dict[str, Any]]:
    """A record's text (a fact's sentence, an episode's content) and its metadata: kind, group and times."""
    if isinstance(record, Fact):
        times = {"valid_at": iso_offset(record.valid_at), "invalid_at": iso_offset(record.invalid_at)}
        return record.fact, {"kind": "fact", "group_id": record.group_id, **times}
    return record.content, {
        "kind": "episode",
        "group_id": record.group_id,
        "reference_time": record.reference_time.isoformat(),
    }
