"""A :class:`tkg.timeline.Scope` as a SQL ``WHERE`` fragment: the same rules as ``Scope.admits``, in SQL.

Every value goes in as a named query parameter; only column names (constants of this module) are spliced into
the text. The fragment refers to the kind's table unqualified, so it fits any ``SELECT ... FROM <table>``.
"""

from __future__ import annotations

from typing import Any

from tkg.models import Kind
from tkg.revisions import ENDED_BY_HAND, REVISIONS
from tkg.timeline import DATE_FIELDS, Filters, Scope

from .schema import TABLES

#: Columns that may hold NULL (a missing timestamp); the others always have a value.
_NULLABLE = {"valid_at", "invalid_at", "expired_at"}


def _earlier(field: str) -> str:
    """A field (``invalid_at``, ``expired_at``) of the earlier supersession (:mod:`tkg.revisions`) believed at
    ``s_known`` (the last learnt by then, if not replaced by then), NULL when there is none."""
    return (
        f"CASE WHEN position('{REVISIONS}' in attributes::text) = 0 THEN NULL ELSE (SELECT CASE WHEN %(s_known)s < "
        f"(r.value->>'until')::timestamptz THEN (r.value->>'{field}')::timestamptz END FROM json_array_elements("
        f"attributes->'{REVISIONS}') WITH ORDINALITY AS r(value, n) WHERE (r.value->>'expired_at')::timestamptz <= "
        "%(s_known)s ORDER BY r.n DESC LIMIT 1) END"
    )


#: A fact's end as believed at ``s_known`` from its earlier supersessions: the end of the one believed then.
_EARLIER_END = _earlier("invalid_at")
#: The ends given by hand recorded after ``s_known``, oldest first (a FROM clause).
_LATER_BY_HAND = (
    f"FROM json_array_elements(attributes->'{ENDED_BY_HAND}') WITH ORDINALITY AS h(value, n) "
    "WHERE (h.value->>'recorded_at')::timestamptz > %(s_known)s"
)


#: The own end the record holds now (``prior_invalid_at`` once it is expired).
_OWN_END = "CASE WHEN expired_at IS NULL THEN invalid_at ELSE prior_invalid_at END"
#: A fact's own end as it was at ``s_known`` (:func:`tkg.revisions.own_end_at`): before an end given by hand was
#: recorded, the end it replaced; the own end the record holds otherwise. A fact never ended by hand is told by a
#: look at its attributes' text, before they are parsed (the cost of parsing every candidate's attributes showed
#: in search times).
_OWN_END_AT = (
    f"CASE WHEN position('{ENDED_BY_HAND}' in attributes::text) = 0 THEN {_OWN_END} "
    f"WHEN EXISTS (SELECT 1 {_LATER_BY_HAND}) THEN (SELECT (h.value->>'previous_end')::timestamptz "
    f"{_LATER_BY_HAND} ORDER BY h.n LIMIT 1) ELSE {_OWN_END} END"
)


#: A fact's end as believed at ``s_known``: :func:`tkg.revisions.believed_end`.
_BELIEVED_END = (
    f"CASE WHEN expired_at <= %(s_known)s THEN invalid_at ELSE COALESCE(({_EARLIER_END}), {_OWN_END_AT}) END"
)
#: When a fact's supersession was learnt, as known at ``s_known`` (NULL: none known then), as
#: :func:`tkg.revisions.as_known` shows it: the record's once learnt by then, else the earlier one believed then.
_BELIEVED_EXPIRY = f"CASE WHEN expired_at <= %(s_known)s THEN expired_at ELSE ({_earlier('expired_at')}) END"
#: The columns a date filter reads of a fact as the view knows it (tkg.timeline.Scope.shown); the others as stored.
_AS_KNOWN = {"invalid_at": f"({_BELIEVED_END})", "expired_at": f"({_BELIEVED_EXPIRY})"}


def scope_where(kind: Kind, scope: Scope | None, params: dict[str, Any]) -> str:
    """The conditions ``scope`` puts on records of ``kind`` (``TRUE`` when none); adds its values to ``params``."""
    if scope is None:
        return "TRUE"
    parts: list[str] = []
    if scope.group_ids is not None:
        params["s_groups"] = sorted(scope.group_ids)
        parts.append("group_id = ANY(%(s_groups)s)")
    params["s_known"] = scope.known_at
    parts.append("created_at <= %(s_known)s")
    if kind is Kind.FACT and scope.as_of is not None:
        params["s_at"] = scope.as_of
        # A supersession learnt after known_at (expired_at > known_at) is not yet known: the fact ends where it
        # ended then -- the earlier supersession believed then (tkg.revisions, in the attributes), else its own
        # end as it was then (an end given by hand later not given yet). tkg.revisions.believed_end is the rule.
        parts.append(f"(valid_at IS NULL OR valid_at <= %(s_at)s) AND COALESCE(%(s_at)s < {_BELIEVED_END}, TRUE)")
    elif kind is Kind.EPISODE and scope.explicit_as_of and scope.as_of is not None:
        params["s_at"] = scope.as_of
        parts.append("reference_time <= %(s_at)s")
    if scope.filters:
        parts.extend(_filters(kind, scope.filters, params))
    return " AND ".join(parts)


def index_bounds(kind: Kind, scope: Scope | None) -> bool:
    """Whether an index reads only the records ``scope`` admits, so that a few admitted among many are found
    without reading the others: episodes as of a time asked for, in the groups asked (``episodes_timeline``, by
    group then reference time). The other conditions (validity, creation) have no index."""
    return (
        scope is not None
        and kind is Kind.EPISODE
        and scope.explicit_as_of
        and scope.as_of is not None
        and scope.group_ids is not None
    )


def _filters(kind: Kind, filters: Filters, params: dict[str, Any]) -> list[str]:
    parts: list[str] = []
    if filters.labels is not None and kind is Kind.ENTITY:
        params["f_labels"] = sorted(filters.labels)
        parts.append("labels && %(f_labels)s::text[]")
    if filters.relations is not None and kind is Kind.FACT:
        params["f_relations"] = sorted(filters.relations)
        parts.append("relation = ANY(%(f_relations)s)")
    record_type = TABLES[kind].record
    for i, rng in enumerate(filters.dates):
        if record_type not in DATE_FIELDS[rng.field]:
            continue
        column = rng.field  # one of DATE_FIELDS' keys, which are also our column names
        if kind is Kind.FACT:
            column = _AS_KNOWN.get(column, column)
        inside: list[str] = []
        if rng.start is not None:
            params[f"d{i}_start"] = rng.start
            inside.append(f"{column} >= %(d{i}_start)s")
        if rng.end is not None:
            params[f"d{i}_end"] = rng.end
            inside.append(f"{column} < %(d{i}_end)s")
        condition = " AND ".join(inside) or "TRUE"
        if rng.field in _NULLABLE:
            missing = "TRUE" if rng.include_missing else "FALSE"
            condition = f"(({column} IS NOT NULL AND {condition}) OR ({column} IS NULL AND {missing}))"
        parts.append(condition)
    return parts
