"""LLM cost of ingestion: calls, prompt characters and tokens per episode, and the engine's own time.

Two conversations, both ingested message by message through ``Memory.add_episode`` with the rule-based LLM
double (:class:`tkg.llm.rules.RulesLLM`, deterministic, zero latency), so the numbers count exactly what tkg asks
an LLM and how long tkg itself takes:

* ``scripted``: a generated conversation of chit-chat and controlled statements about people moving, changing
  jobs and liking things, with repeats and contradictions (the resolution call's work);
* ``locomo``: the first conversation of the LoCoMo dev split in ``../shared/data`` (real turns; the double turns
  every capitalised name into an entity and a ``TALKED_ABOUT`` fact from the speaker).

Each runs with reflection off (the default) and on. Run from the repository root::

    python benchmarks/bench_extraction.py            # 400 scripted messages + all LoCoMo conv-26 turns
    python benchmarks/bench_extraction.py --quick    # 200 scripted messages + 200 LoCoMo turns

Results are printed and written to ``benchmarks/out/extraction.json``.
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
import shared_data
from measure import percentile

from tkg import FixedClock, HashEmbedder, Kind, Memory, MemoryConfig
from tkg.backends.memory import InMemoryStore
from tkg.invalidation import statement_key
from tkg.llm.base import LLMClient, Prompt, T
from tkg.llm.rules import RulesLLM
from tkg.models import Fact

ROOT = Path(__file__).resolve().parent
#: The calls an episode itself costs; the rest (community summaries) belong to the community refresh policy.
EPISODE_PROMPTS = {"extract_graph", "resolve", "reflect"}

PEOPLE = ["Alice", "Bob", "Carol", "Dave", "Erin", "Frank"]
CITIES = ["Paris", "Berlin", "Denver", "Lisbon", "Osaka", "Quito", "Austin"]
EMPLOYERS = ["Acme", "Globex", "Initech", "Umbrella", "Hooli", "Stark Industries"]
HOBBIES = ["chess", "jazz", "climbing", "pottery", "sailing", "tennis"]
CHATTER = [
    "How was your weekend?",
    "Haha, that sounds fun!",
    "I had a long day at work today.",
    "Did you see the game last night?",
    "Let's grab coffee next Thursday.",
    "I just finished a great book.",
]


def scripted_conversation(n: int, seed: int = 7) -> list[tuple[str, datetime]]:
    """``n`` messages, one every six hours from 2023-01-01: about a third chit-chat, the rest statements."""
    rng = random.Random(seed)
    start = datetime(2023, 1, 1, tzinfo=UTC)
    out = []
    for i in range(n):
        who = rng.choice(PEOPLE)
        roll = rng.random()
        if roll < 0.35:
            text = rng.choice(CHATTER)
        elif roll < 0.55:
            text = f"I LIVES_IN {rng.choice(CITIES)} since {rng.choice(['last month', 'two weeks ago', 'now'])}."
        elif roll < 0.75:
            text = f"I WORKS_AT {rng.choice(EMPLOYERS)} since {rng.choice(['last year', 'March', 'now'])}."
        else:
            text = f"I LIKES {rng.choice(HOBBIES)}. Talked to {rng.choice(PEOPLE)} about it."
        out.append((f"{who}: {text}", start + timedelta(hours=6 * i)))
    return out


def locomo_conversation(path: Path, limit: int | None) -> list[tuple[str, datetime]]:
    data = json.loads(path.read_text())
    out = [
        (shared_data.turn_line(turn, captions=False), when + timedelta(seconds=30 * j))
        for _, when, turns in shared_data.locomo_sessions(data[0])
        for j, turn in enumerate(turns)
    ]
    return out[:limit] if limit else out


class Timed:
    """Wraps an LLM client and adds up the time spent inside it (the rest is engine time)."""

    def __init__(self, inner: LLMClient) -> None:
        self.inner = inner
        self.seconds = 0.0

    def generate(self, prompt: Prompt, response_model: type[T]) -> T:
        started = time.perf_counter()
        try:
            return self.inner.generate(prompt, response_model)
        finally:
            self.seconds += time.perf_counter() - started


def run(messages: list[tuple[str, datetime]], reflection: bool) -> dict[str, Any]:
    llm = Timed(RulesLLM())
    store = InMemoryStore(dim=HashEmbedder().dim)
    memory = Memory(
        store,
        embedder=HashEmbedder(),
        llm=llm,
        clock=FixedClock(datetime(2025, 1, 1, tzinfo=UTC), tick=timedelta(seconds=1)),
        config=MemoryConfig(reflection=reflection),
    )
    calls: list[int] = []
    chars: list[int] = []
    engine_ms: list[float] = []
    decisions: dict[str, int] = {}
    for text, when in messages:
        before = llm.seconds
        started = time.perf_counter()
        result = memory.add_episode(text, group_id="bench", reference_time=when)
        wall = time.perf_counter() - started
        engine_ms.append((wall - (llm.seconds - before)) * 1000)
        calls.append(sum(n for name, n in result.usage.by_prompt.items() if name in EPISODE_PROMPTS))
        chars.append(result.usage.prompt_chars)
        for key, value in result.decisions.items():
            decisions[key] = decisions.get(key, 0) + value
    usage = memory.usage
    facts = [f for f in store.scan(Kind.FACT) if isinstance(f, Fact)]
    by_id = {f.id: f for f in facts}
    # a superseded fact whose superseder says the same (verbatim) is a restatement kept for its provenance
    restated = sum(
        f.invalidated_by is not None and statement_key(by_id[f.invalidated_by]) == statement_key(f) for f in facts
    )
    n = len(messages)
    return {
        "episodes": n,
        "reflection": reflection,
        "llm_calls_per_episode": usage.calls / n,
        "episode_calls_per_episode": sum(calls) / n,
        "community_calls": usage.calls - sum(calls),
        "max_llm_calls_in_one_episode": max(calls),
        "episodes_with_2_or_more_calls": sum(c >= 2 for c in calls),
        "prompt_chars_per_episode": usage.prompt_chars / n,
        "max_prompt_chars_in_one_episode": max(chars),
        "prompt_tokens_per_episode": usage.prompt_tokens / n,
        "completion_tokens_per_episode": usage.completion_tokens / n,
        "tokens_estimated": usage.estimated,
        "calls_by_prompt": dict(usage.by_prompt),
        "engine_ms_p50": percentile(engine_ms, 50),
        "engine_ms_p95": percentile(engine_ms, 95),
        "facts": len(facts),
        "invalidated_facts": sum(f.expired_at is not None for f in facts) - restated,
        "restatements": restated,
        "entities": store.count(Kind.ENTITY),
        "facts_asked_per_episode": decisions.get("fact_questions", 0) / n,
        "candidates_per_asked_fact": decisions.get("fact_candidates", 0) / max(1, decisions.get("fact_questions", 0)),
        "other_relation_candidates_per_asked_fact": decisions.get("fact_candidates_other_relation", 0)
        / max(1, decisions.get("fact_questions", 0)),
        "decisions": decisions,
    }


#: Targets of issue 7 for the LLM side of ingestion (reflection off, the default).
MAX_CALLS_PER_EPISODE = 2.0
MAX_PROMPT_CHARS_PER_EPISODE = 15_000.0


def contract(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The suite's ``tables`` / ``plots`` / ``targets`` (benchmarks/README.md) from the result rows."""
    table = {
        "title": "LLM cost and engine time per episode (RulesLLM, zero latency)",
        "columns": [
            "conversation",
            "reflection",
            "episodes",
            "calls/episode",
            "max calls",
            "episodes with 2+ calls",
            "community calls",
            "prompt chars/episode",
            "max prompt chars",
            "prompt tokens/episode",
            "completion tokens/episode",
            "engine p50 ms",
            "engine p95 ms",
            "facts",
            "superseded",
            "restatements",
            "facts asked/episode",
            "candidates/asked fact",
            "of which other relation",
        ],
        "rows": [
            [
                r["conversation"],
                "on" if r["reflection"] else "off",
                r["episodes"],
                r["episode_calls_per_episode"],
                r["max_llm_calls_in_one_episode"],
                r["episodes_with_2_or_more_calls"],
                r["community_calls"],
                r["prompt_chars_per_episode"],
                r["max_prompt_chars_in_one_episode"],
                r["prompt_tokens_per_episode"],
                r["completion_tokens_per_episode"],
                r["engine_ms_p50"],
                r["engine_ms_p95"],
                r["facts"],
                r["invalidated_facts"],
                r["restatements"],
                r["facts_asked_per_episode"],
                r["candidates_per_asked_fact"],
                r["other_relation_candidates_per_asked_fact"],
            ]
            for r in rows
        ],
        "notes": [
            "superseded: facts ended by a contradicting fact; restatements: facts repeated while they held (kept, "
            "with an empty interval, linked to the fact they repeat). Candidates: existing facts shown to the "
            "resolution call with each new fact it asks about (superseded ones included when their own interval "
            "overlaps; 'other relation': under another relation name with a close sentence).",
            "calls/episode: extraction + resolution (+ reflection) calls of the episodes themselves; community "
            "calls: summary calls of the refresh policy during the run (prompt chars and tokens include them).",
            "Tokens are estimated as characters / 4 (the double reports none). Graphiti on LoCoMo conv-26 with the "
            "same kind of fakes: 5.5 calls and 38.8k prompt characters per episode "
            "(shared/research/graphiti_bench.md).",
        ],
    }
    targets = []
    for r in rows:
        if r["reflection"]:
            continue
        name = r["conversation"]
        targets.append(
            render.target(
                f"{name}: at most 2 LLM calls per episode (mean, reflection off)",
                r["episode_calls_per_episode"],
                MAX_CALLS_PER_EPISODE,
                "calls",
                strict=False,
            )
        )
        targets.append(
            render.target(
                f"{name}: at most 15k prompt characters per episode (mean, reflection off)",
                r["prompt_chars_per_episode"],
                MAX_PROMPT_CHARS_PER_EPISODE,
                "chars",
                strict=False,
            )
        )
    return {"tables": [table], "plots": [], "targets": targets}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 scripted messages and 200 LoCoMo turns")
    parser.add_argument("--messages", type=int, default=400, help="scripted conversation length (>= 200)")
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "extraction.json", help="where the JSON goes")
    parser.add_argument("--data", help=shared_data.HELP)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    info = bench_core.machine()
    n = 200 if args.quick else max(200, args.messages)
    conversations = {"scripted": scripted_conversation(n)}
    locomo = shared_data.locomo_file(args.data)
    if locomo is not None:
        conversations["locomo"] = locomo_conversation(locomo, 200 if args.quick else None)
    else:
        print(f"({shared_data.missing_message()}; only the scripted conversation runs)")
    rows = []
    for name, messages in conversations.items():
        for reflection in (False, True):
            row = {"conversation": name, **run(messages, reflection)}
            rows.append(row)
    header = (
        f"{'conversation':<12} {'refl':>4} {'episodes':>8} {'calls/ep':>8} {'max':>3} {'>=2':>5} {'comm':>4} "
        f"{'chars/ep':>8} {'max chars':>9} {'ptok/ep':>7} {'ctok/ep':>7} {'eng p50 ms':>10} {'p95':>6} "
        f"{'facts':>5} {'superseded':>10} {'restated':>8} {'asked/ep':>8} {'cand/asked':>10}"
    )
    print(header)
    for r in rows:
        print(
            f"{r['conversation']:<12} {'on' if r['reflection'] else 'off':>4} {r['episodes']:>8} "
            f"{r['episode_calls_per_episode']:>8.2f} {r['max_llm_calls_in_one_episode']:>3} "
            f"{r['episodes_with_2_or_more_calls']:>5} {r['community_calls']:>4} {r['prompt_chars_per_episode']:>8.0f} "
            f"{r['max_prompt_chars_in_one_episode']:>9} {r['prompt_tokens_per_episode']:>7.0f} "
            f"{r['completion_tokens_per_episode']:>7.0f} {r['engine_ms_p50']:>10.2f} {r['engine_ms_p95']:>6.2f} "
            f"{r['facts']:>5} {r['invalidated_facts']:>10} {r['restatements']:>8} "
            f"{r['facts_asked_per_episode']:>8.2f} {r['candidates_per_asked_fact']:>10.2f}"
        )
    print(
        "calls/ep, max, >=2: extraction + resolution (+ reflection) calls of the episodes themselves; comm: "
        "community summary calls made by the refresh policy during the run (chars and tokens include them).\n"
        "(tokens estimated as characters / 4: the double reports none; Graphiti, graphiti_bench.md: 5.5 calls and "
        "38.8k prompt characters per episode on LoCoMo conv-26)"
    )
    payload = {
        **render.header("extraction", args, info, started_at, started),
        **contract(rows),
        "results": rows,
    }
    render.write_result(args.out, payload)


if __name__ == "__main__":
    main()
