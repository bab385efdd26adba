"""How the in-memory store keeps its vectors: float32 (the default) or bfloat16 (``InMemoryStore(vector_precision=
"bfloat16")``), half the bytes.

bfloat16 is float32's upper 16 bits (sign, the same 8-bit exponent, 7 of its 23 mantissa bits), rounded to the
nearest, ties to even: any finite float32 vector fits, whatever its scale, and each component keeps ~3 significant
digits (relative error at most 2^-9). A store of that precision keeps each vector rounded so, and everything it does
reads the rounded values: the records it returns carry them (as float32), exact scores and its HNSW graph are
computed from them, and a snapshot saves them. So a vector whose components are already bfloat16 values is kept
exactly, and such a store answers like a float32 one (tests/test_store_oracle.py checks it against the reference
store). Cosine scores of rounded vectors differ from the exact ones by ~1e-4 (benchmarks/bench_scale.py reports the
recall against exact search over the unrounded vectors).

Why bfloat16 and not IEEE float16: numpy converts float16 to float32 element by element (~1.5 ns each: +1 ms to
score 2,000 rows at 384-d, measured), while bfloat16 widens with an integer cast and a shift (~+0.2 ms), and
float16's range (6e-8 to 65,504) would flush or overflow the components of an embedder that does not normalise.

What it saves: the store's own copy of each vector, 1.5 KB -> 0.77 KB at 384-d. hnswlib keeps a float32 copy of
each unit vector for its graph walk (it has no 16-bit storage); that copy is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

Float32 = npt.NDArray[np.float32]
_BLOCK = 1 << 16  # values rounded at a time


def _same(values: Float32) -> Float32:
    return values


def to_bfloat16(values: Float32) -> npt.NDArray[np.uint16]:
    """Each float32 rounded to the nearest bfloat16 (ties to even), as its 16 bits. A finite value that would round
    past the largest bfloat16 is truncated to it instead of becoming infinite."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.reshape(-1).view(np.uint32)
    out = np.empty(bits.shape, dtype=np.uint16)
    work = np.empty(min(len(bits), _BLOCK), dtype=np.uint32)
    # A block at a time, in place: a few passes over a block that stays in cache (a 1M-fact snapshot's vectors
    # are 640 million values).
    for start in range(0, len(bits), _BLOCK):
        part = bits[start : start + _BLOCK]
        block = work[: len(part)]
        np.right_shift(part, np.uint32(16), out=block)
        block &= np.uint32(1)  # the last kept bit: ties go to even
        block += np.uint32(0x7FFF)
        block += part
        block >>= np.uint32(16)
        out[start : start + len(part)] = block
    overflow = np.flatnonzero((out & np.uint16(0x7F80)) == np.uint16(0x7F80))  # rounded up to infinity
    if len(overflow):
        out[overflow] = (bits[overflow] >> np.uint32(16)).astype(np.uint16)
    return out.reshape(values.shape)


def from_bfloat16(bits: npt.NDArray[np.uint16]) -> Float32:
    """bfloat16 values (their 16 bits) as float32, exactly (a new array)."""
    return np.left_shift(bits, np.uint32(16), dtype=np.uint32).view(np.float32)  # one pass: widen and shift


@dataclass(frozen=True)
class Precision:
    """A way of keeping vectors: ``dtype`` of the stored rows, ``encode`` (float32 rows -> stored rows) and
    ``decode`` (stored -> float32, the values every read and score uses). ``exact``: decode(encode(x)) is x."""

    name: str
    dtype: np.dtype[Any]
    encode: Callable[[Float32], npt.NDArray[Any]]
    decode: Callable[[npt.NDArray[Any]], Float32]
    exact: bool

    def round(self, values: Float32) -> Float32:
        """``values`` as a store of this precision keeps them (float32)."""
        return self.decode(self.encode(np.asarray(values, dtype=np.float32)))

    def read(self, stored: npt.NDArray[Any] | None) -> Float32 | None:
        """A stored row as a record carries it: float32, read-only (the row codecs use it when rows are
        encoded; float32 rows are the records' vectors as they are)."""
        if stored is None:
            return None
        values = self.decode(stored)
        values.flags.writeable = False
        return values


FLOAT32 = Precision("float32", np.dtype(np.float32), _same, _same, exact=True)
BFLOAT16 = Precision("bfloat16", np.dtype(np.uint16), to_bfloat16, from_bfloat16, exact=False)
#: The precisions ``InMemoryStore(vector_precision=...)`` accepts, by name.
PRECISIONS: dict[str, Precision] = {p.name: p for p in (FLOAT32, BFLOAT16)}
