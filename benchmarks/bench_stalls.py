#!/usr/bin/env python
"""Write stalls: the slowest add_episode calls of a long run on a big store, with index maintenance on the
writer's path and off it, side by side; and the same run on PostgreSQL.

The base graph of ``bench_core.py`` (same records, same seed) at N facts is bulk-loaded into an ``InMemoryStore``,
then ``--episodes`` episodes go through ``Memory.add_episode`` (scripted LLM, hash embedder). Fresh vectors wait
in a tail that is folded into the HNSW graph in batches, and fresh BM25 documents in a tail merged by a rebuild of
the whole text index; done on the writer's path, those folds are the slow calls. The run is made three times, each
in its own process: ``inline`` (``InMemoryStore(background=False)``: every fold on the writer that fills a tail) and
``background`` (the default: a worker thread folds, the writer never waits for more than one small HNSW insert),
then ``background-frozen``: the default store in a process that calls ``gc.freeze()`` once the base graph is
loaded (a host's choice: the collector stops scanning the objects alive then; benchmarks/README.md says what it
did). Then ``postgres``: a ``PostgresStore`` on an ``EmbeddedPostgres`` (temporary directory), whose slow calls
were the repacks of its BM25 postings (run by the write that noticed them, while every writer waited: ~0.4 s a
kind at 100,000 facts) before they moved to a worker beside the writers (the run counts the repacks it saw).
Calls during which Python ran a full garbage collection (it stops every thread for a time that grows with the
objects alive) are also counted apart.
Engine time = wall time of add_episode minus the time inside the LLM double and the embedder.

    python benchmarks/bench_stalls.py                 # 100,000 facts, 10,000 episodes (~5 min)
    python benchmarks/bench_stalls.py --quick         # 10,000 facts, 1,000 episodes
    python benchmarks/bench_stalls.py --modes postgres # PostgreSQL alone (~7 min)

Target (issue 16): no add_episode over 50 ms at 100,000 facts in a 10,000-episode run (max and p99.9 reported), in
memory. PostgreSQL has no target here: its add_episode p95 at 100,000 facts is ~45 ms (bench_postgres.py).
"""

from __future__ import annotations

import argparse
import gc
import random
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_core as core
import render
from measure import POSTGRES_SETTINGS, percentile

import tkg
from tkg.backends.memory import InMemoryStore
from tkg.storage import Store

ROOT = Path(__file__).resolve().parent
LIMIT_MS = 50.0
MODES = ("inline", "background", "background-frozen", "postgres")


def measure(mode: str, n_facts: int, episodes: int) -> dict[str, Any]:
    """One mode, in the calling process: build, load, then time every add_episode."""
    if mode != "postgres":
        return _measure(mode, InMemoryStore(dim=core.DIM, background=mode.startswith("background")), n_facts, episodes)
    from tkg.backends.postgres import EmbeddedPostgres, PostgresStore

    with (
        EmbeddedPostgres(settings=POSTGRES_SETTINGS) as server,
        PostgresStore(server.dsn, dim=core.DIM, schema="stalls") as store,
    ):
        return _measure(mode, store, n_facts, episodes, lambda: _repacks(server.dsn))


def _repacks(dsn: str) -> int:
    """The repacks of the PostgreSQL store's postings so far (each moves a kind's packs to a new generation)."""
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT coalesce(sum(gen), 0) FROM stalls.packed").fetchone()
    return int(row[0]) if row else 0


def _measure(
    mode: str, store: Store, n_facts: int, episodes: int, repacks: Callable[[], int] | None = None
) -> dict[str, Any]:
    rng = random.Random(core.SEED)
    np.random.seed(core.SEED)
    records, vocab, _ = core.build_records(n_facts, rng, tkg.HashEmbedder(dim=core.DIM))
    texts = core.episode_texts(rng, vocab, episodes)
    del vocab  # the harness's word lists: ~90,000 references for every full collection to follow, none tkg's
    store.load(records)
    records.clear()
    gc.collect()
    if mode.endswith("-frozen"):
        gc.freeze()  # every object alive now (the loaded memory) leaves the collector's generations
    pauses: list[tuple[float, float]] = []  # (start, end) of each full (generation 2) collection
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if info.get("generation") == 2:
            if phase == "start":
                started.append(time.perf_counter())
            elif started:
                pauses.append((started.pop(), time.perf_counter()))

    gc.callbacks.append(on_gc)
    embedder = core.TimedEmbedder(tkg.HashEmbedder(dim=core.DIM))
    handler = core.TimedHandler(core.extraction_handler)
    clock = tkg.FixedClock(core.CLOCK_START, tick=timedelta(seconds=1))
    memory = tkg.Memory(
        store,
        embedder=embedder,
        llm=tkg.ScriptedLLM(handler=handler),
        clock=clock,
        config=tkg.MemoryConfig(communities=None),
    )
    gc.collect()
    repacks_before = repacks() if repacks is not None else 0
    engine: list[float] = []
    spans: list[tuple[float, float]] = []
    for text in texts:
        handler.seconds = embedder.seconds = 0.0
        start = time.perf_counter()
        memory.add_episode(text, group_id=core.GROUP)
        end = time.perf_counter()
        spans.append((start, end))
        engine.append((end - start - handler.seconds - embedder.seconds) * 1000.0)
        llm = memory.llm
        if isinstance(llm, tkg.ScriptedLLM) and len(llm.calls) > 1000:
            llm.calls.clear()  # the double keeps every prompt
    t = time.perf_counter()
    idle = store.wait_for_maintenance(600)
    gc.callbacks.remove(on_gc)
    # Calls during which Python ran a full garbage collection (any thread's allocations may trigger one; it stops
    # every thread): the collector's pause, not tkg's work. Reported apart.
    in_gc = [any(a < e and s < b for a, b in pauses) for s, e in spans]
    own = [v for v, hit in zip(engine, in_gc, strict=True) if not hit]
    return {
        "mode": mode,
        "facts": n_facts,
        "episodes": episodes,
        "p50_ms": percentile(engine, 50),
        "p95_ms": percentile(engine, 95),
        "p99_ms": percentile(engine, 99),
        "p999_ms": percentile(engine, 99.9),
        "max_ms": max(engine),
        "over_limit": sum(1 for v in engine if v > LIMIT_MS),
        "max_without_gc_ms": max(own) if own else float("nan"),
        "over_limit_without_gc": sum(1 for v in own if v > LIMIT_MS),
        "full_gcs": len(pauses),
        "full_gc_max_ms": max(((b - a) * 1000.0 for a, b in pauses), default=0.0),
        "calls_with_full_gc": sum(in_gc),
        "slowest_ms": sorted(engine, reverse=True)[:5],
        "drain_s": time.perf_counter() - t,
        "drained": idle,
        "text_index": store.stats().get("text_index"),
        "repacks": repacks() - repacks_before if repacks is not None else "-",
    }


