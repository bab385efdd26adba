#!/usr/bin/env python
"""tkg against Graphiti, side by side: the same LoCoMo episodes, the same rules "LLM", the same hash embedder.

Both engines ingest the same message episodes ("Speaker: text" at the session's date, taken turn by turn from
the LoCoMo dev conversations in ``../shared/data/locomo``; past the 4,124 turns of the 7 conversations they come
round again as new groups two years later). tkg gets :class:`tkg.llm.rules.RulesLLM`; graphiti-core (0.31.1, its
embedded Kuzu driver, in memory) gets :class:`graphiti_side.GraphitiRules`, which answers Graphiti's prompts with
the very same rule functions. Both embed with ``tkg.HashEmbedder(dim=384)``. So the graphs differ only by what
the engines do with the same answers, and the "LLM" costs nothing: what is measured is the engines.

Per engine, at each size (episodes ingested one by one; sizes are checkpoints of one run, which does exactly the
work of separate runs of those sizes since everything is deterministic):

* engine time per episode: wall time minus the time inside the doubles (LLM, embedder), p50 / p95 / mean; and
  engine CPU per episode (process CPU of all threads minus the doubles' CPU), robust on a shared machine;
* LLM calls and prompt characters per episode (characters of every message sent, counted the same way on both
  sides), embedded texts per episode;
* hybrid search latency p50 / p95 over the resulting graph, LoCoMo questions of the ingested conversations, each
  in its conversation's group: facts only (``Graphiti.search`` vs ``Memory.search(targets=["facts"])``) and
  combined (``COMBINED_HYBRID_SEARCH_RRF`` vs tkg's default facts + entities + episodes), 10 results each;
* peak RSS and memory per episode (RSS growth since the engine was set up / episodes). Each engine runs in a
  process of its own, so its peak RSS is its own.

Graphiti grows by megabytes and hundreds of milliseconds per episode, so each engine has a budget
(``--graphiti-max-rss-gb``, ``--graphiti-max-minutes``, and the same for tkg): it stops early when the projection
to the next size exceeds the budget (or the budget is reached), and the report says how far it got and why. Only
measured points are reported; a projection is printed as one, never in a table.

graphiti-core is never a dependency of tkg: it lives in its own venv, ``benchmarks/.venv-graphiti``, created on
first use by ``benchmarks/graphiti_env.sh``. Both engines run with that venv's interpreter by default (the same
Python and numpy for both; ``--tkg-python current`` runs tkg with this interpreter instead). Run from the
repository root::

    python benchmarks/bench_graphiti.py --quick   # CI smoke: 25 episodes per engine, ~1-2 minutes with the venv
    nice python benchmarks/bench_graphiti.py      # 100, 1,000 and 10,000 episodes (Graphiti within its budget)

Writes ``benchmarks/out/graphiti.json`` (the benchmark contract: tables, plots, targets, raw numbers).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import shared_data  # benchmarks/ is the script's own folder, first on sys.path
from measure import percentile

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VENV = HERE / ".venv-graphiti"
VENV_PYTHON = VENV / "bin" / "python"
ENV_SCRIPT = HERE / "graphiti_env.sh"
DIM = 384
LIMIT = 10
#: Each pass over the conversations after the first lands this much later, in new groups.
CYCLE_SHIFT = timedelta(days=728)
#: "now" for tkg's clock: after every episode date, so every fact counts as current when searched.
CLOCK_START = datetime(2030, 1, 1, tzinfo=UTC)
TARGET_ENGINE_RATIO = 50.0
TARGET_SEARCH_RATIO = 20.0
TARGET_CALLS = 2.0
TARGET_CHARS = 15_000.0
ENGINES = ("graphiti", "tkg")  # Graphiti first: a size it stops short of is then measured on tkg too


# ----------------------------------------------------------------------------------------------------------
# workload


@dataclass(frozen=True, slots=True)
class Turn:
    """One message episode."""

    content: str
    group_id: str
    reference_time: datetime
    name: str
    conversation: str


def conversation_turns(record: dict[str, Any]) -> list[tuple[str, datetime, str]]:
    """(``"Speaker: text"``, time, dialogue id) per turn of one LoCoMo conversation, 30 s apart in a session."""
    out = []
    for _, when, turns in shared_data.locomo_sessions(record):
        for j, turn in enumerate(turns):
            text = " ".join(str(turn.get("text", "")).split())
            if text:
                out.append((f"{turn['speaker']}: {text}", when + timedelta(seconds=30 * j), str(turn.get("dia_id"))))
    return out


def group_name(sample_id: str, cycle: int) -> str:
    return sample_id if cycle == 0 else f"{sample_id}-c{cycle}"


def make_episodes(data: Sequence[dict[str, Any]], count: int) -> list[Turn]:
    """The first ``count`` episodes: every turn of conversation 1, then 2, ...; then the same again as new groups
    (``conv-26-c1``...) dated ``CYCLE_SHIFT`` later, as often as needed."""
    if count < 1:
        raise ValueError("count must be at least 1")
    per_conversation = [(str(r["sample_id"]), conversation_turns(r)) for r in data]
    if not any(turns for _, turns in per_conversation):
        raise ValueError("the LoCoMo data holds no turns")
    out: list[Turn] = []
    cycle = 0
    while len(out) < count:
        for sample_id, turns in per_conversation:
            group = group_name(sample_id, cycle)
            for content, when, dia in turns:
                if len(out) == count:
                    return out
                out.append(Turn(content, group, when + CYCLE_SHIFT * cycle, f"{group}:{dia}", sample_id))
        cycle += 1
    return out


def make_queries(data: Sequence[dict[str, Any]], episodes: Sequence[Turn], count: int) -> list[tuple[str, str]]:
    """``count`` (question, group) pairs: LoCoMo questions of the conversations the episodes come from, taken in
    turn from each group present (in order of appearance), each asked in its own group."""
    questions = {str(r["sample_id"]): [str(q["question"]) for q in r.get("qa", []) if q.get("question")] for r in data}
    conversation_of = {t.group_id: t.conversation for t in episodes}
    groups = [g for g in conversation_of if questions.get(conversation_of[g])]
    if not groups:
        return []
    out = []
    for j in range(count):
        group = groups[j % len(groups)]
        pool = questions[conversation_of[group]]
        out.append((pool[(j // len(groups)) % len(pool)], group))
    return out


# ----------------------------------------------------------------------------------------------------------
# statistics and budget


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    ms = [s * 1000.0 for s in seconds]
    mean = sum(ms) / len(ms) if ms else float("nan")
    return {"p50": percentile(ms, 50), "p95": percentile(ms, 95), "mean": mean, "n": len(ms)}


@dataclass(frozen=True, slots=True)
class Budget:
    """What one engine may use: peak RSS and wall time of its whole run."""

    max_rss_mb: float
    max_seconds: float


def budget_verdict(
    budget: Budget,
    done: int,
    goal: int,
    rss_mb: float,
    rss_slope_mb: float | None,
    elapsed_s: float,
    seconds_per_episode: float | None,
) -> tuple[str | None, dict[str, float]]:
    """Whether to stop after ``done`` episodes on the way to ``goal``: the budget is reached, or the projection
    (current RSS + slope x episodes left; elapsed + recent seconds per episode x episodes left) exceeds it.
    Returns (reason or None, the projection)."""
    left = max(0, goal - done)
    projection: dict[str, float] = {"episodes": float(goal)}
    if rss_slope_mb is not None:
        projection["rss_mb"] = rss_mb + max(0.0, rss_slope_mb) * left
    if seconds_per_episode is not None:
        projection["seconds"] = elapsed_s + seconds_per_episode * left
    if rss_mb > budget.max_rss_mb:
        return f"RSS {rss_mb:,.0f} MB reached the budget of {budget.max_rss_mb:,.0f} MB", projection
    if elapsed_s > budget.max_seconds:
        return f"run time {elapsed_s / 60:.1f} min reached the budget of {budget.max_seconds / 60:.0f} min", projection
    if projection.get("rss_mb", 0.0) > budget.max_rss_mb:
        return (
            f"projected RSS at {goal:,} episodes, {projection['rss_mb']:,.0f} MB (projection: "
            f"{max(0.0, rss_slope_mb or 0.0):.2f} MB/episode since the last size), exceeds the budget of "
            f"{budget.max_rss_mb:,.0f} MB",
            projection,
        )
    if projection.get("seconds", 0.0) > budget.max_seconds:
        return (
            f"projected run time at {goal:,} episodes, {projection['seconds'] / 60:,.0f} min (projection: "
            f"{(seconds_per_episode or 0.0) * 1000:.0f} ms/episode recently, growing with the graph), exceeds the "
            f"budget of {budget.max_seconds / 60:.0f} min",
            projection,
        )
    return None, projection


def rss_mb() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in MiB (Linux)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    current = float("nan")
    try:
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        pass
    return current, peak


# ----------------------------------------------------------------------------------------------------------
# the engines (child process)


class TkgEngine:
    """tkg's in-memory Memory with RulesLLM and HashEmbedder wrapped in timers (the same Meter as Graphiti's)."""

    name = "tkg"

    def __init__(self, dim: int) -> None:
        from graphiti_side import Meter

        from tkg import FixedClock, HashEmbedder, Memory, RulesLLM

        meter = self.meter = Meter()
        rules = RulesLLM()
        embedder = HashEmbedder(dim=dim)

        class TimedRules:
            def generate(self, prompt: Any, response_model: Any) -> Any:
                with meter.timing():
                    meter.llm_calls += 1
                    meter.prompt_chars += prompt.chars  # system + user: every message sent
                    meter.by_prompt[prompt.name] += 1
                    try:
                        return rules.generate(prompt, response_model)
                    finally:
                        rules.calls.clear()  # the double keeps every prompt: keep its memory out of tkg's RSS

        class TimedEmbedder:
            dim = embedder.dim
            name = embedder.name

            def embed(self, texts: Sequence[str]) -> Any:
                with meter.timing():
                    meter.embed_calls += 1
                    meter.embed_texts += len(texts)
                    return embedder.embed(texts)

        self.memory = Memory(
            embedder=TimedEmbedder(),
            llm=TimedRules(),
            clock=FixedClock(CLOCK_START, tick=timedelta(milliseconds=1)),
        )

    def add(self, content: str, group_id: str, reference: datetime, name: str, description: str) -> None:
        self.memory.add_episode(
            content, group_id=group_id, reference_time=reference, name=name, source_description=description
        )

    def search_facts(self, query: str, group_id: str, limit: int) -> int:
        return len(self.memory.search(query, group_ids=[group_id], targets=["facts"], limit=limit).facts)

    def search_all(self, query: str, group_id: str, limit: int) -> int:
        found = self.memory.search(query, group_ids=[group_id], limit=limit)
        return len(found.facts) + len(found.entities) + len(found.episodes) + len(found.communities)

    def counts(self) -> dict[str, int]:
        from tkg import Fact, Kind

        memory = self.memory
        facts = [f for f in memory.records(Kind.FACT) if isinstance(f, Fact)]
        counts = memory.stats()["records"]
        return {
            "entities": counts["entity"],
            "facts": len(facts),
            "invalidated_facts": sum(f.invalid_at is not None for f in facts),
            "episodes": counts["episode"],
            "communities": counts["community"],
        }

    def close(self) -> None:
        pass


def _versions() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    # relative to the repository root (the suite's working directory): no machine's path in a committed result
    out: dict[str, Any] = {"python": sys.version.split()[0], "executable": os.path.relpath(sys.executable)}
    for name in ("tkg", "graphiti-core", "kuzu", "numpy", "pydantic", "openai", "hnswlib", "bm25s"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _measure_searches(engine: Any, queries: Sequence[tuple[str, str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    meter = engine.meter
    for kind in ("facts", "all"):
        run = engine.search_facts if kind == "facts" else engine.search_all
        for question, group in queries[:3]:  # warm-up, untimed
            run(question, group, LIMIT)
        wall, engine_s, cpu, hits = [], [], [], 0
        for question, group in queries:
            fake, fake_cpu = meter.seconds, meter.cpu_seconds
            c0 = time.process_time()
            t0 = time.perf_counter()
            hits += run(question, group, LIMIT)
            elapsed = time.perf_counter() - t0
            cpu.append(time.process_time() - c0 - (meter.cpu_seconds - fake_cpu))
            wall.append(elapsed)
            engine_s.append(elapsed - (meter.seconds - fake))
        out[kind] = {
            "wall_ms": summary_ms(wall),
            "engine_ms": summary_ms(engine_s),
            "cpu_ms": summary_ms(cpu),
            "results_per_query": hits / max(1, len(queries)),
        }
    return out


def _checkpoint(
    engine: Any, n: int, rec: dict[str, list[Any]], base_rss: float, started: float, queries: Any, partial: bool
) -> dict[str, Any]:
    ingest_s = sum(rec["wall"][:n])
    searches = _measure_searches(engine, queries)
    current, peak = rss_mb()
    by_prompt: dict[str, float] = {}
    for snapshot in rec["by_prompt"][:n]:
        for key, value in snapshot.items():
            by_prompt[key] = by_prompt.get(key, 0.0) + value / n
    by_prompt = {key: round(value, 4) for key, value in by_prompt.items()}
    return {
        "episodes": n,
        "partial": partial,
        "engine_ms": summary_ms(rec["engine"][:n]),
        "wall_ms": summary_ms(rec["wall"][:n]),
        "engine_cpu_ms": summary_ms(rec["cpu"][:n]),
        "fake_ms_per_episode": 1000.0 * sum(rec["fake"][:n]) / n,
        "llm_calls_per_episode": sum(rec["calls"][:n]) / n,
        "max_llm_calls_in_one_episode": max(rec["calls"][:n]),
        "prompt_chars_per_episode": sum(rec["chars"][:n]) / n,
        "embedded_texts_per_episode": sum(rec["texts"][:n]) / n,
        "llm_calls_by_prompt_per_episode": by_prompt,
        "ingest_seconds": ingest_s,
        "search": searches,
        "search_queries": len(queries),
        "rss_mb": current,
        "peak_rss_mb": peak,
        "rss_growth_mb": current - base_rss,
        "memory_kb_per_episode": 1024.0 * (current - base_rss) / n,
        "graph": engine.counts(),
        "elapsed_seconds": time.perf_counter() - started,
    }


def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """Run one engine over the episodes with checkpoints at the sizes; returns the JSON-able result."""
    started = time.perf_counter()
    sys.path.insert(0, str(HERE))
    data = json.loads(Path(spec["locomo"]).read_text())
    sizes = sorted(set(spec["sizes"]))
    episodes = make_episodes(data, sizes[-1])
    name = spec["engine"]
    load_start = round(os.getloadavg()[0], 2)
    before_engine, _ = rss_mb()
    if name == "graphiti":
        from graphiti_side import GraphitiEngine

        db_dir = tempfile.mkdtemp(prefix="graphiti-kuzu-") if spec.get("graphiti_db") == "disk" else None
        engine: Any = GraphitiEngine(DIM, None if db_dir is None else str(Path(db_dir) / "graph.kuzu"))
    else:
        engine = TkgEngine(DIM)
    gc.collect()
    base_rss, _ = rss_mb()
    budget = Budget(spec["max_rss_mb"], spec["max_seconds"])
    check_every = int(spec["check_every"])
    block = int(spec["block"])
    rec: dict[str, list[Any]] = {k: [] for k in ("wall", "engine", "cpu", "fake", "calls", "chars", "texts")}
    rec["by_prompt"] = []
    points: list[dict[str, Any]] = []
    blocks: list[dict[str, Any]] = []
    stopped: dict[str, Any] | None = None
    meter = engine.meter
    segment_start, segment_rss = 0, base_rss
    i = 0
    for size in sizes:
        while i < size and stopped is None:
            turn = episodes[i]
            snap = meter.snapshot()
            c0 = time.process_time()
            t0 = time.perf_counter()
            engine.add(turn.content, turn.group_id, turn.reference_time, turn.name, "LoCoMo dev conversation")
            wall = time.perf_counter() - t0
            cpu = time.process_time() - c0
            now = meter.snapshot()
            fake = now["seconds"] - snap["seconds"]
            rec["wall"].append(wall)
            rec["engine"].append(wall - fake)
            rec["cpu"].append(cpu - (now["cpu_seconds"] - snap["cpu_seconds"]))
            rec["fake"].append(fake)
            rec["calls"].append(now["llm_calls"] - snap["llm_calls"])
            rec["chars"].append(now["prompt_chars"] - snap["prompt_chars"])
            rec["texts"].append(now["embed_texts"] - snap["embed_texts"])
            rec["by_prompt"].append({k: v - snap["by_prompt"].get(k, 0) for k, v in now["by_prompt"].items()})
            i += 1
            if i % block == 0:
                lo = i - block
                blocks.append(
                    {
                        "episodes": [lo + 1, i],
                        "wall_ms_p50": percentile(rec["wall"][lo:i], 50) * 1000,
                        "engine_ms_p50": percentile(rec["engine"][lo:i], 50) * 1000,
                        "engine_cpu_ms_mean": 1000 * sum(rec["cpu"][lo:i]) / block,
                        "llm_calls_per_episode": sum(rec["calls"][lo:i]) / block,
                        "prompt_chars_per_episode": sum(rec["chars"][lo:i]) / block,
                        "rss_mb": rss_mb()[0],
                    }
                )
            if i % check_every == 0 and i < size:
                current, _ = rss_mb()
                seg = i - segment_start
                slope = (current - segment_rss) / seg if seg >= check_every else None
                recent = rec["wall"][-check_every:]
                reason, projection = budget_verdict(
                    budget, i, size, current, slope, time.perf_counter() - started, sum(recent) / len(recent)
                )
                if reason is not None:
                    stopped = {"after_episodes": i, "on_the_way_to": size, "reason": reason, "projection": projection}
            if i % 500 == 0:
                print(f"[{name}] {i:,} episodes, {time.perf_counter() - started:,.0f} s", file=sys.stderr, flush=True)
        if stopped is not None:
            if not points or points[-1]["episodes"] != i:
                points.append(
                    _checkpoint(
                        engine, i, rec, base_rss, started, make_queries(data, episodes[:i], spec["queries"]), True
                    )
                )
            break
        points.append(
            _checkpoint(
                engine, size, rec, base_rss, started, make_queries(data, episodes[:size], spec["queries"]), False
            )
        )
        print(f"[{name}] measured {size:,} episodes", file=sys.stderr, flush=True)
        later = [s for s in sizes if s > size]
        if later:
            current, _ = rss_mb()
            slope = (current - segment_rss) / max(1, size - segment_start)
            recent = rec["wall"][-max(check_every, size // 10) :]
            reason, projection = budget_verdict(
                budget, size, later[0], current, slope, time.perf_counter() - started, sum(recent) / len(recent)
            )
            if reason is not None:
                stopped = {
                    "after_episodes": size,
                    "on_the_way_to": later[0],
                    "reason": reason,
                    "projection": projection,
                }
                break
            segment_start, segment_rss = size, current
    engine.close()
    return {
        "engine": name,
        "versions": _versions(),
        "rss_before_engine_mb": before_engine,
        "rss_baseline_mb": base_rss,
        "sizes_asked": sizes,
        "points": points,
        "blocks": blocks,
        "stopped": stopped,
        "budget": {"max_rss_mb": budget.max_rss_mb, "max_seconds": budget.max_seconds},
        "seconds": time.perf_counter() - started,
        "load_average": {"start": load_start, "end": round(os.getloadavg()[0], 2)},
    }


# ----------------------------------------------------------------------------------------------------------
# report (parent process)


def ratio(graphiti: float | None, tkg: float | None) -> float | None:
    """How many times Graphiti's figure is tkg's (None when either is missing or tkg's is not positive)."""
    if graphiti is None or tkg is None or not tkg > 0 or math.isnan(graphiti) or math.isnan(tkg):
        return None
    return graphiti / tkg


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}x" if value >= 100 else f"{value:,.1f}x" if value >= 10 else f"{value:,.2f}x"


