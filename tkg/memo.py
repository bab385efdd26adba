"""Bounded memos of pure functions of one string, kept where Python's cycle collector never looks.

``functools.lru_cache`` keeps its entries in a linked list that the collector walks, key and result, at every
full (generation 2) collection, and a full collection stops every thread: a cache of 60,000 sentences added
~20 ms to each one in a 100k-fact run (benchmarks/bench_stalls.py). A plain ``dict`` whose keys and values are
strings or numbers is not tracked by the collector at all, so the memos here cost nothing to it. The price is
eviction: a full memo starts over (every entry dropped at once) instead of dropping its least recent entry, which
bounds memory the same and costs one miss per entry afterwards.

>>> upper = Memo(str.upper, maxsize=2)
>>> upper("a"), upper("b"), upper("a"), len(upper)
('A', 'B', 'A', 2)
>>> upper("c"), len(upper)  # full: starts over
('C', 1)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from tkg.errors import ValidationError

#: What a memo may hold: results the collector does not track, so that the table stays untracked too.
Atomic = TypeVar("Atomic", str, int, float)


class Memo(Generic[Atomic]):
    """``fn`` memoised over at most ``maxsize`` distinct strings. ``fn`` must be pure and return a ``str``,
    ``int`` or ``float`` (a tracked result, such as a tuple or list, would make the collector walk the table
    again). Safe to share between threads: a race computes a value twice, never a wrong one.

    Hot loops may read :attr:`table` directly (``table.get(key) or memo(key)``): a dict lookup costs less
    than a call of this object's ``__call__``.
    """

    __slots__ = ("_fn", "_maxsize", "table")

    def __init__(self, fn: Callable[[str], Atomic], maxsize: int) -> None:
        if maxsize < 1:
            raise ValidationError(f"Memo maxsize must be at least 1, got {maxsize}")
        self._fn: Callable[[str], Atomic] = fn
        self._maxsize = maxsize
        self.table: dict[str, Atomic] = {}

    def __call__(self, key: str) -> Atomic:
        table = self.table
        value = table.get(key)
        if value is None:
            value = self._fn(key)
            if len(table) >= self._maxsize:
                table.clear()
            table[key] = value
        return value

    def __len__(self) -> int:
        return len(self.table)

    def clear(self) -> None:
        self.table.clear()
