"""Question answering end to end, on LongMemEval and LoCoMo, against any OpenAI-compatible endpoint: ingest each
history into tkg with LLM extraction, answer every question from tkg's context and from the baselines' with one
answer model and one prompt, grade with the benchmark's judge, and report accuracy, tokens, calls and latency.

    python benchmarks/bench_qa.py --dataset longmemeval --base-url https://api.openai.com/v1 --model gpt-4o-mini \\
        --api-key-env OPENAI_API_KEY --dry-run             # what it will cost, and nothing else
    python benchmarks/bench_qa.py --dataset locomo --base-url http://127.0.0.1:8080/v1 --model local --limit 1

Systems (``--systems``, all by default): ``tkg`` (the memory's context string, ``--budget-chars`` long), ``full``
(the whole history in the prompt, when it is at most ``--full-context-chars``), ``bm25`` and ``dense`` (the best
turns by BM25 or by the embedder's cosine, in the same character budget, in time order). Separate models for
extraction (``--extract-model``), answers (``--answer-model``) and the judge (``--judge-model``) default to
``--model``. Every result is cached in ``--work`` (histories as tkg snapshots and journals, answers and grades in
a JSONL file), so a rerun continues where the last one stopped; ``--max-calls`` stops cleanly after that many LLM
calls (exit status 3, everything done so far kept).
"""

from __future__ import annotations

import argparse
import json
import re
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import qa_data
import qa_protocols
import render
import shared_data
import turn_ranking
from measure import percentile
from qa_data import History, Question, Turn

from tkg import Memory, MemoryConfig
from tkg.cli_ingest import ingest
from tkg.cli_input import MessageLine
from tkg.environment import make_embedder
from tkg.llm import LLMPolicy
from tkg.llm.base import Prompt, T, Tokens
from tkg.llm.openai import OpenAILLM

SYSTEMS = ("tkg", "full", "bm25", "dense")
EXIT_BUDGET = 3
#: Characters per token for the estimates (tokens the server reports replace them once calls are made).
CHARS_PER_TOKEN = 4
ANSWER_MAX_TOKENS = 200
JUDGE_MAX_TOKENS = 10


class BudgetExhausted(Exception):
    """``--max-calls`` LLM calls were made: the run stops, keeping what is done."""


class Budget:
    """LLM calls allowed in this run (None: any number), shared by every thread. Once spent, ``spent`` is set:
    ingestion stops after the episodes in flight (a call refused to one of them leaves it failed, and the next
    run retries it)."""

    def __init__(self, limit: int | None) -> None:
        self.limit, self.used = limit, 0
        self.spent = threading.Event()
        self._lock = threading.Lock()

    def take(self) -> None:
        with self._lock:
            if self.limit is not None and self.used >= self.limit:
                self.spent.set()
                raise BudgetExhausted(f"--max-calls {self.limit} reached")
            self.used += 1


class BudgetedLLM:
    """tkg's extraction client, each call counted against the budget and in ``calls`` / ``tokens`` (the calls that
    reached the server: one the budget refused is not counted, and leaves its episode failed for the next run)."""

    def __init__(self, inner: OpenAILLM, budget: Budget) -> None:
        self.inner, self.budget = inner, budget
        self.calls = self.prompt_tokens = self.completion_tokens = 0
        self._lock = threading.Lock()

    def generate(self, prompt: Prompt, response_model: type[T]) -> T:
        return self.generate_with_usage(prompt, response_model)[0]

    def generate_with_usage(self, prompt: Prompt, response_model: type[T]) -> tuple[T, Tokens | None]:
        self.budget.take()
        with self._lock:
            self.calls += 1
        answer, tokens = self.inner.generate_with_usage(prompt, response_model)
        if tokens is not None:
            with self._lock:
                self.prompt_tokens += tokens.prompt
                self.completion_tokens += tokens.completion
        return answer, tokens


