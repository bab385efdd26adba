"""The question-answering harness (benchmarks/bench_qa.py) end to end against a local OpenAI-compatible server, on
a few questions of each dev split: the cost estimate and --dry-run, the baselines, the report, and a run stopped by
--max-calls (in ingestion, then in answering) that continues where it stopped and ends as a clean run does."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_openai_server import FakeOpenAIServer

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_qa  # noqa: E402
import qa_data  # noqa: E402
import qa_protocols  # noqa: E402
import render  # noqa: E402
import shared_data  # noqa: E402

DATA = shared_data.data_dir(None)
pytestmark = pytest.mark.skipif(DATA is None, reason=shared_data.missing_message("the dev splits"))


def model(request: dict[str, Any]) -> dict[str, Any] | str:
    """A deterministic stand-in: extraction finds nothing new; the answerer repeats the line of its memory that
    shares the most words with the question; the judges compare texts."""
    text = str(request["messages"][-1]["content"])
    if request.get("tools"):
        return {"entities": [], "facts": []}
    if text.startswith("You answer questions"):
        memory = text.split("# Memory\n", 1)[1].split("\n\n# Today's date", 1)[0]
        question = set(re.findall(r"\w+", text.split("# Question\n", 1)[1].lower()))
        lines = [line for line in memory.splitlines() if line.strip()]
        best = max(lines, key=lambda line: len(question & set(re.findall(r"\w+", line.lower()))), default="")
        return best or "I do not know."
    if "Answer yes or no only." in text:
        gold = text.split("Answer: ", 1)[1].split("\n\n", 1)[0] if "Answer: " in text else ""
        response = text.split("Model Response: ", 1)[1]
        return "yes" if gold and gold.lower()[:12] in response.lower() else "no"
    gold = text.split("Gold answer: ", 1)[1].split("\n", 1)[0]
    answer = text.split("Generated answer: ", 1)[1].split("\n", 1)[0]
    return "CORRECT" if gold.lower() in answer.lower() else "WRONG"


def run(server: FakeOpenAIServer, work: Path, *args: str) -> tuple[int, dict[str, Any] | None]:
    """One run; its result for the one dataset asked (None when no result was written)."""
    out = work / "qa.json"
    out.unlink(missing_ok=True)
    argv = ["--base-url", server.base_url, "--model", "m", "--embedder", "hash", "--work", str(work), "--out", str(out)]
    code = bench_qa.main([*argv, *args], environ={})
    if not out.exists():
        return code, None
    payload = json.loads(out.read_text())
    assert not render.contract_problems(payload)
    return code, next(iter(payload["datasets"].values()), payload)


def chat_calls(server: FakeOpenAIServer) -> int:
    return sum(path.endswith("/chat/completions") for path in server.paths())


@pytest.mark.slow  # ingests a LoCoMo conversation through a local server
def test_locomo_end_to_end_with_the_baselines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeOpenAIServer(chat=model) as server:
        code, report = run(server, tmp_path, "--dataset", "locomo", "--limit", "1", "--max-questions", "6")
    assert code == 0 and report is not None
    out = capsys.readouterr().out
    assert "cost estimate (6 questions" in out and "tkg context latency: p50" in out
    assert set(report["systems"]) == {"tkg", "full", "bm25", "dense"}
    turns = len(qa_data.load("locomo", DATA, 1)[0][0].turns)  # type: ignore[arg-type]
    assert report["ingest"]["episodes"] == turns and report["ingest"]["calls"] == turns  # one call per turn
    assert report["context_latency_ms"]["n"] == 6 and report["endpoint"] == "local"
    for row in report["systems"].values():
        assert row["n"] == 6 and 0 <= row["accuracy"] <= 1 and 0 <= row["f1"] <= 1
        assert sum(k["n"] for k in row["by_kind"].values()) == 6
    # the full-context answerer sees every turn: its grades follow from the history alone
    histories, _ = qa_data.load("locomo", DATA, 1)  # type: ignore[arg-type]
    assert (
        report["systems"]["full"]["context_chars_per_question"] == sum(len(t.line) + 1 for t in histories[0].turns) - 1
    )


def test_dry_run_estimates_and_calls_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with FakeOpenAIServer(chat=model) as server:
        code, report = run(server, tmp_path, "--dataset", "longmemeval-oracle", "--max-questions", "3", "--dry-run")
        assert server.requests == []
    assert code == 0 and report is None
    out = capsys.readouterr().out
    histories, _ = qa_data.load("longmemeval-oracle", DATA, None)  # type: ignore[arg-type]
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    turns = sum(len(h.turns) for h in histories[:3])  # the first three questions, spread over the types
    assert (
        lines["extract"].split()[2] != "0-0"
        and lines["answer"].split()[2] == "12"
        and lines["judge"].split()[2] == "12"
    )
    assert turns > 0


def test_a_stopped_run_continues_and_ends_as_a_clean_run(tmp_path: Path) -> None:
    args = ("--dataset", "longmemeval-oracle", "--max-questions", "3", "--concurrency", "2")
    with FakeOpenAIServer(chat=model) as clean_server:
        code, clean = run(clean_server, tmp_path / "clean", *args)
        clean_calls = chat_calls(clean_server)
    assert code == 0 and clean is not None and clean["stopped"] is None
    episodes = clean["ingest"]["episodes"]
    calls = 0
    with FakeOpenAIServer(chat=model) as server:
        for cap in (episodes // 2, 5):  # stopped in ingestion, then among the answers
            code, report = run(server, tmp_path / "resumed", *args, "--max-calls", str(cap))
            assert code == bench_qa.EXIT_BUDGET and report is not None and "--max-calls" in report["stopped"]
            assert chat_calls(server) - calls <= cap
            calls = chat_calls(server)
        code, final = run(server, tmp_path / "resumed", *args)
        assert code == 0 and final is not None
        assert chat_calls(server) == clean_calls  # nothing asked twice
    for key in ("systems", "ingest"):
        assert {k: v for k, v in final[key].items() if "seconds" not in k} == {
            k: v for k, v in clean[key].items() if "seconds" not in k
        }
    # everything is cached now: a rerun asks nothing
    with FakeOpenAIServer(chat=model) as idle:
        assert run(idle, tmp_path / "resumed", *args)[0] == 0 and chat_calls(idle) == 0


def test_judges_and_metrics() -> None:
    prompt = qa_protocols.judge_prompt("longmemeval", "temporal-reasoning", "Q?", "18 days", "19 days", False)
    assert "do not penalize off-by-one errors" in prompt and prompt.endswith("Answer yes or no only.")
    assert "unanswerable" in qa_protocols.judge_prompt("longmemeval", "multi-session", "Q?", "x", "y", True)
    assert qa_protocols.judged_correct("longmemeval", "Yes.") and not qa_protocols.judged_correct("longmemeval", "No")
    assert qa_protocols.judged_correct("locomo", "CORRECT") and not qa_protocols.judged_correct("locomo", "INCORRECT")
    assert qa_protocols.token_f1("on 7 May 2023", "7 May 2023") == pytest.approx(2 * 0.75 * 1 / 1.75)
    assert qa_protocols.exact_match("The Beatles!", "beatles")
