"""A tiny OpenAI-compatible HTTP server on 127.0.0.1, for testing the real ``openai`` client offline.

Standard library only. It answers ``POST /v1/chat/completions`` and ``POST /v1/embeddings``, records every
request, and can be told to fail the next few requests with an HTTP status.

>>> with FakeOpenAIServer(chat=lambda req: {"entities": [], "facts": []}) as srv:
...     srv.base_url  # doctest: +ELLIPSIS
'http://127.0.0.1:.../v1'
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import struct
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

# A chat handler gets the request JSON and returns the arguments object the model "answers" (a dict), or a
# string sent verbatim (to simulate output that is not JSON at all).
ChatHandler = Callable[[dict[str, Any]], "dict[str, Any] | str"]
EmbedHandler = Callable[[list[str]], Sequence[Sequence[float]]]


def default_embed(texts: list[str], dim: int = 8) -> list[list[float]]:
    """Deterministic, unnormalised vectors derived from a hash of each text."""
    out = []
    for text in texts:
        digest = hashlib.sha256(text.encode("utf-8")).digest()
        out.append([digest[i] - 127.5 for i in range(dim)])
    return out


class FakeOpenAIServer:
    """An OpenAI-compatible server in a daemon thread; use it as a context manager.

    ``requests`` holds ``(path, json_body)`` of every request received, failed ones included.
    """

    def __init__(
        self,
        chat: ChatHandler | None = None,
        embed: EmbedHandler | None = None,
        *,
        model: str = "fake-model",
        reverse_embeddings: bool = False,
    ) -> None:
        self.chat: ChatHandler = chat or (lambda request: {})
        self.embed: EmbedHandler = embed or default_embed
        self.model = model
        # Real servers may list embedding items out of order; clients must sort by ``index``.
        self.reverse_embeddings = reverse_embeddings
        self.requests: list[tuple[str, dict[str, Any]]] = []
        self._failures: list[tuple[int, str, float | None]] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> FakeOpenAIServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    self._send(400, _error("request body is not JSON", "invalid_request_error"))
                    return
                status, payload = server._handle(self.path, body)
                retry_after = payload.pop("_retry_after", None)
                self._send(status, payload, retry_after)

            def _send(self, status: int, payload: dict[str, Any], retry_after: str | None = None) -> None:
                data = json.dumps(payload).encode("utf-8")
                # the client may have given up already (a timeout test); that is not the server's problem
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.send_response(status)
                    if retry_after is not None:
                        self.send_header("Retry-After", retry_after)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,), name="fake-openai", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeOpenAIServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the server is not running")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    # -- programming -------------------------------------------------------------------------------------------

    def fail_next(
        self, count: int = 1, status: int = 500, message: str = "simulated failure", retry_after: float | None = None
    ) -> None:
        """Answer the next ``count`` requests (any path) with HTTP ``status`` and an OpenAI-style error body (and a
        ``Retry-After`` header when given)."""
        with self._lock:
            self._failures.extend([(status, message, retry_after)] * count)

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]

    # -- request handling --------------------------------------------------------------------------------------

    def _handle(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.requests.append((path, body))
            failure = self._failures.pop(0) if self._failures else None
        if failure is not None:
            status, message, retry_after = failure
            payload = _error(message, "server_error" if status >= 500 else "invalid_request_error")
            if retry_after is not None:
                payload["_retry_after"] = str(retry_after)
            return status, payload
        try:
            if path == "/v1/chat/completions":
                return 200, self._chat_completion(body)
            if path == "/v1/embeddings":
                return 200, self._embeddings(body)
        except Exception as exc:  # a buggy test handler should surface as a 500, not hang the client
            return 500, _error(f"fake server handler raised {type(exc).__name__}: {exc}", "server_error")
        return 404, _error(f"no route {path}", "invalid_request_error")

    def _chat_completion(self, body: dict[str, Any]) -> dict[str, Any]:
        answer = self.chat(body)
        text = answer if isinstance(answer, str) else json.dumps(answer)
        message: dict[str, Any] = {"role": "assistant", "content": None}
        tools = body.get("tools")
        if tools:
            message["tool_calls"] = [
                {
                    "id": "call_0",
                    "type": "function",
                    "function": {"name": _forced_tool_name(body), "arguments": text},
                }
            ]
            finish_reason = "tool_calls"
        else:
            message["content"] = text
            finish_reason = "stop"
        prompt_tokens = sum(len(str(m.get("content") or "")) // 4 for m in body.get("messages", []))
        completion_tokens = len(text) // 4
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
            "usage": _usage(prompt_tokens, completion_tokens),
        }

    def _embeddings(self, body: dict[str, Any]) -> dict[str, Any]:
        inputs = body.get("input")
        texts = [inputs] if isinstance(inputs, str) else list(inputs or [])
        as_base64 = body.get("encoding_format") == "base64"
        items = [
            {"object": "embedding", "index": i, "embedding": _b64(vec) if as_base64 else [float(x) for x in vec]}
            for i, vec in enumerate(self.embed(texts))
        ]
        if self.reverse_embeddings:
            items.reverse()
        prompt_tokens = sum(len(t) // 4 for t in texts)
        return {
            "object": "list",
            "model": body.get("model") or self.model,
            "data": items,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }


def _forced_tool_name(body: dict[str, Any]) -> str:
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        return str(choice["function"]["name"])
    return str(body["tools"][0]["function"]["name"])


def _b64(vector: Sequence[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _error(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
