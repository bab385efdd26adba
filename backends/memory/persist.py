"""The in-memory backend's own snapshot sections: its search indexes, carried through a snapshot so that a load
restores them instead of rebuilding them. The container (:mod:`tkg.snapshot`) stores these sections verbatim;
only this module knows what they hold.

Sections, per kind:

* ``slots/<kind>`` -- each record's slot (int64, in scan order): the indexes below are keyed by slot;
* ``scale/<kind>`` -- each record's stored ``1 / norm`` (float32), so exact scores reload bit-identically;
* ``hnsw/<kind>`` and ``hnswdata/<kind>`` -- the HNSW graph as hnswlib's pickle state: a msgpack map of its
  parameters and small arrays, and its per-element block (links and label) with hnswlib's copy of each vector cut
  out (a load puts the vectors back from the records' own, bit for bit). Format 2 files held hnswlib's own index
  file in ``hnsw/<kind>`` instead; it still loads (through a temporary file, as hnswlib reads only paths);
* ``bm25/<kind>`` -- the BM25 index's arrays (:meth:`TextIndex.export`).

Every section is checked against the records before it is used; one that does not fit is dropped and its index
rebuilt, never used. Implausible slots drop every index.
"""

from __future__ import annotations

import functools
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from itertools import chain, repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack
import numpy as np
import numpy.typing as npt

from tkg.codec import NO_TIME
from tkg.errors import BackendError
from tkg.integrity import check_write, nothing_stored
from tkg.models import VECTOR_FIELD, Entity, Fact, Kind, Record, search_text
from tkg.names import normalize_name
from tkg.revisions import has_history
from tkg.snapshot import pack
from tkg.storage import IndexExport, RecordSet, Sections
from tkg.timeutil import to_micros

from .arrays import Column, ObjectList
from .tables import MAX, MIN, SetIndex, Table, Timeline, name_key
from .text import TextMismatch
from .vectors import VectorIndex

if TYPE_CHECKING:
    from .store import InMemoryStore

_ID, _GROUP, _RELATION = attrgetter("id"), attrgetter("group_id"), attrgetter("relation")
_EPISODES = attrgetter("episodes")
_SOURCE, _TARGET = attrgetter("source_id"), attrgetter("target_id")
_EPISODE, _ENTITY, _COMMUNITY = attrgetter("episode_id"), attrgetter("entity_id"), attrgetter("community_id")


# -- export ----------------------------------------------------------------------------------------------------
def export_indexes(store: InMemoryStore) -> IndexExport:
    """The store's index sections, its time columns and a gather of its vectors (see the module docstring)."""
    tables, vectors, texts = store._tables, store._vectors, store._texts
    slots = {
        kind: np.fromiter((s for s, r in enumerate(t.rows) if r is not None), dtype=np.int64, count=t.live)
        for kind, t in tables.items()
    }
    sections: dict[str, bytes | npt.NDArray[Any]] = {}
    for kind in Kind:
        sections[f"slots/{kind.value}"] = np.asarray(slots[kind], dtype="<i8")
    for kind, index in vectors.items():
        live = slots[kind]
        scales = index.scales(live[live < index.has_vec.size]) if len(live) else np.zeros(0, np.float32)
        if len(scales) != len(live):  # records without vectors beyond the index's columns
            padded = np.ones(len(live), dtype=np.float32)
            padded[: len(scales)] = scales
            scales = padded
        sections[f"scale/{kind.value}"] = np.asarray(scales, dtype="<f4")
    for kind, text in texts.items():
        state = text.export()
        sections[f"bm25/{kind.value}"] = pack(
            {k: (_array(v) if isinstance(v, np.ndarray) else v) for k, v in state.items()}
        )
    for kind, index in vectors.items():
        graph = index.export_graph()
        if graph is not None:
            small = {k: _array(v) for k, v in graph.items() if isinstance(v, np.ndarray) and k != "level0"}
            sections[f"hnsw/{kind.value}"] = pack({"params": dict(graph["params"]), **small})
            sections[f"hnswdata/{kind.value}"] = np.ascontiguousarray(graph["level0"])
    times: dict[Kind, dict[str, npt.NDArray[np.int64]]] = {}
    for kind, table in tables.items():
        at = slots[kind]
        columns = {"created_at": table.created.view()[at]}
        if kind is Kind.FACT:
            for name, column, missing in (
                ("valid_at", table.valid, MIN),
                ("invalid_at", table.invalid, MAX),
                ("expired_at", table.expired, MAX),
                ("prior_invalid_at", table.prior, MAX),
            ):
                values = column.view()[at]
                columns[name] = np.where(values == missing, NO_TIME, values)
        elif kind is Kind.EPISODE:
            columns["reference_time"] = table.valid.view()[at]
        times[kind] = columns

    def gather(kind: Kind) -> Any:
        index, at = vectors[kind], slots[kind]
        return lambda positions: index.rows(at[positions])

    def fields(kind: Kind) -> Callable[[str], list[Any]]:
        table = tables[kind]
        rows = [row for row in table.rows if row is not None]  # scan order
        return functools.partial(table.codec.column, rows)

    return IndexExport(
        sections=sections,
        times=times,
        vectors={kind: gather(kind) for kind in vectors},
        fields={kind: fields(kind) for kind in Kind},
    )


