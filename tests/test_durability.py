"""Durable embedded memory (issue 15): the write-ahead journal, compaction, verified snapshot saves, and crash
tests that SIGKILL a writer at random moments and check that every acknowledged write is there."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import run_script_to_the_end

from tkg import FactInput, FixedClock, HashEmbedder, Kind, Memory, MemoryConfig, RulesLLM, ScriptedLLM
from tkg import snapshot as snapshot_module
from tkg.errors import ConfigurationError, JournalError, SnapshotError
from tkg.journal import JournalPolicy, segment_paths
from tkg.models import Episode, Fact

EMB = HashEmbedder(dim=16)
CHILD = Path(__file__).with_name("crash_child.py")


def open_memory(path: Path, **policy: Any) -> Memory:
    return Memory.open(
        path,
        embedder=EMB,
        clock=FixedClock("2024-01-01T00:00:00Z"),
        config=MemoryConfig(communities=None),
        durability=JournalPolicy(**policy) if policy else None,
    )


def facts_of(memory: Memory) -> set[str]:
    return {f.fact for f in memory.records(Kind.FACT) if isinstance(f, Fact)}


def write(memory: Memory, i: int) -> None:
    memory.add_facts([FactInput(f"P{i}", "LIKES", f"T{i % 7}")], group_id="g")


def journalled(path: Path, facts: int) -> Path:
    """A memory at ``path`` written ``facts`` facts through its journal and closed: its newest segment."""
    memory = open_memory(path)
    for i in range(facts):
        write(memory, i)
    memory.close()
    return segment_paths(path)[-1]


def crashed(memory: Memory) -> None:
    """What a process that dies holding ``memory`` open leaves: its files as they are, and its writer's lock
    released by the OS (the memory is not used to write again)."""
    assert memory._files is not None
    memory._files._writer.release()


# -- the journal ---------------------------------------------------------------------------------------------------
def test_every_write_is_on_disk_when_the_call_returns(tmp_path: Path) -> None:
    path = tmp_path / "m.tkg"
    memory = open_memory(path)
    for i in range(12):
        write(memory, i)
    # removals are journalled too, and their deletes replayed
    memory.remove_episode(memory.episodes("g")[3].id)
    memory.add_facts([FactInput("P0", "LIKES", "T3")], group_id="g")
    crashed(memory)  # no close, no save
    again = open_memory(path)
    assert again._files is not None and again._files.report.replayed == 14 and not path.exists()
    for kind in Kind:  # every record, in the same order
        assert again.records(kind) == memory.records(kind), kind


def test_compaction_folds_the_journal_into_a_snapshot_while_writes_go_on(tmp_path: Path) -> None:
    path = tmp_path / "m.tkg"
    memory = open_memory(path, compact_bytes=0)
    for i in range(20):
        write(memory, i)
    before = sum(p.stat().st_size for p in segment_paths(path))
    memory.compact()
    assert path.exists() and sum(p.stat().st_size for p in segment_paths(path)) < before
    meta, _ = snapshot_module.read(path)
    assert meta["journal_seq"] == 20
    write(memory, 20)
    memory.close()
    reopened = open_memory(path)
    assert facts_of(reopened) == facts_of(memory) and len(facts_of(memory)) == 21
    assert reopened._files is not None and reopened._files.report.replayed == 1
    # saving a durable memory to its own file is a compaction, never a second source of truth
    reopened.save(path)
    assert snapshot_module.read(path)[0]["journal_seq"] == 21
    reopened.close()


def test_automatic_compaction_runs_in_the_background_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "m.tkg"
    memory = open_memory(path, compact_bytes=4_000)
    for i in range(60):
        write(memory, i)
    assert memory._files is not None
    memory._files.wait()
    assert memory._files.last_error is None
    assert len(segment_paths(path)) <= 2 and path.exists()
    memory.close()
    assert facts_of(open_memory(path)) == {f"P{i} likes T{i % 7}" for i in range(60)}


_EXIT_WHILE_COMPACTING = """
import sys
from tkg import HashEmbedder, Memory, MemoryConfig, RulesLLM
from tkg.journal import JournalPolicy
memory = Memory.open(
    sys.argv[1], embedder=HashEmbedder(dim=768), llm=RulesLLM(), config=MemoryConfig(communities=None),
    durability=JournalPolicy(sync="interval", compact_bytes=20_000_000),
)
for i in range(3000):  # the journal reaches 20 MB at the last ~100 episodes: a compaction starts
    memory.add_episode(f"User: I LIKES thing{i}.", group_id="g")
