"""``tkg ingest`` on long inputs: resumable (a re-run adds nothing, an extended file adds only its new lines),
progress with rate and time left, extraction calls concurrent through the bulk path, and Ctrl-C stopping after
the episodes in flight with everything done saved and a re-run finishing the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fake_openai_server import FakeOpenAIServer
from helpers_doors import ROOT
from test_cli import FACTS, MESSAGES, answer_by_schema, no_llm_env, run, write_jsonl

from tkg import HashEmbedder, Memory
from tkg.cli_ingest import episode_ids
from tkg.cli_input import parse_jsonl

__all__ = ["no_llm_env"]  # the fixture, used by name


def chat_lines(n: int) -> list[dict[str, Any]]:
    return [
        {"speaker": "User" if i % 2 == 0 else "Assistant", "text": f"turn {i} about topic {i % 5}",
         "reference_time": f"2024-05-{1 + i // 24:02d}T{i % 24:02d}:00:00Z"}
        for i in range(n)
    ]  # fmt: skip


def contents(path: Path) -> Counter[str]:
    return Counter(e.content for e in Memory.load(path, embedder=HashEmbedder()).episodes())


def test_episode_ids_are_stable_and_keep_repeated_lines_apart() -> None:
    text = "\n".join(['{"content": "User: ok"}', '{"content": "User: ok"}', '{"content": "User: hi", "id": "mine"}'])
    items = parse_jsonl("in.jsonl", text)
    first, again = episode_ids(items, "g"), episode_ids(parse_jsonl("in.jsonl", text), "g")
    assert first == again and len(set(first)) == 3 and first[2] == "mine"
    assert episode_ids(items, "other")[:2] != first[:2]  # ids are global across groups: the group is part of them


def test_a_rerun_adds_nothing_and_an_extended_file_only_its_new_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_llm_env: None
) -> None:
    store = tmp_path / "m.tkg"
    lines = [*FACTS, *MESSAGES, {"content": "User: ok"}, {"content": "User: ok"}]
    source = write_jsonl(tmp_path / "in.jsonl", lines)
    code, out, err = run(capsys, "ingest", str(source), "--store", str(store), "--embedder", "hash")
    assert code == 0, err
    first = contents(store)
    assert first["User: ok"] == 2 and sum(first.values()) == 6  # one episode for the three fact lines

    code, out, err = run(capsys, "ingest", str(source), "--store", str(store), "--embedder", "hash")
    assert (code, err) == (0, "")
    assert "skipped 8 lines already in the memory (an earlier run)" in out
    assert "added 0 episodes, 0 entities, 0 facts" in out
    assert contents(store) == first

    write_jsonl(source, [*lines, {"content": "User: ok"}, {"content": "Bob: I moved to Lisbon."}])
    code, out, err = run(capsys, "ingest", str(source), "--store", str(store), "--embedder", "hash")
    assert code == 0, err
    assert "skipped 8 lines" in out and "added 2 episodes" in out
    assert contents(store) == first + Counter({"User: ok": 1, "Bob: I moved to Lisbon.": 1})

    # another group is another memory: everything is added again there
    code, out, _ = run(capsys, "ingest", str(source), "--store", str(store), "--embedder", "hash", "--group", "g2")
    assert code == 0 and "skipped" not in out and "added 8 episodes" in out


def test_progress_bar_shows_rate_and_counts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_llm_env: None
) -> None:
    source = write_jsonl(tmp_path / "in.jsonl", chat_lines(12))
    args = ["ingest", str(source), "--store", str(tmp_path / "m.tkg"), "--embedder", "hash"]
    code, _, err = run(capsys, *args, "--progress")
    assert code == 0, err
    assert "ingest: 100%" in err and "12/12" in err and "line/s" in err
    code, _, err = run(capsys, *args)  # not a terminal: no bar
    assert (code, err) == (0, "")


def test_extraction_calls_run_concurrently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    in_flight, most, lock = 0, 0, threading.Lock()

    def slow(request: dict[str, Any]) -> dict[str, Any]:
        nonlocal in_flight, most
        with lock:
            in_flight += 1
            most = max(most, in_flight)
        time.sleep(0.1)
        with lock:
            in_flight -= 1
        return answer_by_schema(request)

    source = write_jsonl(tmp_path / "in.jsonl", chat_lines(8))
    with FakeOpenAIServer(chat=slow) as server:
        monkeypatch.setenv("TKG_LLM_BASE_URL", server.base_url)
        monkeypatch.setenv("TKG_LLM_MODEL", "fake-model")
        args = ["ingest", str(source), "--store", str(tmp_path / "m.tkg"), "--embedder", "hash"]
        code, out, err = run(capsys, *args, "--concurrency", "4")
    assert code == 0, err
    assert "LLM calls: 8" in out
    assert most >= 3  # one at a time would take 0.8 s; the bulk path runs them together


@pytest.mark.slow  # runs tkg in a child process and interrupts it
def test_ctrl_c_keeps_what_is_done_and_a_rerun_finishes(tmp_path: Path) -> None:
    calls = 0

    def slow(request: dict[str, Any]) -> dict[str, Any]:
        nonlocal calls
        calls += 1
        time.sleep(0.05)
        return answer_by_schema(request)

    lines = chat_lines(60)
    source, store = write_jsonl(tmp_path / "in.jsonl", lines), tmp_path / "m.tkg"
    command = [sys.executable, "-m", "tkg.cli", "ingest", str(source), "--store", str(store), "--embedder", "hash"]
    with FakeOpenAIServer(chat=slow) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TKG_")}
        env |= {"TKG_LLM_BASE_URL": server.base_url, "TKG_LLM_MODEL": "fake-model"}
        child = subprocess.Popen(
            [*command, "--concurrency", "2"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while calls < 10:
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.02)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=60)
        assert child.returncode == 130, err
        assert "interrupted: finishing the work in flight, then saving" in err
        assert "again to resume (done lines are skipped)" in err
        done = contents(store)
        assert 0 < sum(done.values()) < 60 and f"stopped: {sum(done.values())} of 60 lines done and saved" in err
        assert all(n == 1 for n in done.values())
        assert {e.status.value for e in Memory.load(store, embedder=HashEmbedder()).episodes()} == {"extracted"}

        again = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert f"skipped {sum(done.values())} lines already in the memory" in again.stdout
    finished = contents(store)
    assert sum(finished.values()) == 60 and all(n == 1 for n in finished.values())


def test_help_documents_the_input_format(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "ingest", "--help")
    assert code == 0
    for part in ('message line: {"content":', 'fact line: {"subject":', '"reference_time"', "resuming:", "130 stopped"):
        assert part in out


def test_a_facts_csv_comes_in_with_its_valid_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_llm_env: None
) -> None:
    """tkg's own facts CSV (from another memory) and a plain edge list both ingest; transaction times are the
    import's, valid times are the file's; a re-run adds nothing; a bad row names its line."""
    source = tmp_path / "source.tkg"
    assert run(capsys, "ingest", str(write_jsonl(tmp_path / "f.jsonl", FACTS)), "--store", str(source), "--embedder",
               "hash")[0] == 0  # fmt: skip
    exported = tmp_path / "facts.csv"
    assert run(capsys, "export", "--store", str(source), "--embedder", "hash", "--format", "csv", "--out",
               str(exported))[0] == 0  # fmt: skip
    target = tmp_path / "target.tkg"
    code, out, err = run(capsys, "ingest", str(exported), "--store", str(target), "--embedder", "hash")
    assert code == 0, err
    assert "read " in out and "3 facts" in out

    def periods(path: Path) -> set[tuple[str, Any, Any]]:
        memory = Memory.load(path, embedder=HashEmbedder())
        return {(f.fact, f.valid_at, f.invalid_at) for f in memory.records("fact")}

    assert periods(target) == periods(source)
    code, out, _ = run(capsys, "ingest", str(exported), "--store", str(target), "--embedder", "hash")
    assert code == 0 and "skipped 3 lines" in out

    edges = tmp_path / "edges.csv"
    edges.write_text("Source,Target,Type,weight\nAnn,Acme,WORKS_AT,1\n\nBen,Oslo,LIVES_IN,2\n", encoding="utf-8")
    code, out, err = run(capsys, "ingest", str(edges), "--store", str(target), "--embedder", "hash")
    assert code == 0, err
    assert {"Ann works at Acme", "Ben lives in Oslo"} <= {
        f.fact for f in Memory.load(target, embedder=HashEmbedder()).records("fact")
    }

    before = target.read_bytes()
    edges.write_text("source,target,relation,valid_at\nAnn,Acme,WORKS_AT,2020-01-01\nBen,Oslo,LIVES_IN,soon\n")
    code, out, err = run(capsys, "ingest", str(edges), "--store", str(target), "--embedder", "hash")
    assert (code, out) == (2, "")
    assert err == f"tkg: error: {edges}:2: \"valid_at\" '2020-01-01' is naive (no UTC offset): " + (
        'write e.g. "2024-05-01T12:00:00Z"\n'
    )
    edges.write_text(
        "source,target,relation,valid_at\nAnn,Acme,WORKS_AT,2020-01-01T00:00:00Z\nBen,Oslo,LIVES_IN,soon\n"
    )
    code, _, err = run(capsys, "ingest", str(edges), "--store", str(target), "--embedder", "hash")
    assert err.startswith(f"tkg: error: {edges}:3: \"valid_at\" 'soon' is not an ISO-8601 time")
    edges.write_text("from,to\nAnn,Acme\n", encoding="utf-8")
    code, _, err = run(capsys, "ingest", str(edges), "--store", str(target), "--embedder", "hash")
    assert code == 2 and "the header lacks subject, relation, object" in err
    assert target.read_bytes() == before


def test_a_line_whose_own_id_is_in_use_in_another_group_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_llm_env: None
) -> None:
    """A line's own ``"id"`` found in another group is not "done before": the run stops, naming the line."""
    store = tmp_path / "m.tkg"
    source = write_jsonl(tmp_path / "in.jsonl", [{"content": "User: hi", "id": "mine"}])
    code, _, err = run(capsys, "ingest", str(source), "--store", str(store), "--embedder", "hash")
    assert code == 0, err
    code, _, err = run(capsys, "ingest", str(source), "--store", str(store), "--embedder", "hash", "--group", "g2")
    assert code != 0 and "in.jsonl:1" in err and "in use in group" in err
    assert [(e.id, e.group_id) for e in Memory.load(store, embedder=HashEmbedder()).episodes()] == [("mine", "default")]


