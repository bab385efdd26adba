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

>>> from tkg import FactInput, FixedClock, HashEmbedder, Memory
>>> memory = Memory(embedder=HashEmbedder(dim=32), clock=FixedClock("2024-05-01T00:00:00Z"))
>>> _ = memory.add_facts([FactInput("Ann", "LIVES_IN", "Oslo", valid_at="2020-01-01T00:00:00Z")], group_id="g")
>>> ann = find_entity(memory, "Ann")
>>> page = render_neighbourhood(memory, ann.id)
>>> [edge.relation for edge in page.layout.edges], page.html.startswith("<!DOCTYPE html>")
(['LIVES_IN'], True)
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import tempfile
import threading
import warnings
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tkg.errors import ConfigurationError, NotFoundError, ValidationError
from tkg.models import Entity, Fact, Kind, check_group_id
from tkg.pictures.page import page_html
from tkg.timeline import believed_invalid_at, fact_holds
from tkg.timeutil import iso, optional_utc

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tkg.memory import Memory

__all__ = [
    "MAX_TIMELINE_FACTS",
    "TIMELINE_FORMATS",
    "GraphEdge",
    "GraphNode",
    "NeighbourhoodLayout",
    "RenderedNeighbourhood",
    "RenderedTimeline",
    "TimelineBar",
    "TimelineLayout",
    "fact_status",
    "find_entity",
    "layout_neighbourhood",
    "layout_timeline",
    "neighbourhood_layout",
    "render_neighbourhood",
    "render_timeline",
    "timeline_layout",
]

#: The image formats :func:`render_timeline` writes.
TIMELINE_FORMATS = ("png", "svg")
#: Beyond this many facts a timeline stops being readable; the most recent ones are drawn, with a note.
MAX_TIMELINE_FACTS = 200
#: The neighbourhood page's defaults: entities and facts drawn at most.
MAX_GRAPH_NODES = 100
MAX_GRAPH_FACTS = 400
MAX_DEPTH = 3

Status = Literal["current", "ended", "superseded", "future"]

_INSTALL_HINT = 'pip install "tkg[pictures]"'
_LABEL_CHARS = 42
_TEXT_CHARS = 90


# ----------------------------------------------------------------------------------------------------------
# shared helpers


def fact_status(fact: Fact, now: datetime) -> Status:
    """How a fact stands at ``now`` (a transaction time: what the memory knew then).

    ``superseded``: a later fact ended it (``expired_at`` is set and known by ``now``); ``ended``: its own
    ``invalid_at`` has passed; ``future``: its ``valid_at`` has not come yet; else ``current``.
    """
    if fact.expired_at is not None and fact.expired_at <= now:
        return "superseded"
    end = believed_invalid_at(fact, now)
    if end is not None and end <= now:
        return "ended"
    if fact.valid_at is not None and fact.valid_at > now:
        return "future"
    return "current"


def find_entity(memory: Memory, name_or_id: str, *, group_ids: Iterable[str] | str | None = None) -> Entity:
    """The entity with this id, else the one whose name or alias is exactly this (else the same ignoring case,
    else the same once normalised as entity resolution does).

    ``group_ids`` narrows the search. Raises :class:`NotFoundError` when nothing matches and
    :class:`ValidationError` when several entities match, listing them so that one can be picked by id.
    """
    if not isinstance(name_or_id, str) or not name_or_id.strip():
        raise ValidationError("an entity id or name is needed, got an empty value")
    if isinstance(group_ids, str):
        group_ids = [group_ids]
    groups = None if group_ids is None else frozenset(check_group_id(g) for g in group_ids)
    text = name_or_id.strip()
    direct = memory.get_many(Kind.ENTITY, [text])[0]
    if isinstance(direct, Entity) and (groups is None or direct.group_id in groups):
        return direct
    # The memory's name index finds the candidates (normalised names and aliases); an exact match wins over one
    # that ignores case, which wins over one that only normalises the same.
    candidates = {e.id: e for e in memory.find_entities(text, group_ids=None if groups is None else sorted(groups))}
    folded = text.casefold()
    found = (
        [e for e in candidates.values() if text == e.name or text in e.aliases]
        or [e for e in candidates.values() if folded in {n.casefold() for n in (e.name, *e.aliases)}]
        or list(candidates.values())
    )
    where = "" if groups is None else f" in group(s) {', '.join(sorted(groups))}"
    if not found:
        raise NotFoundError(f"no entity has the id, name or alias {text!r}{where}")
    if len(found) > 1:
        found.sort(key=lambda e: (e.group_id, e.name, e.id))
        listed = "; ".join(f"{e.name!r} (id {e.id}, group {e.group_id}{_labels_note(e)})" for e in found[:10])
        more = f"; and {len(found) - 10} more" if len(found) > 10 else ""
        raise ValidationError(
            f"{len(found)} entities are named {text!r}{where}: {listed}{more}; pass an id instead, or narrow the group"
        )
    return found[0]


