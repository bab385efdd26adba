"""Cosine search over slots: an hnswlib graph for the bulk, brute force for a fresh tail and small subsets.

Why the tail: one ``add_items`` into a big HNSW graph costs far more than appending a row, so new vectors wait
in a tail (searched exactly) and join the graph in batches. Why brute force for small subsets: a filter that
passes few slots makes HNSW wander; a matrix product over them is exact and faster. Results are therefore always
complete: every live, admitted slot is either in the graph or in the tail.

Memory: each vector is held once in Python, as a row of a matrix chunk owned by this index; the stored record's
vector is a read-only view of that row (:meth:`VectorIndex.set` returns it), so records and exact scoring share
it. Rows are never overwritten -- a changed vector gets a new row, so a view held by an old record never changes
under it -- and chunks never move. hnswlib keeps its own copy of each unit-length vector, which its graph walk
needs; it cannot hand it back cheaply (``get_items`` costs ~35 us a row), so exact scores are the raw rows times
a stored ``1 / norm``.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterator

import hnswlib
import numpy as np
import numpy.typing as npt

from .arrays import Column

Mask = npt.NDArray[np.bool_]
_CHUNK = 8192  # rows scored at a time when an exact fallback scans many slots
_CHUNK_ROWS = 16384  # rows per matrix chunk that new vectors are appended to


def top_k(slots: npt.NDArray[np.int64], scores: npt.NDArray[np.float32], k: int) -> list[tuple[int, float]]:
    """The ``k`` best (slot, score) pairs, best first; ties broken by slot for determinism."""
    if len(slots) == 0 or k <= 0:
        return []
    if len(slots) > k:
        part = np.argpartition(-scores, k - 1)[:k]
        slots, scores = slots[part], scores[part]
    order = np.lexsort((slots, -scores))
    return [(int(slots[i]), float(scores[i])) for i in order]


def inverse_norm(vector: npt.NDArray[np.float32]) -> float:
    """``1 / ||vector||`` (1 for a zero vector, which then scores 0 against everything)."""
    norm = float(np.sqrt(np.einsum("i,i->", vector, vector, dtype=np.float64)))
    return 1.0 / norm if norm > 0 else 1.0


class GraphMismatch(Exception):
    """A persisted HNSW graph does not fit the vectors it was restored next to (the caller rebuilds it)."""


class VectorIndex:
    def __init__(
        self,
        dim: int,
        *,
        m: int = 16,
        ef_construction: int = 100,
        ef_search: int = 64,
        tail_limit: int = 512,
        brute_force_limit: int = 4096,
        threads: int = 1,
    ) -> None:
        self.dim = dim
        self._chunks: list[npt.NDArray[np.float32]] = []  # matrices of rows; never reallocated
        self._fill = 0  # rows used in the last chunk
        self._chunk_of = Column(np.int32, -1)  # slot -> chunk of its row
        self._row_of = Column(np.int32, -1)  # slot -> row in that chunk
        self._scale = Column(np.float32, 1.0)  # slot -> 1 / norm of that vector
        self.has_vec = Column(np.bool_, False)
        self._in_graph = Column(np.bool_, False)
        self._tail: set[int] = set()
        self._graph: hnswlib.Index | None = None
        self._graph_live = 0
        self._m, self._efc, self._efs = m, ef_construction, ef_search
        self._tail_limit, self._brute_limit, self._threads = tail_limit, brute_force_limit, threads

    # -- writes ---------------------------------------------------------------------------------------------
    def set(self, slot: int, vector: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """Index ``vector`` (validated, of this dimension) at ``slot``; returns the read-only view of the row that
        now holds it, which the stored record should carry instead of its own copy."""
        self._grow(slot + 1)
        if self.has_vec[slot]:
            current = self.vector(slot)
            if current is vector or np.array_equal(current, vector):
                return current
        view = self._append(vector)
        self._chunk_of[slot], self._row_of[slot] = len(self._chunks) - 1, self._fill - 1
        self._scale[slot] = inverse_norm(view)
        if self._in_graph[slot]:
            assert self._graph is not None
            self._graph.mark_deleted(slot)
            self._in_graph[slot] = False
            self._graph_live -= 1
        self.has_vec[slot] = True
        self._tail.add(slot)
        if len(self._tail) >= self._tail_limit:
            self.flush()
        return view

    def _append(self, vector: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        if not self._chunks or self._fill == len(self._chunks[-1]) or not self._chunks[-1].flags.writeable:
            self._chunks.append(np.empty((_CHUNK_ROWS, self.dim), dtype=np.float32))
            self._fill = 0
        chunk = self._chunks[-1]
        chunk[self._fill] = vector
        view = chunk[self._fill]
        view.flags.writeable = False
        self._fill += 1
        return view

    def remove(self, slot: int) -> None:
        if slot >= self.has_vec.size or not self.has_vec[slot]:
            return
        self.has_vec[slot] = False
        self._tail.discard(slot)
        if self._in_graph[slot]:
            assert self._graph is not None
            self._graph.mark_deleted(slot)
            self._in_graph[slot] = False
            self._graph_live -= 1

    def flush(self) -> None:
        """Move the tail into the HNSW graph (one batched insert)."""
        if not self._tail:
            return
        slots = np.fromiter(sorted(self._tail), dtype=np.int64, count=len(self._tail))
        graph = self._ensure_graph(int(slots.max()) + 1)
        # Re-adding a label hnswlib marked deleted updates it in place and unmarks it.
        graph.add_items(self._unit_rows(slots), slots, num_threads=self._threads)
        in_graph = self._in_graph.view()
        in_graph[slots] = True
        self._graph_live += len(slots)
        self._tail.clear()

    def _grow(self, size: int) -> None:
        if size > self.has_vec.size:
            self._chunk_of.ensure(size)
            self._row_of.ensure(size)
            self._scale.ensure(size)
            self.has_vec.ensure(size)
            self._in_graph.ensure(size)

    def _ensure_graph(self, needed: int) -> hnswlib.Index:
        if self._graph is None:
            self._graph = hnswlib.Index(space="ip", dim=self.dim)
            self._graph.init_index(max_elements=max(1024, 2 * needed), ef_construction=self._efc, M=self._m)
        elif needed > self._graph.get_max_elements():
            self._graph.resize_index(max(needed, 2 * self._graph.get_max_elements()))
        return self._graph

    def _rows(self, slots: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """The raw vectors of ``slots``, in order (one gather per chunk involved)."""
        chunks = self._chunk_of.view()[slots]
        rows = self._row_of.view()[slots]
        if len(slots) and chunks.min() == chunks.max():
            return self._chunks[int(chunks[0])][rows]
        out = np.empty((len(slots), self.dim), dtype=np.float32)
        for chunk in np.unique(chunks).tolist():
            where = chunks == chunk
            out[where] = self._chunks[chunk][rows[where]]
        return out

    def _unit_rows(self, slots: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        rows = self._rows(slots)
        rows *= self._scale.view()[slots][:, None]
        return rows

    # -- bulk restore (snapshots) ---------------------------------------------------------------------------
    def restore(
        self,
        slots: npt.NDArray[np.int64],
        matrix: npt.NDArray[np.float32],
        graph_file: str | None,
    ) -> bool:
        """Fill an empty index with the rows of ``matrix`` at ``slots`` (the matrix becomes a chunk as it is:
        the records already carry views of its rows). With ``graph_file`` (written by :meth:`save_graph` for the
        same vectors) the graph is loaded, not rebuilt. Returns whether the saved graph was used; one that does
        not match is dropped and rebuilt."""
        if self._tail or self._graph is not None or self._chunks:
            raise ValueError("restore() needs an empty vector index")
        if len(matrix) != len(slots):
            raise ValueError("restore() needs one row per slot")
        size = int(slots.max()) + 1 if len(slots) else 0
        self._grow(size)
        if len(slots):
            self._chunks.append(matrix)  # read-only: new vectors go to a fresh chunk
            self._fill = len(matrix)
            self._chunk_of.view()[slots] = 0
            self._row_of.view()[slots] = np.arange(len(slots), dtype=np.int32)
            scale = self._scale.view()
            for start in range(0, len(slots), _CHUNK):
                part = matrix[start : start + _CHUNK]
                norms = np.sqrt(np.einsum("ij,ij->i", part, part, dtype=np.float64))
                scale[slots[start : start + _CHUNK]] = 1.0 / np.where(norms > 0, norms, 1.0)
            self.has_vec.view()[slots] = True
        used = False
        if graph_file is not None and len(slots):
            try:
                self._load_graph(graph_file, slots)
                used = True
            except GraphMismatch:
                self._graph, self._graph_live = None, 0
                self._in_graph.view()[:] = False
        if not used:
            self._tail.update(slots.tolist())
            self.flush()
        return used

    def save_graph(self, path: str | os.PathLike[str]) -> bool:
        """Flush the tail and write the HNSW graph to ``path`` (hnswlib's own format); False if there is none."""
        self.flush()
        if self._graph is None or self._graph_live == 0:
            return False
        self._graph.save_index(os.fspath(path))
        return True

    def _load_graph(self, path: str, slots: npt.NDArray[np.int64]) -> None:
        graph = hnswlib.Index(space="ip", dim=self.dim)
        try:
            graph.load_index(path, max_elements=max(1024, 2 * (int(slots.max()) + 1)))
        except (RuntimeError, ValueError) as exc:
            raise GraphMismatch(str(exc)) from None
        labels = np.asarray(graph.get_ids_list(), dtype=np.int64)
        # Every restored vector must be a label of the graph, and a few of them must hold the same unit
        # vector: a graph saved for other data would otherwise answer with wrong slots.
        if graph.dim != self.dim or len(labels) < len(slots) or not np.isin(slots, labels).all():
            raise GraphMismatch("the graph's labels do not cover the restored vectors")
        sample = slots[np.linspace(0, len(slots) - 1, num=min(16, len(slots)), dtype=np.int64)]
        try:
            stored = np.asarray(graph.get_items(sample, return_type="numpy"), dtype=np.float32)
        except RuntimeError as exc:  # a label marked deleted in the saved graph
            raise GraphMismatch(str(exc)) from None
        if not np.allclose(stored, self._unit_rows(sample), atol=1e-6):
            raise GraphMismatch("the graph holds different vectors")
        extra = np.setdiff1d(labels, slots, assume_unique=True)
        for slot in extra.tolist():  # labels of vectors removed since the graph was saved
            with contextlib.suppress(RuntimeError):  # already marked deleted in the saved graph
                graph.mark_deleted(slot)
        graph.set_ef(self._efs)
        self._graph = graph
        self._in_graph.view()[slots] = True
        self._graph_live = len(slots)

    # -- reads ----------------------------------------------------------------------------------------------
    def search(self, query: npt.NDArray[np.float32], k: int, mask: Mask) -> list[tuple[int, float]]:
        """Top ``k`` slots by cosine among those where ``mask`` (over all slots) is true."""
        n = self.has_vec.size
        if k <= 0 or n == 0:
            return []
        allowed = mask[:n] & self.has_vec.view()
        passing = int(np.count_nonzero(allowed))
        if passing == 0:
            return []
        if passing <= self._brute_limit or self._graph is None or self._graph_live == 0:
            return self._brute(query, np.flatnonzero(allowed), k)
        tail = np.fromiter(self._tail, dtype=np.int64, count=len(self._tail))
        tail = tail[allowed[tail]] if len(tail) else tail
        found = self._brute(query, tail, k)
        in_graph_passing = passing - len(tail)
        if in_graph_passing > 0:
            found += self._graph_search(query, min(k, in_graph_passing), allowed, in_graph_passing)
        found.sort(key=lambda item: (-item[1], item[0]))
        return found[:k]

    def _brute(self, query: npt.NDArray[np.float32], slots: npt.NDArray[np.int64], k: int) -> list[tuple[int, float]]:
        if len(slots) == 0:
            return []
        scale = self._scale.view()
        best: list[tuple[int, float]] = []
        for part in _chunks(slots):
            # einsum, not `@`: a matrix-vector product through multithreaded OpenBLAS is ~100x slower when another
            # process holds a core (its threads spin); einsum stays single-threaded and predictable.
            scores = np.einsum("ij,j->i", self._rows(part), query) * scale[part]
            best = _merge(best, top_k(part, scores.astype(np.float32), k), k)
        return best

    def _graph_search(
        self, query: npt.NDArray[np.float32], k: int, allowed: Mask, passing: int
    ) -> list[tuple[int, float]]:
        graph = self._graph
        assert graph is not None
        frac = passing / max(1, self._graph_live)
        try:
            if frac >= 0.5:
                # Most slots pass: ask for a few more than k unfiltered and filter here (no Python callback).
                want = min(self._graph_live, math.ceil(k / frac * 1.25) + 8)
                graph.set_ef(max(self._efs, want))
                labels, dists = graph.knn_query(query, k=want, num_threads=1)
                hits = [(int(s), 1.0 - float(d)) for s, d in zip(labels[0], dists[0], strict=True) if allowed[s]]
                if len(hits) >= k:
                    return hits[:k]
            graph.set_ef(max(self._efs, k))
            labels, dists = graph.knn_query(query, k=k, num_threads=1, filter=lambda s: bool(allowed[s]))
            return [(int(s), 1.0 - float(d)) for s, d in zip(labels[0], dists[0], strict=True)]
        except RuntimeError:
            # hnswlib could not find k admitted items (its graph walk can miss some under a filter):
            # fall back to exact search so the answer stays complete.
            in_graph = np.flatnonzero(allowed & self._in_graph.view()[: len(allowed)])
            return self._brute(query, in_graph, k)

    def vector(self, slot: int) -> npt.NDArray[np.float32]:
        view = self._chunks[int(self._chunk_of[slot])][int(self._row_of[slot])]  # type: ignore[call-overload]
        view.flags.writeable = False
        return view

    def memory(self) -> dict[str, int]:
        """Approximate bytes held, by part (vectors counted once, where the records keep them)."""
        live = int(np.count_nonzero(self.has_vec.view()))
        graph = 0
        if self._graph is not None:
            graph = self._graph.element_count * (self.dim * 4 + 8 + (2 * self._m + 1) * 4 + 64)
        rows = sum(len(c) for c in self._chunks)
        return {"vectors": rows * self.dim * 4 + live * 112, "graph": graph, "columns": self.has_vec.size * 18}


def _chunks(slots: npt.NDArray[np.int64]) -> Iterator[npt.NDArray[np.int64]]:
    for start in range(0, len(slots), _CHUNK):
        yield slots[start : start + _CHUNK]


def _merge(a: list[tuple[int, float]], b: list[tuple[int, float]], k: int) -> list[tuple[int, float]]:
    if not a:
        return b
    merged = a + b
    merged.sort(key=lambda item: (-item[1], item[0]))
    return merged[:k]
