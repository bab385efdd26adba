"""Cosine similarity as every backend scores it, so that they rank alike, ties included.

A store scores a query against a stored vector as the raw row's product with the unit query, times the row's
``1 / norm``: numpy's ``einsum`` over float32 rows, whose result for a row is the same whichever rows it is computed
with. A database computes it its own way (pgvector: a float32 distance, an ulp or so off), and two records whose
vectors score the same here -- the same text, or a bag-of-words embedder's equal overlaps -- then rank by rounding,
not by insertion order as everywhere else. Stores rescore what they found with these functions. Pure functions.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


def inverse_norm(vector: npt.NDArray[np.float32]) -> float:
    """``1 / ||vector||`` (1 for a zero vector, which then scores 0 against everything)."""
    norm = float(np.sqrt(np.einsum("i,i->", vector, vector, dtype=np.float64)))
    return 1.0 / norm if norm > 0 else 1.0


def inverse_norms(rows: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """:func:`inverse_norm` of each row, as float32 (how a store keeps them)."""
    return np.array([inverse_norm(row) for row in rows], dtype=np.float32)


def cosines(
    rows: npt.NDArray[np.float32], query: npt.NDArray[np.float32], scales: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """The cosine of each raw row (float32, C order) with the unit ``query``, given the rows' ``scales``
    (:func:`inverse_norms`)."""
    # einsum, not `@`: a matrix-vector product through multithreaded OpenBLAS is ~100x slower when another
    # process holds a core (its threads spin); einsum stays single-threaded and predictable.
    dots: npt.NDArray[np.float32] = np.einsum("ij,j->i", rows, query)
    return bounded(dots * scales)


def bounded(scores: npt.NDArray[np.floating]) -> npt.NDArray[np.float32]:
    """Products of rows and their ``1 / norm`` as cosines: float32, within [-1, 1] (a vector with itself may come
    out an ulp above 1)."""
    return np.clip(scores, -1.0, 1.0).astype(np.float32, copy=False)
