#!/usr/bin/env python
"""The in-memory BM25 index on a corpus with a natural vocabulary: what pruning by the rarest query term saves.

bench_core's graph (and so bench_scale's) is made of names from small pools: at 1M facts its whole vocabulary is
~380 terms, the rarest in ~3,000 documents. A user's memory has a long tail of rare words (names, places,
products) beside common ones. Here documents draw their words from a Zipf-like vocabulary (50,000 words,
frequency ~ 1 / rank^1.1) and each query joins one word of the tail that 10 to 2,000 documents hold with one to
three of the 50 most common words -- "where does Xavier work" -- or, as a control, holds common words only.

Each query is searched twice: with the index's defaults, where a query of several terms first tries to prove its
top 10 from the documents of its rarest term (MaxScore, ``TextIndex._search_pruned``), and with that step off
(every posting merged); each way goes first for half of the queries. The two answers must be identical; the times
are compared per query set. No target: the table shows what the step buys and that it costs nothing where it
cannot decide.

    python benchmarks/bench_text.py            # 300,000 documents, 300 queries per set
    python benchmarks/bench_text.py --quick    # 20,000 documents (CI smoke)
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_core as core
import render
from measure import percentile

from tkg.backends.memory import text as text_module
from tkg.backends.memory.text import TextIndex

ROOT = Path(__file__).resolve().parent
VOCABULARY = 50_000
ZIPF = 1.1
COMMON = 50
RARE_DF = (10, 2_000)
K = 10
SEED = 5


def build(n_docs: int, rng: np.random.Generator) -> tuple[TextIndex, dict[int, str]]:
    """An index of ``n_docs`` documents of 4-16 words each, rebuilt once (all main, no tail)."""
    words = [f"q{i:05d}x" for i in range(VOCABULARY)]  # distinct tokens the stemmer leaves alone
    weights = 1.0 / np.arange(1, VOCABULARY + 1) ** ZIPF
    draws = rng.choice(VOCABULARY, size=n_docs * 16, p=weights / weights.sum())
    lengths = rng.integers(4, 17, size=n_docs)
    texts: dict[int, str] = {}
    at = 0
    for slot, length in enumerate(lengths.tolist()):
        texts[slot] = " ".join(words[w] for w in draws[at : at + length].tolist())
        at += length
    index = TextIndex(lambda: iter(list(texts.items())), min_rebuild=n_docs + 1)
    index.auto_rebuild = False
    for slot, text in texts.items():
        index.set(slot, text)
    index.rebuild()
    return index, texts


def query_sets(texts: dict[int, str], n_queries: int, rng: np.random.Generator) -> dict[str, list[str]]:
    """A tail word with one to three common words; two to four common words (the control)."""
    counts: dict[str, int] = {}
    for text in texts.values():
        for word in set(text.split()):
            counts[word] = counts.get(word, 0) + 1
    common = sorted(counts, key=lambda w: -counts[w])[:COMMON]
    tail = sorted(w for w, c in counts.items() if RARE_DF[0] <= c <= RARE_DF[1])
    if not tail:
        raise SystemExit("no word of the tail in this corpus: use more documents")

    def some_common() -> list[str]:  # one to three
        return [common[i] for i in rng.choice(COMMON, size=int(rng.integers(1, 4)), replace=False)]

    rare_and_common = [" ".join([tail[int(rng.integers(len(tail)))], *some_common()]) for _ in range(n_queries)]
    common_only = [
        " ".join(common[i] for i in rng.choice(COMMON, size=int(rng.integers(2, 5)), replace=False))
        for _ in range(n_queries)
    ]
    return {"a tail word and common words": rare_and_common, "common words only": common_only}


def measure(index: TextIndex, queries: list[str], n_docs: int) -> dict[str, Any]:
    """Each query with pruning (the defaults) and without, alternately; the answers must match."""
    mask = np.ones(n_docs, dtype=np.bool_)
    saved = text_module._PRUNE_COST
    on: list[float] = []
    off: list[float] = []
    pruned = 0
    original = TextIndex._search_pruned

    def counting(self: TextIndex, *args: Any) -> Any:
        nonlocal pruned
        found = original(self, *args)
        pruned += found is not None
        return found

    TextIndex._search_pruned = counting  # type: ignore[method-assign]
    try:
        for query in queries[:5]:  # warm up
            index.search(query, K, mask)
        pruned = 0
        for i, query in enumerate(queries):
            # the second search of a query finds its postings in the CPU's caches (~6% faster): each way goes
            # first for half of the queries
            answers = {}
            for cost in (saved, float("inf")) if i % 2 == 0 else (float("inf"), saved):
                text_module._PRUNE_COST = cost
                t = time.perf_counter()
                answers[cost] = index.search(query, K, mask)
                (on if cost == saved else off).append(time.perf_counter() - t)
            if answers[saved] != answers[float("inf")]:
                raise SystemExit(f"pruning changed the answer to {query!r}")
    finally:
        text_module._PRUNE_COST = saved
        TextIndex._search_pruned = original  # type: ignore[method-assign]

    def ms(values: list[float], q: float) -> float:
        return percentile(values, q) * 1000

    return {
        "queries": len(queries),
        "pruned_share": pruned / len(queries),
        "on_ms": {"p50": ms(on, 50), "p95": ms(on, 95), "mean": float(np.mean(on)) * 1000},
        "off_ms": {"p50": ms(off, 50), "p95": ms(off, 95), "mean": float(np.mean(off)) * 1000},
    }


def contract(n_docs: int, results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    sets = list(results)
    rows = [
        ["queries answered by pruning", *(f"{results[s]['pruned_share']:.0%}" for s in sets)],
        [
            "search ms p50, pruning on / off",
            *(f"{r['on_ms']['p50']:.3f} / {r['off_ms']['p50']:.3f}" for r in map(results.get, sets)),
        ],
        [
            "search ms p95, pruning on / off",
            *(f"{r['on_ms']['p95']:.3f} / {r['off_ms']['p95']:.3f}" for r in map(results.get, sets)),
        ],
        [
            "speedup of the mean (off / on)",
            *(round(r["off_ms"]["mean"] / r["on_ms"]["mean"], 2) for r in map(results.get, sets)),
        ],
    ]
    table = {
        "title": f"BM25 top {K} over {n_docs:,} documents of a Zipf vocabulary: pruning by the rarest term on / off",
        "columns": ["metric", *sets],
        "rows": rows,
        "notes": [
            f"{VOCABULARY:,} words, frequency ~ 1 / rank^{ZIPF}, 4-16 words a document; a tail word is held by "
            f"{RARE_DF[0]:,}-{RARE_DF[1]:,} documents, common words are the {COMMON} most frequent.",
            "TextIndex.search alone (the in-memory backend's BM25, no mask); each query both ways, each way first for "
            "half of the queries (a second search finds the postings in the CPU's caches); answers identical "
            "(checked).",
        ],
    }
    return {"tables": [table], "plots": [], "targets": []}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=300_000)
    parser.add_argument("--queries", type=int, default=300)
    parser.add_argument("--quick", action="store_true", help="20,000 documents, 100 queries per set")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "text.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.docs, args.queries = 20_000, 100
    started = time.perf_counter()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    info = core.machine()
    rng = np.random.default_rng(SEED)
    t = time.perf_counter()
    index, texts = build(args.docs, rng)
    print(f"-- {args.docs:,} documents indexed in {time.perf_counter() - t:.1f} s", flush=True)
    results = {}
    for name, queries in query_sets(texts, args.queries, rng).items():
        results[name] = measure(index, queries, args.docs)
        r = results[name]
        print(
            f"   {name}: pruned {r['pruned_share']:.0%}; p50 {r['on_ms']['p50']:.3f} / {r['off_ms']['p50']:.3f} ms, "
            f"mean {r['on_ms']['mean']:.3f} / {r['off_ms']['mean']:.3f} ms (on / off)",
            flush=True,
        )
    payload = {
        **render.header("text", args, info, started_at, started),
        **contract(args.docs, results),
        "results": results,
    }
    render.write_result(args.out, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
