"""The bi-temporal graph model: plain, immutable records with no persistence logic.

Three tiers, as in the Zep paper: episodes (raw input, kept verbatim), entities and the facts between them
(entity edges), and communities. Mentions link an episode to the entities it names; memberships link a community
to its entities. Every record carries a ``group_id`` (the tenant) and every timestamp is aware UTC.

Facts are bi-temporal:

* event timeline T: ``valid_at`` / ``invalid_at`` -- when the fact held in the world (``None`` = unknown / open);
* transaction timeline T': ``created_at`` / ``expired_at`` -- when the memory recorded the fact, and when it learnt
  that the fact had ended (an invalidation sets ``invalid_at`` and ``expired_at`` together). Nothing is deleted.

Records are frozen; change one with :func:`dataclasses.replace` and put it back through the store.
"""

from __future__ import annotations

import dataclasses
import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from enum import StrEnum
from typing import Any, ClassVar, TypeAlias

import numpy as np
import numpy.typing as npt

from tkg.errors import ValidationError
from tkg.timeutil import to_utc

Vector: TypeAlias = npt.NDArray[np.float32]

_GROUP_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$")
_ID_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")
_RELATION_RE = re.compile(r"^[A-Z][A-Z0-9_]{0,99}$")


class Kind(StrEnum):
    """The kinds of record a store holds."""

    EPISODE = "episode"
    ENTITY = "entity"
    FACT = "fact"
    COMMUNITY = "community"
    MENTION = "mention"
    MEMBERSHIP = "membership"


class EpisodeStatus(StrEnum):
    """Where an episode stands: ``extracted`` (its entities and facts are in the graph, from the LLM or from
    structured input), ``stored`` (kept and linked to known entities without an LLM), ``failed`` (the LLM failed
    for good; retry with :meth:`tkg.Memory.retry`), ``queued`` (kept verbatim and searchable, its extraction not
    yet run; see :class:`tkg.BackgroundIngestor`)."""

    EXTRACTED = "extracted"
    STORED = "stored"
    FAILED = "failed"
    QUEUED = "queued"


class Verdict(StrEnum):
    """What the LLM said of a new fact against an older one it was shown with (kept on the new fact, so the
    history can be recomputed without asking again): it states the ``same`` thing, ``contradicts`` it (they
    cannot hold at once), or is ``compatible`` with it."""

    SAME = "same"
    CONTRADICTS = "contradicts"
    COMPATIBLE = "compatible"


#: Each verdict by its text (a member looks itself up too: it is equal to its text). Faster than Verdict(text),
#: which every fact read back from a store would run for each of its verdicts.
_VERDICTS: dict[str, Verdict] = {v.value: v for v in Verdict}


def _verdict(value: object) -> Verdict:
    found = _VERDICTS.get(value) if isinstance(value, str) else None
    if found is None:
        raise ValidationError(f"verdict {value!r} is not one of {', '.join(_VERDICTS)}")
    return found


class EpisodeSource(StrEnum):
    """What an episode's content is: a chat message ("Speaker: text"), free text, or a JSON document."""

    MESSAGE = "message"
    TEXT = "text"
    JSON = "json"


def new_id() -> str:
    return uuid.uuid4().hex


def check_group_id(group_id: object) -> str:
    if not isinstance(group_id, str) or not _GROUP_RE.match(group_id):
        raise ValidationError(
            f"group_id {group_id!r} is invalid: use 1-128 characters from letters, digits and _ . : - "
            "(starting with a letter or digit)"
        )
    return group_id


def check_id(value: object, what: str = "id") -> str:
    if not isinstance(value, str) or not _ID_RE.match(value):
        raise ValidationError(f"{what} {value!r} is invalid: use 1-128 characters from letters, digits and _ . : -")
    return value


def check_lookup_id(value: object) -> str:
    """An id to look a record up by: a string (any string; one that no record has is simply not found)."""
    if not isinstance(value, str):
        raise ValidationError(f"an id is a string, not {value!r}")
    return value


def check_id_list(value: object, what: str = "ids") -> list[str]:
    """``value`` as a list of strings (ids, looked up as they are): :class:`ValidationError` for one string (a
    common slip for a list of one) or anything that is not a sequence of strings."""
    if isinstance(value, str):
        raise ValidationError(f"{what} must be a list of ids, not one string ({value!r})")
    if not isinstance(value, Sequence) or not all(isinstance(i, str) for i in value):
        raise ValidationError(f"{what} must be a list of id strings, not {value!r}")
    return list(value)