def _array(value: npt.NDArray[Any]) -> dict[str, Any]:
    return {"dtype": value.dtype.str, "shape": list(value.shape), "data": np.ascontiguousarray(value).tobytes()}


def _unarray(value: Any) -> npt.NDArray[Any]:
    dtype = np.dtype(value["dtype"])
    if dtype.hasobject:
        raise ValueError("object arrays are not allowed")
    return np.frombuffer(value["data"], dtype=dtype).reshape(value["shape"])


# -- restore ---------------------------------------------------------------------------------------------------
def restore(store: InMemoryStore, records: RecordSet, sections: Sections | None) -> dict[str, Any]:
    """Bulk-load a snapshot's records into this empty store, reusing its index sections where they fit the
    records (each is checked; one that does not fit is rebuilt). Returns, per index, whether it was ``loaded``
    or ``rebuilt``."""
    if any(t.rows for t in store._tables.values()):
        raise BackendError("restore() needs an empty store")
    version = sections.version if sections is not None else 1
    if sections is None or version < 2:
        store.load(records)
        store._restored = {"format": version, "indexes": "rebuilt"}
        return dict(store._restored)
    by_kind = records.records
    check_write(list(records), (), nothing_stored)
    indexes = _read_sections(sections)
    slot_map = _restored_slots(by_kind, indexes["slots"])
    use_indexes = slot_map is not None
    if slot_map is None:
        slot_map = {kind: np.arange(len(by_kind.get(kind, ())), dtype=np.int64) for kind in Kind}
    report: dict[str, Any] = {"format": version, "graphs": {}, "text": {}}
    tmp = tempfile.TemporaryDirectory(prefix="tkg-load.") if version == 2 and indexes["graphs"] else None
    # Each kind's vectors as its index keeps them (the file's own matrix at float32); the rows hold views of them.
    stored = {
        kind: (vec_at, store._vectors[kind].precision.encode(matrix))
        for kind, (vec_at, matrix) in records.vectors.items()
        if kind in store._vectors
    }
    try:

        def restore_vectors(kind: Kind, index: VectorIndex) -> bool:
            recs = by_kind.get(kind, [])
            vec_at, matrix = stored.get(kind, (np.zeros(0, np.int64), np.zeros((0, store.dim), index.precision.dtype)))
            graph = indexes["graphs"].get(kind) if use_indexes else None
            if isinstance(graph, bytes | memoryview) and tmp is not None:  # format 2: hnswlib's own file
                path = Path(tmp.name) / f"{kind.value}.hnsw"
                path.write_bytes(graph)
                graph = str(path)
            scales = indexes["scales"].get(kind)
            if scales is not None:
                scales = scales[vec_at] if len(scales) == len(recs) else None
            return index.restore(slot_map[kind][vec_at], matrix, graph, scales)

        # The vector indexes (big numpy copies, which release the GIL) are restored on a helper thread while the
        # tables (Python objects and maps) are filled here: they share no state.
        with ThreadPoolExecutor(1, thread_name_prefix="tkg-restore-vectors") as pool:
            graphs = {
                kind: pool.submit(restore_vectors, kind, index)
                for kind, index in store._vectors.items()
                if by_kind.get(kind)
            }
            for kind in Kind:
                _restore_table(
                    store, kind, by_kind.get(kind, []), slot_map[kind], records.times.get(kind, {}), stored.get(kind)
                )
            for kind, restored in graphs.items():
                report["graphs"][kind.value] = "loaded" if restored.result() else "rebuilt"
    finally:
        if tmp is not None:
            tmp.cleanup()
    for kind, text in store._texts.items():
        table = store._tables[kind]
        state = indexes["text"].get(kind) if use_indexes else None
        try:
            if state is None:
                raise TextMismatch("no saved text index")
            text.restore(state, slot_map[kind], lambda slot, t=table: search_text(t.record(slot)))  # type: ignore[misc, arg-type]
            report["text"][kind.value] = "loaded"
        except TextMismatch:
            text.rebuild()
            report["text"][kind.value] = "rebuilt"
    store._restored = report
    return dict(report)


