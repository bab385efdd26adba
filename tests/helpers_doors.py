"""Shared fixtures of the door tests (MCP server, HTTP service): servers on 127.0.0.1, and a two-tenant memory."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tkg import HashEmbedder, Memory
from tkg.demo import build_demo

ROOT = Path(__file__).resolve().parent.parent
#: A string only tenant "beta" holds: it must never appear in an answer to anyone else.
BETA_MARKER = "Zebrafinch"


def two_tenants() -> Memory:
    """The offline demo memory (group ``demo``) plus a second tenant ``beta`` with facts of its own."""
    memory = Memory(embedder=HashEmbedder())
    build_demo(memory)
    memory.add_facts(
        [
            {"subject": "Quinn", "relation": "OWNS", "object": BETA_MARKER, "valid_at": "2020-01-01T00:00:00Z"},
            {"subject": "Quinn", "relation": "LIVES_IN", "object": "Reykjavik", "valid_at": "2021-01-01T00:00:00Z"},
        ],
        group_id="beta",
    )
    memory.add_episode(f"Quinn: my {BETA_MARKER} sings every morning.", group_id="beta")
    return memory


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(port: int, process: subprocess.Popen[Any] | None = None, timeout: float = 30.0) -> None:
    """Block until something listens on 127.0.0.1:port (or the process died, or the timeout passed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            out = process.stderr.read() if process.stderr else ""
            raise RuntimeError(f"server exited with {process.returncode}: {out}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout} s")


@contextlib.contextmanager
def uvicorn_thread(app: Any) -> Iterator[str]:
    """Serve an ASGI app with uvicorn on a free port of 127.0.0.1 in a thread; yields the base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()


@contextlib.contextmanager
def module_process(module: str, args: Sequence[str], port: int) -> Iterator[subprocess.Popen[str]]:
    """Run ``python -m module args`` and wait until it listens on ``port``; stopped at exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TKG_")}
    process = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_port(port, process)
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if process.stderr:
            process.stderr.close()


# -- headless Chromium ----------------------------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and os.environ.get("TKG_REQUIRE_BROWSER") == "1":  # CI: a missing browser fails, never skips
    raise RuntimeError("TKG_REQUIRE_BROWSER=1 but Chromium is not installed (Debian: apt-get install chromium)")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="Chromium is not installed (Debian: apt-get install chromium); CI installs it"
)


def load_in_chromium(page: Path | str, profile: Path) -> tuple[str, list[str]]:
    """Load ``page`` (a file, or a URL on 127.0.0.1) headless, with every other host unreachable (what is shown
    must work offline); return the DOM once the network is idle and the scripts ran, and every console line."""
    assert CHROMIUM is not None
    target = page.as_uri() if isinstance(page, Path) else page
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--virtual-time-budget=10000",
        "--enable-logging=stderr", "--v=0", "--dump-dom", target,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    return done.stdout, console
