"""Snapshots: a whole memory in one msgpack file, written atomically, read defensively.

File layout: an 8-byte magic, a big-endian header (format version u16, payload length u64, sha256 of the payload),
then the msgpack payload ``{"meta": {...}, "records": {kind: [record, ...]}}``. Records are plain maps: datetimes
as integer microseconds since the epoch (UTC), vectors as little-endian float32 bytes. The file is backend-neutral;
indexes are rebuilt on load (one batched build per index; see benchmarks/bench_core.py for what that costs).

A save goes to a temporary file in the same directory, is fsynced, then renamed over the target, so a crash
leaves the previous snapshot intact. A load checks magic, version, length and checksum before decoding anything,
and builds a new store; nothing existing is touched if any check fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import struct
import tempfile
from collections.abc import Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import msgpack
import numpy as np

from tkg.errors import SnapshotError, SnapshotFormatError, SnapshotVersionError, TkgError
from tkg.models import RECORD_TYPES, Kind, Record
from tkg.storage import Store
from tkg.timeutil import from_micros, to_micros

MAGIC = b"\x89TKGSNP\n"
FORMAT_VERSION = 1
_HEADER = struct.Struct(">HQ32s")
_DT = "__dt__"


def _encode_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return {_DT: to_micros(value)}
    if isinstance(value, np.ndarray):
        return value.astype("<f4").tobytes()
    if isinstance(value, tuple):
        return [_encode_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _encode_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_encode_value(v) for v in value]
    if hasattr(value, "value") and isinstance(getattr(value, "value", None), str):  # StrEnum
        return value.value
    return value


def encode_record(record: Record) -> dict[str, Any]:
    return {f.name: _encode_value(getattr(record, f.name)) for f in dataclasses.fields(record)}


def _decode_value(value: Any) -> Any:
    if isinstance(value, dict):
        if len(value) == 1 and _DT in value:
            return from_micros(value[_DT])
        return {k: _decode_value(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_value(v) for v in value]
    return value


_VECTOR_FIELDS = {"embedding", "name_embedding"}
_TUPLE_FIELDS = {"labels", "aliases", "episodes"}


def decode_record(kind: Kind, data: Mapping[str, Any]) -> Record:
    fields: dict[str, Any] = {}
    for name, value in data.items():
        if name in _VECTOR_FIELDS and value is not None:
            fields[name] = np.frombuffer(value, dtype="<f4").astype(np.float32)
        elif name in _TUPLE_FIELDS:
            fields[name] = tuple(value)
        else:
            fields[name] = _decode_value(value)
    return RECORD_TYPES[kind](**fields)


def save(store: Store, path: str | os.PathLike[str], meta: Mapping[str, Any]) -> int:
    """Write every record of ``store`` to ``path`` atomically; returns the file size in bytes."""
    target = Path(path)
    records = {kind.value: [encode_record(r) for r in store.scan(kind)] for kind in Kind}
    try:
        payload = msgpack.packb({"meta": dict(meta), "records": records}, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise SnapshotError(
            f"cannot encode the memory (an attribute value is not serialisable, or an integer wider than 64 "
            f"bits?): {exc}"
        ) from None
    header = MAGIC + _HEADER.pack(FORMAT_VERSION, len(payload), hashlib.sha256(payload).digest())
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise SnapshotError(f"cannot save to {target}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(header)
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # make the rename itself durable
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return len(header) + len(payload)


def read(path: str | os.PathLike[str]) -> tuple[dict[str, Any], Iterator[Record]]:
    """Check and decode a snapshot file: its meta map, and its records (decoded lazily, in dependency order)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise SnapshotError(f"snapshot {path} does not exist") from None
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {exc}") from None
    if not data.startswith(MAGIC):
        raise SnapshotFormatError(f"{path} is not a tkg snapshot (wrong magic bytes)")
    if len(data) < len(MAGIC) + _HEADER.size:
        raise SnapshotFormatError(f"{path} is truncated (incomplete header)")
    version, length, digest = _HEADER.unpack_from(data, len(MAGIC))
    if version > FORMAT_VERSION:
        raise SnapshotVersionError(
            f"{path} uses snapshot format {version}, newer than this tkg reads ({FORMAT_VERSION}); upgrade tkg"
        )
    payload = memoryview(data)[len(MAGIC) + _HEADER.size :]
    if len(payload) != length:
        raise SnapshotFormatError(f"{path} is truncated or padded: {len(payload)} payload bytes, expected {length}")
    if hashlib.sha256(payload).digest() != digest:
        raise SnapshotFormatError(f"{path} is corrupt (checksum mismatch)")
    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        meta, records = body["meta"], body["records"]
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        raise SnapshotFormatError(f"{path} is corrupt: {exc}") from None
    if not isinstance(meta, dict) or not isinstance(records, dict):
        raise SnapshotFormatError(f"{path} is corrupt: unexpected payload structure")

    def decode() -> Iterator[Record]:
        # Dependency order: endpoints before the edges that point to them.
        order = [Kind.EPISODE, Kind.ENTITY, Kind.COMMUNITY, Kind.FACT, Kind.MENTION, Kind.MEMBERSHIP]
        for kind in order:
            for item in records.get(kind.value, []):
                try:
                    yield decode_record(kind, item)
                except TkgError as exc:
                    raise SnapshotFormatError(f"{path} holds an invalid {kind} record: {exc}") from None
                except Exception as exc:
                    raise SnapshotFormatError(f"{path} holds a malformed {kind} record: {exc!r}") from None

    return meta, decode()