def contract(rows: list[dict[str, Any]]) -> dict[str, Any]:
    columns = [f"{r['mode']}" for r in rows]
    metrics = [
        ("engine p50 ms", "p50_ms"),
        ("engine p95 ms", "p95_ms"),
        ("engine p99 ms", "p99_ms"),
        ("engine p99.9 ms", "p999_ms"),
        ("engine max ms", "max_ms"),
        (f"episodes over {LIMIT_MS:.0f} ms", "over_limit"),
        ("full garbage collections during the run", "full_gcs"),
        ("longest full garbage collection ms", "full_gc_max_ms"),
        ("engine max ms, calls without a full collection", "max_without_gc_ms"),
        (f"episodes over {LIMIT_MS:.0f} ms without a full collection", "over_limit_without_gc"),
        ("worker still busy after the run, s", "drain_s"),
        ("repacks of the postings during the run (PostgreSQL)", "repacks"),
    ]
    n, e = (rows[0]["facts"], rows[0]["episodes"]) if rows else (0, 0)
    table = {
        "title": f"add_episode engine time, {e:,} episodes on {n:,} facts: index maintenance inline vs background, "
        "and PostgreSQL",
        "columns": ["metric", *columns],
        "rows": [[label, *[r[key] for r in rows]] for label, key in metrics],
        "notes": [
            "inline: InMemoryStore(background=False), HNSW folds and BM25 rebuilds on the writer that fills a tail; "
            "background: the default, a worker thread folds 32 vectors at a time and rebuilds BM25 from a snapshot; "
            "background-frozen: the same, in a process that calls gc.freeze() after loading the base graph",
            "engine time = wall time of add_episode minus the LLM double and the embedder; each mode in its own "
            "process, same records and episodes",
            "a full (generation 2) garbage collection stops every thread for a time that grows with the tracked "
            "objects alive: the store's records are rows the collector skips and tkg's string memos are dicts it does "
            "not track (tkg.memo), so at 100k facts these are mostly the interpreter's own and its imports'; "
            "gc.freeze() takes those out of its way",
            "postgres: PostgresStore (EmbeddedPostgres, shared_buffers 4GB), BM25 postings repacked by a worker beside "
            "the writers; repacks = the kinds' pack generations made during the run",
        ],
    }
    targets = [
        render.target(f"no add_episode over 50 ms at {n:,} facts ({r['mode']}, max)", r["max_ms"], LIMIT_MS, "ms")
        for r in rows
        if r["mode"].startswith("background")
    ]
    return {"tables": [table], "plots": [], "targets": targets}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--facts", type=int, default=100_000, help="graph size in facts")
    parser.add_argument("--episodes", type=int, default=10_000, help="add_episode calls measured")
    parser.add_argument("--quick", action="store_true", help="10,000 facts, 1,000 episodes")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of: {', '.join(MODES)}")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "stalls.json", help="where the JSON goes")
    args = parser.parse_args(argv)
    if args.quick:
        args.facts, args.episodes = 10_000, 1_000
    started = time.perf_counter()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    info = core.machine()
    rows = []
    modes = [m for m in args.modes.split(",") if m]
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes takes some of: {', '.join(MODES)}")
    for mode in modes:  # one after the other: each has both cores (the worker uses the second)
        print(f"-- {mode}: {args.facts:,} facts, {args.episodes:,} episodes", flush=True)
        row = core.in_fresh_process(measure, mode, args.facts, args.episodes)
        print(
            f"   p50 {row['p50_ms']:.2f}  p99.9 {row['p999_ms']:.1f}  max {row['max_ms']:.1f} ms, "
            f"{row['over_limit']} over {LIMIT_MS:.0f} ms; {row['full_gcs']} full GCs (max "
            f"{row['full_gc_max_ms']:.0f} ms), max without them {row['max_without_gc_ms']:.1f} ms",
            flush=True,
        )
        rows.append(row)
    payload = {
        **render.header("stalls", args, info, started_at, started),
        **contract(rows),
        "results": rows,
    }
    render.write_result(args.out, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