sys.stdout.write("written")
"""


def test_a_process_that_ends_mid_compaction_exits_cleanly_and_loses_nothing(tmp_path: Path) -> None:
    """A script that ends without close() while a background compaction builds its replica: the process waits
    for the compaction instead of aborting (exit 134, "terminate called without an active exception", 2 runs of
    3 with a daemon compaction thread), and the files open with every episode."""
    path = tmp_path / "m.tkg"
    run_script_to_the_end(_EXIT_WHILE_COMPACTING, str(path))
    assert path.exists()  # the compaction finished: a snapshot
    memory = Memory.open(path, embedder=HashEmbedder(dim=768), config=MemoryConfig(communities=None))
    assert len(memory.records(Kind.EPISODE)) == 3000
    memory.close()


def test_a_torn_tail_is_cut_at_the_last_whole_batch_and_reported(tmp_path: Path, caplog: Any) -> None:
    path = tmp_path / "m.tkg"
    newest = journalled(path, 5)
    whole = newest.stat().st_size
    with open(newest, "ab") as f:
        f.write(b"\x00\x00\x10\x00half a batch")
    reopened = open_memory(path)
    assert reopened._files is not None and reopened._files.report.cut_bytes == 16
    assert "torn write" in caplog.text
    assert newest.stat().st_size == whole  # repaired on disk
    assert len(facts_of(reopened)) == 5
    write(reopened, 5)  # and it goes on after the cut
    reopened.close()
    assert len(facts_of(open_memory(path))) == 6


def test_damage_before_the_tail_is_refused_not_guessed(tmp_path: Path) -> None:
    path = tmp_path / "m.tkg"
    memory = open_memory(path)
    write(memory, 0)
    memory._files.journal.rotate()  # type: ignore[union-attr]
    write(memory, 1)
    memory.close()
    first = segment_paths(path)[0]
    data = bytearray(first.read_bytes())
    data[-5] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(JournalError, match="damaged"):
        open_memory(path)


@pytest.mark.parametrize("where", ["first batch", "middle batch", "a batch's length", "meta entry"])
def test_damage_inside_the_newest_segment_with_whole_batches_after_it_is_refused_not_cut(
    tmp_path: Path, where: str
) -> None:
    """A crash tears the last write only: a bad entry with whole batches after it is damage, refused with the file
    left as it is (it was taken for a torn tail and cut: every later acknowledged write lost, on disk too)."""
    path = tmp_path / "m.tkg"
    newest = journalled(path, 5)
    data = bytearray(newest.read_bytes())
    frames = [i for i in range(len(data)) if data.startswith(b"\x83\xa3seq", i)]  # each batch's payload
    at = {"first batch": frames[0] + 4, "middle batch": frames[2] + 4, "a batch's length": frames[1] - 8}.get(
        where,
        frames[0] - 10,  # the meta entry's payload, which ends where the first batch's frame begins
    )
    data[at] ^= 0x01
    newest.write_bytes(bytes(data))
    for opening in (lambda: Memory.load(path, embedder=EMB), lambda: open_memory(path)):
        with pytest.raises(JournalError, match="whole batches follow it"):
            opening()
        assert newest.read_bytes() == bytes(data)


def test_damage_in_the_last_batch_of_the_newest_segment_is_a_torn_write(tmp_path: Path) -> None:
    path = tmp_path / "m.tkg"
    newest = journalled(path, 3)
    data = bytearray(newest.read_bytes())
    data[-3] ^= 0x01
    newest.write_bytes(bytes(data))
    opens_and_goes_on(path, 2)


def opens_and_goes_on(path: Path, held: int) -> None:
    """The memory at ``path`` opens with ``held`` facts, takes one more, and holds it when opened again."""
    memory = open_memory(path)
    assert len(facts_of(memory)) == held
    write(memory, held)
    memory.close()
    assert len(facts_of(open_memory(path))) == held + 1


class _OtherEmbedder(HashEmbedder):
    """Vectors of the same size, from another embedder (by name)."""

    @property
    def name(self) -> str:
        return "another-embedder"


def test_a_memory_with_no_snapshot_yet_refuses_another_embedder_as_a_snapshot_does(tmp_path: Path) -> None:
    """Each journal segment records the embedder that made its vectors: a memory that never compacted (all of a
    small memory may live in its journal) refuses another embedder, or one of another size, with the snapshot's
    error, and leaves its files as they were; check_embedder=False mixes them knowingly."""
    from tkg.errors import ConfigurationError

    path = tmp_path / "m.tkg"
    memory = open_memory(path)
    for i in range(3):
        write(memory, i)
    memory.close()
    assert not path.exists() and segment_paths(path)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ConfigurationError, match="was embedded with 'hash-16-tri', not 'another-embedder'"):
        Memory.open(path, embedder=_OtherEmbedder(dim=16))
    with pytest.raises(ConfigurationError, match="holds 16-d vectors; the embedder makes 32-d"):
        Memory.open(path, embedder=HashEmbedder(dim=32))
    with pytest.raises(ConfigurationError, match="was embedded with"):
        Memory.load(path, embedder=_OtherEmbedder(dim=16))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files
    mixed = Memory.open(path, embedder=_OtherEmbedder(dim=16), check_embedder=False)
    assert len(facts_of(mixed)) == 3
    mixed.close()
    assert len(facts_of(open_memory(path))) == 3


def test_a_segment_of_the_first_journal_format_opens_as_before(tmp_path: Path) -> None:
    """Format 1 segments (no meta entry: written before the journal recorded its embedder) are read as they
    were, and a memory goes on writing after them."""
    from tkg import journal

    path = tmp_path / "m.tkg"
    memory = open_memory(path)
    write(memory, 0)
    memory.close()
    reopened = Memory.load(path, embedder=EMB)
    records = [r for kind in Kind for r in reopened.records(kind)]
    old = journal.MAGIC + journal._HEAD.pack(1) + journal.encode_batch(1, journal.WriteBatch(puts=records))
    for segment in segment_paths(path):
        segment.unlink()
    (tmp_path / "m.tkg.journal.000001").write_bytes(old)
    assert journal.recorded_meta(path) == {"dim": 16}  # told by the vectors: no embedder recorded
    opens_and_goes_on(path, 1)


def test_a_segment_torn_in_its_meta_entry_holds_nothing_and_opens(tmp_path: Path) -> None:
    """A crash while a new segment's head (magic, format, meta entry) was written: nothing was acknowledged in
    it; it is cut to its header and the memory opens with every batch before it."""
    path = tmp_path / "m.tkg"
    memory = open_memory(path)
    write(memory, 0)
    memory._files.journal.rotate()  # type: ignore[union-attr]
    memory.close()
    newest = segment_paths(path)[-1]
    data = newest.read_bytes()
    newest.write_bytes(data[: len(data) - 5])
    opens_and_goes_on(path, 1)


def test_load_sees_the_journal_too_and_changes_nothing_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "m.tkg"
    memory = open_memory(path)
    for i in range(3):
        write(memory, i)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    loaded = Memory.load(path, embedder=EMB)
    assert len(facts_of(loaded)) == 3
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files


def test_interval_sync_acknowledges_after_the_flush(tmp_path: Path) -> None:
    path = tmp_path / "m.tkg"
    memory = open_memory(path, sync="interval", interval=0.01)
    for i in range(10):
        write(memory, i)
    assert len(facts_of(Memory.load(path, embedder=EMB))) == 10  # a process crash loses nothing: the OS has them
    memory.close()


def test_a_journal_that_cannot_be_written_fails_the_write_and_changes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "m.tkg"
    memory = open_memory(path)
    write(memory, 0)
    assert memory._files is not None
    memory._files.journal.close()
    before = {k: len(memory.records(k)) for k in Kind}
    with pytest.raises(JournalError):
        write(memory, 1)
    assert {k: len(memory.records(k)) for k in Kind} == before


def test_open_refuses_a_store_that_persists_itself_and_a_missing_file_when_asked(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError):
        Memory.open(tmp_path / "absent.tkg", embedder=EMB, create=False)
    with pytest.raises(SnapshotError):
        Memory.open(tmp_path / "no-such-dir" / "m.tkg", embedder=EMB)


# -- snapshot saves ----------------------------------------------------------------------------------------------
def _slow_hasher(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every big chunk's hashing on the helper thread starts 20 ms late, and every chunk counts as big but the
    last small one: the interleaving that stored a wrong digest before the digest was fed in order."""
    original = ThreadPoolExecutor.submit

    def late(self: ThreadPoolExecutor, fn: Any, *args: Any, **kwargs: Any) -> Future[Any]:
        if self._thread_name_prefix.startswith("tkg-snapshot-hash"):  # type: ignore[attr-defined]

            def delayed() -> Any:
                time.sleep(0.02)
                return fn(*args, **kwargs)

            return original(self, delayed)
        return original(self, fn, *args, **kwargs)

    monkeypatch.setattr(ThreadPoolExecutor, "submit", late)
    # vectors sections in blocks of 16 rows (1 KiB at 16-d), hashed on the helper thread; 40 vectors leave a last,
    # smaller block hashed inline right after the delayed one
    monkeypatch.setattr(snapshot_module, "_VECTOR_ROWS", 16)
    monkeypatch.setattr(snapshot_module, "_THREAD_MIN", 1000)