def _labels_note(entity: Entity) -> str:
    labels = [label for label in entity.labels if label != "Entity"]
    return f", {'/'.join(labels)}" if labels else ""


def _entity(memory: Memory, entity_id: str, known_at: datetime | None) -> Entity:
    if not isinstance(entity_id, str) or not entity_id:
        raise ValidationError(f"entity_id must be a non-empty string, got {entity_id!r}")
    record = memory.get_many(Kind.ENTITY, [entity_id])[0]
    if not isinstance(record, Entity):
        raise NotFoundError(f"no entity with id {entity_id!r}")
    if known_at is not None and record.created_at > known_at:
        raise NotFoundError(
            f"entity {record.name!r} ({entity_id}) was recorded at {iso(record.created_at)}, after known_at "
            f"{iso(known_at)}: the memory did not know it yet"
        )
    return record


def _names(memory: Memory, ids: Iterable[str]) -> dict[str, Entity]:
    wanted = sorted(set(ids))
    return {e.id: e for e in memory.get_many(Kind.ENTITY, wanted) if isinstance(e, Entity)}


def _short(text: str, limit: int) -> str:
    """One line of at most ``limit`` characters (user text may hold newlines and control characters)."""
    flat = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _positive(value: object, what: str, maximum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
        raise ValidationError(f"{what} must be an integer from 1 to {maximum}, got {value!r}")
    return value


def _target(path: str | os.PathLike[str]) -> Path:
    """Check before any work that a file could be written at ``path``."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise ValidationError(f"cannot write {target}: directory {directory} does not exist")
    if target.is_dir():
        raise ValidationError(f"cannot write {target}: it is a directory")
    return target


def _write_atomic(target: Path, data: bytes) -> None:
    """Write to a temporary file beside ``target`` and rename it into place: readers never see half a file."""
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ----------------------------------------------------------------------------------------------------------
# the timeline: layout (pure) and drawing (matplotlib)


@dataclass(frozen=True, slots=True)
class TimelineBar:
    """One fact on the timeline: its row, what the row says, and where its bar and marks go.

    ``start`` / ``end`` are the drawn ends of the valid-interval bar (the view's edge where the interval is open:
    ``open_start`` / ``open_end``). ``invalid_at`` and ``expired_at`` are as known at the view's ``known_at``.
    ``holds_at_as_of`` is ``None`` without an ``as_of``.
    """

    row: int
    fact_id: str
    relation: str
    other_name: str
    outgoing: bool
    label: str
    text: str
    status: Status
    start: datetime
    end: datetime
    open_start: bool
    open_end: bool
    valid_at: datetime | None
    invalid_at: datetime | None
    created_at: datetime
    expired_at: datetime | None
    holds_at_as_of: bool | None


@dataclass(frozen=True, slots=True)
class TimelineLayout:
    """Everything a timeline picture shows, computed without matplotlib (see :func:`layout_timeline`)."""

    entity_id: str
    entity_name: str
    group_id: str
    bars: tuple[TimelineBar, ...]
    total: int
    now: datetime
    as_of: datetime | None
    known_at: datetime | None
    x_min: datetime
    x_max: datetime

    @property
    def omitted(self) -> int:
        """Facts left out because there were more than the cap."""
        return self.total - len(self.bars)


def layout_timeline(
    entity: Entity,
    facts: Sequence[Fact],
    names: dict[str, Entity],
    *,
    now: datetime,
    as_of: datetime | None = None,
    known_at: datetime | None = None,
    max_facts: int = MAX_TIMELINE_FACTS,
) -> TimelineLayout:
    """Lay out the bars of an entity's timeline: a pure function of the facts, the entity names and the times.

    Only facts recorded by ``known_at`` (default ``now``) are shown, and an invalidation learnt later is not yet
    known. Rows run oldest first (by ``valid_at``, else ``created_at``); past ``max_facts`` the most recent facts
    are kept.
    """
    seen_at = known_at or now
    visible = [f for f in facts if f.created_at <= seen_at]
    visible.sort(key=lambda f: (f.valid_at or f.created_at, f.created_at, f.id))
    total = len(visible)
    kept = visible[-max_facts:] if total > max_facts else visible
    ends = {f.id: believed_invalid_at(f, seen_at) for f in kept}
    expired = {f.id: f.expired_at if f.expired_at is not None and f.expired_at <= seen_at else None for f in kept}
    points = [seen_at, *(t for t in (as_of,) if t is not None)]
    for f in kept:
        points += [t for t in (f.valid_at, ends[f.id], f.created_at, expired[f.id]) if t is not None]
    low, high = min(points), max(points)
    pad = max((high - low) * 0.04, timedelta(days=30))
    x_min, x_max = low - pad, high + pad
    bars: list[TimelineBar] = []
    for row, f in enumerate(kept):
        outgoing = f.source_id == entity.id
        other_id = f.target_id if outgoing else f.source_id
        other = names.get(other_id)
        other_name = _short(other.name, _LABEL_CHARS) if other is not None else f"? ({other_id})"
        label = f"{f.relation} → {other_name}" if outgoing else f"{f.relation} ← {other_name}"
        if f.source_id == f.target_id:
            label = f"{f.relation} (itself)"
        end = ends[f.id]
        bars.append(
            TimelineBar(
                row=row,
                fact_id=f.id,
                relation=f.relation,
                other_name=other_name,
                outgoing=outgoing,
                label=_short(label, _LABEL_CHARS + 24),
                text=_short(f.fact, _TEXT_CHARS),
                status=fact_status(f, seen_at),
                start=f.valid_at if f.valid_at is not None else x_min,
                end=end if end is not None else x_max,
                open_start=f.valid_at is None,
                open_end=end is None,
                valid_at=f.valid_at,
                invalid_at=end,
                created_at=f.created_at,
                expired_at=expired[f.id],
                holds_at_as_of=None if as_of is None else fact_holds(f, as_of, seen_at),
            )
        )
    return TimelineLayout(
        entity_id=entity.id,
        entity_name=entity.name,
        group_id=entity.group_id,
        bars=tuple(bars),
        total=total,
        now=now,
        as_of=as_of,
        known_at=known_at,
        x_min=x_min,
        x_max=x_max,
    )


def timeline_layout(
    memory: Memory,
    entity_id: str,
    *,
    as_of: datetime | str | None = None,
    known_at: datetime | str | None = None,
    max_facts: int = MAX_TIMELINE_FACTS,
) -> TimelineLayout:
    """Read an entity's facts from ``memory`` and lay out its timeline (see :func:`layout_timeline`)."""
    as_of_t, known_t = optional_utc(as_of, "as_of"), optional_utc(known_at, "known_at")
    max_facts = _positive(max_facts, "max_facts", 5_000)
    entity = _entity(memory, entity_id, known_t)
    facts = memory.facts_about(entity.id)
    names = _names(memory, (i for f in facts for i in (f.source_id, f.target_id)))
    return layout_timeline(
        entity, facts, names, now=memory.clock.now(), as_of=as_of_t, known_at=known_t, max_facts=max_facts
    )


@dataclass(frozen=True, slots=True)
class RenderedTimeline:
    """A drawn timeline: the image bytes, their format, the file written (if any), the layout and the figure."""

    data: bytes
    format: str
    path: Path | None
    layout: TimelineLayout
    figure: Figure


def render_timeline(
    memory: Memory,
    entity_id: str,
    path_or_format: str | os.PathLike[str] = "png",
    *,
    format: str | None = None,
    as_of: datetime | str | None = None,
    known_at: datetime | str | None = None,
    max_facts: int = MAX_TIMELINE_FACTS,
    dpi: int = 100,
) -> RenderedTimeline:
    """Draw the fact timeline of an entity as PNG or SVG.

    ``path_or_format`` is a file to write (its suffix, ``.png`` or ``.svg``, picks the format unless ``format``
    is given) or just a format name (``"png"`` / ``"svg"``), in which case nothing is written and the bytes are
    in the result's ``data``. ``known_at`` shows the memory as it stood then; ``as_of`` marks a moment in the
    world with a line and fades the facts that did not hold then. Beyond ``max_facts`` facts the most recent
    are drawn and a note says how many were left out.

    Raises :class:`NotFoundError` for an unknown entity, :class:`ValidationError` for a bad target or format,
    and :class:`ConfigurationError` when matplotlib is not installed; then no file is written.
    """
    fmt, target = _timeline_target(path_or_format, format)
    dpi = _positive(dpi, "dpi", 600)
    layout = timeline_layout(memory, entity_id, as_of=as_of, known_at=known_at, max_facts=max_facts)
    data, figure = _draw_timeline(layout, fmt, dpi)
    if target is not None:
        _write_atomic(target, data)
    return RenderedTimeline(data=data, format=fmt, path=target, layout=layout, figure=figure)


def _timeline_target(path_or_format: str | os.PathLike[str], format: str | None) -> tuple[str, Path | None]:
    if format is not None and (not isinstance(format, str) or format.lower() not in TIMELINE_FORMATS):
        raise ValidationError(f"format must be one of {', '.join(TIMELINE_FORMATS)}, got {format!r}")
    chosen = format.lower() if format is not None else None
    if isinstance(path_or_format, str) and path_or_format.lower() in TIMELINE_FORMATS:
        named = path_or_format.lower()
        if chosen is not None and chosen != named:
            raise ValidationError(f"two formats were asked for: {named!r} and format={chosen!r}")
        return named, None
    if not isinstance(path_or_format, str | os.PathLike):
        raise ValidationError(
            f"expected a file path or a format ({', '.join(TIMELINE_FORMATS)}), got {path_or_format!r}"
        )
    target = Path(path_or_format)
    suffix = target.suffix.lower().lstrip(".")
    if chosen is None:
        if suffix not in TIMELINE_FORMATS:
            raise ValidationError(
                f"cannot tell the image format of {target}: name it .png or .svg, or pass format='png' / 'svg'"
            )
        chosen = suffix
    elif suffix in TIMELINE_FORMATS and suffix != chosen:
        raise ValidationError(f"{target} is named .{suffix} but format={chosen!r} was asked for")
    return chosen, _target(target)


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigurationError(f"drawing a timeline needs matplotlib: {_INSTALL_HINT}") from None
    return matplotlib


_MATPLOTLIB_LOCK = threading.Lock()

# Relation colours: light, so that the fact text printed on a bar stays readable.
_PALETTE = (
    "#a6cee3", "#b2df8a", "#fdbf6f", "#cab2d6", "#fb9a99", "#ffed6f", "#8dd3c7", "#bebada", "#80b1d3", "#fccde5",
)  # fmt: skip
_EDGE = "#33415c"
_ENDED_EDGE = "#7f8c8d"
_SUPERSEDED_FACE = "#e6e6e6"
_RED = "#c0392b"
_ROW_INCHES = 0.36
_TOP_INCHES = 1.45
_BOTTOM_INCHES = 0.75
_WIDTH_INCHES = 12.0
_LEFT_INCHES = 3.1


def _draw_timeline(layout: TimelineLayout, fmt: str, dpi: int) -> tuple[bytes, Figure]:
    matplotlib = _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    # Fixed settings for this drawing only: a salt so SVG ids do not depend on random state, glyphs as paths
    # (no font files referenced), and the bundled DejaVu font so output does not depend on the machine's fonts.
    settings = {
        "svg.hashsalt": "tkg-timeline",
        "svg.fonttype": "path",
        "font.family": "DejaVu Sans",
        "hatch.linewidth": 0.8,
        "timezone": "UTC",
    }
    # rc_context swaps the global rcParams for the duration of the drawing; the lock keeps two threads (say, a
    # server's request handlers) from drawing with each other's settings.
    with _MATPLOTLIB_LOCK, matplotlib.rc_context(settings), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph .* missing from")  # names in scripts DejaVu lacks
        rows = max(len(layout.bars), 1)
        height = _TOP_INCHES + rows * _ROW_INCHES + _BOTTOM_INCHES
        figure = Figure(figsize=(_WIDTH_INCHES, height), dpi=dpi)
        FigureCanvasAgg(figure)  # the Agg canvas, explicitly: never pyplot, never a GUI backend
        _plot(figure, layout, height)
        buffer = io.BytesIO()
        metadata: dict[str, Any] = (
            {"Date": None, "Creator": "tkg"} if fmt == "svg" else {"Software": "tkg"}
        )  # no timestamps: the same graph gives the same bytes
        figure.savefig(buffer, format=fmt, dpi=dpi, metadata=metadata)
    return buffer.getvalue(), figure


def _plot(figure: Figure, layout: TimelineLayout, height: float) -> None:
    import matplotlib.dates as mdates
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    ax = figure.add_axes(
        (
            _LEFT_INCHES / _WIDTH_INCHES,
            _BOTTOM_INCHES / height,
            1 - (_LEFT_INCHES + 0.35) / _WIDTH_INCHES,
            (height - _TOP_INCHES - _BOTTOM_INCHES) / height,
        )
    )
    x0, x1 = mdates.date2num(layout.x_min), mdates.date2num(layout.x_max)
    span = x1 - x0
    relations = sorted({bar.relation for bar in layout.bars})
    colours = {r: _PALETTE[i % len(_PALETTE)] for i, r in enumerate(relations)}
    for bar in layout.bars:
        _plot_bar(ax, bar, colours[bar.relation], span, layout, Rectangle)
    rows = max(len(layout.bars), 1)
    ax.set_xlim(x0, x1)
    ax.set_ylim(rows - 0.45, -0.6)  # row 0 at the top
    ax.set_yticks([bar.row for bar in layout.bars], [bar.label for bar in layout.bars], fontsize=8, parse_math=False)
    ax.tick_params(axis="y", length=0)
    locator = mdates.AutoDateLocator()
    ax.xaxis.set_major_locator(locator)
    ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    seen_at = layout.known_at or layout.now
    ax.axvline(mdates.date2num(seen_at), color="#555555", linestyle=":", linewidth=1, gid="tkg-now")
    ax.text(
        mdates.date2num(seen_at), -0.55, "known at" if layout.known_at else "now",
        fontsize=7, color="#555555", ha="center", va="bottom",
    )  # fmt: skip
    if layout.as_of is not None:
        ax.axvline(mdates.date2num(layout.as_of), color="#1f5fa8", linestyle="--", linewidth=1.2, gid="tkg-as-of")
        ax.text(
            mdates.date2num(layout.as_of), -0.55, f"as of {layout.as_of:%Y-%m-%d}",
            fontsize=7, color="#1f5fa8", ha="center", va="bottom",
        )  # fmt: skip
    if not layout.bars:
        ax.text(0.5, 0.5, "no facts recorded", transform=ax.transAxes, ha="center", va="center", color="#777777")
    _plot_titles(figure, layout, height)
    handles = [
        Patch(facecolor=_PALETTE[0], edgecolor=_EDGE, label="holds (valid interval)"),
        Patch(facecolor=_PALETTE[0], edgecolor=_ENDED_EDGE, alpha=0.5, label="ended"),
        Patch(facecolor=_SUPERSEDED_FACE, edgecolor=_ENDED_EDGE, hatch="////", label="superseded by a later fact"),
        Line2D([], [], color=_RED, marker="X", linestyle="none", label="invalid_at (superseded)"),
        Line2D([], [], color=_EDGE, marker=">", linestyle="none", label="open-ended"),
        Line2D([], [], color="#777777", marker="|", markersize=8, label="recorded (created_at → expired_at)"),
        Line2D([], [], color=_RED, marker="x", linestyle="none", label="expired_at"),
    ]
    figure.legend(
        handles=handles, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.78 / height), ncol=4, fontsize=7.5,
        frameon=False, handlelength=1.6, columnspacing=1.4,
    )  # fmt: skip


