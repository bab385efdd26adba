#!/usr/bin/env python
"""Community tier benchmark: full detection, refresh, incremental extension and drift, on the in-memory backend.

For each size N (entities) it builds a graph with planted communities -- N entities in blocks of ``--block``,
``--facts-per-entity`` x N facts, a share ``--intra`` of them inside a block, ~10% of all facts ended (they weigh
nothing) -- bulk-loads it into an ``InMemoryStore`` and measures:

1. reading the weighted entity graph through the Store interface (``read_entity_graph``);
2. label propagation alone (sweeps, convergence, communities found, NMI against the planted blocks), and the
   seed-to-seed variation of the result (``1 - NMI`` between two seeds: the noise floor of the drift measure);
3. a full ``CommunityTier.refresh`` with no LLM (names and summaries built from members, HashEmbedder vectors,
   one write), then a refresh of the unchanged graph (which must write nothing);
4. ``--additions`` new entities, one at a time, each with ``--facts-per-entity`` facts mostly into one block:
   ``CommunityTier.extend`` time per entity (p50/p95/mean/max) and the write of entity + facts + community update;
5. the drift after those additions (``CommunityTier.drift``: ``1 - NMI`` against a full run), and how many
   communities a refresh then re-summarises: warm (re-converging from the stored communities; planned, not
   written) and full (from singletons; written).

Everything is seeded; two runs do the same work.

    python benchmarks/bench_communities.py                  # sizes 10000,100000; 1000 additions
    python benchmarks/bench_communities.py --quick          # CI smoke: 2000 entities, 200 additions

Results are printed as a table and written to ``benchmarks/out/communities.json``.
"""

from __future__ import annotations

import argparse
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
import render
from measure import summarise_ms

from tkg.backends.memory import InMemoryStore
from tkg.clock import FixedClock
from tkg.communities import label_propagation, normalized_mutual_information, partition_distance
from tkg.community_tier import CommunityTier, read_entity_graph
from tkg.config import CommunityConfig
from tkg.embedders import HashEmbedder
from tkg.models import Entity, Fact, Record
from tkg.storage import WriteBatch
from tkg.timeline import make_scope

OUT_DIR = Path(__file__).resolve().parent / "out"
GROUP = "bench"
DIM = 384
T0 = datetime(2024, 1, 1, tzinfo=UTC)
NOW = datetime(2024, 6, 1, tzinfo=UTC)
ENDED_SHARE = 0.10
FIRST = "Alice Bob Carol David Erin Frank Grace Heidi Ivan Judy Karl Laura Nina Oscar Rita Victor Wendy Zoe".split()
LAST = "Smith Chen Garcia Rossi Nguyen Okafor Silva Tanaka Novak Kim Dubois Patel Costa Jensen Sato Weber".split()


def entity_name(i: int) -> str:
    return f"{FIRST[i % len(FIRST)]} {LAST[(i // len(FIRST)) % len(LAST)]} {i}"


