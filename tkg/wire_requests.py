"""What the agent-facing doors accept: strict request values, and the annotated types that publish them.

The MCP server (:mod:`tkg.mcp_server`) and the HTTP service (:mod:`tkg.http_service`) take their arguments through
these types and functions, so both refuse the same values with the same words:

* Timestamps must carry a UTC offset (a naive one is a :class:`~tkg.errors.TimestampError`, never silently UTC),
  limits are bounded, group and record ids are validated, episode text must be storable.
* The annotated types (:data:`Timestamp`, :data:`Limit`, :data:`GroupId`, ...) carry the descriptions both doors
  publish (the MCP tools' input schemas, the HTTP service's OpenAPI document).

What the doors answer is :mod:`tkg.wire_shapes`; whose records a caller may touch is :mod:`tkg.tenancy`.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, WithJsonSchema

from tkg.errors import ConfigurationError, TimestampError, ValidationError
from tkg.models import check_group_id
from tkg.timeutil import SUPPORTED_RANGE, to_aware, to_utc

__all__ = [
    "DEFAULT_CONTEXT_CHARS",
    "DEFAULT_LIMIT",
    "DEFAULT_PAGE",
    "MAX_CONTEXT_CHARS",
    "MAX_FACTS",
    "MAX_LIMIT",
    "MAX_PAGE",
    "SEARCH_TARGETS",
    "AsOf",
    "FactIn",
    "GroupId",
    "GroupIds",
    "IncludeInvalidated",
    "KnownAt",
    "Limit",
    "Query",
    "RecordId",
    "ReferenceTimestamp",
    "Source",
    "Timestamp",
    "allowed_groups",
    "check_content",
    "describe_errors",
    "parse_fact",
    "parse_groups",
    "parse_limit",
    "parse_time",
]

#: Results per kind a search returns when the caller names no limit, and the most one call may ask for.
DEFAULT_LIMIT = 10
MAX_LIMIT = 100
#: Episodes a listing returns by default, and the most one page may hold.
DEFAULT_PAGE = 20
MAX_PAGE = 200
#: The context string's default budget in characters, and the largest budget a caller may ask for.
DEFAULT_CONTEXT_CHARS = 4_000
MAX_CONTEXT_CHARS = 200_000
#: Structured facts one call may add (they become one JSON episode, itself bounded by max_episode_chars).
MAX_FACTS = 1_000

_GROUP_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$"
_ID_PATTERN = r"^[A-Za-z0-9_.:\-]{1,128}$"
_TIME_EXAMPLE = "2024-05-01T12:00:00Z"
#: The kinds of record a search may return.
SEARCH_TARGETS = ("facts", "entities", "episodes", "communities")


# ----------------------------------------------------------------------------------------------------------
# parsing


def parse_time(value: object, what: str = "timestamp", *, keep_offset: bool = False) -> datetime | None:
    """A request timestamp as aware UTC (``keep_offset``: in its own offset, the speaker's clock, for a reference
    time: "yesterday" is read on the speaker's calendar); ``None`` stays ``None``.

    Only ISO-8601 with a UTC offset is accepted (``Z`` or ``+02:00``): a naive timestamp or a bare date is refused
    with a :class:`~tkg.errors.TimestampError` that says how to fix it, because guessing UTC would silently move
    facts by hours for callers in other zones.

    >>> parse_time("2024-05-01T14:00:00+02:00", "as_of").isoformat()
    '2024-05-01T12:00:00+00:00'
    >>> parse_time("2024-05-01T12:00:00", "as_of")
    Traceback (most recent call last):
    ...
    tkg.errors.TimestampError: as_of '2024-05-01T12:00:00' has no UTC offset; add one, e.g. 2024-05-01T12:00:00Z
    """
    if value is None:
        return None
    if isinstance(value, datetime):
        return to_aware(value, what) if keep_offset else to_utc(value, what)
    if not isinstance(value, str):
        raise TimestampError(
            f"{what} must be an ISO-8601 string with a UTC offset, e.g. {_TIME_EXAMPLE}; got {type(value).__name__}"
        )
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise TimestampError(f"{what} {value!r} is not an ISO-8601 timestamp; use e.g. {_TIME_EXAMPLE}") from None
    if parsed.tzinfo is None or parsed.utcoffset() is None:
        example = text + "Z" if "T" in text else f"{text}T00:00:00Z"
        raise TimestampError(f"{what} {value!r} has no UTC offset; add one, e.g. {example}")
    try:
        return to_aware(parsed, what) if keep_offset else to_utc(parsed, what)
    except TimestampError:
        raise TimestampError(f"{what} {value!r} is outside the supported range ({SUPPORTED_RANGE})") from None


def parse_limit(value: object, what: str = "limit", *, default: int, maximum: int, minimum: int = 1) -> int:
    """A bounded integer request value (``None``: the default).

    >>> parse_limit(None, default=10, maximum=100)
    10
    >>> parse_limit(500, default=10, maximum=100)
    Traceback (most recent call last):
    ...
    tkg.errors.ValidationError: limit must be an integer from 1 to 100, got 500
    """
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValidationError(f"{what} must be an integer from {minimum} to {maximum}, got {value!r}")
    return value


def parse_groups(value: object) -> list[str] | None:
    """A list of group ids (a single string is one group; ``None``: no narrowing). Each is validated."""
    if value is None:
        return None
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise ValidationError(f"group_ids must be a non-empty list of group ids, got {value!r}")
    return list(dict.fromkeys(check_group_id(g) for g in items))


def allowed_groups(groups: Collection[str] | None) -> list[str] | None:
    """The groups a door's caller may use, validated, in the order given (``None``: every group). A single string
    is refused: as a collection it is its characters, so ``"ab"`` would allow groups ``a`` and ``b``."""
    if groups is None:
        return None
    if isinstance(groups, str):
        raise ConfigurationError(f"groups must be a collection of group ids, not one string; use [{groups!r}]")
    return [check_group_id(g) for g in groups]


def check_content(content: object, what: str = "content") -> None:
    """Refuse episode content that is not storable text: lone UTF-16 surrogates (JSON allows ``\\ud800``, UTF-8
    does not), and for JSON documents NaN or Infinity (not JSON at all)."""
    if isinstance(content, str):
        text = content
    else:
        try:
            text = json.dumps(content, ensure_ascii=False, allow_nan=False)
        except ValueError as exc:  # NaN or Infinity, or an integer of more digits than Python writes out
            if "digits" in str(exc):
                raise ValidationError(f"{what} holds an integer too long to write out: {exc}") from None
            raise ValidationError(f"{what} holds NaN or Infinity, which JSON does not have") from None
        except (TypeError, RecursionError):
            raise ValidationError(f"{what} is not a JSON value tkg can store") from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(f"{what} holds a lone surrogate (\\ud800-\\udfff), which is not text") from None


def describe_errors(errors: Sequence[Mapping[str, Any]], *, skip: Collection[str] = ("body",)) -> str:
    """pydantic's validation errors as one line a person or an agent can act on."""
    parts = []
    for error in errors[:5]:
        where = ".".join(str(p) for p in error.get("loc", ()) if p not in skip)
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        # tkg's own messages already name the field ("as_of '...' has no UTC offset"): do not say it twice.
        named = where and message.startswith(f"{where.rsplit('.', 1)[-1]} ")
        parts.append(f"{where}: {message}" if where and not named else message)
    more = f" (and {len(errors) - 5} more)" if len(errors) > 5 else ""
    return "; ".join(parts) + more


# ----------------------------------------------------------------------------------------------------------
# annotated types


def _time_value(value: Any, info: ValidationInfo) -> Any:
    # TimestampError is a ValueError, so pydantic reports its message as the field's error.
    return parse_time(value, info.field_name or "timestamp")


def _reference_value(value: Any, info: ValidationInfo) -> Any:
    return parse_time(value, info.field_name or "reference_time", keep_offset=True)


_TIME_SCHEMA = {"type": "string", "format": "date-time", "examples": [_TIME_EXAMPLE]}

#: An ISO-8601 timestamp with a UTC offset (``Z`` or ``+hh:mm``); naive timestamps are refused.
Timestamp = Annotated[
    datetime | None,
    BeforeValidator(_time_value),
    WithJsonSchema({"anyOf": [_TIME_SCHEMA, {"type": "null"}]}),
]
#: A :data:`Timestamp` kept in its own offset: an episode's reference time, whose calendar relative dates use.
ReferenceTimestamp = Annotated[
    datetime | None,
    BeforeValidator(_reference_value),
    WithJsonSchema({"anyOf": [_TIME_SCHEMA, {"type": "null"}]}),
]
GroupId = Annotated[
    str,
    Field(
        pattern=_GROUP_PATTERN,
        description="A group (tenant) id: 1-128 characters from letters, digits and _ . : - "
        "(starting with a letter or digit).",
    ),
]
RecordId = Annotated[str, Field(pattern=_ID_PATTERN, description="A record id as returned by tkg.")]
Query = Annotated[
    str,
    Field(min_length=1, max_length=10_000, description="What to look for, in natural language."),
]
GroupIds = Annotated[
    list[GroupId] | None,
    Field(
        min_length=1,
        max_length=100,
        description="Groups to search; omitted or null: every group this caller may use.",
    ),
]
Limit = Annotated[
    int, Field(ge=1, le=MAX_LIMIT, strict=True, description=f"Results to return, best first (1-{MAX_LIMIT}).")
]
AsOf = Annotated[
    Timestamp,
    Field(
        description="Valid time: return what held in the world at this moment (ISO-8601 with offset). "
        "Omitted: what holds now.",
    ),
]
KnownAt = Annotated[
    Timestamp,
    Field(
        description="Transaction time: answer as the memory stood at this moment, ignoring what it learnt later "
        "(ISO-8601 with offset). Omitted: everything known now.",
    ),
]
IncludeInvalidated = Annotated[
    bool, Field(strict=True, description="Also return facts that have ended or were superseded (the history).")
]
#: What an episode's content is (the values of tkg.models.EpisodeSource).
Source = Literal["message", "text", "json"]


# ----------------------------------------------------------------------------------------------------------
# structured facts


class FactIn(BaseModel):
    """A structured fact to add with no LLM."""

    model_config = ConfigDict(extra="forbid")

    subject: str = Field(min_length=1, max_length=500, description="The subject entity's name, e.g. Alice.")
    relation: str = Field(
        min_length=1, max_length=100, description="The relation, e.g. WORKS_AT or 'works at' (normalised)."
    )
    object: str = Field(min_length=1, max_length=500, description="The object entity's name, e.g. Acme.")
    fact: str | None = Field(
        None, max_length=2_000, description="The fact as a sentence; default: built from the three parts."
    )
    valid_at: Timestamp = Field(
        None, description="When it started to hold (ISO-8601 with offset); default: the reference time."
    )
    invalid_at: Timestamp = Field(None, description="When it stopped holding (ISO-8601 with offset); default: open.")
    subject_label: str = Field("Entity", min_length=1, max_length=100, description="Type of the subject, e.g. Person.")
    object_label: str = Field(
        "Entity", min_length=1, max_length=100, description="Type of the object, e.g. Organization."
    )


def parse_fact(data: object, what: str) -> FactIn:
    """One structured fact of a request (a mapping, or already a :class:`FactIn`), validated; ``what`` names it in
    the error, e.g. ``facts[2]``."""
    if isinstance(data, FactIn):
        return data
    if not isinstance(data, Mapping):
        raise ValidationError(f"{what} must be an object with subject, relation and object")
    try:
        return FactIn.model_validate(data)
    except pydantic.ValidationError as exc:
        raise ValidationError(f"{what}: {describe_errors(exc.errors())}") from None
