"""The episode-context reranker: rank episodes (conversation turns) with what the memory knows beyond their text.

Text alone (BM25, cosine) ranks each turn on its own. A memory also knows the order of its episodes and which
of them form a session, who spoke and which entities each episode mentions, and when each was said. This
reranker adds those signals to a normalised text score; see :class:`tkg.search_config.EpisodeContext` for the
formula and its weights.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta

from tkg.errors import ValidationError
from tkg.models import Entity, Episode, Kind, Record, Vector
from tkg.names import normalize_name
from tkg.ranking import normalized
from tkg.search_config import EpisodeContext, Method
from tkg.storage import Hit, Store
from tkg.temporal import add_months, midnight, resolve_time
from tkg.time_phrases import Unit, find_time_phrases
from tkg.timeline import DateRange, Scope

Loader = Callable[[Kind, Sequence[str]], list[Record | None]]

#: How far a session is followed on either side of a candidate (longer sessions are cut at this window).
SESSION_SCAN = 48

_WORD = re.compile(r"\w+", re.UNICODE)


def time_phrase(query: str) -> str | None:
    """The first time phrase in a query ("last week", "3 days ago", "May 2023"), if any.

    >>> time_phrase("What did I buy two weeks ago?")
    'two weeks ago'
    >>> time_phrase("What is my cat's name?") is None
    True
    """
    found = find_time_phrases(query)
    return found[0].text if found else None


#: How far either side of its date a phrase that is not a whole period reaches, by how coarse it is.
_HALF_WIDTH: dict[Unit, timedelta] = {
    "moment": timedelta(days=2),
    "day": timedelta(days=3),
    "weekend": timedelta(days=7),
    "week": timedelta(days=7),
    "month": timedelta(days=20),
    "season": timedelta(days=45),
    "year": timedelta(days=200),
    "decade": timedelta(days=2000),
}
_PERIOD_MONTHS: dict[Unit, int] = {"month": 1, "season": 3, "year": 12}


def time_span(query: str, reference: datetime, lag: timedelta) -> DateRange | None:
    """The stretch of time a query's time phrase names, resolved against ``reference``, widened by how precise
    the phrase is ("3 days ago": a few days; "two months ago": weeks; "in March", "last year": the whole month
    or year) and extended by ``lag`` afterwards (people talk about an event after it happens). ``None`` when the
    query names no time.

    >>> from datetime import UTC
    >>> span = time_span("What did I buy in March 2023?", datetime(2023, 6, 1, tzinfo=UTC), timedelta(days=3))
    >>> span.start.date(), span.end.date()
    (datetime.date(2023, 3, 1), datetime.date(2023, 4, 4))
    """
    found = find_time_phrases(query)
    if not found:
        return None
    phrase = found[0]
    when = resolve_time(phrase.text, reference)
    if when is None:
        return None
    said = phrase.expression
    try:
        if said.period:  # the whole month, season or year, from its first day ("mid-March": all of March)
            first = when.date().replace(day=1) if said.unit != "year" else when.date().replace(month=1, day=1)
            start, end = midnight(first), midnight(add_months(first, _PERIOD_MONTHS[said.unit]))
        else:
            start, end = when - _HALF_WIDTH[said.unit], when + _HALF_WIDTH[said.unit]
        return DateRange("reference_time", start, end + lag)
    except (OverflowError, ValueError, ValidationError):  # at the very edge of the calendar: no time signal
        return None


def rerank_episodes(
    store: Store,
    query: str,
    scope: Scope,
    config: EpisodeContext,
    lists: dict[Method, list[Hit]],
    limit: int,
    reference_time: datetime,
    load: Loader,
    vector: Vector,
) -> list[Hit]:
    weights = config.bm25_weight + config.cosine_weight or 1.0
    text_scores = {Method.BM25: config.bm25_weight, Method.COSINE: config.cosine_weight}
    base: dict[str, float] = {}
    for method, hits in lists.items():
        for key, value in normalized(hits).items():
            base[key] = base.get(key, 0.0) + text_scores.get(method, 1.0) * value / weights
    span = time_span(query, reference_time, config.time_window) if config.time_weight else None
    if span is not None:
        # The episodes of the named time join the candidates, the most similar first, even with no shared word.
        dated = replace(scope, filters=replace(scope.filters, dates=(*scope.filters.dates, span)))
        for hit in store.vector_search(Kind.EPISODE, vector, limit, dated):
            base.setdefault(hit.id, 0.0)
    if not base:
        return []
    episodes = {r.id: r for r in load(Kind.EPISODE, list(base)) if isinstance(r, Episode)}
    base = {k: v for k, v in base.items() if k in episodes}

    # Sessions: runs of a group's timeline whose consecutive reference times are within session_gap.
    session_of: dict[str, int] = {}
    runs: list[list[Episode]] = []
    for episode_id in sorted(base, key=lambda k: -base[k]):
        if episode_id in session_of:
            continue
        run = _session(store, episodes[episode_id], config)
        index = len(runs)
        runs.append(run)
        for member in run:
            session_of.setdefault(member.id, index)
            episodes.setdefault(member.id, member)

    # Neighbours of the best candidates join the candidates: the answer may sit next to the turn that matched.
    ranked = sorted(base, key=lambda k: -base[k])
    candidates = dict.fromkeys(ranked)
    neighbours: dict[str, list[str]] = {}
    for episode_id in list(candidates):
        run = runs[session_of[episode_id]]
        at = next(i for i, e in enumerate(run) if e.id == episode_id)
        near = [e.id for e in run[max(0, at - config.neighbours) : at] + run[at + 1 : at + 1 + config.neighbours]]
        neighbours[episode_id] = near
    for episode_id in ranked[:limit]:
        for other in neighbours[episode_id]:
            if other not in candidates:
                candidates[other] = None
                run = runs[session_of[episode_id]]
                at = next(i for i, e in enumerate(run) if e.id == other)
                session_of[other] = session_of[episode_id]
                lo, hi = max(0, at - config.neighbours), at + 1 + config.neighbours
                neighbours[other] = [e.id for e in run[lo:at] + run[at + 1 : hi]]
    visible = {k for k in candidates if scope.admits(episodes[k])}

    session_sum: dict[int, list[float]] = {}
    for episode_id, score in base.items():
        session_sum.setdefault(session_of[episode_id], []).append(score)
    session_score = {s: sum(sorted(v, reverse=True)[:3]) for s, v in session_sum.items()}
    best_session = max(session_score.values(), default=0.0) or 1.0

    linked = _entity_linked(store, query, scope, load) if config.entity_weight else set()

    scored: list[Hit] = []
    for episode_id in candidates:
        if episode_id not in visible:
            continue
        score = base.get(episode_id, 0.0)
        score += config.session_weight * session_score.get(session_of[episode_id], 0.0) / best_session
        lent = [base.get(n, 0.0) for n in neighbours.get(episode_id, ())]
        score += config.neighbour_weight * max(lent, default=0.0)
        if episode_id in linked:
            score += config.entity_weight
        if span is not None and span.admits(episodes[episode_id]):
            score += config.time_weight
        scored.append(Hit(episode_id, score))
    order = {k: i for i, k in enumerate(candidates)}
    return sorted(scored, key=lambda h: (-h.score, order[h.id]))


def _session(store: Store, episode: Episode, config: EpisodeContext) -> list[Episode]:
    window = store.episode_window(episode.id, SESSION_SCAN, SESSION_SCAN)
    at = next(i for i, e in enumerate(window) if e.id == episode.id)
    start = at
    while start > 0 and episode_gap(window[start - 1], window[start]) <= config.session_gap.total_seconds():
        start -= 1
    end = at
    while end + 1 < len(window) and episode_gap(window[end], window[end + 1]) <= config.session_gap.total_seconds():
        end += 1
    return window[start : end + 1]


def episode_gap(a: Episode, b: Episode) -> float:
    return abs((b.reference_time - a.reference_time).total_seconds())


def _words(text: str) -> str:
    return " ".join(_WORD.findall(normalize_name(text)))


def _entity_linked(store: Store, query: str, scope: Scope, load: Loader) -> set[str]:
    """Episodes that mention an entity whose name the query contains (as whole words)."""
    text = f" {_words(query)} "
    named = [
        e.id
        for e in load(Kind.ENTITY, [h.id for h in store.text_search(Kind.ENTITY, query, 20, scope)])
        if isinstance(e, Entity) and f" {_words(e.name)} " in text
    ]
    return {m.episode_id for m in store.mentions(entity_ids=named)} if named else set()
