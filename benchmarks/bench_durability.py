#!/usr/bin/env python
"""Durability benchmark (issue 15): what the write-ahead journal costs a service, and how long a replay takes.

1. **HTTP writes.** The HTTP service (uvicorn on 127.0.0.1, a real client over loopback) takes ``POST /v1/facts``
   requests, three ways, measured in the same run (throughput with ``--clients`` concurrent clients, latency with
   one client, so that it is a write's own time, not its wait behind the others):
   in memory only (``Memory()``: nothing survives a restart), journalled (``Memory.open``: every write synced to
   disk before it is answered, compaction in the background), and the old way for reference (in memory, the
   whole snapshot rewritten after each write). Throughput (requests/s) and latency p50/p95 per request.
2. **Replay.** A journal holding ``--replay`` facts' worth of batches (one batch per episode of
   ``--facts-per-batch`` structured facts with their entities and mentions, 384-d vectors, encoded straight into
   a segment) is opened: the time to replay it, per batch and per fact.

Targets (issue 15): journalled throughput at least 80% of in-memory-only, and p50 write latency within 2 ms of it.

    python benchmarks/bench_durability.py --quick     # CI smoke: 300 requests, replay of 5,000 facts
    python benchmarks/bench_durability.py             # 2,000 requests; replay of 100k and 1M facts

Percentiles are linear interpolation between closest ranks (numpy's default). Results are printed and written to
``benchmarks/out/durability.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_core as core
import render
from measure import percentile

from tkg import HashEmbedder, Memory, MemoryConfig
from tkg.journal import JournalPolicy, encode_batch
from tkg.models import Entity, Episode, EpisodeSource, Fact, Mention
from tkg.storage import WriteBatch

OUT_DIR = Path(__file__).resolve().parent / "out"
DIM = 384
KEY = "bench-key"
T0 = datetime(2024, 1, 1, tzinfo=UTC)


@contextlib.contextmanager
def serving(memory: Memory, after_write: Callable[[], object] | None) -> Iterator[str]:
    import uvicorn

    from tkg.http_service import create_app, listening_socket

    app = create_app(memory, {KEY: ["bench"]}, after_write=after_write)
    sock = listening_socket("127.0.0.1", 0)  # as tkg-http listens (TCP_NODELAY)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
        sock.close()


def hammer(url: str, requests: int, clients: int) -> dict[str, float]:
    """``requests`` writes from ``clients`` keep-alive connections; each request goes out in one packet with
    TCP_NODELAY (a client that sends headers and body apart meets delayed ACKs: ~40 ms a request, whatever the
    server does)."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    latencies: list[float] = []
    lock = threading.Lock()
    counter = iter(range(requests))
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}

    def client(n: int) -> None:
        connection = http.client.HTTPConnection(where.hostname, where.port, timeout=60)
        connection.connect()
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # type: ignore[union-attr]
        try:
            for i in counter:
                body = json.dumps(
                    {"facts": [{"subject": f"Person {i}", "relation": "LIKES", "object": f"Thing {i % 97}"}]}
                ).encode()
                started = time.perf_counter()
                connection.request("POST", "/v1/facts", body=body, headers=headers)
                answer = connection.getresponse()
                text = answer.read()
                took = time.perf_counter() - started
                if answer.status not in (200, 201):
                    raise RuntimeError(f"{answer.status}: {text[:200]!r}")
                with lock:
                    latencies.append(took * 1000)
        finally:
            connection.close()

    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    return {
        "requests": len(latencies),
        "requests_per_s": len(latencies) / seconds,
        "p50_ms": percentile(latencies, 50),
        "p95_ms": percentile(latencies, 95),
        "max_ms": max(latencies),
    }


