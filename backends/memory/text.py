"""BM25 over slots: a main index in bm25s's layout for the bulk, an incremental inverted index for the fresh
tail, both scored at query time with the current corpus statistics.

A main index cannot take a document without being rebuilt, so new or changed documents go to a tail with its own
postings. When the tail grows past a fraction of the main index, both are merged by one rebuild, so the amortised
cost of an add stays small and every query sees every live document exactly once.

The main index is a bm25s ``BM25`` whose CSC arrays hold each posting's term frequency (not a score) and whose
vocabulary maps terms to columns; it is built here from token ids with numpy (:func:`_build`) rather than by
``BM25.index``, whose per-document Python loops hold the interpreter lock throughout (this build tokenizes, then
counts the postings in one sort: 0.40 s for bench_core's 100,000 facts, 0.28 s for its 33,334 episodes, against
1.39 and 0.68 s, tokenizing included; on the store's background thread it hands the lock over every
``_PAUSE_EVERY`` documents). Scores do not depend on when the index was last rebuilt: every query scores
main and tail postings with one formula (:mod:`tkg.tokens`) over the live documents' N, df and average length, in
float64 and in query-term order. A live store, the same store reopened and the reference store give the same
scores (the backend conformance suite checks this against the reference store without folding the index first).

Speed at a million documents, where a query's postings number hundreds of thousands: each posting carries a code of
its (term frequency, document length) pair, so a query evaluates the formula once per distinct pair and gathers
(:func:`_pair_codes`); and a query whose postings cover a good share of the documents is summed in one float32
array, whose sums are within a few rounding steps of the exact ones, so that only the documents near its top k
are scored exactly (:meth:`TextIndex._search_dense`). bench_scale's fact queries at 1M: 5.3 / 8.6 ms p50 / p95
scoring every posting by the formula in float64, 2.4 / 3.2 ms so.

Memory: tokens are not kept per document. A rebuild re-tokenizes the live texts (the store hands them over through
``source``), and removing a document of the main index re-tokenizes its old text to update the statistics; this
trades a little CPU on rare paths for ~200 bytes a document.
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import bm25s
import numpy as np
import numpy.typing as npt

from tkg import tokens
from tkg.selection import Mask, dense_candidates, top_k
from tkg.tokens import bm25_sums, idf, term_part, tokenize

from .arrays import Column

#: Every live document as (slot, text).
Source = Callable[[], Iterable[tuple[int, str]]]

#: The layout of :meth:`TextIndex.export`; a saved index of another layout is rebuilt on load.
FORMAT = 2

# Below this share of the documents a query's postings are merged sparsely (sort by document); above it one
# dense array over all main documents is cheaper.
_DENSE_SHARE = 1 / 32
# A dense search of several terms rescores its candidates exactly by binary search in each term's postings when
# that costs less than summing every posting in float64: a lookup counts as this many postings.
_LOOKUP_COST = 8
# A query of several terms first tries to prove its top k among the documents holding its rarest term (MaxScore,
# :meth:`TextIndex._search_pruned`) when looking those documents up costs less than summing every posting: a
# lookup counts as this many postings.
_PRUNE_COST = 8
# Pair codes (see _pair_codes) are numbered through a table of this many (frequency, length) keys at most; wider
# keys are sorted instead.
_PAIR_TABLE = 1 << 20


def _spans(index: dict[str, Any], token_ids: Sequence[int]) -> list[tuple[int, int]]:
    """Each query token's posting list as a [start, end) range of the CSC arrays; ids without a column (bm25s's
    empty token is added to the vocabulary after the matrix is built) have no postings."""
    indptr = index["indptr"]
    columns = len(indptr) - 1
    return [(int(indptr[t]), int(indptr[t + 1])) if 0 <= t < columns else (0, 0) for t in token_ids]


def _as_bm25s(
    data: npt.NDArray[np.float32],
    indices: npt.NDArray[np.int32],
    indptr: npt.NDArray[Any],
    vocab: Sequence[str],
    num_docs: int,
) -> bm25s.BM25:
    """A bm25s index holding these CSC arrays (a posting's value is its term frequency: queries score with the
    live statistics, see the module docstring) and this vocabulary (term ``i`` is column ``i``)."""
    main = bm25s.BM25(k1=tokens.K1, b=tokens.B, method="lucene", dtype="float64")
    main.scores = {"data": data, "indices": indices, "indptr": indptr, "num_docs": num_docs}
    main.vocab_dict = {term: i for i, term in enumerate(vocab)}
    main.nonoccurrence_array = None
    return main


# A background rebuild lets the tail grow to this many times its threshold before the writer rebuilds itself.
_BEHIND = 4
# A background rebuild hands the interpreter lock over after tokenizing this many documents (~0.25 ms): a writer
# that let it go (for a numpy or hnswlib call) gets it back then, not after the interpreter's 5 ms switch interval
# (measured at 100k facts: add_episode calls of 56-83 ms while the episodes' index was rebuilt without pauses).
_PAUSE_EVERY = 64


#: Each main posting's pair code; each code's term frequency and document length (see _pair_codes).
Pairs = tuple[npt.NDArray[Any], npt.NDArray[np.float64], npt.NDArray[np.float64]]


def _pair_codes(tf: npt.NDArray[Any], dl: npt.NDArray[Any]) -> Pairs:
    """Each posting's (term frequency, document length) as a small code into the distinct pairs, and those pairs'
    frequencies and lengths in float64. A query evaluates the BM25 formula once per pair and term, then gathers
    by code: the same float64 operations on the same operands as per posting, so the same values (bench_scale's 7.4
    million fact postings hold 14 pairs)."""
    tf, dl = np.asarray(tf).astype(np.int64), np.asarray(dl).astype(np.int64)
    if not len(tf):
        return np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.float64), np.zeros(0, dtype=np.float64)
    width = int(dl.max()) + 1
    keys = tf * width + dl
    if int(keys.max()) < _PAIR_TABLE:
        present = np.zeros(int(keys.max()) + 1, dtype=np.bool_)
        present[keys] = True
        distinct = np.flatnonzero(present)
        codes = (np.cumsum(present) - 1)[keys]
    else:
        distinct, codes = np.unique(keys, return_inverse=True)
    dtype = np.uint8 if len(distinct) <= 1 << 8 else np.uint16 if len(distinct) <= 1 << 16 else np.int32
    return codes.astype(dtype), (distinct // width).astype(np.float64), (distinct % width).astype(np.float64)


def _canonical(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    # np.add.at takes its fast loop only for numpy's own dtype instances; an array restored from elsewhere may
    # carry an equal but distinct one and be ~25x slower. A view with the canonical dtype costs nothing.
    return array.view(np.dtype(array.dtype.str))


def _current_only(state: dict[str, Any]) -> dict[str, Any]:
    """An :meth:`TextIndex.export`-ed state without the main index's stale documents (removed or replaced since its
    build): their postings, and the terms only they held, are dropped and the positions renumbered. A snapshot
    then holds no word of an erased record, and its main index only slots that still have a document (a load sizes
    its tables to the records it holds; the stale positions pointed past them)."""
    current = np.asarray(state["current"], dtype=np.bool_)
    if current.all():
        return state
    slots = np.asarray(state["slots"], dtype=np.int64)
    out = {**state, "slots": slots[current], "lengths": np.asarray(state["lengths"])[current]}
    out["current"] = np.ones(len(out["slots"]), dtype=np.bool_)
    if "vocab" not in state:
        return out
    data, indices, indptr = (np.asarray(state[key]) for key in ("data", "indices", "indptr"))
    vocab = list(state["vocab"])
    columns = len(indptr) - 1
    live = current[indices]
    column_of = np.repeat(np.arange(columns), np.diff(indptr))
    held = np.bincount(column_of[live], minlength=columns)
    kept = np.flatnonzero(held)
    renumbered = np.cumsum(current) - 1
    out.update(
        data=data[live],
        indices=renumbered[indices[live]].astype(indices.dtype),
        indptr=np.concatenate([[0], np.cumsum(held[kept])]).astype(indptr.dtype),
        # a term past the columns (bm25s's empty token) has no postings to lose: kept, still past them
        vocab=[vocab[c] for c in kept.tolist()] + vocab[columns:],
        num_docs=int(np.count_nonzero(current)),
    )
    if not out["num_docs"]:
        for key in ("vocab", "data", "indices", "indptr", "num_docs"):
            del out[key]
    return out


class Built:
    """A main index built from a snapshot of documents (main positions in slot order), with each document's
    tokens as term ids: those of the document at position ``at`` are ``term_ids[starts[at]:starts[at] +
    lengths[at]]``; and its postings' pair codes (:func:`_pair_codes`)."""

    def __init__(
        self,
        main: bm25s.BM25 | None,
        slots: npt.NDArray[np.int64],
        lengths: npt.NDArray[np.int64],
        term_ids: npt.NDArray[np.int32],
        starts: npt.NDArray[np.int64],
        vocab: list[str],
    ) -> None:
        self.main, self.slots, self.lengths = main, slots, lengths
        self._term_ids, self._starts, self._vocab = term_ids, starts, vocab
        self.df: dict[str, int] = {}
        self.pairs = _pair_codes(np.zeros(0), np.zeros(0))
        if main is not None:
            index = main.scores
            self.df = dict(zip(vocab, np.diff(index["indptr"]).tolist(), strict=True))
            self.pairs = _pair_codes(index["data"], lengths[index["indices"]])

    def tokens(self, at: int) -> list[str]:
        """The tokens of the document at main position ``at``."""
        start = int(self._starts[at])
        vocab = self._vocab
        return [vocab[t] for t in self._term_ids[start : start + int(self.lengths[at])].tolist()]


