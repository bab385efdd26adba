"""The fact timeline of an entity, as PNG or SVG: a pure layout (:func:`layout_timeline`) and its drawing.

Every fact touching the entity is a bar over its valid interval (event time), with a thin second lane under it
for the transaction times (``created_at`` and ``expired_at``). Facts that a later fact superseded are grey and
hatched, with a red cross at their ``invalid_at``; open-ended facts end in an arrow.

matplotlib is imported only when a timeline is drawn, always on the Agg canvas and inside an ``rc_context`` (under
a lock), so global matplotlib state is left alone. The bytes are stable for a given graph and clock (no dates in
the metadata, fixed SVG ids), so they can be compared in tests.
"""

from __future__ import annotations

import io
import os
import threading
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tkg.errors import ConfigurationError, ValidationError
from tkg.models import Entity, Fact
from tkg.pictures.common import (
    Status,
    bounded_int,
    entities_by_id,
    fact_status,
    known_entity,
    one_line,
    writable_path,
    write_atomic,
)
from tkg.timeline import believed_invalid_at, fact_holds
from tkg.timeutil import iso, optional_utc

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from tkg.memory import Memory

__all__ = [
    "MAX_TIMELINE_FACTS",
    "TIMELINE_FORMATS",
    "RenderedTimeline",
    "TimelineBar",
    "TimelineLayout",
    "layout_timeline",
    "render_timeline",
    "timeline_layout",
]

#: The image formats :func:`render_timeline` writes.
TIMELINE_FORMATS = ("png", "svg")
#: Beyond this many facts a timeline stops being readable; the most recent ones are drawn, with a note.
MAX_TIMELINE_FACTS = 200

_INSTALL_HINT = 'pip install "tkg[pictures]"'
_LABEL_CHARS = 42
_TEXT_CHARS = 90
# The axis is padded within these, a day inside the dates Python holds (matplotlib rounds its ends to a day).
_FIRST = datetime(1, 1, 2, tzinfo=UTC)
_LAST = datetime(9999, 12, 30, tzinfo=UTC)
_SAFE_YEARS = (1000, 9000)  # an axis within these gets matplotlib's own date ticks


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
    # Padded within the dates Python holds: a fact of the first century (or of year 9999) is a fact too.
    x_min = low - min(pad, max(low - _FIRST, timedelta(0)))
    x_max = high + min(pad, max(_LAST - high, timedelta(0)))
    bars: list[TimelineBar] = []
    for row, f in enumerate(kept):
        outgoing = f.source_id == entity.id
        other_id = f.target_id if outgoing else f.source_id
        other = names.get(other_id)
        other_name = one_line(other.name, _LABEL_CHARS) if other is not None else f"? ({other_id})"
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
                label=one_line(label, _LABEL_CHARS + 24),
                text=one_line(f.fact, _TEXT_CHARS),
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
    max_facts = bounded_int(max_facts, "max_facts", 5_000)
    entity = known_entity(memory, entity_id, known_t)
    facts = memory.facts_about(entity.id)
    names = entities_by_id(memory, (i for f in facts for i in (f.source_id, f.target_id)))
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
    dpi = bounded_int(dpi, "dpi", 600)
    layout = timeline_layout(memory, entity_id, as_of=as_of, known_at=known_at, max_facts=max_facts)
    data, figure = _draw_timeline(layout, fmt, dpi)
    if target is not None:
        write_atomic(target, data)
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
    return chosen, writable_path(target)


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
    if _SAFE_YEARS[0] <= layout.x_min.year and layout.x_max.year <= _SAFE_YEARS[1]:
        locator = mdates.AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    else:  # matplotlib's date locator steps past year 9999 (or before 1) near the ends: ticks placed here
        ax.set_xticks([x0 + (x1 - x0) * i / 4 for i in range(5)])
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%Y-%m-%d"))
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
    name = one_line(layout.entity_name, 80)
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