class Chat:
    """Plain chat completions for answers and grades: temperature 0, the server's token counts."""

    def __init__(self, base_url: str, api_key: str, budget: Budget, timeout: float) -> None:
        from openai import OpenAI

        self.client = OpenAI(base_url=base_url, api_key=api_key, max_retries=4, timeout=timeout)
        self.budget = budget

    def ask(self, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
        self.budget.take()
        start = time.perf_counter()
        reply = self.client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=max_tokens
        )
        usage = reply.usage
        return {
            "text": (reply.choices[0].message.content or "").strip(),
            "prompt_tokens": usage.prompt_tokens if usage else len(prompt) // CHARS_PER_TOKEN,
            "completion_tokens": usage.completion_tokens if usage else 0,
            "seconds": time.perf_counter() - start,
        }


class Cache:
    """Results by key, in a JSONL file appended as they come (a rerun reads them back)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._items: dict[str, Any] = {}
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    entry = json.loads(line)
                    self._items[entry["key"]] = entry["value"]

    def get(self, key: str) -> Any:
        return self._items.get(key)

    def put(self, key: str, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps({"key": key, "value": value}, ensure_ascii=False) + "\n")


@dataclass
class Settings:
    dataset: str
    data: Path
    base_url: str | None
    api_key: str
    extract_model: str
    answer_model: str
    judge_model: str
    embedder: str
    systems: tuple[str, ...]
    budget_chars: int
    full_context_chars: int
    concurrency: int
    max_calls: int | None
    limit: int | None
    max_questions: int | None
    categories: frozenset[int]
    work: Path
    timeout: float = 120.0


@dataclass
class Outcome:
    """What the run measured, for the report."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    ingest: dict[str, dict[str, Any]] = field(default_factory=dict)
    context_seconds: list[float] = field(default_factory=list)
    stopped: str | None = None


# ----------------------------------------------------------------------------------------------------------
# the cost, before any call


def estimate(histories: Sequence[History], questions: Sequence[Question], s: Settings, cache: Cache) -> dict[str, Any]:
    """Calls and tokens the run will still make (what is cached is not counted). Extraction: one call per turn
    not yet ingested, plus at most one resolution call (counted as a range); tokens from the prompt tkg would
    send (the turn, the turns before it it is shown, the instructions and the schema). Answers and grades: one
    call each per question and system, the context at its budget."""
    from tkg.llm.schema import GraphExtraction

    overhead = len(json.dumps(GraphExtraction.model_json_schema())) + 1_500  # the schema, and the instructions
    extract_calls = extract_chars = 0
    if "tkg" in s.systems:
        for history in histories:
            if (cache.get(f"ingest|{history.id}") or {}).get("done"):
                continue
            shown = MemoryConfig().context_episodes
            for n in range(len(history.turns)):
                window = history.turns[max(0, n - shown) : n + 1]
                extract_calls += 1
                extract_chars += overhead + sum(len(t.text) + len(t.speaker) + 30 for t in window)
    by_history = {h.id: h for h in histories}
    answer_calls = judge_calls = answer_chars = judge_chars = 0
    for q in questions:
        for system in s.systems:
            if cache.get(_key("judge", system, q, s.judge_model)) is not None:
                continue
            size = _history_chars(by_history[q.history]) if system == "full" else s.budget_chars
            if system == "full" and size > s.full_context_chars:
                continue
            if cache.get(_key("answer", system, q, s.answer_model)) is None:
                answer_calls += 1
                answer_chars += size + len(qa_protocols.ANSWER_PROMPT) + len(q.question)
            judge_calls += 1
            judge_chars += 900 + len(q.question) + len(q.answer) + 4 * ANSWER_MAX_TOKENS
    prompt_tokens = {
        "extract": extract_chars // CHARS_PER_TOKEN,
        "answer": answer_chars // CHARS_PER_TOKEN,
        "judge": judge_chars // CHARS_PER_TOKEN,
    }
    low = extract_calls + answer_calls + judge_calls
    return {
        "extract": {"calls": [extract_calls, 2 * extract_calls], "prompt_tokens": prompt_tokens["extract"]},
        "answer": {"calls": answer_calls, "prompt_tokens": prompt_tokens["answer"]},
        "judge": {"calls": judge_calls, "prompt_tokens": prompt_tokens["judge"]},
        "total": {"calls": [low, low + extract_calls], "prompt_tokens": sum(prompt_tokens.values())},
    }


