#!/usr/bin/env python
"""Scale curves of tkg alone on the in-memory backend: 10k, 100k and 1M facts with 384-d hash embeddings.

For each size N (facts) two fresh subprocesses run, so that sizes do not contaminate each other's memory:

1. *build*: the base graph of bench_core (``build_records``: N facts, ~N/3 entities, one message episode per 3
   facts, mentions; every fact, entity and episode carries a 384-d vector) bulk-loaded with
   ``InMemoryStore.load``; resident memory after the build (RSS minus the RSS right after the imports);
   ``Memory.add_facts`` (structured, no LLM) and ``Memory.add_episode`` with ``RulesLLM`` latency (engine time:
   wall time minus the time inside the embedder and the LLM double); ``Memory.search`` latency; ``Memory.save``.
2. *load*: ``Memory.load`` of that snapshot in a fresh process (time, resident memory, which indexes were loaded
   rather than rebuilt), then the same searches again.

    python benchmarks/bench_scale.py                      # 10k, 100k, 1M (needs ~15 GB of RAM and ~30 min)
    python benchmarks/bench_scale.py --quick              # CI smoke: 2k and 10k facts (under a minute)
    python benchmarks/bench_scale.py --sizes 10000,100000 --threads 2
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_core
import render

import tkg
from tkg.backends.memory import InMemoryStore
from tkg.backends.memory.precision import PRECISIONS
from tkg.llm.rules import RulesLLM
from tkg.models import Fact
from tkg.timeline import make_scope

NAME = "scale"
DIM = bench_core.DIM
GROUP = bench_core.GROUP
TARGET_SEARCH_MS = 10.0
TARGET_KB_PER_FACT = 3.0
TARGET_SNAPSHOT_S = 30.0
TARGET_SIZE = 1_000_000
EMBEDDERS = {"hash": "HashEmbedder", "minilm": "MiniLMEmbedder"}
DEFAULT_EF: int = inspect.signature(InMemoryStore).parameters["ef_search"].default


def rss_bytes() -> int:
    """Current resident set size of this process (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


class TimedRulesLLM(RulesLLM):
    """RulesLLM that adds up the time spent inside it, so engine time can exclude the LLM double."""

    seconds = 0.0

    def generate(self, prompt: Any, response_model: Any) -> Any:
        start = time.perf_counter()
        try:
            return super().generate(prompt, response_model)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls.clear()  # do not keep every prompt through the run


def make_embedder(args: argparse.Namespace) -> tkg.Embedder:
    """The run's embedder: ``HashEmbedder(dim=384)`` (the default, no model), or the MiniLM model of the ``embed``
    extra (384-d; ~250 texts a second on this project's 2-core machines, so 100k facts take ~10 minutes)."""
    if args.embedder == "minilm":
        from tkg.embedders.onnx import MiniLMEmbedder

        return MiniLMEmbedder(threads=2)
    return tkg.HashEmbedder(dim=DIM)


def _ms(values: Sequence[float]) -> dict[str, float]:
    return bench_core.summarise(values)


def _fact_inputs(rng: random.Random, vocab: bench_core.Vocabulary, count: int) -> list[list[tkg.FactInput]]:
    """Batches of 3 structured facts about known people, organisations and places (some new names)."""
    relations = [("WORKS_AT", "orgs"), ("LIVES_IN", "places"), ("KNOWS", "people"), ("VISITED", "places")]
    batches = []
    for _ in range(count):
        batch = []
        for _ in range(3):
            relation, pool = rng.choice(relations)
            subject = bench_core._person(rng, vocab)
            obj = rng.choice(getattr(vocab, pool))
            if obj == subject:
                obj = rng.choice(vocab.places)
            batch.append(tkg.FactInput(subject, relation, obj))
        batches.append(batch)
    return batches


def _search(
    memory: tkg.Memory,
    queries: Sequence[str],
    warmup: int,
    embedder: bench_core.TimedEmbedder,
    times_asked: Sequence[dict[str, datetime]] | None = None,
) -> dict[str, Any]:
    """Memory.search latency after ``warmup`` unmeasured queries (:func:`bench_core.run_searches`), under this
    benchmark's keys: wall time (``ms``) and engine time (``engine_ms``: minus the time inside ``embedder``, the
    memory's embedder). ``times_asked``: each query's ``as_of`` / ``known_at`` arguments (default: none, now)."""
    asked = list(times_asked) if times_asked is not None else [{} for _ in queries]
    bench_core.run_searches(memory, embedder, queries[:warmup], asked[:warmup])
    timed = bench_core.run_searches(memory, embedder, queries[warmup:], asked[warmup:])
    return {
        "ms": timed["total_ms"],
        "engine_ms": timed["excluding_embed_ms"],
        "results_per_query": timed["results_per_query"],
    }


# ----------------------------------------------------------------------------------------------------------
# workers (one fresh process each)
def worker_build(n_facts: int, args: argparse.Namespace, snapshot: Path) -> dict[str, Any]:
    gc.collect()
    baseline = rss_bytes()
    rng = random.Random(bench_core.SEED)
    result: dict[str, Any] = {"facts": n_facts, "baseline_rss_mb": baseline / 2**20}
    t0 = time.perf_counter()
    records, vocab, timings = bench_core.build_records(n_facts, rng, make_embedder(args))
    t1 = time.perf_counter()
    store = InMemoryStore(dim=DIM, threads=args.threads, vector_precision=args.vector_precision)
    store.load(records)
    load_s = time.perf_counter() - t1
    # Recall against exact search over the vectors as embedded (a bfloat16 store holds them rounded).
    originals = {r.id: r.embedding for r in records if isinstance(r, Fact) and r.embedding is not None}
    result["recall_after_build"] = _recall(store, vocab, args, lambda fact, held=originals: held[fact.id])
    del records, originals
    gc.collect()
    resident = rss_bytes() - baseline
    result["build"] = {
        "records_s": t1 - t0,
        "store_load_s": load_s,
        "total_s": time.perf_counter() - t0,
        "counts": timings["counts"],
    }
    result["rss_mb"] = resident / 2**20
    result["kb_per_fact"] = resident / n_facts / 1000
    result["breakdown_mb"] = {k: v / 2**20 for k, v in store.memory_breakdown().items()}
    result["breakdown_mb"]["records_and_maps (rest of RSS)"] = (
        resident - sum(store.memory_breakdown().values())
    ) / 2**20

    embedder = bench_core.TimedEmbedder(make_embedder(args))
    llm = TimedRulesLLM()
    clock = tkg.FixedClock(bench_core.CLOCK_START, tick=timedelta(seconds=1))
    memory = tkg.Memory(store, embedder=embedder, llm=llm, clock=clock)

    # add_facts: structured, no LLM
    batches = _fact_inputs(rng, vocab, args.warmup + args.adds)
    engine = []
    for i, batch in enumerate(batches):
        embedder.seconds = 0.0
        start = time.perf_counter()
        memory.add_facts(batch, group_id=GROUP)
        elapsed = time.perf_counter() - start - embedder.seconds
        if i >= args.warmup:
            engine.append(elapsed)
    result["add_facts_ms"] = _ms(engine)

    # add_episode with the rules LLM
    texts = bench_core.episode_texts(rng, vocab, args.warmup + args.adds)
    engine = []
    for i, text in enumerate(texts):
        embedder.seconds = llm.seconds = 0.0
        start = time.perf_counter()
        memory.add_episode(text, group_id=GROUP)
        elapsed = time.perf_counter() - start - embedder.seconds - llm.seconds
        if i >= args.warmup:
            engine.append(elapsed)
    result["add_episode_ms"] = _ms(engine)

    queries = bench_core.query_texts(random.Random(bench_core.SEED + 1), vocab, args.warmup + args.queries)
    gc.collect()
    result["search"] = _search(memory, queries, args.warmup, embedder)
    if args.profile and result["search"]["ms"]["p95"] >= TARGET_SEARCH_MS:
        result["search_profile"] = bench_core.profile(
            f"search at N={n_facts:,}",
            lambda: [memory.search(q, group_ids=[GROUP], limit=10) for q in queries[args.warmup :]],
            args.queries,
        )

    gc.collect()
    start = time.perf_counter()
    result["file_bytes"] = memory.save(snapshot)
    result["save_s"] = time.perf_counter() - start
    result["facts_stored"] = store.count(tkg.Kind.FACT)
    return result


def _recall(
    store: InMemoryStore, vocab: bench_core.Vocabulary, args: argparse.Namespace, truth: bench_core.VectorOf
) -> dict[str, Any]:
    """recall@10 of the store's fact cosine search against exact search with ``truth``'s vectors (the queries of
    :func:`worker_load`'s recall)."""
    queries = bench_core.query_texts(random.Random(bench_core.SEED + 1), vocab, args.warmup + args.queries)
    vectors = make_embedder(args).embed(queries[args.warmup :][: bench_core.RECALL_QUERIES])
    scope = make_scope(datetime.now(UTC), [GROUP])
    cuts = bench_core.exact_cuts(store, vectors, scope, bench_core.RECALL_K, truth)
    return bench_core.fact_recall(store, vectors, cuts, scope, bench_core.RECALL_K, truth)


def worker_load(n_facts: int, args: argparse.Namespace, snapshot: Path) -> dict[str, Any]:
    gc.collect()
    baseline = rss_bytes()
    start = time.perf_counter()
    loaded = InMemoryStore(dim=DIM, vector_precision=args.vector_precision)
    embedder = bench_core.TimedEmbedder(make_embedder(args))
    memory = tkg.Memory.load(snapshot, embedder=embedder, store=loaded)
    load_s = time.perf_counter() - start
    gc.collect()
    resident = rss_bytes() - baseline
    facts = loaded.count(tkg.Kind.FACT)
    vocab = bench_core.make_vocabulary(random.Random(bench_core.SEED), max(30, n_facts // 3))
    queries = bench_core.query_texts(random.Random(bench_core.SEED + 1), vocab, args.warmup + args.queries)
    out = {
        "load_s": load_s,
        "rss_mb": resident / 2**20,
        "kb_per_fact": resident / facts / 1000,
        "restored": loaded.stats().get("restored", {}),
        "search": _search(memory, queries, args.warmup, embedder),
    }
    # The same queries at past times (bench_core.PAST_TIMES).
    for name, asked in bench_core.past_times(len(queries)).items():
        out[name] = _search(memory, queries, args.warmup, embedder, asked)
    if args.profile and out["search"]["ms"]["p95"] >= TARGET_SEARCH_MS:
        out["search_profile"] = bench_core.profile(
            f"search after a load at N={n_facts:,}",
            lambda: [memory.search(q, group_ids=[GROUP], limit=10) for q in queries[args.warmup :]],
            args.queries,
        )
    # Recall of the fact cosine search and search latency at each ef_search: the default's store is the one just
    # loaded; every other is loaded afresh from the snapshot (one at a time: a 1M store is ~10 GB).
    vectors = embedder.embed(queries[args.warmup :][: bench_core.RECALL_QUERIES])
    scope = make_scope(datetime.now(UTC), [GROUP])
    cuts = bench_core.exact_cuts(loaded, vectors, scope, bench_core.RECALL_K)
    out["by_ef"] = {}
    for ef in sorted({DEFAULT_EF, *args.ef}, key=lambda ef: (ef != DEFAULT_EF, ef)):
        if ef != DEFAULT_EF:
            del memory, loaded
            gc.collect()
            loaded = InMemoryStore(dim=DIM, ef_search=ef, vector_precision=args.vector_precision)
            memory = tkg.Memory.load(snapshot, embedder=embedder, store=loaded)
        out["by_ef"][str(ef)] = {
            "recall": bench_core.fact_recall(loaded, vectors, cuts, scope, bench_core.RECALL_K),
            "search": out["search"] if ef == DEFAULT_EF else _search(memory, queries, args.warmup, embedder),
        }
    if args.profile and load_s >= TARGET_SNAPSHOT_S:
        import cProfile
        import io
        import pstats

        del memory, loaded
        gc.collect()
        profiler = cProfile.Profile()
        profiler.enable()
        tkg.Memory.load(snapshot, embedder=embedder)
        profiler.disable()
        stream = io.StringIO()
        pstats.Stats(profiler, stream=stream).sort_stats("cumulative").print_stats(25)
        out["load_profile"] = stream.getvalue()
    return out


def run_worker(kind: str, n_facts: int, args: argparse.Namespace, snapshot: Path) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = Path(tmp.name)
    command = [
        sys.executable,
        __file__,
        "--worker",
        kind,
        "--sizes",
        str(n_facts),
        "--snapshot",
        str(snapshot),
        "--worker-out",
        str(out),
        "--threads",
        str(args.threads),
        "--queries",
        str(args.queries),
        "--adds",
        str(args.adds),
        "--warmup",
        str(args.warmup),
        "--ef",
        ",".join(map(str, args.ef)),
        "--embedder",
        args.embedder,
        "--vector-precision",
        args.vector_precision,
        *(["--profile"] if args.profile else []),
    ]
    try:
        subprocess.run(command, check=True)
        return json.loads(out.read_text())  # type: ignore[no-any-return]
    finally:
        out.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------------------
# report
def _r(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(float(value), digits)


def _p50_p95(ms: dict[str, float] | None) -> str | None:
    return None if ms is None else f"{ms['p50']:.2f} / {ms['p95']:.2f}"


def build_payload(runs: list[dict[str, Any]], args: argparse.Namespace, started: str, seconds: float) -> dict:
    first = args.precisions[0]
    results = [r for r in runs if r.get("precision", "float32") == first]
    sizes = [r["facts"] for r in results]
    columns = ["metric", *[f"{n:,} facts" for n in sizes]]

    def row(label: str, values: list[Any]) -> list[Any]:
        return [label, *values]

    rows = [
        row(
            "entities / episodes / mentions",
            [
                f"{r['build']['counts']['entities']:,} / {r['build']['counts']['episodes']:,} / "
                f"{r['build']['counts']['mentions']:,}"
                for r in results
            ],
        ),
        row("build s (records + store.load)", [_r(r["build"]["total_s"], 1) for r in results]),
        row("add_facts engine ms p50", [_r(r["add_facts_ms"]["p50"]) for r in results]),
        row("add_facts engine ms p95", [_r(r["add_facts_ms"]["p95"]) for r in results]),
        row("add_episode engine ms p50", [_r(r["add_episode_ms"]["p50"]) for r in results]),
        row("add_episode engine ms p95", [_r(r["add_episode_ms"]["p95"]) for r in results]),
        row("search ms p50", [_r(r["search"]["ms"]["p50"]) for r in results]),
        row("search ms p95", [_r(r["search"]["ms"]["p95"]) for r in results]),
        row("search ms p95 after load", [_r(r["loaded"]["search"]["ms"]["p95"]) for r in results]),
        row(
            "search ms p50 / p95 as of a past time, after load",
            [_p50_p95(r["loaded"].get("search_as_of", {}).get("ms")) for r in results],
        ),
        row(
            "search ms p50 / p95 known at a past time, after load",
            [_p50_p95(r["loaded"].get("search_known_at", {}).get("ms")) for r in results],
        ),
        row(
            f"fact cosine recall@10 against exact (ef_search {DEFAULT_EF})",
            [_r(r["loaded"]["by_ef"][str(DEFAULT_EF)]["recall"]["recall"], 3) for r in results],
        ),
        row("RSS MB after build", [_r(r["rss_mb"], 0) for r in results]),
        row("RSS MB after load", [_r(r["loaded"]["rss_mb"], 0) for r in results]),
        row(
            "KB per fact (build / load)",
            [f"{r['kb_per_fact']:.2f} / {r['loaded']['kb_per_fact']:.2f}" for r in results],
        ),
        row("snapshot save s", [_r(r["save_s"]) for r in results]),
        row("snapshot load s", [_r(r["loaded"]["load_s"]) for r in results]),
        row("snapshot file MB", [_r(r["file_bytes"] / 2**20, 0) for r in results]),
        row(
            "indexes restored",
            [
                "loaded"
                if all(
                    v == "loaded" for part in ("graphs", "text") for v in r["loaded"]["restored"].get(part, {}).values()
                )
                else "rebuilt"
                for r in results
            ],
        ),
    ]
    efs = sorted({int(ef) for r in results for ef in r["loaded"]["by_ef"]})

    def by_ef(ef: int, show: Callable[[dict[str, Any]], Any]) -> list[Any]:
        return [show(r["loaded"]["by_ef"][str(ef)]) if str(ef) in r["loaded"]["by_ef"] else None for r in results]

    ef_rows = []
    for ef in efs:
        ef_rows += [
            row(f"ef_search {ef}: fact cosine recall@10", by_ef(ef, lambda e: _r(e["recall"]["recall"], 3))),
            row(f"ef_search {ef}: fact cosine search ms p50 / p95", by_ef(ef, lambda e: _p50_p95(e["recall"]["ms"]))),
            row(
                f"ef_search {ef}: hybrid search engine ms p50 / p95",
                by_ef(ef, lambda e: _p50_p95(e["search"]["engine_ms"])),
            ),
        ]
    breakdown_keys = list(results[0]["breakdown_mb"])
    breakdown_rows = [
        row(key, [_r(r["breakdown_mb"][key] * 2**20 / r["facts"] / 1000, 3) for r in results]) for key in breakdown_keys
    ]
    notes = [
        "Graph: bench_core's base graph -- per fact 1/3 entity and 1/3 message episode, each with a 384-d vector, so "
        "1.67 vectors per fact.",
        f"Engine ms = wall time minus time inside {EMBEDDERS[args.embedder]} and RulesLLM. Search = Memory.search, "
        "hybrid, limit 10, query embedding included. As of / known at a past time: the same queries, each with a "
        "random as_of in the facts' event span (2015 to the benchmark's now) or a random known_at in the span "
        "their records were created over (the view of what the memory had recorded by then).",
        f"Recall: {bench_core.RECALL_QUERIES} of the queries, the store's cosine search over facts (k 10, the "
        "group's current facts) against exact cosine over all of them; a returned fact counts when its exact score "
        "reaches the 10th best.",
        "RSS = resident set after the build / after Memory.load, minus the RSS of the same fresh process after its "
        "imports; each size runs in its own processes.",
    ]
    largest = results[-1]
    at_target = largest if largest["facts"] >= TARGET_SIZE else None
    precision_tables, precision_targets = _precision_comparison(runs, results, columns)
    targets = [
        render.target(
            "search p95 at 1M facts < 10 ms",
            None
            if at_target is None
            else max(at_target["search"]["ms"]["p95"], at_target["loaded"]["search"]["ms"]["p95"]),
            TARGET_SEARCH_MS,
            "ms",
        ),
        render.target(
            "resident memory per fact < 3 KB (384-d)",
            None if at_target is None else max(at_target["kb_per_fact"], at_target["loaded"]["kb_per_fact"]),
            TARGET_KB_PER_FACT,
            "KB",
        ),
        render.target(
            "snapshot save of 1M facts < 30 s",
            None if at_target is None else at_target["save_s"],
            TARGET_SNAPSHOT_S,
            "s",
        ),
        render.target(
            "snapshot load of 1M facts < 30 s",
            None if at_target is None else at_target["loaded"]["load_s"],
            TARGET_SNAPSHOT_S,
            "s",
        ),
        *precision_targets,
    ]
    return {
        "bench": NAME,
        "command": render.command_line(),
        "machine": bench_core.machine(),
        "args": render.plain_args(args, leave_out=["worker", "worker_out"]),
        "started": started,
        "seconds": seconds,
        "tables": [
            {
                "title": f"tkg in-memory backend at scale ({EMBEDDERS[args.embedder]} dim 384)",
                "columns": columns,
                "rows": rows,
                "notes": notes,
            },
            {
                "title": "search quality and latency against HNSW ef_search (after a load)",
                "columns": columns,
                "rows": ef_rows,
                "notes": [
                    f"Each ef_search: the snapshot loaded into InMemoryStore(ef_search=...) (ef_search {DEFAULT_EF} is "
                    "the default and the store of the table above). Recall as above; fact cosine search = the "
                    "store's vector_search over facts, k 10, per call; hybrid search engine ms = Memory.search as "
                    "above minus the time inside the embedder (the query's vector).",
                    "HashEmbedder vectors of templated facts are a hard case for HNSW (hashed words: many facts "
                    "share most of their words, so near-equal distances); see benchmarks/README.md for MiniLM "
                    "vectors.",
                ],
            },
            {
                "title": "resident memory per fact by part, KB (after build)",
                "columns": columns,
                "rows": breakdown_rows,
                "notes": [
                    f"vectors: the records' {first} arrays, held once; hnsw_graph: hnswlib's own copy of each unit "
                    "vector (float32) plus its links; bm25: bm25s arrays; columns: numpy filter columns; the rest of "
                    "RSS is records (Python objects) and the id / adjacency / mention maps."
                ],
            },
            *precision_tables,
        ],
        "plots": [
            {
                "file": "scale_search.png",
                "title": "search latency vs graph size",
                "x_label": "facts",
                "y_label": "ms",
                "log_x": True,
                "log_y": False,
                "x": sizes,
                "series": {
                    "search p50": [r["search"]["ms"]["p50"] for r in results],
                    "search p95": [r["search"]["ms"]["p95"] for r in results],
                },
            },
            {
                "file": "scale_memory.png",
                "title": "resident memory per fact",
                "x_label": "facts",
                "y_label": "KB / fact",
                "log_x": True,
                "log_y": False,
                "x": sizes,
                "series": {
                    "after build": [r["kb_per_fact"] for r in results],
                    "after load": [r["loaded"]["kb_per_fact"] for r in results],
                },
            },
            {
                "file": "scale_snapshot.png",
                "title": "snapshot save / load time",
                "x_label": "facts",
                "y_label": "s",
                "log_x": True,
                "log_y": False,
                "x": sizes,
                "series": {"save": [r["save_s"] for r in results], "load": [r["loaded"]["load_s"] for r in results]},
            },
        ],
        "targets": targets,
        "sizes": runs,
    }


def _precision_comparison(
    runs: list[dict[str, Any]], results: list[dict[str, Any]], columns: list[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A table per other vector precision beside the first (``results``), and its targets."""
    base = results[0].get("precision", "float32") if results else "float32"
    tables, targets = [], []
    for precision in sorted({r.get("precision", "float32") for r in runs} - {base}):
        other = {r["facts"]: r for r in runs if r.get("precision") == precision}
        pairs = [(r, other.get(r["facts"])) for r in results]

        def both(show: Callable[[dict[str, Any]], str], pairs: list[Any] = pairs) -> list[str | None]:
            return [None if o is None else f"{show(r)} / {show(o)}" for r, o in pairs]

        def vectors_kb(r: dict[str, Any]) -> str:
            return f"{r['breakdown_mb']['vectors'] * 2**20 / r['facts'] / 1000:.2f}"

        rows = [
            ["KB per fact after build", *both(lambda r: f"{r['kb_per_fact']:.2f}")],
            ["KB per fact after load", *both(lambda r: f"{r['loaded']['kb_per_fact']:.2f}")],
            ["of which the store's vectors, KB per fact", *both(vectors_kb)],
            [
                "fact cosine recall@10 against exact over the vectors as embedded (after build)",
                *both(lambda r: f"{r['recall_after_build']['recall']:.3f}"),
            ],
            ["search ms p50", *both(lambda r: f"{r['search']['ms']['p50']:.2f}")],
            ["search ms p95", *both(lambda r: f"{r['search']['ms']['p95']:.2f}")],
            ["add_episode engine ms p50", *both(lambda r: f"{r['add_episode_ms']['p50']:.2f}")],
            ["snapshot load s", *both(lambda r: f"{r['loaded']['load_s']:.2f}")],
        ]
        tables.append(
            {
                "title": f'vectors kept at {precision} (InMemoryStore(vector_precision="{precision}")) beside {base}',
                "columns": columns,
                "rows": rows,
                "notes": [
                    f"Each cell: {base} / {precision}, the same graph built and loaded in fresh processes of the same "
                    "run (sizes and precisions alternate).",
                    "Recall here: right after the bulk load, the store's fact cosine search (k 10, ef_search "
                    f"{DEFAULT_EF}) against exact cosine over the facts' vectors as the embedder gave them (a "
                    f"{precision} store holds them rounded); a returned fact counts when that exact score reaches the "
                    "10th best.",
                    "hnswlib keeps its own float32 copy of each unit vector whatever the precision.",
                ],
            }
        )
        # the largest size's pair, if it reaches the targets' size
        ours, top = pairs[-1] if pairs and pairs[-1][0]["facts"] >= TARGET_SIZE else (None, None)
        targets.append(
            render.target(
                f"resident memory per fact < 3 KB (384-d, {precision} vectors)",
                None if top is None else max(top["kb_per_fact"], top["loaded"]["kb_per_fact"]),
                TARGET_KB_PER_FACT,
                "KB",
            )
        )
        loss = None
        if ours is not None and top is not None:
            loss = ours["recall_after_build"]["recall"] - top["recall_after_build"]["recall"]
        targets.append(
            render.target(
                f"{precision} vectors: fact cosine recall@10 at 1M facts at most 0.01 below {base}'s",
                loss,
                0.01,
                "",
                strict=False,
            )
        )
    return tables, targets


def _snapshot_name(n_facts: int, precision: str) -> str:
    """scale-N.tkg (float32 vectors) or scale-N-<precision>.tkg."""
    return f"scale-{n_facts}{'' if precision == 'float32' else '-' + precision}.tkg"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000,1000000", help="comma-separated fact counts")
    parser.add_argument("--quick", action="store_true", help="CI smoke: 2,000 and 10,000 facts, fewer queries")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--adds", type=int, default=100, help="add_facts calls and add_episode calls measured")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="InMemoryStore(threads=...) for the HNSW build")
    parser.add_argument(
        "--ef", default="64,128,256", help="comma-separated HNSW ef_search values whose recall and latency are measured"
    )
    parser.add_argument(
        "--embedder",
        choices=sorted(EMBEDDERS),
        default="hash",
        help="vectors of every record and query: hash (HashEmbedder, the default) or minilm (tkg's MiniLM model)",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile search / load where a target is missed")
    parser.add_argument(
        "--keep-snapshots",
        metavar="DIR",
        help="write each size's snapshot to DIR/scale-N.tkg and keep it (to profile loads without a rebuild: "
        "python benchmarks/bench_scale.py --load-only DIR --sizes N)",
    )
    parser.add_argument(
        "--load-only", metavar="DIR", help="skip the builds; load and search DIR/scale-N.tkg kept by --keep-snapshots"
    )
    parser.add_argument(
        "--precisions",
        default="float32,bfloat16",
        help="comma-separated InMemoryStore(vector_precision=...) values, each size run at each; the main tables "
        "show the first, a table compares the others with it",
    )
    parser.add_argument("--out", default=str(bench_core.OUT_DIR / f"{NAME}.json"))
    parser.add_argument("--worker", choices=["build", "load"], help=argparse.SUPPRESS)
    parser.add_argument("--vector-precision", default="float32", choices=sorted(PRECISIONS), help=argparse.SUPPRESS)
    parser.add_argument("--snapshot", help=argparse.SUPPRESS)
    parser.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.queries, args.adds = "2000,10000", 50, 30
    args.sizes = sorted(int(s) for s in str(args.sizes).split(","))
    args.ef = sorted(int(ef) for ef in str(args.ef).split(","))
    args.precisions = [p.strip() for p in str(args.precisions).split(",") if p.strip()]
    unknown = sorted(set(args.precisions) - set(PRECISIONS))
    if unknown or not args.precisions:
        parser.error(f"--precisions: each of {sorted(PRECISIONS)}, got {unknown or 'none'}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        work = worker_build if args.worker == "build" else worker_load
        result = work(args.sizes[0], args, Path(args.snapshot))
        Path(args.worker_out).write_text(json.dumps(result))
        return 0
    started = bench_core.datetime.now(bench_core.UTC).isoformat()
    t0 = time.perf_counter()
    results = []
    if args.load_only:
        args.vector_precision = args.precisions[0]
        for n in args.sizes:
            snapshot = Path(args.load_only) / _snapshot_name(n, args.vector_precision)
            print(f"-- {n:,} facts: load {snapshot} ...", flush=True)
            loaded = run_worker("load", n, args, snapshot)
            print(json.dumps({k: v for k, v in loaded.items() if not k.endswith("profile")}, indent=1))
            for key in ("load_profile", "search_profile"):
                if key in loaded:
                    print(loaded[key])
        return 0
    kept = Path(args.keep_snapshots) if args.keep_snapshots else None
    if kept is not None:
        kept.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(
        prefix="tkg-scale-", dir=bench_core.OUT_DIR if bench_core.OUT_DIR.is_dir() else None
    ) as tmp:
        for n in args.sizes:
            for precision in args.precisions:
                args.vector_precision = precision
                snapshot = (kept or Path(tmp)) / _snapshot_name(n, precision)
                print(f"-- {n:,} facts, {precision} vectors: build ...", flush=True)
                result = run_worker("build", n, args, snapshot)
                print(f"-- {n:,} facts, {precision} vectors: load ...", flush=True)
                result["loaded"] = run_worker("load", n, args, snapshot)
                if kept is None:
                    snapshot.unlink(missing_ok=True)
                result["precision"] = precision
                results.append(result)
    payload = build_payload(results, args, started, time.perf_counter() - t0)
    render.print_tables(payload)
    for r in results:
        for key in ("search_profile",):
            if key in r:
                print(r[key])
        if "load_profile" in r["loaded"]:
            print(r["loaded"]["load_profile"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(payload, indent=1, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