def new_memory(kind: str, folder: Path) -> tuple[Memory, Callable[[], object] | None]:
    embedder = HashEmbedder(dim=DIM)
    config = MemoryConfig(communities=None)
    if kind == "journal":
        return Memory.open(folder / "served.tkg", embedder=embedder, config=config, durability=JournalPolicy()), None
    memory = Memory(embedder=embedder, config=config)
    if kind == "rewrite":
        path = folder / "rewritten.tkg"
        return memory, lambda: memory.save(path)
    return memory, None


def http_section(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in ("memory", "journal", "rewrite"):
        memory, after = new_memory(kind, folder)
        requests = args.requests if kind != "rewrite" else max(50, args.requests // 4)
        with serving(memory, after) as url:
            hammer(url, 20, args.clients)  # warm up
            loaded = hammer(url, requests, args.clients)  # throughput: clients queue on the write lock
            alone = hammer(url, max(50, requests // 4), 1)  # latency: one client, no queueing
            out[kind] = {
                **loaded,
                "p50_ms": alone["p50_ms"],
                "p95_ms": alone["p95_ms"],
                "queued_p50_ms": loaded["p50_ms"],
            }
        memory.close()
        print(
            f"http {kind:>8}: {out[kind]['requests_per_s']:8.1f} req/s  p50 {out[kind]['p50_ms']:6.2f} ms  "
            f"p95 {out[kind]['p95_ms']:6.2f} ms",
            flush=True,
        )
    return out


def batches(facts: int, per_batch: int, embedder: HashEmbedder) -> Iterator[WriteBatch]:
    """What ``add_facts`` writes, without planning: an episode, its entities, facts and mentions per batch."""
    rng = np.random.default_rng(15)
    for start in range(0, facts, per_batch):
        now = T0 + timedelta(seconds=start)
        episode = Episode(
            id=f"ep{start}",
            group_id="bench",
            content=json.dumps([{"n": start}]),
            source=EpisodeSource.JSON,
            reference_time=now,
            created_at=now,
            embedding=embedder.embed([f"episode {start}"])[0],
        )
        puts: list[Any] = [episode]
        for i in range(start, min(start + per_batch, facts)):
            a, b = f"e{i}", f"e{i}o"
            texts = [f"Person {i}", f"Thing {int(rng.integers(1000))}", f"Person {i} likes thing {i}"]
            vectors = embedder.embed(texts)
            puts += [
                Entity(id=a, group_id="bench", name=texts[0], created_at=now, name_embedding=vectors[0]),
                Entity(id=b, group_id="bench", name=texts[1], created_at=now, name_embedding=vectors[1]),
                Fact(
                    id=f"f{i}",
                    group_id="bench",
                    source_id=a,
                    target_id=b,
                    relation="LIKES",
                    fact=texts[2],
                    created_at=now,
                    valid_at=now,
                    episodes=(episode.id,),
                    embedding=vectors[2],
                ),
                Mention(episode.id, a, "bench", now),
                Mention(episode.id, b, "bench", now),
            ]
        yield WriteBatch(puts=puts)


def replay_section(args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    embedder = HashEmbedder(dim=DIM)
    rows = []
    for facts in args.replay:
        path = folder / f"replay{facts}.tkg"
        segment = Path(f"{path}.journal.000001")
        written = 0
        started = time.perf_counter()
        with open(segment, "wb") as f:
            from tkg.journal import _HEAD, FORMAT_VERSION, MAGIC

            f.write(MAGIC + _HEAD.pack(FORMAT_VERSION))
            for seq, batch in enumerate(batches(facts, args.facts_per_batch, embedder), start=1):
                f.write(encode_batch(seq, batch))
                written = seq
        encoded = time.perf_counter() - started
        size = segment.stat().st_size
        started = time.perf_counter()
        memory = Memory.open(path, embedder=embedder, config=MemoryConfig(communities=None))
        seconds = time.perf_counter() - started
        assert memory.stats()["records"]["fact"] == facts
        memory.close()
        row = {
            "facts": facts,
            "batches": written,
            "journal_mb": size / 1e6,
            "replay_s": seconds,
            "replay_us_per_fact": seconds / facts * 1e6,
            "batches_per_s": written / seconds,
            "encode_s": encoded,
        }
        rows.append(row)
        print(
            f"replay {facts:>9,} facts: {written:,} batches, {size / 1e6:8.1f} MB, {seconds:7.2f} s "
            f"({row['replay_us_per_fact']:.0f} us/fact)",
            flush=True,
        )
        for leftover in folder.glob(f"replay{facts}.tkg*"):
            leftover.unlink()
    return rows


def summary(http: dict[str, Any], replay: list[dict[str, Any]]) -> dict[str, Any]:
    base, journal, rewrite = http["memory"], http["journal"], http["rewrite"]
    ratio = journal["requests_per_s"] / base["requests_per_s"]
    gap = journal["p50_ms"] - base["p50_ms"]
    table = {
        "title": "HTTP writes (POST /v1/facts) and journal replay",
        "columns": ["measure", "in memory only", "journal", "snapshot rewrite", "journal / in memory"],
        "rows": [
            [
                "requests/s",
                round(base["requests_per_s"], 1),
                round(journal["requests_per_s"], 1),
                round(rewrite["requests_per_s"], 1),
                f"{ratio:.0%}",
            ],
            [
                "write p50 ms",
                round(base["p50_ms"], 2),
                round(journal["p50_ms"], 2),
                round(rewrite["p50_ms"], 2),
                f"+{gap:.2f} ms",
            ],
            ["write p95 ms", round(base["p95_ms"], 2), round(journal["p95_ms"], 2), round(rewrite["p95_ms"], 2), ""],
        ],
        "notes": [
            "journal: every write fdatasync-ed before it is answered; compaction in the background past 64 MB",
            "snapshot rewrite: the way the servers persisted before the journal (whole file after each write)",
        ],
    }
    replay_table = {
        "title": "Journal replay on open (384-d vectors)",
        "columns": ["facts", "batches", "journal MB", "replay s", "us per fact"],
        "rows": [
            [
                r["facts"],
                r["batches"],
                round(r["journal_mb"], 1),
                round(r["replay_s"], 2),
                round(r["replay_us_per_fact"]),
            ]
            for r in replay
        ],
        "notes": [
            "one batch per episode of structured facts, as add_facts writes them",
            "a journal is folded into a snapshot past 64 MB (~10k facts), so a real open replays at most about that",
        ],
    }
    targets = [
        render.target("journal throughput >= 80% of in-memory", ratio, 0.8, "", lower_is_better=False, strict=False),
        render.target("journal write p50 within 2 ms of in-memory", gap, 2.0, "ms", strict=False),
    ]
    return {"tables": [table, replay_table], "plots": [], "targets": targets}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="CI smoke sizes")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=4)
    # A journal holds at most about JournalPolicy.compact_bytes (64 MB, ~10k facts of 384-d) before it is folded
    # into a snapshot; 100k facts' worth is ten times that (compaction turned off). 1M facts' worth would take
    # ~16 min and >12 GB to replay (HNSW inserts and the decoded batches): pass --replay to measure it anyway.
    parser.add_argument("--replay", type=lambda s: [int(x) for x in s.split(",")], default=[10_000, 100_000])
    parser.add_argument("--facts-per-batch", type=int, default=3)
    parser.add_argument("--out", type=Path, default=OUT_DIR / "durability.json")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.replay = 300, [5_000]
    started = time.perf_counter()
    began = datetime.now(UTC).isoformat()
    with tempfile.TemporaryDirectory(prefix="tkg-bench-durability.") as tmp:
        http = http_section(args, Path(tmp))
        replay = replay_section(args, Path(tmp))
    payload = {
        "bench": "durability",
        "command": render.command_line(),
        "machine": core.machine(),
        "args": render.plain_args(args),
        "started": began,
        "seconds": time.perf_counter() - started,
        "http": http,
        "replay": replay,
        **summary(http, replay),
    }
    render.print_tables(payload)
    render.write_result(args.out, payload)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