def _read_sections(sections: Sections) -> dict[str, dict[Kind, Any]]:
    """The sections this backend wrote, decoded (a malformed one is left out: its index is rebuilt)."""
    out: dict[str, dict[Kind, Any]] = {"slots": {}, "scales": {}, "graphs": {}, "text": {}}
    names = set(sections.names())
    for name in names:
        part, _, kind_name = name.partition("/")
        try:
            kind = Kind(kind_name)
        except ValueError:
            continue
        try:
            if part == "slots":
                out["slots"][kind] = np.frombuffer(sections.read(name), dtype="<i8")
            elif part == "scale":
                out["scales"][kind] = np.frombuffer(sections.read(name), dtype="<f4")
            elif part == "bm25":
                state = msgpack.unpackb(sections.read(name), raw=False, strict_map_key=False)
                out["text"][kind] = {
                    k: (_unarray(v) if isinstance(v, dict) and "dtype" in v else v) for k, v in state.items()
                }
            elif part == "hnsw" and sections.version == 2:
                out["graphs"][kind] = bytes(sections.read(name))
            elif part == "hnsw":
                state = msgpack.unpackb(sections.read(name), raw=False, strict_map_key=False)
                graph = {k: (_unarray(v) if isinstance(v, dict) and "dtype" in v else v) for k, v in state.items()}
                data_name = f"hnswdata/{kind_name}"
                if data_name in names:  # without it the graph is rebuilt (the index finds the state incomplete)
                    graph["level0"] = np.frombuffer(sections.read(data_name), dtype=np.uint8)
                out["graphs"][kind] = graph
        except (ValueError, TypeError, KeyError, msgpack.UnpackException):
            continue
    return out


def _restored_slots(records: dict[Kind, list[Record]], saved: dict[Kind, Any]) -> dict[Kind, Any] | None:
    """The saved slot of every record, if the snapshot has a plausible set (else None: renumber, rebuild)."""
    out = {}
    for kind in Kind:
        n = len(records.get(kind, ()))
        slots = saved.get(kind)
        if slots is None:
            return None
        slots = np.asarray(slots, dtype=np.int64)
        if len(slots) != n:
            return None
        # Slots are increasing in scan order; the holes left by deletions are bounded by what was written.
        if n and (int(slots[0]) < 0 or not bool(np.all(np.diff(slots) > 0)) or int(slots[-1]) > 4 * n + (1 << 20)):
            return None
        out[kind] = slots
    return out