def _plot_bar(ax: Any, bar: TimelineBar, colour: str, span: float, layout: TimelineLayout, rectangle: Any) -> None:
    import matplotlib.dates as mdates

    start, end = mdates.date2num(bar.start), mdates.date2num(bar.end)
    width = max(end - start, span * 0.003)  # a fact valid for an instant still shows
    fade = 0.35 if bar.holds_at_as_of is False else 1.0
    style: dict[str, Any] = {"facecolor": colour, "edgecolor": _EDGE, "linewidth": 0.8, "alpha": fade}
    if bar.status == "superseded":
        style.update(facecolor=_SUPERSEDED_FACE, edgecolor=_ENDED_EDGE, hatch="////")
    elif bar.status == "ended":
        style.update(edgecolor=_ENDED_EDGE, alpha=0.5 * fade)
    elif bar.status == "future":
        style.update(linestyle="--")
    ax.add_patch(rectangle((start, bar.row - 0.21), width, 0.42, gid=f"tkg-bar-{bar.fact_id}", **style))
    ax.text(
        start + span * 0.004, bar.row, bar.text, fontsize=6.5, va="center", ha="left", clip_on=True,
        color="#222222" if bar.status == "current" else "#555555", parse_math=False,
    )  # fmt: skip
    lane = bar.row + 0.33
    if bar.open_end:
        ax.plot([end], [bar.row], marker=">", color=_EDGE, markersize=6, clip_on=False, gid=f"tkg-open-{bar.fact_id}")
    if bar.open_start:
        ax.plot([start], [bar.row], marker="<", color=_EDGE, markersize=6, clip_on=False)
    if bar.status == "superseded" and bar.invalid_at is not None:
        ax.plot(
            [mdates.date2num(bar.invalid_at)], [bar.row], marker="X", color=_RED, markersize=7,
            markeredgecolor="white", markeredgewidth=0.6, gid=f"tkg-invalid-{bar.fact_id}",
        )  # fmt: skip
    # The transaction lane: when the memory recorded the fact, and (if it did) when it learnt that it ended.
    created = mdates.date2num(bar.created_at)
    recorded_end = bar.expired_at or layout.known_at or layout.now
    ax.plot(
        [created, mdates.date2num(recorded_end)], [lane, lane], color="#777777", linewidth=1,
        marker="|", markersize=6, markevery=[0], gid=f"tkg-tx-{bar.fact_id}",
    )  # fmt: skip
    if bar.expired_at is not None:
        ax.plot([mdates.date2num(bar.expired_at)], [lane], marker="x", color=_RED, markersize=5)


