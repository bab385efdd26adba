"""The reference store: the storage contract as plain brute force, the oracle of the conformance suite."""

from .store import ReferenceStore

__all__ = ["ReferenceStore"]
