"""The episode-context reranker: rank episodes (conversation turns) with what the memory knows beyond their text.

Text alone (BM25, cosine) ranks each turn on its own. A memory also knows the order of its episodes and which
of them form a session, who spoke and which entities each episode mentions, and when each was said. This
reranker adds those signals to a normalised text score; see :class:`tkg.search_config.EpisodeContext` for the
formula and its weights.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from functools import lru_cache

import numpy as np

from tkg.errors import ValidationError
from tkg.models import Entity, Episode, Kind, Record, Vector
from tkg.names import normalize_name
from tkg.ranking import normalized
from tkg.search_config import EpisodeContext, Method
from tkg.storage import Hit, Store
from tkg.temporal import add_months, midnight, resolve_time
from tkg.time_phrases import Unit, find_time_phrases
from tkg.timeline import DateRange, Scope
from tkg.tokens import K1, B, tokenize

Loader = Callable[[Kind, Sequence[str]], list[Record | None]]

#: How far a session is followed on either side of a candidate (longer sessions are cut at this window).
SESSION_SCAN = 48
#: A view of the past scans further on a side where episodes it does not see (recorded later) crowd the scan, up
#: to this many episodes.
_SCAN_MOST = SESSION_SCAN * 64

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
    if config.expansion_terms and base:
        _expand(store, query, scope, config, base, limit, load, weights)
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
    unbounded: set[int] = set()  # runs whose ends lie beyond the scan: no session evidence
    for episode_id in sorted(base, key=lambda k: -base[k]):
        if episode_id in session_of:
            continue
        run, bounded = _session(store, episodes[episode_id], config, scope)
        index = len(runs)
        runs.append(run)
        if not bounded:
            unbounded.add(index)
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

    weighed = {session_of[k] for k in base} - unbounded
    if not config.session_weight or not weighed:
        session_score: dict[int, float] = {}
    elif config.session_document:
        session_score = _session_documents(query, vector, runs, weighed)
    else:
        session_sum: dict[int, list[float]] = {}
        for episode_id, score in base.items():
            if session_of[episode_id] in weighed:
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
    ranked_hits = sorted(scored, key=lambda h: (-h.score, order[h.id]))
    if config.session_decay:
        seen: Counter[int] = Counter()
        decayed = []
        for hit in ranked_hits:
            session = session_of[hit.id]
            decayed.append(Hit(hit.id, hit.score - config.session_decay * seen[session]))
            seen[session] += 1
        ranked_hits = sorted(decayed, key=lambda h: (-h.score, order[h.id]))
    return ranked_hits


@lru_cache(maxsize=32_768)
def _terms(text: str) -> tuple[tuple[str, int], ...]:
    """An episode's BM25 terms with their counts (cached: the same episodes come back query after query)."""
    return tuple(Counter(tokenize(text)).items())


def _expand(
    store: Store,
    query: str,
    scope: Scope,
    config: EpisodeContext,
    base: dict[str, float],
    limit: int,
    load: Loader,
    weights: float,
) -> None:
    """Pseudo-relevance feedback: the terms shared by at least two of the best candidates and absent from the
    query, searched with BM25; what they find gains ``expansion_weight`` times its normalised score, scaled like
    the base scores (divided by ``weights``), in place."""
    top = sorted(base, key=lambda k: -base[k])[: config.expansion_docs]
    asked = set(tokenize(query))
    df: Counter[str] = Counter()
    tf: Counter[str] = Counter()
    for record in load(Kind.EPISODE, top):
        if isinstance(record, Episode):
            for term, count in _terms(record.content):
                if term not in asked and not term.isdigit():
                    df[term] += 1
                    tf[term] += count
    shared = sorted((t for t in df if df[t] >= 2), key=lambda t: (-df[t], -tf[t], t))[: config.expansion_terms]
    if not shared:
        return
    for key, value in normalized(store.text_search(Kind.EPISODE, " ".join(shared), limit, scope)).items():
        base[key] = base.get(key, 0.0) + config.expansion_weight * value / weights


