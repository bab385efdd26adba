"""The command line and both servers on a PostgreSQL memory (``--store postgresql://...``): the same commands and
answers as on a snapshot, the embedder recorded and enforced, and clear errors for a schema that holds nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers_doors import free_port, module_process
from test_cli import FACTS, MESSAGES, no_llm_env, run, write_jsonl

from tkg import HashEmbedder, Memory
from tkg.errors import ValidationError
from tkg.locations import Location

__all__ = ["no_llm_env"]  # the fixture, used by name


@pytest.fixture
def dsn(postgres_server: Any) -> str:
    return str(postgres_server.dsn)


@pytest.fixture
def schema() -> str:
    from conftest import new_postgres_schema

    return new_postgres_schema()


def postgres_memory(dsn: str, schema: str) -> Iterator[Memory]:
    from tkg.backends.postgres import PostgresStore

    with PostgresStore(dsn, dim=384, schema=schema) as store:
        yield Memory(store, embedder=HashEmbedder())


def counts(dsn: str, schema: str) -> dict[str, int]:
    for memory in postgres_memory(dsn, schema):
        return dict(memory.stats()["records"])
    raise AssertionError("unreachable")


def test_location_tells_a_dsn_from_a_path() -> None:
    assert Location.parse("postgresql://u@h/db", "s") == Location(dsn="postgresql://u@h/db", schema="s")
    assert Location.parse("postgres://h/db").is_postgres
    assert Location.parse("memory.tkg") == Location(path=Path("memory.tkg"))
    described = str(Location.parse("postgresql://ann:s3cret@db.example:5433/mem", "s"))
    assert described == "PostgreSQL schema 's' at user=ann dbname=mem host=db.example port=5433"  # no password
    with pytest.raises(ValidationError, match="--store is empty"):
        Location.parse(" ")


def test_cli_on_postgres(
    dsn: str, schema: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_llm_env: None
) -> None:
    store = ["--store", dsn, "--schema", schema, "--embedder", "hash"]
    code, out, err = run(capsys, "ingest", str(write_jsonl(tmp_path / "in.jsonl", [*FACTS, *MESSAGES])), *store)
    assert code == 0, err
    assert f"saved in PostgreSQL schema '{schema}' at " in out and "password" not in out
    assert counts(dsn, schema)["fact"] == 3

    code, out, err = run(capsys, "search", "Where does Alice work?", *store)
    assert code == 0, err
    assert "Alice works at Globex  (2023-03-01 - present)" in out and "Acme  (" not in out
    code, out, _ = run(capsys, "search", "Where does Alice work?", *store, "--as-of", "2020-01-01")
    assert "Alice works at Acme  (2019-03-01 - 2023-02-28)" in out
    code, out, _ = run(capsys, "context", "Alice", *store)
    assert code == 0 and "Alice works at Globex" in out

    code, out, err = run(capsys, "stats", "--store", dsn, "--schema", schema)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"store        {Location.parse(dsn, schema)}"
    assert lines[1:6] == [
        "embedder     hash-384-tri (384-d; --embedder hash)",
        "groups       default",
        "episodes     4",
        "entities     5",
        "facts        3  (2 current, 1 ended)",
    ]

    # export from the database, import into another schema: the same records
    exported = tmp_path / "out.jsonl"
    code, out, err = run(capsys, "export", *store, "--out", str(exported))
    assert code == 0, err
    other = schema + "_copy"
    code, out, err = run(capsys, "import", str(exported), "--store", dsn, "--schema", other, "--embedder", "hash")
    assert code == 0, err
    assert counts(dsn, other) == counts(dsn, schema)

    picture = tmp_path / "alice.svg"
    code, out, err = run(capsys, "timeline", "Alice", "--store", dsn, "--schema", schema, "--out", str(picture))
    assert code == 0, err
    assert "Globex" in picture.read_text(encoding="utf-8")


def test_cli_postgres_errors(
    dsn: str, schema: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], no_llm_env: None
) -> None:
    code, out, err = run(capsys, "search", "q", "--store", dsn, "--schema", schema, "--embedder", "hash")
    assert (code, out) == (2, "")
    assert err.startswith(f"tkg: error: PostgreSQL schema '{schema}' at ") and err.endswith(
        "holds no tkg memory; create it with `tkg ingest FILE --store DSN` or `tkg demo --store DSN`\n"
    )
    code, _, err = run(
        capsys,
        "ingest",
        str(write_jsonl(tmp_path / "f.jsonl", FACTS)),
        "--store",
        dsn,
        "--schema",
        schema,
        "--embedder",
        "hash",
    )
    assert code == 0, err
    # another embedder of the same size would mix vectors that mean different things: refused, with the fix
    code, out, err = run(capsys, "search", "q", "--store", dsn, "--schema", schema, "--embedder", "minilm")
    assert (code, out) == (2, "")
    assert "was made with the embedder 'hash-384-tri' (384-d)" in err and err.endswith("pass --embedder hash\n")
    before = counts(dsn, schema)
    code, _, err = run(capsys, "demo", "--store", dsn, "--schema", schema, "--embedder", "hash", "--no-llm")
    assert code == 0, err
    code, _, err = run(capsys, "demo", "--store", dsn, "--schema", schema, "--embedder", "hash", "--no-llm")
    assert code == 2 and "already holds the group 'demo'" in err
    assert counts(dsn, schema)["episode"] > before["episode"]
    code, _, err = run(capsys, "search", "q", "--store", "postgresql://nobody@127.0.0.1:1/none", "--embedder", "hash")
    assert code == 2 and "cannot connect to PostgreSQL" in err


@pytest.mark.slow  # starts a server process
def test_http_service_on_postgres(dsn: str, schema: str, tmp_path: Path) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"k-demo": ["demo"]}), encoding="utf-8")
    port = free_port()
    args = ["--demo", "--store", dsn, "--schema", schema, "--keys", str(keys), "--port", str(port)]
    with module_process("tkg.http_service", [*args, "--embedder", "hash", "--no-llm"], port):
        base, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer k-demo"}
        r = httpx.post(f"{base}/v1/context", json={"query": "Where does Alice work?"}, headers=auth)
        assert r.status_code == 200 and "Globex" in r.json()["text"]
        assert httpx.post(f"{base}/v1/episodes", json={"content": "Gil: hello"}, headers=auth).status_code == 201
    assert counts(dsn, schema)["episode"] == 14  # the demo's 13 and Gil's, in the database after the server stopped


@pytest.mark.slow  # starts a server process
def test_mcp_server_on_postgres(dsn: str, schema: str) -> None:
    import anyio
    from mcp import Client
    from test_mcp import data, stdio
    from test_mcp import run as run_mcp

    async def scenario(client: Client) -> None:
        await client.call_tool("add_episode", {"content": "Hana: I moved to Kyoto.", "group_id": "demo"})
        page = data(await client.call_tool("list_episodes", {"limit": 1}))
        assert page["total"] == 14
        text = data(await client.call_tool("get_context", {"query": "Where does Alice work?"}))["result"]
        assert "Globex" in text
        await anyio.sleep(0)

    run_mcp(stdio("--demo", "--store", dsn, "--schema", schema, "--no-llm"), scenario)
    assert counts(dsn, schema)["episode"] == 14