def test_a_fact_line_tkg_cannot_store_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_llm_env: None
) -> None:
    """A subject longer than a name may be, or facts whose episode is over max_episode_chars, were found only
    when their batch was written: the lines before them were in the memory already, and the README promises
    that a bad line leaves the memory unchanged."""
    store = tmp_path / "m.tkg"
    good = {"subject": "Ann", "relation": "LIVES_IN", "object": "Oslo"}
    for bad, line in [
        ({"subject": "A" * 600, "relation": "KNOWS", "object": "Bob"}, "3"),
        ({**good, "fact": "x" * 100_100}, "3"),
        ({"subject": "Bob", "relation": "!!!", "object": "Boston"}, "3"),  # was stored as RELATES_TO
    ]:
        source = write_jsonl(tmp_path / "in.jsonl", [{"content": "User: hello"}, good, bad])
        code, _, err = run(capsys, "ingest", str(source), "--store", str(store), "--embedder", "hash")
        assert code == 2 and err.startswith(f"tkg: error: {source}:{line}: "), err
        assert not store.exists() and not list(tmp_path.glob("m.tkg*"))


def test_valid_jsonl_with_unicode_line_separators_and_a_byte_order_mark_comes_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_llm_env: None
) -> None:
    """A JSON string may hold U+2028, U+2029 or U+0085 unescaped, and the file was cut there as at a line end; a
    byte order mark first (Excel's "CSV UTF-8") made the header lack "subject"."""
    store = tmp_path / "m.tkg"
    text = "Ann: one\u2028two\u2029three\u0085four"
    source = tmp_path / "in.jsonl"
    source.write_text("\ufeff" + json.dumps({"content": text}, ensure_ascii=False) + "\n", encoding="utf-8")
    code, _, err = run(capsys, "ingest", str(source), "--store", str(store), "--embedder", "hash")
    assert code == 0, err
    assert [e.content for e in Memory.load(store, embedder=HashEmbedder()).episodes()] == [text]
    table = tmp_path / "facts.csv"
    table.write_text("\ufeffsubject,relation,object\nAnn,LIVES_IN,Oslo\n", encoding="utf-8")
    code, _, err = run(capsys, "ingest", str(table), "--store", str(store), "--embedder", "hash")
    assert code == 0, err
