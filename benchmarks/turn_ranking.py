"""The plain retrieval baselines the benchmarks compare tkg with: BM25 (bm25s, Snowball stemming, English stop
words) and dense cosine over a history's texts, and their reciprocal-rank fusion."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import bm25s
import numpy as np
import numpy.typing as npt
import Stemmer

__all__ = ["bm25_index", "bm25_rank", "dense_rank", "rrf"]

_STEM = Stemmer.Stemmer("english").stemWords


def bm25_index(texts: Sequence[str]) -> Any:
    index = bm25s.BM25()
    index.index(bm25s.tokenize(list(texts), stopwords="en", stemmer=_STEM, show_progress=False), show_progress=False)
    return index


def bm25_rank(index: Any, ids: Sequence[str], query: str) -> list[str]:
    """``ids`` of the texts that share a term with ``query``, best first."""
    tokens = bm25s.tokenize([query], stopwords="en", stemmer=_STEM, return_ids=False, show_progress=False)[0]
    token_ids = index.get_tokens_ids(tokens)
    if not token_ids:
        return []
    scores = index.get_scores_from_ids(token_ids)
    order = np.argsort(-scores, kind="stable")
    return [ids[i] for i in order if scores[i] > 0]


def dense_rank(vectors: npt.NDArray[np.float32], ids: Sequence[str], query: npt.NDArray[np.float32]) -> list[str]:
    """Every id, by cosine with ``query`` (the vectors are unit length), best first."""
    scores = np.einsum("ij,j->i", vectors, query)
    return [ids[i] for i in np.argsort(-scores, kind="stable")]


def rrf(first: list[str], second: list[str], k: int = 60) -> list[str]:
    scores: dict[str, float] = {}
    for ranking in (first, second):
        for rank, item in enumerate(ranking, start=1):
            scores[item] = scores.get(item, 0.0) + 1.0 / (k + rank)
    order = {item: i for i, item in enumerate(dict.fromkeys(first + second))}
    return sorted(scores, key=lambda item: (-scores[item], order[item]))
