"""The k best of many scores, exactly: ids ranked by score, equal scores in id order (so a result depends only on
the set of (id, score) pairs), with a floor from a strided sample cutting a long array down first. Pure numpy; the
in-memory backend ranks its slots with it and PostgreSQL's BM25 the documents whose postings it scores.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

Mask = npt.NDArray[np.bool_]

# From this many candidates, top_k first cuts them down with a floor taken from a strided sample of
# SAMPLE_PER_K * k of them (when there are at least twice that many).
SAMPLE_FROM = 32_768
SAMPLE_PER_K = 64


def top_k(slots: npt.NDArray[np.int64], scores: npt.NDArray[np.float32], k: int) -> list[tuple[int, float]]:
    """The ``k`` best (slot, score) pairs, best first; equal scores in slot order, also at the cut (so the result
    depends only on the set of (slot, score) pairs, never on their order in the arrays)."""
    if len(slots) == 0 or k <= 0:
        return []
    n = len(slots)
    if n >= SAMPLE_FROM and n >= 2 * SAMPLE_PER_K * k:
        # A floor from a strided sample: its k-th best score is at most the k-th best overall, and at least k scores
        # reach it, so keeping the scores at or above it keeps the whole top k, ties included (exact; 3-4x faster
        # than partitioning every score when they are many).
        sample = scores[:: n // (SAMPLE_PER_K * k)]
        floor = np.partition(sample, len(sample) - k)[len(sample) - k]
        pick = np.flatnonzero(scores >= floor)
        slots, scores = slots[pick], scores[pick]
    if len(slots) > k:
        kth = scores[np.argpartition(-scores, k - 1)[k - 1]]
        better = np.flatnonzero(scores > kth)
        tied = np.flatnonzero(scores == kth)
        if len(better) + len(tied) > k:  # only the lowest slots among the scores equal to the k-th one
            tied = tied[np.argsort(slots[tied], kind="stable")[: k - len(better)]]
        part = np.concatenate([better, tied])
        slots, scores = slots[part], scores[part]
    order = np.lexsort((slots, -scores))
    return [(int(slots[i]), float(scores[i])) for i in order]


def dense_candidates(
    scores: npt.NDArray[np.float32], keep: Callable[[npt.NDArray[np.int64]], Mask], k: int, margin: float = 0.0
) -> npt.NDArray[np.int64] | None:
    """For a score array over every slot, the slots that can hold the top ``k`` among positive scores at slots
    ``keep`` accepts: those at or above the k-th best of a strided sample of such slots (exact, like top_k's floor;
    ties kept), lowered by the relative ``margin`` (for approximate scores), already filtered by ``keep``. None
    when the array is small or the sample has fewer than k accepted positive scores (the caller filters every slot
    instead)."""
    n = len(scores)
    if n < SAMPLE_FROM or n < 2 * SAMPLE_PER_K * k or k <= 0:
        return None
    at = np.arange(0, n, n // (SAMPLE_PER_K * k), dtype=np.int64)
    sampled = scores[at]
    accepted = sampled > 0
    accepted &= keep(at)
    values = sampled[accepted]
    if len(values) < k:
        return None
    floor = np.partition(values, len(values) - k)[len(values) - k]
    slots = np.flatnonzero(scores >= (float(floor) * (1 - margin) if margin else floor))
    return slots[keep(slots)]
