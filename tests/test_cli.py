"""The ``tkg`` command line, run in-process through ``main([...])`` (plus one real subprocess)."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai_server import FakeOpenAIServer

from tkg import FactInput, HashEmbedder, Memory
from tkg.cli import main
from tkg.cli_input import FactLines, MessageLine, parse_jsonl
from tkg.environment import llm_from_env, make_embedder
from tkg.errors import ConfigurationError, ValidationError
from tkg.wire_shapes import EntityOut, EpisodeOut, FactOut, SearchOut

FACTS = [
    {
        "subject": "Alice",
        "relation": "WORKS_AT",
        "object": "Acme",
        "fact": "Alice works at Acme",
        "valid_at": "2019-03-01T00:00:00Z",
        "invalid_at": "2023-02-28T00:00:00Z",
    },
    {
        "subject": "Alice",
        "relation": "WORKS_AT",
        "object": "Globex",
        "fact": "Alice works at Globex",
        "valid_at": "2023-03-01T00:00:00Z",
    },
    {"subject": "Bob", "relation": "LIVES_IN", "object": "Boston", "valid_at": "2019-01-01T00:00:00Z"},
]
MESSAGES = [
    {"content": "Alice: I adopted a border collie called Pixel.", "reference_time": "2024-05-06T09:00:00Z"},
    {"speaker": "Bob", "text": "Pixel is a great name for a dog!", "reference_time": "2024-05-06T09:05:00Z"},
    {"content": "Carol is planning a trip to Denver.", "source": "text", "source_description": "notes"},
]
ENV_VARS = ("TKG_LLM_BASE_URL", "TKG_LLM_MODEL", "TKG_LLM_API_KEY", "TKG_LLM_MODE", "TKG_EMBED_BASE_URL")
EXTRACTION: dict[str, Any] = {
    "entities": [{"name": "Alice", "label": "Person"}, {"name": "Pixel", "label": "Animal"}],
    "facts": [{"source": "Alice", "target": "Pixel", "relation": "OWNS", "fact": "Alice owns a dog named Pixel"}],
}


def answer_by_schema(request: dict[str, Any]) -> dict[str, Any]:
    """The fake model's answer: the extraction above, or 'nothing to merge or invalidate' for a resolution call."""
    if "Resolution" in json.dumps(request.get("tool_choice")):
        return {"reasoning": "nothing matches", "entities": [], "facts": []}
    return EXTRACTION