def _history_chars(history: History) -> int:
    return sum(len(t.line) + 1 for t in history.turns)


def print_estimate(est: dict[str, Any], questions: int, s: Settings) -> None:
    print(f"cost estimate ({questions} questions, systems {', '.join(s.systems)}; calls still to make):")
    for stage, row in est.items():
        shown = _calls(row["calls"])
        shown = f"{shown:,}" if isinstance(shown, int) else shown
        print(f"  {stage:<8} calls {shown:>15}   prompt tokens ~{row['prompt_tokens']:,}")


# ----------------------------------------------------------------------------------------------------------
# the run


def _key(stage: str, system: str, q: Question, model: str) -> str:
    return f"{stage}|{system}|{q.id}|{model}"


def _safe_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:-]", "-", text)[:128]


def ingest_history(history: History, s: Settings, cache: Cache, budget: Budget, embedder: Any) -> Path:
    """Ingest the history into its memory in ``--work``, resuming: turns already ingested are skipped, failed ones
    retried. Returns the memory's path."""
    path = s.work / "histories" / f"{_safe_id(history.id)}.tkg"
    path.parent.mkdir(parents=True, exist_ok=True)
    key = f"ingest|{history.id}"
    before = cache.get(key) or {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.0}
    if before.get("done"):
        return path
    assert s.base_url is not None
    llm = BudgetedLLM(OpenAILLM(s.extract_model, base_url=s.base_url, api_key=s.api_key), budget)
    config = MemoryConfig(llm_policy=LLMPolicy(max_concurrency=s.concurrency))
    items = [
        MessageLine(n + 1, f"{t.speaker}: {t.text}", "message", t.when, "", "", _safe_id(t.id))
        for n, t in enumerate(history.turns)
    ]
    start = time.perf_counter()
    report = None
    with Memory.open(path, embedder=embedder, llm=llm, config=config, create=True) as memory:
        try:
            report = ingest(memory, items, name=history.id, chunk=4 * s.concurrency, stop=budget.spent)
        finally:
            cache.put(
                key,
                {
                    "calls": before["calls"] + llm.calls,
                    "prompt_tokens": before["prompt_tokens"] + llm.prompt_tokens,
                    "completion_tokens": before["completion_tokens"] + llm.completion_tokens,
                    "seconds": before["seconds"] + time.perf_counter() - start,
                    "episodes": len(history.turns),
                    "failed": len(report.failures) if report is not None else None,
                    "done": report is not None and not report.failures and not report.stopped,
                },
            )
    if budget.spent.is_set():
        raise BudgetExhausted(f"--max-calls {budget.limit} reached while ingesting {history.id}")
    return path


class Contexts:
    """Each system's context for a question about one history."""

    def __init__(self, history: History, memory: Memory | None, s: Settings, embedder: Any) -> None:
        self.history, self.memory, self.s = history, memory, s
        self.ids = [t.id for t in history.turns]
        self.by_id = {t.id: t for t in history.turns}
        self._bm25 = turn_ranking.bm25_index([t.text for t in history.turns]) if "bm25" in s.systems else None
        self._embedder = embedder
        self._vectors = (
            np.asarray(embedder.embed([t.text for t in history.turns]), dtype=np.float32)
            if "dense" in s.systems
            else None
        )

    def of(self, system: str, q: Question, timings: list[float]) -> str | None:
        if system == "tkg":
            assert self.memory is not None
            start = time.perf_counter()
            text = self.memory.context(q.question, max_chars=self.s.budget_chars)
            timings.append(time.perf_counter() - start)
            return text
        if system == "full":
            text = "\n".join(t.line for t in self.history.turns)
            return text if len(text) <= self.s.full_context_chars else None
        if system == "bm25":
            ranked = turn_ranking.bm25_rank(self._bm25, self.ids, q.question)
        else:
            vector = np.asarray(self._embedder.embed([q.question])[0], dtype=np.float32)
            assert self._vectors is not None
            ranked = turn_ranking.dense_rank(self._vectors, self.ids, vector)
        return self._within_budget(ranked)

    def _within_budget(self, ranked: Sequence[str]) -> str:
        chosen: list[Turn] = []
        used = 0
        for turn_id in ranked:
            line = self.by_id[turn_id].line
            if used + len(line) + 1 > self.s.budget_chars:
                continue
            chosen.append(self.by_id[turn_id])
            used += len(line) + 1
        return "\n".join(t.line for t in sorted(chosen, key=lambda t: t.when))


