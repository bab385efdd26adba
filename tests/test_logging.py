"""Standard logging: the library logs through module loggers and configures no handler; the command line and the
servers send tkg's records to stderr at --log-level; the HTTP service writes a structured access log."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from tkg import FactInput, FixedClock, HashEmbedder, Memory, ScriptedLLM
from tkg.cli import main
from tkg.errors import ExtractionFailedError, LLMError
from tkg.llm import GraphExtraction


def answer(prompt: object, model: type) -> GraphExtraction:
    return GraphExtraction.model_validate(
        {
            "entities": [{"name": "Ann", "label": "Person"}, {"name": "Oslo", "label": "Place"}],
            "facts": [{"source": "Ann", "relation": "LIVES_IN", "target": "Oslo", "fact": "Ann lives in Oslo"}],
        }
    )


def test_the_library_logs_episodes_failures_and_erasures_and_configures_no_handler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    memory = Memory(
        embedder=HashEmbedder(dim=32), llm=ScriptedLLM(handler=answer), clock=FixedClock("2025-01-01T00:00:00Z")
    )
    with caplog.at_level(logging.DEBUG, logger="tkg"):
        result = memory.add_episode("Ann: I live in Oslo.", group_id="g")
        failing = Memory(
            embedder=HashEmbedder(dim=32),
            llm=ScriptedLLM(handler=lambda p, m: (_ for _ in ()).throw(LLMError("model not loaded"))),
        )
        with pytest.raises(ExtractionFailedError):
            failing.add_episode("Bob: hello", group_id="h")
        memory.delete_group("g")
    by_name = {(r.name, r.levelname): r.getMessage() for r in caplog.records}
    episode_line = by_name[("tkg.ingest", "DEBUG")]
    assert result.episode.id in episode_line and "group g" in episode_line and "LLM calls" in episode_line
    assert "model not loaded" in by_name[("tkg.ingest", "WARNING")]
    assert "group g erased" in by_name[("tkg.memory", "INFO")]
    assert not logging.getLogger("tkg").handlers  # the application decides where records go


def test_the_command_line_logs_at_its_level_and_leaves_logging_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = tmp_path / "facts.jsonl"
    lines.write_text(json.dumps({"subject": "Ann", "relation": "LIVES_IN", "object": "Oslo"}) + "\n")
    snap = tmp_path / "m.tkg"
    args = ["ingest", str(lines), "--snapshot", str(snap), "--embedder", "hash", "--no-llm"]
    assert main(args) == 0
    assert "tkg.ingest" not in capsys.readouterr().err  # default: errors only, which the command reports itself
    again = ["ingest", str(lines), "--store", str(tmp_path / "m2.tkg"), "--embedder", "hash", "--no-llm"]
    assert main([*again, "--log-level", "debug"]) == 0  # another memory: a re-run into the same one adds nothing
    err = capsys.readouterr().err
    assert "DEBUG tkg.ingest: episode" in err
    assert not logging.getLogger("tkg").handlers and logging.getLogger("tkg").level == logging.NOTSET


def test_the_http_service_writes_an_access_log(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from tkg.http_service import create_app

    memory = Memory(embedder=HashEmbedder(dim=32))
    memory.add_facts([FactInput("Ann", "LIVES_IN", "Oslo")], group_id="g")
    client = TestClient(create_app(memory, {"secret-key": ["g"]}))
    with caplog.at_level(logging.INFO, logger="tkg.http.access"):
        assert (
            client.post("/v1/facts/search", json={"query": "Ann"}, headers={"X-API-Key": "secret-key"}).status_code
            == 200
        )
        assert client.get("/v1/groups").status_code == 401  # refused by the gate: logged too
    records = [r for r in caplog.records if r.name == "tkg.http.access"]
    assert [(r.method, r.path, r.status) for r in records] == [  # type: ignore[attr-defined]
        ("POST", "/v1/facts/search", 200),
        ("GET", "/v1/groups", 401),
    ]
    assert all(r.ms >= 0 for r in records)  # type: ignore[attr-defined]
    assert not any("secret-key" in r.getMessage() for r in records)  # keys are never logged