def _round(value: float | None, digits: int = 3) -> float | None:
    if value is None or math.isnan(value):
        return None
    return round(value, digits) if abs(value) < 1000 else round(value, 1)


#: (label, path into a point, round digits): the rows of each size's table; ratio = graphiti / tkg
ROWS: list[tuple[str, tuple[str, ...], int]] = [
    ("engine ms/episode p50", ("engine_ms", "p50"), 3),
    ("engine ms/episode p95", ("engine_ms", "p95"), 3),
    ("engine ms/episode mean", ("engine_ms", "mean"), 3),
    ("engine CPU ms/episode p50 (all threads)", ("engine_cpu_ms", "p50"), 3),
    ("engine CPU ms/episode mean (all threads)", ("engine_cpu_ms", "mean"), 3),
    ("wall ms/episode p50 (with the doubles)", ("wall_ms", "p50"), 3),
    ("time in the doubles ms/episode", ("fake_ms_per_episode",), 3),
    ("LLM calls/episode", ("llm_calls_per_episode",), 3),
    ("prompt chars/episode", ("prompt_chars_per_episode",), 0),
    ("embedded texts/episode", ("embedded_texts_per_episode",), 2),
    ("search facts ms p50", ("search", "facts", "wall_ms", "p50"), 3),
    ("search facts ms p95", ("search", "facts", "wall_ms", "p95"), 3),
    ("search combined ms p50", ("search", "all", "wall_ms", "p50"), 3),
    ("search combined ms p95", ("search", "all", "wall_ms", "p95"), 3),
    ("search facts CPU ms p50", ("search", "facts", "cpu_ms", "p50"), 3),
    ("search combined CPU ms p50", ("search", "all", "cpu_ms", "p50"), 3),
    ("search combined CPU ms p95", ("search", "all", "cpu_ms", "p95"), 3),
    ("results per combined search", ("search", "all", "results_per_query"), 1),
    ("peak RSS MB", ("peak_rss_mb",), 0),
    ("RSS growth MB", ("rss_growth_mb",), 1),
    ("memory KB/episode", ("memory_kb_per_episode",), 1),
    ("entities", ("graph", "entities"), 0),
    ("facts", ("graph", "facts"), 0),
    ("invalidated facts", ("graph", "invalidated_facts"), 0),
    ("ingest s (total, with the doubles)", ("ingest_seconds",), 2),
]