def test_a_slow_hashing_thread_never_yields_a_file_that_does_not_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = Memory(embedder=EMB, clock=FixedClock("2024-01-01T00:00:00Z"), config=MemoryConfig(communities=None))
    for i in range(40):
        write(memory, i)
    _slow_hasher(monkeypatch)
    for attempt in range(5):
        path = tmp_path / f"m{attempt}.tkg"
        memory.save(path)
        assert len(facts_of(Memory.load(path, embedder=EMB))) == 40


def test_a_save_that_does_not_read_back_keeps_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = Memory(embedder=EMB, clock=FixedClock("2024-01-01T00:00:00Z"), config=MemoryConfig(communities=None))
    write(memory, 0)
    path = tmp_path / "m.tkg"
    memory.save(path)
    good = path.read_bytes()
    write(memory, 1)
    real_save = snapshot_module._Writer.section

    def corrupting(self: Any, name: str, chunks: Any) -> None:
        real_save(self, name, chunks)
        if name == "records/fact":
            self.sections[-1]["sha256"] = b"\x00" * 32  # a digest that does not match what was written

    monkeypatch.setattr(snapshot_module._Writer, "section", corrupting)
    with pytest.raises(SnapshotError, match="read back"):
        memory.save(path)
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tkg"]  # its temporary file is gone too