def _partner(rng: random.Random, n: int, block: int, source: int, intra: float) -> int:
    if rng.random() < intra:
        start = (source // block) * block
        return start + rng.randrange(min(block, n - start))
    return rng.randrange(n)


def build_records(n: int, args: argparse.Namespace, rng: random.Random) -> list[Record]:
    entities = [Entity(id=f"e{i:07d}", group_id=GROUP, name=entity_name(i), created_at=T0) for i in range(n)]
    records: list[Record] = list(entities)
    for k in range(round(args.facts_per_entity * n)):
        a = k % n
        b = _partner(rng, n, args.block, a, args.intra)
        ended = rng.random() < ENDED_SHARE
        records.append(
            Fact(
                id=f"f{k:08d}",
                group_id=GROUP,
                source_id=entities[a].id,
                target_id=entities[b].id,
                relation="RELATES_TO",
                fact=f"{entities[a].name} relates to {entities[b].name}",
                created_at=T0,
                valid_at=T0,
                invalid_at=T0 + timedelta(days=30) if ended else None,
                expired_at=T0 + timedelta(days=30) if ended else None,
            )
        )
    return records


def summarise(values_s: Sequence[float]) -> dict[str, float]:
    if not values_s:
        return {}
    return {f"{k}_ms": v for k, v in summarise_ms(values_s).items() if k != "n"}


def timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def bench_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(args.seed)
    out: dict[str, Any] = {"entities": n}
    records, out["build_records_s"] = timed(lambda: build_records(n, args, rng))
    out["facts"] = len(records) - n
    store = InMemoryStore(dim=DIM)
    start = time.perf_counter()
    store.load(records)
    out["store_load_s"] = time.perf_counter() - start
    del records

    clock = FixedClock(NOW, tick=timedelta(seconds=1))
    tier = CommunityTier(HashEmbedder(dim=DIM), clock=clock, config=CommunityConfig(seed=args.seed))
    scope = make_scope(NOW, GROUP)
    (graph, _), out["read_graph_s"] = timed(lambda: read_entity_graph(store, GROUP, scope))
    out["graph_edges"] = graph.edge_count
    out["graph_weight"] = graph.total_weight
    result, out["label_propagation_s"] = timed(lambda: label_propagation(graph, seed=args.seed))
    out["iterations"] = result.iterations
    out["converged"] = result.converged
    out["communities_found"] = sum(1 for c in result.communities() if len(c) > 1)
    truth = np.arange(n) // args.block
    out["nmi_vs_planted"] = normalized_mutual_information(result.labels, truth)
    other = label_propagation(graph, seed=args.seed + 1)
    active = graph.degree() > 0
    out["seed_to_seed_distance"] = partition_distance(result.labels[active], other.labels[active])

    report, out["refresh_s"] = timed(lambda: tier.refresh(store, GROUP))
    out["refresh"] = {"communities": report.communities, "members": report.members, "puts": report.puts}
    again, out["refresh_unchanged_s"] = timed(lambda: tier.refresh(store, GROUP))
    out["refresh_unchanged_writes"] = again.puts + again.deletes

    extend_s: list[float] = []
    write_s: list[float] = []
    joined = waiting = 0
    for j in range(args.additions):
        now = clock.now()
        newcomer = Entity(id=f"n{j:06d}", group_id=GROUP, name=f"Newcomer {j}", created_at=now)
        home = rng.randrange(n)
        facts = [
            Fact(
                id=f"nf{j:06d}_{k}",
                group_id=GROUP,
                source_id=newcomer.id,
                target_id=f"e{_partner(rng, n, args.block, home, args.intra):07d}",
                relation="RELATES_TO",
                fact=f"Newcomer {j} relates to someone ({k})",
                created_at=now,
                valid_at=now,
            )
            for k in range(max(1, round(args.facts_per_entity)))
        ]
        start = time.perf_counter()
        update = tier.extend(store, [newcomer], facts, now=now)
        middle = time.perf_counter()
        store.write(WriteBatch(puts=[newcomer, *facts, *update.puts], deletes=update.deletes))
        end = time.perf_counter()
        extend_s.append(middle - start)
        write_s.append(end - middle)
        joined += newcomer.id in update.assigned
        waiting += newcomer.id in update.waiting
    out["extend"] = summarise(extend_s)
    out["extend_write"] = summarise(write_s)
    out["additions"] = {"count": args.additions, "joined": joined, "waiting": waiting}
    out["drift_after_additions"], out["drift_s"] = timed(lambda: tier.drift(store, GROUP))
    out["pending_changes"] = tier.pending_changes(GROUP)
    (_, warm), out["warm_refresh_plan_s"] = timed(lambda: tier.plan_refresh(store, GROUP, warm=True))
    out["warm_refresh_after_additions"] = {
        "communities": warm.communities,
        "created": warm.created,
        "updated": warm.updated,
        "unchanged": warm.unchanged,
        "removed": warm.removed,
        "iterations": warm.iterations,
    }
    after, out["refresh_after_additions_s"] = timed(lambda: tier.refresh(store, GROUP))
    out["refresh_after_additions"] = {
        "communities": after.communities,
        "created": after.created,
        "updated": after.updated,
        "unchanged": after.unchanged,
        "removed": after.removed,
    }
    return out


ROWS: list[tuple[str, str, str]] = [
    ("facts (10% ended)", "facts", "{:,}"),
    ("graph edges (distinct pairs)", "graph_edges", "{:,}"),
    ("store load (setup) s", "store_load_s", "{:.2f}"),
    ("read graph via Store s", "read_graph_s", "{:.3f}"),
    ("label propagation s", "label_propagation_s", "{:.3f}"),
    ("  sweeps / converged", "_sweeps", "{}"),
    ("  communities (2+ members)", "communities_found", "{:,}"),
    ("  NMI vs planted blocks", "nmi_vs_planted", "{:.3f}"),
    ("  seed-to-seed 1-NMI", "seed_to_seed_distance", "{:.4f}"),
    ("full refresh (no LLM) s", "refresh_s", "{:.2f}"),
    ("refresh, unchanged graph s", "refresh_unchanged_s", "{:.2f}"),
    ("  records written", "refresh_unchanged_writes", "{}"),
    ("extend p50 ms", "extend.p50_ms", "{:.3f}"),
    ("extend p95 ms", "extend.p95_ms", "{:.3f}"),
    ("extend mean ms", "extend.mean_ms", "{:.3f}"),
    ("extend max ms", "extend.max_ms", "{:.3f}"),
    ("write (entity+facts+update) p50 ms", "extend_write.p50_ms", "{:.3f}"),
    ("additions joined / waiting", "_joined", "{}"),
    ("drift after additions (1-NMI)", "drift_after_additions", "{:.4f}"),
    ("drift measurement s", "drift_s", "{:.3f}"),
    ("full refresh after additions s", "refresh_after_additions_s", "{:.2f}"),
    ("  re-summarised / unchanged", "_resummarised", "{}"),
    ("warm refresh after additions s", "warm_refresh_plan_s", "{:.2f}"),
    ("  re-summarised / unchanged", "_warm_resummarised", "{}"),
]


def _value(result: dict[str, Any], path: str) -> Any:
    if path == "_sweeps":
        return f"{result['iterations']} / {result['converged']}"
    if path == "_joined":
        return f"{result['additions']['joined']} / {result['additions']['waiting']}"
    if path in ("_resummarised", "_warm_resummarised"):
        r = result["refresh_after_additions" if path == "_resummarised" else "warm_refresh_after_additions"]
        return f"{r['created'] + r['updated']} / {r['unchanged']}"
    value: Any = result
    for part in path.split("."):
        value = value[part]
    return value


def print_report(info: dict[str, Any], results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"tkg {info['tkg']} | Python {info['python']} | {info['platform']} | CPUs {info['cpu_count']}")
    packages = info["packages"]
    print(f"load average {info['load_average']} | numpy {packages['numpy']} igraph {packages['igraph']}")
    print(
        f"planted blocks of {args.block}, {args.facts_per_entity} facts per entity, {args.intra:.0%} inside a "
        f"block; {args.additions} incremental additions; seed {args.seed}\n"
    )
    width = 36
    print(f"{'entities':<{width}}" + "".join(f"{r['entities']:>14,}" for r in results))
    for label, path, fmt in ROWS:
        cells = [fmt.format(_value(r, path)) for r in results]
        print(f"{label:<{width}}" + "".join(f"{c:>14}" for c in cells))


def contract(results: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The suite's ``tables`` / ``plots`` / ``targets`` (benchmarks/README.md) from the per-size results."""
    rows = []
    for label, path, fmt in ROWS:
        # composite cells ("sweeps / converged") are short strings; the rest stay numbers
        cells = [fmt.format(_value(r, path)) if path.startswith("_") else _value(r, path) for r in results]
        rows.append([label.strip(), *cells])
    sizes = [r["entities"] for r in results]
    table = {
        "title": f"Communities: planted blocks of {args.block}, {args.facts_per_entity:g} facts per entity, "
        f"{args.intra:.0%} inside a block, {args.additions:,} incremental additions (no LLM)",
        "columns": ["metric", *(f"{n:,} entities" for n in sizes)],
        "rows": rows,
        "notes": ["NMI: normalised mutual information (1 = identical partitions); drift = 1 - NMI against a full run."],
    }
    plot = {
        "file": "time_vs_entities.png",
        "title": "Community tier: detection and refresh time",
        "x_label": "entities",
        "y_label": "seconds",
        "log_x": True,
        "log_y": True,
        "x": sizes,
        "series": {
            "label propagation": [r["label_propagation_s"] for r in results],
            "full refresh (no LLM)": [r["refresh_s"] for r in results],
            "extend p95 (per entity)": [r["extend"]["p95_ms"] / 1000 for r in results],
        },
    }
    return {"tables": [table], "plots": [plot], "targets": []}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="entity counts, comma-separated")
    parser.add_argument("--additions", type=int, default=1000, help="incremental additions per size")
    parser.add_argument("--block", type=int, default=20, help="planted community size")
    parser.add_argument("--facts-per-entity", type=float, default=3.0)
    parser.add_argument("--intra", type=float, default=0.85, help="share of facts inside a planted block")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="2000 entities, 200 additions (a few seconds)")
    parser.add_argument("--out", type=Path, default=OUT_DIR / "communities.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.additions = "2000", 200
    args.size_list = [int(s) for s in str(args.sizes).split(",") if s.strip()]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    info = core.machine()  # the machine description every benchmark here records
    results = []
    for n in args.size_list:
        print(f"... {n:,} entities", file=sys.stderr, flush=True)
        results.append(bench_size(n, args))
    print_report(info, results, args)
    payload = {
        **render.header("communities", args, info, started_at, started, leave_out=["out"]),
        **contract(results, args),
        "results": results,
    }
    render.write_result(args.out, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
