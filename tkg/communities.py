"""Community detection, pure: label propagation that always terminates, the plurality rule, partition distance.

No store, no LLM, no clock: arrays and ids in, arrays and ids out. :mod:`tkg.community_tier` turns a store's
entity graph into a :class:`WeightedGraph` and the result into records.

Why this label propagation terminates (Graphiti's loops forever on symmetric and bipartite graphs, because it
updates every vertex at once and a pair of vertices can swap labels for ever):

* **Retention.** After a bounded exploration phase (below), a vertex changes its label only when another label
  has *strictly* more weight among its neighbours than its current one. With integer weights each change raises
  the total weight of edges whose two ends share a label (a potential bounded by the total edge weight ``W``) by
  at least 1, so there are at most ``W`` changes in all, whatever the order (the update is a move in a potential
  game): ``explore_sweeps + W + 1`` sweeps always reach a fixed point.
* **Semi-synchronous updates** (Cordasco & Gargano, 2010). Vertices are split into colour classes of a proper
  vertex colouring (igraph's greedy colouring), so no two vertices of a class are adjacent. A whole class is
  updated at once with numpy; that is the same as updating its vertices one after another, so the argument above
  holds, and no pair can oscillate.
* **A bound anyway.** At most ``max_iterations`` sweeps run; the result says whether a fixed point was reached.
  Under retention only vertices whose neighbourhood changed are looked at again.

The first ``explore_sweeps`` sweeps break ties by a seeded random draw, even against a vertex's current label
(the rule of Raghavan, Albert & Kumara, 2007): labels spread through ties, which finds larger communities that
depend less on the seed. Retention alone stops at the first tie and fragments planted communities (on the
benchmark graph NMI 0.90 against the planted blocks and 0.09 between two seeds; with 10 exploration sweeps 0.96
and 0.04, on a par with igraph's own label propagation, which has no iteration bound).

At a fixed point every vertex with neighbours carries a label of maximum total edge weight among its
neighbours' labels, so it shares its community with at least one neighbour; a vertex with no neighbours keeps its
own label (a singleton).

Determinism: vertices are ordered by their key (an entity id), parallel edges are summed and self-loops dropped,
so the same graph gives the same arrays whatever order it was built in. Ties between labels of equal weight go to
a seeded random priority (never to "the larger id"), and the order in which colour classes are visited each sweep
is drawn from the same seed. Same graph and seed, same result.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from tkg.errors import ValidationError

IntArray = npt.NDArray[np.int64]
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True, eq=False)
class WeightedGraph:
    """An undirected graph with positive integer edge weights, over vertices named by sorted string keys.

    Stored as CSR: the neighbours of vertex ``v`` are ``indices[indptr[v]:indptr[v + 1]]`` (ascending) with
    ``weights`` alongside; each undirected edge appears once from each end. Build with :meth:`from_edges`.

    >>> g = WeightedGraph.from_edges(["b", "a", "c"], [("a", "b"), ("b", "a"), ("c", "c")])
    >>> g.keys, g.neighbours(0), g.weights_of(0)
    (('a', 'b', 'c'), [1], [2])
    """

    keys: tuple[str, ...]
    indptr: IntArray
    indices: IntArray
    weights: IntArray

    @classmethod
    def from_edges(
        cls,
        keys: Iterable[str],
        edges: Iterable[tuple[str, str]],
        weights: Iterable[int] | None = None,
    ) -> WeightedGraph:
        """Vertices ``keys`` (duplicates collapse) and edges between them, each of weight 1 unless ``weights``
        says otherwise; parallel edges add up, self-loops are dropped (they say nothing about which community a
        vertex belongs to) and zero weights are ignored. An edge naming an unknown key is an error."""
        ordered = tuple(sorted(set(keys)))
        index = {key: i for i, key in enumerate(ordered)}
        pairs = list(edges)
        try:
            src = np.fromiter((index[a] for a, _ in pairs), dtype=np.int64, count=len(pairs))
            dst = np.fromiter((index[b] for _, b in pairs), dtype=np.int64, count=len(pairs))
        except KeyError as exc:
            raise ValidationError(f"edge end {exc.args[0]!r} is not one of the graph's vertices") from None
        if weights is None:
            w = np.ones(len(pairs), dtype=np.int64)
        else:
            w = np.fromiter(weights, dtype=np.int64)
            if w.shape != src.shape:
                raise ValidationError(f"{len(w)} weights for {len(pairs)} edges")
            if (w < 0).any():
                raise ValidationError("edge weights must be non-negative integers")
        return cls.from_arrays(ordered, src, dst, w)

    @classmethod
    def from_arrays(cls, keys: Sequence[str], src: IntArray, dst: IntArray, weights: IntArray) -> WeightedGraph:
        """Like :meth:`from_edges` with vertex indices into ``keys``, which must be unique; their order is the
        vertex order (what the seeded visiting order and tie-breaking are drawn over)."""
        n = len(keys)
        keep = (src != dst) & (weights > 0)
        lo = np.minimum(src, dst)[keep]
        hi = np.maximum(src, dst)[keep]
        code, inverse = np.unique(lo * n + hi, return_inverse=True)
        total = np.bincount(inverse, weights=weights[keep]).astype(np.int64) if code.size else code
        a, b = code // max(n, 1), code % max(n, 1)
        both_src = np.concatenate([a, b])
        both_dst = np.concatenate([b, a])
        both_w = np.concatenate([total, total])
        order = np.lexsort((both_dst, both_src))
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(both_src, minlength=n), out=indptr[1:])
        return cls(
            keys=tuple(keys),
            indptr=indptr,
            indices=both_dst[order].astype(np.int64),
            weights=both_w[order].astype(np.int64),
        )

    @property
    def n(self) -> int:
        return len(self.keys)

    @property
    def edge_count(self) -> int:
        """Distinct undirected edges (parallel edges summed into one)."""
        return len(self.indices) // 2

    @property
    def total_weight(self) -> int:
        return int(self.weights.sum()) // 2

    def degree(self) -> IntArray:
        return np.diff(self.indptr)

    def neighbours(self, v: int) -> list[int]:
        return [int(x) for x in self.indices[self.indptr[v] : self.indptr[v + 1]]]

    def weights_of(self, v: int) -> list[int]:
        return [int(x) for x in self.weights[self.indptr[v] : self.indptr[v + 1]]]

    def label_weights(self, v: int, labels: Sequence[int] | IntArray) -> dict[int, int]:
        """Total edge weight from ``v`` to its neighbours, per neighbour label."""
        out: dict[int, int] = {}
        for u, w in zip(self.neighbours(v), self.weights_of(v), strict=True):
            label = int(labels[u])
            out[label] = out.get(label, 0) + w
        return out


@dataclass(frozen=True, slots=True, eq=False)
class Propagation:
    """The outcome of :func:`label_propagation`: one label per vertex (a vertex index that names the community),
    the sweeps run, and whether a fixed point was reached within the bound."""

    labels: IntArray
    iterations: int
    converged: bool

    def communities(self) -> list[IntArray]:
        """The vertex indices of each community (ascending), communities ordered by their smallest vertex."""
        return partition_groups(self.labels)


def partition_groups(labels: IntArray) -> list[IntArray]:
    """Group vertex indices by label: ascending within a group, groups ordered by their smallest vertex."""
    if labels.size == 0:
        return []
    order = np.argsort(labels, kind="stable")
    bounds = np.flatnonzero(np.diff(labels[order])) + 1
    groups = np.split(order, bounds)
    return sorted(groups, key=lambda g: int(g[0]))


def label_propagation(
    graph: WeightedGraph,
    *,
    seed: int = 0,
    max_iterations: int = 100,
    explore_sweeps: int = 10,
    initial: Sequence[int] | IntArray | None = None,
) -> Propagation:
    """Weighted label propagation, semi-synchronous over colour classes, ending with retention; see the module
    notes.

    Every vertex starts with its own label. A sweep visits the colour classes in a seeded order; within a class
    each (still active) vertex takes a label of maximum total weight among its neighbours' labels. During the
    first ``explore_sweeps`` sweeps a tie is broken by a seeded random draw, redrawn each sweep, even against
    the vertex's current label (Raghavan et al.'s rule: labels spread through ties, which finds larger, more
    stable communities); after that a vertex keeps its label whenever it is among the maxima (retention), and
    the run stops at the first sweep that changes nothing, a fixed point. At most ``max_iterations`` sweeps run
    in all; ``explore_sweeps + W + 1`` always suffice (``W`` the total edge weight).

    ``initial`` (one integer per vertex; equal values share a community) starts from a known partition instead
    of singletons -- a warm start that re-converges where the graph changed and leaves the rest alone (pass
    ``explore_sweeps=0`` to keep it close). Vertices with no neighbours start alone whatever it says.

    >>> g = WeightedGraph.from_edges("abcd", [("a", "b"), ("a", "b"), ("c", "d"), ("c", "d"), ("b", "c")])
    >>> result = label_propagation(g, seed=1)
    >>> [list(map(int, c)) for c in result.communities()], result.converged
    ([[0, 1], [2, 3]], True)
    """
    if max_iterations < 1:
        raise ValidationError("max_iterations must be at least 1")
    if explore_sweeps < 0:
        raise ValidationError("explore_sweeps must be >= 0")
    n = graph.n
    degree = graph.degree()
    labels = np.arange(n, dtype=np.int64) if initial is None else _canonical_labels(initial, degree > 0)
    if n == 0:
        return Propagation(labels, 0, True)
    rng = np.random.default_rng(seed)
    src_all = np.repeat(np.arange(n, dtype=np.int64), degree)
    classes = _colour_classes(graph, src_all)
    current_weight = np.zeros(n, dtype=np.int64)
    has_neighbours = degree > 0
    active = has_neighbours
    priority = rng.permutation(n).astype(np.int64)
    iterations = 0
    while active.any():
        if iterations == max_iterations:
            return Propagation(labels, iterations, False)
        iterations += 1
        exploring = iterations <= explore_sweeps
        if exploring:
            priority = rng.permutation(n).astype(np.int64)
            active = has_neighbours
        next_active = np.zeros(n, dtype=bool)
        changed_any = False
        for c in rng.permutation(len(classes)):
            positions = classes[c]
            positions = positions[active[src_all[positions]]]
            if positions.size == 0:
                continue
            changed, new = _update_class(
                graph, src_all, positions, labels, priority, current_weight, retain=not exploring
            )
            if changed.size == 0:
                continue
            changed_any = True
            labels[changed] = new
            # Only neighbours outside the new community can stop being dominant (those inside gained weight).
            starts, stops = graph.indptr[changed], graph.indptr[changed + 1]
            touched = graph.indices[_ranges(starts, stops)]
            owner_label = np.repeat(new, stops - starts)
            next_active[touched[labels[touched] != owner_label]] = True
        if not changed_any:  # every vertex already holds a label of maximum weight: a fixed point
            break
        # Leaving exploration, every vertex is looked at again under retention.
        active = has_neighbours if iterations == explore_sweeps else next_active
    return Propagation(labels, iterations, True)


def _canonical_labels(initial: Sequence[int] | IntArray, has_neighbours: npt.NDArray[np.bool_]) -> IntArray:
    """Each group of equal values renamed to its smallest vertex index; vertices without neighbours alone."""
    values = np.asarray(initial, dtype=np.int64)
    if values.shape != has_neighbours.shape:
        raise ValidationError(f"initial has {values.size} labels for {has_neighbours.size} vertices")
    own = np.arange(values.size, dtype=np.int64)
    if values.size == 0:
        return own
    values = values.copy()
    alone = ~has_neighbours
    values[alone] = values.max() + 1 + np.arange(int(alone.sum()), dtype=np.int64)
    _, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    return own[first][inverse]


def _colour_classes(graph: WeightedGraph, src_all: IntArray) -> list[IntArray]:
    """CSR positions (edge slots) of each colour class of a greedy proper colouring; vertices with no
    neighbours are left out (they never change)."""
    if graph.edge_count == 0:
        return []
    # Imported when first needed: igraph (with the matplotlib it imports when installed) is half of the objects a
    # fresh process holds, which every full garbage collection walks, and of tkg's import time.
    import igraph

    upper = src_all < graph.indices
    ig = igraph.Graph(n=graph.n, edges=np.column_stack([src_all[upper], graph.indices[upper]]).tolist())
    colours = np.asarray(ig.vertex_coloring_greedy(), dtype=np.int64)
    slot_colour = colours[src_all]
    order = np.argsort(slot_colour, kind="stable")
    bounds = np.flatnonzero(np.diff(slot_colour[order])) + 1
    return [part for part in np.split(order, bounds) if part.size]


def _update_class(
    graph: WeightedGraph,
    src_all: IntArray,
    positions: IntArray,
    labels: IntArray,
    priority: IntArray,
    current_weight: IntArray,
    *,
    retain: bool,
) -> tuple[IntArray, IntArray]:
    """One simultaneous update of independent vertices (the edge slots ``positions`` are theirs): the vertices
    that change, and their new labels. ``retain``: keep the current label when it is among the maxima."""
    n = graph.n
    src = src_all[positions]
    lab = labels[graph.indices[positions]]
    code, inverse = np.unique(src * n + lab, return_inverse=True)
    total = np.bincount(inverse, weights=graph.weights[positions]).astype(np.int64)
    vertex, label = code // n, code % n
    # Best label per vertex: weight desc, then the seeded priority.
    order = np.lexsort((priority[label], -total, vertex))
    first = order[np.r_[True, vertex[order][1:] != vertex[order][:-1]]]
    best_vertex, best_label, best_total = vertex[first], label[first], total[first]
    own = label == labels[vertex]
    current_weight[best_vertex] = 0
    current_weight[vertex[own]] = total[own]
    if retain:
        change = best_total > current_weight[best_vertex]
    else:
        change = (best_total >= current_weight[best_vertex]) & (best_label != labels[best_vertex])
    return best_vertex[change], best_label[change]


def _ranges(starts: IntArray, stops: IntArray) -> IntArray:
    """Concatenated ``arange(start, stop)`` for each pair, without a Python loop."""
    lengths = stops - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.cumsum(lengths) + lengths, lengths)
    return offsets + np.arange(total, dtype=np.int64)


def is_fixed_point(graph: WeightedGraph, labels: Sequence[int] | IntArray) -> bool:
    """Whether every vertex with neighbours carries a label of maximum total weight among its neighbours'
    labels (the condition at which :func:`label_propagation` stops). A reference check, one vertex at a time."""
    for v in range(graph.n):
        weights = graph.label_weights(v, labels)
        if weights and weights.get(int(labels[v]), 0) < max(weights.values()):
            return False
    return True


def seeded_rank(seed: int, key: str) -> int:
    """A stable pseudo-random rank of ``key`` under ``seed`` (the same on every machine and run)."""
    digest = hashlib.blake2b(f"{seed}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def plurality(weights: Mapping[K, int], sizes: Mapping[K, int] | None = None, *, seed: int = 0) -> K | None:
    """The label held by the weighted plurality of a vertex's neighbours, the dynamic-extension rule of the Zep
    paper (one step of label propagation for a newcomer): maximum total weight, then the larger community (per
    ``sizes``), then a seeded priority of ``str(label)``. ``None`` when no label has positive weight (the vertex
    has no neighbours and waits).

    >>> plurality({"c1": 2, "c2": 3})
    'c2'
    >>> plurality({"c1": 2, "c2": 2}, {"c1": 5, "c2": 9})
    'c2'
    >>> plurality({}) is None
    True
    """
    best: K | None = None
    best_key: tuple[int, int, int] | None = None
    for label, weight in weights.items():
        if weight <= 0:
            continue
        key = (-weight, -(sizes or {}).get(label, 0), seeded_rank(seed, str(label)))
        if best_key is None or key < best_key:
            best, best_key = label, key
    return best


def normalized_mutual_information(a: Sequence[Hashable] | IntArray, b: Sequence[Hashable] | IntArray) -> float:
    """NMI of two partitions of the same items (labels in matching order), normalised by the arithmetic mean of
    the two entropies: 1.0 for identical partitions (up to renaming), near 0 for unrelated ones. Two partitions
    that both put everything in one community (zero entropy) count as identical.

    >>> normalized_mutual_information([0, 0, 1, 1], ["x", "x", "y", "y"])
    1.0
    >>> normalized_mutual_information([0, 0, 1, 1], [0, 1, 0, 1])
    0.0
    """
    if len(a) != len(b):
        raise ValidationError(f"partitions of {len(a)} and {len(b)} items cannot be compared")
    if len(a) == 0:
        return 1.0
    ia = _codes(a)
    ib = _codes(b)
    n = len(ia)
    joint = np.unique(ia * (int(ib.max()) + 1) + ib, return_counts=True)[1]
    pa = np.bincount(ia) / n
    pb = np.bincount(ib) / n
    h_a = float(-(pa * np.log(pa)).sum())
    h_b = float(-(pb * np.log(pb)).sum())
    if h_a + h_b == 0.0:
        return 1.0
    p = joint / n
    mutual = h_a + h_b + float((p * np.log(p)).sum())
    return float(min(1.0, max(0.0, 2.0 * mutual / (h_a + h_b))))


def partition_distance(a: Sequence[Hashable] | IntArray, b: Sequence[Hashable] | IntArray) -> float:
    """``1 - NMI``: 0.0 when two partitions agree, up to 1.0 when they share no structure. tkg's drift measure."""
    value = 1.0 - normalized_mutual_information(a, b)
    return 0.0 if math.isclose(value, 0.0, abs_tol=1e-12) else value


def _codes(labels: Sequence[Hashable] | IntArray) -> IntArray:
    if isinstance(labels, np.ndarray) and labels.dtype.kind in "iu":
        return np.unique(labels, return_inverse=True)[1].astype(np.int64)
    seen: dict[Hashable, int] = {}
    return np.fromiter((seen.setdefault(x, len(seen)) for x in labels), dtype=np.int64, count=len(labels))
