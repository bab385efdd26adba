"""Rank fusion and reranking: pure functions over ids and scores, no store involved."""

from __future__ import annotations

from collections.abc import Sequence

from tkg.storage import Hit


def rrf(rankings: Sequence[Sequence[Hit]], k: int = 60) -> list[Hit]:
    """Reciprocal rank fusion: ``score(d) = sum over lists of 1 / (k + rank)``, ranks from 1.

    Ties keep the order of first appearance, so results are deterministic.

    >>> [h.id for h in rrf([[Hit("a", 9), Hit("b", 8)], [Hit("b", 1.0)]])]
    ['b', 'a']
    """
    scores: dict[str, float] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking, start=1):
            scores[hit.id] = scores.get(hit.id, 0.0) + 1.0 / (k + rank)
    order = {key: i for i, key in enumerate(scores)}
    return [Hit(i, s) for i, s in sorted(scores.items(), key=lambda item: (-item[1], order[item[0]]))]
