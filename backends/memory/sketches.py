"""Bit sketches of the in-memory store's vectors, for filtered nearest-neighbour search over large subsets.

A filter that passes a few thousand to a hundred thousand slots is the hard case of vector search: exact scoring
reads every passing row (1.5 KB each at 384-d), and hnswlib under a filter calls back into Python for every node it
walks past (its walk crowded by nodes the filter refuses: the facts of a hot entity under the new fact's own
relation, when the search wants the others). The sketches (:mod:`tkg.vector_sketches`) of the passing slots are
scanned instead, ~7 ns a slot (0.75 ms over 100,000), and the closest by sketch scored exactly. Recall against
exact search: of the top 32, 0.97-0.98 on the hot entity benchmark's facts at 10,000 (hnswlib's filtered walk:
0.67); of the top 10, 0.965 on random 32-d vectors with the 300 nearest filtered out (the hard case for hashing;
hnswlib: 0.995).

Sketches are computed when first needed (a memory whose searches never take this path never pays for them) and
are not saved: they are a pure function of the vectors.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from tkg.vector_sketches import BITS, EXACT_UP_TO, WORDS, candidate_count, sketch

from .arrays import Column

Rows = Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float32]]


class Sketches:
    """The sketch of each slot's vector, kept column-wise (one array per 64-bit word) and computed lazily: a slot
    whose vector is set again or removed is marked stale and sketched again when a search next needs it."""

    __slots__ = ("_last", "_ready", "_words")

    def __init__(self) -> None:
        self._words = [Column(np.uint64, 0) for _ in range(WORDS)]
        self._ready = Column(np.bool_, False)
        # The distances of the last span scanned whole: (query, its sketch, first slot, distances). An episode's two
        # searches around an entity (its relation, the others) ask with one query over slots of one span: the
        # second reads the first's distances instead of scanning again. The span runs to the index's last slot, and
        # a sketch made (again) later corrects its slot's distance: a slot is always sketched before its distance
        # is read, so the distances read are always those of the current sketches.
        self._last: tuple[bytes, npt.NDArray[np.uint64], int, npt.NDArray[np.uint16]] | None = None

    def nbytes(self) -> int:
        """Bytes held: the sketches, their flags and the last span's distances (the directions, BITS x dim floats,
        are shared by every store of that dimension)."""
        return self._ready.size * (WORDS * 8 + 1) + (self._last[3].nbytes if self._last is not None else 0)

    def forget(self, slot: int) -> None:
        """``slot``'s vector changed or went away."""
        if slot < self._ready.size:
            self._ready[slot] = False  # its distance in the last span is corrected when it is sketched again

    def candidates(
        self, query: npt.NDArray[np.float32], slots: npt.NDArray[np.int64], k: int, rows: Rows, size: int
    ) -> npt.NDArray[np.int64]:
        """Among ``slots`` (ascending), the ``candidate_count(k)`` whose sketch is nearest ``query``'s, equal
        distances in slot order (the candidates PostgreSQL takes by ``ORDER BY distance, seq LIMIT``); all of them
        up to ``EXACT_UP_TO``. ``rows(slots)`` gives raw vectors to sketch; ``size``: the slots the index has."""
        want = candidate_count(k)
        if len(slots) <= max(want, EXACT_UP_TO):
            return slots
        for column in (*self._words, self._ready):
            column.ensure(size)
        self._sketch_missing(slots, rows)
        distance = self._distances(query, slots)
        # The cut: the smallest distance at which at least `want` slots are that close (distances are small ints);
        # all the closer ones are taken, and of those at the cut the first in slot order.
        closer = np.cumsum(np.bincount(distance, minlength=BITS + 1))
        cut = int(np.searchsorted(closer, want))
        short = want - (int(closer[cut - 1]) if cut else 0)
        taken = distance < cut
        taken[np.flatnonzero(distance == cut)[:short]] = True
        return slots[taken]

    def _distances(self, query: npt.NDArray[np.float32], slots: npt.NDArray[np.int64]) -> npt.NDArray[np.uint16]:
        """The Hamming distance of each of ``slots``' sketches (all made) to ``query``'s."""
        low, high = int(slots[0]), int(slots[-1]) + 1
        key = query.tobytes()
        last = self._last
        if last is not None and last[0] == key and last[2] <= low and high <= last[2] + len(last[3]):
            return last[3][slots - last[2]]
        mine = sketch(query[None, :])[0]
        # Scan the span and read it at the slots, else gather. The span is the whole index when that stays dense,
        # else the index's end when that does: the next search's slots may start before these and end after them
        # (the other relation's facts around the same entity, the oldest or the newest of them).
        size = self._ready.size
        low, end = (0, size) if 4 * len(slots) >= size else (low, size if 4 * len(slots) >= size - low else high)
        dense = 4 * len(slots) >= end - low
        distance = np.zeros(end - low if dense else len(slots), dtype=np.uint16)
        for word, bits in zip(self._words, mine.tolist(), strict=True):
            values = word.view()[low:end] if dense else word.view()[slots]
            distance += np.bitwise_count(values ^ np.uint64(bits))
        if not dense:
            return distance
        self._last = (key, mine, low, distance)
        return distance[slots - low]

    def _sketch_missing(self, slots: npt.NDArray[np.int64], rows: Rows) -> None:
        missing = slots[~self._ready.view()[slots]]
        for start in range(0, len(missing), 8192):
            part = missing[start : start + 8192]
            made = sketch(rows(part))
            for j, word in enumerate(self._words):
                word.view()[part] = made[:, j]
            self._ready.view()[part] = True
            self._correct(part, made)

    def _correct(self, part: npt.NDArray[np.int64], made: npt.NDArray[np.uint64]) -> None:
        """The last span's distances of ``part``, whose sketches (``made``) were just made."""
        last = self._last
        if last is None:
            return
        _, mine, low, distance = last
        inside = (part >= low) & (part < low + len(distance))
        if inside.any():
            distance[part[inside] - low] = np.bitwise_count(made[inside] ^ mine).sum(axis=1, dtype=np.uint16)
