#!/usr/bin/env python
"""PostgreSQL backend versus the in-memory backend, in one run: build, add_episode, hybrid search, memory.

For each graph size N (facts) the base graph of ``bench_core.py`` (same records, same seed) is bulk-loaded into
an ``InMemoryStore`` and into a ``PostgresStore`` (a fresh schema), and the same episodes and queries are run on
each through ``Memory``: ``add_episode`` engine time (wall minus scripted-LLM and embedder time) and
``Memory.search(limit=10)`` total time (hybrid: cosine + full text fused by RRF over facts, entities, episodes).

Each (size, backend) runs in a fresh process, so the resident memory reported is that backend's alone: the
client process's RSS at the end, once the records are dropped, minus its RSS after its imports (what the store
keeps in the process, as ``bench_scale.py`` counts it), and its peak (which includes building the records). For
PostgreSQL the data lives in the server; its on-disk size (tables and indexes of the schema) is reported beside.

The PostgreSQL server is an embedded one (``EmbeddedPostgres``, unix socket, no fsync; data in a temporary
directory) unless ``--dsn`` names your own.

    python benchmarks/bench_postgres.py                    # sizes 10000,100000; 100 episodes; 200 queries
    python benchmarks/bench_postgres.py --quick            # smoke: 2000 facts, 20 episodes, 20 queries
    python benchmarks/bench_postgres.py --dsn postgresql://me@localhost/tkgbench

Results are printed as a table and written to ``benchmarks/out/postgres.json`` (the suite's JSON contract).
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import random
import sys
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_core as core
import render
from measure import POSTGRES_SETTINGS, percentile, server_settings

import tkg
from tkg.backends.memory import InMemoryStore
from tkg.backends.postgres import EmbeddedPostgres, PostgresStore
from tkg.storage import Store
from tkg.timeline import make_scope

BACKENDS = ("memory", "postgres")
EF_SEARCH = {
    name: inspect.signature(store).parameters["ef_search"].default
    for name, store in (("memory", InMemoryStore), ("postgres", PostgresStore))
}


def run_backend(
    name: str, store: Store, records: list[Any], texts: Sequence[str], queries: Sequence[str], warmup: int
) -> dict[str, Any]:
    """Load ``records`` into ``store`` (the caller's list is emptied, so the process keeps only what the store
    holds), then time add_episode and search through a ``Memory`` on it."""
    t = time.perf_counter()
    store.load(records)  # type: ignore[attr-defined]
    load_s = time.perf_counter() - t
    records.clear()
    embedder = core.TimedEmbedder(tkg.HashEmbedder(dim=core.DIM))
    handler = core.TimedHandler(core.extraction_handler)
    clock = tkg.FixedClock(core.CLOCK_START, tick=timedelta(seconds=1))
    memory = tkg.Memory(store, embedder=embedder, llm=tkg.ScriptedLLM(handler=handler), clock=clock)
    bench = core.Bench(memory, embedder, handler)
    gc.collect()
    core.run_add_episodes(bench, texts[:warmup])
    added = core.run_add_episodes(bench, texts[warmup:])
    llm = memory.llm
    if isinstance(llm, tkg.ScriptedLLM):
        llm.calls.clear()  # the double keeps every prompt; they are not the store's memory
    gc.collect()
    core.run_searches(memory, embedder, queries[:warmup])
    searched = core.run_searches(memory, embedder, queries[warmup:])
    past = {}  # the same queries at past times, after a warm-up of their own
    for name, asked in core.past_times(len(queries)).items():
        core.run_searches(memory, embedder, queries[:warmup], asked[:warmup])
        past[name] = core.run_searches(memory, embedder, queries[warmup:], asked[warmup:])
    gc.collect()
    peak, current = core.rss_mb()
    # Search quality beside the timings (after the RSS reading: the exact scan reads every fact's vector):
    # recall@10 of the fact cosine search against exact, bench_scale's measure.
    vectors = tkg.HashEmbedder(dim=core.DIM).embed(list(queries[warmup:][: core.RECALL_QUERIES]))
    scope = make_scope(clock.now(), [core.GROUP])
    cuts = core.exact_cuts(store, vectors, scope, core.RECALL_K)
    recall = core.fact_recall(store, vectors, cuts, scope, core.RECALL_K)
    return {
        "load_s": load_s,
        "add_episode": added,
        "search": searched,
        **past,
        "recall": recall,
        "records": memory.stats()["records"],
        "rss_mb": {"peak": peak, "current": current},
    }


def repack_under_writes(store: PostgresStore, dsn: str, texts: Sequence[str]) -> dict[str, Any]:
    """The facts' packed postings rebuilt twice while add_episode runs in this thread: as a write used to (after
    its commit, one transaction holding the packs' lock exclusively, so every writer waits: ``terms.repack``, which a
    bulk load still runs) and as the store's worker does now (``terms.repack_steps``, beside the writers). Each:
    the repack's seconds and the engine ms of the episodes added meanwhile."""
    from tkg.backends.postgres import terms
    from tkg.backends.postgres.schema import render
    from tkg.models import Kind

    store.wait_for_maintenance()  # the store's own worker idle: these repacks are the only ones
    embedder = core.TimedEmbedder(tkg.HashEmbedder(dim=core.DIM))
    handler = core.TimedHandler(core.extraction_handler)
    clock = tkg.FixedClock(core.CLOCK_START + timedelta(days=400), tick=timedelta(seconds=1))
    memory = tkg.Memory(store, embedder=embedder, llm=tkg.ScriptedLLM(handler=handler), clock=clock)
    bench = core.Bench(memory, embedder, handler)

    def q(text: str) -> Any:
        return render(text, store.schema)

    out: dict[str, Any] = {}
    for mode in ("exclusive", "beside"):
        with psycopg.connect(dsn, autocommit=True) as conn:
            took: list[float] = []

            def repack(mode: str = mode, conn: psycopg.Connection[Any] = conn, took: list[float] = took) -> None:
                t = time.perf_counter()
                if mode == "exclusive":
                    with conn.transaction(), conn.cursor() as cur:
                        terms.repack(cur, q, Kind.FACT, store.schema)
                else:
                    steps = list(terms.repack_steps(conn, q, Kind.FACT, store.schema))
                    assert steps[-1:] == ["swapped"], steps
                took.append(time.perf_counter() - t)

            worker = threading.Thread(target=repack)
            engine: list[float] = []
            worker.start()
            while worker.is_alive():
                added = core.run_add_episodes(bench, [texts[len(engine) % len(texts)]])
                engine.append(added["engine_ms"]["max"])
            worker.join()
        out[mode] = {
            "repack_s": took[0] if took else None,
            "episodes": len(engine),
            "engine_ms_p50": percentile(engine, 50) if engine else None,
            "engine_ms_max": max(engine) if engine else None,
        }
    return out


