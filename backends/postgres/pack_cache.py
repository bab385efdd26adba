"""The packed postings a store's text searches have read, kept decoded in the client (:mod:`.terms`, packs).

A pack of one generation never changes: a repack writes the next generation beside it, and readers switch when
it is swapped in. So a search tells the server which of its terms' packs it holds for the generation it last saw
(:meth:`PackCache.held`); the server sends only the others, or all of them when its generation is another
(:func:`.search.postings_statement`), and the search keeps what came (:meth:`PackCache.keep`). A common term's
pack at a million facts is ~3 MB, read through TOAST on every search without this. Several processes may share
a schema: the generation comes from the same snapshot as the postings, so a pack of an older generation is never
used, whoever repacked.

Bounded by bytes; the least recently used packs go first. Thread-safe (a search reads its lists on several
threads).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from tkg.models import Kind


class Pack(Protocol):
    """A decoded pack, as the cache counts it."""

    @property
    def nbytes(self) -> int: ...


#: What an entry costs beyond its arrays (the key, the dict slot, the arrays' headers), counted against the bound.
_OVERHEAD = 200


@dataclass(frozen=True)
class Held:
    """The packs a search holds before it reads: of generation ``gen`` (-1: none), by term (an empty array: the
    term had no pack in that generation)."""

    gen: int = -1
    packs: Mapping[str, Any] = field(default_factory=dict)


class PackCache:
    """Packs by (kind, term), all of one generation per kind, at most ``max_bytes`` of them (0: none kept)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[Kind, str], Pack] = OrderedDict()
        self._gen: dict[Kind, int] = {}
        self._bytes = 0
        self._guard = threading.Lock()

    def held(self, kind: Kind, terms: Iterable[str]) -> Held:
        """The packs of ``terms`` held for ``kind``'s generation last seen, each marked as just used."""
        with self._guard:
            gen = self._gen.get(kind)
            if gen is None:
                return Held()
            packs = {}
            for term in terms:
                key = (kind, term)
                pack = self._entries.get(key)
                if pack is not None:
                    self._entries.move_to_end(key)
                    packs[term] = pack
            return Held(gen, packs)

    def keep(self, kind: Kind, gen: int, packs: Mapping[str, Pack]) -> None:
        """Keep ``packs`` (by term) of ``kind``'s generation ``gen``, as read: a newer generation replaces the
        kind's packs; an older one (a search whose snapshot predates another's) is not kept."""
        if not self.max_bytes:
            return
        with self._guard:
            seen = self._gen.get(kind)
            if seen is not None and gen < seen:
                return
            if seen != gen:
                for key in [key for key in self._entries if key[0] is kind]:
                    self._bytes -= self._size(self._entries.pop(key))
                self._gen[kind] = gen
            for term, pack in packs.items():
                if self._size(pack) > self.max_bytes:
                    continue
                old = self._entries.pop((kind, term), None)
                if old is not None:
                    self._bytes -= self._size(old)
                self._entries[(kind, term)] = pack
                self._bytes += self._size(pack)
            while self._bytes > self.max_bytes:
                _, pack = self._entries.popitem(last=False)
                self._bytes -= self._size(pack)

    @staticmethod
    def _size(pack: Pack) -> int:
        return int(pack.nbytes) + _OVERHEAD

    def stats(self) -> dict[str, int]:
        """How many packs are held and their bytes (as counted against ``max_bytes``)."""
        with self._guard:
            return {"packs": len(self._entries), "bytes": self._bytes}
