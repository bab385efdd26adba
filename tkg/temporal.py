"""Dates from time phrases: the LLM (or :func:`tkg.time_phrases.find_time_phrases`) picks the phrase, this module
computes the date against the reference time (the moment the speaker said it).

The reference must be timezone-aware and may be in any timezone: it should be the speaker's local time, since
"yesterday" said at 01:00 on 1 May in Paris (+02:00) is 30 April there, although it is still 29 April in UTC.

Granularity rule:

- A phrase of a day or coarser (yesterday, last Friday, in March, next week, two weeks ago, last weekend, a date,
  a year) names a calendar date of the speaker's calendar, computed from the reference's *local* date, and is
  returned as midnight UTC **of that same calendar date**: "yesterday" at 2024-05-01T01:00+02:00 gives
  2024-04-30T00:00Z. The date shown in UTC is the speaker's date; the speaker's offset does not shift it.
- A sub-day phrase (now, 3 hours ago, in 20 minutes, an ISO date-time) names an instant: the reference plus or
  minus the delta, in UTC. An ISO date-time with no offset is the speaker's wall-clock time.

Calendar rules (d is the reference's local date; all phrases are read by :mod:`tkg.time_phrases`):

- present tense (now, currently, at the moment, these days ...) -> the reference instant;
- today / tonight / this morning -> d; yesterday / last night -> d - 1; tomorrow -> d + 1; the day before
  yesterday -> d - 2; the day after tomorrow -> d + 2;
- N days / weeks / fortnights ago (in N ..., N ... from now) -> d -/+ N days / 7N / 14N; N months / years /
  decades ago -> the same day N calendar months back, clamped to the month's end ("a month ago" on 31 March is
  29 February); N hours / minutes ago -> the instant;
- last / this / next week -> d - 7 / d / d + 7;
- last / this / next month or year -> the first day of the previous / current / next month or year;
- a date without a year (March 3rd) -> that day in d's year; a month alone (March, in March) -> its first day in
  d's year; after "since" (since March, since March 3rd), the latest such that has begun by d (since March said
  in January: last year's); early / mid / late March -> the 1st / 11th / 21st; last March -> the latest March
  that has ended (before d's month); next March -> the first March after d's month; this March -> March of d's year;
- a year alone -> 1 January; early / mid / late 2019 -> 1 January / 1 May / 1 September;
- seasons are meteorological, northern hemisphere (spring March, summer June, autumn / fall September, winter
  December, three months each), a season phrase gives its first day: last summer -> the latest summer that has
  ended; this summer -> the one d is in, else the one starting in d's year; next summer -> the first one starting
  after d's month; summer 2019 -> 1 June 2019 (winter 2019 -> 1 December 2019);
- weekdays (Monday-Sunday): Friday / on Friday -> the latest Friday on or before d (said on a Friday: d); last
  Friday -> the latest Friday before d (said on a Friday: a week ago); this Friday -> the first Friday on or
  after d (said on a Friday: d); next Friday -> the first Friday after d (said on Wednesday: in two days);
- weekends are named by their Saturday: this weekend -> said Monday to Friday, the coming Saturday; said on
  Saturday or Sunday, this weekend's Saturday. last weekend -> this weekend's Saturday - 7 (said Monday to
  Friday: the Saturday just before; said on a weekend: the previous weekend's). next weekend -> this weekend's
  Saturday + 7. the weekend / over the weekend -> the latest Saturday on or before d, Sunday counting as its
  weekend (said Monday to Friday: last weekend's; said on a weekend: this weekend's);
- an ISO-8601 date -> that date (also in basic form, 20240501); an ISO-8601 date-time -> that instant;
- a decade (the 1990s) -> 1 January of its first year; the 3rd (a day alone) -> that day of d's month; Q3 2021
  -> the quarter's first day. A decade without its century (the 90s), a quarter without its year and a year
  written with an apostrophe (March '19) give ``None``: dateparser reads them as seconds, a month or a day; so
  does a bare number of up to three digits ("10", "at 7": an hour, an age, a day?), which dateparser reads as a
  month.

Everything else goes to dateparser (about a millisecond per phrase, with the explicit languages), given the
reference's local wall-clock time (dateparser computes on an aware base's wall clock and drops its offset, and
knows only real-world offsets by name, so tkg keeps the offset itself). Its result is a day (midnight UTC of its
date) when the phrase names no time of day and no sub-day unit and dateparser kept the reference's time of day or
gave midnight; else an instant: the speaker's wall-clock time, or the zone the phrase names ("5pm EST").

Unreadable phrases, phrases over :data:`MAX_PHRASE` characters, impossible dates (February 30th) and results
outside the timestamps tkg accepts (years 1 to 9999, :data:`tkg.timeutil.EARLIEST` to
:data:`tkg.timeutil.LATEST`) give ``None``, never a guess and never an exception; only a missing or naive
reference raises :class:`tkg.errors.TimestampError`.
"""

