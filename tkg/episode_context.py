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
from tkg.temporal import resolve_time
from tkg.timeline import DateRange, Scope

Loader = Callable[[Kind, Sequence[str]], list[Record | None]]

#: How far a session is followed on either side of a candidate (longer sessions are cut at this window).
SESSION_SCAN = 48

_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
_DAYS = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_NUMBER = r"\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|a few|a couple of"
_TIME_PHRASE = re.compile(
    rf"\b(yesterday|today|last (?:night|week|weekend|month|year|{_DAYS})|this (?:week|weekend|month|year)"
    rf"|(?:{_NUMBER}) (?:day|week|month|year)s? ago"
    rf"|(?:(?:early|late|mid) )?(?:{_MONTHS})(?: \d{{1,2}}(?:st|nd|rd|th)?)?(?:,? \d{{4}})?"
    rf"|\d{{1,2}}(?:st|nd|rd|th)? (?:of )?(?:{_MONTHS})(?:,? \d{{4}})?)\b",
    re.IGNORECASE,
)


_WORD = re.compile(r"\w+", re.UNICODE)


def time_phrase(query: str) -> str | None:
    """The first time phrase in a query ("last week", "3 days ago", "May 2023"), if any.

    >>> time_phrase("What did I buy two weeks ago?")
    'two weeks ago'
    >>> time_phrase("What is my cat's name?") is None
    True
    """
    match = _TIME_PHRASE.search(query)
    return match.group(1) if match else None


_SPREAD = [  # how wide a time phrase is, by its wording: (pattern, half-width)
    (re.compile(r"\b(yesterday|today|last night|days? ago)\b", re.I), timedelta(days=2)),
    (re.compile(r"\b(weeks? ago|week|weekend)\b", re.I), timedelta(days=7)),
    (re.compile(r"\b(months? ago|month)\b", re.I), timedelta(days=20)),
    (re.compile(r"\b(years? ago|year)\b", re.I), timedelta(days=200)),
    (re.compile(r"\d{1,2}(?:st|nd|rd|th)?\b(?! ?\d{4}$)|\b\d{4}-\d{2}-\d{2}\b", re.I), timedelta(days=3)),
]
_MONTH_ONLY = re.compile(rf"^(?:(?:early|late|mid) )?(?:{_MONTHS})(?:,? \d{{4}})?$", re.I)


def time_span(query: str, reference: datetime, lag: timedelta) -> DateRange | None:
    """The stretch of time a query's time phrase names, resolved against ``reference``, widened by how precise
    the phrase is ("3 days ago": a few days; "last month": weeks; "in March": the month) and extended by ``lag``
    afterwards (people talk about an event after it happens). ``None`` when the query names no time.

    >>> from datetime import UTC
    >>> span = time_span("What did I buy in March 2023?", datetime(2023, 6, 1, tzinfo=UTC), timedelta(days=3))
    >>> span.start.date(), span.end.date()
    (datetime.date(2023, 3, 1), datetime.date(2023, 4, 4))
    """
    phrase = time_phrase(query)
    if phrase is None:
        return None
    when = resolve_time(phrase, reference)
    if when is None:
        return None
    try:
        if _MONTH_ONLY.match(phrase):
            start = when.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            end = (start + timedelta(days=32)).replace(day=1)
        else:
            half = next((width for pattern, width in _SPREAD if pattern.search(phrase)), timedelta(days=3))
            start, end = when - half, when + half
        return DateRange("reference_time", start, end + lag)
    except (OverflowError, ValidationError):  # at the very edge of the calendar: no time signal
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
