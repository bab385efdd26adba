"""Where a memory lives between processes: snapshots of the whole memory (:mod:`tkg.snapshot`) opened into a
store, and written from one."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from tkg import snapshot
from tkg.embedders.base import Embedder
from tkg.errors import BackendError, ConfigurationError
from tkg.models import Kind
from tkg.storage import Store


def save_snapshot(store: Store, path: str | os.PathLike[str], meta: Mapping[str, Any]) -> int:
    """Write ``store`` to a snapshot at ``path`` (atomic, verified); returns the file size in bytes."""
    return snapshot.save(store, path, meta)


def load_snapshot(
    path: str | os.PathLike[str], embedder: Embedder, store: Store | None = None, *, check_embedder: bool = True
) -> Store:
    """The store filled from the snapshot at ``path`` (a fresh in-memory store unless an empty ``store`` is
    given), after checking that ``embedder`` made its vectors. Nothing is changed if a check fails."""
    with snapshot.open_snapshot(path) as opened:
        meta = opened.meta
        if meta.get("dim") != embedder.dim:
            raise ConfigurationError(
                f"snapshot {path} holds {meta.get('dim')}-d vectors; the embedder makes {embedder.dim}-d"
            )
        if check_embedder and meta.get("embedder") != embedder.name:
            raise ConfigurationError(
                f"snapshot {path} was embedded with {meta.get('embedder')!r}, not {embedder.name!r}; "
                "pass the same embedder, or check_embedder=False to mix them knowingly"
            )
        if store is None:
            from tkg.backends.memory import InMemoryStore

            store = InMemoryStore(dim=embedder.dim)
        if store.dim != embedder.dim:
            raise ConfigurationError(f"the store holds {store.dim}-d vectors; the embedder makes {embedder.dim}-d")
        if any(store.count(kind) for kind in Kind):
            raise BackendError("Memory.load() needs an empty store; the one given holds records")
        opened.restore_into(store)
    return store
