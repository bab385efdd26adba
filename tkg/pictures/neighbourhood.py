"""The neighbourhood of an entity as one self-contained HTML page: a pure, deterministic radial layout
(:func:`layout_neighbourhood`) and the data the page draws from it.

Entities are nodes (the centre in the middle, each hop on a ring further out), facts are edges labelled by
relation, ended facts dashed; hovering or clicking shows a fact's text and its four timestamps. The page itself
(inline CSS, JS and SVG; no network, no CDN) is assembled by :mod:`tkg.pictures.page`.
"""

from __future__ import annotations

import math
import os
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tkg.models import Entity, Fact
from tkg.pictures.common import Status, bounded_int, fact_status, known_entity, one_line, writable_path, write_atomic
from tkg.pictures.page import page_html
from tkg.timeline import believed_invalid_at
from tkg.timeutil import iso, optional_utc

if TYPE_CHECKING:
    from tkg.memory import Memory

__all__ = [
    "MAX_DEPTH",
    "MAX_GRAPH_FACTS",
    "MAX_GRAPH_NODES",
    "GraphEdge",
    "GraphNode",
    "NeighbourhoodLayout",
    "RenderedNeighbourhood",
    "layout_neighbourhood",
    "neighbourhood_html",
    "neighbourhood_layout",
    "render_neighbourhood",
]

#: The neighbourhood page's defaults: entities and facts drawn at most, and the most hops walked.
MAX_GRAPH_NODES = 100
MAX_GRAPH_FACTS = 400
MAX_DEPTH = 3


@dataclass(frozen=True, slots=True)
class GraphNode:
    """An entity on the neighbourhood page: ``hop`` steps from the centre, at (``x``, ``y``)."""

    id: str
    name: str
    labels: tuple[str, ...]
    summary: str
    aliases: tuple[str, ...]
    hop: int
    x: float
    y: float


@dataclass(frozen=True, slots=True)
class GraphEdge:
    """A fact on the neighbourhood page; ``bend`` curves parallel edges apart (0: straight)."""

    id: str
    source: str
    target: str
    relation: str
    fact: str
    status: Status
    valid_at: datetime | None
    invalid_at: datetime | None
    created_at: datetime
    expired_at: datetime | None
    bend: float


@dataclass(frozen=True, slots=True)
class NeighbourhoodLayout:
    """The nodes and edges of a neighbourhood page, with the view box that holds them."""

    center_id: str
    center_name: str
    group_id: str
    depth: int
    nodes: tuple[GraphNode, ...]
    edges: tuple[GraphEdge, ...]
    now: datetime
    as_of: datetime | None
    known_at: datetime | None
    omitted_nodes: int
    omitted_edges: int
    view: tuple[float, float, float, float]


_RING = 230.0  # pixels between rings
_SPACING = 70.0  # least arc length between neighbours on a ring
_BEND = 34.0  # pixels between parallel edges


def layout_neighbourhood(
    center: Entity,
    hops: dict[str, int],
    entities: dict[str, Entity],
    facts: Sequence[Fact],
    *,
    now: datetime,
    depth: int,
    as_of: datetime | None = None,
    known_at: datetime | None = None,
    omitted_nodes: int = 0,
    max_facts: int = MAX_GRAPH_FACTS,
) -> NeighbourhoodLayout:
    """A deterministic radial layout: the centre in the middle, each hop on a ring further out.

    Ring 1 is ordered by name; each later ring by the position of the node's first parent on the ring inside
    it, so children sit near their parents. Parallel facts between the same two entities get opposite bends.
    """
    seen_at = known_at or now
    ring_of: dict[int, list[str]] = defaultdict(list)
    for entity_id, hop in hops.items():
        ring_of[hop].append(entity_id)
    adjacency: dict[str, set[str]] = defaultdict(set)
    for f in facts:
        adjacency[f.source_id].add(f.target_id)
        adjacency[f.target_id].add(f.source_id)
    angles = _ring_angles(hops, ring_of, adjacency, entities)
    position: dict[str, tuple[float, float]] = {center.id: (0.0, 0.0)}
    radius = 0.0
    for hop in sorted(h for h in ring_of if h > 0):
        radius = max(radius + _RING, len(ring_of[hop]) * _SPACING / (2 * math.pi))
        for entity_id in ring_of[hop]:
            angle = angles[entity_id]
            position[entity_id] = (round(radius * math.cos(angle), 2), round(radius * math.sin(angle), 2))
    nodes = tuple(
        GraphNode(
            id=e.id,
            name=e.name,
            labels=tuple(label for label in e.labels if label != "Entity"),
            summary=e.summary,
            aliases=e.aliases,
            hop=hops[e.id],
            x=position[e.id][0],
            y=position[e.id][1],
        )
        for e in sorted((entities[i] for i in hops), key=lambda e: (hops[e.id], e.name.casefold(), e.id))
    )
    drawn = sorted(
        (f for f in facts if f.source_id in hops and f.target_id in hops),
        key=lambda f: (f.valid_at or f.created_at, f.created_at, f.id),
    )
    omitted_edges = max(len(drawn) - max_facts, 0)
    drawn = drawn[-max_facts:] if omitted_edges else drawn
    edges = tuple(_edges(drawn, seen_at))
    margin = 130.0
    xs = [n.x for n in nodes] or [0.0]
    ys = [n.y for n in nodes] or [0.0]
    view = (
        round(min(xs) - margin, 2),
        round(min(ys) - margin, 2),
        round(max(xs) - min(xs) + 2 * margin, 2),
        round(max(ys) - min(ys) + 2 * margin, 2),
    )
    return NeighbourhoodLayout(
        center_id=center.id,
        center_name=center.name,
        group_id=center.group_id,
        depth=depth,
        nodes=nodes,
        edges=edges,
        now=now,
        as_of=as_of,
        known_at=known_at,
        omitted_nodes=omitted_nodes,
        omitted_edges=omitted_edges,
        view=view,
    )


