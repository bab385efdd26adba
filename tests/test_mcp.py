"""The MCP server, end to end: the SDK's own client talks to ``python -m tkg.mcp_server`` in a subprocess, over stdio
and over streamable HTTP. Every tool is called; bad arguments come back as tool errors and change nothing."""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from helpers_doors import BETA_MARKER, ROOT, free_port, module_process, two_tenants

from tkg import ConfigurationError, HashEmbedder, Memory

mcp = pytest.importorskip("mcp")
from mcp import Client, StdioServerParameters  # noqa: E402
from mcp_types import CallToolResult  # noqa: E402

TOOLS = {
    "add_episode",
    "add_facts",
    "search_facts",
    "search_entities",
    "search_communities",
    "get_context",
    "list_episodes",
    "get_episode",
    "delete_episode",
    "invalidate_fact",
    "entity_history",
    "list_groups",
    "episode_status",
}


def stdio(*args: str) -> StdioServerParameters:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TKG_")}
    return StdioServerParameters(
        command=sys.executable, args=["-m", "tkg.mcp_server", "--embedder", "hash", *args], env=env, cwd=str(ROOT)
    )


def run(server: Any, scenario: Callable[[Client], Awaitable[None]]) -> None:
    async def main() -> None:
        async with Client(server, read_timeout_seconds=60) as client:
            await scenario(client)

    anyio.run(main)


