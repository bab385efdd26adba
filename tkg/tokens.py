"""Full-text tokens: the one tokenizer that BM25 search uses in every backend that computes BM25 itself (the
in-memory backend and the reference store), so that their scores are comparable bit for bit."""

from __future__ import annotations

import re
from functools import lru_cache

import Stemmer
from bm25s.stopwords import STOPWORDS_EN

_WORD = re.compile(r"\w+", re.UNICODE)
_STOP = frozenset(STOPWORDS_EN)
_STEMMER = Stemmer.Stemmer("english")

#: BM25's constants (the Lucene variant: idf = ln(1 + (N - df + 0.5) / (df + 0.5)),
#: tf part = tf / (K1 * (1 - B + B * dl / avgdl) + tf)).
K1 = 1.5
B = 0.75


@lru_cache(maxsize=500_000)
def _stem(word: str) -> str:
    return str(_STEMMER.stemWord(word))


def tokenize(text: str) -> list[str]:
    """Lower-cased, stop words removed, Snowball-stemmed word tokens.

    >>> tokenize("The quick brown foxes")
    ['quick', 'brown', 'fox']
    """
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOP]
