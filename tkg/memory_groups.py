"""Whole groups in and out of a memory: export (tkg's lossless JSONL, CSV, GraphML, Neo4j CSV), import of tkg's
JSONL, and erasure. :class:`tkg.Memory` is the only class that uses it."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from tkg import export as formats
from tkg.clock import Clock
from tkg.community_tier import CommunityTier
from tkg.embedders.base import Embedder
from tkg.errors import ConfigurationError, ValidationError
from tkg.locks import MemoryLocks
from tkg.models import Entity, Fact, Kind, check_group_id
from tkg.persistence import file_path, shared_temporary
from tkg.revisions import check_history
from tkg.storage import Store, WriteBatch

log = logging.getLogger("tkg.memory")


class MemoryGroups:
    """Export, import and erasure of whole groups (see :class:`tkg.Memory`)."""

    _store: Store
    _locks: MemoryLocks
    _clock: Clock
    _embedder: Embedder
    _communities: CommunityTier | None

    def export(self, path: str | Path, format: str = "jsonl", group_ids: Sequence[str] | None = None) -> int:
        """Write these groups (default: all) to ``path`` in ``format`` (:data:`tkg.export.FORMATS`; ``neo4j``
        writes a folder), and return the number of records written. ``jsonl`` is lossless: every record with
        its four timestamps and its vectors, read back by :meth:`import_jsonl`. The others are for other tools
        (see :mod:`tkg.export`). The records are read at one instant (under the read lock); the file is written
        to a temporary name and renamed, so a failed export leaves no partial file."""
        if format not in formats.FORMATS:
            raise ValidationError(f"unknown export format {format!r}; use one of {', '.join(formats.FORMATS)}")
        target = file_path(path, "an export's path")
        groups = frozenset(check_group_id(g) for g in group_ids) if group_ids is not None else None
        with self._locks.read():
            records = {kind: list(self._store.scan(kind, groups)) for kind in formats.KIND_ORDER}
            held = sorted(groups if groups is not None else self._store.groups())
        entities = [e for e in records[Kind.ENTITY] if isinstance(e, Entity)]
        facts = [f for f in records[Kind.FACT] if isinstance(f, Fact)]
        if format == "neo4j":
            if target.exists() and not target.is_dir():
                raise ValidationError(f"cannot write {target}: it is a file; a neo4j export is a folder")
            try:
                target.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ValidationError(f"cannot make the folder {target}: {exc.strerror or exc}") from None
            entities_csv, facts_csv = (target / name for name in formats.NEO4J_FILES)
            _write_all(
                [
                    (entities_csv, _text(lambda out: formats.write_neo4j_entities(out, entities))),
                    (facts_csv, _text(lambda out: formats.write_neo4j_facts(out, facts))),
                ]
            )
            return len(facts) + len(entities)
        if format == "graphml":
            _write_all([(target, lambda path: formats.write_graphml(path, facts, entities))])
            return len(facts) + len(entities)
        if format == "csv":
            _write_all([(target, _text(lambda out: formats.write_facts_csv(out, facts, entities)))])
            return len(facts)
        header = {
            "embedder": self._embedder.name,
            "dim": self._embedder.dim,
            "groups": held,
            "exported_at": self._clock.now().isoformat(),
        }
        _write_all(
            [(target, _text(lambda out: out.writelines(line + "\n" for line in formats.jsonl_lines(records, header))))]
        )
        return sum(len(v) for v in records.values())

    def import_jsonl(self, path: str | Path) -> dict[str, int]:
        """Add the groups of a ``jsonl`` export (:meth:`export`) to this memory, exactly as they were: every
        record, timestamp and vector. All or nothing, in one write. Refused (nothing written) when the export was
        made with another embedder, when one of its groups already holds records here (erase it first with
        :meth:`delete_group`, or import into another memory), or when a line is not a tkg record (the error names
        it). Returns the number of records imported per kind."""
        source = file_path(path, "an export's path")
        try:
            with open(source, encoding="utf-8") as lines:
                header, records = formats.read_jsonl(lines, str(source))
        except OSError as exc:
            raise ValidationError(f"cannot read {source}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:  # a snapshot, or another binary file, given for an export
            raise ValidationError(f"{source}: not UTF-8 text ({exc.reason}), so not a tkg export") from None
        if header.get("embedder") != self._embedder.name or header.get("dim") != self._embedder.dim:
            raise ConfigurationError(
                f"{source} was exported with the embedder {header.get('embedder')!r} ({header.get('dim')}-d); this "
                f"memory embeds with {self._embedder.name!r} ({self._embedder.dim}-d): import it into a memory with "
                "that embedder"
            )
        seen: set[tuple[Kind, str]] = set()
        for record in records:
            if (record.kind, record.id) in seen:
                raise ValidationError(
                    f"{source} holds the {record.kind.value} {record.id!r} twice: an export lists each record once"
                )
            seen.add((record.kind, record.id))
            if isinstance(record, Fact):
                check_history(record)
        groups = sorted({r.group_id for r in records})
        # The groups' locks too: an episode of one of them planned meanwhile would not see what is imported.
        with self._locks.groups(groups, self._store), self._locks.write():
            taken = sorted(set(groups) & self._store.groups())
            if taken:
                raise ValidationError(
                    f"group(s) {taken} already hold records in this memory; erase them first (delete_group) or "
                    "import into another memory"
                )
            # Ids name records across groups: one in use (an export edited to another group and imported back)
            # would move that record out of its group.
            ids: dict[Kind, list[str]] = {}
            for record in records:
                ids.setdefault(record.kind, []).append(record.id)
            used = [
                (kind, i)
                for kind, wanted in ids.items()
                for i, found in zip(wanted, self._store.get(kind, wanted), strict=True)
                if found is not None
            ]
            if used:
                raise ValidationError(
                    f"{len(used)} record id(s) in {source} are in use in this memory (e.g. {used[0][0].value} "
                    f"{used[0][1]!r}): a file exported from this memory cannot be imported into it again"
                )
            if records:
                self._store.write(WriteBatch(puts=records))
        imported = {kind.value: 0 for kind in Kind}
        for record in records:
            imported[record.kind.value] += 1
        log.info("imported %s: %d records in group(s) %s", source, len(records), groups)
        return imported

    def delete_group(self, group_id: str) -> dict[str, int]:
        """Erase a whole group for good: its episodes, entities, facts, mentions, communities and memberships.
        Everything else in tkg keeps history (facts end, they are not deleted); this does not, and is meant for
        privacy requests ("forget this user"). Other groups are untouched. Returns the number of records erased
        per kind (all zero for a group that holds nothing). A memory opened with :meth:`open` journals the
        erasure, and its next compaction writes a snapshot without the group; copies of older snapshot files you
        keep elsewhere still hold it."""
        check_group_id(group_id)
        groups = frozenset({group_id})
        with self._locks.group(group_id, self._store), self._locks.write():
            deletes = [(kind, record.id) for kind in Kind for record in self._store.scan(kind, groups)]
            if deletes:
                self._store.write(WriteBatch(deletes=deletes))
            if self._communities is not None:
                self._communities.forget(group_id)
        erased = {kind.value: 0 for kind in Kind}
        for kind, _ in deletes:
            erased[kind.value] += 1
        log.info("group %s erased: %s", group_id, ", ".join(f"{n} {kind}" for kind, n in erased.items() if n))
        return erased


def _text(write: Callable[[IO[str]], None]) -> Callable[[Path], None]:
    """``write`` given the file at a path, opened for UTF-8 text (newlines as written: CSV writes its own)."""

    def to(path: Path) -> None:
        with open(path, "w", newline="", encoding="utf-8") as out:
            write(out)

    return to


def _write_all(files: Sequence[tuple[Path, Callable[[Path], None]]]) -> None:
    """Write each file to a temporary name beside it, then rename them all over their targets: a failed export
    leaves no partial file, and the files it would replace as they were. An error is a ValidationError naming
    the file."""
    for target, _ in files:
        if not target.parent.is_dir():
            raise ValidationError(f"cannot write {target}: directory {target.parent} does not exist")
        if target.is_dir():  # the rename at the end would fail, naming the temporary file
            raise ValidationError(f"cannot write {target}: it is a directory; name a file in it")
    written: list[tuple[str, Path]] = []
    target = files[0][0]
    try:
        for target, write in files:
            fd, temporary = shared_temporary(target, "")
            os.close(fd)
            written.append((temporary, target))
            write(Path(temporary))
        for temporary, target in written:
            os.replace(temporary, target)
    except OSError as exc:
        raise ValidationError(f"cannot write {target}: {exc.strerror or exc}") from None
    finally:
        for temporary, _ in written:
            Path(temporary).unlink(missing_ok=True)
