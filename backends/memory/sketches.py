"""Bit sketches of vectors for filtered nearest-neighbour search over large subsets.

A filter that passes a few thousand to a hundred thousand slots is the hard case of vector search: exact scoring
reads every passing row (1.5 KB each at 384-d), and hnswlib under a filter calls back into Python for every node it
walks past (its walk crowded by nodes the filter refuses: the facts of a hot entity under the new fact's own
relation, when the search wants the others). A sketch is the sign of the vector's product with ``BITS`` fixed
random directions (random-hyperplane hashing): the fraction of bits two sketches differ in estimates the angle
between their vectors. Scanning the sketches of the passing slots costs ~7 ns a slot (0.75 ms over 100,000); the
closest by sketch (16 per result wanted, at least 1,024) are then scored exactly, so a result's scores are exact
and only its membership is approximate, as with HNSW. Recall against exact search: of the top 32, 0.97-0.98 on
the hot entity benchmark's facts at 10,000 (hnswlib's filtered walk: 0.67); of the top 10, 0.965 on random 32-d
vectors with the 300 nearest filtered out (the hard case for hashing; hnswlib: 0.995).

Sketches are computed when first needed (a memory whose searches never take this path never pays for them) and
are not saved: they are a pure function of the vectors and of ``SEED``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from .arrays import Column

BITS = 384
WORDS = BITS // 64
SEED = 0x746B67  # fixed: sketches of the same vectors are the same in every process
# Candidates scored exactly per wanted result (at least _MIN_CANDIDATES): the sketch only has to put the true
# neighbours among them, not in order.
_OVERSAMPLE = 16
_MIN_CANDIDATES = 1024
_BLAS_FROM = 256  # rows sketched at once from which a BLAS product beats einsum's ~22 us a row (384-d)

Rows = Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float32]]


class Sketches:
    """The sketch of each slot's vector, kept column-wise (one array per 64-bit word) and computed lazily: a slot
    whose vector is set again or removed is marked stale and sketched again when a search next needs it."""

    __slots__ = ("_dim", "_planes", "_ready", "_words")

    def __init__(self, dim: int) -> None:
        self._dim = dim
        self._planes: npt.NDArray[np.float32] | None = None  # made on first use (BITS x dim floats)
        self._words = [Column(np.uint64, 0) for _ in range(WORDS)]
        self._ready = Column(np.bool_, False)

    def nbytes(self) -> int:
        """Bytes held: the sketches, their flags and, once made, the hyperplanes."""
        planes = 0 if self._planes is None else self._planes.nbytes
        return self._ready.size * (WORDS * 8 + 1) + planes

    def forget(self, slot: int) -> None:
        """``slot``'s vector changed or went away."""
        if slot < self._ready.size:
            self._ready[slot] = False

    def candidates(
        self, query: npt.NDArray[np.float32], slots: npt.NDArray[np.int64], k: int, rows: Rows
    ) -> npt.NDArray[np.int64]:
        """Among ``slots`` (ascending), those whose sketch is nearest ``query``'s: at least ``k * _OVERSAMPLE``
        (all of them when there are not more), ties at the cut kept. ``rows(slots)`` gives raw vectors to sketch."""
        want = max(k * _OVERSAMPLE, _MIN_CANDIDATES)
        if len(slots) <= want:
            return slots
        self._sketch_missing(slots, rows)
        mine = self.sketch(query[None, :])[0]
        low, high = int(slots[0]), int(slots[-1]) + 1
        dense = 4 * len(slots) >= high - low  # scan the span and read it at the slots, else gather
        distance = np.zeros(high - low if dense else len(slots), dtype=np.uint16)
        for word, bits in zip(self._words, mine.tolist(), strict=True):
            values = word.view()[low:high] if dense else word.view()[slots]
            distance += np.bitwise_count(values ^ np.uint64(bits))
        if dense:
            distance = distance[slots - low]
        # The cut: the smallest distance at which at least `want` slots are that close (distances are small ints).
        cut = int(np.searchsorted(np.cumsum(np.bincount(distance, minlength=BITS + 1)), want))
        return slots[distance <= cut]

    def sketch(self, vectors: npt.NDArray[np.float32]) -> npt.NDArray[np.uint64]:
        """The sketches of ``vectors`` (rows), one row of ``WORDS`` words each."""
        if self._planes is None:  # one hyperplane per row
            self._planes = np.random.default_rng(SEED).standard_normal((BITS, self._dim)).astype(np.float32)
        if len(vectors) < _BLAS_FROM:
            # einsum: single-threaded; a small product through multithreaded OpenBLAS spins its threads when another
            # process holds a core (64 rows: np.dot 2.7 ms, einsum 1.4 ms, with the other core busy).
            signs = np.einsum("ij,kj->ik", vectors, self._planes) > 0
        else:
            signs = np.dot(vectors, self._planes.T) > 0
        return np.packbits(signs, axis=1).view(np.uint64)  # type: ignore[no-any-return]

    def _sketch_missing(self, slots: npt.NDArray[np.int64], rows: Rows) -> None:
        size = int(slots[-1]) + 1
        for column in (*self._words, self._ready):
            column.ensure(size)
        missing = slots[~self._ready.view()[slots]]
        for start in range(0, len(missing), 8192):
            part = missing[start : start + 8192]
            made = self.sketch(rows(part))
            for j, word in enumerate(self._words):
                word.view()[part] = made[:, j]
            self._ready.view()[part] = True
