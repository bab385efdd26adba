"""Mem0's scopes and metadata filters, as pure functions: which tkg group a (user, agent, run) scope is stored in,
which stored groups a read's scope covers, and whether a memory's metadata passes a filter.

A scope is stored as one group, ``mem0.u:<user>.a:<agent>.r:<run>`` with the parts given (each id escaped to
letters, digits and ``-``; ``_xx_`` stands for any other character). A read names some of the three ids and
covers every group whose parts include them: ``filters={"user_id": "alice"}`` reads what was added for alice
alone, with an agent, or in a run; ``{"user_id": "alice", "agent_id": "bot"}`` only what named both.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from tkg.errors import ValidationError

__all__ = ["ANY", "SCOPE_KEYS", "matches", "scope_group", "scope_of", "scopes_covered", "split_filters"]

#: Mem0's scope ids, in the order they appear in a group name, with their letters.
SCOPE_KEYS = {"user_id": "u", "agent_id": "a", "run_id": "r"}
#: A read's scope id that stands for any id of its kind, present (``filters={"agent_id": "*"}``), as in Mem0.
ANY = "*"
_PREFIX = "mem0"
_PLAIN = re.compile(r"[A-Za-z0-9-]")
_OPERATORS = frozenset({"eq", "ne", "in", "nin", "gt", "gte", "lt", "lte", "contains", "icontains"})
_ORDER = {"gt": operator.gt, "gte": operator.ge, "lt": operator.lt, "lte": operator.le}


def check_scope_id(value: Any, name: str) -> str | None:
    """A scope id as Mem0 takes it: None, or a value whose text (numbers allowed) is not empty and has no spaces."""
    if value is None:
        return None
    text = str(value).strip()
    if not text or any(c.isspace() for c in text):
        raise ValidationError(f"{name} must be a non-empty id without whitespace, got {value!r}")
    return text


def _escape(text: str) -> str:
    return "".join(c if _PLAIN.match(c) else f"_{ord(c):x}_" for c in text)


def _unescape(text: str) -> str:
    return re.sub(r"_([0-9a-f]+)_", lambda m: chr(int(m.group(1), 16)), text)


def scope_group(scope: Mapping[str, str]) -> str:
    """The group a memory added with these scope ids is stored in (at least one id)."""
    parts = [f"{letter}:{_escape(scope[key])}" for key, letter in SCOPE_KEYS.items() if scope.get(key)]
    if not parts:
        raise ValidationError("at least one of user_id, agent_id or run_id is required")
    group = ".".join([_PREFIX, *parts])
    if len(group) > 128:
        raise ValidationError(f"the scope ids are too long for one memory group ({len(group)} > 128 characters)")
    return group


def scope_of(group: str) -> dict[str, str] | None:
    """The scope ids of a group made by :func:`scope_group` (None for any other group)."""
    head, _, rest = group.partition(".")
    if head != _PREFIX or not rest:
        return None
    letters = {letter: key for key, letter in SCOPE_KEYS.items()}
    scope: dict[str, str] = {}
    for part in rest.split("."):
        letter, _, value = part.partition(":")
        if letter not in letters or not value:
            return None
        scope[letters[letter]] = _unescape(value)
    return scope


def scopes_covered(groups: Iterable[str], wanted: Mapping[str, str]) -> list[str]:
    """The groups whose scope includes every id in ``wanted``, sorted; an id :data:`ANY` (a read's ``"*"``) is
    any id of that kind, present."""
    found = []
    for group in groups:
        scope = scope_of(group)
        if scope is not None and all(
            key in scope if value == ANY else scope.get(key) == value for key, value in wanted.items()
        ):
            found.append(group)
    return sorted(found)


def split_filters(filters: Mapping[str, Any] | None) -> tuple[dict[str, str], dict[str, Any]]:
    """A Mem0 ``filters`` dict split into its scope ids (:data:`ANY` for ``"*"``) and its metadata conditions."""
    if filters is not None and not isinstance(filters, Mapping):
        raise ValidationError(f"filters must be a dict, got {type(filters).__name__}")
    scope: dict[str, str] = {}
    rest: dict[str, Any] = {}
    for key, value in (filters or {}).items():
        if key in SCOPE_KEYS:
            checked = check_scope_id(value, key)
            if checked is not None:
                scope[key] = checked
        else:
            rest[key] = value
    check_condition(rest)
    return scope, rest


def check_condition(condition: Mapping[str, Any]) -> None:
    """Refuse a malformed filter before any memory is read (an unknown operator, ``AND`` / ``OR`` / ``NOT`` not
    given a list of filters, ``in`` / ``nin`` not given a list), whether or not a memory would reach it."""
    for key, expected in condition.items():
        if key in ("AND", "OR", "NOT"):
            for inner in _conditions(expected, key):
                check_condition(inner)
        elif isinstance(expected, Mapping):
            _check_operators(expected)
            for op in ("in", "nin"):
                if op in expected:
                    _listed(expected[op], op)


def matches(item: Mapping[str, Any], condition: Mapping[str, Any]) -> bool:
    """Does a memory (its metadata, and ``actor_id`` / ``role``) pass a Mem0 filter? Keys are ANDed; ``AND``,
    ``OR`` and ``NOT`` take lists of filters; a value is matched exactly, ``"*"`` means present, and a dict
    applies operators (eq, ne, in, nin, gt, gte, lt, lte, contains, icontains)."""
    for key, expected in condition.items():
        if key == "AND":
            ok = all(matches(item, c) for c in _conditions(expected, key))
        elif key == "OR":
            ok = any(matches(item, c) for c in _conditions(expected, key))
        elif key == "NOT":
            ok = not any(matches(item, c) for c in _conditions(expected, key))
        else:
            ok = _value_matches(key in item, item.get(key), expected)
        if not ok:
            return False
    return True


def _conditions(value: Any, key: str) -> list[Mapping[str, Any]]:
    if not isinstance(value, list) or not value or not all(isinstance(c, Mapping) for c in value):
        raise ValidationError(f"filter {key} takes a list of filters (at least one), got {value!r}")
    return value


def _value_matches(present: bool, actual: Any, expected: Any) -> bool:
    if expected == "*":
        return present
    if not isinstance(expected, Mapping):
        return present and actual == expected
    _check_operators(expected)
    for op, operand in expected.items():
        if op == "ne":
            if present and actual == operand:
                return False
            continue
        if op == "nin":
            if present and _any_in(actual, _listed(operand, op)):
                return False
            continue
        if not present or not _compare(op, actual, operand):
            return False
    return True


def _check_operators(expected: Mapping[str, Any]) -> None:
    unknown = set(expected) - _OPERATORS
    if unknown:
        raise ValidationError(f"unknown filter operator(s) {sorted(unknown)}; use {sorted(_OPERATORS)}")


def _listed(operand: Any, op: str) -> list[Any]:
    if not isinstance(operand, list):
        raise ValidationError(f"filter operator {op} takes a list, got {operand!r}")
    return operand


def _compare(op: str, actual: Any, operand: Any) -> bool:
    if isinstance(actual, datetime):  # created_at / updated_at: against a date or time, ISO-8601 (UTC if no offset)
        operand = _as_time(operand)
        if operand is None:
            return False
    if op == "eq":
        return bool(actual == operand)
    if op == "in":
        return _any_in(actual, _listed(operand, op))
    if op in ("contains", "icontains"):
        if not isinstance(operand, str):
            return False
        if isinstance(actual, list):  # a list of tags: one of them is the operand
            return any(isinstance(a, str) and _same_text(op, a, operand) for a in actual)
        if not isinstance(actual, str):
            return False
        return operand in actual if op == "contains" else operand.casefold() in actual.casefold()
    try:
        return bool(_ORDER[op](actual, operand))
    except TypeError:  # e.g. a string against a number: not a match
        return False


def _any_in(actual: Any, listed: list[Any]) -> bool:
    """Is ``actual`` among ``listed`` -- or, a list itself (tags), is one of its values?"""
    if isinstance(actual, list):
        return any(a in listed for a in actual)
    return actual in listed


def _same_text(op: str, a: str, b: str) -> bool:
    return a == b if op == "contains" else a.casefold() == b.casefold()


def _as_time(value: Any) -> datetime | None:
    """A filter's date or time as an aware datetime (a date is its midnight; no offset: UTC), else None."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
