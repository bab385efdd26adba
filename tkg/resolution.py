"""Entity resolution, the deterministic part: is an extracted name an entity the graph already holds?

Pure functions over names and candidate entities; no store, no LLM. The passes, cheapest first:

1. exact: the normalised name equals a candidate's normalised name or alias -> that entity;
2. fuzzy: character 3-gram Jaccard similarity >= ``fuzzy_threshold`` with one candidate -> that entity, unless the
   name is *weak* (short single words and low-entropy strings such as "Al" or "aaa" are too easily confused) or
   the two names' numbers differ ("Robert Smith1" and "Robert Smith12", "Flight BA1170" and "Flight BA117",
   "John Smith II" and "John Smith III": a number tells entities apart more often than it is mistyped, so the LLM
   decides);
3. otherwise, candidates that look related (sharing a word, 3-gram Jaccard >= ``related_threshold``, or name
   cosine >= ``cosine_threshold``) make the name *ambiguous*: only those go to the LLM, in one batched call;
4. with no related candidate, the name is a new entity, without asking anyone.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from tkg.config_fields import check_field_types
from tkg.errors import ConfigurationError
from tkg.memo import Memo
from tkg.models import Entity
from tkg.names import fold_accents, normalize_name

_FUZZY_CHARS = re.compile(r"[^\w' ]+|_")
_STOP = frozenset({"the", "a", "an", "of", "and", "mr", "mrs", "ms", "dr", "inc", "ltd", "co", "my", "our"})


@dataclass(frozen=True, slots=True)
class ResolutionRules:
    """Thresholds of the deterministic passes."""

    #: 3-gram Jaccard similarity at or above which a strong name merges without asking.
    fuzzy_threshold: float = 0.9
    #: 3-gram Jaccard similarity at or above which a candidate is worth asking about.
    related_threshold: float = 0.45
    #: Name-embedding cosine at or above which a candidate is worth asking about.
    cosine_threshold: float = 0.85
    #: At most this many candidates per ambiguous name go into the LLM prompt.
    max_candidates: int = 5

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.max_candidates < 1:
            raise ConfigurationError("ResolutionRules.max_candidates must be at least 1")


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome for one name: ``match`` (an entity id), or ``ambiguous`` candidates for the LLM, or neither
    (a new entity). ``reason`` says which pass decided."""

    match: str | None = None
    ambiguous: tuple[Entity, ...] = field(default=())
    reason: str = "new"


def fuzzy_form(name: str) -> str:
    """The normalised name without accents (:func:`tkg.names.fold_accents`) and with punctuation other than
    apostrophes removed; letters of every script stay.

    >>> fuzzy_form("Dr. José Álvarez-Núñez"), fuzzy_form("Łukasz"), fuzzy_form("東京 タワー")
    ('dr jose alvarez nunez', 'łukasz', '東京 タワー')
    """
    return _FUZZY_FORMS.table.get(name) or _FUZZY_FORMS(name)  # a hit without a call


def _fold_fuzzy(name: str) -> str:
    return " ".join(_FUZZY_CHARS.sub(" ", fold_accents(normalize_name(name))).split())


_FUZZY_FORMS = Memo(_fold_fuzzy, 1 << 14)  # every candidate's forms are folded again for each name judged


def shingles(name: str) -> frozenset[str]:
    """Character 3-grams of the fuzzy form, spaces removed (``"Bob"`` -> ``{"bob"}``)."""
    text = fuzzy_form(name).replace(" ", "")
    if len(text) < 3:
        return frozenset({text}) if text else frozenset()
    return frozenset(text[i : i + 3] for i in range(len(text) - 2))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    """Jaccard similarity of two sets (0 when both are empty).

    >>> round(jaccard(shingles("Jonathan Smith"), shingles("Jonathon Smith")), 2)
    0.57
    """
    if not a and not b:
        return 0.0
    return len(a & b) / len(a | b)


