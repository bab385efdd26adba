#!/usr/bin/env python
"""One long-lived user: engine time per episode while one entity accumulates facts.

The normal case of an agent memory is one group whose user entity takes part in most facts. Every new fact is
checked against the facts that may repeat or contradict it (tkg/invalidation.py), and those are found among the
facts of its two entities, so tkg's own cost per episode can grow with the degree of the user's entity. This
benchmark measures it: one group, messages ``"User: I <RELATION> thing<k>."`` (five relations, objects drawn
from a pool three times the run, so a few repeat) through ``Memory.add_episode`` with the rule-based LLM double
(``tkg.RulesLLM``: extraction and resolution answered at zero latency). At each size it reports the engine time
(wall time minus the time inside the LLM double) of the last ``--block`` episodes before it: p50, p95, max; and
the recall of the store's candidate lookup (``Store.closest_facts``, which may answer from an approximate index)
against the exact answer of the storage interface's reference implementation, for new sentences of the user.

    python benchmarks/bench_hot_entity.py --quick        # 200 and 400 facts (seconds)
    python benchmarks/bench_hot_entity.py                # 1,000, 3,000, 10,000 and 100,000 facts (~25 min)
    python benchmarks/bench_hot_entity.py --sizes 1000,10000
    python benchmarks/bench_hot_entity.py --backends memory,postgres --postgres-sizes 1000,10000   # PostgreSQL too
    python benchmarks/bench_hot_entity.py --restate --sizes 250,500,1000 --out benchmarks/out/hot_restated.json
    python benchmarks/bench_hot_entity.py --moves --sizes 250,500,1000,2000 --out benchmarks/out/hot_moves.json
    python benchmarks/bench_hot_entity.py --changes --sizes 250,500,1000 --out benchmarks/out/hot_changes.json

``--restate``: every message also says ``"I KNOWS Bob."``, one statement restated in every episode (a user who
mentions the same thing day after day). Each restatement is a fact of its own, superseded by the first; each new
one, coming last, is settled from the statement's facts (``tkg/invalidation.py`` ``restated_last``), read whole:
this measures what that costs as they accumulate (no targets).

``--moves``: every message also says ``"I LIVES_IN city<i>."``, a new city each time, with ``LIVES_IN`` declared
single-valued in the ontology: a value that changes in every episode (a user's location, status or current task).
Each new fact ends the one before it; the whole chain is one component of the history, and each new value, coming
last, is settled from the slot's facts (``ended_in_slot``), read whole (no targets).

``--changes``: the same messages with the default ontology, so the LLM (here the rule-based double) judges each
new city against the candidates it is shown: the value holding must be among them. Both report how many LIVES_IN
values hold at each size (one is right).

Targets (issue 16): engine p50 < 5 ms and p95 < 10 ms per episode at every size, on every backend.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_core
import render
from bench_extraction import Timed
from measure import POSTGRES_SETTINGS, percentile

from tkg import FixedClock, HashEmbedder, Memory, MemoryConfig, Ontology, RelationType
from tkg.backends.memory import InMemoryStore
from tkg.llm.rules import RulesLLM
from tkg.storage import Store

ROOT = Path(__file__).resolve().parent
RELATIONS = ("LIKES", "VISITED", "KNOWS", "OWNS", "READ")
P50_LIMIT_MS = 5.0
P95_LIMIT_MS = 10.0
RECALL_K = 32  # facts the engine reads in its first closest-first round (tkg/extraction.py, candidate_batch)
RECALL_QUERIES = 40


def recall(store: Store, embedder: HashEmbedder, user_id: str, rng: random.Random, pool: int) -> dict[str, float]:
    """Mean recall@RECALL_K of ``store.closest_facts`` around the user, for the new fact's relation and for the
    others, against the exact answer (``Store.closest_facts``, the interface's own); a result counts when its
    exact score reaches the exact k-th best (equal scores are interchangeable)."""
    found: dict[str, list[float]] = {"same": [], "other": []}
    for _ in range(RECALL_QUERIES):
        relation = rng.choice(RELATIONS)
        vector = embedder.embed([f"User {relation.lower()} thing{rng.randrange(pool)}"])[0]
        for name, same in (("same", True), ("other", False)):
            ranked = Store.closest_facts(store, [user_id], vector, 1 << 30, relation, same=same)  # every one
            exact = ranked[:RECALL_K]
            if not exact:
                continue
            kth = exact[-1][1] - 1e-6
            score = {f.id: s for f, s in ranked}
            got = store.closest_facts([user_id], vector, RECALL_K, relation, same=same)
            found[name].append(sum(score[f.id] >= kth for f, _ in got) / len(exact))
    return {name: sum(v) / len(v) if v else 1.0 for name, v in found.items()}


VARIANTS = {  # --restate / --moves / --changes: what each message also says, and the tables' subtitle
    "restate": (" I KNOWS Bob.", "one statement restated in every episode"),
    "moves": (" I LIVES_IN city{i}.", "a single-valued value changed in every episode"),
    "changes": (" I LIVES_IN city{i}.", "a value changed in every episode, judged by the LLM"),
}
#: The variants whose LIVES_IN value changes in every episode: one value must hold at a time.
CHANGING = ("moves", "changes")


def run(
    sizes: list[int], block: int, seed: int = 3, store: Any = None, variant: str | None = None
) -> list[dict[str, Any]]:
    """One run on ``store`` (default: a new in-memory store); the same seed gives the same episodes; ``variant``:
    one of VARIANTS, what each message also says."""
    rng = random.Random(seed)
    llm = Timed(RulesLLM())
    embedder = HashEmbedder()
    store = InMemoryStore(dim=embedder.dim) if store is None else store
    memory = Memory(
        store,
        embedder=embedder,
        llm=llm,
        clock=FixedClock(datetime(2025, 1, 1, tzinfo=UTC), tick=timedelta(seconds=1)),
        config=MemoryConfig(communities=None),  # the community tier has its own benchmark
        ontology=Ontology(relations={"LIVES_IN": RelationType(single_valued=True)}) if variant == "moves" else None,
    )
    start = datetime(2020, 1, 1, tzinfo=UTC)
    last = sizes[-1]
    engine_ms: list[float] = []
    rows = []
    for i in range(last):
        text = f"User: I {rng.choice(RELATIONS)} thing{rng.randrange(3 * last)}."
        text += VARIANTS[variant][0].format(i=i) if variant else ""
        before = llm.seconds
        began = time.perf_counter()
        memory.add_episode(text, group_id="user", reference_time=start + timedelta(hours=i))
        engine_ms.append((time.perf_counter() - began - (llm.seconds - before)) * 1000)
        if i + 1 in sizes:
            window = engine_ms[-block:]
            user = memory.find_entities("User", group_ids=["user"])[0]
            every = memory.facts_about(user.id, include_invalidated=True)
            degree = len(every)
            holding = sum(f.relation == "LIVES_IN" for f in memory.facts_about(user.id, include_invalidated=False))
            found = recall(store, embedder, user.id, random.Random(seed + i), 3 * last)
            row = {
                "episodes": i + 1,
                "user_facts": degree,
                "p50_ms": percentile(window, 50),
                "p95_ms": percentile(window, 95),
                "max_ms": max(window),
                "block": len(window),
                "recall_same": found["same"],
                "recall_other": found["other"],
                "verdicts": sum(len(f.verdicts) for f in every),
                **({"holding": holding} if variant in CHANGING else {}),
            }
            rows.append(row)
            print(
                f"{i + 1:>7,} episodes, user entity in {degree:,} facts: engine p50 {row['p50_ms']:.2f} ms, "
                f"p95 {row['p95_ms']:.2f} ms, max {row['max_ms']:.2f} ms (last {len(window)} episodes); "
                f"recall@{RECALL_K} {found['same']:.3f} (same relation), {found['other']:.3f} (others)"
                + f"; verdicts held: {row['verdicts']:,}"
                + (f"; LIVES_IN values holding: {holding}" if variant in CHANGING else ""),
                flush=True,
            )
    return rows


def contract(
    by_backend: dict[str, list[dict[str, Any]]], before: dict[str, Any] | None = None, variant: str | None = None
) -> dict[str, Any]:
    """Tables, plot and targets of a run; ``before``: an earlier run's JSON, shown beside it (its tables only);
    ``variant``: a run of ``--restate`` or ``--moves`` (no targets)."""
    tables, series, targets = [], {}, []
    for backend, rows in by_backend.items():
        tables.append(
            {
                "title": f"One user entity accumulating facts: engine time per episode ({backend} backend, RulesLLM)"
                + (f", {VARIANTS[variant][1]}" if variant else ""),
                "columns": [
                    "episodes",
                    "facts of the user entity",
                    "engine p50 ms",
                    "engine p95 ms",
                    "engine max ms",
                    f"recall@{RECALL_K} same relation",
                    f"recall@{RECALL_K} other relations",
                    "verdicts held",
                    *(["LIVES_IN values holding"] if variant in CHANGING else []),
                ],
                "rows": [
                    [
                        r["episodes"],
                        r["user_facts"],
                        r["p50_ms"],
                        r["p95_ms"],
                        r["max_ms"],
                        r.get("recall_same"),
                        r.get("recall_other"),
                        r.get("verdicts"),
                        *([r.get("holding")] if variant in CHANGING else []),
                    ]
                    for r in rows
                ],
                "notes": [
                    "engine time = wall time of add_episode minus the time inside the LLM double; each row: the last "
                    f"{rows[0]['block'] if rows else 0} episodes before that size",
                    f"recall@{RECALL_K}: Store.closest_facts around the user against the exact answer, mean of "
                    f"{RECALL_QUERIES} new sentences (a fact counts when its exact score reaches the exact "
                    f"{RECALL_K}th best); the planner's first read is {RECALL_K} facts",
                    "verdicts held: the LLM's verdicts (Fact.verdicts) held by the user's facts, superseded ones too",
                    *(
                        ["LIVES_IN values holding: the user's current LIVES_IN facts at that size (one is right)"]
                        if variant in CHANGING
                        else []
                    ),
                    *([f"server: EmbeddedPostgres with {POSTGRES_SETTINGS}"] if backend == "postgres" else []),
                ],
            }
        )
        for r in rows if not variant else ():
            at = f"{r['user_facts']:,} facts ({backend})"
            targets.append(render.target(f"engine p50 < 5 ms at {at}", r["p50_ms"], P50_LIMIT_MS, "ms"))
            targets.append(render.target(f"engine p95 < 10 ms at {at}", r["p95_ms"], P95_LIMIT_MS, "ms"))
    for backend, rows in before["results"].items() if before else ():
        tables.append(
            {
                "title": f"Before: the same benchmark on {before['started'][:10]} ({backend} backend)",
                "columns": ["episodes", "facts of the user entity", "engine p50 ms", "engine p95 ms", "engine max ms"],
                "rows": [[r["episodes"], r["user_facts"], r["p50_ms"], r["p95_ms"], r["max_ms"]] for r in rows],
                "notes": [f"from {before.get('source', 'an earlier run')}: {before.get('command', '')}"],
            }
        )
    # One x for every backend (PostgreSQL may stop at smaller sizes): a size a backend did not run is left out.
    x = sorted({r["user_facts"] for rows in by_backend.values() for r in rows})
    for backend, rows in by_backend.items():
        at = {r["user_facts"]: r for r in rows}
        for stat in ("p50", "p95"):
            series[f"{backend} {stat}"] = [at[n][f"{stat}_ms"] if n in at else None for n in x]
    plot = {
        "file": "hot_entity_engine_ms.png",
        "title": "Engine time per episode as one entity accumulates facts",
        "x_label": "facts of the user entity",
        "y_label": "ms per episode",
        "x": x,
        "series": series,
    }
    return {"tables": tables, "plots": [plot], "targets": targets}


def run_on(backend: str, sizes: list[int], block: int, variant: str | None = None) -> list[dict[str, Any]]:
    print(f"-- {backend} backend", flush=True)
    if backend == "memory":
        return run(sizes, block, variant=variant)
    from tkg.backends.postgres import EmbeddedPostgres, PostgresStore

    with (
        EmbeddedPostgres(settings=POSTGRES_SETTINGS) as server,
        PostgresStore(server.dsn, dim=HashEmbedder().dim, schema="hot") as store,
    ):
        return run(sizes, block, store=store, variant=variant)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 and 400 episodes")
    parser.add_argument("--sizes", default="1000,3000,10000,100000", help="comma-separated episode counts")
    parser.add_argument(
        "--postgres-sizes", default=None, help="episode counts on PostgreSQL (default: --sizes; its writes are slower)"
    )
    parser.add_argument("--block", type=int, default=200, help="episodes measured before each size")
    parser.add_argument("--backends", default="memory", help="comma-separated: memory, postgres (default memory)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "hot_entity.json", help="where the JSON goes")
    parser.add_argument("--before", type=Path, help="an earlier run's JSON, shown beside this one")
    parser.add_argument("--reuse", type=Path, help="take the measurements from this run's JSON instead of running")
    parser.add_argument("--restate", action="store_true", help='every message also says "I KNOWS Bob." (no targets)')
    parser.add_argument(
        "--moves", action="store_true", help='every message also says "I LIVES_IN city<i>." (single-valued; no targets)'
    )
    parser.add_argument(
        "--changes", action="store_true", help="as --moves, with the default ontology: the LLM decides (no targets)"
    )
    args = parser.parse_args(argv)
    chosen = [name for name in VARIANTS if getattr(args, name)]
    if len(chosen) > 1:
        parser.error(f"{' and '.join('--' + c for c in chosen)} are separate runs: take one")
    variant = chosen[0] if chosen else None

    def counts(text: str) -> list[int]:
        return sorted({int(s) for s in text.split(",") if s.strip()})

    sizes = [200, 400] if args.quick else counts(args.sizes)
    sizes_of = {
        "memory": sizes,
        "postgres": counts(args.postgres_sizes) if args.postgres_sizes and not args.quick else sizes,
    }
    if any(not s or s[0] < 1 for s in sizes_of.values()) or args.block < 1:
        parser.error("--sizes and --postgres-sizes take positive integers; --block must be at least 1")
    started = time.perf_counter()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    info = bench_core.machine()
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not backends or set(backends) - {"memory", "postgres"}:
        parser.error("--backends takes memory and/or postgres")
    before = None
    if args.before:
        before = json.loads(args.before.read_text())
        before["source"] = args.before.name
    if args.reuse:  # only the presentation is new: keep the measured run's header
        measured = json.loads(args.reuse.read_text())
        header = {k: measured[k] for k in ("bench", "command", "machine", "args", "started", "seconds")}
        by_backend = measured["results"]
        was = next((name for name in VARIANTS if measured["args"].get(name)), None)
        if variant and was and variant != was:
            parser.error(f"{args.reuse} is a --{was} run, not --{variant}")
        variant = variant or was
    else:
        # each backend in a fresh process: none is measured in a process another one has used
        by_backend = {b: bench_core.in_fresh_process(run_on, b, sizes_of[b], args.block, variant) for b in backends}
        header = render.header("hot_entity", args, info, started_at, started)
    payload = {**header, **contract(by_backend, before, variant), "results": by_backend}
    render.write_result(args.out, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
