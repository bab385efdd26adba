"""The embedder protocol and the check every vector passes before it reaches a store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from tkg.errors import EmbeddingError


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into vectors. ``embed`` returns a float32 array of shape ``(len(texts), dim)``."""

    @property
    def dim(self) -> int: ...

    @property
    def name(self) -> str:
        """Identifies the model, so a snapshot can refuse vectors from another one."""
        ...

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]: ...


def check_vectors(vectors: object, dim: int, count: int | None = None) -> npt.NDArray[np.float32]:
    """Validate and L2-normalise a batch of vectors: right shape, finite, not all zero where that matters."""
    try:
        arr = np.asarray(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise EmbeddingError(f"embeddings are not numeric vectors: {exc}") from None
    if arr.ndim == 1:
        arr = arr.reshape(1, -1)
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise EmbeddingError(f"embeddings have shape {arr.shape}; expected (n, {dim}) for this memory's dimension")
    if count is not None and arr.shape[0] != count:
        raise EmbeddingError(f"the embedder returned {arr.shape[0]} vectors for {count} texts")
    if not np.isfinite(arr).all():
        raise EmbeddingError("embeddings contain NaN or infinite values")
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    return np.ascontiguousarray(arr / norms, dtype=np.float32)