def _build(docs: Iterable[tuple[int, str]], pause: Callable[[], None] | None = None) -> Built:
    """A main index over ``docs`` (any order): tokenized here, the postings counted with numpy. ``pause`` is
    called every ``_PAUSE_EVERY`` documents (a background rebuild hands the interpreter lock over)."""
    vocab: dict[str, int] = {}
    term_ids = array("i")
    slot_list = array("q")
    length_list = array("q")
    for n, (slot, text) in enumerate(docs, 1):
        words = tokenize(text)
        term_ids.extend([vocab.setdefault(w, len(vocab)) for w in words])
        slot_list.append(slot)
        length_list.append(len(words))
        if pause is not None and not n % _PAUSE_EVERY:
            pause()
    slots = np.frombuffer(slot_list, dtype=np.int64)
    lengths = np.frombuffer(length_list, dtype=np.int64)
    ids = np.frombuffer(term_ids, dtype=np.int32).copy()
    terms = list(vocab)
    n_docs = len(slots)
    order = np.argsort(slots, kind="stable")  # main positions are in slot order
    starts = (np.cumsum(lengths) - lengths)[order]
    if not n_docs:
        return Built(None, slots.copy(), lengths.copy(), ids, starts, terms)
    position = np.empty(n_docs, dtype=np.int64)
    position[order] = np.arange(n_docs, dtype=np.int64)
    # one key per token, term-major: the unique keys are the postings in CSC order (by term, then position)
    keys = ids.astype(np.int64) * n_docs + np.repeat(position, lengths)
    postings, tf = np.unique(keys, return_counts=True)
    indptr = np.searchsorted(postings // n_docs, np.arange(len(terms) + 1), side="left").astype(np.int64)
    main = _as_bm25s(tf.astype(np.float32), (postings % n_docs).astype(np.int32), indptr, terms, n_docs)
    return Built(main, slots[order], lengths[order], ids, starts, terms)


def _term_counts(tokens: Sequence[str]) -> dict[str, int]:
    """Each term's frequency in ``tokens``, as a plain dict filled by insertion: one holding only strings and
    integers is never tracked by the cycle collector, so a tail of tens of thousands of documents adds nothing to
    what a full collection walks (a Counter, or a dict copied from one, is tracked)."""
    counts: dict[str, int] = {}
    for term in tokens:
        counts[term] = counts.get(term, 0) + 1
    return counts


class Rebuild:
    """A rebuild of a :class:`TextIndex`'s main index in three steps: ``begin_rebuild`` (store lock held),
    :meth:`run` (no lock: tokenizing and indexing every document), ``finish_rebuild`` (store lock held)."""

    def __init__(self, docs: Iterable[tuple[int, str]], index: TextIndex | None = None) -> None:
        self._docs: Iterable[tuple[int, str]] | None = docs
        self._index = index
        self.built: Built | None = None

    def run(self) -> None:
        if self._docs is None:
            return
        docs, self._docs = self._docs, None
        self.built = _build(docs, pause=_hand_over)

    def finish(self) -> None:
        if self._index is not None:
            self._index.finish_rebuild(self)


def _hand_over() -> None:
    time.sleep(0)  # releases the interpreter lock: a thread waiting for it takes it now


class TextMismatch(Exception):
    """A persisted BM25 index does not fit the documents it was restored next to (the caller rebuilds it)."""


class TextIndex:
    def __init__(self, source: Source, *, min_rebuild: int = 2048, rebuild_fraction: float = 0.25) -> None:
        self._source = source  # every live (slot, text), for rebuilds
        self._count = 0  # live documents
        self._main: bm25s.BM25 | None = None
        self._main_slots = np.zeros(0, dtype=np.int64)  # main position -> slot
        self._main_lengths = np.zeros(0, dtype=np.int64)  # main position -> its document's length in tokens
        self._main_current = Column(np.bool_, False)  # slot -> its main document is still its text
        # main posting -> its (term frequency, document length) code; each code's frequency and length
        self._main_pairs = _pair_codes(np.zeros(0), np.zeros(0))
        # main column (its first posting) -> the pair codes among its postings, found when a pruned search first
        # needs them
        self._codes_in: dict[int, npt.NDArray[np.intp]] = {}
        # Document frequencies: plain dicts of strings and integers, which the cycle collector does not track (a
        # Counter it would, and walk each of its terms in every full collection; so too bm25s's own set of term
        # ids, which only its retrieve() reads: not made).
        self._main_df: dict[str, int] = {}
        self._main_len = 0
        self._tail: dict[int, dict[str, int]] = {}  # slot -> its term frequencies (see _term_counts)
        self._tail_lens: dict[int, int] = {}
        self._tail_postings: dict[str, dict[int, int]] = {}  # term -> {slot: term frequency}
        self._tail_df: dict[str, int] = {}
        self._tail_len = 0
        self._min_rebuild, self._fraction = min_rebuild, rebuild_fraction
        self.auto_rebuild = True  # off during bulk loads, which rebuild once at the end
        # Set by a store that rebuilds in the background (see Rebuild): called when a rebuild is due, instead of
        # rebuilding on the writer's path -- unless the tail has run far ahead (the worker is behind).
        self.on_due: Callable[[], None] | None = None
        self._rebuilding: Rebuild | None = None  # the background rebuild in flight
        self._touched: set[int] = set()  # slots set or removed since that rebuild's snapshot

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
        self._add_to_tail(slot, _term_counts(tokens), len(tokens))
        self._count += 1
        if self._rebuilding is not None:
            self._touched.add(slot)
        if self.auto_rebuild and len(self._tail) >= self._threshold():
            if self.on_due is None or len(self._tail) >= _BEHIND * self._threshold():
                self.rebuild()
            elif self._rebuilding is None:
                self.on_due()

    def _add_to_tail(self, slot: int, counts: dict[str, int], length: int) -> None:
        self._tail[slot] = counts
        self._tail_lens[slot] = length
        self._tail_len += length
        for term, tf in counts.items():
            self._tail_postings.setdefault(term, {})[slot] = tf
            self._tail_df[term] = self._tail_df.get(term, 0) + 1

    def _threshold(self) -> float:
        return max(self._min_rebuild, self._fraction * len(self._main_slots))

    def due(self) -> bool:
        """Whether the tail has grown enough to merge it into the main index (and no merge is under way)."""
        return self._rebuilding is None and len(self._tail) >= self._threshold()

    def remove(self, slot: int, old_text: str) -> None:
        """Drop ``slot``'s document, whose text is ``old_text``."""
        if self._rebuilding is not None:
            self._touched.add(slot)
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
        """Merge the tail into a fresh bm25s index over every live document (now, on this thread; a background
        rebuild under way is abandoned)."""
        self._rebuilding, self._touched = None, set()
        built = _build(self._source())
        self._install(built)
        self._count = len(built.slots)
        self._clear_tail()

    def begin_rebuild(self) -> Rebuild:
        """Start a rebuild whose work (:meth:`Rebuild.run`) runs without the store's lock: takes the snapshot of
        the live documents the source hands over (the store copies its record list, so this is cheap) and from
        now on notes which slots change. :meth:`finish_rebuild` installs it."""
        task = Rebuild(self._source(), self)
        self._rebuilding, self._touched = task, set()
        return task

    def finish_rebuild(self, task: Rebuild) -> None:
        """Install a finished background rebuild: its main index holds the snapshot's documents; those changed or
        removed since are marked stale in it, and those set since go to a fresh tail -- so every live document is
        indexed exactly once, as after :meth:`rebuild`. A rebuild superseded by another is dropped."""
        built = task.built
        task.built = None
        if self._rebuilding is not task or built is None:
            return
        touched, self._touched, self._rebuilding = self._touched, set(), None
        tail, tail_lens = self._tail, self._tail_lens
        self._install(built)
        count = len(built.slots)
        self._clear_tail()
        current = self._main_current.view()
        # Under the store's lock, so nothing is tokenized again: the build kept each document's tokens.
        for slot in sorted(touched):
            at = int(np.searchsorted(built.slots, slot))
            if at < len(built.slots) and built.slots[at] == slot and current[slot]:  # its snapshot is stale now
                current[slot] = False
                tokens = built.tokens(at)
                self._main_len -= len(tokens)
                for term in set(tokens):
                    self._main_df[term] -= 1
                count -= 1
            counts = tail.get(slot)
            if counts is not None:  # set since the snapshot: it stays in the tail
                self._add_to_tail(slot, counts, tail_lens[slot])
                count += 1
        self._count = count

    def _install(self, built: Built) -> None:
        self._use_main(built.main, built.pairs)
        self._set_main(built.slots, np.ones(len(built.slots), dtype=np.bool_), built.lengths)
        self._main_df = built.df
        self._main_len = int(built.lengths.sum())

    def _use_main(self, main: bm25s.BM25 | None, pairs: Pairs) -> None:
        self._main, self._main_pairs = main, pairs
        self._codes_in = {}

    def _set_main(
        self, slots: npt.NDArray[np.int64], current: npt.NDArray[np.bool_], lengths: npt.NDArray[np.int64]
    ) -> None:
        self._main_slots = slots
        self._main_lengths = lengths.astype(np.int64)
        self._main_current = Column(np.bool_, False, capacity=max(1024, int(slots.max(initial=0)) + 1))
        self._main_current.ensure(int(slots.max(initial=-1)) + 1)
        self._main_current.view()[slots[current]] = True

    def _clear_tail(self) -> None:
        self._tail, self._tail_lens, self._tail_postings, self._tail_df, self._tail_len = {}, {}, {}, {}, 0

    # -- snapshots ------------------------------------------------------------------------------------------
    def export(self) -> dict[str, object]:
        """The main index as plain arrays and lists (for a snapshot); the tail is listed by slot only."""
        main = self._main
        out: dict[str, object] = {
            "format": FORMAT,
            "slots": self._main_slots,
            "lengths": self._main_lengths,
            "current": self._main_current.view()[self._main_slots] if len(self._main_slots) else np.zeros(0, bool),
            "df_terms": [term for term, n in self._main_df.items() if n],  # a term no document holds now: gone
            "df_counts": np.fromiter((n for n in self._main_df.values() if n), dtype=np.int64),
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
        return _current_only(out)

    def restore(self, state: dict[str, object], live: npt.NDArray[np.int64], texts: Callable[[int], str]) -> None:
        """Load an :meth:`export`-ed index into this empty one. ``live`` are the slots that have a document
        now, ``texts(slot)`` their text (for the tail, which is re-tokenized). Raises :class:`TextMismatch` if the
        state does not describe exactly those documents."""
        if state.get("format") != FORMAT:
            raise TextMismatch("a text index of another layout (term frequencies were added in format 2)")
        try:
            state = _current_only(state)  # a file written before stale documents were dropped on export
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise TextMismatch(f"inconsistent text index arrays: {exc}") from None
        try:
            slots = np.asarray(state["slots"], dtype=np.int64)
            lengths = np.asarray(state["lengths"], dtype=np.int64)
            current = np.asarray(state["current"], dtype=np.bool_)
            tail = np.asarray(state["tail"], dtype=np.int64)
            df_terms = list(state["df_terms"])  # type: ignore[call-overload]
            df_counts = np.asarray(state["df_counts"], dtype=np.int64)
            main_len = int(state["main_len"])  # type: ignore[call-overload]
        except (KeyError, TypeError, ValueError) as exc:
            raise TextMismatch(f"incomplete text index: {exc}") from None
        documents = np.concatenate([slots[current], tail]) if len(current) == len(slots) == len(lengths) else None
        if documents is None or len(df_terms) != len(df_counts):
            raise TextMismatch("inconsistent text index arrays")
        if len(documents) != len(live) or not np.array_equal(np.sort(documents), np.sort(live)):
            raise TextMismatch("the text index covers other documents than the snapshot's records")
        main, pairs = None, _pair_codes(np.zeros(0), np.zeros(0))
        if len(slots):
            try:
                vocab = list(state["vocab"])  # type: ignore[call-overload]
                data = np.asarray(state["data"], dtype=np.float32)
                indices = np.asarray(state["indices"], dtype=np.int32)
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
                or (len(data) and not float(data.min()) >= 1)
                or int(lengths.min()) < 0
            ):
                raise TextMismatch("the bm25 arrays do not fit together")
            # each column's postings in increasing position: searches look documents up by binary search
            rises = np.diff(indices.astype(np.int64)) > 0
            rises[indptr[1:-1][(indptr[1:-1] > 0) & (indptr[1:-1] < len(indices))] - 1] = True
            if not rises.all():
                raise TextMismatch("the bm25 postings are not sorted by document")
            main = _as_bm25s(data, indices, indptr, vocab, num_docs)
            pairs = _pair_codes(data, lengths[indices])
        self._use_main(main, pairs)
        self._set_main(slots, current, lengths)
        self._main_df = dict(zip(df_terms, df_counts.tolist(), strict=True))
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
        """The ``k`` best slots that ``mask`` admits for ``query``: BM25 (:mod:`tkg.tokens`) over the live
        documents' statistics, each score a float64 sum in query-term order returned as
        :func:`~tkg.tokens.rank_score`; equal scores in slot order."""
        if k <= 0 or not self._count:
            return []
        documents = self._count
        weights = {}  # term -> idf, in query order; terms no live document holds add nothing
        for term in dict.fromkeys(tokenize(query)):
            df = self._main_df.get(term, 0) + self._tail_df.get(term, 0)
            if df:
                weights[term] = idf(documents, df)
        if not weights:
            return []
        average = max(1e-9, (self._main_len + self._tail_len) / documents)
        found: list[tuple[int, float]] = []
        main = self._main
        if main is not None and len(self._main_slots):
            found = self._search_main(main, weights, average, k, mask)
        if self._tail:
            found += self._search_tail(weights, average, k, mask)
            found.sort(key=lambda item: (-item[1], item[0]))
        return found[:k]

    def _search_main(
        self, main: bm25s.BM25, weights: dict[str, float], average: float, k: int, mask: Mask
    ) -> list[tuple[int, float]]:
        """The top ``k`` current main documents."""
        index = main.scores
        vocab = main.vocab_dict
        columns = [(vocab[term], weight) for term, weight in weights.items() if term in vocab]
        if not columns:
            return []
        spans = _spans(index, [c for c, _ in columns])
        # each query term with postings, in query order: its postings' range and its value for each pair code
        codes, pair_tf, pair_dl = self._main_pairs
        terms = [
            (a, b, term_part(w, pair_tf, pair_dl, average))
            for (a, b), (_, w) in zip(spans, columns, strict=True)
            if b > a
        ]
        total = sum(b - a for a, b, _ in terms)
        if not total:
            return []
        indices = index["indices"]
        found = self._search_pruned(indices, terms, k, mask)
        if found is not None:
            return found
        n = len(self._main_slots)
        current = self._main_current.view()
        # Main positions are slots when no slot is missing (slots are sorted and distinct); then a query whose
        # postings cover a good share of the documents is summed in one dense array and masked with dense ops.
        if total >= _DENSE_SHARE * n and int(self._main_slots[-1]) == n - 1:
            found = self._search_dense(indices, terms, total, k, mask)
            if found is not None:
                return found
        documents, sums = bm25_sums([(indices[a:b], np.take(value, codes[a:b])) for a, b, value in terms])
        slots = self._main_slots[documents]
        keep = current[slots] & mask[slots]
        return top_k(slots[keep], sums[keep].astype(np.float32), k)

    def _search_dense(
        self,
        indices: npt.NDArray[np.int32],
        terms: list[tuple[int, int, npt.NDArray[np.float64]]],
        total: int,
        k: int,
        mask: Mask,
    ) -> list[tuple[int, float]] | None:
        """The top ``k`` when main positions are slots, from one float32 array over every document (float64 sums
        over a million documents cost twice the memory traffic). With one term, its float32 values are the ranked
        scores themselves. With more, each float32 sum is within 2m + 2 float32 rounding steps of the ranked
        score (m terms, all values positive), so the documents whose sum is within ``margin`` of the k-th best
        hold the top k, ties included; they are rescored exactly (:meth:`_exact`). None when that would cost more
        than summing every posting exactly (the caller does)."""
        codes = self._main_pairs[0]
        current = self._main_current.view()
        n = len(self._main_slots)
        scores = np.zeros(n, dtype=np.float32)
        for a, b, value in terms:
            # np.take: twice as fast as indexing with the small codes
            np.add.at(scores, _canonical(indices[a:b]), np.take(value.astype(np.float32), codes[a:b]))
        margin = 0.0 if len(terms) == 1 else (4 * len(terms) + 8) * 2.0**-24
        positions = dense_candidates(scores, lambda at: current[at] & mask[at], k, margin)
        if positions is None:
            keep = scores > 0
            keep &= current[:n]
            keep &= mask[:n]
            positions = np.flatnonzero(keep)
        if not margin:
            return top_k(positions, scores[positions], k)
        if len(positions) > k:
            kth = float(np.partition(scores[positions], len(positions) - k)[len(positions) - k])
            positions = positions[scores[positions] >= kth * (1 - margin)]
        if len(positions) * len(terms) * _LOOKUP_COST > total:
            return None
        return top_k(positions, self._exact(indices, terms, positions).astype(np.float32), k)

    def _search_pruned(
        self,
        indices: npt.NDArray[np.int32],
        terms: list[tuple[int, int, npt.NDArray[np.float64]]],
        k: int,
        mask: Mask,
    ) -> list[tuple[int, float]] | None:
        """The top ``k`` found among the documents holding the query's rarest term alone (MaxScore), or None.

        A document without the rarest term scores at most the sum of the other terms' bounds (the most each adds
        to a document: its part for the best (frequency, length) pair among its postings). A document with it
        scores at least its part for it (a float64 sum of positive parts is at least each of them). So when the
        k-th best part among the admitted documents holding the rarest term ranks above the others' bounds (as
        ranked, float32: rounding keeps the order), no other document can enter the top k or tie at its cut: the
        answer is theirs, by their exact sums (:meth:`_exact`), as the exhaustive merge gives it. None when the
        rarest term is not rare enough for its lookups to cost less than the merge, fewer than ``k`` admitted
        documents hold it, or its parts do not decide."""
        if len(terms) < 2:
            return None
        rarest = min(range(len(terms)), key=lambda t: terms[t][1] - terms[t][0])
        a, b, value = terms[rarest]
        if (b - a) * len(terms) * _PRUNE_COST > sum(end - start for start, end, _ in terms):
            return None
        # The others' bounds are the same float64 values as their parts, added in the same order from 0: a document
        # without the rarest term sums to at most this (rounding never reverses an order); the slack is a margin.
        rest = np.float32(sum(self._bound(*terms[t]) for t in range(len(terms)) if t != rarest) * (1 + 1e-9))
        if not rest < np.float32(self._bound(a, b, value)):
            return None  # no part of the rarest term reaches the others' bounds
        positions = indices[a:b]
        slots = self._main_slots[positions]
        keep = self._main_current.view()[slots] & mask[slots]
        if int(np.count_nonzero(keep)) < k:
            return None
        parts = np.take(value, self._main_pairs[0][a:b][keep]).astype(np.float32)
        if not rest < np.partition(parts, len(parts) - k)[len(parts) - k]:
            return None
        positions, slots = positions[keep], slots[keep]
        return top_k(slots, self._exact(indices, terms, positions).astype(np.float32), k)

    def _bound(self, a: int, b: int, value: npt.NDArray[np.float64]) -> float:
        """The most the term whose postings are ``a:b`` (worth ``value`` by pair code) adds to a document."""
        memo, codes = self._codes_in, self._main_pairs[0]  # one main index: swaps and searches hold the store lock
        present = memo.get(a)
        if present is None:
            present = memo[a] = np.flatnonzero(np.bincount(codes[a:b]))
        return float(value[present].max())

    def _exact(
        self,
        indices: npt.NDArray[np.int32],
        terms: list[tuple[int, int, npt.NDArray[np.float64]]],
        documents: npt.NDArray[np.integer[Any]],
    ) -> npt.NDArray[np.float64]:
        """The BM25 sums of the main positions ``documents``: each term found by binary search in its postings
        (sorted by position), the values added in query order; adding 0 where a term is absent changes no sum, so
        each equals the exhaustive merge's."""
        codes = self._main_pairs[0]
        sums = np.zeros(len(documents), dtype=np.float64)
        for a, b, value in terms:
            postings = indices[a:b]
            at = np.minimum(np.searchsorted(postings, documents), b - a - 1)
            hit = np.flatnonzero(postings[at] == documents)
            found = np.zeros(len(documents), dtype=np.float64)
            found[hit] = np.take(value, codes[a:b][at[hit]])
            sums += found
        return sums

    def _search_tail(self, weights: dict[str, float], average: float, k: int, mask: Mask) -> list[tuple[int, float]]:
        """The tail's top ``k``, scored like the main documents; vectorised per term (the tail may hold a quarter
        of the main index between merges)."""
        lengths = self._tail_lens
        found_slots: list[npt.NDArray[np.int64]] = []
        found_scores: list[npt.NDArray[np.float64]] = []
        for term, weight in weights.items():
            postings = self._tail_postings.get(term)
            if not postings:
                continue
            n = len(postings)
            slots = np.fromiter(postings.keys(), dtype=np.int64, count=n)
            tf = np.fromiter(postings.values(), dtype=np.float64, count=n)
            dl = np.fromiter(map(lengths.__getitem__, postings.keys()), dtype=np.float64, count=n)
            keep = mask[slots]
            found_slots.append(slots[keep])
            found_scores.append(term_part(weight, tf[keep], dl[keep], average))
        if not found_slots or not sum(map(len, found_slots)):
            return []
        slots, sums = bm25_sums(list(zip(found_slots, found_scores, strict=True)))
        return top_k(slots, sums.astype(np.float32), k)

    def stats(self) -> dict[str, int]:
        return {"main": len(self._main_slots), "tail": len(self._tail)}

    def memory(self) -> dict[str, int]:
        """Approximate bytes held by the bm25s arrays and the per-slot columns."""
        main = self._main
        arrays = 0
        if main is not None:
            arrays = sum(np.asarray(main.scores[k]).nbytes for k in ("data", "indices", "indptr"))
            arrays += sum(part.nbytes for part in self._main_pairs)
        return {"bm25": arrays + self._main_slots.nbytes + self._main_lengths.nbytes + self._main_current.size}