def _plot_titles(figure: Figure, layout: TimelineLayout, height: float) -> None:
    name = _short(layout.entity_name, 80)
    figure.text(
        0.5 * (_LEFT_INCHES / _WIDTH_INCHES), 1 - 0.3 / height, f"{name}: fact timeline", fontsize=12,
        fontweight="bold", ha="left", va="center", parse_math=False,
    )  # fmt: skip
    parts = [f"group {layout.group_id}", f"{len(layout.bars)} fact{'s' if len(layout.bars) != 1 else ''}"]
    if layout.known_at is not None:
        parts.append(f"as known at {iso(layout.known_at)}")
    if layout.as_of is not None:
        parts.append(f"faded: did not hold as of {iso(layout.as_of)}")
    if layout.omitted:
        parts.append(f"showing the {len(layout.bars)} most recent of {layout.total} facts ({layout.omitted} left out)")
    figure.text(
        0.5 * (_LEFT_INCHES / _WIDTH_INCHES), 1 - 0.58 / height, " · ".join(parts), fontsize=8, color="#444444",
        ha="left", va="center", parse_math=False,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------------
# the neighbourhood: layout (pure) and the HTML page


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
    depth = _positive(depth, "depth", MAX_DEPTH)
    limit = _positive(limit, "limit", 2_000)
    max_facts = _positive(max_facts, "max_facts", 10_000)
    as_of_t, known_t = optional_utc(as_of, "as_of"), optional_utc(known_at, "known_at")
    center = _entity(memory, entity_id, known_t)
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
    target = _target(path) if path is not None else None
    layout = neighbourhood_layout(
        memory, entity_id, depth=depth, as_of=as_of, known_at=known_at, limit=limit, max_facts=max_facts
    )
    page = neighbourhood_html(layout)
    if target is not None:
        _write_atomic(target, page.encode("utf-8"))
    return RenderedNeighbourhood(html=page, path=target, layout=layout)


def _page_data(layout: NeighbourhoodLayout) -> dict[str, Any]:
    return {
        "center": layout.center_id,
        "view": list(layout.view),
        "nodes": [
            {
                "id": n.id,
                "name": n.name,
                "short": _short(n.name, 28),
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
        title=f"{_short(layout.center_name, 80)}: neighbourhood (tkg)",
        heading=_short(layout.center_name, 120),
        subtitle=" · ".join(parts),
        data=_page_data(layout),
    )