def test_temporary_files_of_killed_saves_are_removed_by_the_next_save_or_open(tmp_path: Path) -> None:
    path = tmp_path / "m.tkg"
    memory = Memory(embedder=EMB, config=MemoryConfig(communities=None))
    write(memory, 0)
    memory.save(path)
    for n in range(3):  # what a SIGKILL mid-save leaves: nobody holds their lock
        (tmp_path / f".m.tkg.dead{n}.tmp").write_bytes(b"x" * 100)
    unrelated = tmp_path / ".other.tkg.x.tmp"
    unrelated.write_bytes(b"keep")
    memory.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tkg.x.tmp", "m.tkg"]
    (tmp_path / ".m.tkg.dead.tmp").write_bytes(b"x")
    Memory.load(path, embedder=EMB)
    assert not (tmp_path / ".m.tkg.dead.tmp").exists()


def test_a_save_in_progress_is_never_taken_for_a_dead_one(tmp_path: Path) -> None:
    fcntl = pytest.importorskip("fcntl")
    path = tmp_path / "m.tkg"
    holder = tmp_path / ".m.tkg.live.tmp"
    holder.write_bytes(b"x")
    with open(holder, "rb") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # as a save holds its temporary file
        assert snapshot_module.remove_stale_temporaries(path) == []
        assert holder.exists()