def answer_and_grade(
    q: Question, system: str, contexts: Contexts, s: Settings, cache: Cache, chat: Chat, timings: list[float]
) -> dict[str, Any] | None:
    """One question for one system: its answer and grade, from the cache or from the models."""
    answer = cache.get(_key("answer", system, q, s.answer_model))
    if answer is None:
        context = contexts.of(system, q, timings)
        if context is None:
            return None  # the history does not fit (full context)
        answer = chat.ask(
            s.answer_model, qa_protocols.answer_prompt(context, q.question, q.asked_at), ANSWER_MAX_TOKENS
        )
        answer["context_chars"] = len(context)
        cache.put(_key("answer", system, q, s.answer_model), answer)
    grade = cache.get(_key("judge", system, q, s.judge_model))
    if grade is None:
        prompt = qa_protocols.judge_prompt(s.dataset, q.kind, q.question, q.answer, answer["text"], q.abstention)
        grade = chat.ask(s.judge_model, prompt, JUDGE_MAX_TOKENS)
        grade["correct"] = qa_protocols.judged_correct(s.dataset, grade["text"])
        cache.put(_key("judge", system, q, s.judge_model), grade)
    return {
        "question": q.id,
        "kind": q.kind,
        "system": system,
        "correct": bool(grade["correct"]),
        "f1": qa_protocols.token_f1(answer["text"], q.answer),
        "exact": qa_protocols.exact_match(answer["text"], q.answer),
        "answer_calls": 1,
        "answer_prompt_tokens": answer["prompt_tokens"],
        "answer_completion_tokens": answer["completion_tokens"],
        "judge_prompt_tokens": grade["prompt_tokens"],
        "judge_completion_tokens": grade["completion_tokens"],
        "context_chars": answer.get("context_chars", 0),
    }


def run(histories: Sequence[History], questions: Sequence[Question], s: Settings) -> Outcome:
    s.work.mkdir(parents=True, exist_ok=True)
    cache = Cache(s.work / "results.jsonl")
    budget = Budget(s.max_calls)
    assert s.base_url is not None
    chat = Chat(s.base_url, s.api_key, budget, s.timeout)
    embedder = make_embedder(s.embedder)
    outcome = Outcome()
    by_history: dict[str, list[Question]] = {}
    for q in questions:
        by_history.setdefault(q.history, []).append(q)
    try:
        for history in histories:
            asked = by_history.get(history.id, [])
            if not asked:
                continue
            memory = None
            if "tkg" in s.systems:
                # answered from the memory as stored, opened afresh: its search indexes then depend on its
                # records alone, not on how the ingestion went (one run, or several after a stop)
                memory = Memory.open(ingest_history(history, s, cache, budget, embedder), embedder=embedder)
            try:
                outcome.ingest[history.id] = cache.get(f"ingest|{history.id}") or {}
                contexts = Contexts(history, memory, s, embedder)
                jobs = [(q, system) for q in asked for system in s.systems]

                def one(job: tuple[Question, str], contexts: Contexts = contexts) -> dict[str, Any] | None:
                    return answer_and_grade(job[0], job[1], contexts, s, cache, chat, outcome.context_seconds)

                with ThreadPoolExecutor(max_workers=s.concurrency) as pool:
                    outcome.rows += [row for row in pool.map(one, jobs) if row is not None]
            finally:
                if memory is not None:
                    memory.close()
    except BudgetExhausted as exc:
        outcome.stopped = str(exc)
    return outcome


# ----------------------------------------------------------------------------------------------------------
# the report