def server_pss_mb(backend_pid: int) -> float | None:
    """Proportional resident memory of the PostgreSQL server that runs ``backend_pid`` (its postmaster and every
    child: shared buffers counted once), or None when the server is not a process of this machine we can read."""
    try:
        postmaster = int(Path(f"/proc/{backend_pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        pids = [postmaster]
        for stat in Path("/proc").glob("[0-9]*/stat"):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == postmaster:
                pids.append(int(stat.parent.name))
        kb = 0
        for pid in pids:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    kb += int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return kb / 1024


def measure(
    backend: str,
    n_facts: int,
    episodes: int,
    queries: int,
    warmup: int,
    dsn: str | None,
    drop: bool = True,
    build_memory_mb: int = 1024,
) -> dict[str, Any]:
    """One backend at one size, in the calling process (run it in a fresh one: RSS is per process)."""
    gc.collect()
    _, rss_base = core.rss_mb()  # this fresh process after its imports: subtracted, as bench_scale.py does
    rng = random.Random(core.SEED)
    np.random.seed(core.SEED)
    t = time.perf_counter()
    records, vocab, _ = core.build_records(n_facts, rng, tkg.HashEmbedder(dim=core.DIM))
    build_s = time.perf_counter() - t
    texts = core.episode_texts(rng, vocab, warmup + episodes)
    query_texts = core.query_texts(rng, vocab, warmup + queries)
    if backend == "memory":
        out = run_backend(backend, InMemoryStore(dim=core.DIM), records, texts, query_texts, warmup)
        out["database_mb"] = out["server_pss_mb"] = None
    else:
        assert dsn is not None
        schema = f"bench_{n_facts}_{int(time.time())}"
        with PostgresStore(dsn, dim=core.DIM, schema=schema, build_memory_mb=build_memory_mb) as store:
            out = run_backend(backend, store, records, texts, query_texts, warmup)
            out["repack"] = repack_under_writes(store, dsn, texts)
            with store._connection().cursor() as cur:
                cur.execute(
                    "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                    "JOIN pg_namespace s ON s.oid = c.relnamespace WHERE s.nspname = %s AND c.relkind IN ('r', 'm')",
                    (schema,),
                )
                row = cur.fetchone()
                out["database_mb"] = float(row[0]) / 2**20 if row else None
                pid = cur.execute("SELECT pg_backend_pid()").fetchone()
                out["server_pss_mb"] = server_pss_mb(int(pid[0])) if pid else None
        if drop:  # once the store is closed: its worker may still be indexing the last writes until then
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    out["build_records_s"] = build_s
    out["rss_mb"]["after_imports"] = rss_base
    out["rss_mb"]["store"] = out["rss_mb"]["current"] - rss_base
    return out


def backends_at(n_facts: int, args: argparse.Namespace) -> tuple[str, ...]:
    """The backends measured at ``n_facts``: the in-memory one only up to ``--memory-up-to`` (its own scale runs
    are bench_scale.py's)."""
    return tuple(b for b in BACKENDS if b != "memory" or args.memory_up_to is None or n_facts <= args.memory_up_to)


def bench_size(n_facts: int, args: argparse.Namespace, dsn: str) -> dict[str, Any]:
    result: dict[str, Any] = {"facts": n_facts}
    for backend in backends_at(n_facts, args):
        result[backend] = core.in_fresh_process(
            measure, backend, n_facts, args.episodes, args.queries, args.warmup, dsn, args.drop, args.build_memory_mb
        )
        b = result[backend]
        print(f"    {backend}: load {b['load_s']:.1f} s, client RSS {b['rss_mb']['store']:,.0f} MB", flush=True)
    return result


def repack_value(run: dict[str, Any], mode: str, key: str) -> Any:
    """One number of a run's repack_under_writes (None for the in-memory backend, which has no packs)."""
    return (run.get("repack") or {}).get(mode, {}).get(key)


def contract(results: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The suite's ``tables`` / ``plots`` / ``targets`` (benchmarks/README.md) from the per-size results.

    The table has ``bench_scale.py``'s layout and row names where they apply (one column per size, here per size
    and backend), so its in-memory rows and these read together."""
    runs = [(r["facts"], backend, r[backend]) for r in results for backend in BACKENDS if backend in r]

    def kb_per_fact(mb: float | None, facts: int) -> float | None:
        return None if mb is None else mb * 2**20 / facts / 1000

    rows: list[list[Any]] = [
        ["build s (records + store.load)", *(b["build_records_s"] + b["load_s"] for _, _, b in runs)],
        ["  of which store.load s", *(b["load_s"] for _, _, b in runs)],
        ["add_episode engine ms p50", *(b["add_episode"]["engine_ms"]["p50"] for _, _, b in runs)],
        ["add_episode engine ms p95", *(b["add_episode"]["engine_ms"]["p95"] for _, _, b in runs)],
        ["search ms p50", *(b["search"]["total_ms"]["p50"] for _, _, b in runs)],
        ["search ms p95", *(b["search"]["total_ms"]["p95"] for _, _, b in runs)],
        *(
            [f"search {label} ms {q}", *(b[name]["total_ms"][q] if name in b else None for _, _, b in runs)]
            for name, label in (("search_as_of", "as of a past time"), ("search_known_at", "known at a past time"))
            for q in ("p50", "p95")
        ),
        ["fact cosine recall@10 against exact", *(b["recall"]["recall"] for _, _, b in runs)],
        ["client RSS MB at end (minus imports)", *(b["rss_mb"]["store"] for _, _, b in runs)],
        ["client peak RSS MB", *(b["rss_mb"]["peak"] for _, _, b in runs)],
        ["client KB per fact", *(kb_per_fact(b["rss_mb"]["store"], n) for n, _, b in runs)],
        ["database MB (server, tables + indexes)", *(b["database_mb"] for _, _, b in runs)],
        ["database KB per fact", *(kb_per_fact(b["database_mb"], n) for n, _, b in runs)],
        ["server resident MB (PSS, at end)", *(b.get("server_pss_mb") for _, _, b in runs)],
        *(
            [f"facts repack {label}: {what}", *(repack_value(b, mode, key) for _, _, b in runs)]
            for mode, label in (("exclusive", "as writes ran it"), ("beside", "on the worker"))
            for what, key in (("s", "repack_s"), ("episodes meanwhile", "episodes"), ("their max ms", "engine_ms_max"))
        ),
    ]
    table = {
        "title": f"PostgreSQL beside in-memory: {args.episodes} episodes, {args.queries} queries per size",
        "columns": ["metric", *(f"{n:,} facts {backend}" for n, backend, _ in runs)],
        "rows": rows,
        "notes": [
            "add = add_episode engine time (wall minus scripted LLM and embedder); search = Memory.search(limit=10) "
            "total, hybrid cosine + full text with RRF over facts, entities, episodes, including query embedding. "
            "At a past time: the same queries, each with a random as_of in the facts' event span (2015 to the "
            "benchmark's now) or a random known_at in the span of their creation (bench_core.PAST_TIMES).",
            "build = making the base graph's records and vectors (the same work for both) + Store.load with index "
            "builds. Each backend and size runs in its own process: client RSS at end = resident set once the "
            "records are dropped minus the same process's RSS after its imports (what the store keeps in the "
            "client); peak includes building the records. database = the schema's tables and indexes on disk; server "
            "resident = the PostgreSQL processes' proportional set size at the end (shared memory counted once).",
            f"Recall: {core.RECALL_QUERIES} of the queries, the store's cosine search over facts (k "
            f"{core.RECALL_K}, the group's current facts) against exact cosine over all of them, as in bench_scale.py "
            "(measured after the RSS readings); HNSW ef_search at "
            f"each store's default ({EF_SEARCH['memory']} in memory, {EF_SEARCH['postgres']} in PostgreSQL).",
            "Server: "
            + ("your --dsn" if args.dsn else f"EmbeddedPostgres, settings {args.settings} (others PostgreSQL's)")
            + f"; index builds in load with {args.build_memory_mb:,} MB (PostgresStore(build_memory_mb=...))",
            "facts repack: the facts' BM25 packs rebuilt while add_episode runs, as a write used to run it after its "
            "commit (one transaction holding the packs' lock exclusively: every writer waits) and as the store's "
            "worker runs it now (terms.repack_steps: writers wait only for its cut); each once, in this order, after "
            "the rest; their max ms = the slowest add_episode engine time during the repack.",
        ],
    }
    sizes = [r["facts"] for r in results]
    plots = [
        {
            "file": f"{op}_vs_size.png",
            "title": f"PostgreSQL and in-memory: {title} against graph size",
            "x_label": "facts",
            "y_label": "milliseconds",
            "log_x": True,
            "log_y": True,
            "x": sizes,
            "series": {
                f"{backend} {q}": [r[backend][key][unit][q] if backend in r else None for r in results]
                for backend in BACKENDS
                for q in ("p50", "p95")
            },
        }
        for op, title, key, unit in (
            ("search", "Memory.search", "search", "total_ms"),
            ("add", "add_episode engine time", "add_episode", "engine_ms"),
        )
    ]
    # Issue 16: PostgreSQL hybrid search p95 under 10 ms at 100k facts and under 25 ms at 1M.
    measured = {r["facts"]: r["postgres"]["search"]["total_ms"]["p95"] for r in results}
    targets = [
        render.target(f"PostgreSQL hybrid search p95 < {limit:.0f} ms at {n:,} facts", measured.get(n), limit, "ms")
        for n, limit in ((100_000, 10.0), (1_000_000, 25.0))
    ]
    return {"tables": [table], "plots": plots, "targets": targets}


def print_report(results: list[dict[str, Any]]) -> None:
    print()
    head = ("N facts", "backend", "load s", "add p50", "add p95", "search p50", "search p95", "client RSS MB")
    print(" ".join(f"{h:>{w}}" for h, w in zip(head, (9, 9, 8, 9, 9, 11, 11, 12), strict=True)))
    for r in results:
        for backend in (b for b in BACKENDS if b in r):
            b = r[backend]
            add, search = b["add_episode"]["engine_ms"], b["search"]["total_ms"]
            print(
                f"{r['facts']:>9,} {backend:>9} {b['load_s']:>8.1f} {add['p50']:>9.2f} {add['p95']:>9.2f} "
                f"{search['p50']:>11.2f} {search['p95']:>11.2f} {b['rss_mb']['store']:>12,.0f}"
            )
    print("(milliseconds; add = add_episode engine time, search = Memory.search total incl. query embedding)")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000", help="graph sizes in facts, comma-separated")
    parser.add_argument("--episodes", type=int, default=100, help="measured add_episode calls per size and backend")
    parser.add_argument("--queries", type=int, default=200, help="measured searches per size and backend")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured iterations before each measurement")
    parser.add_argument(
        "--memory-up-to", type=int, default=None, help="run the in-memory backend only at sizes up to this many facts"
    )
    parser.add_argument(
        "--build-memory-mb",
        type=int,
        default=1024,
        help="PostgresStore(build_memory_mb=...): the server's memory for index builds in load (4096 for 1M facts)",
    )
    parser.add_argument("--dsn", default=None, help="your PostgreSQL (default: an embedded server)")
    parser.add_argument(
        "--server-setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help=f"a setting of the embedded server, over {POSTGRES_SETTINGS} (repeatable)",
    )
    parser.add_argument("--keep", dest="drop", action="store_false", help="keep the benchmark schemas")
    parser.add_argument("--quick", action="store_true", help="smoke: 2000 facts, 20 episodes, 20 queries")
    parser.add_argument("--out", default=str(core.OUT_DIR / "postgres.json"), help="where the JSON results go")
    args = parser.parse_args(argv)
    args.settings = server_settings(args.server_setting)
    if args.quick:
        args.sizes, args.episodes, args.queries = "2000", 20, 20
    try:
        args.sizes = sorted({int(s.replace("_", "")) for s in str(args.sizes).split(",") if s.strip()})
    except ValueError:
        parser.error("--sizes takes comma-separated integers, e.g. 10000,100000")
    if not args.sizes or min(args.sizes) < 10 or args.episodes < 1 or args.queries < 1 or args.warmup < 0:
        parser.error("--sizes need at least 10 facts, --episodes and --queries at least 1, --warmup >= 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    info = core.machine()
    print(f"tkg {info['tkg']} PostgreSQL benchmark -- {started_at}")
    print(f"machine: {info['cpu_count']} CPUs, {info['processor']}, Python {info['python']}, {info['platform']}")
    print(f"CPU busy with other processes at start: {info['others_cpu_busy_at_start']}; load {info['load_average']}")
    server = None if args.dsn else EmbeddedPostgres(settings=args.settings)
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
    payload = {
        **render.header("postgres", args, info, started_at, started),
        **contract(results, args),
        "benchmark": "postgres",
        "results": results,
    }
    out.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
