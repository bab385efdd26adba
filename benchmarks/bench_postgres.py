#!/usr/bin/env python
"""PostgreSQL backend versus the in-memory backend, in one run: add_episode and hybrid search, p50/p95.

For each graph size N (facts) the base graph of ``bench_core.py`` (same records, same seed) is bulk-loaded into
an ``InMemoryStore`` and into a ``PostgresStore`` (a fresh schema), and the same episodes and queries are run on
each through ``Memory``: ``add_episode`` engine time (wall minus scripted-LLM and embedder time) and
``Memory.search(limit=10)`` total time (hybrid: cosine + full text fused by RRF over facts, entities, episodes).

The PostgreSQL server is an embedded one (``EmbeddedPostgres``, unix socket, no fsync; data in a temporary
directory) unless ``--dsn`` names your own.

    python benchmarks/bench_postgres.py                    # sizes 10000,100000; 100 episodes; 200 queries
    python benchmarks/bench_postgres.py --quick            # smoke: 2000 facts, 20 episodes, 20 queries
    python benchmarks/bench_postgres.py --dsn postgresql://me@localhost/tkgbench

Results are printed as a table and written to ``benchmarks/out/postgres.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_core as core

import tkg
from tkg.backends.memory import InMemoryStore
from tkg.backends.postgres import EmbeddedPostgres, PostgresStore
from tkg.storage import Store


def run_backend(
    name: str, store: Store, records: list[Any], texts: Sequence[str], queries: Sequence[str], warmup: int
) -> dict[str, Any]:
    t = time.perf_counter()
    store.load(records)  # type: ignore[attr-defined]
    load_s = time.perf_counter() - t
    embedder = core.TimedEmbedder(tkg.HashEmbedder(dim=core.DIM))
    handler = core.TimedHandler(core.extraction_handler)
    clock = tkg.FixedClock(core.CLOCK_START, tick=timedelta(seconds=1))
    memory = tkg.Memory(store, embedder=embedder, llm=tkg.ScriptedLLM(handler=handler), clock=clock)
    bench = core.Bench(memory, embedder, handler)
    gc.collect()
    core.run_add_episodes(bench, texts[:warmup])
    added = core.run_add_episodes(bench, texts[warmup:])
    gc.collect()
    core.run_searches(bench, queries[:warmup])
    searched = core.run_searches(bench, queries[warmup:])
    print(f"    {name}: load {load_s:.1f} s", flush=True)
    return {"load_s": load_s, "add_episode": added, "search": searched, "records": memory.stats()["records"]}


def bench_size(n_facts: int, args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    rng = random.Random(core.SEED)
    np.random.seed(core.SEED)
    records, vocab, _ = core.build_records(n_facts, rng, tkg.HashEmbedder(dim=core.DIM))
    texts = core.episode_texts(rng, vocab, args.warmup + args.episodes)
    queries = core.query_texts(rng, vocab, args.warmup + args.queries)
    result: dict[str, Any] = {"facts": n_facts}
    result["memory"] = run_backend("memory", InMemoryStore(dim=core.DIM), records, texts, queries, args.warmup)
    gc.collect()
    schema = f"bench_{n_facts}_{int(time.time())}"
    with PostgresStore(dsn, dim=core.DIM, schema=schema) as store:
        result["postgres"] = run_backend("postgres", store, records, texts, queries, args.warmup)
        if args.drop:
            with store._connection().cursor() as cur:
                cur.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return result


def print_report(results: list[dict[str, Any]]) -> None:
    print()
    head = ("N facts", "backend", "load s", "add p50", "add p95", "search p50", "search p95")
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, (9, 9, 8, 9, 9, 11, 11), strict=True)))
    for r in results:
        for backend in ("memory", "postgres"):
            b = r[backend]
            add, search = b["add_episode"]["engine_ms"], b["search"]["total_ms"]
            print(
                f"{r['facts']:>9,} {backend:>9} {b['load_s']:>8.1f} {add['p50']:>9.2f} {add['p95']:>9.2f} "
                f"{search['p50']:>11.2f} {search['p95']:>11.2f}"
            )
    print("(milliseconds; add = add_episode engine time, search = Memory.search total incl. query embedding)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000", help="graph sizes in facts, comma-separated")
    parser.add_argument("--episodes", type=int, default=100, help="measured add_episode calls per size and backend")
    parser.add_argument("--queries", type=int, default=200, help="measured searches per size and backend")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured iterations before each measurement")
    parser.add_argument("--dsn", default=None, help="your PostgreSQL (default: an embedded server)")
    parser.add_argument("--keep", dest="drop", action="store_false", help="keep the benchmark schemas")
    parser.add_argument("--quick", action="store_true", help="smoke: 2000 facts, 20 episodes, 20 queries")
    parser.add_argument("--out", default=str(core.OUT_DIR / "postgres.json"), help="where the JSON results go")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.episodes, args.queries = "2000", 20, 20
    args.sizes = sorted({int(s) for s in str(args.sizes).split(",") if s.strip()})
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    info = core.machine()
    print(f"tkg {info['tkg']} PostgreSQL benchmark -- {datetime.now(UTC).isoformat(timespec='seconds')}")
    print(f"machine: {info['cpu_count']} CPUs, {info['processor']}, Python {info['python']}, {info['platform']}")
    print(f"CPU busy with other processes at start: {info['others_cpu_busy_at_start']}; load {info['load_average']}")
    server = None if args.dsn else EmbeddedPostgres()
    dsn = args.dsn or server.dsn  # type: ignore[union-attr]
    results = []
    try:
        for n in args.sizes:
            t = time.perf_counter()
            print(f"... N={n:,} facts", flush=True)
            results.append(bench_size(n, args, dsn))
            print(f"    done in {time.perf_counter() - t:.1f} s", flush=True)
    finally:
        if server is not None:
            server.stop()
    print_report(results)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": "postgres", "machine": info, "args": vars(args), "results": results}
    out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
