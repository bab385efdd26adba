"""Cosine search over slots: an hnswlib graph for the bulk, brute force for a fresh tail and small subsets.

Why the tail: one ``add_items`` into a big HNSW graph costs far more than appending a row, so new vectors wait
in a tail (searched exactly) and join the graph in batches. Why brute force for small subsets: a filter that
passes few slots makes HNSW wander; a matrix product over them is exact and faster. Every live, admitted slot is
either in the graph or in the tail. A filter that passes many indexed slots, but not most of them (or not the
ones nearest the query: a hot entity's facts of other relations, when its facts of the new fact's relation crowd
the top), goes to the bit sketches of the passing slots (sketches.py), not to hnswlib's filtered walk, which calls
back into Python for every node it passes and found only ~0.7 of the true top 32 there.

Memory: each vector is held once in Python, as a row of a matrix chunk owned by this index; the stored record's
vector is a read-only view of that row (:meth:`VectorIndex.set` returns it), so records and exact scoring share
it. Rows are never overwritten -- a changed vector gets a new row, so a view held by an old record never changes
under it -- and chunks never move. hnswlib keeps its own copy of each unit-length vector, which its graph walk
needs; it cannot hand it back cheaply (``get_items`` costs ~35 us a row), so exact scores are the raw rows times
a stored ``1 / norm``. Rows are kept at the index's :mod:`.precision` (float32, or bfloat16 at half the bytes);
everything here reads them decoded to float32, and a record made from its row gets the decoded values.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import hnswlib
import numpy as np
import numpy.typing as npt

from tkg.cosines import bounded, inverse_norm
from tkg.selection import Mask, top_k

from .arrays import Column
from .precision import FLOAT32, Precision
from .sketches import Sketches

_CHUNK = 8192  # rows scored at a time when an exact fallback scans many slots
_CHUNK_ROWS = 16384  # rows per matrix chunk that new vectors are appended to
_DECODE_ROWS = 256  # rows of a reduced-precision index decoded at a time to be scored
_RESTORE_ROWS = 1 << 17  # rows per step when a restored graph gets its vectors back
# A background fold lets the tail grow to this many times its limit before the writer folds itself.
_BEHIND = 4
# A filtered search whose indexed passing slots are at most this many, and that an unfiltered HNSW query did not
# answer, scans their bit sketches and scores the closest exactly (see sketches.py); more go to hnswlib's
# filtered walk.
_SKETCH_LIMIT = 1 << 17


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
        precision: Precision = FLOAT32,
    ) -> None:
        self.dim = dim
        self.precision = precision  # how rows are kept (see .precision); reads and scores use the decoded values
        self._chunks: list[npt.NDArray[Any]] = []  # matrices of stored rows; never reallocated
        self._fill = 0  # rows used in the last chunk
        self._chunk_of = Column(np.int32, -1)  # slot -> chunk of its row
        self._row_of = Column(np.int32, -1)  # slot -> row in that chunk
        self._scale = Column(np.float32, 1.0)  # slot -> 1 / norm of that vector
        self.has_vec = Column(np.bool_, False)
        self._in_graph = Column(np.bool_, False)
        self._tail: set[int] = set()
        self._sketches = Sketches()
        self._graph: hnswlib.Index | None = None
        self._graph_live = 0
        self._m, self._efc, self._efs = m, ef_construction, ef_search
        self._tail_limit, self._brute_limit, self._threads = tail_limit, brute_force_limit, threads
        # hnswlib may not insert and search at once: every call on the graph holds this lock. A background fold
        # (see Fold) holds it only while inserting one small batch, so a search waits at most that long.
        self._graph_lock = threading.Lock()
        self._folds: list[Fold] = []  # folds begun and not finished; their slots stay in the tail until then
        self._folding: set[int] = set()  # the slots of those folds
        # Set by a store that folds in the background: called when a fold is due instead of folding on the
        # writer's path -- unless the tail has run far ahead (the worker is behind).
        self.on_due: Callable[[], None] | None = None

    # -- writes ---------------------------------------------------------------------------------------------
    def set(self, slot: int, vector: npt.NDArray[np.float32]) -> npt.NDArray[Any]:
        """Index ``vector`` (validated, of this dimension) at ``slot``; returns the read-only view of the stored
        row that now holds it, which the stored record should carry instead of its own copy (decoded by
        ``precision.read`` when read)."""
        self._grow(slot + 1)
        encoded = self.precision.encode(vector)
        if self.has_vec[slot]:
            current = self._stored(slot)
            if current is vector or np.array_equal(current, encoded):
                return current
        view = self._append(encoded)
        self._chunk_of[slot], self._row_of[slot] = len(self._chunks) - 1, self._fill - 1
        self._scale[slot] = inverse_norm(self.precision.decode(view))
        self._sketches.forget(slot)
        self._unlink(slot)
        self.has_vec[slot] = True
        self._tail.add(slot)
        if self.due():
            if self.on_due is not None and len(self._tail) < _BEHIND * self._tail_limit:
                self.on_due()
            else:
                self.flush()
        return view

    def due(self) -> bool:
        """Whether enough new vectors wait outside the graph to fold a batch of them in."""
        return len(self._tail) - len(self._folding) >= self._tail_limit

    def _unlink(self, slot: int) -> None:
        """Mark ``slot``'s vector in the graph deleted (its label is reused when it is inserted again)."""
        if self._in_graph[slot]:
            assert self._graph is not None
            with self._graph_lock:
                self._graph.mark_deleted(slot)
            self._in_graph[slot] = False
            self._graph_live -= 1

    def _append(self, row: npt.NDArray[Any]) -> npt.NDArray[Any]:
        if not self._chunks or self._fill == len(self._chunks[-1]) or not self._chunks[-1].flags.writeable:
            self._chunks.append(np.empty((_CHUNK_ROWS, self.dim), dtype=self.precision.dtype))
            self._fill = 0
        chunk = self._chunks[-1]
        chunk[self._fill] = row
        view = chunk[self._fill]
        view.flags.writeable = False
        self._fill += 1
        return view

    def remove(self, slot: int) -> None:
        if slot >= self.has_vec.size or not self.has_vec[slot]:
            return
        self.has_vec[slot] = False
        self._sketches.forget(slot)
        self._tail.discard(slot)
        self._unlink(slot)

    def flush(self) -> None:
        """Move the whole tail into the HNSW graph now (folds begun in the background are completed here)."""
        for fold in [*self._folds, self.begin_fold()]:
            if fold is not None:
                self.insert(fold)
                self.finish_fold(fold)

    def begin_fold(self, limit: int | None = None) -> Fold | None:
        """Hand the tail's vectors (up to ``limit``) to a fold (the store's lock held): their unit rows are copied now;
        :meth:`insert` puts them in the graph without the store's lock; :meth:`finish_fold` moves them out of
        the tail. Until then they are searched exactly, as tail."""
        ready = sorted(self._tail - self._folding)[: None if limit is None else max(0, limit)]
        if not ready:
            return None
        slots = np.asarray(ready, dtype=np.int64)
        chunks, rows_at = self._chunk_of.view()[slots].copy(), self._row_of.view()[slots].copy()
        fold = Fold(self, slots, self._unit_rows(slots), chunks, rows_at)
        self._folds.append(fold)
        self._folding.update(ready)
        return fold

    def insert(self, fold: Fold) -> None:
        """Insert a fold's vectors into the graph (once, whoever comes first: the worker or a flush)."""
        with self._graph_lock:
            if fold.done:
                return
            graph = self._ensure_graph(int(fold.slots.max()) + 1)
            # Re-adding a label hnswlib marked deleted updates it in place and unmarks it.
            graph.add_items(fold.rows, fold.slots, num_threads=self._threads)
            fold.done = True

    def finish_fold(self, fold: Fold) -> None:
        """Move an inserted fold's slots from the tail to the graph; a slot whose vector changed or went away
        since the fold began has an old vector in the graph, which is marked deleted (its new one, if any, is
        still in the tail)."""
        if fold not in self._folds or not fold.done:
            return
        self._folds.remove(fold)
        self._folding.difference_update(fold.slots.tolist())
        has_vec = self.has_vec.view()
        same = has_vec[fold.slots] & (self._chunk_of.view()[fold.slots] == fold.chunks)
        same &= self._row_of.view()[fold.slots] == fold.rows_at
        current = fold.slots[same]
        self._in_graph.view()[current] = True
        self._graph_live += len(current)
        self._tail.difference_update(current.tolist())
        stale = fold.slots[~same].tolist()
        if stale:
            assert self._graph is not None
            with self._graph_lock:
                for slot in stale:
                    self._graph.mark_deleted(slot)

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
        decode = self.precision.decode
        return self._by_chunk(slots, lambda matrix, rows: decode(matrix[rows]), (self.dim,))

    def _dots(self, slots: npt.NDArray[np.int64], query: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """The raw vectors of ``slots`` times ``query``, in order (one product per chunk involved)."""
        if not self.precision.exact:
            # Decoded a block of rows at a time, which stays in cache from decoding to the product (~20% faster
            # than decoding all first); gathered, not read over a span (decoding costs more than gathering).
            out = np.empty(len(slots), dtype=np.float32)
            for start in range(0, len(slots), _DECODE_ROWS):
                out[start : start + _DECODE_ROWS] = np.einsum(
                    "ij,j->i", self._rows(slots[start : start + _DECODE_ROWS]), query
                )
            return out
        return self._by_chunk(slots, lambda matrix, rows: _span_dots(matrix, rows, query), ())

    def _by_chunk(
        self,
        slots: npt.NDArray[np.int64],
        read: Callable[[npt.NDArray[Any], npt.NDArray[np.int32]], npt.NDArray[np.float32]],
        shape: tuple[int, ...],
    ) -> npt.NDArray[np.float32]:
        """``read(chunk matrix, rows)`` for the rows of ``slots`` in each chunk, put together in slot order."""
        chunks = self._chunk_of.view()[slots]
        rows = self._row_of.view()[slots]
        if len(slots) and chunks.min() == chunks.max():
            return read(self._chunks[int(chunks[0])], rows)
        out = np.empty((len(slots), *shape), dtype=np.float32)
        for chunk in np.unique(chunks).tolist():
            where = chunks == chunk
            out[where] = read(self._chunks[chunk], rows[where])
        return out

    def _unit_rows(self, slots: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        rows = self._rows(slots)
        rows *= self._scale.view()[slots][:, None]
        return rows

    # -- bulk restore (snapshots) ---------------------------------------------------------------------------
    def rows(self, slots: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """The vectors of ``slots`` (which must have one), in order, as float32: a read-only view when they are
        consecutive rows of one float32 chunk (as after a bulk load or a restore), else one gather (and decode) per
        matrix chunk."""
        if len(slots) and self.precision.exact:
            chunks = self._chunk_of.view()[slots]
            rows = self._row_of.view()[slots]
            first, last = int(rows[0]), int(rows[-1])
            if chunks.min() == chunks.max() and last - first == len(slots) - 1 and (np.diff(rows) == 1).all():
                view = self._chunks[int(chunks[0])][first : last + 1]
                view.flags.writeable = False
                return view
        return self._rows(slots)

    def scales(self, slots: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        """The stored ``1 / norm`` of ``slots`` (saved with a snapshot so that a load scores bit-identically)."""
        return self._scale.view()[slots].astype(np.float32)

    def restore(
        self,
        slots: npt.NDArray[np.int64],
        matrix: npt.NDArray[Any],
        graph: str | dict[str, Any] | None,
        scales: npt.NDArray[np.float32] | None = None,
    ) -> bool:
        """Fill an empty index with the rows of ``matrix`` at ``slots``, kept as this index keeps them
        (``precision.encode``d: the matrix becomes a chunk as it is, and the records already carry views of its
        rows). ``graph`` is a saved HNSW graph for the same vectors --
        an hnswlib index file (:meth:`save_graph`) or an :meth:`export_graph` state -- which is loaded, not
        rebuilt; ``scales`` are the saved ``1 / norm`` of the rows (recomputed when absent). Returns whether the
        saved graph was used; one that does not match is dropped and rebuilt."""
        if self._tail or self._graph is not None or self._chunks:
            raise ValueError("restore() needs an empty vector index")
        if len(matrix) != len(slots) or (scales is not None and len(scales) != len(slots)):
            raise ValueError("restore() needs one row (and scale) per slot")
        size = int(slots.max()) + 1 if len(slots) else 0
        self._grow(size)
        if len(slots):
            self._chunks.append(matrix)  # read-only: new vectors go to a fresh chunk
            self._fill = len(matrix)
            self._chunk_of.view()[slots] = 0
            self._row_of.view()[slots] = np.arange(len(slots), dtype=np.int32)
            scale = self._scale.view()
            decode = self.precision.decode
            if scales is not None and _plausible_scales(matrix, scales, decode):
                scale[slots] = scales
            else:
                for start in range(0, len(slots), _CHUNK):
                    part = decode(matrix[start : start + _CHUNK])
                    norms = np.sqrt(np.einsum("ij,ij->i", part, part, dtype=np.float64))
                    scale[slots[start : start + _CHUNK]] = 1.0 / np.where(norms > 0, norms, 1.0)
            self.has_vec.view()[slots] = True
        used = False
        if graph is not None and len(slots):
            try:
                if isinstance(graph, dict):
                    self._graph, extra = self._graph_from_state(graph, slots, matrix)
                    self._adopt_graph(slots, extra)
                else:
                    self._graph = self._graph_from_file(graph, slots)
                    self._adopt_graph(slots)
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

    def export_graph(self) -> dict[str, Any] | None:
        """Flush the tail and return the HNSW graph as arrays (None if there is none), without the copy of each
        live vector that hnswlib keeps: a restore recomputes it, bit for bit, as the saved row times the saved
        ``1 / norm`` -- exactly what :meth:`flush` handed to hnswlib. The vectors of elements where that does not
        hold (labels removed since, marked deleted but still walked through) are kept in ``kept_vectors``."""
        self.flush()
        graph = self._graph
        if graph is None or self._graph_live == 0:
            return None
        state = graph.__getstate__()[0]  # hnswlib's pickle state: a dict of parameters and array copies
        count = int(state["cur_element_count"])
        width = int(state["size_data_per_element"])
        at, end = int(state["offset_data"]), int(state["offset_data"]) + 4 * self.dim
        level0 = np.asarray(state.pop("data_level0")).view(np.uint8).reshape(count, width)
        stored = level0[:, at:end].view(np.float32)  # (count, dim), strided
        # Copies go through 4-byte views: numpy copies strided uint8 slices a byte at a time (~100x slower).
        # hnswlib's layout is all 4-byte words (links, float32 data, 8-byte label).
        words, label_word = level0.view(np.uint32), int(state["label_offset"]) // 4
        labels = words[:, label_word : label_word + 2].copy().view("<u8")[:, 0]
        live = np.zeros(count, dtype=np.bool_)
        in_range = labels < self._in_graph.size
        candidates = np.flatnonzero(in_range)
        live[candidates] = self._in_graph.view()[labels[candidates].astype(np.int64)]
        live_ids = np.flatnonzero(live)
        same = np.zeros(count, dtype=np.bool_)
        for part in _chunks(live_ids):
            owners = labels[part].astype(np.int64)
            expected = self.rows(owners) * self._scale.view()[owners][:, None]  # what flush() computed
            same[part] = (expected.view(np.uint32) == stored[part].view(np.uint32)).all(axis=1)
        kept = np.flatnonzero(~same)
        stripped = np.concatenate([words[:, : at // 4], words[:, end // 4 :]], axis=1).view(np.uint8)
        del level0
        levels = np.asarray(state.pop("element_levels"), dtype="<i4")[:count]
        arrays = {
            "level0": stripped,
            "levels": levels,
            "links": np.asarray(state.pop("link_lists")).view(np.uint8),
            "kept": kept.astype("<i8"),
            "kept_vectors": np.ascontiguousarray(stored[kept]),
        }
        params = {k: v for k, v in state.items() if isinstance(v, (bool, int, float, str))}
        # hnswlib's label table is each element's own label (which the element block holds): not stored.
        return {"params": params, **arrays}

    def _graph_from_file(self, path: str, slots: npt.NDArray[np.int64]) -> hnswlib.Index:
        graph = hnswlib.Index(space="ip", dim=self.dim)
        try:
            graph.load_index(path, max_elements=max(1024, 2 * (int(slots.max()) + 1)))
        except (RuntimeError, ValueError) as exc:
            raise GraphMismatch(str(exc)) from None
        return graph

    def _graph_from_state(
        self, state: dict[str, Any], slots: npt.NDArray[np.int64], matrix: npt.NDArray[Any]
    ) -> tuple[hnswlib.Index, npt.NDArray[np.int64]]:
        """Rebuild an hnswlib index from an :meth:`export_graph` state, putting back the live vectors; returns
        it and the labels it holds beyond ``slots``. Every size and id that hnswlib would trust is checked
        first: a bad one raises :class:`GraphMismatch`."""
        try:
            params = dict(state["params"])
            count, width = int(params["cur_element_count"]), int(params["size_data_per_element"])
            at, label_at = int(params["offset_data"]), int(params["label_offset"])
            per_link, max_m0 = int(params["size_links_per_element"]), int(params["max_M0"])
            level0 = np.asarray(state["level0"], dtype=np.uint8)
            levels = np.asarray(state["levels"], dtype=np.int32)
            links = np.asarray(state["links"], dtype=np.uint8)
            kept = np.asarray(state["kept"], dtype=np.int64)
            kept_vectors = np.asarray(state["kept_vectors"], dtype=np.float32).reshape(len(kept), self.dim)
            if params["space"] != "ip" or int(params["dim"]) != self.dim or count < 1:
                raise GraphMismatch("the graph is of another space or dimension")
            end = at + 4 * self.dim
            if label_at != end or width != end + 8 or at != 4 + 4 * max_m0 or per_link != 4 + 4 * int(params["max_M"]):
                raise GraphMismatch("the graph's element layout is not hnswlib's")
            if level0.size != count * (width - 4 * self.dim) or len(levels) != count:
                raise GraphMismatch("the graph's arrays have the wrong sizes")
            if levels.min() < 0:
                raise GraphMismatch("the graph has negative levels")
            if int(params["max_level"]) != int(levels.max()) or not 0 <= int(params["enterpoint_node"]) < count:
                raise GraphMismatch("the graph's entry point is out of range")
            if links.size != per_link * int(levels.sum()):
                raise GraphMismatch("the graph's upper layers have the wrong size")
            if len(kept) and (int(kept.min()) < 0 or int(kept.max()) >= count):
                raise GraphMismatch("kept vectors of elements the graph does not have")
        except (KeyError, TypeError, ValueError) as exc:
            raise GraphMismatch(f"incomplete graph state: {exc}") from None
        level0 = level0.reshape(count, width - 4 * self.dim)
        words = level0.view(np.uint32)  # 4-byte views: strided uint8 copies are a byte at a time (~100x slower)
        labels = words[:, at // 4 : at // 4 + 2].copy().view("<u8")[:, 0]
        _check_neighbours(words[:, : at // 4], max_m0, count)
        if len(links):
            _check_neighbours(links.reshape(-1, per_link).view(np.uint32), int(params["max_M"]), count)
        # Every restored vector must be an element; the others must have kept their vectors.
        ascending = count < 2 or bool((labels[1:] > labels[:-1]).all())  # usual: added in slot order
        order = np.arange(count) if ascending else np.argsort(labels, kind="stable")
        if (np.diff(labels[order]) == 0).any():
            raise GraphMismatch("two elements of the graph have the same label")
        found = np.searchsorted(labels, slots, sorter=order)
        if len(labels) < len(slots) or (found >= count).any():
            raise GraphMismatch("the graph's labels do not cover the restored vectors")
        internal = order[found]
        if not np.array_equal(labels[internal], slots.astype(np.uint64)):
            raise GraphMismatch("the graph's labels do not cover the restored vectors")
        filled = np.zeros(count, dtype=np.bool_)
        filled[internal] = True
        extra = labels[~filled].astype(np.int64)  # elements of removed vectors (their vectors were kept)
        filled[kept] = True
        if not filled.all():
            raise GraphMismatch("the graph lacks the vectors of some elements")
        data = np.empty((count, width), dtype=np.uint8)
        data_words = data.view(np.uint32)
        data_words[:, : at // 4] = words[:, : at // 4]
        data_words[:, end // 4 :] = words[:, at // 4 :]
        vectors = data[:, at:end].view(np.float32)
        in_order = bool((internal == np.arange(len(internal))).all())  # the usual case: no scatter needed
        # Few, big numpy calls: a restore runs on a helper thread beside Python-heavy work, and each call here
        # waits for the GIL.
        scales, decode = self._scale.view()[slots][:, None], self.precision.decode
        step = _RESTORE_ROWS if self.precision.exact else _CHUNK  # decoded rows: a smaller temporary per step
        for start in range(0, len(slots), step):
            stop = min(start + step, len(slots))
            if in_order:  # bit for bit what flush() gave hnswlib
                np.multiply(decode(matrix[start:stop]), scales[start:stop], out=vectors[start:stop])
            else:
                vectors[internal[start:stop]] = decode(matrix[start:stop]) * scales[start:stop]
        vectors[kept] = kept_vectors
        max_elements = max(1024, count, 2 * (int(slots.max()) + 1))
        padded = np.zeros(max_elements, dtype=np.int32)
        padded[:count] = levels
        full = {
            **params,
            "max_elements": max_elements,
            "data_level0": data.reshape(-1).view(np.int8),
            "element_levels": padded,
            "link_lists": links.view(np.int8),
            "label_lookup_external": labels,
            "label_lookup_internal": np.arange(count, dtype=np.uint32),
        }
        graph = hnswlib.Index.__new__(hnswlib.Index)
        try:
            graph.__setstate__((full,))
        except (RuntimeError, ValueError, TypeError, KeyError) as exc:
            raise GraphMismatch(str(exc)) from None
        return graph, extra

    def _adopt_graph(self, slots: npt.NDArray[np.int64], extra: npt.NDArray[np.int64] | None = None) -> None:
        """Take ``self._graph`` (just loaded) as the graph of ``slots``, after checking that it holds them;
        ``extra`` are its other labels when the caller has already checked that (else they are worked out)."""
        graph = self._graph
        assert graph is not None
        if graph.dim != self.dim:
            raise GraphMismatch("the graph has another dimension")
        if extra is None:
            labels = np.asarray(graph.get_ids_list(), dtype=np.int64)
            # Every restored vector must be a label of the graph, and a few of them must hold the same unit
            # vector: a graph saved for other data would otherwise answer with wrong slots.
            if len(labels) < len(slots) or not np.isin(slots, labels).all():
                raise GraphMismatch("the graph's labels do not cover the restored vectors")
            extra = np.setdiff1d(labels, slots, assume_unique=True)
        sample = slots[np.linspace(0, len(slots) - 1, num=min(16, len(slots)), dtype=np.int64)]
        try:
            stored = np.asarray(graph.get_items(sample, return_type="numpy"), dtype=np.float32)
        except RuntimeError as exc:  # a label marked deleted in the saved graph
            raise GraphMismatch(str(exc)) from None
        if not np.allclose(stored, self._unit_rows(sample), atol=1e-6):
            raise GraphMismatch("the graph holds different vectors")
        for slot in extra.tolist():  # labels of vectors removed since the graph was saved
            with contextlib.suppress(RuntimeError):  # already marked deleted in the saved graph
                graph.mark_deleted(slot)
        graph.set_ef(self._efs)
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
            walked = self._graph_search(query, min(k, in_graph_passing), allowed, in_graph_passing)
            # scored again exactly, as every store scores (tkg.cosines): the graph's own distances are another sum
            found += self._brute(query, np.array(sorted(s for s, _ in walked), dtype=np.int64), k)
        found.sort(key=lambda item: (-item[1], item[0]))
        return found[:k]

    def closest(self, query: npt.NDArray[np.float32], k: int, slots: npt.NDArray[np.int64]) -> list[tuple[int, float]]:
        """Top ``k`` of ``slots`` (ascending) by cosine, by the rule every backend finds the closest facts around
        entities with (:mod:`tkg.vector_sketches`): of those with a vector, the ``candidate_count`` closest by
        sketch (equal distances in slot order; all of them up to ``EXACT_UP_TO``) are scored exactly. Not the HNSW
        graph: a neighbourhood's facts are a small share of it, or crowded out of its walk by the facts the filter
        refuses (the other relations of a busy entity)."""
        if k <= 0 or len(slots) == 0:
            return []
        has = self.has_vec.view()
        if slots[-1] >= has.size:
            slots = slots[slots < has.size]
        return self._by_sketch(query, slots[has[slots]], k)

    def _by_sketch(
        self, query: npt.NDArray[np.float32], slots: npt.NDArray[np.int64], k: int
    ) -> list[tuple[int, float]]:
        """Top ``k`` of ``slots`` (ascending, all with a vector): the closest by sketch, scored exactly."""
        candidates = self._sketches.candidates(query, slots, k, self._rows, self.has_vec.size)
        return self._brute(query, candidates, k)

    def _brute(self, query: npt.NDArray[np.float32], slots: npt.NDArray[np.int64], k: int) -> list[tuple[int, float]]:
        if len(slots) == 0:
            return []
        scale = self._scale.view()
        best: list[tuple[int, float]] = []
        for part in _chunks(slots):
            # as tkg.cosines.cosines, whichever rows of a chunk are read (a row's product is the same either way)
            scores = bounded(self._dots(part, query) * scale[part])
            best = _merge(best, top_k(part, scores, k), k)
        return best

    def _graph_search(
        self, query: npt.NDArray[np.float32], k: int, allowed: Mask, passing: int
    ) -> list[tuple[int, float]]:
        """Top ``k`` among the slots in the graph that ``allowed`` passes (``passing`` of them)."""
        # A fold may have inserted slots that are still searched as tail: the graph answers for its own only.
        indexed = allowed & self._in_graph.view()[: len(allowed)]
        frac = passing / max(1, self._graph_live)
        if frac >= 0.5:
            # Most slots pass: ask for a few more than k unfiltered and filter here (no Python callback).
            want = min(self._graph_live, math.ceil(k / frac * 1.25) + 8)
            try:
                with self._graph_lock:
                    graph = self._ready_graph(want)
                    labels, dists = graph.knn_query(query, k=want, num_threads=1)
            except RuntimeError:  # hnswlib found fewer than `want` live items: answered below
                labels, dists = np.empty((1, 0), np.uint64), np.empty((1, 0), np.float32)
            hits = [(int(s), 1.0 - float(d)) for s, d in zip(labels[0], dists[0], strict=True) if indexed[s]]
            if len(hits) >= k:
                return hits[:k]
        if passing <= _SKETCH_LIMIT:
            slots = np.flatnonzero(indexed)
            return self._by_sketch(query, slots, k)
        try:
            with self._graph_lock:
                graph = self._ready_graph(k)
                labels, dists = graph.knn_query(query, k=k, num_threads=1, filter=lambda s: bool(indexed[s]))
            return [(int(s), 1.0 - float(d)) for s, d in zip(labels[0], dists[0], strict=True)]
        except RuntimeError:
            # hnswlib could not find k admitted items (its graph walk can miss some under a filter):
            # fall back to exact search so the answer stays complete.
            return self._brute(query, np.flatnonzero(indexed), k)

    def _ready_graph(self, ef: int) -> hnswlib.Index:
        """The graph, set to search with at least ``ef`` candidates (the graph's lock held)."""
        assert self._graph is not None
        self._graph.set_ef(max(self._efs, ef))
        return self._graph

    def _stored(self, slot: int) -> npt.NDArray[Any]:
        """``slot``'s stored row (read-only view)."""
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
        columns = self.has_vec.size * 18 + self._sketches.nbytes()
        row_bytes = self.dim * self.precision.dtype.itemsize
        return {"vectors": rows * row_bytes + live * 112, "graph": graph, "columns": columns}


class Fold:
    """Tail vectors on their way into the HNSW graph (see :meth:`VectorIndex.begin_fold`): their slots, unit
    rows, and where their rows were when the fold began (a slot set again or removed since is not moved)."""

    __slots__ = ("chunks", "done", "index", "rows", "rows_at", "slots")

    def __init__(
        self,
        index: VectorIndex,
        slots: npt.NDArray[np.int64],
        rows: npt.NDArray[np.float32],
        chunks: npt.NDArray[np.int32],
        rows_at: npt.NDArray[np.int32],
    ) -> None:
        self.index, self.slots, self.rows, self.chunks, self.rows_at = index, slots, rows, chunks, rows_at
        self.done = False  # inserted into the graph

    def run(self) -> None:
        self.index.insert(self)

    def finish(self) -> None:
        self.index.finish_fold(self)


def _span_dots(
    matrix: npt.NDArray[np.float32], rows: npt.NDArray[np.int32], query: npt.NDArray[np.float32]
) -> npt.NDArray[np.float32]:
    """``matrix[rows] @ query``. When the rows fill at least half of the span they take, the product runs over the
    span in place and is read at them (no gather: ~2x cheaper; each row's sum is computed alike, so the values
    are equal either way)."""
    low, high = int(rows.min()), int(rows.max()) + 1
    if 2 * len(rows) >= high - low:
        return np.einsum("ij,j->i", matrix[low:high], query)[rows - low]  # type: ignore[no-any-return]
    return np.einsum("ij,j->i", matrix[rows], query)  # type: ignore[no-any-return]


def _chunks(slots: npt.NDArray[np.int64]) -> Iterator[npt.NDArray[np.int64]]:
    for start in range(0, len(slots), _CHUNK):
        yield slots[start : start + _CHUNK]


def _plausible_scales(
    matrix: npt.NDArray[Any], scales: npt.NDArray[np.float32], decode: Callable[[npt.NDArray[Any]], npt.NDArray[Any]]
) -> bool:
    """Whether saved ``1 / norm`` values fit a sample of the rows (``decode``d; else they are recomputed, never
    used)."""
    sample = np.linspace(0, len(matrix) - 1, num=min(16, len(matrix)), dtype=np.int64)
    rows = decode(matrix[sample]).astype(np.float64)
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
    expected = 1.0 / np.where(norms > 0, norms, 1.0)
    return bool(np.allclose(scales[sample], expected, rtol=1e-5, atol=0.0))


def _check_neighbours(lists: npt.NDArray[np.uint32], max_m: int, count: int) -> None:
    """Raise :class:`GraphMismatch` unless every link list (``u32 header | max_m u32 ids``, one per row) names
    at most ``max_m`` neighbours, all existing elements: hnswlib follows them without checking."""
    lists = np.ascontiguousarray(lists[:, : max_m + 1])
    sizes = lists[:, 0] & 0xFFFF
    if len(sizes) and int(sizes.max()) > max_m:
        raise GraphMismatch("a link list is longer than the graph allows")
    used = np.arange(max_m)[None, :] < sizes[:, None]
    if used.any() and int(lists[:, 1:][used].max()) >= count:
        raise GraphMismatch("a link points to an element the graph does not have")


def _merge(a: list[tuple[int, float]], b: list[tuple[int, float]], k: int) -> list[tuple[int, float]]:
    if not a:
        return b
    merged = a + b
    merged.sort(key=lambda item: (-item[1], item[0]))
    return merged[:k]
