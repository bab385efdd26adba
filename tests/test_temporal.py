"""Time phrases: one vocabulary for finding and resolving (tkg.time_phrases), dates on the speaker's own calendar
(tkg.temporal), the modal "may", weekends and weekdays, and the edges of the calendar."""

from __future__ import annotations

import calendar
from datetime import UTC, date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import dateparser
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tkg.temporal
from tkg.drafts import time_mentions
from tkg.episode_context import time_phrase, time_span
from tkg.errors import TimestampError
from tkg.temporal import resolve_time
from tkg.time_phrases import (
    AMBIGUOUS_MONTHS,
    MODIFIERS,
    MONTH_ABBREVIATIONS,
    MONTHS,
    NUMBERS,
    SEASONS,
    UNITS,
    WEEKDAYS,
    find_time_phrases,
    parse_time_phrase,
)
from tkg.timeutil import EARLIEST, LATEST, to_utc


def day(y: int, m: int = 1, d: int = 1) -> datetime:
    return datetime(y, m, d, tzinfo=UTC)


def found(text: str) -> list[str]:
    return [p.text for p in find_time_phrases(text)]


@pytest.fixture
def no_dateparser(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any dateparser call: the phrases of the grammar are computed by calendar arithmetic alone."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"dateparser was called for {args[0]!r}")

    monkeypatch.setattr(tkg.temporal.dateparser, "parse", refuse)
    tkg.temporal._parse_cached.cache_clear()


# -- one vocabulary: whatever the finder finds, the resolver dates ---------------------------------------------
_FULL_MONTHS = sorted(MONTHS)
_SAFE_MONTHS = [m for m in _FULL_MONTHS if m not in AMBIGUOUS_MONTHS]
_NUMBER = st.one_of(st.sampled_from(sorted(NUMBERS)), st.integers(0, 60).map(str))
_UNIT = st.builds(lambda u, s: u + s, st.sampled_from(UNITS), st.sampled_from(["", "s"]))
_DAY = st.builds(lambda d, s: f"{d}{s}", st.integers(1, 31), st.sampled_from(["", "st", "nd", "rd", "th"]))
_YEAR = st.integers(1900, 2099).map(str)
_ANY_MONTH = st.sampled_from(_FULL_MONTHS + sorted(MONTH_ABBREVIATIONS)).map(str.capitalize)
_MOD = st.sampled_from(sorted(MODIFIERS))


@st.composite
def _phrases(draw: st.DrawFn) -> tuple[str, str]:
    """(a phrase the finder emits, the words before it that make it one): every form of the grammar."""
    form = draw(st.integers(0, 14))
    if form == 0:
        d = draw(st.dates(date(1900, 1, 1), date(2099, 12, 31)))
        time = draw(st.sampled_from(["", "T10:30", " 23:59:59", "T08:00:00Z", "T08:00+05:30"]))
        return d.isoformat() + time, "on "
    if form == 1:
        return f"{draw(_NUMBER)} {draw(_UNIT)} {draw(st.sampled_from(['ago', 'from now']))}", ""
    if form == 2:
        return f"in {draw(_NUMBER)} {draw(_UNIT)}", ""
    if form == 3:
        year = draw(st.sampled_from(["", f", {draw(_YEAR)}", f" {draw(_YEAR)}"]))
        return f"{draw(_ANY_MONTH)} {draw(_DAY)}{year}", "on "
    if form == 4:
        year = draw(st.sampled_from(["", f" {draw(_YEAR)}"]))
        return f"{draw(_DAY)} {draw(st.sampled_from(['', 'of ']))}{draw(_ANY_MONTH)}{year}", "on the "
    if form == 5:
        part = draw(st.sampled_from(["", "early ", "mid-", "late "]))
        return f"{part}{draw(_ANY_MONTH)} {draw(_YEAR)}", "in "
    if form == 6:
        return f"{draw(st.sampled_from(sorted(SEASONS)))} {draw(st.sampled_from(['', 'of ']))}{draw(_YEAR)}", "in "
    if form == 7:
        return draw(
            st.sampled_from(
                ["yesterday", "today", "tonight", "tomorrow", "last night", "this morning", "this afternoon",
                 "this evening", "the day before yesterday", "day after tomorrow"]
            )
        ), ""  # fmt: skip
    if form == 8:
        what = draw(st.sampled_from(["week", "weekend", "month", "year", *WEEKDAYS, *SEASONS, *_FULL_MONTHS]))
        return f"{draw(_MOD)} {what.capitalize() if what in MONTHS else what}", ""
    if form == 9:
        return "the weekend", "over "
    if form == 10:
        part = draw(st.sampled_from(["", "early ", "mid ", "mid-", "late "]))
        return f"{part}{draw(st.sampled_from(_FULL_MONTHS)).capitalize()}", "in "
    if form == 11:
        return draw(st.sampled_from(sorted(WEEKDAYS))).capitalize(), draw(st.sampled_from(["on ", "since ", "by "]))
    if form == 12:
        prefix = draw(st.sampled_from(["in ", "during ", "since ", "from ", "by ", "around ", "until ", "mid-"]))
        return f"{prefix}{draw(_YEAR)}", ""
    if form == 13:
        return draw(st.sampled_from(_SAFE_MONTHS)).capitalize(), ""
    return draw(st.sampled_from(sorted(AMBIGUOUS_MONTHS & set(MONTHS)))), draw(st.sampled_from(["in ", "until "]))


def _impossible(phrase: str, reference: datetime) -> bool:
    """The phrases the resolver documents as dating nothing: a day the month does not have (Feb 30th)."""
    said = parse_time_phrase(phrase)
    if said is None or said.kind != "date":
        return False
    assert said.month is not None and said.day is not None
    return said.day > calendar.monthrange(reference.year if said.year is None else said.year, said.month)[1]


@given(
    _phrases(),
    st.datetimes(datetime(1950, 1, 1), datetime(2080, 1, 1), timezones=st.just(UTC)),
    st.sampled_from(["We talked about it ", "Bob: ", "", "(", "and so, "]),
)
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_every_phrase_the_finder_emits_resolves_without_dateparser(
    no_dateparser: None, case: tuple[str, str], reference: datetime, lead: str
) -> None:
    phrase, evidence = case
    text = f"{lead}{evidence}{phrase}, they said."
    assert found(text) == [phrase]
    value = resolve_time(phrase, reference)
    if _impossible(phrase, reference):
        assert value is None
    else:
        assert value is not None and EARLIEST <= value <= LATEST and value.tzinfo is UTC


@given(st.text(max_size=80), st.datetimes(timezones=st.just(UTC)))
@settings(max_examples=300, deadline=None)
def test_found_phrases_sit_in_the_text_in_order_and_never_raise(text: str, reference: datetime) -> None:
    phrases = find_time_phrases(text)
    end = 0
    for phrase in phrases:
        assert text[phrase.start : phrase.end] == phrase.text and phrase.start >= end
        end = phrase.end
        value = resolve_time(phrase.text, reference)
        assert value is None or EARLIEST <= value <= LATEST


def test_the_callers_share_the_vocabulary() -> None:
    ref = day(2024, 5, 15)  # a Wednesday
    text = "Bob: last weekend, the 3rd of May 2023 and on Friday; in 2019, since last summer, mid-March."
    assert found(text) == ["last weekend", "3rd of May 2023", "Friday", "in 2019", "last summer", "mid-March"]
    assert [m["phrase"] for m in time_mentions(text, ref)] == found(text)
    assert time_phrase(text) == "last weekend"
    # what the query reader used to miss and the episode reader used to have, and the other way round
    assert time_phrase("What did I do in 2019?") == "in 2019" and time_phrase("since last summer?") == "last summer"
    assert found("Where was I in March?") == ["March"]
    assert found("Good Friday, every Friday, Friday night") == [] and found("since Friday") == ["Friday"]
    assert found("I have 2019 photos and it is 2019") == [] and found("Now I currently live here") == []
    assert found("in a second language") == [] and resolve_time("30 seconds ago", day(2024, 5, 15)) is not None


# -- the modal "may" and other month words that are common words (issue 19) ------------------------------------
@pytest.mark.parametrize(
    "text",
    [
        "I may go there",
        "you may want to check",
        "May I ask what happened?",
        "Bob: May I come along?",
        "This may be hard.",
        "It may 2x the cost.",  # a digit after the modal is no day ("2x")
        "MAY I GO",
        "Soldiers march on.",
        "we might march",
    ],
)
def test_a_common_word_is_no_month(text: str) -> None:
    assert found(text) == []
    assert time_phrase(text) is None


@pytest.mark.parametrize(
    ("text", "phrase", "month"),
    [
        ("We met in May.", "May", 5),
        ("we met in may", "may", 5),
        ("I moved on May 5", "May 5", 5),
        ("It was the 5th may", "5th may", 5),
        ("the end of may", "may", 5),
        ("since May", "May", 5),
        ("until march", "march", 3),
        ("last may we went", "last may", 5),
        ("early may", "early may", 5),
        ("She and Bob left mid-May", "mid-May", 5),
        ("We saw it March 2023", "March 2023", 3),
        ("This May was warm", "This May", 5),
        ("The trip was in late March.", "late March", 3),
        ("We flew out, May being cheap", "May", 5),  # capitalised, not starting a sentence
        ("In March we moved", "March", 3),
        ("August 3 was hot", "August 3", 8),
        ("August's been eventful", "August", 8),  # only may, march and mar are also common words
    ],
)
def test_a_month_word_with_evidence_is_a_month(text: str, phrase: str, month: int) -> None:
    phrases = find_time_phrases(text)
    assert [p.text for p in phrases] == [phrase]
    assert phrases[0].expression.month == month
    assert resolve_time(phrase, day(2024, 6, 20)).month == month  # type: ignore[union-attr]


def test_the_resolver_takes_may_as_a_month_only_when_it_is_the_whole_phrase() -> None:
    ref = day(2024, 6, 20)
    assert resolve_time("May", ref) == day(2024, 5, 1) and resolve_time("in may", ref) == day(2024, 5, 1)
    assert resolve_time("I may go there", ref) is None and resolve_time("you may want to", ref) is None
    assert time_phrase("What may I cook tonight?") == "tonight"


# -- calendar rules ----------------------------------------------------------------------------------------------
WEEK = [date(2024, 5, 13) + timedelta(days=i) for i in range(7)]  # Monday 13 May to Sunday 19 May 2024


@pytest.mark.parametrize(
    ("phrase", "expected"),
    [
        # said on:   Mon    Tue    Wed    Thu    Fri    Sat    Sun
        ("last weekend", [11, 11, 11, 11, 11, 11, 11]),
        ("this weekend", [18, 18, 18, 18, 18, 18, 18]),
        ("next weekend", [25, 25, 25, 25, 25, 25, 25]),
        ("the weekend", [11, 11, 11, 11, 11, 18, 18]),
        ("over the weekend", [11, 11, 11, 11, 11, 18, 18]),
        ("this past weekend", [11, 11, 11, 11, 11, 11, 11]),
        ("Friday", [10, 10, 10, 10, 17, 17, 17]),
        ("on Friday", [10, 10, 10, 10, 17, 17, 17]),
        ("last Friday", [10, 10, 10, 10, 10, 17, 17]),
        ("this Friday", [17, 17, 17, 17, 17, 24, 24]),
        ("next Friday", [17, 17, 17, 17, 24, 24, 24]),
        ("this coming Friday", [17, 17, 17, 17, 24, 24, 24]),
    ],
)
def test_weekends_and_weekdays_said_on_each_day_of_a_week(phrase: str, expected: list[int]) -> None:
    for said_on, saturday_or_day in zip(WEEK, expected, strict=True):
        reference = datetime.combine(said_on, datetime.min.time(), UTC) + timedelta(hours=15)
        assert resolve_time(phrase, reference) == day(2024, 5, saturday_or_day), (phrase, said_on.strftime("%a"))


def test_the_weekend_is_named_by_its_saturday() -> None:
    for said_on in WEEK:
        reference = datetime.combine(said_on, datetime.min.time(), UTC)
        for phrase in ("last weekend", "this weekend", "next weekend", "the weekend"):
            assert resolve_time(phrase, reference).weekday() == 5  # type: ignore[union-attr]


def test_month_season_and_year_rules() -> None:
    in_april = day(2024, 4, 10)
    assert resolve_time("in March", in_april) == day(2024, 3, 1)
    assert resolve_time("last March", in_april) == day(2024, 3, 1)  # the latest March that has ended
    assert resolve_time("last March", day(2024, 3, 20)) == day(2023, 3, 1)
    assert resolve_time("next March", in_april) == day(2025, 3, 1)
    assert resolve_time("next May", in_april) == day(2024, 5, 1)
    assert resolve_time("this March", in_april) == day(2024, 3, 1)
    assert [resolve_time(f"{p} March", in_april) for p in ("early", "mid", "late")] == [
        day(2024, 3, 1),
        day(2024, 3, 11),
        day(2024, 3, 21),
    ]
    assert [resolve_time(p, in_april) for p in ("early 2019", "mid-2019", "late 2019")] == [
        day(2019),
        day(2019, 5),
        day(2019, 9),
    ]
    in_january = day(2024, 1, 15)
    assert resolve_time("this winter", in_january) == day(2023, 12, 1)  # the winter January is in
    assert resolve_time("last winter", in_january) == day(2022, 12, 1)  # the latest that has ended
    assert resolve_time("next winter", in_january) == day(2024, 12, 1)
    assert resolve_time("this summer", in_january) == day(2024, 6, 1)
    assert resolve_time("summer of 2019", in_january) == day(2019, 6, 1)
    assert resolve_time("last summer", day(2024, 9, 1)) == day(2024, 6, 1)  # ended on 31 August
    assert resolve_time("March 3rd", in_april) == day(2024, 3, 3) and resolve_time("3 Mar 2021", in_april) == day(
        2021, 3, 3
    )
    assert resolve_time("February 30th", in_april) is None  # a day the month does not have
    assert resolve_time("February 29", day(2023, 5, 1)) is None and resolve_time("February 29", in_april) is not None


def test_day_words_and_shifts() -> None:
    ref = datetime(2024, 5, 15, 18, 30, tzinfo=UTC)
    assert resolve_time("today", ref) == day(2024, 5, 15) and resolve_time("tonight", ref) == day(2024, 5, 15)
    assert resolve_time("last night", ref) == day(2024, 5, 14)
    assert resolve_time("the day before yesterday", ref) == day(2024, 5, 13)
    assert resolve_time("day after tomorrow", ref) == day(2024, 5, 17)
    assert resolve_time("last week", ref) == day(2024, 5, 8) and resolve_time("next week", ref) == day(2024, 5, 22)
    assert resolve_time("a fortnight ago", ref) == day(2024, 5, 1)
    assert resolve_time("two decades ago", ref) == day(2004, 5, 15)
    assert resolve_time("3 days from now", ref) == day(2024, 5, 18)
    assert resolve_time("in 20 minutes", ref) == datetime(2024, 5, 15, 18, 50, tzinfo=UTC)
    assert resolve_time("currently", ref) == ref and resolve_time("right now", ref) == ref
    assert resolve_time("since about two weeks ago", ref) == day(2024, 5, 1)  # leading fillers dropped


def test_out_of_the_calendar_is_none_never_an_error() -> None:
    ref = day(2024, 5, 15)
    for phrase in (
        "9999 years from now",
        "10000 years ago",
        "in 10000",
        "10000",
        "in 999999999 days",
        "999999999 hours ago",
        "0001-01-01",
        "9999-12-31T23:59Z",
        "May 5, 123456",
        "May 5, 0000",
        "in 99999999999 years",
    ):
        assert resolve_time(phrase, ref) is None, phrase
    assert resolve_time("a decade from now", day(9995, 6, 1)) is None
    assert resolve_time("yesterday", datetime(1, 1, 2, tzinfo=UTC)) is None  # 1 January of year 1: before EARLIEST


def test_a_reference_must_be_an_aware_datetime() -> None:
    with pytest.raises(TimestampError, match="naive"):
        resolve_time("yesterday", datetime(2024, 5, 1))
    with pytest.raises(TimestampError):
        resolve_time("yesterday", "2024-05-01")  # type: ignore[arg-type]
    assert resolve_time(None, None) is None  # type: ignore[arg-type]  # no phrase: nothing to date


# -- the speaker's own calendar (issue 14 item 4) ----------------------------------------------------------------
PARIS = timezone(timedelta(hours=2))


def test_calendar_phrases_fall_on_the_speakers_date() -> None:
    one_am_in_paris = datetime(2024, 5, 1, 1, 0, tzinfo=PARIS)  # still 30 April 23:00 in UTC
    assert resolve_time("yesterday", one_am_in_paris) == day(2024, 4, 30)
    assert resolve_time("yesterday", one_am_in_paris.astimezone(UTC)) == day(2024, 4, 29)
    assert resolve_time("today", one_am_in_paris) == day(2024, 5, 1)
    assert resolve_time("this month", one_am_in_paris) == day(2024, 5, 1)
    assert resolve_time("last month", one_am_in_paris.astimezone(UTC)) == day(2024, 3, 1)
    # sub-day phrases are instants: the same whatever the zone the reference is written in
    assert resolve_time("3 hours ago", one_am_in_paris) == datetime(2024, 4, 30, 20, tzinfo=UTC)
    assert resolve_time("now", one_am_in_paris) == datetime(2024, 4, 30, 23, tzinfo=UTC)
    assert resolve_time("now", one_am_in_paris).tzinfo is UTC  # type: ignore[union-attr]
    # a wall-clock date-time is the speaker's; one with an offset is its own
    assert resolve_time("2024-04-30T22:00", one_am_in_paris) == datetime(2024, 4, 30, 20, tzinfo=UTC)
    assert resolve_time("2024-04-30T22:00Z", one_am_in_paris) == datetime(2024, 4, 30, 22, tzinfo=UTC)


def test_named_zones_work_across_daylight_saving() -> None:
    new_york = ZoneInfo("America/New_York")
    late_evening = datetime(2024, 3, 10, 23, 30, tzinfo=new_york)  # 11 March 03:30 UTC; DST began that morning
    assert resolve_time("yesterday", late_evening) == day(2024, 3, 9)
    assert resolve_time("today", late_evening) == day(2024, 3, 10)
    assert resolve_time("1 hour ago", late_evening) == datetime(2024, 3, 11, 2, 30, tzinfo=UTC)
    after_the_change = datetime(2024, 3, 10, 3, 30, tzinfo=new_york)  # 07:30 UTC; 01:30 local was 06:30 UTC
    assert resolve_time("3 hours ago", after_the_change) == datetime(2024, 3, 10, 4, 30, tzinfo=UTC)


def test_drafts_pass_the_local_reference_through() -> None:
    mentions = time_mentions("Ann: I saw Bob yesterday.", datetime(2024, 5, 1, 1, 0, tzinfo=PARIS))
    assert mentions == [{"phrase": "yesterday", "at": "2024-04-30T00:00:00+00:00"}]


def test_dateparser_reads_an_aware_relative_base_as_wall_clock_time() -> None:
    """Pins the dependency's behaviour the fallback relies on: dateparser computes from the base's wall-clock
    time and drops its offset (a naive result); it returns an aware result only when the text names a zone; and
    it knows no offset that is not a real zone's. So tkg gives it the naive wall-clock time and keeps the offset
    itself."""
    aware = datetime(2024, 5, 1, 1, 0, tzinfo=PARIS)
    assert dateparser.parse("3 hours ago", settings={"RELATIVE_BASE": aware}) == datetime(2024, 4, 30, 22, 0)
    base = {"RELATIVE_BASE": aware.replace(tzinfo=None)}
    assert dateparser.parse("yesterday", languages=["en"], settings=base) == datetime(2024, 4, 30, 1, 0)
    named = dateparser.parse("March 3 2021 10am EST", languages=["en"], settings=base)
    assert named is not None and named.utcoffset() == timedelta(hours=-5)
    with pytest.raises(Exception, match="0007"):
        dateparser.parse("yesterday", settings={**base, "TIMEZONE": "+0007"})


def test_the_dateparser_fallback_is_speaker_local_too() -> None:
    one_am_in_paris = datetime(2024, 5, 1, 1, 0, tzinfo=PARIS)  # a Wednesday in Paris, a Tuesday in UTC
    assert parse_time_phrase("hier") is None and parse_time_phrase("Tuesday at 5pm") is None  # not the grammar's
    assert resolve_time("hier", one_am_in_paris, ("fr",)) == day(2024, 4, 30)
    # the same instant in UTC: another day; the cache must not hand back the Paris answer
    assert resolve_time("hier", one_am_in_paris.astimezone(UTC), ("fr",)) == day(2024, 4, 29)
    assert resolve_time("Tuesday at 5pm", one_am_in_paris) == datetime(2024, 4, 30, 15, tzinfo=UTC)
    assert resolve_time("3/5/2023", one_am_in_paris) == day(2023, 3, 5)  # a date: midnight UTC of that date
    assert resolve_time("March 3 2021 10am EST", one_am_in_paris) == datetime(2021, 3, 3, 15, tzinfo=UTC)
    odd = timezone(timedelta(minutes=7))  # no real zone has it: dateparser cannot be told it, tkg needs not
    assert resolve_time("Tuesday at 5pm", datetime(2024, 5, 1, 1, 0, tzinfo=odd)) == datetime(
        2024, 4, 30, 16, 53, tzinfo=UTC
    )


_OFFSETS = st.integers(-12 * 60, 14 * 60).map(lambda m: timezone(timedelta(minutes=m)))
_WALL = st.datetimes(datetime(1900, 1, 1), datetime(2100, 1, 1))
_DAY_PHRASES = [
    "yesterday", "today", "tomorrow", "last night", "the day before yesterday", "two weeks ago", "in 3 days",
    "a month ago", "10 years ago", "last week", "next week", "last month", "this year", "next year", "in March",
    "last March", "next May", "early June", "March 3rd", "3rd of March 2021", "last Friday", "this Friday",
    "next Friday", "on Friday", "last weekend", "this weekend", "next weekend", "over the weekend", "last summer",
    "this winter", "next spring", "in 2019", "late 2019", "2023-05-01", "3/5/2023",
]  # fmt: skip


@given(_WALL, _OFFSETS, st.sampled_from(_DAY_PHRASES))
@settings(max_examples=400, deadline=None)
def test_day_phrases_are_offset_invariant_midnights(wall: datetime, zone: timezone, phrase: str) -> None:
    """A calendar phrase depends on the speaker's wall-clock date only: the same wall-clock time given in UTC
    gives the same date, and it is always midnight UTC."""
    local = wall.replace(tzinfo=zone)
    value = resolve_time(phrase, local)
    assert value == resolve_time(phrase, wall.replace(tzinfo=UTC))
    assert value is not None and value.tzinfo is UTC and value.time() == datetime.min.time()


@given(_WALL, _OFFSETS)
@settings(max_examples=300, deadline=None)
def test_yesterday_is_one_local_day_before_and_hours_are_instants(wall: datetime, zone: timezone) -> None:
    local = wall.replace(tzinfo=zone)
    assert resolve_time("yesterday", local) == datetime.combine(
        local.date() - timedelta(days=1), datetime.min.time(), UTC
    )
    assert resolve_time("3 hours ago", local) == (local - timedelta(hours=3)).astimezone(UTC)
    assert resolve_time("20 minutes from now", local) == (local + timedelta(minutes=20)).astimezone(UTC)


_VOCABULARY = [
    *MONTHS, *MONTH_ABBREVIATIONS, *WEEKDAYS, *SEASONS, *NUMBERS, *UNITS, *MODIFIERS, "ago", "from", "now", "in",
    "of", "the", "weekend", "yesterday", "9999", "10000", "0", "31st", "2019", "-", ",", "2024-02-30", "T25:00",
]  # fmt: skip


@given(
    st.one_of(st.text(max_size=60), st.lists(st.sampled_from(_VOCABULARY), max_size=6).map(" ".join)),
    st.datetimes(timezones=_OFFSETS),
    st.sampled_from([("en",), ("en", "fr"), ("de",)]),
)
@settings(max_examples=500, deadline=None)
def test_any_text_gives_a_date_in_range_or_none(phrase: str, reference: datetime, languages: tuple[str, ...]) -> None:
    value = resolve_time(phrase, reference, languages)
    assert value is None or (EARLIEST <= value <= LATEST and value.tzinfo is UTC)


# -- the time a query names ----------------------------------------------------------------------------------------
def test_time_span_covers_a_named_period_or_a_stretch_around_a_date() -> None:
    ref, lag = day(2024, 6, 20), timedelta(days=3)
    march = time_span("What did I read in March?", ref, lag)
    assert march is not None and (march.start, march.end) == (day(2024, 3, 1), day(2024, 4, 4))
    last_year = time_span("Where did I go last year?", ref, lag)
    assert last_year is not None and (last_year.start, last_year.end) == (day(2023), day(2024, 1, 4))
    summer = time_span("What happened last summer?", ref, lag)
    assert summer is not None and (summer.start, summer.end) == (day(2023, 6, 1), day(2023, 9, 4))
    ago = time_span("What did I buy two months ago?", ref, lag)
    assert ago is not None and (ago.start, ago.end) == (day(2024, 3, 31), day(2024, 5, 13))
    weekend = time_span("What did I do last weekend?", ref, lag)
    assert weekend is not None and (weekend.start, weekend.end) == (day(2024, 6, 8), day(2024, 6, 25))
    assert time_span("What may I cook?", ref, lag) is None
    assert time_span("Anything from 9999-12-30?", day(9999, 12, 29), lag) is None  # off the calendar: no span


def test_an_out_of_range_time_is_refused_naming_the_range_tkg_holds() -> None:
    """The message names the bounds tkg really holds (it said "years 1 to 9999" of 0001-01-01, which is in year 1)."""
    for value in ("0001-01-01T00:00:00Z", "9999-12-31T00:00:00Z"):
        with pytest.raises(TimestampError, match="0001-01-02 to 9999-12-30, in UTC"):
            to_utc(value, "valid_at")


MAY_20 = datetime(2024, 5, 20, 10, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("phrase", "expected"),
    [
        ("in the 1990s", datetime(1990, 1, 1, tzinfo=UTC)),  # dateparser: 33 minutes after the reference
        ("the 2010s", datetime(2010, 1, 1, tzinfo=UTC)),
        ("the 90s", None),  # dateparser: 90 seconds before; which century is a guess
        ("'80s", None),
        ("the 1st", datetime(2024, 5, 1, tzinfo=UTC)),  # dateparser: 1 January
        ("on the 3rd", datetime(2024, 5, 3, tzinfo=UTC)),
        ("the 12th", datetime(2024, 5, 12, tzinfo=UTC)),  # dateparser: 1 December
        ("the 45th", None),  # dateparser: 2045
        ("Q1 2020", datetime(2020, 1, 1, tzinfo=UTC)),  # dateparser: 1 February
        ("2021 Q3", datetime(2021, 7, 1, tzinfo=UTC)),
        ("Q3", None),
        ("March '19", None),  # dateparser: 19 March 2024
        ("20240501", datetime(2024, 5, 1, tzinfo=UTC)),  # basic ISO-8601; refused before
        ("20241340", None),
        ("+2020", datetime(2020, 1, 1, tzinfo=UTC)),  # ISO 8601's expanded year; was 1 May 2020
        ("+2020-03-01", datetime(2020, 3, 1, tzinfo=UTC)),
        ("-0044", None),  # 45 BC: off the calendar; was 1 May 44
        ("-44", None),  # was 1 May 2044
        ("-2020-03-01", None),  # was 1 March 2020
        ("-5 days", datetime(2024, 5, 15, tzinfo=UTC)),  # a shift, not a signed date
        ("10", None),  # dateparser: 1 October, an hour, an age or a day read as a month
        ("at 10", None),
        ("by 7", None),
        ("03", None),
        ("13", None),  # dateparser: the 13th
        ("2019", datetime(2019, 1, 1, tzinfo=UTC)),  # four digits: a year
    ],
)
def test_phrases_dateparser_misreads_are_read_by_tkg_or_refused(phrase: str, expected: datetime | None) -> None:
    assert tkg.temporal.resolve_time(phrase, MAY_20) == expected


def test_a_time_of_day_written_against_its_number_is_an_instant() -> None:
    """ "10am" names a time of day as "10 am" does: an instant on the speaker's clock, not the day (the clock
    pattern wanted a word boundary between the digit and "am")."""
    said = datetime(2024, 5, 1, 10, 0, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    for phrase in ("yesterday at 10am", "yesterday at 10 am", "yesterday at 10:00"):
        assert tkg.temporal.resolve_time(phrase, said) == datetime(2024, 4, 30, 4, 30, tzinfo=UTC), phrase
    assert tkg.temporal.resolve_time("yesterday at 12am", said) == datetime(2024, 4, 29, 18, 30, tzinfo=UTC)


def test_since_a_month_or_day_without_its_year_is_the_latest_that_has_begun() -> None:
    """ "since March" said in January is last March (it was this year's, ahead: the fact held neither now nor
    then); a month or day already begun this year, and phrases without "since", keep the year rule."""
    january = datetime(2024, 1, 15, 12, tzinfo=timezone(timedelta(hours=-10)))
    assert resolve_time("since March", january) == day(2023, 3, 1)
    assert resolve_time("since March 3rd", january) == day(2023, 3, 3)
    assert resolve_time("Since Jan 16", january) == day(2023, 1, 16)
    assert resolve_time("since Jan 15", january) == day(2024, 1, 15)  # today has begun
    assert resolve_time("since January", january) == day(2024, 1, 1)
    assert resolve_time("in March", january) == resolve_time("March", january) == day(2024, 3, 1)
    assert resolve_time("since last March", january) == day(2023, 3, 1)
    assert resolve_time("since March 2024", january) == day(2024, 3, 1)  # a year given is the year
    assert resolve_time("since this March", january) == day(2024, 3, 1)  # "this" says which: as without "since"
    assert resolve_time("since Feb 29", datetime(2024, 1, 15, tzinfo=UTC)) == day(2020, 2, 29)  # the latest one


def test_the_end_of_the_period_a_phrase_names() -> None:
    ref = datetime(2024, 5, 15, 9, tzinfo=timezone(timedelta(hours=2)))
    assert tkg.temporal.period_end("2019", ref) == day(2020)
    assert tkg.temporal.period_end("in March 2020", ref) == day(2020, 4, 1)
    assert tkg.temporal.period_end("summer 2019", ref) == day(2019, 9, 1)
    assert tkg.temporal.period_end("yesterday", ref) == day(2024, 5, 15)
    assert tkg.temporal.period_end("2019-05-03", ref) == day(2019, 5, 4)
    assert tkg.temporal.period_end("last week", ref) == day(2024, 5, 15)
    assert tkg.temporal.period_end("Q3 2021", ref) == day(2021, 10, 1)
    assert tkg.temporal.period_end("the 1990s", ref) == day(2000)
    assert tkg.temporal.period_end("2019-03", ref) == day(2019, 4, 1)
    assert tkg.temporal.period_end("3/5/2023", ref) == day(2023, 3, 6)  # dateparser's day: the next midnight
    assert tkg.temporal.period_end("März 2020", ref, ("de", "en")) is not None  # in the memory's languages
    for instant_or_part in ("3 hours ago", "now", "early 2019", "2019-05-03T10:00:00Z", "whenever", "", None):
        assert tkg.temporal.period_end(instant_or_part, ref) is None
