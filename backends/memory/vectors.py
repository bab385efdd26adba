"""Cosine search over slots: an hnswlib graph for the bulk, brute force for a fresh tail and small subsets.

Why the tail: one ``add_items`` into a big HNSW graph costs far more than appending a row, so new vectors wait
in a tail (searched exactly) and join the graph in batches. Why brute force for small subsets: a filter that
passes few slots makes HNSW wander; a matrix product over them is exact and faster. Results are therefore always
complete: every live, admitted slot is either in the graph or in the tail.
"""

from __future__ import annotations

import math

import hnswlib
import numpy as np
import numpy.typing as npt

from .arrays import Column, Matrix

Mask = npt.NDArray[np.bool_]


def top_k(slots: npt.NDArray[np.int64], scores: npt.NDArray[np.float32], k: int) -> list[tuple[int, float]]:
    """The ``k`` best (slot, score) pairs, best first; ties broken by slot for determinism."""
    if len(slots) == 0 or k <= 0:
        return []
    if len(slots) > k:
        part = np.argpartition(-scores, k - 1)[:k]
        slots, scores = slots[part], scores[part]
    order = np.lexsort((slots, -scores))
    return [(int(slots[i]), float(scores[i])) for i in order]


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
        self._vecs = Matrix(dim)
        self.has_vec = Column(np.bool_, False)
        self._in_graph = Column(np.bool_, False)
        self._tail: set[int] = set()
        self._graph: hnswlib.Index | None = None
        self._graph_live = 0
        self._m, self._efc, self._efs = m, ef_construction, ef_search
        self._tail_limit, self._brute_limit, self._threads = tail_limit, brute_force_limit, threads

    # -- writes ---------------------------------------------------------------------------------------------
    def set(self, slot: int, vector: npt.NDArray[np.float32]) -> None:
        self._grow(slot + 1)
        if self.has_vec[slot] and np.array_equal(self._vecs.view()[slot], vector):
            return
        self._vecs[slot] = vector
        if self._in_graph[slot]:
            assert self._graph is not None
            self._graph.mark_deleted(slot)
            self._in_graph[slot] = False
            self._graph_live -= 1
        self.has_vec[slot] = True
        self._tail.add(slot)
        if len(self._tail) >= self._tail_limit:
            self.flush()

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
        graph.add_items(self._vecs.rows(slots), slots, num_threads=self._threads)
        in_graph = self._in_graph.view()
        in_graph[slots] = True
        self._graph_live += len(slots)
        self._tail.clear()

    def _grow(self, size: int) -> None:
        if size > self.has_vec.size:
            self._vecs.ensure(size)
            self.has_vec.ensure(size)
            self._in_graph.ensure(size)

    def _ensure_graph(self, needed: int) -> hnswlib.Index:
        if self._graph is None:
            self._graph = hnswlib.Index(space="ip", dim=self.dim)
            self._graph.init_index(max_elements=max(1024, 2 * needed), ef_construction=self._efc, M=self._m)
        elif needed > self._graph.get_max_elements():
            self._graph.resize_index(max(needed, 2 * self._graph.get_max_elements()))
        return self._graph

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
        # einsum, not `@`: a matrix-vector product through multithreaded OpenBLAS is ~100x slower when another
        # process holds a core (its threads spin); einsum stays single-threaded and predictable.
        if len(slots) * 4 >= self._vecs.size:
            scores = np.einsum("ij,j->i", self._vecs.view(), query)[slots]  # contiguous pass beats a gather copy
        else:
            scores = np.einsum("ij,j->i", self._vecs.rows(slots), query)
        return top_k(slots, scores.astype(np.float32), k)

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
        return self._vecs.view()[slot]
