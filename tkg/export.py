"""Export formats: a memory's records written for other tools, and tkg's own lossless JSONL read back.

Pure functions over records (the facade, :meth:`tkg.Memory.export`, reads them under its lock):

* ``jsonl`` -- lossless: a header line (``{"tkg_export": 1, "embedder": ..., "dim": ..., "groups": [...]}``), then
  one line per record, ``{"kind": "fact", "record": {...}}``, in the record codec's JSON form
  (:mod:`tkg.codec`: times as ``{"__dt__": microseconds}``, vectors as base64 float32). Every record, every
  timestamp, every vector: :meth:`tkg.Memory.import_jsonl` rebuilds the same memory.
* ``csv`` -- the facts, one row each, with both entities' names and the four timestamps in ISO-8601.
* ``graphml`` -- the entity graph (entities as nodes, facts as edges with their relation, sentence and times;
  ``tkg_id`` holds the record ids),
  written by igraph; Gephi, yEd, NetworkX and Cytoscape read it.
* ``neo4j`` -- a folder with ``entities.csv`` and ``facts.csv`` in the headers ``neo4j-admin database import``
  reads (``id:ID``, ``:LABEL``, ``:START_ID``, ``:END_ID``, ``:TYPE``).
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from tkg.codec import decode_record, encode_record
from tkg.errors import ValidationError
from tkg.models import LABEL_SEPARATOR, Entity, Fact, Kind, Record, check_fields

FORMATS = ("jsonl", "csv", "graphml", "neo4j")
FORMAT_VERSION = 1
#: The order records are written in: what a record points to comes first.
KIND_ORDER = (Kind.EPISODE, Kind.ENTITY, Kind.COMMUNITY, Kind.FACT, Kind.MENTION, Kind.MEMBERSHIP)
FACT_COLUMNS = (
    "id",
    "group_id",
    "source_id",
    "source",
    "relation",
    "target_id",
    "target",
    "fact",
    "valid_at",
    "invalid_at",
    "created_at",
    "expired_at",
    "invalidated_by",
    "episodes",
)


def _iso(value: datetime | None) -> str:
    return value.isoformat() if value is not None else ""


# -- jsonl ------------------------------------------------------------------------------------------------------
def jsonl_lines(records: Mapping[Kind, Sequence[Record]], header: Mapping[str, Any]) -> Iterator[str]:
    """The lines of a ``jsonl`` export (no newlines)."""
    yield json.dumps({"tkg_export": FORMAT_VERSION, **header}, ensure_ascii=False)
    for kind in KIND_ORDER:
        for record in records.get(kind, ()):
            line = {"kind": kind.value, "record": encode_record(record, json=True)}
            yield json.dumps(line, ensure_ascii=False, allow_nan=False)


def read_jsonl(lines: Iterable[str], source: str) -> tuple[dict[str, Any], list[Record]]:
    """The header and the records of a ``jsonl`` export; :class:`ValidationError` naming the line of anything
    that is not one."""
    header: dict[str, Any] | None = None
    records: list[Record] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"{source}:{number}: not JSON ({exc.msg})") from None
        if header is None:
            if not isinstance(item, dict) or item.get("tkg_export") != FORMAT_VERSION:
                raise ValidationError(
                    f"{source}:{number}: not a tkg export (its first line must be the header written by "
                    f"'tkg export --format jsonl', version {FORMAT_VERSION})"
                )
            header = item
            continue
        try:
            record = decode_record(Kind(item["kind"]), item["record"], json=True)
            check_fields(record)  # what the entry points check of text, for every field: nothing unstorable gets in
        except RecursionError:
            raise ValidationError(f"{source}:{number}: not a tkg record: nested too deep") from None
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:  # the record's own message
            raise ValidationError(f"{source}:{number}: not a tkg record: {exc}") from None
        records.append(record)
    if header is None:
        raise ValidationError(f"{source}: empty, not a tkg export")
    return header, records


# -- csv --------------------------------------------------------------------------------------------------------
def write_facts_csv(out: IO[str], facts: Sequence[Fact], entities: Sequence[Entity]) -> None:
    names = {e.id: e.name for e in entities}
    writer = csv.writer(out)
    writer.writerow(FACT_COLUMNS)
    for f in facts:
        writer.writerow(
            [
                f.id,
                f.group_id,
                f.source_id,
                names.get(f.source_id, ""),
                f.relation,
                f.target_id,
                names.get(f.target_id, ""),
                f.fact,
                _iso(f.valid_at),
                _iso(f.invalid_at),
                _iso(f.created_at),
                _iso(f.expired_at),
                f.invalidated_by or "",
                ";".join(f.episodes),
            ]
        )


# -- graphml ----------------------------------------------------------------------------------------------------
#: The characters XML 1.0 cannot hold (control characters but tab, newline and return; U+FFFE, U+FFFF).
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml(text: str) -> str:
    """``text`` as GraphML can hold it: each character XML cannot hold written as U+FFFD (the JSONL export keeps
    every character)."""
    return _NOT_XML.sub("\ufffd", text)


def write_graphml(path: Path, facts: Sequence[Fact], entities: Sequence[Entity]) -> None:
    import igraph

    index = {e.id: i for i, e in enumerate(entities)}
    kept = [f for f in facts if f.source_id in index and f.target_id in index]
    graph = igraph.Graph(n=len(entities), edges=[(index[f.source_id], index[f.target_id]) for f in kept], directed=True)
    graph.vs["tkg_id"] = [e.id for e in entities]  # "id" is GraphML's own node attribute
    graph.vs["name"] = [_xml(e.name) for e in entities]
    graph.vs["group_id"] = [e.group_id for e in entities]
    graph.vs["labels"] = [_xml(LABEL_SEPARATOR.join(e.labels)) for e in entities]
    graph.vs["summary"] = [_xml(e.summary) for e in entities]
    graph.es["tkg_id"] = [f.id for f in kept]
    graph.es["relation"] = [f.relation for f in kept]
    graph.es["fact"] = [_xml(f.fact) for f in kept]
    for name in ("valid_at", "invalid_at", "created_at", "expired_at"):
        graph.es[name] = [_iso(getattr(f, name)) for f in kept]
    graph.write_graphml(str(path))
    if entities and kept:
        return
    # Every attribute is text; igraph declares one whose list is empty (no entities, or no facts) boolean.
    text = path.read_text(encoding="utf-8")
    head, body = text.split("<graph ", 1)
    path.write_text(head.replace('attr.type="boolean"', 'attr.type="string"') + "<graph " + body, encoding="utf-8")


# -- neo4j ------------------------------------------------------------------------------------------------------
#: The files of a ``neo4j`` export, in its folder: what each holds is written by the function beside it.
NEO4J_FILES = ("entities.csv", "facts.csv")


def write_neo4j_entities(out: IO[str], entities: Sequence[Entity]) -> None:
    writer = csv.writer(out)
    writer.writerow(["id:ID", "name", "group_id", "summary", ":LABEL"])
    for e in entities:
        labels = LABEL_SEPARATOR.join(["Entity", *(x for x in e.labels if x != "Entity")])
        writer.writerow([e.id, e.name, e.group_id, e.summary, labels])


def write_neo4j_facts(out: IO[str], facts: Sequence[Fact]) -> None:
    writer = csv.writer(out)
    writer.writerow(
        [
            ":START_ID",
            ":END_ID",
            ":TYPE",
            "id",
            "fact",
            "group_id",
            "valid_at",
            "invalid_at",
            "created_at",
            "expired_at",
        ]
    )
    for f in facts:
        writer.writerow(
            [
                f.source_id,
                f.target_id,
                f.relation,
                f.id,
                f.fact,
                f.group_id,
                _iso(f.valid_at),
                _iso(f.invalid_at),
                _iso(f.created_at),
                _iso(f.expired_at),
            ]
        )
