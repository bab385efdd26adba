"""tkg.memo: bounded memos the cycle collector never walks, and the engine's hot string functions kept in them."""

from __future__ import annotations

import gc

import pytest

import tkg
from tkg import invalidation, resolution, tokens
from tkg.errors import ValidationError
from tkg.memo import Memo


def test_memo_returns_the_functions_results_and_calls_it_once_per_key() -> None:
    calls: list[str] = []

    def length(text: str) -> int:
        calls.append(text)
        return len(text)

    memo = Memo(length, maxsize=10)
    assert [memo(w) for w in ("a", "bb", "a", "", "")] == [1, 2, 1, 0, 0]
    # a falsy result is kept too ("" -> 0 is asked of the table, not recomputed by __call__)
    assert calls == ["a", "bb", ""]


def test_a_full_memo_starts_over_and_stays_bounded() -> None:
    memo = Memo(str.upper, maxsize=3)
    for i in range(10):
        memo(f"w{i}")
        assert 1 <= len(memo) <= 3
    assert memo("w9") == "W9"
    memo.clear()
    assert len(memo) == 0


@pytest.mark.parametrize("maxsize", [0, -1])
def test_memo_refuses_a_size_below_one(maxsize: int) -> None:
    with pytest.raises(ValidationError):
        Memo(str.upper, maxsize=maxsize)


def _collector_visits() -> int:
    """How many references a full collection would follow now (one per referent of each tracked object)."""
    gc.collect()
    return sum(len(gc.get_referents(o)) for o in gc.get_objects())


def test_the_engines_memos_add_nothing_for_the_collector_to_walk() -> None:
    """Tokens, sentence keys, fuzzy names and hashed embeddings of 5,000 new words: their memos grow by
    thousands of entries, and a full collection (which stops every thread) has no more to follow than before.
    An lru_cache in their place would add two or three visits per entry."""
    embedder = tkg.HashEmbedder(dim=16)
    words = [f"zq{i}x{i * 7919 % 10007}" for i in range(5000)]
    embedder.embed(["warm up"])
    before = _collector_visits()
    for word in words:
        tokens.tokenize(f"{word} ran")
        invalidation.text_key(f"{word} moved.")
        resolution.fuzzy_form(f"Dr. {word}")
    embedder.embed(words)
    grown = _collector_visits() - before
    for memo in (tokens._STEMS, invalidation._TEXT_KEYS, resolution._FUZZY_FORMS, embedder._codes):
        assert len(memo) >= 5000
        assert not gc.is_tracked(memo.table)
    assert grown < 1000, grown