def test_a_save_whose_new_temporary_file_a_cleanup_took_makes_another(tmp_path: Path, monkeypatch) -> None:
    """In the instant between making its temporary file and locking it, a save's file looks like a dead save's to
    a cleanup beside it, which deletes it: the save then makes another (it failed with FileNotFoundError)."""
    path = tmp_path / "m.tkg"
    memory = Memory(embedder=EMB, config=MemoryConfig(communities=None))
    write(memory, 0)
    make = snapshot_module.tempfile.mkstemp
    made: list[str] = []

    def made_then_taken(**kwargs: Any) -> tuple[int, str]:
        fd, name = make(**kwargs)
        made.append(name)
        if len(made) == 1:
            assert snapshot_module.remove_stale_temporaries(path) == [Path(name)]
        return fd, name

    monkeypatch.setattr(snapshot_module.tempfile, "mkstemp", made_then_taken)
    memory.save(path)
    assert len(made) == 2
    assert facts_of(Memory.load(path, embedder=EMB)) == facts_of(memory)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tkg"]


def test_a_save_holds_its_temporary_file_until_it_is_renamed(tmp_path: Path, monkeypatch) -> None:
    """The cleanup that every save, open and load runs finds the file still in use at the rename (the lock was
    released when the written descriptor closed, before the check and the rename: a save beside it deleted it)."""
    path = tmp_path / "m.tkg"
    memory = Memory(embedder=EMB, config=MemoryConfig(communities=None))
    write(memory, 0)
    rename = os.replace
    seen: list[bool] = []

    def replace_after_a_cleanup(source: Any, target: Any) -> None:
        snapshot_module.remove_stale_temporaries(path)
        seen.append(Path(source).exists())
        rename(source, target)

    monkeypatch.setattr(snapshot_module.os, "replace", replace_after_a_cleanup)
    memory.save(path)
    assert seen == [True]
    assert facts_of(Memory.load(path, embedder=EMB)) == facts_of(memory)


