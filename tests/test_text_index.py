"""The in-memory BM25 index scores only the query's postings, with exactly bm25s's dense results.

The oracle is bm25s itself: ``BM25.get_scores_from_ids`` builds a float32 score for every document, and the
search it replaced kept the positive ones, masked them and took the top k. Small vocabularies make many equal
scores, so the choice among tied documents is compared too.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

import bm25s
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tkg.backends.memory import text as text_module
from tkg.backends.memory import vectors as vectors_module
from tkg.backends.memory.text import TextIndex, score_postings, tokenize
from tkg.backends.memory.vectors import top_k

# Few words, so documents share terms and scores tie; "the"/"and" are stop words; "zebra" is never indexed.
WORDS = ["alpha", "beta", "gamma", "delta", "omega", "works", "working", "lives", "the", "and"]
QUERY_WORDS = [*WORDS, "zebra", "unknown"]

texts_st = st.lists(st.sampled_from(WORDS), min_size=0, max_size=8).map(" ".join)
query_st = st.lists(st.sampled_from(QUERY_WORDS), min_size=0, max_size=6).map(" ".join)


@contextmanager
def dense_share(share: float) -> Iterator[None]:
    """Force the dense (0) or the sparse (inf) merge of the postings."""
    saved = text_module._DENSE_SHARE
    text_module._DENSE_SHARE = share
    try:
        yield
    finally:
        text_module._DENSE_SHARE = saved


def bm25(corpus: list[list[str]]) -> bm25s.BM25:
    model = bm25s.BM25(k1=TextIndex.K1, b=TextIndex.B, method="lucene")
    model.index([tokens or [""] for tokens in corpus], show_progress=False)
    return model


def dense_reference(model: bm25s.BM25, ids: list[int]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    scores = model.get_scores_from_ids(ids)
    positions = np.flatnonzero(scores > 0)
    return positions, scores[positions]


def assert_same(
    got: tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]],
    want: tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]],
) -> None:
    assert got[0].tolist() == want[0].tolist()
    assert got[1].dtype == np.float32
    assert got[1].view(np.int32).tolist() == np.asarray(want[1], dtype=np.float32).view(np.int32).tolist()  # bits


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    corpus=st.lists(texts_st, min_size=1, max_size=40),
    query=st.lists(st.sampled_from(QUERY_WORDS), min_size=1, max_size=8),
    share=st.sampled_from([0.0, float("inf")]),
)
def test_postings_scores_equal_bm25s_dense_scores(corpus: list[str], query: list[str], share: float) -> None:
    model = bm25([tokenize(text) for text in corpus])
    ids = model.get_tokens_ids([token for word in query for token in tokenize(word)])  # repeats kept
    with dense_share(share):
        got = score_postings(model.scores, ids)
    assert_same(got, dense_reference(model, ids))


def test_postings_scores_of_no_or_unknown_tokens_are_empty() -> None:
    model = bm25([["alpha"], ["beta", "alpha"]])
    for ids in ([], model.get_tokens_ids(["zebra"])):
        positions, scores = score_postings(model.scores, ids)
        assert positions.tolist() == [] and scores.tolist() == []
    # bm25s appends the empty token to the vocabulary without a column: it has no postings
    assert score_postings(model.scores, [len(model.scores["indptr"]) - 1])[0].tolist() == []


def test_repeated_documents_in_a_column_are_summed_like_bm25s() -> None:
    model = bm25([["alpha", "beta"], ["alpha"], ["beta", "beta", "gamma"]])
    # A hand-made matrix whose only column lists document 1 twice (bm25s never writes one; a file might).
    crafted = {
        "data": np.array([0.5, 0.25, 0.125], dtype=np.float32),
        "indices": np.array([1, 1, 0], dtype=np.int32),
        "indptr": np.array([0, 3], dtype=np.int64),
        "num_docs": 2,
    }
    model.scores = crafted
    for share in (0.0, float("inf")):
        with dense_share(share):
            assert_same(score_postings(crafted, [0, 0]), dense_reference(model, [0, 0]))


# -- the whole index against the search it replaced ---------------------------------------------------------
def reference_search(index: TextIndex, query: str, k: int, mask: npt.NDArray[np.bool_]) -> list[tuple[int, float]]:
    """The former TextIndex.search: bm25s's dense scores over every main document, then positives, mask, top k."""
    terms = list(dict.fromkeys(tokenize(query)))
    if not terms or k <= 0 or not len(index):
        return []
    found: list[tuple[int, float]] = []
    main = index._main
    if main is not None and len(index._main_slots):
        ids = main.get_tokens_ids(terms)
        if ids:
            scores = main.get_scores_from_ids(ids)
            positive = np.flatnonzero(scores > 0)
            slots = index._main_slots[positive]
            keep = index._main_current.view()[slots] & mask[slots]
            found = top_k(slots[keep], scores[positive][keep].astype(np.float32), k)
    if index._tail:
        found += reference_tail(index, terms, k, mask)
        found.sort(key=lambda item: (-item[1], item[0]))
    return found[:k]