def check_relation(name: object) -> str:
    if not isinstance(name, str) or not _RELATION_RE.match(name):
        raise ValidationError(f"relation {name!r} must be SCREAMING_SNAKE_CASE, e.g. WORKS_AT")
    return name


def check_text(value: str, what: str = "text") -> str:
    """``value`` if every store can hold it: no NUL character and no lone surrogate (neither can be written to a
    snapshot or to PostgreSQL, so accepting one would make every later save fail)."""
    if "\x00" in value:
        raise ValidationError(f"{what} contains a NUL character, which tkg cannot store; remove it")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(
            f"{what} contains a lone surrogate (half of a UTF-16 pair), which is not text tkg can store; "
            "decode your input as UTF-8 first"
        ) from None
    return value


#: The longest entity name (or alias) tkg stores, in characters: a name is a key of PostgreSQL's name index, whose
#: keys hold at most ~2.7 KB (500 characters of up to 4 UTF-8 bytes each fit), and a name is a few words.
MAX_NAME_CHARS = 500


def check_name(value: str, what: str = "an entity name") -> str:
    """``value`` if it can be an entity's name: text every store holds (:func:`check_text`), at most
    :data:`MAX_NAME_CHARS` characters."""
    return check_text(check_name_length(value, what), what)


def check_name_length(value: str, what: str = "an entity name") -> str:
    """``value`` if it is at most :data:`MAX_NAME_CHARS` characters long (what every record checks; the doors check
    the text too, :func:`check_name`)."""
    if len(value) > MAX_NAME_CHARS:
        raise ValidationError(
            f"{what} is {len(value):,} characters long; a name is at most {MAX_NAME_CHARS} (is it a sentence? state "
            "it as a fact or an episode)"
        )
    return value


#: How deeply lists and maps may nest in what tkg stores (metadata, attributes, JSON episodes): msgpack, which
#: writes snapshots and journals, refuses past 511 levels, and Python's JSON and recursion stop near 1,000.
MAX_NESTING = 100


