"""The HTTP service's gate: API keys (each bound to the groups it may touch), the ASGI middleware that checks the
key and the body size before the application sees a request, and the access log.

A missing or unknown key on ``/v1/`` is ``401`` (the health check is open); a body over the limit is ``413``,
answered from its ``Content-Length`` without reading it, or as soon as a chunked body passes the limit. The groups
of a good key travel with the request (:func:`key_groups`). Keys are kept only as SHA-256 digests.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tkg.errors import ConfigurationError, ValidationError
from tkg.models import check_group_id

if TYPE_CHECKING:
    from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["AccessLog", "Gate", "KeyRing", "key_groups"]

#: The access log: one INFO record per request, its fields also as attributes (method, path, status, ms) for a
#: structured handler. Keys, query strings and bodies are never logged.
access_log = logging.getLogger("tkg.http.access")

#: Paths under /v1/ that need no key.
OPEN_PATHS = frozenset({"/v1/health"})
# Where the gate leaves a good key's groups in the ASGI scope's state, for the application.
_STATE_KEY = "tkg.groups"


# ----------------------------------------------------------------------------------------------------------
# keys


class KeyRing:
    """API keys and the groups each may touch. Keys are kept only as SHA-256 digests.

    >>> ring = KeyRing({"k-alpha-0123456789": ["alpha"]})
    >>> sorted(ring.groups_for("k-alpha-0123456789")), ring.groups_for("nope")
    (['alpha'], None)
    """

    def __init__(self, keys: Mapping[str, Collection[str]]) -> None:
        if not isinstance(keys, Mapping) or not keys:
            raise ConfigurationError("the key ring needs at least one key, as {key: [group, ...]}")
        self._groups: dict[str, frozenset[str]] = {}
        for key, groups in keys.items():
            if not isinstance(key, str) or not key or key != key.strip() or not key.isprintable() or not key.isascii():
                # ASCII: HTTP headers carry bytes, read as Latin-1, so a key outside ASCII could never match
                raise ConfigurationError(
                    "an API key must be a non-empty printable ASCII string without surrounding spaces"
                )
            if isinstance(groups, str) or not isinstance(groups, Collection) or not groups:
                raise ConfigurationError(f"key ...{key[-4:]}: give a non-empty list of groups")
            try:
                allowed = frozenset(check_group_id(g) for g in groups)
            except ValidationError as exc:
                raise ConfigurationError(f"key ...{key[-4:]}: {exc}") from None
            self._groups[_digest(key)] = allowed

    @classmethod
    def from_file(cls, path: str | Path) -> KeyRing:
        """Read a key file: a JSON object ``{"key": ["group", ...], ...}``."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigurationError(f"key file {path} does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"key file {path} cannot be read: {exc}") from None
        except json.JSONDecodeError as exc:
            raise ConfigurationError(f"key file {path} is not JSON: {exc.msg} (line {exc.lineno})") from None
        if not isinstance(data, dict):
            raise ConfigurationError(f'key file {path} must hold a JSON object {{"key": ["group", ...]}}')
        try:
            return cls(data)
        except ConfigurationError as exc:
            raise ConfigurationError(f"key file {path}: {exc}") from None

    def groups_for(self, key: str) -> frozenset[str] | None:
        """The groups ``key`` may touch, or ``None`` for an unknown key."""
        return self._groups.get(_digest(key))

    def __len__(self) -> int:
        return len(self._groups)


def _digest(key: str) -> str:
    # Looking up a digest, not the key, keeps lookup time independent of how much of a guessed key is right.
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _key_from(headers: Mapping[str, str]) -> str | None:
    api_key = headers.get("x-api-key")
    if api_key:
        return api_key.strip()
    scheme, _, credentials = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return None


# ----------------------------------------------------------------------------------------------------------
# the gate: authentication and body size, before the application sees the request


class Gate:
    """ASGI middleware: 401 for a missing or unknown key on ``/v1/`` (before the application sees the request; a
    body within the limit is read and dropped first, so the connection stays usable and the client is not reset
    before it reads the answer), 413 for a body over the limit (from Content-Length without reading it, or as soon
    as a chunked body passes the limit)."""

    def __init__(self, app: ASGIApp, ring: KeyRing, max_body_bytes: int) -> None:
        self.app = app
        self.ring = ring
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        path = str(scope.get("path", ""))
        if path.startswith("/v1/") and path not in OPEN_PATHS:
            key = _key_from(headers)
            groups = self.ring.groups_for(key) if key else None
            if groups is None:
                detail = (
                    "unknown API key"
                    if key
                    else "missing API key: send 'Authorization: Bearer KEY' or 'X-API-Key: KEY'"
                )
                # Read a body within the limit before answering: closing a socket with unread bytes on it makes
                # the kernel reset the connection, and the client may lose the 401 it was sent.
                drained = await self._drain(receive, headers)
                await _send_error(send, 401, "unauthorized", detail, {"www-authenticate": "Bearer"}, close=not drained)
                return
            scope.setdefault("state", {})[_STATE_KEY] = groups
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                await _send_error(send, 400, "bad_request", f"Content-Length {length!r} is not a number")
                return
            if int(length) > self.max_body_bytes:
                await _send_error(send, 413, "payload_too_large", self._too_large(int(length)))
                return
        from starlette.exceptions import HTTPException

        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    # An HTTPException passes through FastAPI's body reading to the app's error handler.
                    raise HTTPException(413, self._too_large(None))
            return message

        await self.app(scope, limited_receive, send)

    async def _drain(self, receive: Receive, headers: Mapping[str, str]) -> bool:
        """Read and drop the request body if it fits the size limit; False when it does not (or cannot be read)."""
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            return False
        if length == "0" or (length is None and "transfer-encoding" not in headers):
            return True
        received = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return False
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:
                return False
            if not message.get("more_body", False):
                return True

    def _too_large(self, length: int | None) -> str:
        size = f"{length:,} bytes" if length is not None else "the body"
        return f"request body too large: {size} over the limit of {self.max_body_bytes:,} bytes"


def key_groups(scope: Mapping[str, object]) -> frozenset[str] | None:
    """The groups of the key the gate let through with this request (an ASGI scope), or ``None`` without one."""
    state = scope.get("state")
    groups = state.get(_STATE_KEY) if isinstance(state, Mapping) else None
    return groups if isinstance(groups, frozenset) else None


async def _send_error(
    send: Send,
    status: int,
    error: str,
    detail: str,
    headers: Mapping[str, str] | None = None,
    *,
    close: bool = True,
) -> None:
    body = json.dumps({"error": error, "detail": detail}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    if close:  # the request body is left unread on the socket, so the connection cannot be reused
        raw.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class AccessLog:
    """ASGI middleware: one :data:`access_log` record per HTTP request once its answer has started, with the
    method, the path, the status and the milliseconds taken (``-`` as status when no answer was sent)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not access_log.isEnabledFor(logging.INFO):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: list[int] = []

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            ms = (time.perf_counter() - started) * 1000
            method, path = str(scope.get("method", "")), str(scope.get("path", ""))
            code = status[0] if status else None
            access_log.info(
                "%s %s %s %.1f ms",
                method,
                path,
                code if code is not None else "-",
                ms,
                extra={"method": method, "path": path, "status": code, "ms": round(ms, 3)},
            )