def summarise(outcome: Outcome, questions: Sequence[Question], s: Settings) -> dict[str, Any]:
    kinds = sorted({q.kind for q in questions})
    systems: dict[str, Any] = {}
    for system in s.systems:
        rows = [r for r in outcome.rows if r["system"] == system]
        if not rows:
            continue
        per_kind = {}
        for kind in kinds:
            picked = [r["correct"] for r in rows if r["kind"] == kind]
            if picked:
                per_kind[kind] = {"accuracy": sum(picked) / len(picked), "n": len(picked)}
        systems[system] = {
            "n": len(rows),
            "accuracy": sum(r["correct"] for r in rows) / len(rows),
            "f1": sum(r["f1"] for r in rows) / len(rows),
            "exact": sum(r["exact"] for r in rows) / len(rows),
            "by_kind": per_kind,
            "answer_prompt_tokens_per_question": sum(r["answer_prompt_tokens"] for r in rows) / len(rows),
            "judge_prompt_tokens_per_question": sum(r["judge_prompt_tokens"] for r in rows) / len(rows),
            "context_chars_per_question": sum(r["context_chars"] for r in rows) / len(rows),
        }
    ingested = [v for v in outcome.ingest.values() if v]
    asked = max(1, len({r["question"] for r in outcome.rows}))
    ingest_cost = {
        "histories": len(ingested),
        "episodes": sum(v.get("episodes", 0) for v in ingested),
        "calls": sum(v.get("calls", 0) for v in ingested),
        "prompt_tokens": sum(v.get("prompt_tokens", 0) for v in ingested),
        "completion_tokens": sum(v.get("completion_tokens", 0) for v in ingested),
    }
    ingest_cost["calls_per_question"] = ingest_cost["calls"] / asked
    ingest_cost["prompt_tokens_per_question"] = ingest_cost["prompt_tokens"] / asked
    latency = outcome.context_seconds
    return {
        "benchmark": "qa",
        "dataset": s.dataset,
        "models": {"extract": s.extract_model, "answer": s.answer_model, "judge": s.judge_model},
        "endpoint": _endpoint(s.base_url),
        "questions": len(questions),
        "answered": asked if outcome.rows else 0,
        "systems": systems,
        "ingest": ingest_cost,
        "context_latency_ms": {
            "p50": percentile([x * 1000 for x in latency], 50) if latency else None,
            "p95": percentile([x * 1000 for x in latency], 95) if latency else None,
            "n": len(latency),
        },
        "stopped": outcome.stopped,
    }


def _endpoint(url: str | None) -> str:
    """The endpoint as a report may name it: local servers by their kind only (no machine's address)."""
    if not url:
        return "none"
    return "local" if re.search(r"//(127\.0\.0\.1|localhost|\[::1\])", url) else url


def print_report(summary: dict[str, Any]) -> None:
    print(f"\n{summary['dataset']}: {summary['answered']} of {summary['questions']} questions answered")
    if summary["stopped"]:
        print(f"stopped early: {summary['stopped']}; run the same command again to continue")
    header = f"{'system':<8} {'accuracy':>9} {'F1':>6} {'EM':>6} {'n':>5}  answer tokens/q  context chars/q"
    print(header)
    for system, row in summary["systems"].items():
        print(
            f"{system:<8} {row['accuracy']:>9.3f} {row['f1']:>6.3f} {row['exact']:>6.3f} {row['n']:>5}  "
            f"{row['answer_prompt_tokens_per_question']:>15,.0f}  {row['context_chars_per_question']:>15,.0f}"
        )
    for system, row in summary["systems"].items():
        kinds = ", ".join(f"{k} {v['accuracy']:.3f} ({v['n']})" for k, v in row["by_kind"].items())
        print(f"  {system}: {kinds}")
    ing = summary["ingest"]
    print(
        f"ingestion: {ing['episodes']:,} episodes, {ing['calls']:,} LLM calls ({ing['calls_per_question']:.1f} per "
        f"question), {ing['prompt_tokens']:,} prompt + {ing['completion_tokens']:,} completion tokens"
    )
    lat = summary["context_latency_ms"]
    if lat["n"]:
        print(f"tkg context latency: p50 {lat['p50']:.1f} ms, p95 {lat['p95']:.1f} ms ({lat['n']} queries)")


