"""Dates from time phrases: the LLM picks the phrase, this module computes the date against the episode's time.

Rules (those of the Zep paper's temporal prompt): present tense or "now" -> the reference time; a date alone ->
midnight UTC of that day; a year alone -> 1 January of that year; relative phrases ("two weeks ago", "next
Thursday", "last summer") -> computed from the reference time. Unparseable phrases give ``None``, never a guess.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from functools import lru_cache

import dateparser

from tkg.errors import TimestampError
from tkg.timeutil import to_utc

_NOW = re.compile(r"^(now|today|currently|present|at present|right now|these days|nowadays)$", re.I)
_YEAR = re.compile(r"^(?:in |during |since |from |by |around |early |late |mid[- ])?(\d{4})$", re.I)
_SEASON = re.compile(r"^(last|this|next)\s+(spring|summer|autumn|fall|winter)$", re.I)
_SEASON_MONTH = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}
_DATE_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def resolve_time(phrase: str | None, reference: datetime, languages: tuple[str, ...] = ("en",)) -> datetime | None:
    """The UTC datetime a time phrase denotes, relative to ``reference``; ``None`` if it denotes nothing."""
    if phrase is None:
        return None
    if not isinstance(reference, datetime):
        raise TimestampError(f"cannot resolve the time phrase {phrase!r}: no reference time to count from")
    text = " ".join(str(phrase).split()).strip().rstrip(".")
    if not text:
        return None
    if _NOW.match(text):
        return reference
    if (m := _YEAR.match(text)) is not None:
        return datetime(int(m.group(1)), 1, 1, tzinfo=UTC)
    if (m := _SEASON.match(text)) is not None:
        return _season(m.group(1).lower(), m.group(2).lower(), reference)
    iso = _iso(text)
    if iso is not None:
        return iso
    return _parse_relative(text, reference, languages)


def _iso(text: str) -> datetime | None:
    if _DATE_ONLY.match(text):
        try:
            return datetime.fromisoformat(text).replace(tzinfo=UTC)
        except ValueError:
            return None
    if re.match(r"^\d{4}-\d{2}-\d{2}[T ]\d", text):
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            return None
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else to_utc(parsed)
    return None


def _season(which: str, season: str, reference: datetime) -> datetime:
    month = _SEASON_MONTH[season]
    year = reference.year
    start = datetime(year, month, 1, tzinfo=UTC)
    if which == "last":
        # "last summer" means a summer that has ended: said in July, it is the previous year's.
        end = datetime(year + (month + 3 > 12), (month + 3 - 1) % 12 + 1, 1, tzinfo=UTC)
        if end > reference:
            start = start.replace(year=year - 1)
    elif which == "next" and start <= reference:
        start = start.replace(year=year + 1)
    return start


@lru_cache(maxsize=4096)
def _parse_relative(text: str, reference: datetime, languages: tuple[str, ...]) -> datetime | None:
    settings = {
        "RELATIVE_BASE": reference.replace(tzinfo=None),
        "TIMEZONE": "UTC",
        "TO_TIMEZONE": "UTC",
        "RETURN_AS_TIMEZONE_AWARE": True,
        "PREFER_DAY_OF_MONTH": "first",
        "REQUIRE_PARTS": [],
    }
    try:
        parsed = dateparser.parse(text, languages=list(languages), settings=settings)  # type: ignore[arg-type]
    except (ValueError, OverflowError):
        return None
    if parsed is None:
        return None
    result = parsed.astimezone(UTC)
    # A phrase naming a day but no time of day ("March 3rd", "last Tuesday") means that day at midnight;
    # dateparser carries over the reference's time of day, so drop it unless the phrase gave a time.
    if not re.search(
        r"\d{1,2}:\d{2}|\b(am|pm|noon|midnight|o'clock|hour|minute|second)s?\b", text, re.I
    ) and not re.search(r"\b(ago|in \d+ (hours?|minutes?))\b", text, re.I):
        result = result.replace(hour=0, minute=0, second=0, microsecond=0)
    return result
