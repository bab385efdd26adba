"""psycopg adapters between numpy float32 vectors and pgvector's ``vector`` type (binary, so exact and fast)."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg.adapt import Buffer, Dumper, Loader
from psycopg.pq import Format
from psycopg.types import TypeInfo

from tkg.errors import BackendError

_HEADER = struct.Struct(">HH")  # dimension, unused


def _vector_adapters(oid: int) -> tuple[type[Dumper], type[Dumper], type[Loader], type[Loader]]:
    class BinaryDumper(Dumper):
        format = Format.BINARY

        def dump(self, obj: Any) -> Buffer:
            arr = np.asarray(obj, dtype=">f4")
            return _HEADER.pack(arr.shape[0], 0) + arr.tobytes()

    class TextDumper(Dumper):
        format = Format.TEXT

        def dump(self, obj: Any) -> Buffer:
            # repr of a float32 widened to float64 is exact; PostgreSQL reads it back to the same float32.
            return ("[" + ",".join(map(repr, np.asarray(obj, dtype=np.float32).tolist())) + "]").encode()

    class BinaryLoader(Loader):
        format = Format.BINARY

        def load(self, data: Buffer) -> npt.NDArray[np.float32]:
            (dim, _) = _HEADER.unpack_from(data)
            return np.frombuffer(data, dtype=">f4", count=dim, offset=_HEADER.size).astype(np.float32)

    class TextLoader(Loader):
        format = Format.TEXT

        def load(self, data: Buffer) -> npt.NDArray[np.float32]:
            text = bytes(data).decode()
            return np.array(text[1:-1].split(","), dtype=np.float32)

    for cls in (BinaryDumper, TextDumper):
        cls.oid = oid
    return BinaryDumper, TextDumper, BinaryLoader, TextLoader


def register_vector(conn: psycopg.Connection[Any]) -> None:
    """Teach ``conn`` to send numpy arrays as ``vector`` and read ``vector`` columns as float32 arrays."""
    info = TypeInfo.fetch(conn, "vector")
    if info is None:
        raise BackendError("the pgvector type 'vector' is not visible on this connection (is the extension installed?)")
    binary_dumper, text_dumper, binary_loader, text_loader = _vector_adapters(info.oid)
    adapters = conn.adapters
    adapters.register_dumper(np.ndarray, text_dumper)
    adapters.register_dumper(np.ndarray, binary_dumper)
    adapters.register_loader(info.oid, text_loader)
    adapters.register_loader(info.oid, binary_loader)
