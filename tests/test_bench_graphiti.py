"""The pure pieces of the tkg vs Graphiti benchmark: workload, budget, report, and the rules double's answers to
Graphiti's prompts (checked against tkg's own RulesLLM). None of it needs graphiti-core installed."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_graphiti as bg
from graphiti_side import GraphitiRules, Meter, block, reference_time

from tkg.errors import ValidationError
from tkg.llm.base import Prompt
from tkg.llm.rules import RulesLLM
from tkg.llm.schema import GraphExtraction, Resolution


def _conversation(sample_id: str, speakers: tuple[str, str], turns: int) -> dict:
    session = [
        {"speaker": speakers[i % 2], "dia_id": f"D1:{i + 1}", "text": f"Hello {i} from Paris."} for i in range(turns)
    ]
    return {
        "sample_id": sample_id,
        "conversation": {"session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": session},
        "qa": [{"question": f"{sample_id} question {k}?"} for k in range(3)],
    }


DATA = [_conversation("conv-1", ("Ann", "Bob"), 3), _conversation("conv-2", ("Cy", "Di"), 2)]


# -- workload -------------------------------------------------------------------------------------------------
def test_episodes_cycle_into_new_groups_at_later_dates() -> None:
    episodes = bg.make_episodes(DATA, 12)
    assert len(episodes) == 12
    assert [e.group_id for e in episodes[:6]] == ["conv-1"] * 3 + ["conv-2"] * 2 + ["conv-1-c1"]
    assert episodes[0].content == "Ann: Hello 0 from Paris."
    assert episodes[1].reference_time - episodes[0].reference_time == timedelta(seconds=30)
    assert episodes[5].reference_time - episodes[0].reference_time == bg.CYCLE_SHIFT
    assert episodes[5].content == episodes[0].content
    assert episodes[10].group_id == "conv-1-c2"
    assert all(e.reference_time.tzinfo is UTC for e in episodes)
    assert bg.make_episodes(DATA, 12) == episodes  # deterministic


def test_queries_come_from_each_group_in_turn() -> None:
    episodes = bg.make_episodes(DATA, 7)
    queries = bg.make_queries(DATA, episodes, 5)
    assert [g for _, g in queries] == ["conv-1", "conv-2", "conv-1-c1", "conv-1", "conv-2"]
    assert queries[0][0] == "conv-1 question 0?" and queries[3][0] == "conv-1 question 1?"
    assert queries[2][0] == "conv-1 question 0?"  # a later pass asks its own conversation's questions


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError):
        bg.make_episodes(DATA, 0)


# -- statistics and budget ------------------------------------------------------------------------------------
def test_percentile_interpolates_like_numpy() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert bg.percentile(values, 50) == 3.0
    assert bg.percentile(values, 95) == pytest.approx(4.8)
    assert bg.percentile([7.0], 95) == 7.0


def test_budget_stops_on_a_projection_and_says_so() -> None:
    budget = bg.Budget(max_rss_mb=1000.0, max_seconds=600.0)
    reason, projection = bg.budget_verdict(budget, 100, 1000, 500.0, 1.0, 10.0, 0.1)
    assert reason is not None and "projected RSS" in reason and projection["rss_mb"] == pytest.approx(1400.0)
    reason, _ = bg.budget_verdict(budget, 100, 1000, 500.0, 0.1, 10.0, 1.0)
    assert reason is not None and "projected run time" in reason
    reason, _ = bg.budget_verdict(budget, 100, 1000, 1200.0, None, 10.0, None)
    assert reason is not None and "reached the budget" in reason
    assert bg.budget_verdict(budget, 100, 1000, 500.0, 0.1, 10.0, 0.1)[0] is None


# -- report ---------------------------------------------------------------------------------------------------
def _point(n: int, engine_ms: float, search_ms: float, calls: float, partial: bool = False) -> dict:
    return {
        "episodes": n,
        "partial": partial,
        "engine_ms": {"p50": engine_ms, "p95": engine_ms * 2, "mean": engine_ms},
        "search": {"all": {"wall_ms": {"p50": search_ms, "p95": search_ms * 2}}},
        "llm_calls_per_episode": calls,
        "prompt_chars_per_episode": 3000.0 * calls,
        "memory_kb_per_episode": 10.0,
        "graph": {"facts": n},
    }


def test_report_gives_ratios_targets_and_marks_what_was_not_reached() -> None:
    results: dict[str, dict[str, Any]] = {
        "tkg": {"points": [_point(100, 2.0, 1.0, 1.5), _point(1000, 2.0, 1.0, 1.5)], "stopped": None},
        "graphiti": {
            "points": [_point(100, 150.0, 30.0, 5.0)],
            "stopped": {
                "after_episodes": 100,
                "on_the_way_to": 1000,
                "reason": "projected RSS exceeds the budget",
                "projection": {"rss_mb": 9000.0},
            },
        },
    }
    report = bg.build_report(results, [100, 1000])
    first, second, summary = report["tables"]
    row = {r[0]: r for r in first["rows"]}
    assert row["engine ms/episode p50"][1:] == [2.0, 150.0, "75.0x"]
    assert {r[0]: r for r in second["rows"]}["engine ms/episode p50"][2] == "not reached"
    assert any("PROJECTION, not measured" in note for note in summary["notes"])
    verdicts = {t["name"]: t["pass"] for t in report["targets"]}
    assert verdicts["100 episodes: tkg engine time per episode p50 at least 50x less than Graphiti's"] is True
    assert verdicts["100 episodes: tkg search combined p50 at least 20x less than Graphiti's"] is True
    assert verdicts["tkg LLM calls per episode at most 2 (1,000 episodes)"] is True
    engine_plot = report["plots"][0]
    assert engine_plot["x"] == [100, 1000] and engine_plot["series"]["graphiti p50"] == [150.0, None]


def test_ratio_handles_missing_and_zero() -> None:
    assert bg.ratio(10.0, 2.0) == 5.0
    assert bg.ratio(None, 2.0) is None and bg.ratio(1.0, 0.0) is None
    assert bg.fmt_ratio(None) == "-" and bg.fmt_ratio(123.4) == "123x" and bg.fmt_ratio(4.567) == "4.57x"


# -- the rules double for Graphiti's prompts ------------------------------------------------------------------
WHEN = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
MESSAGE = "Ann: I LIVES_IN Paris since 2019. We met Bob Smith at Acme."


def _rules_extraction(content: str) -> GraphExtraction:
    speaker = content.split(":", 1)[0]
    return RulesLLM().generate(
        Prompt("extract_graph", "", "", {"content": content, "speaker": speaker}), GraphExtraction
    )


def test_entities_and_edges_follow_tkg_rules() -> None:
    rules = GraphitiRules()
    expected = _rules_extraction(MESSAGE)
    entities = rules.answer("ExtractedEntities", f"intro\n<CURRENT MESSAGE>\n{MESSAGE}\n</CURRENT MESSAGE>\n")
    assert [e["name"] for e in entities["extracted_entities"]] == [e.name for e in expected.entities]
    prompt = (
        f"<CURRENT_MESSAGE>\n{MESSAGE}\n</CURRENT_MESSAGE>\n<REFERENCE_TIME>\n{WHEN}  # ISO 8601\n</REFERENCE_TIME>"
    )
    edges = rules.answer("ExtractedEdges", prompt)["edges"]
    assert [(e["source_entity_name"], e["relation_type"], e["target_entity_name"]) for e in edges] == [
        (f.source, f.relation, f.target) for f in expected.facts
    ]
    assert edges[0]["valid_at"].startswith("2019-01-01T00:00:00")  # "since 2019", as tkg dates it
    assert edges[1]["valid_at"].startswith("2023-05-08T13:56:00")  # "now": the episode time
    assert rules.facts[edges[0]["fact"]]["relation"] == "LIVES_IN"


def test_edge_judgement_matches_rules_llm() -> None:
    rules = GraphitiRules()
    for content in ("Ann: I LIVES_IN Paris.", "Ann: I LIVES_IN Rome.", "Bob: I LIVES_IN Oslo."):
        prompt = f"<CURRENT_MESSAGE>\n{content}\n</CURRENT_MESSAGE>\n<REFERENCE_TIME>\n{WHEN}\n</REFERENCE_TIME>"
        rules.answer("ExtractedEdges", prompt)
    paris, rome, oslo = "Ann lives in Paris", "Ann lives in Rome", "Bob lives in Oslo"
    prompt = (
        f"<EXISTING FACTS>\n[{{'idx': 0, 'fact': '{paris}'}}, {{'idx': 1, 'fact': '{rome}'}}]\n</EXISTING FACTS>\n"
        f"<FACT INVALIDATION CANDIDATES>\n[{{'idx': 2, 'fact': '{oslo}'}}, {{'idx': 3, 'fact': '{rome}'}}]\n"
        f"</FACT INVALIDATION CANDIDATES>\n<NEW FACT>\n{rome}\n</NEW FACT>"
    )
    answer = rules.answer("EdgeDuplicate", prompt)
    assert answer == {"duplicate_facts": [1], "contradicted_facts": [0]}
    # the same question put to tkg's RulesLLM gets the same verdict
    candidates = [
        {"number": n, "fact": f, "relation": "LIVES_IN", "source": f.split()[0], "target": f.split()[-1]}
        for n, f in ((1, paris), (2, rome), (3, oslo))
    ]
    facts = [{"fact": rome, "relation": "LIVES_IN", "source": "Ann", "target": "Rome", "candidates": candidates}]
    verdict = RulesLLM().generate(Prompt("resolve", "", "", {"names": [], "facts": facts}), Resolution).facts[0]
    assert (verdict.duplicates, verdict.contradicts) == ([2], [1])
    # a duplicate only among the invalidation candidates is not one for Graphiti
    only_later = prompt.replace(f"'idx': 1, 'fact': '{rome}'", "'idx': 1, 'fact': 'Ann talked about Bob'")
    assert rules.answer("EdgeDuplicate", only_later)["duplicate_facts"] == []


def test_node_resolution_uses_the_affix_rule() -> None:
    prompt = (
        '<ENTITIES>\n[{"id": 0, "name": "Smith"}, {"id": 1, "name": "Ann"}, {"id": 2, "name": "Zed"}]\n</ENTITIES>\n'
        '<EXISTING ENTITIES>\n[{"candidate_id": 0, "name": "Bob Smith"}, {"candidate_id": 1, "name": "Ann"}, '
        '{"candidate_id": 2, "name": "Ann Lee"}]\n</EXISTING ENTITIES>'
    )
    resolutions = GraphitiRules().answer("NodeResolutions", prompt)["entity_resolutions"]
    assert [r["duplicate_candidate_id"] for r in resolutions] == [0, -1, -1]  # "Ann" is ambiguous: two candidates


def test_unknown_prompts_and_missing_blocks_are_errors() -> None:
    with pytest.raises(ValidationError):
        GraphitiRules().answer("CommunityDigest", "")
    with pytest.raises(ValidationError):
        block("no blocks here", "NEW FACT")
    with pytest.raises(ValidationError):
        reference_time("yesterday")
    assert reference_time("2023-05-08 13:56:00  # comment") == WHEN


def test_meter_adds_up_time_spent_inside() -> None:
    meter = Meter()
    with meter.timing():
        sum(range(10_000))
    first = meter.seconds
    with meter.timing():
        pass
    assert first > 0 and meter.seconds >= first and meter.cpu_seconds >= 0
