"""psycopg adapters between numpy float32 vectors and pgvector's ``vector`` type (binary, so exact and fast), the
sketches of stored facts' vectors, and the steps that enter rows into their kind's HNSW index."""

from __future__ import annotations

import struct
from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
from psycopg import sql
from psycopg.adapt import Buffer, Dumper, Loader
from psycopg.pq import Format
from psycopg.types import TypeInfo

from tkg.errors import BackendError
from tkg.models import Kind
from tkg.vector_sketches import BITS, sketch_text

from .schema import VECTOR_TABLES, render

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


_SKETCH_BATCH = 5000


def sketch_all(conn: psycopg.Connection[Any], schema: str) -> None:
    """The schema 6 backfill (:func:`.schema.ensure_schema`): the sketch of every stored fact's vector."""
    after = -1
    while True:
        rows = conn.execute(
            render(
                "SELECT seq, embedding::real[] FROM {s}.facts WHERE embedding IS NOT NULL AND seq > %s "
                "ORDER BY seq LIMIT %s",
                schema,
            ),
            [after, _SKETCH_BATCH],
        ).fetchall()
        if not rows:
            return
        sketches = sketch_text(np.array([row[1] for row in rows], dtype=np.float32))
        conn.execute(
            render(
                f"UPDATE {{s}}.facts f SET sketch = u.sketch::bit({BITS}) FROM unnest(%s::bigint[], %s::text[]) "
                "AS u(seq, sketch) WHERE f.seq = u.seq",
                schema,
            ),
            [[row[0] for row in rows], sketches],
        )
        after = rows[-1][0]


#: Rows entered into an HNSW index per transaction of :func:`index_steps`: a writer that rewrites one of them waits
#: for that transaction (at 1M facts an HNSW insert takes ~3 ms).
INDEX_BATCH = 16


def index_steps(
    conn: psycopg.Connection[Any], q: Callable[[str], sql.Composed], kind: Kind
) -> Generator[int, None, None]:
    """Mark the rows of ``kind`` that are not in its HNSW index indexed, oldest first, :data:`INDEX_BATCH` in each
    transaction (``conn`` in autocommit mode), until none is left; yields how many each step marked. Marking a row
    enters it into the (partial) index. Rows a writer holds are skipped: its write marks them unindexed again and
    asks for another pass."""
    table, _ = VECTOR_TABLES[kind]
    statement = q(
        f"UPDATE {{s}}.{table} SET indexed = true WHERE seq = ANY(ARRAY(SELECT seq FROM {{s}}.{table} "
        "WHERE NOT indexed ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED))"
    )
    while True:
        with conn.transaction():
            marked = conn.execute(statement, [INDEX_BATCH]).rowcount
        yield marked
        if marked < INDEX_BATCH:
            return