def _session_documents(
    query: str, vector: Vector, runs: Sequence[Sequence[Episode]], wanted: set[int]
) -> dict[int, float]:
    """Each wanted session scored as one document: the cosine of its episodes' mean vector with the query's, and
    BM25 of the query over the sessions as documents (statistics over these sessions), each min-max normalised
    over the sessions and averaged."""
    sessions = sorted(wanted)
    asked = list(dict.fromkeys(tokenize(query)))
    documents = [_document_terms(tuple(e.content for e in runs[index])) for index in sessions]
    mean_length = sum(length for _, length in documents) / len(documents) if documents else 0.0
    bm25 = [0.0] * len(sessions)
    for term in asked:
        df = sum(1 for counts, _ in documents if term in counts)
        if not df:
            continue
        idf = math.log(1 + (len(documents) - df + 0.5) / (df + 0.5))
        for i, (counts, length) in enumerate(documents):
            tf = counts.get(term, 0)
            if tf:
                bm25[i] += idf * tf / (K1 * (1 - B + B * length / (mean_length or 1.0)) + tf)
    # Mean vectors: every member's vector stacked once (grouped by session), summed per session, one product.
    rows: list[Vector] = []
    starts: list[int] = []
    scored: list[int] = []
    for i, index in enumerate(sessions):
        members = [e.embedding for e in runs[index] if e.embedding is not None]
        if members:
            starts.append(len(rows))
            scored.append(i)
            rows.extend(members)
    cosine = [0.0] * len(sessions)
    if rows:
        sums = np.add.reduceat(np.stack(rows).astype(np.float64), starts, axis=0)
        norms = np.linalg.norm(sums, axis=1)
        dots = sums @ np.asarray(vector, dtype=np.float64)
        for i, dot, norm in zip(scored, dots.tolist(), norms.tolist(), strict=True):
            cosine[i] = dot / norm if norm else 0.0
    text = normalized([Hit(str(i), v) for i, v in enumerate(bm25)])
    dense = normalized([Hit(str(i), v) for i, v in enumerate(cosine)])
    return {index: (text[str(i)] + dense[str(i)]) / 2 for i, index in enumerate(sessions)}


@lru_cache(maxsize=4096)
def _document_terms(contents: tuple[str, ...]) -> tuple[dict[str, int], int]:
    """The BM25 terms of a session (its episodes' contents as one document) and its length; shared, not to be
    changed by callers."""
    counts: Counter[str] = Counter()
    for text in contents:
        for term, count in _terms(text):
            counts[term] += count
    return dict(counts), sum(counts.values())


def _session(store: Store, episode: Episode, config: EpisodeContext, scope: Scope) -> tuple[list[Episode], bool]:
    """The episode's session among the episodes the view sees (as far as :data:`SESSION_SCAN` reaches on either
    side), and whether both of its ends were seen. A session that runs past the scan is not one the reranker can
    weigh as a unit: episodes stored without times of their own (all stamped within seconds when imported) form
    one endless "session". An episode the view does not see (recorded after ``known_at``, said after ``as_of``)
    joins no session: a view of the past ranks as the memory of then would."""
    sees = scope.unfiltered().admits
    before = after = SESSION_SCAN
    while True:  # SESSION_SCAN seen episodes on each side: a side crowded by unseen ones is scanned further
        scanned = store.episode_window(episode.id, before, after)
        first = next(i for i, e in enumerate(scanned) if e.id == episode.id)
        began, finished = first < before, len(scanned) - 1 - first < after  # the timeline's ends reached
        window = [e for e in scanned if e.id == episode.id or sees(e)]
        at = next(i for i, e in enumerate(window) if e.id == episode.id)
        more_before = not began and at < SESSION_SCAN
        more_after = not finished and len(window) - 1 - at < SESSION_SCAN
        if not (more_before or more_after) or max(before, after) >= _SCAN_MOST:
            break
        before, after = before * (4 if more_before else 1), after * (4 if more_after else 1)
    # As far as SESSION_SCAN seen episodes reach, and an end known where fewer were found: as a view of the
    # memory as it stood then scans.
    window, at = window[max(0, at - SESSION_SCAN) : at + SESSION_SCAN + 1], min(at, SESSION_SCAN)
    began, finished = began and at < SESSION_SCAN, finished and len(window) - 1 - at < SESSION_SCAN
    start = at
    while start > 0 and episode_gap(window[start - 1], window[start]) <= config.session_gap.total_seconds():
        start -= 1
    end = at
    while end + 1 < len(window) and episode_gap(window[end], window[end + 1]) <= config.session_gap.total_seconds():
        end += 1
    # An end is seen when the walk stopped at a gap, or at the start or end of the group's timeline.
    seen = (start > 0 or began) and (end + 1 < len(window) or finished)
    return window[start : end + 1], seen


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
