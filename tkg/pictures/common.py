"""What both pictures share: finding the entity to draw, how a fact stands at a moment, bounded arguments, and
writing a file atomically (a temporary file renamed into place, so readers never see half a picture and an error
leaves nothing behind)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tkg.errors import NotFoundError, ValidationError
from tkg.models import Entity, Fact, Kind, check_group_id
from tkg.persistence import shared_temporary
from tkg.timeline import believed_invalid_at
from tkg.timeutil import iso

if TYPE_CHECKING:
    from tkg.memory import Memory

__all__ = [
    "Status",
    "bounded_int",
    "entities_by_id",
    "fact_status",
    "find_entity",
    "known_entity",
    "one_line",
    "writable_path",
    "write_atomic",
]

#: How a fact stands at a moment (see :func:`fact_status`); both pictures draw the four differently.
Status = Literal["current", "ended", "superseded", "future"]


def fact_status(fact: Fact, now: datetime) -> Status:
    """How a fact stands at ``now`` (a transaction time: what the memory knew then).

    ``superseded``: a later fact ended it (``expired_at`` is set and known by ``now``); ``ended``: its own
    ``invalid_at`` has passed; ``future``: its ``valid_at`` has not come yet; else ``current``.
    """
    if fact.expired_at is not None and fact.expired_at <= now:
        return "superseded"
    end = believed_invalid_at(fact, now)
    if end is not None and end <= now:
        return "ended"
    if fact.valid_at is not None and fact.valid_at > now:
        return "future"
    return "current"


def find_entity(memory: Memory, name_or_id: str, *, group_ids: Iterable[str] | str | None = None) -> Entity:
    """The entity with this id, else the one whose name or alias is exactly this (else the same ignoring case,
    else the same once normalised as entity resolution does).

    ``group_ids`` narrows the search. Raises :class:`NotFoundError` when nothing matches and
    :class:`ValidationError` when several entities match, listing them so that one can be picked by id.
    """
    if not isinstance(name_or_id, str) or not name_or_id.strip():
        raise ValidationError("an entity id or name is needed, got an empty value")
    if isinstance(group_ids, str):
        group_ids = [group_ids]
    groups = None if group_ids is None else frozenset(check_group_id(g) for g in group_ids)
    text = name_or_id.strip()
    direct = memory.get_many(Kind.ENTITY, [text])[0]
    if isinstance(direct, Entity) and (groups is None or direct.group_id in groups):
        return direct
    # The memory's name index finds the candidates (normalised names and aliases); an exact match wins over one
    # that ignores case, which wins over one that only normalises the same.
    candidates = {e.id: e for e in memory.find_entities(text, group_ids=None if groups is None else sorted(groups))}
    folded = text.casefold()
    found = (
        [e for e in candidates.values() if text == e.name or text in e.aliases]
        or [e for e in candidates.values() if folded in {n.casefold() for n in (e.name, *e.aliases)}]
        or list(candidates.values())
    )
    where = "" if groups is None else f" in group(s) {', '.join(sorted(groups))}"
    if not found:
        raise NotFoundError(f"no entity has the id, name or alias {text!r}{where}")
    if len(found) > 1:
        found.sort(key=lambda e: (e.group_id, e.name, e.id))
        listed = "; ".join(f"{e.name!r} (id {e.id}, group {e.group_id}{_labels_note(e)})" for e in found[:10])
        more = f"; and {len(found) - 10} more" if len(found) > 10 else ""
        raise ValidationError(
            f"{len(found)} entities are named {text!r}{where}: {listed}{more}; pass an id instead, or narrow the group"
        )
    return found[0]


def _labels_note(entity: Entity) -> str:
    labels = [label for label in entity.labels if label != "Entity"]
    return f", {'/'.join(labels)}" if labels else ""


def known_entity(memory: Memory, entity_id: str, known_at: datetime | None) -> Entity:
    """The entity with this id, if the memory knew it at ``known_at`` (any time when ``None``)."""
    if not isinstance(entity_id, str) or not entity_id:
        raise ValidationError(f"entity_id must be a non-empty string, got {entity_id!r}")
    record = memory.get_many(Kind.ENTITY, [entity_id])[0]
    if not isinstance(record, Entity):
        raise NotFoundError(f"no entity with id {entity_id!r}")
    if known_at is not None and record.created_at > known_at:
        raise NotFoundError(
            f"entity {record.name!r} ({entity_id}) was recorded at {iso(record.created_at)}, after known_at "
            f"{iso(known_at)}: the memory did not know it yet"
        )
    return record


def entities_by_id(memory: Memory, ids: Iterable[str]) -> dict[str, Entity]:
    """The entities among ``ids`` that exist, by id (for the names at the far end of facts)."""
    wanted = sorted(set(ids))
    return {e.id: e for e in memory.get_many(Kind.ENTITY, wanted) if isinstance(e, Entity)}


def one_line(text: str, limit: int) -> str:
    """One line of at most ``limit`` characters (user text may hold newlines and control characters)."""
    flat = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def bounded_int(value: object, what: str, maximum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= maximum:
        raise ValidationError(f"{what} must be an integer from 1 to {maximum}, got {value!r}")
    return value


def writable_path(path: str | os.PathLike[str]) -> Path:
    """Check before any work that a file could be written at ``path``."""
    target = Path(path)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise ValidationError(f"cannot write {target}: directory {directory} does not exist")
    if target.is_dir():
        raise ValidationError(f"cannot write {target}: it is a directory")
    return target


def write_atomic(target: Path, data: bytes) -> None:
    """Write to a temporary file beside ``target`` and rename it into place: readers never see half a file."""
    fd, tmp = shared_temporary(target)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
