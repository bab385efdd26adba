"""The one vocabulary of time phrases: its words, its grammar, what a phrase says and where phrases sit in a text.

Three readers share it: :func:`tkg.temporal.resolve_time` (the date of a phrase an extraction picked),
:func:`tkg.drafts.time_mentions` (the phrases of an episode's text, with no LLM) and the episode-context reranker
(the time a search query names). Because they read one grammar, every phrase :func:`find_time_phrases` finds is
one :func:`parse_time_phrase` reads and the resolver dates by calendar arithmetic, with no dateparser call
(``tests/test_temporal.py`` checks it on generated phrases).

The grammar (case-insensitive; MOD is ``last`` / ``past`` / ``this past``, ``this``, ``next`` / ``coming`` /
``this coming``; N is digits or a number word from :data:`NUMBERS`; UNIT is one of :data:`UNITS`, plural or not):

- an ISO-8601 date or date-time: ``2024-05-01``, ``2024-05-01T10:00Z``
- a date: ``March 3rd[, 2021]``, ``Mar. 3``, ``3rd of March[ 2021]``, ``3 Mar 2021``
- a month: ``[early|mid|late] March[ 2023]`` (an abbreviation only with its year), ``MOD March``
- a year: ``[in|during|since|from|by|around|until|till|early|mid|late] 2019``
- a season: ``MOD summer``, ``summer [of] 2019``
- a shift from the reference: ``N UNIT ago``, ``in N UNIT``, ``N UNIT from now``, ``yesterday``, ``today``,
  ``tonight``, ``tomorrow``, ``last night``, ``this morning|afternoon|evening``, ``the day before yesterday``,
  ``the day after tomorrow``, ``MOD week``
- a calendar month or year: ``MOD month``, ``MOD year``
- a weekday: ``[MOD] Friday``; a weekend: ``MOD weekend``, ``the weekend``
- the present: ``now``, ``right now``, ``currently``, ``presently``, ``at present``, ``at the moment``,
  ``these days``, ``nowadays``

Reading (:func:`parse_time_phrase`) takes a phrase known to be about time (an extraction chose it) and also drops
leading filler words (:data:`FILLERS`: "on", "since", "about" ...). Finding (:func:`find_time_phrases`) reads text
that is mostly not about time, so it asks for evidence first:

- a month word that is also a common word (:data:`AMBIGUOUS_MONTHS`: may, march, mar) counts when a day
  number follows it, a year follows it, a day with an ordinal or "of" precedes it (``5th May``, ``5 of may``),
  early / mid / late / last / next (not a bare "this") stands before it, a preposition of :data:`PREPOSITIONS`
  precedes it, or it is capitalised ("May", not "MAY") and does not start a sentence. So "I may go", "you may
  want to" and "May I ask" name no month; "in may", "May 5", "last may", "We met in May", "until May" do;
- a bare weekday counts after a preposition ("on Friday"); "Good Friday" and "every Friday" are no dates;
- a year counts after its preposition and between 1900 and 2099 ("in 2019"; in "2019 people" it is a number);
- the present ("now", "currently") is tense, not a mention of a time: never found.

A month's or weekday's preposition is evidence, not part of the phrase ("in March" is found as "March"); a year
keeps its preposition ("in 2019"), since a number alone is no time phrase.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

MONTHS: dict[str, int] = {
    "january": 1, "february": 2, "march": 3, "april": 4, "may": 5, "june": 6, "july": 7, "august": 8,
    "september": 9, "october": 10, "november": 11, "december": 12,
}  # fmt: skip
#: Abbreviations count only with a day or a year ("Mar 3", "Sept 2021"), never alone.
MONTH_ABBREVIATIONS: dict[str, int] = {
    "jan": 1, "feb": 2, "mar": 3, "apr": 4, "jun": 6, "jul": 7, "aug": 8, "sep": 9, "sept": 9, "oct": 10,
    "nov": 11, "dec": 12,
}  # fmt: skip
#: Month words that are also common English words; found in text only with evidence (module docstring).
AMBIGUOUS_MONTHS = frozenset({"may", "march", "mar"})
WEEKDAYS: dict[str, int] = {
    "monday": 0, "tuesday": 1, "wednesday": 2, "thursday": 3, "friday": 4, "saturday": 5, "sunday": 6,
}  # fmt: skip
#: A season's first month (northern hemisphere, meteorological seasons).
SEASONS: dict[str, int] = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}
NUMBERS: dict[str, int] = {
    "a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40,
    "fifty": 50, "a couple of": 2, "a couple": 2, "couple of": 2, "a few": 3, "several": 3,
}  # fmt: skip
#: No "second": "in a second language" is no time, and a memory has no use for seconds ("30 seconds ago" still
#: goes to dateparser).
UNITS = ("minute", "hour", "day", "week", "fortnight", "month", "year", "decade")
#: The step of a modifier: -1 the one before, 0 the current one, +1 the one after.
MODIFIERS: dict[str, int] = {
    "last": -1, "past": -1, "this past": -1, "this": 0, "next": 1, "coming": 1, "this coming": 1,
}  # fmt: skip
#: Words that name a day by its distance from the reference's, in days.
DAY_WORDS: dict[str, int] = {
    "the day before yesterday": -2, "day before yesterday": -2, "yesterday": -1, "last night": -1, "today": 0,
    "tonight": 0, "this morning": 0, "this afternoon": 0, "this evening": 0, "tomorrow": 1,
    "day after tomorrow": 2, "the day after tomorrow": 2,
}  # fmt: skip
#: The present tense: the reference instant itself.
PRESENT = ("now", "right now", "currently", "presently", "at present", "at the moment", "these days", "nowadays")
#: Words before a year that keep it a time phrase ("in 2019"); early / mid / late name a third of it.
YEAR_PREFIXES = ("in", "during", "since", "from", "by", "around", "until", "till")
PARTS = ("early", "mid", "late")
#: Words before a month or weekday that make it a time ("in May", "on Friday").
PREPOSITIONS = frozenset(
    {"in", "on", "of", "since", "until", "till", "by", "from", "during", "before", "after", "through", "throughout"}
)
#: Leading words an extracted phrase may carry that do not change its date ("since March", "about a week ago").
FILLERS = ("on", "in", "at", "since", "from", "by", "around", "about", "approximately", "roughly", "during",
           "until", "till", "over", "the", "as of", "circa", "sometime in")  # fmt: skip

Kind = Literal["now", "timestamp", "date", "month", "year", "season", "shift", "calendar", "weekday", "weekend"]
#: How coarse a phrase is: the calendar unit it names or counts in ("moment" for the sub-day ones).
Unit = Literal["moment", "day", "weekend", "week", "month", "season", "year", "decade"]
Part = Literal["early", "mid", "late"]
_GRAIN: dict[str, Unit] = {
    "minute": "moment", "hour": "moment", "day": "day", "week": "week", "fortnight": "week",
    "month": "month", "year": "year", "decade": "decade",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Expression:
    """What a time phrase says, before any date is computed (:func:`tkg.temporal.resolve_time` computes it).

    ``kind`` says which fields matter: ``timestamp`` (``text``); ``date`` (``year`` or None for the reference's
    year, ``month``, ``day``); ``month`` (``month``, ``year`` or None, ``part``, ``step`` for last/this/next);
    ``year`` (``year``, ``part``); ``season`` (``month``: its first month, ``year`` or None, ``step``); ``shift``
    (``count`` signed ``shift_unit`` from the reference); ``calendar`` (``step`` months or years from the
    reference's, by ``unit``); ``weekday`` (``weekday``, ``step`` or None when bare); ``weekend`` (``step`` or None
    for "the weekend"); ``now``.
    """

    kind: Kind
    unit: Unit
    step: int | None = None
    count: int = 0
    shift_unit: str = "day"
    year: int | None = None
    month: int | None = None
    day: int | None = None
    weekday: int | None = None
    part: Part | None = None
    text: str = ""

    @property
    def period(self) -> bool:
        """Whether the phrase names a whole calendar month, season or year ("March", "last year", "in 2019")."""
        return self.kind in ("month", "year", "season", "calendar")


@dataclass(frozen=True, slots=True)
class TimePhrase:
    """A time phrase found in a text: ``text[start:end]`` and what it says."""

    text: str
    start: int
    end: int
    expression: Expression


def _either(words: Iterable[str]) -> str:
    """A regex alternation of ``words``, longest first (so "a couple of" wins over "a"), spaces as any blanks."""
    return "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in sorted(words, key=len, reverse=True))


_MONTH = _either(MONTHS)
_ANY_MONTH = _either([*MONTHS, *MONTH_ABBREVIATIONS])
_WEEKDAY = _either(WEEKDAYS)
_N = rf"{_either(NUMBERS)}|[0-9]{{1,9}}"
_UNIT = rf"(?:{_either(UNITS)})s?"
_DAY = r"(?:3[01]|[12][0-9]|0?[1-9])(?:st|nd|rd|th)?"
_YEAR = r"[0-9]{4,9}"
_PART = _either(PARTS)
_RULES = [
    r"(?P<ts>[0-9]{4}-[0-9]{2}-[0-9]{2}"
    r"(?:[T ][0-9]{2}:[0-9]{2}(?::[0-9]{2}(?:\.[0-9]{1,6})?)?(?:Z|[+-][0-9]{2}(?::?[0-9]{2})?)?)?)",
    rf"(?P<ago>(?P<ago_n>{_N})\s+(?P<ago_u>{_UNIT})\s+(?P<ago_dir>ago|from\s+now))",
    rf"(?P<inn>in\s+(?P<inn_n>{_N})\s+(?P<inn_u>{_UNIT}))",
    rf"(?P<mdy>(?P<mdy_m>{_ANY_MONTH})\.?\s+(?P<mdy_d>{_DAY})(?:,?\s+(?P<mdy_y>{_YEAR}))?)",
    rf"(?P<dmy>(?P<dmy_d>{_DAY})\s+(?P<dmy_of>of\s+)?(?P<dmy_m>{_ANY_MONTH})\.?(?:,?\s+(?P<dmy_y>{_YEAR}))?)",
    rf"(?P<my>(?:(?P<my_p>{_PART})(?:\s+|-))?(?P<my_m>{_ANY_MONTH})\.?,?\s+(?P<my_y>{_YEAR}))",
    rf"(?P<sy>(?P<sy_s>{_either(SEASONS)})\s+(?:of\s+)?(?P<sy_y>{_YEAR}))",
    rf"(?P<dw>{_either(DAY_WORDS)})",
    rf"(?P<near>(?P<near_mod>{_either(MODIFIERS)})\s+"
    rf"(?P<near_what>{_either(['week', 'weekend', 'month', 'year', *WEEKDAYS, *SEASONS, *MONTHS])}))",
    r"(?P<tw>the\s+weekend)",
    rf"(?P<mo>(?:(?P<mo_p>{_PART})(?:\s+|-))?(?P<mo_m>{_MONTH}))",
    rf"(?P<wd>{_WEEKDAY})",
    rf"(?P<yr>(?:(?P<yr_p>{_either([*YEAR_PREFIXES, *PARTS])})(?:\s+|-))?(?P<yr_y>{_YEAR})(?!-[0-9]))",
    rf"(?P<now>{_either(PRESENT)})",
]
#: The grammar: one alternation, the longer forms first where two could start at the same word.
GRAMMAR = re.compile(rf"(?<!\w)(?:{'|'.join(_RULES)})(?!\w)", re.IGNORECASE)
# The finder's scan: the grammar where a phrase can start, a digit or one of its first words (all of them but the
# present's, which is never found). Trying every rule at every word made finding twice as slow.
_FIRST_WORDS = {
    w.split()[0]
    for w in [*MONTHS, *MONTH_ABBREVIATIONS, *WEEKDAYS, *SEASONS, *NUMBERS, *MODIFIERS, *DAY_WORDS, *YEAR_PREFIXES]
} | {*PARTS, "in", "the"}
_SCAN = re.compile(
    rf"(?=[0-9{''.join(sorted({w[0] for w in _FIRST_WORDS}))}])(?<!\w)(?=[0-9]|(?:{_either(_FIRST_WORDS)})(?!\w))"
    rf"(?:{'|'.join(_RULES)})(?!\w)",
    re.IGNORECASE,
)
_FILLER = re.compile(rf"^(?:{_either(FILLERS)})\s+", re.IGNORECASE)
_WORD_BEFORE = re.compile(r"(\w+)\s+$")
_SENTENCE_END = frozenset(".!?:;\n\r")


def parse_time_phrase(phrase: str) -> Expression | None:
    """What ``phrase`` says, if the grammar reads it; ``None`` otherwise (then only dateparser might).

    >>> said = parse_time_phrase("since last Friday")
    >>> said.kind, said.step, said.weekday
    ('weekday', -1, 4)
    """
    text = " ".join(phrase.split())
    for _ in range(3):  # "since about two weeks ago": at most a few filler words
        match = GRAMMAR.fullmatch(text)
        if match is not None:
            return _expression(match)
        stripped = _FILLER.sub("", text, count=1)
        if stripped == text:
            return None
        text = stripped
    return None


def find_time_phrases(text: str) -> list[TimePhrase]:
    """The time phrases of a free text, in order, with the evidence rules of the module docstring.

    >>> [p.text for p in find_time_phrases("I may go to Rome in May, or two weeks after Easter. Last Friday?")]
    ['May', 'Last Friday']
    """
    found: list[TimePhrase] = []
    position = 0
    while (match := _SCAN.search(text, position)) is not None:
        if _evident(match, text):
            found.append(TimePhrase(match.group(0), match.start(), match.end(), _expression(match)))
            position = match.end()
        else:  # a rejected match may hide a phrase that starts inside it ("this may 5th")
            position = match.start() + 1
    return found


def _expression(m: re.Match[str]) -> Expression:
    rule = m.lastgroup
    if rule == "ts":
        return Expression("timestamp", "day" if len(m.group(0)) == 10 else "moment", text=m.group(0))
    if rule in ("ago", "inn"):
        count = _number(m.group(f"{rule}_n"))
        unit = m.group(f"{rule}_u").casefold().removesuffix("s")
        sign = -1 if rule == "ago" and m.group("ago_dir").casefold() == "ago" else 1
        return Expression("shift", _GRAIN[unit], count=sign * count, shift_unit=unit)
    if rule in ("mdy", "dmy"):
        year = m.group(f"{rule}_y")
        return Expression(
            "date", "day", year=int(year) if year else None, month=_month(m.group(f"{rule}_m")),
            day=int(m.group(f"{rule}_d").rstrip("stndrhSTNDRH")),
        )  # fmt: skip
    if rule in ("my", "mo"):
        year = m.group("my_y") if rule == "my" else None
        part = m.group(f"{rule}_p")
        return Expression(
            "month", "month", step=0, year=int(year) if year else None, month=_month(m.group(f"{rule}_m")),
            part=part.casefold() if part else None,  # type: ignore[arg-type]
        )  # fmt: skip
    if rule == "sy":
        return Expression("season", "season", month=SEASONS[m.group("sy_s").casefold()], year=int(m.group("sy_y")))
    if rule == "dw":
        return Expression("shift", "day", count=DAY_WORDS[" ".join(m.group(0).casefold().split())])
    if rule == "near":
        return _near(MODIFIERS[" ".join(m.group("near_mod").casefold().split())], m.group("near_what").casefold())
    if rule == "tw":
        return Expression("weekend", "weekend")
    if rule == "wd":
        return Expression("weekday", "day", weekday=WEEKDAYS[m.group(0).casefold()])
    if rule == "yr":
        part = m.group("yr_p")
        part = part.casefold() if part and part.casefold() in ("early", "mid", "late") else None
        return Expression("year", "year", year=int(m.group("yr_y")), part=part)  # type: ignore[arg-type]
    return Expression("now", "moment")


def _near(step: int, what: str) -> Expression:
    if what == "week":
        return Expression("shift", "week", count=step, shift_unit="week")
    if what in ("month", "year"):
        return Expression("calendar", "month" if what == "month" else "year", step=step)
    if what == "weekend":
        return Expression("weekend", "weekend", step=step)
    if what in WEEKDAYS:
        return Expression("weekday", "day", step=step, weekday=WEEKDAYS[what])
    if what in SEASONS:
        return Expression("season", "season", step=step, month=SEASONS[what])
    return Expression("month", "month", step=step, month=MONTHS[what])


def _number(word: str) -> int:
    key = " ".join(word.casefold().split())
    return NUMBERS[key] if key in NUMBERS else int(key)


def _month(word: str) -> int:
    key = word.casefold()
    return MONTHS.get(key) or MONTH_ABBREVIATIONS[key]


# -- evidence (finding only) ----------------------------------------------------------------------------------
def _evident(m: re.Match[str], text: str) -> bool:
    """Whether a grammar match in free text is a time phrase (the rules of the module docstring)."""
    rule = m.lastgroup
    if rule == "now":
        return False
    if rule == "yr":
        return m.group("yr_p") is not None and 1900 <= int(m.group("yr_y")) <= 2099
    if rule == "wd":
        return _word_before(text, m.start()) in PREPOSITIONS
    word = next((m.group(g) for g in ("mdy_m", "dmy_m", "my_m", "mo_m", "near_what") if m.group(g)), None)
    if word is None or word.casefold() not in AMBIGUOUS_MONTHS or rule in ("mdy", "my"):
        return True
    if rule == "dmy":
        return m.group("dmy_d")[-1].isalpha() or bool(m.group("dmy_of") or m.group("dmy_y")) or _titled(word)
    if rule == "near":
        return _titled(word) or m.group("near_mod").casefold() != "this"
    if m.group("mo_p") or _word_before(text, m.start()) in PREPOSITIONS:
        return True
    return _titled(word) and not _starts_sentence(text, m.start())


def _titled(word: str) -> bool:
    return word[:1].isupper() and word[1:].islower()


def _word_before(text: str, at: int) -> str:
    match = _WORD_BEFORE.search(text, max(0, at - 40), at)
    return match.group(1).casefold() if match else ""


def _starts_sentence(text: str, at: int) -> bool:
    head = text[max(0, at - 40) : at].rstrip(" \t\"'“‘([*_")
    return not head or head[-1] in _SENTENCE_END