def _restore_table(
    store: InMemoryStore,
    kind: Kind,
    recs: list[Record],
    slots: Any,
    times: dict[str, npt.NDArray[np.int64]],
    stored: tuple[npt.NDArray[np.int64], npt.NDArray[Any]] | None,
) -> None:
    """Fill ``kind``'s table; ``stored``: the positions of the records with a vector and those vectors as the
    kind's index keeps them (the rows hold views of them)."""
    table: Table = store._tables[kind]
    n = len(recs)
    size = int(slots[-1]) + 1 if n else 0
    slot_list = slots.tolist()
    vectors: Iterable[Any] = repeat(None)
    if kind in VECTOR_FIELD and store._vectors[kind].precision.exact:
        vectors = map(attrgetter(VECTOR_FIELD[kind]), recs)  # views of the index's matrix already
    elif kind in VECTOR_FIELD and stored is not None:
        vec_at, matrix = stored
        matrix.flags.writeable = False  # and so its rows
        if len(vec_at) == n and (n < 2 or bool((np.diff(vec_at) > 0).all())):  # every record, in order
            vectors = list(matrix)
        else:
            views: list[Any] = [None] * n
            for at, row in zip(vec_at.tolist(), matrix, strict=True):
                views[at] = row
            vectors = views
    rows = list(map(table.codec.pack, recs, vectors))
    if size == n:  # no holes: slots are 0..n-1
        table.rows = ObjectList(rows)
    else:
        table.rows = ObjectList.empty(size)
        for slot, row in zip(slot_list, rows, strict=True):
            table.rows[slot] = row
    table.slot_of = dict(zip(map(_ID, recs), slot_list, strict=True))
    for column in (table.alive, table.group, table.created, table.valid, table.invalid, table.expired, table.prior):
        column.ensure(size)
    for column in (table.relation, table.source, table.target):
        column.ensure(size)
    table.alive.view()[slots] = True
    table.live = n
    table.version += 1
    group_ids = list(map(_GROUP, recs))
    table.group.view()[slots] = _codes(group_ids, store._group_codes)
    for group, count in Counter(group_ids).items():
        store._group_counts[group] = store._group_counts.get(group, 0) + count

    def micros(name: str, missing: int) -> npt.NDArray[np.int64]:
        column = times.get(name)
        if column is None:  # not a time column of this file: convert from the records
            values = [getattr(r, name) for r in recs]
            return np.fromiter((missing if v is None else to_micros(v) for v in values), np.int64, n)
        return np.where(column == NO_TIME, missing, column).astype(np.int64)

    table.created.view()[slots] = micros("created_at", MAX)
    if kind is Kind.FACT:
        table.valid.view()[slots] = micros("valid_at", MIN)
        table.invalid.view()[slots] = micros("invalid_at", MAX)
        table.expired.view()[slots] = micros("expired_at", MAX)
        table.prior.view()[slots] = micros("prior_invalid_at", MAX)
        for slot, fact in zip(slot_list, recs, strict=True):
            if has_history(fact):  # type: ignore[arg-type]
                table.histories.set(slot, fact)  # type: ignore[arg-type]
        table.relation.view()[slots] = _codes(list(map(_RELATION, recs)), store._relation_codes)
        ids = list(map(_ID, recs))
        sources, targets = list(map(_SOURCE, recs)), list(map(_TARGET, recs))
        table.source.view()[slots] = _codes(sources, store._entity_codes)
        table.target.view()[slots] = _codes(targets, store._entity_codes)
        _group_into(store._adjacent, sources + targets, ids + ids)
        judged = [(named, fact.id) for fact in recs if isinstance(fact, Fact) for named in fact.verdicts]
        _group_into(store._judging, [j[0] for j in judged], [j[1] for j in judged])
        episodes = list(map(_EPISODES, recs))
        counts = np.fromiter(map(len, episodes), dtype=np.int64, count=n)
        owners = _pick(ids, np.repeat(np.arange(n), counts))
        _group_into(store._episode_facts, list(chain.from_iterable(episodes)), owners)
    elif kind is Kind.EPISODE:
        refs = micros("reference_time", MIN)
        table.valid.view()[slots] = refs
        timeline: dict[str, list[tuple[int, int]]] = {}
        for group, ref, slot in zip(group_ids, refs.tolist(), slot_list, strict=True):
            timeline.setdefault(group, []).append((ref, slot))
        for group, pairs in timeline.items():
            store._timeline[group] = Timeline(pairs)
    elif kind is Kind.ENTITY:
        by_label: dict[str, list[int]] = {}
        names = store._names
        for slot, entity in zip(slot_list, recs, strict=True):
            assert isinstance(entity, Entity)
            for label in entity.labels:
                by_label.setdefault(label, []).append(slot)
            for name in (entity.name, *entity.aliases):
                key = name_key(entity.group_id, normalize_name(name))
                names.setdefault(key, {})[entity.id] = None
        for label, labelled in by_label.items():
            column = Column(np.bool_, False)
            column.ensure(size)
            column.view()[labelled] = True
            table.labels[label] = column
    elif kind is Kind.MENTION:
        episode_ids, entity_ids = list(map(_EPISODE, recs)), list(map(_ENTITY, recs))
        _group_into(store._mentions_by_episode, episode_ids, entity_ids)
        _group_into(store._mentions_by_entity, entity_ids, episode_ids)
    elif kind is Kind.MEMBERSHIP:
        community_ids, entity_ids = list(map(_COMMUNITY, recs)), list(map(_ENTITY, recs))
        _group_into(store._members_by_community, community_ids, entity_ids)
        _group_into(store._members_by_entity, entity_ids, community_ids)


def _codes(values: list[str], codes: dict[str, int]) -> npt.NDArray[np.int32]:
    """The code of each value in ``codes``, adding the new ones (in first-seen order)."""
    for value in dict.fromkeys(values):
        if value not in codes:
            codes[value] = len(codes)
    return np.fromiter(map(codes.__getitem__, values), dtype=np.int32, count=len(values))


def _pick(values: list[str], at: npt.NDArray[np.int64]) -> list[str]:
    """``[values[i] for i in at]`` at C speed."""
    if len(at) == 0:
        return []
    picked = itemgetter(*at.tolist())(values)
    return [picked] if len(at) == 1 else list(picked)


def _group_into(index: SetIndex, keys: list[str], values: list[str]) -> None:
    """``index[key][value] = None`` for each pair, grouped with one sort instead of a Python loop per pair (bulk
    restores build millions of these sets)."""
    if not keys:
        return
    unique = list(dict.fromkeys(keys))
    code = dict(zip(unique, range(len(unique)), strict=True))
    codes = np.fromiter(map(code.__getitem__, keys), dtype=np.int64, count=len(keys))
    ordered = _pick(values, np.argsort(codes, kind="stable"))
    ends = np.bincount(codes, minlength=len(unique)).cumsum().tolist()
    groups = map(dict.fromkeys, map(ordered.__getitem__, map(slice, [0, *ends[:-1]], ends)))
    if not index:  # the usual case (a restore into an empty store): no merging, no Python loop
        index.fill(unique, groups)
        return
    for key, group in zip(unique, groups, strict=True):
        found = index.get(key)
        if found is None:
            index[key] = group
        else:
            found.update(group)
