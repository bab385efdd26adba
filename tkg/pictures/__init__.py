"""Pictures of memory: an entity's fact timeline (PNG or SVG) and its graph neighbourhood (an offline HTML page).

* :func:`render_timeline` draws every fact touching an entity as a bar over its valid interval (event time),
  with a thin second lane under it for the transaction times (``created_at`` and ``expired_at``). Facts that a
  later fact superseded are grey and hatched, with a red cross at their ``invalid_at``; open-ended facts end in
  an arrow. It needs matplotlib (``pip install "tkg[pictures]"``), imported only when a timeline is drawn, always
  on the Agg canvas and inside an ``rc_context`` so global matplotlib state is left alone. The bytes are stable
  for a given graph and clock (no dates in the metadata, fixed SVG ids), so they can be compared in tests.
* :func:`render_neighbourhood` writes one self-contained HTML page (inline CSS, JS and SVG; no network, no CDN)
  with the entity's neighbourhood: entities as nodes on a deterministic radial layout computed here, facts as
  edges labelled by relation, ended facts dashed; hovering or clicking shows a fact's text and its four
  timestamps. Every string from memory travels as escaped JSON and is put into the page with ``textContent``,
  and a Content-Security-Policy admits only the page's own script, so names cannot inject HTML or JS.

Both also return their bytes, so a server can stream them; a file target is written atomically (a temporary
file renamed into place), and nothing is written when an error is raised.

The modules: :mod:`~tkg.pictures.timeline` (the timeline's layout and drawing), :mod:`~tkg.pictures.neighbourhood`
(the neighbourhood's layout and the page's data), :mod:`~tkg.pictures.page` (the HTML page, from the template,
CSS and JS shipped in ``tkg/pictures/assets/``) and :mod:`~tkg.pictures.common` (what both share).

>>> from tkg import FactInput, FixedClock, HashEmbedder, Memory
>>> memory = Memory(embedder=HashEmbedder(dim=32), clock=FixedClock("2024-05-01T00:00:00Z"))
>>> _ = memory.add_facts([FactInput("Ann", "LIVES_IN", "Oslo", valid_at="2020-01-01T00:00:00Z")], group_id="g")
>>> ann = find_entity(memory, "Ann")
>>> page = render_neighbourhood(memory, ann.id)
>>> [edge.relation for edge in page.layout.edges], page.html.startswith("<!DOCTYPE html>")
(['LIVES_IN'], True)
"""

from tkg.pictures.common import Status, fact_status, find_entity
from tkg.pictures.neighbourhood import (
    MAX_DEPTH,
    MAX_GRAPH_FACTS,
    MAX_GRAPH_NODES,
    GraphEdge,
    GraphNode,
    NeighbourhoodLayout,
    RenderedNeighbourhood,
    layout_neighbourhood,
    neighbourhood_html,
    neighbourhood_layout,
    render_neighbourhood,
)
from tkg.pictures.timeline import (
    MAX_TIMELINE_FACTS,
    TIMELINE_FORMATS,
    RenderedTimeline,
    TimelineBar,
    TimelineLayout,
    layout_timeline,
    render_timeline,
    timeline_layout,
)

__all__ = [
    "MAX_DEPTH",
    "MAX_GRAPH_FACTS",
    "MAX_GRAPH_NODES",
    "MAX_TIMELINE_FACTS",
    "TIMELINE_FORMATS",
    "GraphEdge",
    "GraphNode",
    "NeighbourhoodLayout",
    "RenderedNeighbourhood",
    "RenderedTimeline",
    "Status",
    "TimelineBar",
    "TimelineLayout",
    "fact_status",
    "find_entity",
    "layout_neighbourhood",
    "layout_timeline",
    "neighbourhood_html",
    "neighbourhood_layout",
    "render_neighbourhood",
    "render_timeline",
    "timeline_layout",
]