def is_weak(name: str) -> bool:
    """A name too short or too repetitive for fuzzy matching to be trusted: fewer than 6 characters in a single
    word, or a character entropy under 1.5 bits.

    >>> is_weak("Al"), is_weak("Alice Smith"), is_weak("aaaaaaa")
    (True, False, True)
    """
    text = fuzzy_form(name)
    compact = text.replace(" ", "")
    if len(compact) < 6 and len(text.split()) < 2:
        return True
    counts = Counter(compact)
    entropy = -sum((c / len(compact)) * math.log2(c / len(compact)) for c in counts.values()) if compact else 0.0
    return entropy < 1.5


def _numbers(name: str) -> list[str]:
    """The numbers in ``name``, in order: runs of digits, in ASCII whatever the script they are written in ("１１７"
    and "١١٧" are 117; leading zeros kept: "007" is not "7"), and words that are upper-case Roman numerals, as
    their value ("Henry VIII" is Henry 8; "Jonathan Smithson III" is not "Jonathan Smithson II")."""
    out = []
    for digits, word in _NUMBER.findall(name):
        if digits:
            out.append("".join(str(unicodedata.digit(c)) for c in digits))
        elif _ROMAN.fullmatch(word):
            out.append(str(_roman_value(word)))
    return out


_NUMBER = re.compile(r"(\d+)|\b([IVXLCDM]+)\b")
_ROMAN = re.compile(r"M{0,3}(CM|CD|D?C{0,3})(XC|XL|L?X{0,3})(IX|IV|V?I{0,3})")
_ROMAN_DIGITS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def _roman_value(word: str) -> int:
    values = [_ROMAN_DIGITS[c] for c in word]
    return sum(-v if v < after else v for v, after in zip(values, [*values[1:], 0], strict=True))


def _words(name: str) -> set[str]:
    return {w for w in fuzzy_form(name).split() if w not in _STOP}


def forms(entity: Entity) -> list[str]:
    return [entity.name, *entity.aliases]


def judge(
    name: str,
    candidates: Sequence[Entity],
    cosines: dict[str, float] | None = None,
    rules: ResolutionRules | None = None,
) -> Verdict:
    """Decide whether ``name`` is one of ``candidates`` (entities of the same group), by the passes above.

    ``cosines`` maps candidate ids to the cosine similarity of their name embedding with ``name``'s.

    >>> from datetime import UTC, datetime
    >>> alice = Entity(id="a", group_id="g", name="Alice Smith", created_at=datetime(2024, 1, 1, tzinfo=UTC))
    >>> judge("alice  smith", [alice]).match, judge("Alice Smyth", [alice]).reason
    ('a', 'ambiguous')
    """
    rules = rules or ResolutionRules()
    cosines = cosines or {}
    key = normalize_name(name)
    exact = [c for c in candidates if any(normalize_name(f) == key for f in forms(c))]
    if len(exact) == 1:
        return Verdict(match=exact[0].id, reason="exact")
    if len(exact) > 1:
        return Verdict(ambiguous=tuple(exact[: rules.max_candidates]), reason="ambiguous")
    grams = shingles(name)
    words = _words(name)
    scored: list[tuple[float, Entity]] = []
    for candidate in candidates:
        similarity = max(jaccard(grams, shingles(f)) for f in forms(candidate))
        related = (
            similarity >= rules.related_threshold
            or bool(words & set().union(*(_words(f) for f in forms(candidate))))
            or cosines.get(candidate.id, 0.0) >= rules.cosine_threshold
        )
        if related:
            scored.append((similarity, candidate))
    if not scored:
        return Verdict()
    scored.sort(key=lambda item: (-item[0], item[1].id))
    best, entity = scored[0]
    runner_up = scored[1][0] if len(scored) > 1 else 0.0
    if (
        best >= rules.fuzzy_threshold
        and runner_up < rules.fuzzy_threshold
        and not is_weak(name)
        and any(
            _numbers(f) == _numbers(name) and jaccard(grams, shingles(f)) >= rules.fuzzy_threshold
            for f in forms(entity)
        )
    ):
        return Verdict(match=entity.id, reason="fuzzy")
    return Verdict(ambiguous=tuple(c for _, c in scored[: rules.max_candidates]), reason="ambiguous")
