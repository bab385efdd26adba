"""BM25 over slots: a bm25s index for the bulk, an incremental inverted index for the fresh tail.

bm25s cannot add a document without re-indexing the whole corpus, so new or changed documents go to a tail
with its own postings and are scored with the same BM25 (Lucene variant) formula and corpus-wide statistics.
When the tail grows past a fraction of the main index, both are merged by one rebuild, so the amortised cost of
an add stays small and every query sees every live document exactly once.

Memory: tokens are not kept per document. A rebuild re-tokenizes the live texts (the store hands them over through
``source``), and removing a document of the main index re-tokenizes its old text to update the statistics; this
trades a little CPU on rare paths for ~200 bytes a document.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import bm25s
import numpy as np
import numpy.typing as npt

from tkg import tokens
from tkg.tokens import tokenize

from .arrays import Column
from .vectors import Mask, dense_candidates, top_k

Source = Callable[[], Iterable[tuple[int, str]]]


# Below this share of the documents a query's postings are merged sparsely (sort by document); above it one
# dense float32 array over all documents is cheaper (at 1M documents: ~1 ms of fixed cost, then a few ns a
# posting, against ~30 ns a posting for the sort).
_DENSE_SHARE = 1 / 32


def _spans(index: dict[str, Any], token_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Each query token's posting list as a [start, end) range of the CSC arrays; ids without a column (bm25s's
    empty token is added to the vocabulary after the matrix is built) have no postings."""
    indptr = index["indptr"]
    columns = len(indptr) - 1
    return [(int(indptr[t]), int(indptr[t + 1])) for t in token_ids if 0 <= t < columns]


def _dense_scores(index: dict[str, Any], spans: list[tuple[int, int]]) -> npt.NDArray[np.float32]:
    """bm25s's own accumulation: a float32 array over every document, the postings added token by token."""
    data, indices = _canonical(index["data"]), index["indices"]
    scores = np.zeros(int(index["num_docs"]), dtype=np.float32)
    for a, b in spans:
        np.add.at(scores, indices[a:b], data[a:b])
    return scores


