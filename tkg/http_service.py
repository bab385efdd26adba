"""An HTTP service over a :class:`tkg.Memory`, for other services: FastAPI, OpenAPI documented, one API key per tenant.

``pip install "tkg[http]"``. Every operation of the MCP server is here under ``/v1/...``, built on the same
:class:`tkg.tenancy.ScopedMemory`, so both doors accept and return the same shapes.

* **Keys.** Each API key is bound to the groups (tenants) it may touch. Send it as ``Authorization: Bearer KEY`` or
  ``X-API-Key: KEY``; a missing or unknown key is ``401`` before anything else is looked at. Every read is filtered
  to the key's groups, and naming another group, or the id of a record in one, is ``404`` exactly as for something
  that does not exist, so a key learns nothing about other tenants.
* **Limits.** A body over ``max_body_bytes`` is ``413``, answered from its ``Content-Length`` before it is read (and
  cut off as soon as a chunked one passes the limit). Malformed JSON is ``400``; a value that breaks the schema or
  a naive timestamp is ``422``. On any error nothing is written.
* **Persistence.** Served from the command line, the memory is durable (:meth:`tkg.Memory.open`): every write is
  journalled before it is answered. ``after_write``, for a memory served otherwise, runs after each successful
  write under the write lock.

Run it::

    echo '{"change-me-to-a-long-random-key": ["demo"]}' > keys.json
    python -m tkg.http_service --demo --keys keys.json --port 8080

Keys are read from the key file when the service starts, never from the environment.
"""

import argparse
import socket
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from tkg.errors import (
    BackendError,
    ConfigurationError,
    ExtractionFailedError,
    IngestorClosedError,
    LLMError,
    NotFoundError,
    QueueFullError,
    TkgError,
    UnknownGroupError,
    ValidationError,
)
from tkg.http_gate import AccessLog, Gate, KeyRing, key_groups
from tkg.memory import Memory
from tkg.serving import Served, add_serving_options, serve_command, serving_error
from tkg.tenancy import ScopedMemory
from tkg.wire_requests import (
    DEFAULT_CONTEXT_CHARS,
    DEFAULT_LIMIT,
    DEFAULT_PAGE,
    MAX_CONTEXT_CHARS,
    MAX_FACTS,
    MAX_PAGE,
    AsOf,
    FactIn,
    GroupId,
    GroupIds,
    IncludeInvalidated,
    KnownAt,
    Limit,
    Query,
    RecordId,
    ReferenceTimestamp,
    Source,
    Timestamp,
    describe_errors,
)
from tkg.wire_shapes import (
    ContextOut,
    EpisodeListOut,
    EpisodeOut,
    ErrorOut,
    FactOut,
    GroupsOut,
    HistoryOut,
    IngestionOut,
    IngestOut,
    RemovalOut,
    SearchOut,
)

if TYPE_CHECKING:
    from fastapi import FastAPI

    from tkg.background import BackgroundIngestor

# No `from __future__ import annotations` here: FastAPI reads the endpoint closures' annotations, which name
# objects local to create_app, so they must be evaluated where they are written.

__all__ = ["DEFAULT_MAX_BODY_BYTES", "KeyRing", "create_app", "main"]

DEFAULT_MAX_BODY_BYTES = 1_000_000


def _require_http() -> None:
    try:
        import fastapi  # noqa: F401
        import fastapi_offline  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigurationError('the HTTP service needs the "http" extra: pip install "tkg[http]"') from None


# ----------------------------------------------------------------------------------------------------------
# request bodies (the fields are tkg.wire_requests' annotated types, which the MCP tools use too)


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid")


class AddEpisodeIn(_In):
    """An episode to remember."""

    content: str | dict[str, Any] | list[Any] = Field(
        description='The episode, kept verbatim. source="message": "Speaker: text"; "text": free text; '
        '"json": a JSON document (an object or array, or its text).'
    )
    group_id: GroupId | None = Field(None, description="Group to write to; omitted: the key's only group.")
    source: Source = Field("message", description="What content is: message, text or json.")
    reference_time: ReferenceTimestamp = Field(
        None, description="When it happened (ISO-8601 with offset); relative dates in it count from here. Default: now."
    )
    source_description: str = Field("", max_length=500, description="Where it came from.")
    name: str = Field("", max_length=500, description="An optional title.")