from __future__ import annotations

import calendar
import contextlib
import re
from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Any

import dateparser

from tkg.errors import TimestampError
from tkg.time_phrases import Expression, parse_time_phrase
from tkg.timeutil import EARLIEST, LATEST

#: Longer "phrases" are sentences, not time phrases; dateparser is slow on them and would guess.
MAX_PHRASE = 120
_SUB_DAY = {"minute": "minutes", "hour": "hours"}
_DAYS = {"day": 1, "week": 7, "fortnight": 14}
_MONTHS = {"month": 1, "year": 12, "decade": 120}
_PART_DAY = {None: 1, "early": 1, "mid": 11, "late": 21}
_PART_MONTH = {None: 1, "early": 1, "mid": 5, "late": 9}


def resolve_time(phrase: str | None, reference: datetime, languages: tuple[str, ...] = ("en",)) -> datetime | None:
    """The UTC datetime a time phrase denotes, said at ``reference`` (aware, the speaker's local time best);
    ``None`` if it denotes nothing. The rules are in the module docstring. The grammar of
    :mod:`tkg.time_phrases` is English and always applies; ``languages`` are dateparser's, for the rest.

    >>> from datetime import timezone
    >>> resolve_time("yesterday", datetime(2024, 5, 1, 1, 0, tzinfo=timezone(timedelta(hours=2))))
    datetime.datetime(2024, 4, 30, 0, 0, tzinfo=datetime.timezone.utc)
    """
    if phrase is None:
        return None
    if not isinstance(reference, datetime) or reference.utcoffset() is None:
        raise TimestampError(
            f"cannot resolve the time phrase {phrase!r}: the reference time {reference!r} is missing or naive; "
            "pass an aware datetime, best the speaker's local time"
        )
    text = " ".join(str(phrase).split()).strip(" .,;:!?")
    if not text or len(text) > MAX_PHRASE:
        return None
    signed = _SIGNED_YEAR.match(text)
    if signed is not None:  # ISO 8601's expanded years: "+2020" is 2020; "-0044" (44 BC) is off the calendar
        if signed.group(1) == "-" or len(signed.group(2)) < 4:
            return None
        text = text[1:]
    said = None if _BASIC_ISO_DATE.match(text) else parse_time_phrase(text)  # the grammar reads 8 digits as a year
    try:
        if said is not None:
            read = _resolve(said, reference)
            since = _SINCE.match(text) and said.kind in ("date", "month") and said.year is None
            value: datetime | None = _begun(read, reference) if since else read
        else:
            known, value = _misread_by_dateparser(text, reference)
            if not known:
                value = _dateparser(text, reference, languages)
    except (OverflowError, ValueError):  # off the calendar ("9999 years from now", "in 10000", "Feb 30")
        return None
    return value if value is not None and EARLIEST <= value <= LATEST else None


def period_end(phrase: str | None, reference: datetime, languages: tuple[str, ...] = ("en",)) -> datetime | None:
    """The first instant after the calendar period a phrase names, said at ``reference``: "2019" -> 1 January
    2020, "March 2020" -> 1 April 2020, "Q3 2021" -> 1 October 2021, "yesterday" -> today's midnight; a day
    dateparser read (no unit known) -> the next midnight. ``None`` for an instant ("3 hours ago"), a part of a
    period ("early 2019") or a phrase that denotes nothing. An end given as the same period as the start ("from
    2019 until 2019") means the end of that period."""
    if phrase is None:
        return None
    text = " ".join(str(phrase).split()).strip(" .,;:!?")
    start = resolve_time(text, reference, languages) if text else None
    if start is None:
        return None
    said = parse_time_phrase(text)
    unit: str | None
    if said is not None:
        unit = said.unit if said.part is None else None
    elif _QUARTER.match(text):
        unit = "quarter"
    elif _DECADE.match(text):
        unit = "decade"
    elif _YEAR_MONTH.match(text):
        unit = "month"
    else:  # dateparser's: a day when it gave a midnight and the phrase names no time of day
        unit = "day" if start.time() == datetime.min.time() and not _CLOCK.search(text) else None
    try:
        if unit in _PERIOD_DAYS:
            end = start + timedelta(days=_PERIOD_DAYS[unit])
        elif unit in _PERIOD_MONTHS:
            end = midnight(add_months(start.date(), _PERIOD_MONTHS[unit]))
        else:
            return None
    except (OverflowError, ValueError):
        return None
    return end if end <= LATEST else None