def test_the_cleanup_of_one_file_leaves_the_temporaries_of_its_namesakes_alone(tmp_path: Path) -> None:
    """``m.tkg.bak`` and ``m.tkg.side`` saved beside ``m.tkg``: their temporary files match ``.m.tkg.*.tmp`` too."""
    for name in (".m.tkg.bak.k2x9a1.tmp", ".m.tkg.side.q8z0ab.tmp"):
        (tmp_path / name).write_bytes(b"x" * 100)
    (tmp_path / ".m.tkg.dead.tmp").write_bytes(b"x" * 100)
    assert [p.name for p in snapshot_module.remove_stale_temporaries(tmp_path / "m.tkg")] == [".m.tkg.dead.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".m.tkg.bak.k2x9a1.tmp", ".m.tkg.side.q8z0ab.tmp"]


def test_saves_at_once_to_one_file_and_to_its_namesake_all_succeed(tmp_path: Path) -> None:
    memory = Memory(embedder=EMB, config=MemoryConfig(communities=None))
    for i in range(3):
        write(memory, i)
    targets = [tmp_path / "m.tkg", tmp_path / "m.tkg", tmp_path / "m.tkg.bak"]

    def saves(target: Path) -> int:
        for _ in range(8):
            memory.save(target)
        return 8

    with ThreadPoolExecutor(len(targets)) as pool:
        assert sum(pool.map(saves, targets)) == 8 * len(targets)  # each raised FileNotFoundError at times
    for target in {*targets}:
        assert facts_of(Memory.load(target, embedder=EMB)) == facts_of(memory)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tkg", "m.tkg.bak"]


# -- one writer ---------------------------------------------------------------------------------------------------
def test_a_memory_open_for_writing_refuses_a_second_writer_and_lets_readers_read(tmp_path: Path) -> None:
    """Two memories opened on one file each appended batches with their own sequence numbers: after one write of
    each, the journal no longer opened (out of order). The second open is refused, as is a save of another memory
    over the file; Memory.load reads it; once closed, it opens again, and no lock file is left."""
    from tkg.errors import MemoryInUseError

    path = tmp_path / "m.tkg"
    memory = open_memory(path)
    write(memory, 0)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.suffix != ".lock"}
    with pytest.raises(MemoryInUseError, match=r"m\.tkg is in use by another writer"):
        open_memory(path)
    other = Memory(embedder=EMB, config=MemoryConfig(communities=None))
    write(other, 1)
    with pytest.raises(MemoryInUseError):
        other.save(path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.suffix != ".lock"} == files
    assert facts_of(Memory.load(path, embedder=EMB)) == {"P0 likes T0"}
    write(memory, 2)
    memory.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tkg.journal.000001"]
    with open_memory(path) as again:
        assert facts_of(again) == {"P0 likes T0", "P2 likes T2"}
    other.save(path)  # nobody has it open now: it replaces that memory, journal included
    assert facts_of(Memory.load(path, embedder=EMB)) == {"P1 likes T1"}  # the old journal was replayed onto it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.tkg"]
    assert snapshot_module.read(path)[0]["journal_seq"] == 2  # covered, were a crash to leave the old segments


_HOLD_OPEN = """
import sys
from tkg import HashEmbedder, Memory, MemoryConfig
memory = Memory.open(sys.argv[1], embedder=HashEmbedder(dim=16), config=MemoryConfig(communities=None))
print("open", flush=True)
sys.stdin.readline()
"""


def test_another_process_cannot_open_a_memory_open_for_writing_until_it_dies(tmp_path: Path) -> None:
    from tkg.errors import MemoryInUseError

    path = tmp_path / "m.tkg"
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLD_OPEN, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "open"
        with pytest.raises(MemoryInUseError):
            open_memory(path)
    finally:
        child.kill()  # SIGKILL: the OS releases its lock
        child.wait(timeout=60)
    opens_and_goes_on(path, 0)


# -- crashes -----------------------------------------------------------------------------------------------------
def _kill_round(path: Path, first: int, delay: float) -> int:
    """Run the writer from ``first``, SIGKILL it after ``delay`` seconds of writing; return the last acked i."""
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(path), str(first)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    assert child.stdout is not None
    ready = child.stdout.readline()
    assert ready.strip() == "ready", ready
    acked = first - 1
    lines: list[str] = []

    def read() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    time.sleep(delay)
    child.send_signal(signal.SIGKILL)
    child.wait()
    reader.join(timeout=10)
    for line in lines:
        if line.startswith("ack "):
            acked = int(line.split()[1])
    return acked


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_no_acknowledged_write(tmp_path: Path) -> None:
    """A writer killed with SIGKILL 50 times, mid-write, mid-compaction and mid-snapshot-save: after each kill the
    memory opens, holds every acknowledged write, and holds an unacknowledged one whole or not at all."""
    rng = random.Random(15)
    path = tmp_path / "m.tkg"
    next_i, kills, stale_seen = 0, 0, 0
    while kills < 50:
        acked = _kill_round(path, next_i, rng.uniform(0.02, 0.4))
        kills += 1
        memory = Memory.open(path, embedder=EMB, config=MemoryConfig(communities=None))
        facts = {f.fact for f in memory.records(Kind.FACT) if isinstance(f, Fact)}
        episodes = [e for e in memory.records(Kind.EPISODE) if isinstance(e, Episode)]
        written = {int(e.source_description[1:]) for e in episodes}
        assert set(range(acked + 1)) <= written, f"kill {kills}: lost acknowledged writes"
        # whole or absent: every episode present brought its fact and its two entities
        assert facts == {f"P{i} likes T{i % 7}" for i in written}
        assert len(memory.records(Kind.MENTION)) == 2 * len(written)
        memory.close()
        side = Path(str(path) + ".side")
        if side.exists():
            Memory.load(side, embedder=EMB, check_embedder=False)  # a killed side save never replaced it badly
        stale_seen = max(stale_seen, len(list(tmp_path.glob(".*.tmp"))))
        next_i = max(written, default=-1) + 1
    assert stale_seen <= 2  # a killed save's temporary file is cleaned up by the next save or open