def _ring_angles(
    hops: dict[str, int],
    ring_of: dict[int, list[str]],
    adjacency: dict[str, set[str]],
    entities: dict[str, Entity],
) -> dict[str, float]:
    """The angle of every node off-centre. Ring 1 is spread evenly in name order from 12 o'clock, clockwise;
    a node further out aims at the mean angle of its parents on the ring inside it and is pushed along just
    enough to keep its neighbours at arm's length (evenly spread when the ring is too full for that)."""
    angles: dict[str, float] = {}
    radius = 0.0
    for hop in sorted(h for h in ring_of if h > 0):
        members = ring_of[hop]
        radius = max(radius + _RING, len(members) * _SPACING / (2 * math.pi))
        wanted: dict[str, float] = {}
        for entity_id in members:
            parents = [angles[p] for p in adjacency[entity_id] if hops.get(p) == hop - 1 and p in angles]
            if hop == 1 or not parents:
                wanted[entity_id] = math.inf
                continue
            mean = math.atan2(sum(map(math.sin, parents)), sum(map(math.cos, parents)))
            wanted[entity_id] = (mean + math.pi / 2) % (2 * math.pi)  # measured from 12 o'clock
        members.sort(key=lambda e: (wanted[e], entities[e].name.casefold(), e))
        gap = _SPACING / radius
        placed: list[float] = []
        for entity_id in members:
            aim = wanted[entity_id]
            placed.append(aim if not placed else max(aim, placed[-1] + gap))
        if any(math.isinf(a) for a in placed) or placed[-1] - placed[0] > 2 * math.pi - gap:
            placed = [(placed[0] if not math.isinf(placed[0]) else 0.0) + 2 * math.pi * i / len(members)
                      for i in range(len(members))]  # fmt: skip
        for entity_id, angle in zip(members, placed, strict=True):
            angles[entity_id] = angle - math.pi / 2
    return angles


def _edges(facts: Sequence[Fact], seen_at: datetime) -> Iterator[GraphEdge]:
    between: dict[tuple[str, str], list[Fact]] = defaultdict(list)
    for f in facts:
        between[(min(f.source_id, f.target_id), max(f.source_id, f.target_id))].append(f)
    bends: dict[str, float] = {}
    for (low, _high), group in between.items():
        group.sort(key=lambda f: f.id)
        for index, f in enumerate(group):
            if f.source_id == f.target_id:  # self-loops: nested loops, one per fact
                bends[f.id] = float(index + 1)
                continue
            offset = (index - (len(group) - 1) / 2) * _BEND
            # The bend is measured to the left of source -> target; flip it for facts pointing the other way so
            # that parallel facts spread out instead of landing on top of each other.
            bends[f.id] = offset if f.source_id == low else -offset
    for f in facts:
        invalid = believed_invalid_at(f, seen_at)
        yield GraphEdge(
            id=f.id,
            source=f.source_id,
            target=f.target_id,
            relation=f.relation,
            fact=f.fact,
            status=fact_status(f, seen_at),
            valid_at=f.valid_at,
            invalid_at=invalid,
            created_at=f.created_at,
            expired_at=f.expired_at if f.expired_at is not None and f.expired_at <= seen_at else None,
            bend=bends[f.id],
        )


