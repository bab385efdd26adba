"""The writer of the crash tests (tests/test_durability.py): opens a durable memory and writes until killed.

Usage: ``python crash_child.py PATH FIRST`` -- writes structured facts ``P<i> LIKES T<i % 7>`` for i = FIRST,
FIRST+1, ..., printing ``ack <i>`` (flushed) after each call returns, and every 5th write also saves a side
snapshot (``PATH.side``) so that kills land in snapshot saves too. A small compaction threshold makes kills land
in compactions as well.
"""

from __future__ import annotations

import sys

from tkg import FactInput, FixedClock, HashEmbedder, Memory, MemoryConfig
from tkg.journal import JournalPolicy


def main() -> None:
    path, first = sys.argv[1], int(sys.argv[2])
    memory = Memory.open(
        path,
        embedder=HashEmbedder(dim=16),
        clock=FixedClock("2024-01-01T00:00:00Z", tick=__import__("datetime").timedelta(seconds=1)),
        config=MemoryConfig(communities=None),
        durability=JournalPolicy(compact_bytes=6_000),
    )
    print("ready", flush=True)
    i = first
    while True:
        memory.add_facts([FactInput(f"P{i}", "LIKES", f"T{i % 7}")], group_id="g", source_description=f"w{i}")
        print(f"ack {i}", flush=True)
        if i % 5 == 0:
            memory.save(path + ".side")
        i += 1


if __name__ == "__main__":
    main()