def test_a_write_in_flight_when_the_memory_closes_is_refused_not_lost(tmp_path: Path) -> None:
    """close() while an add_episode waits for its LLM, and a write after close(): each fails with a JournalError
    and changes nothing, neither the live memory nor its files (it was acknowledged and then missing after a
    reopen: close() let the store go on without a journal)."""
    path = tmp_path / "m.tkg"
    rules = RulesLLM()

    def answer(prompt: Any, model: Any) -> Any:
        memory.close()  # the memory closes while this episode's LLM call is in flight
        return rules.generate(prompt, model)

    memory = Memory.open(path, embedder=EMB, llm=ScriptedLLM(handler=answer), clock=FixedClock("2024-01-01T00:00:00Z"))
    write(memory, 0)
    with pytest.raises(JournalError, match="closed"):
        memory.add_episode("Ann: I live in Paris.", group_id="g")
    with pytest.raises(JournalError, match="closed"):
        write(memory, 1)
    assert facts_of(memory) == {"P0 likes T0"} and memory.stats()["records"]["episode"] == 1
    memory.close()  # again: nothing to do
    with open_memory(path) as reopened:
        assert facts_of(reopened) == facts_of(memory)
        assert [e.content for e in reopened.episodes()] == [e.content for e in memory.episodes()]


# -- a disk that fills up ------------------------------------------------------------------------------------------

_FILE_TOO_BIG = """
import resource, signal, sys
from pathlib import Path
from tkg import FactInput, HashEmbedder, Kind, Memory, MemoryConfig
from tkg.errors import JournalError
from tkg.journal import segment_paths
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit a write fails (EFBIG), as on a full disk
path = Path(sys.argv[1])
def opened():
    return Memory.open(path, embedder=HashEmbedder(dim=32), config=MemoryConfig(communities=None))
def names(memory):
    return sorted(e.name for e in memory.records(Kind.ENTITY))
memory = opened()
memory.add_facts([FactInput("Ann", "LIKES", "Tea")], group_id="g")
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (segment_paths(path)[-1].stat().st_size + 100, hard))
try:
    memory.add_facts([FactInput("Bob", "LIKES", "Coffee")], group_id="g")
    raise SystemExit("the write past the limit did not fail")
except JournalError:
    pass
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
assert names(memory) == ["Ann", "Tea"], names(memory)
if sys.argv[2] == "write":
    memory.add_facts([FactInput("Cid", "LIKES", "Milk")], group_id="g")
memory.close()
again = opened()
expected = ["Ann", "Cid", "Milk", "Tea"] if sys.argv[2] == "write" else ["Ann", "Tea"]
assert names(again) == expected, names(again)
again.close()
sys.stdout.write("written")
"""


@pytest.mark.parametrize("then", ["write", "close"])
def test_a_write_the_disk_refused_leaves_nothing_behind(tmp_path: Path, then: str) -> None:
    """The journal's file was buffered: a write that failed for lack of space stayed in the buffer, and the next
    flush put it on disk -- after a later write, under its sequence number (the journal never opened again:
    "out of order"), or at close() (the failed write was there after a reopen)."""
    run_script_to_the_end(_FILE_TOO_BIG, str(tmp_path / "m.tkg"), then)


