"""Dates from time phrases: the LLM picks the phrase, this module computes the date against the episode's time.

Rules (those of the Zep paper's temporal prompt): present tense or "now" -> the reference time; a date alone ->
midnight UTC of that day; a year alone -> 1 January of that year; relative phrases ("two weeks ago", "next
Thursday", "last summer") -> computed from the reference time. Unparseable phrases give ``None``, never a guess.

The commonest relative phrases are computed here with calendar arithmetic (microseconds, and exact: "a month
ago" said on 15 May is 15 April): ``N units ago``, ``in N units``, ``yesterday`` / ``tomorrow``, and ``last`` /
``this`` / ``next`` ``week`` / ``month`` / ``year`` (a month or year phrase means its first day). Units of a day
or more give midnight; hours and minutes keep the time of day. Everything else goes to dateparser (about a
millisecond per phrase, with the explicit languages).
"""

from __future__ import annotations

import calendar
import re
from datetime import UTC, datetime, timedelta
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
    fast = _arithmetic(text.casefold(), reference)
    if fast is not None:
        return fast
    return _parse_relative(text, reference, languages)


_NUMBERS = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "a few": 3, "several": 3,
}  # fmt: skip
_COUNT = r"(\d{1,4}|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|a couple of|a few|several)"
_UNIT = r"(minute|hour|day|week|fortnight|month|year|decade)s?"
_AGO = re.compile(rf"^{_COUNT}\s+{_UNIT}\s+ago$")
_IN = re.compile(rf"^in\s+{_COUNT}\s+{_UNIT}$")
_NEAR = re.compile(r"^(last|this|next)\s+(week|month|year)$")


def _midnight(value: datetime) -> datetime:
    return value.replace(hour=0, minute=0, second=0, microsecond=0)


def _shift(reference: datetime, count: int, unit: str) -> datetime:
    if unit == "minute":
        return reference + timedelta(minutes=count)
    if unit == "hour":
        return reference + timedelta(hours=count)
    if unit in ("day", "week", "fortnight"):
        return _midnight(reference + timedelta(days=count * {"day": 1, "week": 7, "fortnight": 14}[unit]))
    months = count * {"month": 1, "year": 12, "decade": 120}[unit]
    total = reference.year * 12 + reference.month - 1 + months
    year, month = divmod(total, 12)
    if not 1 <= year <= 9999:
        raise OverflowError("year out of range")
    day = min(reference.day, calendar.monthrange(year, month + 1)[1])
    return _midnight(reference.replace(year=year, month=month + 1, day=day))


def _arithmetic(text: str, reference: datetime) -> datetime | None:
    """The common relative phrases, by calendar arithmetic; None for anything else."""
    try:
        if text in ("yesterday", "tomorrow"):
            return _shift(reference, -1 if text == "yesterday" else 1, "day")
        for pattern, sign in ((_AGO, -1), (_IN, 1)):
            if (m := pattern.match(text)) is not None:
                count = int(m.group(1)) if m.group(1).isdigit() else _NUMBERS[m.group(1)]
                return _shift(reference, sign * count, m.group(2))
        if (m := _NEAR.match(text)) is not None:
            step = {"last": -1, "this": 0, "next": 1}[m.group(1)]
            if m.group(2) == "week":
                return _shift(reference, 7 * step, "day")
            first = _shift(reference.replace(day=1), step, "month") if m.group(2) == "month" else None
            if first is not None:
                return first
            return datetime(reference.year + step, 1, 1, tzinfo=UTC)
    except (OverflowError, ValueError):
        return None
    return None


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