def dig(point: dict[str, Any] | None, path: Sequence[str]) -> float | None:
    value: Any = point
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return float(value) if isinstance(value, (int, float)) else None


def point_at(result: dict[str, Any] | None, n: int) -> dict[str, Any] | None:
    for point in (result or {}).get("points", []):
        if point["episodes"] == n:
            return point
    return None


def build_report(results: dict[str, dict[str, Any]], sizes: Sequence[int]) -> dict[str, Any]:
    """Tables, plots and targets from the two engines' results (either may be missing or stopped early)."""
    tkg, graphiti = results.get("tkg"), results.get("graphiti")
    measured = sorted({p["episodes"] for r in (tkg, graphiti) if r for p in r.get("points", [])} | set(sizes))
    tables, targets = [], []
    for n in measured:
        t, g = point_at(tkg, n), point_at(graphiti, n)
        if t is None and g is None:
            continue
        rows = []
        for label, path, digits in ROWS:
            tv, gv = dig(t, path), dig(g, path)
            rows.append(
                [
                    label,
                    _round(tv, digits) if t else "not reached",
                    _round(gv, digits) if g else "not reached",
                    fmt_ratio(ratio(gv, tv)),
                ]
            )
        notes = ["ratio = Graphiti / tkg, both measured in this run; engine = wall - time inside the doubles."]
        for who, point, result in (("tkg", t, tkg), ("graphiti", g, graphiti)):
            if point is not None and result is not None:
                calls = ", ".join(f"{k} {v:.3g}" for k, v in point.get("llm_calls_by_prompt_per_episode", {}).items())
                load = result.get("load_average", {})
                notes.append(
                    f"{who}: LLM calls/episode by prompt: {calls or '-'}; load average (1 min) at its start / end: "
                    f"{load.get('start', '?')} / {load.get('end', '?')} on {os.cpu_count()} CPUs"
                )
        if g is not None and g.get("partial"):
            notes.append(f"Graphiti stopped after {n:,} episodes (budget; see the summary): a partial size.")
        if g is None and graphiti is not None and graphiti.get("stopped"):
            notes.append(f"Graphiti did not reach {n:,} episodes: {graphiti['stopped']['reason']}.")
        tables.append(
            {
                "title": f"{n:,} episodes",
                "columns": ["metric", "tkg", "graphiti", "ratio"],
                "rows": rows,
                "notes": notes,
            }
        )
        if t is not None and g is not None:
            for label, path, limit in (
                ("engine time per episode p50", ("engine_ms", "p50"), TARGET_ENGINE_RATIO),
                ("search combined p50", ("search", "all", "wall_ms", "p50"), TARGET_SEARCH_RATIO),
                ("search combined p95", ("search", "all", "wall_ms", "p95"), TARGET_SEARCH_RATIO),
                # process CPU: what the engines cost regardless of how busy the shared machine was
                ("engine CPU per episode p50", ("engine_cpu_ms", "p50"), TARGET_ENGINE_RATIO),
                ("search combined CPU p50", ("search", "all", "cpu_ms", "p50"), TARGET_SEARCH_RATIO),
                ("search combined CPU p95", ("search", "all", "cpu_ms", "p95"), TARGET_SEARCH_RATIO),
            ):
                value = ratio(dig(g, path), dig(t, path))
                targets.append(
                    {
                        "name": f"{n:,} episodes: tkg {label} at least {limit:.0f}x less than Graphiti's",
                        "value": _round(value, 2),
                        "limit": limit,
                        "unit": "x",
                        "pass": bool(value is not None and value >= limit),
                    }
                )
    tkg_sizes = [p["episodes"] for p in (tkg or {}).get("points", []) if not p.get("partial")]
    if tkg_sizes:
        last = point_at(tkg, max(tkg_sizes))
        for label, key, limit in (
            ("LLM calls per episode", "llm_calls_per_episode", TARGET_CALLS),
            ("prompt characters per episode", "prompt_chars_per_episode", TARGET_CHARS),
        ):
            value = dig(last, (key,))
            targets.append(
                {
                    "name": f"tkg {label} at most {limit:,.0f} ({max(tkg_sizes):,} episodes)",
                    "value": _round(value, 2),
                    "limit": limit,
                    "unit": "calls" if "calls" in key else "chars",
                    "pass": bool(value is not None and value <= limit),
                }
            )
    summary_rows = []
    for label, path, _ in ROWS[:21]:
        summary_rows.append(
            [label, *[fmt_ratio(ratio(dig(point_at(graphiti, n), path), dig(point_at(tkg, n), path))) for n in sizes]]
        )
    notes = []
    for name, result in (("tkg", tkg), ("graphiti", graphiti)):
        if result is None:
            notes.append(f"{name}: no result (its process failed; see stderr).")
            continue
        reached = max((p["episodes"] for p in result.get("points", [])), default=0)
        stop = result.get("stopped")
        if stop:
            projected = stop.get("projection", {})
            parts = []
            if "rss_mb" in projected:
                parts.append(f"RSS {projected['rss_mb']:,.0f} MB")
            if "seconds" in projected:
                parts.append(f"run time {projected['seconds'] / 60:,.0f} min")
            notes.append(
                f"{name}: stopped after {stop['after_episodes']:,} episodes on the way to {stop['on_the_way_to']:,}: "
                f"{stop['reason']}. PROJECTION, not measured, at {stop['on_the_way_to']:,} episodes: "
                + (", ".join(parts) or "none")
                + "."
            )
        else:
            notes.append(f"{name}: measured every size asked (up to {reached:,} episodes).")
    summary = {
        "title": "Summary: Graphiti / tkg (how many times Graphiti's figure is tkg's; measured in the same run)",
        "columns": ["metric", *[f"{n:,} episodes" for n in sizes]],
        "rows": summary_rows,
        "notes": notes,
    }

    def series(result: dict[str, Any] | None, path: Sequence[str]) -> list[float | None]:
        return [_round(dig(point_at(result, n), path), 4) for n in sizes]

    def plot(file: str, title: str, y_label: str, paths: dict[str, tuple[str, ...]], log_y: bool) -> dict[str, Any]:
        return {
            "file": file,
            "title": title,
            "x_label": "episodes ingested",
            "y_label": y_label,
            "log_x": True,
            "log_y": log_y,
            "x": list(sizes),
            "series": {
                f"{who} {label}": series(result, path)
                for who, result in (("tkg", tkg), ("graphiti", graphiti))
                for label, path in paths.items()
            },
        }

    plots = [
        plot(
            "graphiti_engine_ms.png",
            "Engine time per episode (zero-latency LLM)",
            "ms per episode",
            {"p50": ("engine_ms", "p50"), "p95": ("engine_ms", "p95")},
            True,
        ),
        plot(
            "graphiti_search_ms.png",
            "Hybrid search latency (facts + entities + episodes, 10 each)",
            "ms per query",
            {"p50": ("search", "all", "wall_ms", "p50"), "p95": ("search", "all", "wall_ms", "p95")},
            True,
        ),
        plot(
            "graphiti_llm_calls.png",
            "LLM calls per episode",
            "calls per episode",
            {"calls": ("llm_calls_per_episode",)},
            False,
        ),
        plot(
            "graphiti_prompt_chars.png",
            "Prompt characters per episode",
            "characters per episode",
            {"chars": ("prompt_chars_per_episode",)},
            False,
        ),
        plot(
            "graphiti_memory.png",
            "Memory per episode (RSS growth / episodes)",
            "KB per episode",
            {"KB/episode": ("memory_kb_per_episode",)},
            True,
        ),
    ]
    return {"tables": [*tables, summary], "plots": plots, "targets": targets}