def data(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert result.structured_content is not None
    return result.structured_content


def error_text(result: CallToolResult) -> str:
    assert result.is_error, result.structured_content
    return " ".join(getattr(block, "text", "") for block in result.content)


def snapshot_state(path: Path) -> tuple[bytes, dict[str, Any]]:
    return path.read_bytes(), Memory.load(path, embedder=HashEmbedder()).stats()


# ----------------------------------------------------------------------------------------------------------


@pytest.mark.slow  # starts a server process
def test_stdio_every_tool(tmp_path: Path) -> None:
    """One server over stdio, started from the demo memory and saving to a snapshot: every tool, its schema,
    persistence after each write, and refusals that leave the snapshot byte for byte as it was."""
    snapshot = tmp_path / "memory.tkg"

    async def scenario(client: Client) -> None:
        listed = (await client.list_tools()).tools
        assert {t.name for t in listed} == TOOLS
        for tool in listed:
            assert tool.description and len(tool.description) > 60, tool.name
            for name, prop in tool.input_schema.get("properties", {}).items():
                assert prop.get("description") or "$ref" in json.dumps(prop), f"{tool.name}.{name} is undocumented"
            assert tool.output_schema is not None, tool.name
        by_name = {t.name: t for t in listed}
        assert by_name["delete_episode"].annotations.destructive_hint is True
        assert by_name["search_facts"].annotations.read_only_hint is True

        groups = data(await client.call_tool("list_groups", {}))["groups"]
        assert groups == [{"group_id": "demo", "episodes": 13, "entities": 12, "facts": 15}]

        # search facts now, as of 2021, as known before anything was recorded, and with history
        now = data(await client.call_tool("search_facts", {"query": "Where does Alice work?", "limit": 20}))
        works = {f["target"] for f in now["facts"] if f["relation"] == "WORKS_AT" and f["source"] == "Alice"}
        assert works == {"Globex"}
        assert all(f["valid_at"].endswith("Z") and f["created_at"].endswith("Z") for f in now["facts"])
        past = data(
            await client.call_tool(
                "search_facts", {"query": "Where does Alice work?", "limit": 20, "as_of": "2021-06-01T00:00:00Z"}
            )
        )
        assert {f["target"] for f in past["facts"] if f["relation"] == "WORKS_AT" and f["source"] == "Alice"} == {
            "Acme"
        }
        before = data(
            await client.call_tool(
                "search_facts", {"query": "Alice", "known_at": "2000-01-01T00:00:00+02:00", "limit": 5}
            )
        )
        assert before["facts"] == []
        history = data(
            await client.call_tool(
                "search_facts", {"query": "Where does Alice work?", "limit": 20, "include_invalidated": True}
            )
        )
        assert {"Acme", "Globex"} <= {f["target"] for f in history["facts"]}

        entities = data(await client.call_tool("search_entities", {"query": "Alice", "limit": 3}))["entities"]
        alice = next(e for e in entities if e["name"] == "Alice")
        assert "Person" in alice["labels"] and entities[0]["score"] >= entities[-1]["score"]

        communities = data(await client.call_tool("search_communities", {"query": "Alice Globex", "limit": 2}))
        assert communities["communities"] and communities["communities"][0]["summary"]
        assert communities["facts"] == [] and communities["entities"] == []

        context = await client.call_tool("get_context", {"query": "Where does Alice work?", "max_chars": 600})
        text = data(context)["result"]
        assert "Alice works at Globex as a staff engineer (2023-03-01 00:00 UTC - present)" in text
        assert len(text) <= 600
        old = data(
            await client.call_tool(
                "get_context", {"query": "Where does Alice work?", "as_of": "2021-06-01T00:00:00Z", "limit": 5}
            )
        )["result"]
        assert "Acme" in old and "Globex as a staff engineer" not in old

        timeline = data(await client.call_tool("entity_history", {"entity_id": alice["id"]}))
        assert timeline["entity"]["name"] == "Alice"
        acme = next(f for f in timeline["facts"] if f["target"] == "Acme")
        assert (acme["valid_at"], acme["invalid_at"]) == ("2019-03-01T00:00:00Z", "2023-02-28T00:00:00Z")
        assert {"created_at", "expired_at", "invalidated_by"} <= set(acme)
        starts = [f["valid_at"] for f in timeline["facts"]]
        assert starts == sorted(starts)

        page = data(await client.call_tool("list_episodes", {"limit": 5}))
        assert page["total"] == 13 and len(page["episodes"]) == 5
        times = [e["reference_time"] for e in page["episodes"]]
        assert times == sorted(times, reverse=True)
        second = data(await client.call_tool("list_episodes", {"limit": 5, "offset": 5}))
        assert not {e["id"] for e in second["episodes"]} & {e["id"] for e in page["episodes"]}

        # -- refusals: each is a tool error that says what is wrong, and nothing is written -----------------
        saved = snapshot_state(snapshot)
        refusals: list[tuple[str, dict[str, Any], str]] = [
            ("search_facts", {"query": "Alice", "as_of": "2021-06-01T00:00:00"}, "no UTC offset"),
            ("search_facts", {"query": "Alice", "as_of": "2021-06-01"}, "no UTC offset"),
            ("search_facts", {"query": "Alice", "known_at": "yesterday"}, "not an ISO-8601 timestamp"),
            ("search_facts", {"query": "Alice", "limit": 0}, "limit"),
            ("search_facts", {"query": "Alice", "limit": 10_000}, "limit"),
            ("search_facts", {"query": "Alice", "limit": True}, "limit"),
            ("search_facts", {"query": "Alice", "limit": 5.5}, "limit"),
            ("search_facts", {"query": "Alice", "include_invalidated": "yes"}, "include_invalidated"),
            ("get_context", {"query": "Alice", "include_episodes": 1}, "include_episodes"),
            ("search_facts", {"query": ""}, "query"),
            ("search_facts", {"query": "Alice", "group_ids": ["nobody"]}, "group 'nobody' not found"),
            ("search_entities", {"query": "Alice", "group_ids": ["bad group!"]}, "group_ids"),
            ("add_episode", {"content": "Ann: hi", "reference_time": "2024-05-01T10:00:00"}, "no UTC offset"),
            ("add_episode", {"content": "{not json", "source": "json"}, "not valid JSON"),
            ("add_episode", {"content": "   "}, "empty"),
            ("add_episode", {"content": "Ann: hi", "source": "email"}, "source"),
            ("add_facts", {"facts": []}, "facts"),
            ("add_facts", {"facts": [{"subject": "Ann", "relation": "KNOWS"}]}, "object"),
            ("add_facts", {"facts": [{"subject": "A", "relation": "R", "object": "B", "when": "x"}]}, "when"),
            (
                "add_facts",
                {"facts": [{"subject": "A", "relation": "R", "object": "B", "valid_at": "2020-01-01T00:00:00"}]},
                "no UTC offset",
            ),
            (
                "add_facts",
                {
                    "facts": [
                        {
                            "subject": "A",
                            "relation": "R",
                            "object": "B",
                            "valid_at": "2020-01-01T00:00:00Z",
                            "invalid_at": "2019-01-01T00:00:00Z",
                        }
                    ]
                },
                "before valid_at",
            ),
            ("delete_episode", {"episode_id": "0" * 32}, "no episode"),
            ("delete_episode", {"episode_id": "../etc/passwd"}, "episode_id"),
            ("get_episode", {"episode_id": "f" * 32}, "no episode"),
            ("entity_history", {"entity_id": "nope"}, "no entity"),
            ("episode_status", {"episode_id": "0" * 32}, "no episode"),
            ("get_context", {"query": "Alice", "max_chars": -1}, "max_chars"),
            ("list_episodes", {"limit": 100_000}, "limit"),
            ("search_facts", {"query": "Alice", "asof": "2021-06-01T00:00:00Z"}, "takes no argument(s) ['asof']"),
            ("add_episode", {"content": "Ann: hi", "group": "team"}, "takes no argument(s) ['group']"),
        ]
        for tool, arguments, expected in refusals:
            message = error_text(await client.call_tool(tool, arguments))
            assert expected in message, (tool, arguments, message)
        assert snapshot_state(snapshot) == saved

        # -- writes, each saved to the snapshot at once -------------------------------------------------------
        message = data(
            await client.call_tool(
                "add_episode",
                {
                    "content": "Dana: I started at Initech last week.",
                    "reference_time": "2024-06-03T09:00:00+02:00",
                    "source_description": "chat",
                },
            )
        )
        assert message["episode"]["reference_time"] == "2024-06-03T09:00:00+02:00"  # the speaker's offset kept
        assert message["episode"]["group_id"] == "demo" and message["episode"]["source"] == "message"
        text = data(
            await client.call_tool("add_episode", {"content": "Quarterly notes about Initech.", "source": "text"})
        )
        document = data(
            await client.call_tool(
                "add_episode", {"content": json.dumps({"customer": "Initech", "tier": 2}), "source": "json"}
            )
        )
        assert json.loads(document["episode"]["content"]) == {"customer": "Initech", "tier": 2}
        facts = data(
            await client.call_tool(
                "add_facts",
                {
                    "facts": [
                        {
                            "subject": "Dana",
                            "relation": "works at",
                            "object": "Initech",
                            "valid_at": "2024-05-27T00:00:00Z",
                            "subject_label": "Person",
                        }
                    ],
                    "group_id": "demo",
                },
            )
        )
        assert [f["relation"] for f in facts["facts"]] == ["WORKS_AT"]
        on_disk = Memory.load(snapshot, embedder=HashEmbedder())
        assert len(on_disk.records("episode")) == 17 and len(on_disk.records("fact")) == 16
        found = data(await client.call_tool("search_facts", {"query": "Where does Dana work?"}))
        assert any(f["target"] == "Initech" for f in found["facts"])
        status = data(await client.call_tool("episode_status", {"episode_id": text["episode"]["id"]}))
        assert status == {
            "episode_id": text["episode"]["id"],
            "state": "done",
            "error": None,
            "retryable": False,
            "result": None,
        }
        fetched = data(await client.call_tool("get_episode", {"episode_id": text["episode"]["id"]}))
        assert fetched["content"] == "Quarterly notes about Initech." and fetched["source"] == "text"
        dana = next(f for f in found["facts"] if f["target"] == "Initech")
        ended = data(await client.call_tool("invalidate_fact", {"fact_id": dana["id"], "at": "2024-07-01T00:00:00Z"}))
        assert ended["invalid_at"] == "2024-07-01T00:00:00Z"
        assert "already ends" in error_text(await client.call_tool("invalidate_fact", {"fact_id": dana["id"]}))
        assert "no UTC offset" in error_text(
            await client.call_tool("invalidate_fact", {"fact_id": dana["id"], "at": "2024-07-01T00:00:00"})
        )

        removed = data(await client.call_tool("delete_episode", {"episode_id": facts["episode"]["id"]}))
        assert removed["deleted_facts"] == [facts["facts"][0]["id"]]
        gone = data(await client.call_tool("search_facts", {"query": "Where does Dana work?"}))
        assert not any(f["target"] == "Initech" for f in gone["facts"])
        assert Memory.load(snapshot, embedder=HashEmbedder()).stats()["records"]["fact"] == 15
        error = error_text(await client.call_tool("delete_episode", {"episode_id": facts["episode"]["id"]}))
        assert "no episode" in error

    run(stdio("--demo", "--snapshot", str(snapshot), "--no-llm"), scenario)


@pytest.mark.slow  # starts a server process
def test_stdio_server_limited_to_one_group(tmp_path: Path) -> None:
    """--group limits every tool to that group: another group's data, and its records' ids, are 'not found'."""
    snapshot = tmp_path / "tenants.tkg"
    memory = two_tenants()
    memory.save(snapshot)
    beta_episode = next(e.id for e in memory.records("episode", "beta"))
    beta_entity = next(e.id for e in memory.records("entity", "beta"))
    beta_fact = next(f.id for f in memory.records("fact", "beta"))
    before = snapshot.read_bytes()

    async def scenario(client: Client) -> None:
        assert data(await client.call_tool("list_groups", {}))["groups"][0]["group_id"] == "demo"
        for tool, arguments in [
            ("search_facts", {"query": "What does Quinn own?", "include_invalidated": True}),
            ("search_entities", {"query": "Quinn"}),
            ("search_communities", {"query": "Quinn Reykjavik"}),
            ("get_context", {"query": "What does Quinn own?", "include_episodes": True}),
            ("list_episodes", {"limit": 200}),
        ]:
            # The queries name beta's entities (never the marker itself, which the answer would echo).
            answer = json.dumps(data(await client.call_tool(tool, arguments)))
            assert BETA_MARKER not in answer and '"beta"' not in answer, tool
        for tool, arguments in [
            ("search_facts", {"query": BETA_MARKER, "group_ids": ["beta"]}),
            ("list_episodes", {"group_ids": ["beta"]}),
            ("get_episode", {"episode_id": beta_episode}),
            ("delete_episode", {"episode_id": beta_episode}),
            ("invalidate_fact", {"fact_id": beta_fact}),
            ("entity_history", {"entity_id": beta_entity}),
            ("episode_status", {"episode_id": beta_episode}),
            ("add_episode", {"content": "Eve: hello", "group_id": "beta"}),
            ("add_facts", {"facts": [{"subject": "E", "relation": "R", "object": "F"}], "group_id": "beta"}),
        ]:
            message = error_text(await client.call_tool(tool, arguments))
            assert any(s in message for s in ("not found", "no episode", "no entity", "no fact")), (tool, message)
            assert BETA_MARKER not in message
        # naming a group that exists nowhere reads exactly like naming beta
        unknown = error_text(await client.call_tool("search_facts", {"query": "x", "group_ids": ["gamma"]}))
        foreign = error_text(await client.call_tool("search_facts", {"query": "x", "group_ids": ["beta"]}))
        assert unknown.replace("gamma", "beta") == foreign

    run(stdio("--snapshot", str(snapshot), "--group", "demo"), scenario)
    assert snapshot.read_bytes() == before


@pytest.mark.slow  # starts a server process
def test_stdio_background_ingestion(tmp_path: Path) -> None:
    """--background adds queue_episode: it returns at once, the worker finishes the episode, and the snapshot
    holds it as soon as it is accepted and again once it is done."""
    snapshot = tmp_path / "memory.tkg"

    async def scenario(client: Client) -> None:
        assert {t.name for t in (await client.list_tools()).tools} == TOOLS | {"queue_episode"}
        queued = data(
            await client.call_tool(
                "queue_episode", {"content": "Hana: I moved to Kyoto.", "reference_time": "2024-07-01T00:00:00Z"}
            )
        )
        assert queued["state"] in {"queued", "running", "done"} and queued["error"] is None
        episode_id = queued["episode_id"]
        on_disk = Memory.load(snapshot, embedder=HashEmbedder()).get_many("episode", [episode_id])[0]
        assert on_disk is not None and on_disk.content == "Hana: I moved to Kyoto."
        with anyio.fail_after(20):
            while (status := data(await client.call_tool("episode_status", {"episode_id": episode_id})))[
                "state"
            ] != "done":
                await anyio.sleep(0.05)
        assert status["result"]["episode"]["status"] == "stored"
        refused = error_text(
            await client.call_tool("queue_episode", {"content": "Ivo: hi", "reference_time": "2024-07-01T00:00:00"})
        )
        assert "no UTC offset" in refused
        assert data(await client.call_tool("list_episodes", {"limit": 1}))["total"] == 14

    run(stdio("--demo", "--snapshot", str(snapshot), "--no-llm", "--background"), scenario)
    episodes = list(Memory.load(snapshot, embedder=HashEmbedder()).records("episode"))
    assert len(episodes) == 14 and {e.status.value for e in episodes} <= {"stored", "extracted"}


@pytest.mark.slow  # starts a server process
def test_streamable_http(tmp_path: Path) -> None:
    """The same server over streamable HTTP on 127.0.0.1 (the SDK client's URL transport)."""
    port = free_port()
    args = ["--demo", "--embedder", "hash", "--no-llm", "--transport", "http", "--port", str(port)]

    async def scenario(client: Client) -> None:
        assert {t.name for t in (await client.list_tools()).tools} == TOOLS
        added = data(
            await client.call_tool("add_episode", {"content": "Frank: I joined Hooli.", "source_description": "http"})
        )
        page = data(await client.call_tool("list_episodes", {"limit": 1}))
        assert page["total"] == 14
        assert data(await client.call_tool("get_episode", {"episode_id": added["episode"]["id"]}))["content"] == (
            "Frank: I joined Hooli."
        )
        text = data(await client.call_tool("get_context", {"query": "Where does Alice work?"}))["result"]
        assert "Globex" in text
        assert "no UTC offset" in error_text(
            await client.call_tool("search_facts", {"query": "Alice", "as_of": "2021-01-01T00:00:00"})
        )

    with module_process("tkg.mcp_server", args, port):
        run(f"http://127.0.0.1:{port}/mcp", scenario)


def test_command_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tkg.mcp_server import main

    def error() -> str:
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err.startswith("tkg-mcp: error: ") and captured.err.count("\n") == 1
        return captured.err

    assert main(["--embedder", "hash"]) == 2
    assert error() == (
        "tkg-mcp: error: give --store (a snapshot path, created on the first write if missing, "
        "or a postgresql:// DSN), or --demo\n"
    )
    existing = tmp_path / "there.tkg"
    existing.write_bytes(b"x")
    assert main(["--demo", "--snapshot", str(existing), "--embedder", "hash"]) == 2
    assert "already exists" in error()
    assert existing.read_bytes() == b"x"
    missing = tmp_path / "no-such-dir" / "m.tkg"
    assert main(["--snapshot", str(missing), "--embedder", "hash"]) == 2
    assert error() == f"tkg-mcp: error: cannot save {missing}: directory {missing.parent} does not exist\n"
    assert not missing.parent.exists()
    # an error once the background ingestor runs: reported, and its worker threads are stopped
    before = {t for t in threading.enumerate() if t.name.startswith("tkg-ingest")}
    assert main(["--demo", "--background", "--group", "bad group", "--embedder", "hash", "--no-llm"]) == 2
    assert "group_id 'bad group' is invalid" in error()
    assert {t for t in threading.enumerate() if t.name.startswith("tkg-ingest")} == before


def test_create_server_refuses_one_string_as_its_groups() -> None:
    from tkg.mcp_server import create_server

    with pytest.raises(ConfigurationError, match="not one string"):
        create_server(Memory(embedder=HashEmbedder()), groups="ab")


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from tkg.mcp_server import create_server

    monkeypatch.setitem(sys.modules, "mcp.server.mcpserver", None)  # makes the import fail
    with pytest.raises(ConfigurationError, match=r'pip install "tkg\[mcp\]"'):
        create_server(Memory(embedder=HashEmbedder()))