_PERIOD_DAYS = {"day": 1, "weekend": 2, "week": 7}
_PERIOD_MONTHS = {"month": 1, "quarter": 3, "season": 3, "year": 12, "decade": 120}
_YEAR_MONTH = re.compile(r"^\d{4}-\d{2}$")  # ISO 8601's month
#: "since" and a day or month without its year (not "since this March", "since next May": those say which).
_SINCE = re.compile(r"^since\s+(?!this\b|next\b|last\b)", re.I)


def _begun(value: datetime, reference: datetime) -> datetime | None:
    """A day or month named without its year after "since": the latest such that has begun by the reference's
    local date (one year back when this year's is still ahead); None off the calendar."""
    if value.date() <= reference.date():
        return value
    day = value.date()
    for back in range(1, 9):  # 29 February: the latest leap year's
        with contextlib.suppress(ValueError):
            return midnight(day.replace(year=day.year - back))
    return None


def _resolve(said: Expression, reference: datetime) -> datetime:
    """The date of a read phrase by calendar arithmetic on ``reference``'s local date (module docstring rules);
    ``ValueError`` or ``OverflowError`` off the calendar."""
    today = reference.date()  # the reference's own calendar: its local date
    if said.kind == "now":
        return reference.astimezone(UTC)
    if said.kind == "timestamp":
        return _timestamp(said.text, reference)
    if said.kind == "shift":
        if said.shift_unit in _SUB_DAY:
            # on the UTC timeline: aware arithmetic in a named zone is wall-clock arithmetic, wrong across DST
            return reference.astimezone(UTC) + timedelta(**{_SUB_DAY[said.shift_unit]: said.count})
        if said.shift_unit in _DAYS:
            return midnight(today + timedelta(days=said.count * _DAYS[said.shift_unit]))
        return midnight(add_months(today, said.count * _MONTHS[said.shift_unit]))
    if said.kind == "date":
        assert said.month is not None and said.day is not None
        return midnight(date(today.year if said.year is None else said.year, said.month, said.day))
    if said.kind == "month":
        return midnight(_month(said, today))
    if said.kind == "year":
        assert said.year is not None
        return midnight(date(said.year, _PART_MONTH[said.part], 1))
    if said.kind == "season":
        return midnight(_season(said, today))
    if said.kind == "calendar":
        step = said.step or 0
        if said.unit == "month":
            return midnight(add_months(today.replace(day=1), step))
        return midnight(date(today.year + step, 1, 1))
    if said.kind == "weekday":
        return midnight(_weekday(said, today))
    return midnight(_weekend(said.step, today))


def midnight(day: date) -> datetime:
    """A calendar date as the instant tkg stores for it: midnight UTC of that same date."""
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def add_months(day: date, months: int) -> date:
    """The same day ``months`` calendar months later (earlier if negative), clamped to the month's last day.
    Raises ``ValueError`` outside years 1 to 9999.

    >>> add_months(date(2024, 3, 31), -1)
    datetime.date(2024, 2, 29)
    """
    year, month = divmod(day.year * 12 + day.month - 1 + months, 12)
    if not 1 <= year <= 9999:
        raise ValueError(f"year {year} is out of range")
    return date(year, month + 1, min(day.day, calendar.monthrange(year, month + 1)[1]))


def _month(said: Expression, today: date) -> date:
    assert said.month is not None
    if said.year is not None:
        year = said.year
    elif said.step == -1:  # the latest such month that has ended
        year = today.year if said.month < today.month else today.year - 1
    elif said.step == 1:  # the first such month after this one
        year = today.year if said.month > today.month else today.year + 1
    else:
        year = today.year
    return date(year, said.month, _PART_DAY[said.part])


def _season(said: Expression, today: date) -> date:
    assert said.month is not None
    if said.year is not None:
        return date(said.year, said.month, 1)
    now = today.year * 12 + today.month - 1  # months since year 0, as are the season starts below
    start = today.year * 12 + said.month - 1  # this year's
    if said.step == -1:  # the latest that has ended
        while start + 3 > now:
            start -= 12
    elif said.step == 1:  # the first that starts after this month
        start = start if start > now else start + 12
    elif start - 12 <= now < start - 9:  # this winter, said in January or February: last December's
        start -= 12
    year, month = divmod(start, 12)
    return date(year, month + 1, 1)


def _weekday(said: Expression, today: date) -> date:
    assert said.weekday is not None
    ahead = (said.weekday - today.weekday()) % 7  # days to the first such weekday on or after today
    if said.step is None:
        return today - timedelta(days=(7 - ahead) % 7)
    if said.step == -1:
        return today - timedelta(days=7 - ahead if ahead else 7)
    if said.step == 0:
        return today + timedelta(days=ahead)
    return today + timedelta(days=ahead or 7)


def _weekend(step: int | None, today: date) -> date:
    weekday = today.weekday()
    if step is None:
        return today - timedelta(days=(weekday - 5) % 7)
    saturday = today - timedelta(days=weekday - 5) if weekday >= 5 else today + timedelta(days=5 - weekday)
    return saturday + timedelta(days=7 * step)


