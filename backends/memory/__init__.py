"""The in-memory backend (igraph + hnswlib + bm25s); snapshots go through :mod:`tkg.snapshot`."""

from .store import InMemoryStore

__all__ = ["InMemoryStore"]
