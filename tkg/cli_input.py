"""What the user gives the ``tkg`` command line: JSONL input files (message lines and fact lines), validated whole
before anything is written (:mod:`tkg.cli_ingest` adds them), and times given as options.

A message line is ``{"content": ...}`` or ``{"speaker": ..., "text": ...}`` with optional ``reference_time``,
``source``, ``source_description``, ``name`` and ``id`` (the episode's id); a fact line is ``{"subject": ...,
"relation": ..., "object": ...}`` with optional ``fact``, ``valid_at``, ``invalid_at``, ``subject_label`` and
``object_label``. A bad line is an error ``NAME:LINE: problem``.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tkg.config import MemoryConfig
from tkg.errors import TkgError, ValidationError
from tkg.inputs import FactInput
from tkg.models import EpisodeSource, check_id, check_text, loads_checked
from tkg.timeutil import iso, to_aware, to_utc

__all__ = [
    "CSV_COLUMNS",
    "KINDS",
    "FactLines",
    "Item",
    "MessageLine",
    "cli_time",
    "parse_csv",
    "parse_input",
    "parse_jsonl",
    "read_input",
]

#: The ``--kind`` choices: what the lines of an input file are (auto: decided per line).
KINDS = ("auto", "messages", "facts")

_MESSAGE_KEYS = frozenset(
    {"content", "speaker", "text", "reference_time", "source", "source_description", "name", "id"}
)
_FACT_KEYS = frozenset(
    {"subject", "relation", "object", "fact", "valid_at", "invalid_at", "subject_label", "object_label"}
)
_SOURCES = tuple(source.value for source in EpisodeSource)


# ----------------------------------------------------------------------------------------------------------
# JSONL input


@dataclass(frozen=True, slots=True)
class MessageLine:
    """One episode to add, from one line of the input."""

    line: int
    content: Any
    source: str
    reference_time: datetime | None
    source_description: str
    name: str
    episode_id: str | None = None


@dataclass(slots=True)
class FactLines:
    """Consecutive fact lines, ingested together by one :meth:`Memory.add_facts` call."""

    first: int
    last: int
    facts: list[FactInput] = field(default_factory=list)
    chars: int = 0


Item = MessageLine | FactLines


def read_input(path: Path) -> str:
    """The text of an input file, with errors a user can act on."""
    try:
        return path.read_text(encoding="utf-8-sig")  # a byte order mark first (Excel's "CSV UTF-8") is dropped
    except FileNotFoundError:
        raise ValidationError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ValidationError(f"{path}: is a directory, not a JSONL file") from None
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ValidationError(f"{path}: cannot read it: {exc.strerror or exc}") from None


def parse_jsonl(name: str, text: str, kind: str = "auto", max_chars: int | None = None) -> list[Item]:
    """Validate every line of a JSONL document; raise ``NAME:LINE: problem`` at the first bad one.

    Blank lines are skipped. Runs of consecutive fact lines are grouped into batches whose JSON stays well
    under ``max_chars`` (the episode size limit), since each batch becomes one JSON episode.
    """
    max_chars = MemoryConfig().max_episode_chars if max_chars is None else max_chars
    items: list[Item] = []
    # lines end at "\n" alone: splitlines() also splits at U+2028, U+0085 and the like, which JSON strings may hold
    for number, raw in enumerate(text.split("\n"), start=1):
        if not raw.strip():
            continue
        try:
            record = _json_object(raw)
            line_kind = _detect_kind(record) if kind == "auto" else kind
            if line_kind == "facts":
                _append_fact(items, number, _parse_fact(record), len(raw), max_chars // 2)
            else:
                items.append(_parse_message(record, number, max_chars))
        except TkgError as exc:
            raise ValidationError(f"{name}:{number}: {exc}") from None
    if not items:
        raise ValidationError(f"{name}: holds no records (every line is blank)")
    return items


#: The columns of a facts CSV (any order; names case-insensitive) and the other names they go by: tkg's own
#: ``tkg export --format csv`` and edge lists with source/target columns read as they are.
CSV_COLUMNS = {
    "subject": ("subject", "source"),
    "relation": ("relation", "type", ":type"),
    "object": ("object", "target"),
    "fact": ("fact",),
    "valid_at": ("valid_at",),
    "invalid_at": ("invalid_at",),
    "subject_label": ("subject_label", "source_label"),
    "object_label": ("object_label", "target_label"),
}


def parse_csv(name: str, text: str, max_chars: int | None = None) -> list[Item]:
    """Validate every row of a CSV of facts (a header row, then one fact per row; see :data:`CSV_COLUMNS`; other
    columns are ignored, empty cells are absent values); raise ``NAME:LINE: problem`` at the first bad one.

    Only the valid times come in: a fact's transaction times are those of this import (tkg's lossless format
    is the JSONL of ``tkg export``)."""
    max_chars = MemoryConfig().max_episode_chars if max_chars is None else max_chars
    reader = csv.reader(io.StringIO(text))
    try:
        header = [cell.strip().lower() for cell in next(reader)]
    except StopIteration:
        raise ValidationError(f"{name}: is empty (a facts CSV needs a header row)") from None
    except csv.Error as exc:
        raise ValidationError(f"{name}:1: not CSV: {exc}") from None
    where = {key: next((header.index(n) for n in names if n in header), None) for key, names in CSV_COLUMNS.items()}
    missing = [key for key in ("subject", "relation", "object") if where[key] is None]
    if missing:
        optional = ", ".join(key for key in CSV_COLUMNS if key not in ("subject", "relation", "object"))
        raise ValidationError(
            f"{name}:1: the header lacks {', '.join(missing)} (columns: subject or source, relation, "
            f"object or target; optional: {optional})"
        )
    items: list[Item] = []
    try:
        for row in reader:
            number = reader.line_num
            if not any(cell.strip() for cell in row):
                continue
            record = {
                key: row[column].strip()
                for key, column in where.items()
                if column is not None and column < len(row) and row[column].strip()
            }
            try:
                _append_fact(items, number, _parse_fact(record), sum(map(len, row)), max_chars // 2)
            except TkgError as exc:
                raise ValidationError(f"{name}:{number}: {exc}") from None
    except csv.Error as exc:
        raise ValidationError(f"{name}:{reader.line_num}: not CSV: {exc}") from None
    if not items:
        raise ValidationError(f"{name}: holds no facts (only a header)")
    return items


def parse_input(name: str, text: str, kind: str = "auto") -> list[Item]:
    """The items of an input file: a facts CSV when ``name`` ends in ``.csv``, else JSONL."""
    if name.lower().endswith(".csv"):
        if kind == "messages":
            raise ValidationError(f"{name}: a CSV file holds facts; --kind messages reads only JSONL")
        return parse_csv(name, text)
    return parse_jsonl(name, text, kind)


def _json_object(raw: str) -> dict[str, Any]:
    try:
        value = loads_checked(raw, "the line")
    except json.JSONDecodeError as exc:
        raise ValidationError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(value, dict):
        raise ValidationError(f"expected a JSON object, got {_json_type(value)}")
    return value


def _json_type(value: object) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _detect_kind(record: Mapping[str, Any]) -> str:
    if record.keys() & {"subject", "relation", "object"}:
        return "facts"
    if record.keys() & {"content", "text"}:
        return "messages"
    raise ValidationError(
        "cannot tell what this line is: a message needs content (or speaker and text), "
        "a fact needs subject, relation and object"
    )


def _check_keys(record: Mapping[str, Any], allowed: frozenset[str], what: str) -> None:
    unknown = sorted(record.keys() - allowed)
    if unknown:
        raise ValidationError(
            f"unknown key(s) {', '.join(unknown)} for a {what}; allowed: {', '.join(sorted(allowed))}"
        )


def _text_field(record: Mapping[str, Any], key: str, *, required: bool, default: str = "") -> str:
    value = record.get(key)
    if value is None:
        if required:
            raise ValidationError(f'"{key}" is missing')
        return default
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(f'"{key}" must be a non-empty string, got {json.dumps(value)}')
    return check_text(value, f'"{key}"')  # refused here, before the run hashes the line into its episode id


def _time_field(record: Mapping[str, Any], key: str) -> datetime | None:
    value = record.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(f'"{key}" must be an ISO-8601 string such as "2024-05-01T12:00:00Z"')
    try:
        parsed = datetime.fromisoformat(value.strip())
    except ValueError:
        raise ValidationError(f'"{key}" {value!r} is not an ISO-8601 time such as "2024-05-01T12:00:00Z"') from None
    if parsed.tzinfo is None:  # in a data file a time without offset is ambiguous: refused, never guessed
        raise ValidationError(f'"{key}" {value!r} is naive (no UTC offset): write e.g. "2024-05-01T12:00:00Z"')
    return to_aware(parsed, key)  # in its own offset: a reference time's calendar is the speaker's


def _parse_message(record: Mapping[str, Any], number: int, max_chars: int) -> MessageLine:
    _check_keys(record, _MESSAGE_KEYS, "message")
    source = _text_field(record, "source", required=False, default="message")
    if source not in _SOURCES:
        raise ValidationError(f'"source" must be one of {", ".join(_SOURCES)}, got {source!r}')
    if "content" in record and ("text" in record or "speaker" in record):
        raise ValidationError('give either "content" or "speaker" and "text", not both')
    if "content" in record:
        content = _message_content(record["content"], source)
    else:
        text = _text_field(record, "text", required=True)
        speaker = record.get("speaker")
        content = f"{_speaker(speaker)}: {text}" if speaker is not None else text
    size = len(content) if isinstance(content, str) else len(json.dumps(content, ensure_ascii=False))
    if size > max_chars:
        raise ValidationError(f"the message has {size:,} characters, more than the limit of {max_chars:,}")
    return MessageLine(
        line=number,
        content=content,
        source=source,
        reference_time=_time_field(record, "reference_time"),
        source_description=_text_field(record, "source_description", required=False),
        name=_text_field(record, "name", required=False),
        episode_id=check_id(record["id"], '"id"') if "id" in record else None,
    )


def _message_content(value: Any, source: str) -> Any:
    if source == "json":
        if value is None or (isinstance(value, str) and not value.strip()):
            raise ValidationError('"content" is empty')
        if isinstance(value, str):
            try:
                loads_checked(check_text(value, '"content"'), '"content"')
            except json.JSONDecodeError as exc:
                raise ValidationError(f'source is "json" but "content" is not valid JSON: {exc.msg}') from None
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(f'"content" must be a non-empty string, got {json.dumps(value)}')
    return check_text(value, '"content"')


def _speaker(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or ":" in value or "\n" in value or len(value) > 80:
        raise ValidationError(f'"speaker" must be a name of 1-80 characters without ":" or newlines, got {value!r}')
    return value.strip()


def _parse_fact(record: Mapping[str, Any]) -> FactInput:
    _check_keys(record, _FACT_KEYS, "fact")
    parts = {key: _text_field(record, key, required=True) for key in ("subject", "relation", "object")}
    valid_at, invalid_at = _time_field(record, "valid_at"), _time_field(record, "invalid_at")
    if valid_at is not None and invalid_at is not None and invalid_at < valid_at:
        raise ValidationError(f"invalid_at ({iso(invalid_at)}) is before valid_at ({iso(valid_at)})")
    fact = record.get("fact")
    return FactInput(
        parts["subject"],
        parts["relation"],
        parts["object"],
        fact=_text_field(record, "fact", required=False) if fact is not None else None,
        valid_at=valid_at,
        invalid_at=invalid_at,
        subject_label=_text_field(record, "subject_label", required=False, default="Entity"),
        object_label=_text_field(record, "object_label", required=False, default="Entity"),
    )


def _append_fact(items: list[Item], number: int, fact: FactInput, size: int, budget: int) -> None:
    last = items[-1] if items else None
    if isinstance(last, FactLines) and last.chars + size <= budget:
        last.facts.append(fact)
        last.last, last.chars = number, last.chars + size
    else:
        items.append(FactLines(first=number, last=number, facts=[fact], chars=size))


# ----------------------------------------------------------------------------------------------------------
# option values


def cli_time(value: str | None, what: str) -> datetime | None:
    """An ISO-8601 time from the command line; a date or a time without offset is taken as UTC."""
    if value is None:
        return None
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise ValidationError(f"{what} {value!r} is not an ISO-8601 date or time (e.g. 2021-06-01)") from None
    return to_utc(parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC), what)