# ----------------------------------------------------------------------------------------------------------
# command line


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--dataset",
        action="append",
        choices=qa_data.DATASETS,
        help="repeatable; default: longmemeval and locomo",
    )
    p.add_argument("--data", help=shared_data.HELP)
    p.add_argument("--base-url", help="the OpenAI-compatible endpoint (without one: the cost estimate only)")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    p.add_argument("--model", default="gpt-4o-mini", help="the model for every stage not given its own")
    p.add_argument("--extract-model", help="tkg's extraction model")
    p.add_argument("--answer-model", help="the model that answers the questions")
    p.add_argument("--judge-model", help="the grading model")
    p.add_argument("--embedder", default="auto", help="tkg's embedder, also the dense baseline's (auto, minilm, hash)")
    p.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated, of {', '.join(SYSTEMS)}")
    p.add_argument("--budget-chars", type=int, default=4_000, help="context characters for tkg, bm25 and dense")
    p.add_argument(
        "--full-context-chars", type=int, default=520_000, help="the largest history 'full' sends (~130k tokens)"
    )
    p.add_argument("--concurrency", type=int, default=8, help="LLM calls at once")
    p.add_argument("--max-calls", type=int, help="stop cleanly after this many LLM calls (exit status 3)")
    p.add_argument("--limit", type=int, help="LongMemEval: the first N questions (all types); LoCoMo: N conversations")
    p.add_argument("--max-questions", type=int, help="at most this many questions per dataset")
    p.add_argument("--categories", default="1,2,3,4", help="LoCoMo categories (5: adversarial)")
    p.add_argument("--work", default="benchmarks/out/qa", help="cache folder: histories, answers, grades")
    p.add_argument("--out", default="benchmarks/out/qa.json", help="the result JSON (the suite's contract)")
    p.add_argument("--dry-run", action="store_true", help="print the cost estimate and exit; no call, no file")
    p.add_argument("--quick", action="store_true", help="the suite's quick mode: the estimate for 5 questions each")
    return p.parse_args(argv)


def settings_of(args: argparse.Namespace, dataset: str, environ: dict[str, str]) -> Settings:
    systems = tuple(x.strip() for x in args.systems.split(",") if x.strip())
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        raise SystemExit(f"unknown system(s) {unknown}; use {', '.join(SYSTEMS)}")
    root = shared_data.data_dir(args.data)
    if root is None:
        raise SystemExit(shared_data.missing_message("the data sets"))
    return Settings(
        dataset=dataset,
        data=root,
        base_url=args.base_url,
        api_key=environ.get(args.api_key_env) or "sk-no-key",
        extract_model=args.extract_model or args.model,
        answer_model=args.answer_model or args.model,
        judge_model=args.judge_model or args.model,
        embedder=args.embedder,
        systems=systems,
        budget_chars=args.budget_chars,
        full_context_chars=args.full_context_chars,
        concurrency=max(1, args.concurrency),
        max_calls=args.max_calls,
        limit=args.limit if args.limit is not None else (5 if args.quick else None),
        max_questions=args.max_questions if args.max_questions is not None else (5 if args.quick else None),
        categories=frozenset(int(c) for c in args.categories.split(",") if c.strip()),
        work=Path(args.work) / dataset,
    )


