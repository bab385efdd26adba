"""A deterministic embedder with no model: signed feature hashing of words and character trigrams."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from functools import partial

import numpy as np
import numpy.typing as npt

from tkg.errors import ValidationError
from tkg.memo import Memo

_WORD = re.compile(r"\w+", re.UNICODE)


def _bucket(token: str, dim: int) -> int:
    h = int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(), "little")
    index = h % dim
    return index if h >> 63 else -index - 1  # the sign travels in the encoding


class HashEmbedder:
    """Same text, same vector, on every machine; texts sharing words get close vectors.

    Good for unit tests and benchmarks (it costs microseconds); it knows nothing of meaning.

    >>> HashEmbedder(dim=8).embed(["hello world"]).shape
    (1, 8)
    """

    def __init__(self, dim: int = 384, *, trigrams: bool = True) -> None:
        if dim < 2:
            raise ValidationError("HashEmbedder dim must be at least 2")
        self._dim = dim
        self._trigrams = trigrams
        self._codes = Memo(partial(_bucket, dim=dim), 200_000)

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def name(self) -> str:
        return f"hash-{self._dim}{'-tri' if self._trigrams else ''}"

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        out = np.zeros((len(texts), self._dim), dtype=np.float32)
        for row, text in enumerate(texts):
            vec = out[row]
            for word in _WORD.findall(text.lower()):
                self._add(vec, word, 1.0)
                if self._trigrams and len(word) > 3:
                    padded = f"#{word}#"
                    for i in range(len(padded) - 2):
                        self._add(vec, padded[i : i + 3], 0.25)
            norm = float(np.linalg.norm(vec))
            if norm > 0:
                vec /= norm
        return out

    def _add(self, vec: npt.NDArray[np.float32], token: str, weight: float) -> None:
        code = self._codes.table.get(token) or self._codes(token)  # a hit without a call (0 is asked again)
        if code >= 0:
            vec[code] += weight
        else:
            vec[-code - 1] -= weight
