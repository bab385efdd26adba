"""Bit sketches of vectors: the sign of a vector's product with ``BITS`` fixed random directions (random-hyperplane
hashing). The share of bits two sketches differ in estimates the angle between their vectors, so a scan of short
sketches can pick the few candidates of a nearest-neighbour search that are then scored exactly: a result's scores
stay exact and only its membership is approximate, as with HNSW.

Both backends filter large neighbourhoods this way (the in-memory store in ``backends/memory/sketches.py``, the
PostgreSQL store from a covering index of its facts' sketches), with the same directions, the same sketch of every
vector and the same number of candidates, so that they find the same facts. Pure functions, no state but a cache of
the directions per dimension.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import numpy.typing as npt

BITS = 384
WORDS = BITS // 64
SEED = 0x746B67  # fixed: sketches of the same vectors are the same in every process and on every backend
# Candidates scored exactly per wanted result (at least MIN_CANDIDATES): the sketch only has to put the true
# neighbours among them, not in order.
OVERSAMPLE = 16
MIN_CANDIDATES = 1024
# Up to this many vectors are all scored exactly, sketched or not: exact answers where scoring them all is cheap
# (about 1.5 ms for 4,096 at 384-d in memory) -- recall@32 of the sketch's 1,024 candidates is ~0.97, not 1.
EXACT_UP_TO = 4096
_BLAS_FROM = 256  # rows sketched at once from which a BLAS product beats einsum's ~22 us a row (384-d)


def candidate_count(k: int) -> int:
    """How many of the closest by sketch are scored exactly to find the closest ``k``, among more than
    ``EXACT_UP_TO`` vectors (up to that many, all are)."""
    return max(k * OVERSAMPLE, MIN_CANDIDATES)


@lru_cache(maxsize=8)
def hyperplanes(dim: int) -> npt.NDArray[np.float32]:
    """The ``BITS`` random directions of ``dim``-d vectors, one per row (read-only)."""
    planes = np.random.default_rng(SEED).standard_normal((BITS, dim)).astype(np.float32)
    planes.flags.writeable = False
    return planes


def sketch(vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.uint64]:
    """The sketches of ``vectors`` (rows of one dimension), one row of ``WORDS`` 64-bit words each: bit ``i`` (most
    significant first, as ``np.packbits`` writes them) is whether the vector's product with direction ``i`` is
    positive."""
    vectors = np.asarray(vectors, dtype=np.float32)
    planes = hyperplanes(vectors.shape[1])
    # Few rows by einsum: single-threaded; a small product through multithreaded OpenBLAS spins its threads when
    # another process holds a core (64 rows: np.dot 2.7 ms, einsum 1.4 ms, with the other core busy).
    few = len(vectors) < _BLAS_FROM
    product = np.einsum("ij,kj->ik", vectors, planes) if few else np.dot(vectors, planes.T)
    return np.packbits(product > 0, axis=1).view(np.uint64)  # type: ignore[no-any-return]


def sketch_text(vectors: npt.NDArray[np.float32]) -> list[str]:
    """The sketches of ``vectors`` as SQL bit-string input (``x`` and hexadecimal digits, bit 0 first)."""
    packed = sketch(vectors).view(np.uint8)
    return ["x" + row.tobytes().hex() for row in packed]
