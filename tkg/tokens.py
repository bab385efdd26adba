"""Full-text tokens and BM25: the one tokenizer and the one scoring formula of full-text search in every backend
(the in-memory backend, PostgreSQL's postings tables and the reference store), so that they rank alike."""

from __future__ import annotations

import math
import re
import struct
from collections.abc import Sequence
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
import Stemmer
from bm25s.stopwords import STOPWORDS_EN

from tkg.memo import Memo

#: The longest token, in characters: a longer run of word characters (a pasted key, a hex dump, CJK text without
#: punctuation) is cut into tokens of this length, as Lucene's standard tokenizer does. PostgreSQL keeps each term
#: in a btree, whose keys hold at most ~2.7 KB (255 characters of up to 4 UTF-8 bytes each fit).
MAX_TOKEN_CHARS = 255
_WORD = re.compile(rf"\w{{1,{MAX_TOKEN_CHARS}}}", re.UNICODE)
_STOP = frozenset(STOPWORDS_EN)
# Without PyStemmer's own cache (its words are kept as lists, up to 10,000, which the cycle collector walks at every
# full collection): _STEMS, in front of it, memoises the stems where the collector does not look (tkg.memo).
_STEMMER = Stemmer.Stemmer("english", 0)

#: BM25's constants (the Lucene variant: idf = ln(1 + (N - df + 0.5) / (df + 0.5)),
#: tf part = tf / (K1 * (1 - B + B * dl / avgdl) + tf)).
K1 = 1.5
B = 0.75


def idf(documents: int, df: int) -> float:
    """A term's inverse document frequency among ``documents`` of which ``df`` hold it (Lucene: never negative)."""
    return math.log(1.0 + (documents - df + 0.5) / (df + 0.5))


Number = TypeVar("Number", float, npt.NDArray[np.float64])

# bm25_sums bins by id when the ids span at most this many times their count (else it sorts them).
_DENSE_SPAN = 16


def term_part(weight: float, tf: Number, dl: Number, average: float) -> Number:
    """What a query term of ``weight`` (its idf) adds to the score of a document of ``dl`` tokens holding it
    ``tf`` times, ``average`` being the documents' mean length: the same float64 operations in the same order in
    every backend (scalars or numpy arrays of postings)."""
    return weight * tf / (K1 * (1 - B + B * dl / average) + tf)


def bm25_sums(
    columns: Sequence[tuple[npt.NDArray[np.integer[Any]], npt.NDArray[np.float64]]],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """The documents of ``columns`` -- one (documents, their :func:`term_part`) pair per query term, in query
    order -- ascending, and their BM25 sums, each added in query-term order as a loop over the terms would. Parts
    are positive, so every document's sum is too; one that is not is left out, whichever way the sums are taken."""
    count = sum(len(d) for d, _ in columns)
    if not count:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float64)
    low = min(int(d.min()) for d, _ in columns if len(d))
    span = max(int(d.max()) for d, _ in columns if len(d)) - low + 1
    if span <= _DENSE_SPAN * count:  # ids close together: one bin per id in their range, no sort
        binned = np.zeros(span, dtype=np.float64)
        for d, v in columns:  # term by term in query order (np.add.at adds in input order, unbuffered)
            np.add.at(binned, d - low, v)
        documents = np.flatnonzero(binned > 0)
        return (documents + low).astype(np.int64, copy=False), binned[documents]
    ids = np.concatenate([d for d, _ in columns]).astype(np.int64, copy=False)
    # A stable sort keeps each document's parts in query order (and merges the columns' sorted runs quickly), and
    # bincount adds them in that order: 2-3x faster than np.unique's inverse.
    order = np.argsort(ids, kind="stable")
    ids = ids[order]
    first = np.empty(len(ids), dtype=bool)
    first[0] = True
    np.not_equal(ids[1:], ids[:-1], out=first[1:])
    documents = ids[first]
    sums = np.bincount(np.cumsum(first) - 1, weights=np.concatenate([v for _, v in columns])[order])
    positive = sums > 0  # as the binned way finds them
    return documents[positive], sums[positive].astype(np.float64, copy=False)


def rank_score(score: float) -> float:
    """A BM25 score as every backend returns and ranks it: the float64 sum of its terms, rounded to float32, so
    that sums added in another order (a database's aggregate) rank and tie alike; equal scores go in insertion
    order.

    >>> rank_score(0.1) == rank_score(0.1 + 1e-17)
    True
    """
    return float(struct.unpack("f", struct.pack("f", score))[0])


def _stem(word: str) -> str:
    return str(_STEMMER.stemWord(word))


_STEMS = Memo(_stem, 500_000)


def tokenize(text: str) -> list[str]:
    """Lower-cased, stop words removed, Snowball-stemmed word tokens.

    >>> tokenize("The quick brown foxes")
    ['quick', 'brown', 'fox']
    """
    known = _STEMS.table.get
    return [known(w) or _STEMS(w) for w in _WORD.findall(text.lower()) if w not in _STOP]
