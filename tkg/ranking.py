"""Rank fusion and reranking: pure functions over ids and scores, no store involved."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from tkg.cosines import bounded
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


def mmr(
    query: npt.NDArray[np.float32], ids: Sequence[str], vectors: npt.NDArray[np.float32], lam: float, k: int
) -> list[Hit]:
    """Greedy maximal marginal relevance: repeatedly take the candidate maximising
    ``lam * sim(query, d) - (1 - lam) * max(0, max sim(d, chosen))``; its score is that value when it was taken.
    Redundancy is never negative: a candidate unlike what was chosen is not redundant, and no more (its score
    would rise above those taken before it: scores must fall down the list, ``min_score`` cuts at its bottom).

    Vectors are unit length (cosine = dot product; the caller normalises them). ``lam = 1`` is plain cosine
    order.

    >>> import numpy as np
    >>> v = np.array([[1, 0], [1, 0], [0.6, 0.8]], dtype=np.float32)
    >>> [h.id for h in mmr(np.array([1, 0], dtype=np.float32), ["a", "a2", "b"], v, 0.3, 2)]
    ['a', 'b']
    """
    n = len(ids)
    if n == 0 or k <= 0:
        return []
    # einsum, not `@`: multithreaded BLAS is ~100x slower under CPU contention (see backends/memory/vectors.py)
    relevance = bounded(np.einsum("ij,j->i", vectors, query))  # a cosine: within [-1, 1]
    redundancy = np.zeros(n, dtype=np.float32)
    taken = np.zeros(n, dtype=bool)
    out: list[Hit] = []
    for _ in range(min(k, n)):
        scores = np.where(taken, -np.inf, lam * relevance - (1.0 - lam) * redundancy)
        best = int(np.argmax(scores))  # first maximum: ties keep candidate order
        taken[best] = True
        out.append(Hit(ids[best], float(scores[best])))
        redundancy = np.maximum(redundancy, np.einsum("ij,j->i", vectors, vectors[best]))
    return out


def normalized(hits: Sequence[Hit]) -> dict[str, float]:
    """Min-max normalised scores of a ranked list (one item, or all equal: 1.0)."""
    if not hits:
        return {}
    values = [h.score for h in hits]
    low, high = min(values), max(values)
    span = high - low
    return {h.id: (1.0 if span <= 0 else (h.score - low) / span) for h in hits}


def reorder(hits: Sequence[Hit], key_scores: dict[str, float]) -> list[Hit]:
    """``hits`` sorted by ``key_scores`` (higher first; missing = 0), ties kept in their order; returns the new
    scores."""
    scored = [Hit(h.id, key_scores.get(h.id, 0.0)) for h in hits]
    order = {h.id: i for i, h in enumerate(hits)}
    return sorted(scored, key=lambda h: (-h.score, order[h.id]))