def print_report(report: dict[str, Any]) -> None:
    for table in report["tables"]:
        print(f"\n== {table['title']}")
        widths = [
            max(len(str(row[i])) for row in [table["columns"], *table["rows"]]) for i in range(len(table["columns"]))
        ]
        for row in [table["columns"], *table["rows"]]:
            cells = [f"{row[0]!s:<{widths[0]}}"] + [f"{c!s:>{w}}" for c, w in zip(row[1:], widths[1:], strict=True)]
            print("  ".join(cells))
        for note in table.get("notes", []):
            print(f"  note: {note}")
    print("\n== Targets")
    for target in report["targets"]:
        value = "-" if target["value"] is None else f"{target['value']:,}"
        verdict = "PASS" if target["pass"] else "MISS"
        print(f"  {verdict}  {target['name']}: {value} {target['unit']} (limit {target['limit']:,})")


# ----------------------------------------------------------------------------------------------------------
# main


def ensure_venv() -> Path:
    """The graphiti venv's python, creating the venv first if needed (graphiti_env.sh)."""
    if VENV_PYTHON.exists():
        check = subprocess.run(
            [str(VENV_PYTHON), "-c", "import graphiti_core, kuzu, httpx, tkg"], capture_output=True, text=True
        )
        if check.returncode == 0:
            return VENV_PYTHON
    print(f"creating {VENV} (graphiti-core 0.31.1, kuzu 0.11.3; about a minute)...", file=sys.stderr, flush=True)
    made = subprocess.run(["bash", str(ENV_SCRIPT)], capture_output=True, text=True)
    if made.returncode != 0:
        raise SystemExit(
            f"could not create the graphiti venv with {ENV_SCRIPT}:\n{made.stdout[-2000:]}{made.stderr[-4000:]}"
        )
    return VENV_PYTHON