def reference_tail(index: TextIndex, terms: list[str], k: int, mask: npt.NDArray[np.bool_]) -> list[tuple[int, float]]:
    """The former TextIndex._search_tail: BM25 in Python floats, document by document, term by term."""
    n_docs = len(index)
    avg_len = max(1e-9, (index._main_len + index._tail_len) / max(1, n_docs))
    scores: dict[int, float] = {}
    for term in terms:
        postings = index._tail_postings.get(term)
        if not postings:
            continue
        df = index._main_df.get(term, 0) + index._tail_df[term]
        idf = math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
        for slot in postings:
            if not mask[slot]:
                continue
            tf = index._tail[slot][term]
            dl = index._tail_lens[slot]
            tfc = tf / (index.K1 * (1 - index.B + index.B * dl / avg_len) + tf)
            scores[slot] = scores.get(slot, 0.0) + idf * tfc
    slots = np.fromiter(scores, dtype=np.int64, count=len(scores))
    values = np.fromiter(scores.values(), dtype=np.float32, count=len(scores))
    return top_k(slots, values, k)


class Corpus:
    """Live texts by slot, the source a TextIndex rebuilds from."""

    def __init__(self) -> None:
        self.texts: dict[int, str] = {}

    def __call__(self) -> Iterator[tuple[int, str]]:
        return iter(list(self.texts.items()))


operation_st = st.one_of(
    st.tuples(st.just("set"), st.integers(0, 59), texts_st),
    st.tuples(st.just("remove"), st.integers(0, 59), st.just("")),
    st.tuples(st.just("rebuild"), st.just(0), st.just("")),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    initial=st.lists(texts_st, min_size=0, max_size=50),
    operations=st.lists(operation_st, max_size=25),
    queries=st.lists(query_st, min_size=1, max_size=6),
    mask_seed=st.integers(0, 2**32 - 1),
    k=st.integers(1, 12),
    share=st.sampled_from([0.0, float("inf")]),
    sampled=st.booleans(),
)
def test_search_equals_the_dense_bm25s_search(
    initial: list[str],
    operations: list[tuple[str, int, str]],
    queries: list[str],
    mask_seed: int,
    k: int,
    share: float,
    sampled: bool,
) -> None:
    corpus = Corpus()
    index = TextIndex(corpus, min_rebuild=8)
    index.auto_rebuild = False
    for slot, text in enumerate(initial):
        corpus.texts[slot] = text
        index.set(slot, text)
    index.rebuild()
    index.auto_rebuild = True  # the tail below may trigger merges of its own
    for op, slot, text in operations:  # updates after the build: tail documents, deletions, replacements
        if op == "set":
            index.set(slot, text, corpus.texts.get(slot))
            corpus.texts[slot] = text
        elif op == "remove" and slot in corpus.texts:
            index.remove(slot, corpus.texts.pop(slot))
        elif op == "rebuild":
            index.rebuild()
    size = max([*corpus.texts, *index._main_slots.tolist(), 0]) + 1
    rng = np.random.default_rng(mask_seed)
    masks = [np.ones(size, dtype=np.bool_), rng.random(size) < 0.6, np.zeros(size, dtype=np.bool_)]

    restored = TextIndex(corpus)
    live = np.fromiter(sorted(corpus.texts), dtype=np.int64, count=len(corpus.texts))
    restored.restore(index.export(), live, corpus.texts.__getitem__)

    with dense_share(share), sampling_everywhere() if sampled else nullcontext():
        for query in queries:
            for mask in masks:
                want = reference_search(index, query, k, mask)
                assert index.search(query, k, mask) == want
                assert reference_search(restored, query, k, mask) == want
                assert restored.search(query, k, mask) == want
                # every document found holds a query term, is live and passes the mask
                terms = set(tokenize(query))
                for slot, score in want:
                    assert mask[slot] and score > 0 and terms & set(tokenize(corpus.texts[slot]))