class AddFactsIn(_In):
    """Structured facts to add with no LLM."""

    facts: list[FactIn] = Field(min_length=1, max_length=MAX_FACTS)
    group_id: GroupId | None = Field(None, description="Group to write to; omitted: the key's only group.")
    reference_time: ReferenceTimestamp = Field(
        None, description="When these facts were stated; a fact without valid_at holds from here. Default: now."
    )


class InvalidateIn(_In):
    """When a fact stopped holding."""

    at: Timestamp = Field(None, description="When the fact stopped holding (ISO-8601 with offset). Default: now.")


# The search and context bodies' field names are those of ScopedMemory.search / .context: handlers pass them on
# with model_dump().
class SearchIn(_In):
    query: Query
    group_ids: GroupIds = None
    limit: Limit = DEFAULT_LIMIT
    as_of: AsOf = None
    known_at: KnownAt = None


class FactSearchIn(SearchIn):
    include_invalidated: IncludeInvalidated = False


class ContextIn(_In):
    query: Query
    group_ids: GroupIds = None
    limit: Limit = DEFAULT_LIMIT
    max_chars: int = Field(
        DEFAULT_CONTEXT_CHARS, ge=0, le=MAX_CONTEXT_CHARS, strict=True, description="Budget in characters."
    )
    include_episodes: bool | None = Field(
        None, strict=True, description="Also include the source episodes: true, false, or null (when no fact is found)."
    )
    as_of: AsOf = None
    known_at: KnownAt = None


class HealthOut(BaseModel):
    model_config = ConfigDict(extra="forbid")
    status: str


# ----------------------------------------------------------------------------------------------------------
# errors


def _status_of(exc: TkgError) -> tuple[int, str]:
    if isinstance(exc, NotFoundError | UnknownGroupError):
        return 404, "not_found"
    if isinstance(exc, ValidationError):
        return 422, "invalid"
    if isinstance(exc, ExtractionFailedError):
        return 502, "extraction_failed"
    if isinstance(exc, LLMError):
        return 502, "llm_failed"
    # A full background queue or a closed ingestor is the service's state, as is a backend that is down.
    if isinstance(exc, QueueFullError | IngestorClosedError | BackendError | ConfigurationError):
        return 503, "unavailable"
    return 400, "bad_request"


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "Missing or unknown API key."},
    404: {"model": ErrorOut, "description": "No such group or record for this key (the same for foreign ones)."},
    413: {"model": ErrorOut, "description": "Request body over the size limit."},
    422: {"model": ErrorOut, "description": "Invalid value (e.g. a timestamp without UTC offset)."},
}
_BAD_JSON: dict[int | str, dict[str, Any]] = {400: {"model": ErrorOut, "description": "Malformed JSON body."}}
_LLM: dict[int | str, dict[str, Any]] = {
    502: {"model": ErrorOut, "description": "The LLM failed for good; the episode is stored as failed."},
    503: {"model": ErrorOut, "description": "The storage backend is unavailable."},
}


# ----------------------------------------------------------------------------------------------------------
# the application