def neighbourhood_layout(
    memory: Memory,
    entity_id: str,
    *,
    depth: int = 1,
    as_of: datetime | str | None = None,
    known_at: datetime | str | None = None,
    limit: int = MAX_GRAPH_NODES,
    max_facts: int = MAX_GRAPH_FACTS,
) -> NeighbourhoodLayout:
    """Walk ``depth`` hops out from an entity in ``memory`` and lay the neighbourhood out.

    The walk stays in the entity's group and sees what the memory knew at ``known_at`` (default now): by default
    every fact, ended ones included; with ``as_of``, only the facts that held then. At most ``limit`` entities
    (nearest first, then by name) and ``max_facts`` facts (most recent) are kept; the layout counts the rest.
    """
    depth = bounded_int(depth, "depth", MAX_DEPTH)
    limit = bounded_int(limit, "limit", 2_000)
    max_facts = bounded_int(max_facts, "max_facts", 10_000)
    as_of_t, known_t = optional_utc(as_of, "as_of"), optional_utc(known_at, "known_at")
    center = known_entity(memory, entity_id, known_t)
    now = memory.clock.now()
    found = memory.neighbourhood(center.id, depth=depth, as_of=as_of_t, known_at=known_t, limit=limit)
    hops, entities, facts, omitted = found.hops, found.entities, {f.id: f for f in found.facts}, found.omitted
    return layout_neighbourhood(
        center,
        hops,
        entities,
        list(facts.values()),
        now=now,
        depth=depth,
        as_of=as_of_t,
        known_at=known_t,
        omitted_nodes=omitted,
        max_facts=max_facts,
    )


@dataclass(frozen=True, slots=True)
class RenderedNeighbourhood:
    """A neighbourhood page: the HTML text, the file written (if any) and the layout it shows."""

    html: str
    path: Path | None
    layout: NeighbourhoodLayout

    @property
    def data(self) -> bytes:
        """The page as UTF-8 bytes, for a server to stream."""
        return self.html.encode("utf-8")


def render_neighbourhood(
    memory: Memory,
    entity_id: str,
    path: str | os.PathLike[str] | None = None,
    *,
    depth: int = 1,
    as_of: datetime | str | None = None,
    known_at: datetime | str | None = None,
    limit: int = MAX_GRAPH_NODES,
    max_facts: int = MAX_GRAPH_FACTS,
) -> RenderedNeighbourhood:
    """Write the neighbourhood of an entity as one self-contained HTML page (or just return it, without ``path``).

    The page needs no network: CSS, JS and the SVG it draws are inline, and its Content-Security-Policy refuses
    anything else. See :func:`neighbourhood_layout` for ``depth``, ``as_of``, ``known_at``, ``limit`` and
    ``max_facts``. Raises :class:`NotFoundError` for an unknown entity; then nothing is written.
    """
    target = writable_path(path) if path is not None else None
    layout = neighbourhood_layout(
        memory, entity_id, depth=depth, as_of=as_of, known_at=known_at, limit=limit, max_facts=max_facts
    )
    page = neighbourhood_html(layout)
    if target is not None:
        write_atomic(target, page.encode("utf-8"))
    return RenderedNeighbourhood(html=page, path=target, layout=layout)


def _page_data(layout: NeighbourhoodLayout) -> dict[str, Any]:
    return {
        "center": layout.center_id,
        "view": list(layout.view),
        "nodes": [
            {
                "id": n.id,
                "name": n.name,
                "short": one_line(n.name, 28),
                "labels": list(n.labels),
                "summary": n.summary,
                "aliases": list(n.aliases),
                "hop": n.hop,
                "x": n.x,
                "y": n.y,
            }
            for n in layout.nodes
        ],
        "edges": [
            {
                "id": e.id,
                "source": e.source,
                "target": e.target,
                "relation": e.relation,
                "fact": e.fact,
                "status": e.status,
                "valid_at": iso(e.valid_at),
                "invalid_at": iso(e.invalid_at),
                "created_at": iso(e.created_at),
                "expired_at": iso(e.expired_at),
                "bend": e.bend,
            }
            for e in layout.edges
        ],
    }


def neighbourhood_html(layout: NeighbourhoodLayout) -> str:
    """The self-contained HTML page for a laid-out neighbourhood (every string from memory escaped)."""
    parts = [f"group {layout.group_id}", f"depth {layout.depth}"]
    parts.append(f"{len(layout.nodes)} entities, {len(layout.edges)} facts")
    if layout.as_of is not None:
        parts.append(f"facts that held as of {iso(layout.as_of)}")
    parts.append(f"as known at {iso(layout.known_at)}" if layout.known_at else f"drawn {iso(layout.now)}")
    if layout.omitted_nodes or layout.omitted_edges:
        parts.append(f"left out: {layout.omitted_nodes} entities, {layout.omitted_edges} facts (raise the limits)")
    return page_html(
        title=f"{one_line(layout.center_name, 80)}: neighbourhood (tkg)",
        heading=one_line(layout.center_name, 120),
        subtitle=" · ".join(parts),
        data=_page_data(layout),
    )