@pytest.fixture(autouse=True)
def no_llm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests decide themselves whether an LLM endpoint is configured."""
    for name in (*ENV_VARS, "TKG_EMBED_MODEL", "TKG_EMBED_DIM", "TKG_EMBED_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def snap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """A snapshot holding FACTS then MESSAGES (hash embedder)."""
    path = tmp_path / "memory.tkg"
    for name, rows in (("facts.jsonl", FACTS), ("messages.jsonl", MESSAGES)):
        code, _, err = run(
            capsys, "ingest", str(write_jsonl(tmp_path / name, rows)), "--snapshot", str(path), "--embedder", "hash"
        )
        assert code == 0, err
    return path


def search(capsys: pytest.CaptureFixture[str], snap: Path, query: str, *extra: str) -> tuple[int, str, str]:
    return run(capsys, "search", query, "--snapshot", str(snap), "--embedder", "hash", *extra)


# -- ingest ------------------------------------------------------------------------------------------------------


def test_ingest_prints_a_summary_and_saves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.tkg"
    rows = [*FACTS, *MESSAGES]
    code, out, err = run(
        capsys, "ingest", str(write_jsonl(tmp_path / "all.jsonl", rows)), "--snapshot", str(path), "--embedder", "hash"
    )
    assert code == 0, err
    assert "3 messages, 3 facts" in out
    # 1 JSON episode for the fact run + 3 message episodes; Alice Acme Globex Bob Boston (Bob again as speaker)
    assert "added 4 episodes, 5 entities, 3 facts; LLM calls: 0" in out
    assert "no LLM configured" in err
    assert path.is_file()
    memory = Memory.load(path, embedder=HashEmbedder())
    assert memory.stats()["records"]["fact"] == 3


def test_ingest_adds_to_an_existing_snapshot(snap: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    more = write_jsonl(tmp_path / "more.jsonl", [{"subject": "Carol", "relation": "LIVES_IN", "object": "Denver"}])
    code, out, _ = run(capsys, "ingest", str(more), "--snapshot", str(snap), "--embedder", "hash", "--group", "team")
    assert code == 0
    assert "added 1 episode, 2 entities, 1 fact" in out
    assert "5 episodes" in out and "4 facts in total" in out
    code, out, _ = run(capsys, "stats", "--snapshot", str(snap))
    assert "default, team" in out


def test_parse_groups_consecutive_fact_lines_and_builds_speaker_messages() -> None:
    rows = [FACTS[0], FACTS[1], MESSAGES[1], FACTS[2]]
    text = "\n".join(json.dumps(r) for r in rows[:2]) + "\n\n" + "\n".join(json.dumps(r) for r in rows[2:])
    items = parse_jsonl("in.jsonl", text)
    assert [type(i) for i in items] == [FactLines, MessageLine, FactLines]
    first, message, last = items
    assert isinstance(first, FactLines) and (first.first, first.last, len(first.facts)) == (1, 2, 2)
    assert isinstance(message, MessageLine) and message.content == "Bob: Pixel is a great name for a dog!"
    assert message.line == 4
    assert isinstance(last, FactLines) and last.first == 5


def test_parse_splits_long_fact_runs_under_the_episode_limit() -> None:
    text = "\n".join(json.dumps(FACTS[2]) for _ in range(10))
    items = parse_jsonl("in.jsonl", text, max_chars=400)
    assert len(items) > 1
    assert sum(len(i.facts) for i in items if isinstance(i, FactLines)) == 10


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object, got an array"),
        ('{"subject": "Alice", "relation": "KNOWS"}', '"object" is missing'),
        ('{"subject": "A", "relation": "R", "object": "B", "valid_at": "2020-01-01T00:00:00"}', "naive"),
        (
            '{"subject": "A", "relation": "R", "object": "B", "valid_at": "2022-01-01T00:00:00Z", '
            '"invalid_at": "2021-01-01T00:00:00Z"}',
            "before valid_at",
        ),
        ('{"content": "Alice: hi", "colour": "red"}', "unknown key(s) colour"),
        ('{"content": "Alice: hi \\ud800"}', '"content" contains a lone surrogate'),  # valid JSON, not text
        ('{"speaker": "Alice", "text": "hi \\udc00"}', '"text" contains a lone surrogate'),
        ('{"subject": "Al\\udc00", "relation": "LIVES_IN", "object": "Oslo"}', '"subject" contains a lone surrogate'),
        ('{"content": "   "}', "non-empty string"),
        ('{"content": "hi", "source": "email"}', '"source" must be one of'),
        ('{"hello": "world"}', "cannot tell what this line is"),
        (
            '{"content": ' + "[" * 3000 + "]" * 3000 + ', "source": "json"}',
            "nests lists or maps deeper than 100 levels",
        ),
        (
            '{"content": "' + "[" * 3000 + "]" * 3000 + '", "source": "json"}',
            "nests lists or maps deeper than 100 levels",
        ),
    ],
)
def test_a_bad_line_leaves_the_snapshot_untouched(
    snap: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str, message: str
) -> None:
    before = snap.read_bytes()
    good = [json.dumps(FACTS[0]), json.dumps(MESSAGES[0])]
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join([*good, bad, json.dumps(MESSAGES[1])]) + "\n", encoding="utf-8")
    code, out, err = run(capsys, "ingest", str(path), "--snapshot", str(snap), "--embedder", "hash")
    assert code == 2
    assert err.startswith(f"tkg: error: {path}:3: ")
    assert message in err
    assert "Traceback" not in err and out == ""
    assert snap.read_bytes() == before


def test_kind_option_forces_the_line_type(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_jsonl(tmp_path / "in.jsonl", [MESSAGES[0]])
    code, _, err = run(
        capsys, "ingest", str(path), "--snapshot", str(tmp_path / "m.tkg"), "--kind", "facts", "--embedder", "hash"
    )
    assert code == 2
    assert f"{path}:1: unknown key(s) content, reference_time for a fact" in err
    assert not (tmp_path / "m.tkg").exists()


def test_missing_or_empty_input_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.jsonl"
    code, _, err = run(capsys, "ingest", str(missing), "--snapshot", str(tmp_path / "m.tkg"), "--embedder", "hash")
    assert (code, err) == (2, f"tkg: error: {missing}: no such file\n")
    (tmp_path / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    code, _, err = run(
        capsys, "ingest", str(tmp_path / "empty.jsonl"), "--snapshot", str(tmp_path / "m.tkg"), "--embedder", "hash"
    )
    assert code == 2 and "holds no records" in err


# -- search, context, stats --------------------------------------------------------------------------------------


def test_search_shows_current_facts_with_ranges(snap: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = search(capsys, snap, "Where does Alice work?")
    assert code == 0, err
    assert "Alice works at Globex  (2023-03-01 - present)" in out
    assert "Acme  (" not in out  # ended facts are hidden by default
    lines = out.splitlines()
    assert lines[0] == "facts" and "entities" in lines and "episodes" in lines
    assert any(line.strip().split("  ", 1)[1].startswith("Alice (Person)") for line in lines if "Alice (" in line)


def test_search_finds_message_episodes(snap: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = search(capsys, snap, "border collie Pixel", "--limit", "2")
    assert code == 0
    assert "[2024-05-06 09:00] Alice: I adopted a border collie called Pixel." in out


def test_as_of_shows_the_ended_fact_and_hides_the_current_one(snap: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = search(capsys, snap, "Where does Alice work?", "--as-of", "2021-06-01")
    assert code == 0
    assert "Alice works at Acme  (2019-03-01 - 2023-02-28)" in out
    assert "Globex  (" not in out
    code, out, _ = search(capsys, snap, "Where does Alice work?", "--include-invalidated")
    assert "Alice works at Acme  (" in out and "Alice works at Globex  (" in out


def test_known_at_before_anything_was_recorded(snap: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = search(capsys, snap, "Alice", "--known-at", "2000-01-01T00:00:00+02:00")
    assert code == 0
    assert out.splitlines() == ["facts: none", "entities: none", "episodes: none"]


def test_search_json(snap: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = search(capsys, snap, "Where does Alice work?", "--json", "--include-invalidated", "--limit", "5")
    assert code == 0
    data = json.loads(out)
    assert data["query"] == "Where does Alice work?"
    acme = next(f for f in data["facts"] if f["target"] == "Acme")
    assert acme["source"] == "Alice" and acme["relation"] == "WORKS_AT"
    assert (acme["valid_at"], acme["invalid_at"]) == ("2019-03-01T00:00:00Z", "2023-02-28T00:00:00Z")
    # exactly the shape the MCP and HTTP doors publish, every record scored, best first, within the limit
    assert SearchOut.model_validate(data).model_dump(mode="json") == data
    for kind, shape in (("facts", FactOut), ("entities", EntityOut), ("episodes", EpisodeOut)):
        assert 1 <= len(data[kind]) <= 5
        assert all(set(record) == set(shape.model_fields) for record in data[kind])
        scores = [record["score"] for record in data[kind]]
        assert all(isinstance(score, float) for score in scores) and scores == sorted(scores, reverse=True)
    assert data["communities"] == []  # tkg search looks at facts, entities and episodes


def test_search_filters_by_group(snap: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = search(capsys, snap, "Alice", "--group", "elsewhere")
    assert code == 2 and "elsewhere" in err
    code, out, _ = search(capsys, snap, "Alice", "--group", "default")
    assert code == 0 and "Alice works at Globex" in out


def test_context(snap: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["context", "Where does Alice work?", "--snapshot", str(snap), "--embedder", "hash"]
    code, out, _ = run(capsys, *args)
    assert code == 0
    assert "- Alice works at Globex (2023-03-01 00:00 UTC - present)" in out
    assert "<ENTITIES>" in out and "<EPISODES>" not in out
    code, out, _ = run(capsys, *args, "--episodes", "--as-of", "2025-01-01")
    assert "<EPISODES>" in out
    code, out, _ = run(capsys, *args, "--max-chars", "200")
    assert 0 < len(out.rstrip("\n")) <= 200


def test_stats(snap: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "stats", "--snapshot", str(snap))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert re.fullmatch(rf"snapshot     {re.escape(str(snap))} \({snap.stat().st_size:,} bytes, saved \S+\)", lines[0])
    assert lines[1:6] == [
        "embedder     hash-384-tri (384-d; --embedder hash)",
        "groups       default",
        "episodes     4",
        "entities     5",  # Alice Acme Globex Bob Boston; the speakers are Alice and Bob
        "facts        3  (2 current, 1 ended)",
    ]
    # then one line per other kind of record (how many communities label propagation finds is not the CLI's say)
    assert [line.split()[0] for line in lines[6:]] == ["communities", "mentions", "memberships"]


def test_stats_of_a_memory_with_no_snapshot_yet_names_the_embedder_its_journal_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said "not recorded until the first snapshot", and the next command refused by that very embedder."""
    path = tmp_path / "mem.tkg"
    memory = Memory.open(path, embedder=HashEmbedder(dim=384))
    memory.add_facts([FactInput("Ann", "LIVES_IN", "Oslo")], group_id="u1")
    memory.close()
    assert not path.exists()  # the journal alone
    code, out, _ = run(capsys, "stats", "--store", str(path), "--embedder", "hash")
    assert code == 0 and "embedder     hash-384-tri (384-d; --embedder hash)" in out.splitlines()