def _timestamp(text: str, reference: datetime) -> datetime:
    parsed = datetime.fromisoformat(text)
    if len(text) == 10:
        return midnight(parsed.date())
    if parsed.tzinfo is None:  # a wall-clock time: the speaker's
        parsed = parsed.replace(tzinfo=reference.tzinfo)
    return parsed.astimezone(UTC)


# -- the long tail: dateparser --------------------------------------------------------------------------------
_CLOCK = re.compile(r"\d{1,2}:\d{2}|\d\s*[ap]m\b|\b(am|pm|noon|midnight|o'clock|hours?|minutes?|seconds?)\b", re.I)
#: Phrases dateparser reads as something else: a decade as seconds ("the 90s", "the 1990s"), a bare ordinal day as
#: a month ("the 3rd"), a quarter as its middle month ("Q3 2021"), an apostrophe year as a day ("March '19"), and
#: a basic ISO date ("20240501") not at all. Read here, or refused.
_DECADE = re.compile(r"^(?:(?:in|during|since|from)\s+)?(?:the\s+)?(?:(\d{3}0)|'?\d0)'?s$", re.I)
_ORDINAL_DAY = re.compile(r"^(?:on\s+)?(?:the\s+)?(\d{1,2})(?:st|nd|rd|th)$", re.I)
_QUARTER = re.compile(r"^(?:in\s+)?(?:q([1-4])\s+(\d{4})|(\d{4})\s+q([1-4]))$", re.I)
_ANY_QUARTER = re.compile(r"\bq[1-4]\b", re.I)
_APOSTROPHE_YEAR = re.compile(r"'\d{2}\b")
_BASIC_ISO_DATE = re.compile(r"^\d{8}$")
_BARE_NUMBER = re.compile(r"^(?:(?:at|by|on|in|around|about|from|until|till)\s+)?\d{1,3}$", re.I)
_SIGNED_YEAR = re.compile(r"^([+-])(\d+)(?:-\d{1,2}(?:-\d{1,2}(?:[T ].*)?)?)?$")  # a signed date in digits


def _misread_by_dateparser(text: str, reference: datetime) -> tuple[bool, datetime | None]:
    """(True, its date) for a phrase dateparser would misread (see above), the date None where tkg would only
    guess; (False, None) for every other phrase."""
    if decade := _DECADE.match(text):  # a four-digit decade: its first year; "the 90s": which century?
        return True, midnight(date(int(decade[1]), 1, 1)) if decade[1] else None
    if ordinal := _ORDINAL_DAY.match(text):  # that day of the reference's month
        return True, midnight(reference.date().replace(day=int(ordinal[1])))
    if quarter := _QUARTER.match(text):
        number, year = (quarter[1], quarter[2]) if quarter[1] else (quarter[4], quarter[3])
        return True, midnight(date(int(year), 3 * (int(number) - 1) + 1, 1))
    if _ANY_QUARTER.search(text) or _APOSTROPHE_YEAR.search(text) or _BARE_NUMBER.match(text):
        return True, None
    if _BASIC_ISO_DATE.match(text):
        return True, midnight(date(int(text[:4]), int(text[4:6]), int(text[6:])))
    return False, None


def _dateparser(text: str, reference: datetime, languages: tuple[str, ...]) -> datetime | None:
    base = reference.replace(tzinfo=None)  # the speaker's wall-clock time; dateparser drops an offset anyway
    parsed = _parse_cached(text, base, languages)
    if parsed is None:
        return None
    if parsed.tzinfo is not None:  # the phrase named its own zone ("5pm EST"): its instant
        return parsed.astimezone(UTC)
    if not _CLOCK.search(text) and parsed.time() in (base.time(), datetime.min.time()):
        # A phrase naming a day but no time of day ("3/5/2023", "hier"): dateparser carried over the base's time
        # of day or gave midnight; the phrase means that local date.
        return midnight(parsed.date())
    return parsed.replace(tzinfo=reference.tzinfo).astimezone(UTC)  # a wall-clock time: the speaker's


@lru_cache(maxsize=4096)
def _parse_cached(text: str, base: datetime, languages: tuple[str, ...]) -> datetime | None:
    """dateparser's reading of ``text`` from the naive wall-clock ``base``: naive (wall-clock time) unless the
    text names a zone. Keyed by wall-clock time, so equal instants in two zones are not confused."""
    settings: dict[str, Any] = {"RELATIVE_BASE": base, "PREFER_DAY_OF_MONTH": "first", "REQUIRE_PARTS": []}
    try:
        return dateparser.parse(text, languages=list(languages), settings=settings)
    except Exception:  # dateparser raises assorted errors on odd input; an unreadable phrase denotes nothing
        return None