def tables_of(dataset: str, est: dict[str, Any], summary: dict[str, Any] | None, n: int) -> list[dict[str, Any]]:
    """The result's tables for one dataset: accuracy (or why there is none), cost, latency."""
    tables: list[dict[str, Any]] = []
    if summary is None or not summary["systems"]:
        tables.append(
            {
                "title": f"{dataset}: QA accuracy",
                "columns": ["system", "accuracy"],
                "rows": [[system, "not measured"] for system in SYSTEMS],
                "notes": [
                    "No OpenAI-compatible endpoint was given, so no question was answered. Fill this table with "
                    f"`python benchmarks/bench_qa.py --dataset {dataset} --base-url URL --model MODEL` "
                    "(see benchmarks/README.md for the cost)."
                ],
            }
        )
    else:
        kinds = sorted({k for row in summary["systems"].values() for k in row["by_kind"]})
        rows = []
        for system, row in summary["systems"].items():
            by_kind = [row["by_kind"].get(k, {}).get("accuracy") for k in kinds]
            rows.append([system, row["accuracy"], row["f1"], row["n"], *by_kind])
        tables.append(
            {
                "title": f"{dataset}: QA accuracy (judge {summary['models']['judge']})",
                "columns": ["system", "accuracy", "F1", "n", *kinds],
                "rows": rows,
                "notes": [
                    f"extraction {summary['models']['extract']}, answers {summary['models']['answer']}, endpoint "
                    f"{summary['endpoint']}; {summary['answered']} of {summary['questions']} questions"
                    + (f"; stopped early: {summary['stopped']}" if summary["stopped"] else "")
                ],
            }
        )
        ing, lat = summary["ingest"], summary["context_latency_ms"]
        tables.append(
            {
                "title": f"{dataset}: measured cost per question",
                "columns": ["stage", "LLM calls", "prompt tokens", "completion tokens"],
                "rows": [
                    [
                        "ingest (tkg)",
                        ing["calls_per_question"],
                        ing["prompt_tokens_per_question"],
                        ing["completion_tokens"] / max(1, summary["answered"]),
                    ],
                    *[
                        [f"answer ({system})", 1, row["answer_prompt_tokens_per_question"], None]
                        for system, row in summary["systems"].items()
                    ],
                    *[
                        [f"judge ({system})", 1, row["judge_prompt_tokens_per_question"], None]
                        for system, row in summary["systems"].items()
                    ],
                ],
                "notes": [
                    f"tkg search + context latency p50 {lat['p50']} ms, p95 {lat['p95']} ms ({lat['n']} queries)"
                ],
            }
        )
    tables.append(
        {
            "title": f"{dataset}: estimated cost still to pay ({n} questions)",
            "columns": ["stage", "LLM calls", "prompt tokens (estimate)"],
            "rows": [[stage, _calls(row["calls"]), row["prompt_tokens"]] for stage, row in est.items()],
            "notes": ["calls: extraction is one call per turn, plus at most one resolution call (the range)"],
        }
    )
    return tables


def _calls(calls: int | list[int]) -> str | int:
    return f"{calls[0]:,}-{calls[1]:,}" if isinstance(calls, list) else calls


def main(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None) -> int:
    import os
    from datetime import UTC, datetime

    import bench_core

    args = parse_args(argv)
    environ = dict(os.environ) if environ is None else environ
    started, started_at = time.perf_counter(), datetime.now(UTC).isoformat(timespec="seconds")
    tables: list[dict[str, Any]] = []
    summaries: dict[str, Any] = {}
    status = 0
    for dataset in args.dataset or ["longmemeval", "locomo"]:
        s = settings_of(args, dataset, environ)
        histories, questions = qa_data.load(s.dataset, s.data, s.limit, s.categories)
        if s.max_questions is not None:
            questions = questions[: s.max_questions]
            needed = {q.history for q in questions}
            histories = [h for h in histories if h.id in needed]
        cache = Cache(s.work / "results.jsonl")
        est = estimate(histories, questions, s, cache)
        print(f"\n{dataset}")
        print_estimate(est, len(questions), s)
        summary = None
        if s.base_url and not args.dry_run:
            outcome = run(histories, questions, s)
            summary = summaries[dataset] = summarise(outcome, questions, s)
            print_report(summary)
            if outcome.stopped:
                status = EXIT_BUDGET
        tables += tables_of(dataset, est, summary, len(questions))
        if status == EXIT_BUDGET:
            break
    if args.dry_run:
        return 0
    payload = {
        "bench": "qa",
        "command": render.command_line(),
        "machine": bench_core.machine(),
        "args": render.plain_args(args),
        "started": started_at,
        "seconds": time.perf_counter() - started,
        "tables": tables,
        "plots": [],
        "targets": [],
        "datasets": summaries,
    }
    render.write_result(Path(args.out), payload)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