def create_app(
    memory: Memory,
    keys: Mapping[str, Collection[str]] | KeyRing,
    *,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    after_write: Callable[[], object] | None = None,
    ingestor: "BackgroundIngestor | None" = None,
    title: str = "tkg memory",
) -> "FastAPI":
    """The FastAPI application serving ``memory`` to the holders of ``keys`` (``{key: [group, ...]}``).

    ``max_body_bytes`` bounds request bodies; ``after_write`` runs after each successful write, under the write
    lock (e.g. ``lambda: memory.save(path)``). With an ``ingestor`` (:class:`tkg.BackgroundIngestor` over the same
    memory; the caller closes it), ``POST /v1/episodes?wait=false`` answers 202 at once and extraction runs behind
    its queue. OpenAPI at ``/openapi.json``, docs at ``/docs``.
    """
    _require_http()
    from fastapi import Depends, Request, Security
    from fastapi import Path as PathParam
    from fastapi import Query as QueryParam
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from fastapi.security import APIKeyHeader, HTTPBearer
    from fastapi_offline import FastAPIOffline
    from starlette.exceptions import HTTPException

    from tkg import __version__

    ring = keys if isinstance(keys, KeyRing) else KeyRing(keys)
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1:
        raise ConfigurationError(f"max_body_bytes must be a positive integer, got {max_body_bytes!r}")
    if ingestor is not None and ingestor.memory is not memory:
        raise ConfigurationError("the background ingestor must work on the memory the service serves")
    base = ScopedMemory(memory, after_write=after_write, ingestor=ingestor)
    # /docs and /redoc with their scripts and styles served by the service itself, not from a CDN: they work
    # offline, like everything else in tkg (fastapi-offline ships them).
    app = FastAPIOffline(
        title=title,
        version=__version__,
        summary="A temporal knowledge-graph memory for agents, one API key per tenant.",
        description=(
            "Episodes (messages, texts, JSON) become entities and bi-temporal facts: `valid_at`/`invalid_at` say "
            "when a fact held in the world, `created_at`/`expired_at` when the memory learnt it and learnt it had "
            "ended. Search with `as_of` (valid time) and `known_at` (transaction time).\n\n"
            "Authenticate with `Authorization: Bearer KEY` or `X-API-Key: KEY`. Each key may touch only its "
            "groups; other groups and their records answer 404. Timestamps are ISO-8601 with a UTC offset "
            "(`2024-05-01T12:00:00Z`); naive ones are refused with 422."
        ),
    )
    app.add_middleware(Gate, ring=ring, max_body_bytes=max_body_bytes)
    app.add_middleware(AccessLog)  # outermost: logs the gate's 401 and 413 too
    bearer = HTTPBearer(auto_error=False, description="The API key as a bearer token.")
    header_key = APIKeyHeader(name="X-API-Key", auto_error=False, description="The API key.")

    def caller(
        request: Request,
        _bearer: Annotated[Any, Security(bearer)] = None,
        _header: Annotated[Any, Security(header_key)] = None,
    ) -> ScopedMemory:
        # The gate checked the key before the body was read; the Security parameters document it in OpenAPI.
        groups = key_groups(request.scope)
        if groups is None:
            raise HTTPException(401, "missing API key", headers={"WWW-Authenticate": "Bearer"})
        return base.narrow(groups)

    Caller = Annotated[ScopedMemory, Depends(caller)]
    IdInPath = Annotated[RecordId, PathParam(description="A record id as returned by tkg.")]

    @app.exception_handler(TkgError)
    async def tkg_error(request: Request, exc: TkgError) -> JSONResponse:
        status, kind = _status_of(exc)
        body = ErrorOut(error=kind, detail=str(exc), episode_id=getattr(exc, "episode_id", None))
        return JSONResponse(body.model_dump(exclude_none=True), status_code=status)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = list(exc.errors())
        bad_json = next((e for e in errors if e.get("type") == "json_invalid"), None)
        if bad_json is not None:
            reason = (bad_json.get("ctx") or {}).get("error", "JSON decode error")
            where = bad_json.get("loc", (None, None))[-1]
            detail = f"the request body is not valid JSON: {reason} (at character {where})"
            return JSONResponse({"error": "malformed_json", "detail": detail}, status_code=400)
        if any(tuple(e.get("loc", ())) == ("body",) for e in errors):  # none, or not an object
            detail = "the request body must be a JSON object, sent with Content-Type: application/json"
            return JSONResponse({"error": "invalid", "detail": detail}, status_code=422)
        return JSONResponse({"error": "invalid", "detail": describe_errors(errors)}, status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        kinds = {
            400: "bad_request",
            401: "unauthorized",
            404: "not_found",
            405: "method_not_allowed",
            413: "payload_too_large",
        }
        detail = str(exc.detail)
        if exc.status_code == 400 and detail == "There was an error parsing the body":  # Starlette's own words
            # JSON Python cannot read: nested too deep, or an integer of thousands of digits
            detail = "the request body is not valid JSON tkg can read (nested too deep, or a number too long)"
        return JSONResponse(
            {"error": kinds.get(exc.status_code, "http_error"), "detail": detail},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    # -- operations (sync functions: FastAPI runs them in its thread pool; Memory is thread-safe) --------------
    @app.get("/v1/health", tags=["service"], summary="Liveness check (no key needed)")
    def health() -> HealthOut:
        """Answers `{"status": "ok"}` while the service is up. Reveals nothing about the memory."""
        return HealthOut(status="ok")

    @app.get("/v1/groups", tags=["service"], summary="The key's groups", responses=_ERRORS)
    def groups(scoped: Caller) -> GroupsOut:
        """The groups this key may use, with how many episodes, entities and facts each holds."""
        return scoped.list_groups()

    @app.post(
        "/v1/episodes",
        status_code=201,
        response_model=IngestOut,
        tags=["episodes"],
        summary="Add an episode",
        responses=_ERRORS
        | _BAD_JSON
        | _LLM
        | {202: {"model": IngestionOut, "description": "Accepted (wait=false): stored, extraction queued."}},
    )
    def add_episode(
        body: AddEpisodeIn,
        scoped: Caller,
        wait: Annotated[
            bool,
            QueryParam(
                description="true: answer when extraction is done (201). false: answer at once with 202 and let "
                "extraction run in the background (GET /v1/episodes/{episode_id}/status); needs a service "
                "started with background ingestion."
            ),
        ] = True,
    ) -> Any:
        """Store an episode verbatim and, when the service has an LLM, extract its entities and facts (older
        facts it contradicts are ended, not deleted). Returns the episode and what it created or changed; with
        `wait=false`, the episode id and its ingestion state."""
        args = body.model_dump(exclude={"content"})  # the fields are ScopedMemory's parameters, by name
        if not wait:
            queued = scoped.queue_episode(body.content, **args)
            return JSONResponse(queued.model_dump(mode="json"), status_code=202)
        return scoped.add_episode(body.content, **args)

    @app.get(
        "/v1/episodes/{episode_id}/status", tags=["episodes"], summary="An episode's ingestion state", responses=_ERRORS
    )
    def episode_status(episode_id: IdInPath, scoped: Caller) -> IngestionOut:
        """queued, running, done or failed (with the error and whether a retry may help); the result once done,
        for recent background ingestions."""
        return scoped.ingestion_status(episode_id)

    @app.get("/v1/episodes", tags=["episodes"], summary="List episodes", responses=_ERRORS)
    def list_episodes(
        scoped: Caller,
        group_id: Annotated[
            list[GroupId] | None,
            QueryParam(description="Only these groups (repeat the parameter); default: all of the key's groups."),
        ] = None,
        limit: Annotated[int, QueryParam(ge=1, le=MAX_PAGE, description="Episodes per page.")] = DEFAULT_PAGE,
        offset: Annotated[int, QueryParam(ge=0, le=10**9, description="Episodes to skip.")] = 0,
    ) -> EpisodeListOut:
        """Stored episodes, newest first by reference time, with `total` for paging."""
        return scoped.list_episodes(group_ids=group_id or None, limit=limit, offset=offset)

    @app.get("/v1/episodes/{episode_id}", tags=["episodes"], summary="Get an episode", responses=_ERRORS)
    def get_episode(episode_id: IdInPath, scoped: Caller) -> EpisodeOut:
        """One episode by id: content, source, reference time, extraction status."""
        return scoped.get_episode(episode_id)

    @app.delete("/v1/episodes/{episode_id}", tags=["episodes"], summary="Delete an episode", responses=_ERRORS)
    def delete_episode(episode_id: IdInPath, scoped: Caller) -> RemovalOut:
        """Forget an episode as if it had never been added: facts only it supported are deleted, facts it had
        ended hold again, entities nothing else mentions are deleted. Returns the ids of what changed."""
        return scoped.delete_episode(episode_id)

    @app.post(
        "/v1/facts", status_code=201, tags=["facts"], summary="Add structured facts", responses=_ERRORS | _BAD_JSON
    )
    def add_facts(body: AddFactsIn, scoped: Caller) -> IngestOut:
        """Add subject-relation-object facts with no LLM. They are kept as one JSON episode (their provenance):
        deleting that episode removes them again."""
        return scoped.add_facts(body.facts, group_id=body.group_id, reference_time=body.reference_time)

    @app.post("/v1/facts/{fact_id}/invalidate", tags=["facts"], summary="End a fact", responses=_ERRORS | _BAD_JSON)
    def invalidate_fact(fact_id: IdInPath, scoped: Caller, body: InvalidateIn | None = None) -> FactOut:
        """End a fact: it no longer holds from `at` (default now). Nothing is deleted: a search `as_of` an earlier
        time still finds it, and its history keeps the change. Returns the fact as stored now."""
        return scoped.invalidate_fact(fact_id, at=body.at if body is not None else None)

    @app.post("/v1/facts/search", tags=["search"], summary="Search facts", responses=_ERRORS | _BAD_JSON)
    def search_facts(body: FactSearchIn, scoped: Caller) -> SearchOut:
        """Facts relevant to a query, best first: by default those that hold now; `as_of` for another moment of
        the world, `known_at` for what the memory knew then, `include_invalidated` for history too."""
        return scoped.search(targets=("facts",), **body.model_dump())

    @app.post("/v1/entities/search", tags=["search"], summary="Search entities", responses=_ERRORS | _BAD_JSON)
    def search_entities(body: SearchIn, scoped: Caller) -> SearchOut:
        """Entities (people, places, organisations, things) matching a query, best first."""
        return scoped.search(targets=("entities",), **body.model_dump())

    @app.post("/v1/communities/search", tags=["search"], summary="Search communities", responses=_ERRORS | _BAD_JSON)
    def search_communities(body: SearchIn, scoped: Caller) -> SearchOut:
        """Communities (clusters of connected entities, with summaries) matching a query, best first."""
        return scoped.search(targets=("communities",), **body.model_dump())

    @app.post("/v1/context", tags=["search"], summary="Context string for a query", responses=_ERRORS | _BAD_JSON)
    def context(body: ContextIn, scoped: Caller) -> ContextOut:
        """The text an agent puts in its prompt: relevant facts with the period each held, entities with
        summaries and community summaries, best first within `max_chars`; plus the records it holds."""
        return scoped.context(**body.model_dump())

    @app.get("/v1/entities/{entity_id}/history", tags=["entities"], summary="An entity's history", responses=_ERRORS)
    def entity_history(entity_id: IdInPath, scoped: Caller) -> HistoryOut:
        """The entity and every fact touching it, ended and superseded ones included, oldest first, each with
        valid_at / invalid_at and created_at / expired_at."""
        return scoped.entity_history(entity_id)

    return app


# ----------------------------------------------------------------------------------------------------------
# command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tkg.http_service", description="Serve a tkg memory over HTTP, one API key per tenant."
    )
    add_serving_options(
        parser, background="accept POST /v1/episodes?wait=false (extraction in the background; leftovers are resumed)"
    )
    parser.add_argument("--keys", type=Path, required=True, help='key file: JSON {"key": ["group", ...], ...}')
    parser.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1")
    parser.add_argument("--port", type=int, default=8080, help="default 8080")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="default 1,000,000")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted; returns the exit status (2 on a configuration error)."""
    args = build_parser().parse_args(argv)
    try:  # before the memory is opened (a --demo snapshot written): the extra and the key file
        _require_http()
        ring = KeyRing.from_file(args.keys)
    except TkgError as exc:
        return serving_error("tkg-http", exc)

    def start(served: Served) -> Callable[[], object]:
        import uvicorn

        app = create_app(
            served.memory,
            ring,
            max_body_bytes=args.max_body_bytes,
            ingestor=served.ingestor,
        )
        listener = listening_socket(args.host, args.port)
        # tkg's own access log (tkg.http.access, --log-level info) replaces uvicorn's
        server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, access_log=False))
        return lambda: server.run(sockets=[listener])

    return serve_command("tkg-http", args, start)


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on ``host:port`` whose connections send at once (TCP_NODELAY, inherited by every
    accepted socket): otherwise a response written in two parts waits for the client's delayed ACK, ~40 ms a
    request whatever the service does."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigurationError(f"cannot listen on {host}:{port}: {exc}") from None
    sock.listen(2048)
    return sock


if __name__ == "__main__":
    raise SystemExit(main())
