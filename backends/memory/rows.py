"""Records as the in-memory store keeps them: one tuple of plain values per record (a row), made into a record
again when read.

Why not keep the records themselves: every instance of a class is tracked by Python's cycle collector, and a full
collection walks every tracked object alive -- ~0.2 s at 100,000 facts (~415,000 objects, three quarters of them
records), ~2 s at a million, during which every thread of the process stops. A tuple whose items are all plain
(strings, numbers, datetimes, None, numpy arrays, tuples of those) is dropped from the collector's lists the first
time it looks at it, so rows cost the collector nothing once stored. Hence, in a row: a map field is a tuple of its
items (a dict, even an empty one, would keep its tuple tracked), an enum member is its text value, and a map of
enum members (a fact's verdicts) is its keys and its values' texts, two tuples (rebuilt with ``zip``: a fact
read around a hot entity may carry dozens of verdicts). A record whose attributes nest lists or maps keeps its row
tracked; nothing else changes for it.

A record is built from its row when read (~1 us, no validation: it was validated when it was written), equal to
the one written; each table keeps the last records it made for the next reads of the same rows (:mod:`.tables`).

The rows themselves are held in an :class:`.arrays.ObjectList`, a numpy array of objects, which the collector
does not walk either: a list of rows, even of untracked ones, costs a full collection a visit of each item (at
100,000 facts the tables' lists made ~900,000 such visits, ~40% of a collection's time).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from operator import itemgetter
from typing import Any, TypeAlias

from tkg.codec import enum_fields, field_codes, record_maker
from tkg.models import RECORD_TYPES, Kind, Record, Vector

from .precision import Precision

Row: TypeAlias = tuple[Any, ...]


def _items(value: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(value.items()) if value else ()


def _member_values(value: Mapping[str, enum.Enum]) -> tuple[tuple[str, ...], tuple[str, ...]] | tuple[()]:
    return (tuple(value), tuple(map(str, value.values()))) if value else ()


def _members_of(members: Mapping[str, enum.Enum]) -> Callable[[Any], dict[str, enum.Enum]]:
    member = members.__getitem__

    def decode(packed: tuple[tuple[str, ...], tuple[str, ...]] | tuple[()]) -> dict[str, enum.Enum]:
        return dict(zip(packed[0], map(member, packed[1]), strict=True)) if packed else {}

    return decode


class RowCodec:
    """The row form of one record type: :meth:`pack` a record (its vector given apart: the index's view of its
    stored row), :meth:`unpack` a row, :meth:`getter` for fields read straight from rows. ``vector``: how a stored
    row becomes the record's vector (None: the row is the vector, float32)."""

    def __init__(self, kind: Kind, vector: Callable[[Any], Vector | None] | None = None) -> None:
        cls = RECORD_TYPES[kind]
        codes = field_codes(cls)
        self.positions = {name: i for i, (name, _) in enumerate(codes)}
        enums = enum_fields(cls)
        pack: dict[str, Callable[[Any], Any]] = {}
        unpack: dict[str, Callable[[Any], Any]] = {}
        for name, code in codes:
            if name in enums:
                how, members = enums[name]
                pack[name] = str if how == "val" else _member_values
                unpack[name] = members.__getitem__ if how == "val" else _members_of(members)
            elif code == "map":
                pack[name], unpack[name] = _items, dict
            elif code == "vec" and vector is not None:
                unpack[name] = vector
        scope: dict[str, Any] = {f"w{i}": pack[name] for i, (name, _) in enumerate(codes) if name in pack}
        values = [
            "v" if code == "vec" else (f"w{i}(r.{name})" if name in pack else f"r.{name}")
            for i, (name, code) in enumerate(codes)
        ]
        source = f"def pack(r, v):\n    return ({', '.join(values)},)\n"
        exec(source, scope)  # generated from the dataclass's own field names
        self._pack: Callable[[Record, Vector | None], Row] = scope["pack"]
        self._make = record_maker(cls, unpack)
        self._readers = unpack  # field -> its value as the record holds it, from the row's
        self.id_at: Callable[[Row], str] = (
            itemgetter(self.positions["id"]) if "id" in self.positions else lambda row: self.unpack(row).id
        )

    def pack(self, record: Record, vector: Vector | None) -> Row:
        """``record`` as a row; ``vector`` stands for its vector field (None for kinds without one)."""
        return self._pack(record, vector)

    def unpack(self, row: Row) -> Record:
        return self._make(*row)

    def column(self, rows: Iterable[Row], name: str) -> list[Any]:
        """The values of field ``name`` in these rows, as the records hold them (without building a record)."""
        values = list(map(itemgetter(self.positions[name]), rows))
        reader = self._readers.get(name)
        return values if reader is None else list(map(reader, values))

    def getter(self, *names: str) -> Callable[[Row], Any]:
        """Reads these fields from a row, as :func:`operator.itemgetter` does (plain fields only)."""
        return itemgetter(*(self.positions[name] for name in names))


#: One codec per kind (for float32 vectors).
CODECS: dict[Kind, RowCodec] = {kind: RowCodec(kind) for kind in Kind}


def row_codecs(precision: Precision) -> dict[Kind, RowCodec]:
    """One codec per kind for a store keeping its vectors at ``precision``."""
    return CODECS if precision.exact else {kind: RowCodec(kind, precision.read) for kind in Kind}