@pytest.mark.parametrize("command", ["search", "context", "stats"])
def test_missing_snapshot_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    missing = tmp_path / "missing.tkg"
    args = [command, "q"] if command != "stats" else [command]
    code, out, err = run(capsys, *args, "--snapshot", str(missing), "--embedder", "hash")
    assert code == 2 and out == ""
    assert err.startswith(f"tkg: error: snapshot {missing} does not exist; create it with `tkg ingest")


def test_a_corrupt_snapshot_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.tkg"
    bad.write_bytes(b"not a snapshot")
    code, _, err = search(capsys, bad, "Alice")
    assert code == 2 and "is not a tkg snapshot" in err


def test_embedder_mismatch_names_the_right_option(snap: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "search", "Alice", "--snapshot", str(snap), "--embedder", "minilm")
    assert code == 2
    assert "was made with the embedder 'hash-384-tri'" in err and "pass --embedder hash" in err


def test_bad_time_and_limit_are_errors(snap: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = search(capsys, snap, "Alice", "--as-of", "yesterday")
    assert code == 2 and "--as-of 'yesterday' is not an ISO-8601" in err
    code, _, err = search(capsys, snap, "Alice", "--limit", "0")
    assert code == 2 and "limit must be a positive integer" in err


def test_usage_errors_and_help_return_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["search", "q"]) == 2  # --snapshot is required
    assert main(["--help"]) == 0
    assert "ingest" in capsys.readouterr().out


