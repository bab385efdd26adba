"""Shared fixtures. ``make_store`` is parametrised over every backend: the conformance suite runs on each."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

import pytest

from tkg.backends.memory import InMemoryStore
from tkg.storage import Store

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def _memory_store(dim: int) -> Store:
    # Small tails and thresholds so that tests exercise the HNSW graph, the bm25s rebuild and the fresh tails.
    store = InMemoryStore(dim=dim, vector_tail=8)
    for index in store._texts.values():
        index._min_rebuild = 8
    return store


BACKENDS: dict[str, Callable[[int], Store]] = {"memory": _memory_store}


@pytest.fixture(params=sorted(BACKENDS))
def make_store(request: pytest.FixtureRequest) -> Callable[[int], Store]:
    return BACKENDS[request.param]