def check_nesting(value: Any, what: str = "value", *, text_keys: bool = False) -> None:
    """Raise :class:`ValidationError` if lists and maps nest in ``value`` deeper than :data:`MAX_NESTING` levels
    (walked without recursion, so any depth is reported, never a ``RecursionError``); with ``text_keys``, also if a
    map has a key that is not a string (JSON would write ``2`` or ``None`` as the text ``"2"`` or ``"null"``)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            if text_keys and not all(isinstance(key, str) for key in item):
                wrong = next(key for key in item if not isinstance(key, str))
                raise ValidationError(f"{what} has a key that is not a string: {wrong!r} (JSON keys are text)")
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        _check_depth(depth, what)
        stack.extend((child, depth + 1) for child in children)


def loads_checked(text: str, what: str, **options: Any) -> Any:
    """``json.loads(text, **options)`` that refuses a value nesting deeper than :data:`MAX_NESTING` levels with a
    :class:`ValidationError` naming ``what`` (however deep: the parser's own recursion limit included). Malformed
    JSON raises the parser's ``ValueError``, for the caller to word."""
    try:
        value = json.loads(text, **options)
    except RecursionError:
        raise ValidationError(
            f"{what} nests lists or maps deeper than {MAX_NESTING} levels: tkg cannot store it"
        ) from None
    check_nesting(value, what)
    return value


def _check_depth(depth: int, what: str) -> None:
    if depth > MAX_NESTING:
        raise ValidationError(f"{what} nests lists or maps deeper than {MAX_NESTING} levels: tkg cannot store it")


def check_storable(value: Any, what: str = "value", depth: int = 1) -> None:
    """Raise :class:`ValidationError` unless ``value`` is plain data every store can hold: text (see
    :func:`check_text`), 64-bit integers, floats, booleans, None, datetimes, lists and maps with text keys, nested
    at most :data:`MAX_NESTING` levels (so the walk never recurses deeper than that)."""
    if isinstance(value, str):
        check_text(value, what)
    elif isinstance(value, bool) or value is None or isinstance(value, float | datetime):
        return
    elif isinstance(value, int):
        if not -(2**63) <= value < 2**64:
            raise ValidationError(f"{what} holds an integer wider than 64 bits ({value})")
    elif isinstance(value, Mapping):
        _check_depth(depth, what)
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValidationError(f"{what} has a key that is not text: {key!r}")
            check_text(key, what)
            check_storable(item, what, depth + 1)
    elif isinstance(value, list | tuple):
        _check_depth(depth, what)
        for item in value:
            check_storable(item, what, depth + 1)
    else:
        raise ValidationError(f"{what} holds a {type(value).__name__}, which tkg cannot store")


def check_fields(record: Any) -> None:
    """Raise :class:`ValidationError` unless every field of ``record`` (a record built from outside data: an
    import) is of its declared type and holds what every store can write: text as :func:`check_text` wants it,
    tuples of such text, maps of plain data (:func:`check_storable`). A record checks its ids, times, enums and
    vectors itself; the entry points check text as it arrives, and this does it for a whole record."""
    for f in dataclasses.fields(record):
        value, declared = getattr(record, f.name), str(f.type).replace(" ", "")
        what = f"{record.kind.value} {f.name}"
        if declared in ("str", "str|None"):
            if not isinstance(value, str) and not (value is None and declared == "str|None"):
                raise ValidationError(f"{what} must be text, not {type(value).__name__}")
            if value is not None:
                check_text(value, what)
        elif declared.startswith("tuple[str"):
            if not all(isinstance(item, str) for item in value):
                raise ValidationError(f"{what} must be a list of text")
            for item in value:
                check_text(item, what)
        elif declared.startswith("Mapping["):
            if not isinstance(value, Mapping):
                raise ValidationError(f"{what} must be a map, not {type(value).__name__}")
            check_storable(value, what)


#: What separates an entity's labels where they are listed in one field (GraphML, Neo4j's ``:LABEL`` column): a
#: label never holds it (the caller's is refused, the LLM's cut there).
LABEL_SEPARATOR = ";"


def has_relation_name(text: str) -> bool:
    """Whether :func:`relation_name` finds a name in ``text`` (a letter or digit A-Z, 0-9), rather than falling back
    to ``RELATES_TO``."""
    return re.search(r"[A-Za-z0-9]", text) is not None


def relation_name(text: str) -> str:
    """Turn free text such as ``"works at"`` into a relation name (``WORKS_AT``); ``RELATES_TO`` when it has no
    letter or digit A-Z, 0-9 (:func:`has_relation_name`)."""
    name = re.sub(r"[^A-Za-z0-9]+", "_", text.strip()).strip("_").upper()
    if not name:
        return "RELATES_TO"
    if not name[0].isalpha():
        name = "R_" + name
    return name[:100]


def _vec_eq(a: Vector | None, b: Vector | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and bool(np.array_equal(a, b))


class _Record:
    """Shared behaviour of records: value equality that understands numpy vectors, and validation helpers."""

    kind: ClassVar[Kind]
    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            a, b = getattr(self, f.name), getattr(other, f.name)
            if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
                if not _vec_eq(a, b):
                    return False
            elif a != b:
                return False
        return True

    __hash__ = None  # type: ignore[assignment]

    def _set(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)

    def _check_common(self) -> None:
        check_id(self.id, f"{self.kind} id")  # type: ignore[attr-defined]
        check_group_id(self.group_id)  # type: ignore[attr-defined]
        self._set("created_at", to_utc(self.created_at, "created_at"))  # type: ignore[attr-defined]

    def _check_vector(self, name: str) -> None:
        value = getattr(self, name)
        if value is None:
            return
        arr = np.asarray(value, dtype=np.float32)
        if arr.ndim != 1 or arr.size == 0:
            raise ValidationError(f"{self.kind}.{name} must be a 1-d vector")
        arr = np.ascontiguousarray(arr)
        arr.setflags(write=False)
        self._set(name, arr)


@dataclass(frozen=True, slots=True, eq=False)
class Episode(_Record):
    """A raw input, stored verbatim: the ground truth that entities and facts are derived from."""

    kind: ClassVar[Kind] = Kind.EPISODE
    id: str
    group_id: str
    content: str
    source: EpisodeSource
    reference_time: datetime
    created_at: datetime
    source_description: str = ""
    name: str = ""
    status: EpisodeStatus = EpisodeStatus.STORED
    error: str = ""
    attributes: Mapping[str, Any] = field(default_factory=dict)
    embedding: Vector | None = field(default=None, repr=False)
    #: The speaker's UTC offset at ``reference_time`` in seconds (``reference_time`` itself is stored in UTC):
    #: calendar phrases ("yesterday", "last weekend") are resolved on the speaker's own calendar day.
    reference_offset: int = 0

    def __post_init__(self) -> None:
        self._check_common()
        self._set("source", EpisodeSource(self.source))
        if not isinstance(self.reference_offset, int) or abs(self.reference_offset) >= 86_400:
            raise ValidationError(f"reference_offset must be whole seconds within a day, not {self.reference_offset!r}")
        self._set("status", EpisodeStatus(self.status))
        self._set("attributes", dict(self.attributes))
        self._set("reference_time", to_utc(self.reference_time, "reference_time"))
        self._check_vector("embedding")

    @property
    def local_reference(self) -> datetime:
        """``reference_time`` on the speaker's clock (its UTC offset), for calendar arithmetic."""
        return self.reference_time.astimezone(timezone(timedelta(seconds=self.reference_offset)))


@dataclass(frozen=True, slots=True, eq=False)
class Entity(_Record):
    """A thing the episodes talk about: a person, place, organisation, concept."""

    kind: ClassVar[Kind] = Kind.ENTITY
    id: str
    group_id: str
    name: str
    created_at: datetime
    summary: str = ""
    labels: tuple[str, ...] = ("Entity",)
    attributes: Mapping[str, Any] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    name_embedding: Vector | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._check_common()
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValidationError("entity name must be a non-empty string")
        check_name_length(self.name)
        self._set("labels", tuple(self.labels))
        self._set("aliases", tuple(self.aliases))
        for alias in self.aliases:
            check_name_length(alias, "an entity alias")
        self._set("attributes", dict(self.attributes))
        self._check_vector("name_embedding")


@dataclass(frozen=True, slots=True, eq=False)
class Fact(_Record):
    """An entity edge: a relation between two entities, with its sentence and both timelines."""

    kind: ClassVar[Kind] = Kind.FACT
    id: str
    group_id: str
    source_id: str
    target_id: str
    relation: str
    fact: str
    created_at: datetime
    valid_at: datetime | None = None
    invalid_at: datetime | None = None
    expired_at: datetime | None = None
    episodes: tuple[str, ...] = ()
    attributes: Mapping[str, Any] = field(default_factory=dict)
    #: The fact whose arrival ended this one (set together with ``expired_at``); None while it is not superseded.
    invalidated_by: str | None = None
    #: This fact's own ``invalid_at`` before it was superseded, restored if the superseding fact is removed.
    prior_invalid_at: datetime | None = None
    embedding: Vector | None = field(default=None, repr=False)
    #: The LLM's verdicts on the older facts this one was compared with when it arrived: fact id -> Verdict.
    verdicts: Mapping[str, Verdict] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._check_common()
        check_relation(self.relation)
        if not isinstance(self.fact, str) or not self.fact.strip():
            raise ValidationError("fact text must be a non-empty string")
        for name in ("valid_at", "invalid_at", "expired_at", "prior_invalid_at"):
            value = getattr(self, name)
            if value is not None:
                self._set(name, to_utc(value, name))
        if self.valid_at is not None and self.invalid_at is not None and self.invalid_at < self.valid_at:
            from tkg.errors import TimestampError

            raise TimestampError(
                f"fact {self.fact!r}: invalid_at {self.invalid_at.isoformat()} is before valid_at "
                f"{self.valid_at.isoformat()}"
            )
        if self.expired_at is not None and self.expired_at < self.created_at:
            from tkg.errors import TimestampError

            raise TimestampError(f"fact {self.fact!r}: expired_at is before created_at")
        self._set("episodes", tuple(self.episodes))
        self._set("attributes", dict(self.attributes))
        self._set("verdicts", {str(k): _verdict(v) for k, v in self.verdicts.items()})
        self._check_vector("embedding")


@dataclass(frozen=True, slots=True, eq=False)
class Community(_Record):
    """A cluster of strongly connected entities, with a summary."""

    kind: ClassVar[Kind] = Kind.COMMUNITY
    id: str
    group_id: str
    name: str
    created_at: datetime
    summary: str = ""
    name_embedding: Vector | None = field(default=None, repr=False)
    #: A fingerprint of the members the name and summary were written from (``""``: not known, a community
    #: written before tkg kept it). A refresh summarises again a community whose members differ from it.
    summarised: str = ""

    def __post_init__(self) -> None:
        self._check_common()
        self._check_vector("name_embedding")


@dataclass(frozen=True, slots=True, eq=False)
class Mention(_Record):
    """Episode -> entity: the episode names the entity. Its id is derived from its two ends.

    A mention also keeps what the episode said about the entity (the name as written, a type label, a one-line
    summary, typed attributes); an entity's profile is the fold of its mentions (:mod:`tkg.profiles`), so removing
    an episode can recompute the entity as if the episode had never been added.
    """

    kind: ClassVar[Kind] = Kind.MENTION
    episode_id: str
    entity_id: str
    group_id: str
    created_at: datetime
    name: str = ""
    label: str = ""
    summary: str = ""
    attributes: Mapping[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return f"{self.episode_id}>{self.entity_id}"

    def __post_init__(self) -> None:
        check_group_id(self.group_id)
        self._set("created_at", to_utc(self.created_at, "created_at"))
        self._set("attributes", dict(self.attributes))


@dataclass(frozen=True, slots=True, eq=False)
class Membership(_Record):
    """Community -> entity: the entity belongs to the community. Its id is derived from its two ends."""

    kind: ClassVar[Kind] = Kind.MEMBERSHIP
    community_id: str
    entity_id: str
    group_id: str
    created_at: datetime

    @property
    def id(self) -> str:
        return f"{self.community_id}>{self.entity_id}"

    def __post_init__(self) -> None:
        check_group_id(self.group_id)
        self._set("created_at", to_utc(self.created_at, "created_at"))


def evolve(record: Fact, **changes: Any) -> Fact:
    """A copy of a fact with some fields changed, without validating it again: for values derived from valid
    records on hot paths (truth maintenance), where :func:`dataclasses.replace` re-runs every check."""
    copy = object.__new__(Fact)
    for name in _FACT_FIELDS:
        object.__setattr__(copy, name, changes[name] if name in changes else getattr(record, name))
    return copy


Record: TypeAlias = Episode | Entity | Fact | Community | Mention | Membership

_FACT_FIELDS = tuple(f.name for f in dataclasses.fields(Fact))

RECORD_TYPES: dict[Kind, type[Record]] = {
    Kind.EPISODE: Episode,
    Kind.ENTITY: Entity,
    Kind.FACT: Fact,
    Kind.COMMUNITY: Community,
    Kind.MENTION: Mention,
    Kind.MEMBERSHIP: Membership,
}

# Which field of each kind holds the vector that cosine search runs over.
VECTOR_FIELD: dict[Kind, str] = {
    Kind.EPISODE: "embedding",
    Kind.ENTITY: "name_embedding",
    Kind.FACT: "embedding",
    Kind.COMMUNITY: "name_embedding",
}

#: The kinds whose records have a text that full-text search runs over (:func:`search_text`).
TEXT_KINDS = (Kind.EPISODE, Kind.ENTITY, Kind.FACT, Kind.COMMUNITY)


#: The fields :func:`search_text` reads, by kind: a record rewritten with these (and its group) unchanged keeps its
#: search text, so a backend need not index it again.
SEARCH_FIELDS: dict[Kind, tuple[str, ...]] = {
    Kind.FACT: ("relation", "fact"),
    Kind.ENTITY: ("name", "aliases", "summary"),
    Kind.EPISODE: ("content",),
    Kind.COMMUNITY: ("name", "summary"),
}

_SEARCH_TEXT: dict[Kind, Callable[..., str]] = {
    Kind.FACT: lambda relation, fact: f"{relation.replace('_', ' ').lower()} {fact}",
    Kind.ENTITY: lambda name, aliases, summary: " ".join((name, *aliases, summary)),
    Kind.EPISODE: lambda content: content,
    Kind.COMMUNITY: lambda name, summary: f"{name} {summary}",
}


def search_text(record: Record) -> str:
    """The text that full-text (BM25) search indexes for a record (from its :data:`SEARCH_FIELDS` alone)."""
    fields = SEARCH_FIELDS.get(record.kind)
    return "" if fields is None else _SEARCH_TEXT[record.kind](*(getattr(record, name) for name in fields))


def vector_of(record: Record) -> Vector | None:
    name = VECTOR_FIELD.get(record.kind)
    return None if name is None else getattr(record, name)
