"""Growable numpy columns: amortised O(1) appends, views for vectorised filtering; and a list of objects the
cycle collector does not walk."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

MIN = np.iinfo(np.int64).min
MAX = np.iinfo(np.int64).max

# Up to this many codes, a column is compared with each (one pass per code, ~30 us per 100k slots); np.isin costs
# ~0.25 ms per 100k slots whatever the count.
_FEW_CODES = 4


def any_of(column: npt.NDArray, codes: list[int]) -> npt.NDArray[np.bool_]:  # type: ignore[type-arg]
    """Where ``column`` holds one of ``codes``."""
    if len(codes) > _FEW_CODES:
        return np.isin(column, codes)
    found = np.zeros(len(column), dtype=np.bool_)
    for code in codes:
        found |= column == code
    return found


def around(values: npt.NDArray[np.int64], now: int) -> tuple[int, int]:
    """The largest of ``values`` at or before ``now`` and the smallest after it; the int64 minimum, the maximum, where
    there is none. Two passes of unsigned arithmetic (~10x faster than reductions under a ``where`` mask at a
    million values): subtracting ``now + 1`` modulo 2**64 maps the values after ``now`` to the smallest unsigned
    numbers, in their order, and every other value above them; subtracting each from ``now`` maps those at or
    before ``now`` alike."""
    low, high = int(np.iinfo(np.int64).min), int(np.iinfo(np.int64).max)
    if not len(values):
        return low, high
    raw = values.view(np.uint64)
    # v - now - 1 for each v after now (0 .. high - now - 1), anything larger for the others; alike now - v
    after = int((raw - np.uint64((now + 1) % 2**64)).min())
    before = int((np.uint64(now % 2**64) - raw).min())
    return max(low, now - before), min(high, now + 1 + after)


class Column:
    """A 1-d numpy array that grows by doubling; ``view()`` is the filled prefix."""

    __slots__ = ("_data", "_fill", "size")

    def __init__(self, dtype: npt.DTypeLike, fill: object = 0, capacity: int = 1024) -> None:
        self._fill = fill
        self._data = np.full(capacity, fill, dtype=dtype)
        self.size = 0

    def ensure(self, size: int) -> None:
        if size > len(self._data):
            grown = np.full(max(size, 2 * len(self._data)), self._fill, dtype=self._data.dtype)
            grown[: self.size] = self._data[: self.size]
            self._data = grown
        self.size = max(self.size, size)

    def __setitem__(self, index: int, value: object) -> None:
        self._data[index] = value

    def __getitem__(self, index: int) -> object:
        return self._data[index]

    def view(self) -> npt.NDArray:  # type: ignore[type-arg]
        return self._data[: self.size]

    def at(self, rows: npt.NDArray[np.int64] | None) -> npt.NDArray:  # type: ignore[type-arg]
        """The filled prefix (``rows`` None), or its values at ``rows``, in that order."""
        return self._data[: self.size] if rows is None else self._data[: self.size][rows]


class Matrix:
    """A 2-d float32 array of rows that grows by doubling."""

    __slots__ = ("_data", "size")

    def __init__(self, dim: int, capacity: int = 1024) -> None:
        self._data = np.zeros((capacity, dim), dtype=np.float32)
        self.size = 0

    def ensure(self, size: int) -> None:
        if size > len(self._data):
            grown = np.zeros((max(size, 2 * len(self._data)), self._data.shape[1]), dtype=np.float32)
            grown[: self.size] = self._data[: self.size]
            self._data = grown
        self.size = max(self.size, size)

    def __setitem__(self, index: int, value: npt.NDArray[np.float32]) -> None:
        self._data[index] = value

    def rows(self, index: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        return self._data[index]

    def view(self) -> npt.NDArray[np.float32]:
        return self._data[: self.size]


class ObjectList:
    """A list of objects by position (None: an empty one) in a numpy array of objects that grows by doubling.
    Python's cycle collector does not look inside numpy arrays: the objects held are not visited by its full
    collections, which suits objects through which no reference cycle can pass (a table's rows of plain values,
    an index's sets of strings), and only those."""

    __slots__ = ("_items", "_size")

    def __init__(self, items: Iterable[Any] = ()) -> None:
        items = list(items)
        self._size = len(items)
        self._items = np.empty(max(16, self._size), dtype=object)
        self._items[: self._size] = np.fromiter(items, dtype=object, count=self._size)

    @classmethod
    def empty(cls, size: int) -> ObjectList:
        """``size`` empty positions."""
        made = cls()
        made._grow(size)
        made._size = size
        return made

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, at: int) -> Any:
        if not 0 <= at < self._size:
            raise IndexError(at)
        return self._items[at]  # type: ignore[no-any-return]

    def __setitem__(self, at: int, item: Any) -> None:
        if not 0 <= at < self._size:
            raise IndexError(at)
        self._items[at] = item

    def __iter__(self) -> Iterator[Any]:
        return iter(self.copy())

    def append(self, item: Any) -> None:
        if self._size == len(self._items):
            self._grow(2 * self._size)
        self._items[self._size] = item
        self._size += 1

    def copy(self) -> list[Any]:
        """The objects now, as a list."""
        return self._items[: self._size].tolist()  # type: ignore[no-any-return]

    def _grow(self, capacity: int) -> None:
        if capacity > len(self._items):
            items = np.empty(capacity, dtype=object)
            items[: self._size] = self._items[: self._size]
            self._items = items