def _canonical(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    # np.add.at takes its fast loop only for numpy's own dtype instances; an array unpickled elsewhere carries an
    # equal but distinct one and is ~25x slower. A view with the canonical dtype costs nothing.
    return array.view(np.dtype(array.dtype.str))


def score_postings(
    index: dict[str, Any], token_ids: Sequence[int]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """BM25 scores of the documents with a positive score for ``token_ids`` in a bm25s index's precomputed CSC
    matrix (``index`` is ``BM25.scores``): document positions in ascending order and their float32 scores.

    Bit for bit what ``BM25.get_scores_from_ids`` gives at those positions (every other document scores 0
    there): each document's score is the float32 sum of its postings in the order of ``token_ids``, repeats
    included. When the postings are few next to the documents, only they are read (no array over all
    documents).
    """
    spans = _spans(index, token_ids)
    total = sum(b - a for a, b in spans)
    if not total:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    if total >= _DENSE_SHARE * int(index["num_docs"]):
        scores = _dense_scores(index, spans)
        positions = np.flatnonzero(scores > 0)
        return positions, scores[positions]
    # Sparse: the documents in any of the postings, sorted, each posting list mapped onto them by the inverse of
    # np.unique; adding list by list in query order keeps bm25s's order of float32 additions.
    data, indices = _canonical(index["data"]), index["indices"]
    documents, inverse = np.unique(np.concatenate([indices[a:b] for a, b in spans]), return_inverse=True)
    sums = np.zeros(len(documents), dtype=np.float32)
    offset = 0
    for a, b in spans:
        np.add.at(sums, inverse[offset : offset + b - a], data[a:b])
        offset += b - a
    positive = sums > 0
    return documents[positive].astype(np.int64), sums[positive]


class TextMismatch(Exception):
    """A persisted BM25 index does not fit the documents it was restored next to (the caller rebuilds it)."""


class TextIndex:
    K1 = tokens.K1
    B = tokens.B

    def __init__(self, source: Source, *, min_rebuild: int = 2048, rebuild_fraction: float = 0.25) -> None:
        self._source = source  # every live (slot, text), for rebuilds
        self._count = 0  # live documents
        self._main: bm25s.BM25 | None = None
        self._main_slots = np.zeros(0, dtype=np.int64)  # main position -> slot
        self._main_current = Column(np.bool_, False)  # slot -> its main document is still its text
        self._main_df: Counter[str] = Counter()
        self._main_len = 0
        self._tail: dict[int, Counter[str]] = {}
        self._tail_lens: dict[int, int] = {}
        self._tail_postings: dict[str, dict[int, int]] = {}  # term -> {slot: term frequency}
        self._tail_df: Counter[str] = Counter()
        self._tail_len = 0
        self._min_rebuild, self._fraction = min_rebuild, rebuild_fraction
        self.auto_rebuild = True  # off during bulk loads, which rebuild once at the end

    def __len__(self) -> int:
        return self._count

    def _indexed(self, slot: int) -> bool:
        return slot in self._tail or (slot < self._main_current.size and bool(self._main_current[slot]))

    # -- writes ---------------------------------------------------------------------------------------------
    def set(self, slot: int, text: str, old_text: str | None = None) -> None:
        """Index ``text`` at ``slot``; ``old_text`` is the slot's current text, if it has one."""
        if old_text == text and self._indexed(slot):
            return
        if old_text is not None:
            self.remove(slot, old_text)
        tokens = tokenize(text)
        counts = Counter(tokens)
        self._tail[slot] = counts
        self._tail_lens[slot] = len(tokens)
        self._tail_len += len(tokens)
        self._count += 1
        for term, tf in counts.items():
            self._tail_postings.setdefault(term, {})[slot] = tf
            self._tail_df[term] += 1
        if self.auto_rebuild and len(self._tail) >= max(self._min_rebuild, self._fraction * len(self._main_slots)):
            self.rebuild()

    def remove(self, slot: int, old_text: str) -> None:
        """Drop ``slot``'s document, whose text is ``old_text``."""
        counts = self._tail.pop(slot, None)
        if counts is not None:
            self._count -= 1
            self._tail_len -= self._tail_lens.pop(slot)
            for term in counts:
                postings = self._tail_postings[term]
                postings.pop(slot, None)
                if not postings:
                    del self._tail_postings[term]
                self._tail_df[term] -= 1
                if not self._tail_df[term]:
                    del self._tail_df[term]
        elif slot < self._main_current.size and self._main_current[slot]:
            self._count -= 1
            old = tokenize(old_text)
            self._main_current[slot] = False
            self._main_len -= len(old)
            for term in set(old):
                self._main_df[term] -= 1

    def rebuild(self) -> None:
        """Merge the tail into a fresh bm25s index over every live document."""
        docs = sorted(self._source())
        slots = np.fromiter((s for s, _ in docs), dtype=np.int64, count=len(docs))
        corpus = [tokenize(text) for _, text in docs]
        del docs
        self._main = None
        if len(slots):
            self._main = bm25s.BM25(k1=self.K1, b=self.B, method="lucene")
            self._main.index([tokens or [""] for tokens in corpus], show_progress=False)
        self._set_main(slots, np.ones(len(slots), dtype=np.bool_))
        self._main_df = Counter(term for tokens in corpus for term in set(tokens))
        self._main_len = sum(len(tokens) for tokens in corpus)
        self._count = len(slots)
        self._clear_tail()

    def _set_main(self, slots: npt.NDArray[np.int64], current: npt.NDArray[np.bool_]) -> None:
        self._main_slots = slots
        self._main_current = Column(np.bool_, False, capacity=max(1024, int(slots.max(initial=0)) + 1))
        self._main_current.ensure(int(slots.max(initial=-1)) + 1)
        self._main_current.view()[slots[current]] = True

    def _clear_tail(self) -> None:
        self._tail, self._tail_lens, self._tail_postings, self._tail_df, self._tail_len = {}, {}, {}, Counter(), 0

    # -- snapshots ------------------------------------------------------------------------------------------
    def export(self) -> dict[str, object]:
        """The main index as plain arrays and lists (for a snapshot); the tail is listed by slot only."""
        main = self._main
        out: dict[str, object] = {
            "slots": self._main_slots,
            "current": self._main_current.view()[self._main_slots] if len(self._main_slots) else np.zeros(0, bool),
            "df_terms": list(self._main_df),
            "df_counts": np.fromiter(self._main_df.values(), dtype=np.int64, count=len(self._main_df)),
            "main_len": self._main_len,
            "tail": np.fromiter(sorted(self._tail), dtype=np.int64, count=len(self._tail)),
        }
        if main is not None:
            vocab = sorted(main.vocab_dict, key=main.vocab_dict.__getitem__)
            out.update(
                vocab=vocab,
                data=np.asarray(main.scores["data"]),
                indices=np.asarray(main.scores["indices"]),
                indptr=np.asarray(main.scores["indptr"]),
                num_docs=int(main.scores["num_docs"]),
            )
        return out

    def restore(self, state: dict[str, object], live: npt.NDArray[np.int64], texts: Callable[[int], str]) -> None:
        """Load an :meth:`export`-ed index into this empty one. ``live`` are the slots that have a document
        now, ``texts(slot)`` their text (for the tail, which is re-tokenized). Raises :class:`TextMismatch` if the
        state does not describe exactly those documents."""
        try:
            slots = np.asarray(state["slots"], dtype=np.int64)
            current = np.asarray(state["current"], dtype=np.bool_)
            tail = np.asarray(state["tail"], dtype=np.int64)
            df_terms = list(state["df_terms"])  # type: ignore[call-overload]
            df_counts = np.asarray(state["df_counts"], dtype=np.int64)
            main_len = int(state["main_len"])  # type: ignore[call-overload]
        except (KeyError, TypeError, ValueError) as exc:
            raise TextMismatch(f"incomplete text index: {exc}") from None
        documents = np.concatenate([slots[current], tail]) if len(current) == len(slots) else None
        if documents is None or len(df_terms) != len(df_counts):
            raise TextMismatch("inconsistent text index arrays")
        if len(documents) != len(live) or not np.array_equal(np.sort(documents), np.sort(live)):
            raise TextMismatch("the text index covers other documents than the snapshot's records")
        main = None
        if len(slots):
            try:
                vocab = list(state["vocab"])  # type: ignore[call-overload]
                data = np.asarray(state["data"])
                indices = np.asarray(state["indices"])
                indptr = np.asarray(state["indptr"])
                num_docs = int(state["num_docs"])  # type: ignore[call-overload]
            except (KeyError, TypeError, ValueError) as exc:
                raise TextMismatch(f"incomplete text index: {exc}") from None
            if (
                num_docs != len(slots)
                # bm25s adds the empty token to the vocabulary after building the matrix, so it may lack a column
                or not len(vocab) <= len(indptr) <= len(vocab) + 1
                or len(data) != len(indices)
                or (len(indptr) and int(indptr[-1]) != len(data))
                or (len(indices) and (int(indices.min()) < 0 or int(indices.max()) >= num_docs))
            ):
                raise TextMismatch("the bm25 arrays do not fit together")
            main = bm25s.BM25(k1=self.K1, b=self.B, method="lucene")
            main.scores = {"data": data, "indices": indices, "indptr": indptr, "num_docs": num_docs}
            main.vocab_dict = {term: i for i, term in enumerate(vocab)}
            main.unique_token_ids_set = set(main.vocab_dict.values())
            main.nonoccurrence_array = None
        self._main = main
        self._set_main(slots, current)
        self._main_df = Counter(dict(zip(df_terms, df_counts.tolist(), strict=True)))
        self._main_len = main_len
        self._count = int(np.count_nonzero(current))
        self._clear_tail()
        auto, self.auto_rebuild = self.auto_rebuild, False
        try:
            for slot in tail.tolist():
                self.set(slot, texts(slot))
        finally:
            self.auto_rebuild = auto

    # -- reads ----------------------------------------------------------------------------------------------
    def search(self, query: str, k: int, mask: Mask) -> list[tuple[int, float]]:
        terms = list(dict.fromkeys(tokenize(query)))
        if not terms or k <= 0 or not self._count:
            return []
        found: list[tuple[int, float]] = []
        main = self._main
        if main is not None and len(self._main_slots):
            ids = main.get_tokens_ids(terms)
            if ids:
                found = self._search_main(main.scores, ids, k, mask)
        if self._tail:
            found += self._search_tail(terms, k, mask)
            found.sort(key=lambda item: (-item[1], item[0]))
        return found[:k]

    def _search_main(self, index: dict[str, Any], ids: list[int], k: int, mask: Mask) -> list[tuple[int, float]]:
        """The top ``k`` main documents for the token ids: bm25s's scores, equal ones in slot order."""
        n = len(self._main_slots)
        spans = _spans(index, ids)
        total = sum(b - a for a, b in spans)
        # Main positions are slots when no slot is missing (slots are sorted and distinct); then a query whose
        # postings cover a good share of the documents is masked with dense boolean ops, cheaper than gathering
        # the mask for each candidate.
        if total >= _DENSE_SHARE * n and int(self._main_slots[-1]) == n - 1:
            scores = _dense_scores(index, spans)
            current = self._main_current.view()
            positions = dense_candidates(scores, lambda at: current[at] & mask[at], k)
            if positions is None:
                keep = scores > 0
                keep &= current[:n]
                keep &= mask[:n]
                positions = np.flatnonzero(keep)
            return top_k(positions, scores[positions], k)
        positions, values = score_postings(index, ids)
        slots = self._main_slots[positions]
        keep = self._main_current.view()[slots] & mask[slots]
        return top_k(slots[keep], values[keep], k)

    def _search_tail(self, terms: list[str], k: int, mask: Mask) -> list[tuple[int, float]]:
        """The tail's top ``k``: the same BM25 (Lucene) formula as the main index over corpus-wide statistics,
        in float64 term by term in query order, then float32; vectorised per term (the tail may hold a quarter
        of the main index between merges)."""
        n_docs = self._count
        avg_len = max(1e-9, (self._main_len + self._tail_len) / max(1, n_docs))
        lengths = self._tail_lens
        found_slots: list[npt.NDArray[np.int64]] = []
        found_scores: list[npt.NDArray[np.float64]] = []
        for term in terms:
            postings = self._tail_postings.get(term)
            if not postings:
                continue
            df = self._main_df.get(term, 0) + self._tail_df[term]
            idf = math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
            n = len(postings)
            slots = np.fromiter(postings.keys(), dtype=np.int64, count=n)
            tf = np.fromiter(postings.values(), dtype=np.float64, count=n)
            dl = np.fromiter(map(lengths.__getitem__, postings.keys()), dtype=np.float64, count=n)
            keep = mask[slots]
            slots, tf, dl = slots[keep], tf[keep], dl[keep]
            tfc = tf / (self.K1 * (1 - self.B + self.B * dl / avg_len) + tf)
            found_slots.append(slots)
            found_scores.append(idf * tfc)
        if not found_slots or not sum(map(len, found_slots)):
            return []
        slots, inverse = np.unique(np.concatenate(found_slots), return_inverse=True)
        sums = np.zeros(len(slots), dtype=np.float64)
        np.add.at(sums, inverse, np.concatenate(found_scores))  # in query order, like a loop over the terms
        return top_k(slots, sums.astype(np.float32), k)

    def stats(self) -> dict[str, int]:
        return {"main": len(self._main_slots), "tail": len(self._tail)}

    def memory(self) -> dict[str, int]:
        """Approximate bytes held by the bm25s arrays and the per-slot columns."""
        main = self._main
        arrays = 0
        if main is not None:
            arrays = sum(np.asarray(main.scores[k]).nbytes for k in ("data", "indices", "indptr"))
        return {"bm25": arrays + self._main_slots.nbytes + self._main_current.size}