def child_env() -> dict[str, str]:
    """The child's environment: graphiti-core reads these at import (set here, never in tkg)."""
    env = dict(os.environ)
    env.update(
        {
            "GRAPHITI_TELEMETRY_ENABLED": "false",
            "EMBEDDING_DIM": str(DIM),
            "OPENAI_API_KEY": env.get("OPENAI_API_KEY") or "sk-unused-offline-benchmark",
            "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), str(HERE), env.get("PYTHONPATH", "")) if p),
        }
    )
    return env


def run_child(python: Path | str, spec: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
    with tempfile.TemporaryDirectory(prefix="bench-graphiti-") as tmp:
        spec_path, result_path = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_path.write_text(json.dumps(spec))
        cmd = [str(python), str(Path(__file__).resolve()), "--child", str(spec_path), "--result", str(result_path)]
        try:
            done = subprocess.run(cmd, env=child_env(), cwd=str(ROOT), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"[{spec['engine']}] killed after {timeout_s:.0f} s", file=sys.stderr)
            return None
        if done.returncode != 0 or not result_path.exists():
            print(f"[{spec['engine']}] failed with exit code {done.returncode}", file=sys.stderr)
            return None
        return json.loads(result_path.read_text())  # type: ignore[no-any-return]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="CI smoke: 25 episodes per engine, 10 queries")
    p.add_argument("--out", type=Path, default=HERE / "out" / "graphiti.json")
    p.add_argument("--data", help=shared_data.HELP)
    p.add_argument("--sizes", default=None, help="comma-separated episode counts (default 100,1000,10000)")
    p.add_argument("--queries", type=int, default=None, help="search queries per size (default 100; quick 10)")
    p.add_argument("--engines", default=",".join(ENGINES), help="which engines to run (default both)")
    p.add_argument("--graphiti-max-rss-gb", type=float, default=10.0)
    p.add_argument("--graphiti-max-minutes", type=float, default=40.0)
    p.add_argument("--tkg-max-rss-gb", type=float, default=10.0)
    p.add_argument("--tkg-max-minutes", type=float, default=40.0)
    p.add_argument("--graphiti-db", choices=["memory", "disk"], default="memory", help="Kuzu in memory or a temp dir")
    p.add_argument(
        "--tkg-python",
        default="graphiti-venv",
        help="interpreter for the tkg side: 'graphiti-venv' (default: the same Python and libraries as Graphiti), "
        "'current' (this one), or a path",
    )
    p.add_argument("--check-every", type=int, default=25, help="episodes between budget checks")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.sizes is None:
        args.sizes = "25" if args.quick else "100,1000,10000"
    try:
        args.size_list = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        p.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    if not args.size_list or args.size_list[0] < 1:
        p.error("--sizes needs at least one positive size")
    if args.queries is None:
        args.queries = 10 if args.quick else 100
    args.engine_list = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not set(args.engine_list) <= set(ENGINES) or not args.engine_list:
        p.error(f"--engines takes a subset of {','.join(ENGINES)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        measured = child_main(json.loads(args.child.read_text()))
        args.result.write_text(json.dumps(measured, default=str))
        return 0
    from bench_core import machine  # the suite's machine description (imports tkg: this interpreter has it)

    started_at = datetime.now(UTC)
    t0 = time.perf_counter()
    locomo = shared_data.locomo_file(args.data)
    if locomo is None:
        raise SystemExit(shared_data.missing_message())
    venv_python = ensure_venv() if "graphiti" in args.engine_list or args.tkg_python == "graphiti-venv" else None
    interpreters = {
        "graphiti": venv_python,
        "tkg": venv_python
        if args.tkg_python == "graphiti-venv"
        else Path(sys.executable)
        if args.tkg_python == "current"
        else Path(args.tkg_python),
    }
    info = machine()
    results: dict[str, dict[str, Any]] = {}
    sizes = list(args.size_list)
    for name in [e for e in ENGINES if e in args.engine_list]:
        gb, minutes = (
            (args.graphiti_max_rss_gb, args.graphiti_max_minutes)
            if name == "graphiti"
            else (args.tkg_max_rss_gb, args.tkg_max_minutes)
        )
        extra = []
        if name == "tkg" and results.get("graphiti", {}).get("stopped"):
            extra = [p["episodes"] for p in results["graphiti"]["points"] if p.get("partial")]
        spec = {
            "engine": name,
            "locomo": str(locomo),
            "sizes": sorted(set(sizes) | set(extra)),
            "queries": args.queries,
            "max_rss_mb": gb * 1024,
            "max_seconds": minutes * 60,
            "check_every": args.check_every,
            "block": 5 if args.quick else 100,
            "graphiti_db": args.graphiti_db,
        }
        python = interpreters[name]
        if python is None:
            raise SystemExit(f"no interpreter for {name}")
        print(f"[{name}] running with {python}", file=sys.stderr, flush=True)
        result = run_child(python, spec, timeout_s=minutes * 60 * 1.5 + 600)
        if result is not None:
            results[name] = result
    report = build_report(results, sizes)
    out = {
        "bench": "graphiti",
        "command": shlex.join(["python", *sys.argv]),
        "machine": info,
        "args": {
            k: (str(v) if isinstance(v, Path) else v)
            for k, v in vars(args).items()
            if k not in ("child", "result", "size_list", "engine_list")
        },
        "started": started_at.isoformat(),
        "seconds": round(time.perf_counter() - t0, 1),
        **report,
        "setup": {
            "episodes": "LoCoMo dev turns as message episodes 'Speaker: text' at the session date (+30 s per turn), "
            "conversation after conversation; further passes as new groups dated 728 days later",
            "llm": "tkg: tkg.llm.rules.RulesLLM; Graphiti: graphiti_side.GraphitiRules (the same rule functions)",
            "embedder": f"tkg.HashEmbedder(dim={DIM}) on both sides",
            "graphiti": f"graphiti-core with KuzuDriver ({args.graphiti_db}), add_episode one by one, no communities",
            "tkg": "tkg.Memory, in-memory store, default MemoryConfig (incremental communities on), add_episode",
            "search": f"{args.queries} LoCoMo questions per size in their own group, limit {LIMIT}; 'combined' = "
            "Graphiti COMBINED_HYBRID_SEARCH_RRF vs tkg's default (facts, entities, episodes; cosine + BM25, RRF)",
        },
        "engines": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1, default=str))
    print_report(report)
    for name, result in results.items():
        print(f"{name}: {result['versions']}")
    print(f"\nwrote {args.out} in {out['seconds']:.0f} s")
    return 0 if set(results) == set(args.engine_list) else 1


if __name__ == "__main__":
    sys.exit(main())