def test_a_compaction_that_cannot_start_its_segment_fails_no_write(tmp_path: Path, monkeypatch: Any) -> None:
    """The new segment's header could not be written (disk full): the automatic compaction raised a raw OSError
    out of a write already journalled (reported failed, there after a reopen), and the journal stayed closed for
    good; compact() did the same."""
    import errno

    import tkg.journal as journal_module

    real = journal_module._write_all

    def full_for_headers(f: Any, data: bytes) -> None:
        if data.startswith(journal_module.MAGIC):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(f, data)

    path = tmp_path / "m.tkg"
    memory = open_memory(path)
    write(memory, 0)
    memory.close()
    size = sum(p.stat().st_size for p in segment_paths(path))
    memory = open_memory(path, compact_bytes=size + 1)  # every write from now on asks for a compaction
    monkeypatch.setattr(journal_module, "_write_all", full_for_headers)
    for i in range(1, 4):
        write(memory, i)  # each acknowledged, though no compaction can start
    with pytest.raises(JournalError, match="new journal segment"):
        memory.compact()
    assert [p.name for p in segment_paths(path)] == ["m.tkg.journal.000001"]  # none begun and left half-made
    monkeypatch.setattr(journal_module, "_write_all", real)
    write(memory, 4)
    memory.close()
    assert facts_of(open_memory(path)) == {f"P{i} likes T{i % 7}" for i in range(5)}


_END_RIGHT_AFTER_A_COMPACTION_STARTS = """
import sys
from pathlib import Path
from tkg import FactInput, HashEmbedder, Memory, MemoryConfig
from tkg.journal import JournalPolicy, segment_paths
path = Path(sys.argv[1])
memory = Memory.open(
    path, embedder=HashEmbedder(dim=16), config=MemoryConfig(communities=None),
    durability=JournalPolicy(compact_bytes=2_000_000),
)
i = 0
while len(segment_paths(path)) < 2:  # until the automatic compaction has started (it rotates the journal)
    memory.add_facts([FactInput(f"P{i}_{j}", "LIKES", f"T{j}") for j in range(200)], group_id="g")
    i += 1
sys.stdout.write("written")
"""


def test_a_compaction_still_running_when_the_main_thread_ends_finishes(tmp_path: Path) -> None:
    """Python starts no pool work once the main thread has ended: the compaction's snapshot check failed
    (RuntimeError, "cannot schedule new futures after interpreter shutdown"), and the compaction was lost."""
    path = tmp_path / "m.tkg"
    run_script_to_the_end(_END_RIGHT_AFTER_A_COMPACTION_STARTS, str(path))
    assert path.exists() and len(segment_paths(path)) == 1  # folded into a snapshot


def test_a_memory_whose_journal_is_of_format_1_writes_on_in_a_segment_that_records_its_embedder(
    tmp_path: Path,
) -> None:
    """A journal written before segments recorded their embedder (format 1): tkg appended to it, so the memory
    never recorded its embedder, and another one of the same size was taken without a word for ever after."""
    import struct

    import tkg.journal as journal_module

    path = tmp_path / "m.tkg"
    memory = open_memory(path)
    write(memory, 0)
    memory.close()
    [segment] = segment_paths(path)
    data = segment.read_bytes()
    head = len(journal_module.MAGIC) + 2
    meta_length, _ = struct.unpack_from(">II", data, head)
    # as format 1 wrote it: its version, and no meta entry
    segment.write_bytes(journal_module.MAGIC + struct.pack(">H", 1) + data[head + 8 + meta_length :])
    assert journal_module.recorded_meta(path).get("embedder") is None

    memory = open_memory(path)  # read as before
    write(memory, 1)
    memory.close()
    assert [p.name for p in segment_paths(path)] == ["m.tkg.journal.000001", "m.tkg.journal.000002"]
    assert journal_module.recorded_meta(path)["embedder"] == EMB.name
    with pytest.raises(ConfigurationError, match="was embedded with"):  # another embedder, of the same size
        Memory.open(path, embedder=HashEmbedder(dim=EMB.dim, trigrams=False), config=MemoryConfig(communities=None))
    assert facts_of(open_memory(path)) == {"P0 likes T0", "P1 likes T1"}