# -- embedders and LLM from the environment ----------------------------------------------------------------------


def test_auto_embedder_falls_back_to_hash_with_a_note(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tkg.embedders import onnx

    def unavailable(self: object, **kwargs: object) -> None:
        raise ConfigurationError("MiniLMEmbedder needs onnxruntime")

    monkeypatch.setattr(onnx.MiniLMEmbedder, "__init__", unavailable)
    assert isinstance(make_embedder("auto"), HashEmbedder)
    assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(ConfigurationError):
        make_embedder("minilm")


def test_llm_is_read_from_the_environment_at_run_time() -> None:
    assert llm_from_env({}) is None
    llm = llm_from_env({"TKG_LLM_BASE_URL": "http://127.0.0.1:9/v1", "OPENAI_API_KEY": "sk-x"})
    assert llm is not None
    assert (llm.model, llm.mode, llm.endpoint) == ("gpt-4o-mini", "tools", "http://127.0.0.1:9/v1")  # type: ignore[attr-defined]
    with pytest.raises(ValidationError):
        llm_from_env({"TKG_LLM_BASE_URL": "http://127.0.0.1:9/v1", "TKG_LLM_MODE": "telepathy"})


@pytest.fixture
def llm_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(chat=answer_by_schema) as server:
        monkeypatch.setenv("TKG_LLM_BASE_URL", server.base_url)
        monkeypatch.setenv("TKG_LLM_MODEL", "fake-model")
        yield server


def test_ingest_extracts_with_a_configured_llm(
    llm_server: FakeOpenAIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, messages = tmp_path / "m.tkg", write_jsonl(tmp_path / "in.jsonl", MESSAGES[:1])
    code, out, err = run(capsys, "ingest", str(messages), "--snapshot", str(path), "--embedder", "hash")
    assert code == 0, err
    assert "added 1 episode, 2 entities, 1 fact; LLM calls: 1" in out
    assert [p for p in llm_server.paths() if p.endswith("/chat/completions")] == ["/v1/chat/completions"]
    code, out, _ = search(capsys, path, "Pixel")
    assert "Alice owns a dog named Pixel  (2024-05-06 09:00 - present)" in out


def test_no_llm_flag_ignores_the_environment(
    llm_server: FakeOpenAIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    messages = write_jsonl(tmp_path / "in.jsonl", MESSAGES[:1])
    code, out, _ = run(
        capsys, "ingest", str(messages), "--snapshot", str(tmp_path / "m.tkg"), "--embedder", "hash", "--no-llm"
    )
    assert code == 0 and "LLM calls: 0" in out
    assert llm_server.requests == []


def test_a_failing_llm_is_listed_by_line_and_a_rerun_retries_it(
    llm_server: FakeOpenAIServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An extraction that fails for good leaves its episode stored as failed and the rest of the file added; the
    run lists it with the reason and exits 1; the same command again retries only it."""
    llm_server.fail_next(1, status=400, message="model not loaded")  # a 400 is not retried
    path, messages = tmp_path / "m.tkg", write_jsonl(tmp_path / "in.jsonl", [FACTS[0], MESSAGES[0]])
    code, out, err = run(capsys, "ingest", str(messages), "--store", str(path), "--embedder", "hash")
    assert code == 1
    assert f"tkg: note: failed: {messages}:2: " in err and "model not loaded" in err
    assert f"1 episode failed and is stored as failed; run `tkg ingest {messages} --store {path} ...` again" in err
    assert "added 2 episodes, 2 entities, 1 fact; LLM calls: 1" in out  # the call that failed
    memory = Memory.load(path, embedder=HashEmbedder())
    assert sorted(e.status.value for e in memory.episodes()) == ["extracted", "failed"]

    code, out, err = run(capsys, "ingest", str(messages), "--store", str(path), "--embedder", "hash")
    assert (code, err) == (0, ""), err
    assert "skipped 1 line already in the memory (an earlier run)" in out
    assert "LLM calls: 1" in out
    memory = Memory.load(path, embedder=HashEmbedder())
    assert sorted(e.status.value for e in memory.episodes()) == ["extracted", "extracted"]
    assert any(f.fact == "Alice owns a dog named Pixel" for f in memory.records("fact"))


def test_ingest_into_a_missing_directory_fails_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = write_jsonl(tmp_path / "in.jsonl", FACTS)
    code, out, err = run(
        capsys, "ingest", str(facts), "--snapshot", str(tmp_path / "no" / "m.tkg"), "--embedder", "hash"
    )
    assert code == 2 and out == "" and "does not exist" in err


def test_demo_uses_a_configured_llm_for_the_messages(
    llm_server: FakeOpenAIServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run(capsys, "demo", "--embedder", "hash")
    assert code == 0, err
    assert f"LLM fake-model at {llm_server.base_url}" in out
    assert "with live LLM extraction" in out
    calls = sum(path.endswith("/chat/completions") for path in llm_server.paths())
    assert f"LLM calls: {calls}" in out and 12 <= calls <= 24  # one extraction per message, at most one more


def test_openai_embedder_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path, facts = tmp_path / "m.tkg", write_jsonl(tmp_path / "in.jsonl", FACTS)
    args = ["--snapshot", str(path), "--embedder", "openai"]
    monkeypatch.setenv("TKG_EMBED_MODEL", "fake-embed")
    code, _, err = run(capsys, "ingest", str(facts), *args)
    assert code == 2 and "set TKG_EMBED_DIM" in err
    with FakeOpenAIServer() as server:
        monkeypatch.setenv("TKG_EMBED_BASE_URL", server.base_url)
        monkeypatch.setenv("TKG_EMBED_DIM", "8")
        assert run(capsys, "ingest", str(facts), *args)[0] == 0
        code, out, _ = run(capsys, "search", "Alice", *args)
        assert code == 0 and "Alice works at Globex" in out
    code, out, _ = run(capsys, "stats", "--snapshot", str(path))
    assert "openai:fake-embed:8 (8-d; --embedder openai (with TKG_EMBED_MODEL=fake-embed TKG_EMBED_DIM=8))" in out


# -- demo ------------------------------------------------------------------------------------------------------------


def as_of_lines(out: str) -> tuple[str, str]:
    past = next(line for line in out.splitlines() if line.strip().startswith("as of 2021-06-01"))
    now = next(line for line in out.splitlines() if line.strip().startswith("now ("))
    return past, now


def test_demo_offline_with_a_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "demo.tkg"
    code, out, err = run(capsys, "demo", "--snapshot", str(path), "--embedder", "hash")
    assert code == 0, err
    sections = out.split("\n\n")
    assert sections[0] == "tkg demo: a temporal knowledge graph (embedder hash-384-tri, LLM none)"
    assert sections[1].splitlines() == [
        "[1] ingest",
        "  15 structured facts (demo_facts.jsonl) through add_facts, no LLM involved",
        "  12 chat messages (demo_messages.jsonl) stored as episodes, speakers as entities",
        "  (set TKG_LLM_BASE_URL to an OpenAI-compatible endpoint to extract facts from messages)",
        "  memory holds 13 episodes, 12 entities, 15 facts; LLM calls: 0",
    ]
    found = sections[2].splitlines()
    assert found[0] == '[2] tkg search "Who is hiring backend engineers?" --limit 3'
    # each kind's title, then its three best with their scores
    assert [line for line in found[1:] if not line.startswith("    ")] == ["  facts", "  entities", "  episodes"]
    assert sum(bool(re.match(r"    \d\.\d{4}  \S", line)) for line in found) == 9
    assert "Lumen Labs is hiring backend engineers" in sections[2]  # a message episode found by search
    assert sections[3].startswith('[3] tkg context "Where does Alice live and work?" --limit 4: the text an agent')
    assert "\n  <FACTS>\n" in sections[3] and "\n  </FACTS>" in sections[3]
    past, now = as_of_lines(out)
    assert past == "  as of 2021-06-01   Alice works at Acme as a data engineer (2019-03-01 - 2023-02-28)"
    assert re.fullmatch(
        r"  now \(\d{4}-\d\d-\d\d\)   Alice works at Globex as a staff engineer \(2023-03-01 - present\)", now
    )
    saved = f"saved {path} ({path.stat().st_size:,} bytes); try: tkg search Alice --store {path} --embedder hash"
    assert out.endswith(f"\n\n{saved} --as-of 2021-06-01\n")
    memory = Memory.load(path, embedder=HashEmbedder())
    assert memory.stats()["records"]["episode"] == 13
    code, out, _ = search(capsys, path, "Where does Alice work?", "--as-of", "2021-06-01", "--group", "demo")
    assert "Alice works at Acme as a data engineer  (2019-03-01 - 2023-02-28)" in out
    # the demo never overwrites a file
    before = path.read_bytes()
    code, out, err = run(capsys, "demo", "--snapshot", str(path), "--embedder", "hash")
    assert (code, out) == (2, "") and "already holds a memory" in err
    assert path.read_bytes() == before
    # nor a memory that lives in its journal alone (what a server or Memory.open leaves when stopped before its
    # first snapshot): it was replaced, and its journal deleted
    kept = tmp_path / "kept.tkg"
    with Memory.open(kept, embedder=HashEmbedder()) as memory:
        memory.add_facts([FactInput("Ann", "LIVES_IN", "Oslo")], group_id="precious")
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    code, out, err = run(capsys, "demo", "--snapshot", str(kept), "--embedder", "hash")
    assert (code, out) == (2, "") and "already holds a memory" in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files


def test_demo_with_the_default_embedder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "demo.tkg"
    code, out, err = run(capsys, "demo", "--snapshot", str(path))
    assert code == 0, err
    past, now = as_of_lines(out)
    assert "Alice works at Acme" in past and "(2019-03-01 - 2023-02-28)" in past
    assert "Alice works at Globex" in now and "(2023-03-01 - present)" in now
    assert run(capsys, "stats", "--snapshot", str(path))[0] == 0


# -- the installed entry point ---------------------------------------------------------------------------------------


def test_module_entry_point_in_a_subprocess(snap: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tkg.cli", "stats", "--snapshot", str(snap)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "facts        3" in done.stdout
    script = Path(sys.executable).parent / "tkg"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "tkg.cli"]
    missing = tmp_path / "missing.tkg"
    done = subprocess.run(
        [*command, "search", "q", "--snapshot", str(missing), "--embedder", "hash"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("tkg: error: snapshot") and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "command",
    [
        ["export", "--embedder", "hash"],
        ["graph", "Alice"],
        ["timeline", "Alice"],
    ],
)
@pytest.mark.parametrize("target", ["snapshot", "journal"])
def test_an_output_file_that_is_the_memory_is_refused(
    snap: Path, capsys: pytest.CaptureFixture[str], command: list[str], target: str
) -> None:
    out = snap if target == "snapshot" else snap.with_name(f"{snap.name}.journal.000001")
    before = snap.read_bytes()
    code, _, err = run(capsys, *command, "--snapshot", str(snap), "--out", str(out))
    assert code == 2 and "is the memory itself" in err
    assert snap.read_bytes() == before
    assert target == "snapshot" or not out.exists()


def test_a_failed_import_into_a_new_snapshot_leaves_no_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    new = tmp_path / "new.tkg"
    code, _, err = run(capsys, "import", str(tmp_path / "missing.jsonl"), "--snapshot", str(new), "--embedder", "hash")
    assert code == 2 and "missing.jsonl" in err
    (tmp_path / "bad.jsonl").write_text("{not json\n", encoding="utf-8")
    code, _, err = run(capsys, "import", str(tmp_path / "bad.jsonl"), "--snapshot", str(new), "--embedder", "hash")
    assert code == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


def test_a_failed_ingest_into_a_new_store_leaves_no_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An ingestion refused once the memory was opened (a group id that is none) left an empty journal."""
    path = write_jsonl(tmp_path / "in.jsonl", [MESSAGES[0]])
    args = ("ingest", str(path), "--snapshot", str(tmp_path / "m.tkg"), "--embedder", "hash", "--no-llm")
    code, _, err = run(capsys, *args, "--group", "bad group!")
    assert code == 2 and "group_id 'bad group!' is invalid" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl"]
    code, _, err = run(capsys, *args, "--group", "g")  # what it writes, it keeps
    assert code == 0, err
    assert Memory.load(tmp_path / "m.tkg", embedder=HashEmbedder()).stats()["records"]["episode"] == 1


def test_read_only_commands_open_a_memory_whose_journal_has_no_snapshot_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A server stopped before its first snapshot leaves a journal alone: stats and the pictures read it (the
    vectors' size from the journal's records), and change no file."""
    store = tmp_path / "m.tkg"
    script = (
        "import os, sys\nfrom tkg import HashEmbedder, Memory\n"
        "m = Memory.open(sys.argv[1], embedder=HashEmbedder(dim=48))\n"
        "m.add_facts([{'subject': 'Ann', 'relation': 'LIVES_IN', 'object': 'Rome'}], group_id='g')\n"
        "os._exit(0)  # no close, no snapshot\n"
    )
    subprocess.run([sys.executable, "-c", script, str(store)], check=True, timeout=120)
    files = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert not store.exists() and sorted(files) == ["m.tkg.journal.000001", "m.tkg.lock"]  # the lock: released
    code, out, err = run(capsys, "stats", "--store", str(store))
    assert code == 0, err
    assert "none yet" in out and "(48-d; --embedder hash)" in out and re.search(r"facts\s+1\b", out)
    for command, out_name in (("graph", "g.html"), ("timeline", "t.svg")):
        code, out, err = run(capsys, command, "--store", str(store), "Ann", "--out", str(tmp_path / out_name))
        assert code == 0, err
        assert "Ann" in (tmp_path / out_name).read_text(encoding="utf-8")
        (tmp_path / out_name).unlink()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == files


def test_user_text_printed_to_a_terminal_shows_its_control_characters_as_escapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name holding an escape sequence ran in the user's terminal (it set the window title, cleared the screen)
    when a command printed it; a pipe or a file still gets the text as it is."""
    store = tmp_path / "m.tkg"
    memory = Memory(embedder=HashEmbedder())
    memory.add_facts([FactInput("Evil\x1b]0;pwned\x07", "KNOWS", "Bob")], group_id="g")
    memory.save(store)

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, shown in ((Terminal(), "Evil\\x1b]0;pwned\\x07"), (io.StringIO(), "Evil\x1b]0;pwned\x07")):
        monkeypatch.setattr(sys, "stdout", stream)
        assert main(["search", "Evil", "--store", str(store), "--embedder", "hash"]) == 0
        assert shown in stream.getvalue()
        assert ("\x1b" in stream.getvalue()) is (not isinstance(stream, Terminal))


def test_the_commands_tkg_suggests_can_be_pasted_whatever_the_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A path with a space was printed bare: pasting the suggested command gave "unrecognized arguments"."""
    import shlex

    path = tmp_path / "my demo.tkg"
    code, out, err = run(capsys, "demo", "--store", str(path), "--embedder", "hash")
    assert code == 0, err
    suggested = out.rstrip("\n").rsplit("try: ", 1)[1]
    words = shlex.split(suggested)
    assert words[:3] == ["tkg", "search", "Alice"] and words[words.index("--store") + 1] == str(path)
    code, _, err = run(capsys, *words[1:])
    assert code == 0, err
