"""BM25 over slots: a bm25s index for the bulk, an incremental inverted index for the fresh tail.

bm25s cannot add a document without re-indexing the whole corpus, so new or changed documents go to a tail
with its own postings and are scored with the same BM25 (Lucene variant) formula and corpus-wide statistics.
When the tail grows past a fraction of the main index, both are merged by one rebuild, so the amortised cost of
an add stays small and every query sees every live document exactly once.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from functools import lru_cache

import bm25s
import numpy as np
import Stemmer
from bm25s.stopwords import STOPWORDS_EN

from .arrays import Column
from .vectors import Mask, top_k

_WORD = re.compile(r"\w+", re.UNICODE)
_STOP = frozenset(STOPWORDS_EN)
_STEMMER = Stemmer.Stemmer("english")


@lru_cache(maxsize=500_000)
def _stem(word: str) -> str:
    return str(_STEMMER.stemWord(word))


def tokenize(text: str) -> list[str]:
    """Lower-cased, stop words removed, Snowball-stemmed word tokens."""
    return [_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOP]


class TextIndex:
    K1 = 1.5
    B = 0.75

    def __init__(self, *, min_rebuild: int = 2048, rebuild_fraction: float = 0.25) -> None:
        self._tokens: dict[int, list[str]] = {}  # every live slot's tokens
        self._main: bm25s.BM25 | None = None
        self._main_slots = np.zeros(0, dtype=np.int64)  # main position -> slot
        self._main_current = Column(np.bool_, False)  # slot -> its main document is still its text
        self._main_df: Counter[str] = Counter()
        self._main_len = 0
        self._tail: dict[int, Counter[str]] = {}
        self._tail_postings: dict[str, set[int]] = {}
        self._tail_df: Counter[str] = Counter()
        self._tail_len = 0
        self._min_rebuild, self._fraction = min_rebuild, rebuild_fraction
        self.auto_rebuild = True  # off during bulk loads, which rebuild once at the end

    def __len__(self) -> int:
        return len(self._tokens)

    # -- writes ---------------------------------------------------------------------------------------------
    def set(self, slot: int, text: str) -> None:
        tokens = tokenize(text)
        if self._tokens.get(slot) == tokens:
            return
        self.remove(slot)
        self._tokens[slot] = tokens
        counts = Counter(tokens)
        self._tail[slot] = counts
        self._tail_len += len(tokens)
        for term in counts:
            self._tail_postings.setdefault(term, set()).add(slot)
            self._tail_df[term] += 1
        if self.auto_rebuild and len(self._tail) >= max(self._min_rebuild, self._fraction * len(self._main_slots)):
            self.rebuild()

    def remove(self, slot: int) -> None:
        old = self._tokens.pop(slot, None)
        if old is None:
            return
        counts = self._tail.pop(slot, None)
        if counts is not None:
            self._tail_len -= len(old)
            for term in counts:
                postings = self._tail_postings[term]
                postings.discard(slot)
                if not postings:
                    del self._tail_postings[term]
                self._tail_df[term] -= 1
                if not self._tail_df[term]:
                    del self._tail_df[term]
        elif slot < self._main_current.size and self._main_current[slot]:
            self._main_current[slot] = False
            self._main_len -= len(old)
            for term in set(old):
                self._main_df[term] -= 1

    def rebuild(self) -> None:
        """Merge the tail into a fresh bm25s index over every live document."""
        slots = np.fromiter(sorted(self._tokens), dtype=np.int64, count=len(self._tokens))
        corpus = [self._tokens[int(s)] or [""] for s in slots]
        self._main = None
        if len(slots):
            self._main = bm25s.BM25(k1=self.K1, b=self.B, method="lucene")
            self._main.index(corpus, show_progress=False)
        self._main_slots = slots
        self._main_current = Column(np.bool_, False, capacity=max(1024, int(slots.max(initial=0)) + 1))
        self._main_current.ensure(int(slots.max(initial=-1)) + 1)
        self._main_current.view()[slots] = True
        self._main_df = Counter(term for s in slots for term in set(self._tokens[int(s)]))
        self._main_len = sum(len(self._tokens[int(s)]) for s in slots)
        self._tail, self._tail_postings, self._tail_df, self._tail_len = {}, {}, Counter(), 0

    # -- reads ----------------------------------------------------------------------------------------------
    def search(self, query: str, k: int, mask: Mask) -> list[tuple[int, float]]:
        terms = list(dict.fromkeys(tokenize(query)))
        if not terms or k <= 0 or not self._tokens:
            return []
        found: list[tuple[int, float]] = []
        main = self._main
        if main is not None and len(self._main_slots):
            ids = main.get_tokens_ids(terms)
            if ids:
                scores = main.get_scores_from_ids(ids)
                # Few documents share a query term: keep the positives first, then check only those against the
                # scope mask (gathering the mask over every slot cost more than the scoring).
                positive = np.flatnonzero(scores > 0)
                slots = self._main_slots[positive]
                keep = self._main_current.view()[slots] & mask[slots]
                found = top_k(slots[keep], scores[positive][keep].astype(np.float32), k)
        if self._tail:
            found += self._search_tail(terms, k, mask)
            found.sort(key=lambda item: (-item[1], item[0]))
        return found[:k]

    def _search_tail(self, terms: list[str], k: int, mask: Mask) -> list[tuple[int, float]]:
        n_docs = len(self._tokens)
        avg_len = max(1e-9, (self._main_len + self._tail_len) / max(1, n_docs))
        scores: dict[int, float] = {}
        for term in terms:
            postings = self._tail_postings.get(term)
            if not postings:
                continue
            df = self._main_df.get(term, 0) + self._tail_df[term]
            idf = math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
            for slot in postings:
                if not mask[slot]:
                    continue
                tf = self._tail[slot][term]
                dl = len(self._tokens[slot])
                tfc = tf / (self.K1 * (1 - self.B + self.B * dl / avg_len) + tf)
                scores[slot] = scores.get(slot, 0.0) + idf * tfc
        if not scores:
            return []
        slots = np.fromiter(scores, dtype=np.int64, count=len(scores))
        values = np.fromiter(scores.values(), dtype=np.float32, count=len(scores))
        return top_k(slots, values, k)

    def stats(self) -> dict[str, int]:
        return {"main": len(self._main_slots), "tail": len(self._tail)}