def test_search_sees_main_and_tail_documents_through_the_mask() -> None:
    corpus = Corpus()
    index = TextIndex(corpus, min_rebuild=1000)
    for slot, text in enumerate(["alpha beta", "alpha", "gamma", "beta beta"]):
        corpus.texts[slot] = text
        index.set(slot, text)
    index.rebuild()
    corpus.texts[4] = "alpha gamma"
    index.set(4, "alpha gamma")  # tail
    index.remove(1, corpus.texts.pop(1))  # deleted from the main index
    assert index.stats() == {"main": 4, "tail": 1}
    mask = np.ones(5, dtype=np.bool_)
    assert {slot for slot, _ in index.search("alpha", 10, mask)} == {0, 4}  # not the deleted 1
    mask[0] = False
    assert [slot for slot, _ in index.search("alpha beta", 10, mask)] == [3, 4]
    assert index.search("the and", 10, mask) == []  # stop words only
    assert index.search("zebra", 10, mask) == []


@pytest.mark.parametrize("share", [0.0, float("inf")])
def test_dense_and_sparse_merges_agree_on_a_larger_corpus(share: float) -> None:
    rng = np.random.default_rng(7)
    vocabulary = [f"w{i}" for i in range(200)]
    # Zipf-like: a few very common words, many rare ones
    weights = 1.0 / np.arange(1, len(vocabulary) + 1)
    weights /= weights.sum()
    corpus = [list(rng.choice(vocabulary, size=int(rng.integers(1, 12)), p=weights)) for _ in range(3000)]
    model = bm25(corpus)
    for _ in range(50):
        query = list(rng.choice(vocabulary, size=int(rng.integers(1, 6))))
        ids = model.get_tokens_ids(query)
        with dense_share(share):
            assert_same(score_postings(model.scores, ids), dense_reference(model, ids))


# -- top k ------------------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(
    scores=st.lists(st.sampled_from([0.5, 1.0, 1.5, 2.0, 2.5]), min_size=0, max_size=40),
    k=st.integers(0, 45),
    seed=st.integers(0, 2**16),
)
def test_top_k_breaks_ties_by_slot_even_at_the_cut(scores: list[float], k: int, seed: int) -> None:
    # Few distinct scores, so ties straddle the k-th place: the result must be the k lowest (-score, slot) pairs
    # whatever the order of the arrays (callers hand top_k candidates gathered in different orders).
    rng = np.random.default_rng(seed)
    slots = rng.choice(1000, size=len(scores), replace=False).astype(np.int64)
    values = np.array(scores, dtype=np.float32)
    expected = sorted(zip(slots.tolist(), values.tolist(), strict=True), key=lambda p: (-p[1], p[0]))[:k]
    order = rng.permutation(len(scores))
    assert top_k(slots, values, k) == expected
    assert top_k(slots[order], values[order], k) == expected


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(0, 4000),
    distinct=st.integers(1, 50),
    k=st.integers(1, 25),
    seed=st.integers(0, 2**16),
)
def test_top_k_with_a_sampled_floor_is_exact(n: int, distinct: int, k: int, seed: int) -> None:
    # Many candidates take the sampled-floor path (forced here at any size); ties are frequent and fall at the cut.
    rng = np.random.default_rng(seed)
    slots = rng.choice(10 * n + 1, size=n, replace=False).astype(np.int64)
    values = (rng.integers(0, distinct, size=n) / distinct).astype(np.float32)
    expected = sorted(zip(slots.tolist(), values.tolist(), strict=True), key=lambda p: (-p[1], p[0]))[:k]
    with sampling_everywhere():
        assert top_k(slots, values, k) == expected


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(0, 3000),
    distinct=st.integers(1, 30),
    k=st.integers(1, 25),
    kept_share=st.sampled_from([1.0, 0.5, 0.05]),
    seed=st.integers(0, 2**16),
)
def test_dense_candidates_hold_the_exact_top_k(n: int, distinct: int, k: int, kept_share: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    scores = (rng.integers(0, distinct, size=n) / distinct).astype(np.float32)  # zeros are no match
    kept = rng.random(n) < kept_share
    everything = np.flatnonzero((scores > 0) & kept)
    expected = top_k(everything, scores[everything], k)
    with sampling_everywhere():
        found = vectors_module.dense_candidates(scores, lambda at: kept[at], k)
    if found is not None:
        assert bool(kept[found].all()) and top_k(found, scores[found], k) == expected
    # the floor is used whenever the sample holds k accepted matches
    if n >= 2 * k and np.count_nonzero((scores[:: n // k] > 0) & kept[:: n // k]) >= k:
        assert found is not None


@contextmanager
def sampling_everywhere() -> Iterator[None]:
    """Take top_k's sampled floor at any size, from a sample of k (the smallest allowed)."""
    saved = vectors_module._SAMPLE_FROM, vectors_module._SAMPLE_PER_K
    vectors_module._SAMPLE_FROM, vectors_module._SAMPLE_PER_K = 0, 1
    try:
        yield
    finally:
        vectors_module._SAMPLE_FROM, vectors_module._SAMPLE_PER_K = saved
