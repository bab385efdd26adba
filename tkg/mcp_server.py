"""An MCP server over a :class:`tkg.Memory`: tools to remember, search and forget, for any MCP-speaking agent.

Built on the official ``mcp`` SDK (``pip install "tkg[mcp]"``); stdio transport, and streamable HTTP. The tools are
thin: each validates its arguments and calls :class:`tkg.tenancy.ScopedMemory`, which the HTTP service uses too, so
both doors accept and return the same shapes.

Run it::

    python -m tkg.mcp_server --demo                                # the offline demo memory, stdio
    python -m tkg.mcp_server --store memory.tkg --group user-42  # every write journalled beside the snapshot
    python -m tkg.mcp_server --store memory.tkg --transport http --port 8765   # streamable HTTP on /mcp

or build one around your own memory::

    from tkg.mcp_server import create_server
    create_server(memory, groups=["user-42"]).run("stdio")

Bad arguments come back as a tool error (``isError``) whose text says what was wrong; nothing is written then.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from pydantic import Field

from tkg.errors import ConfigurationError, TkgError
from tkg.memory import Memory
from tkg.serving import Served, add_serving_options, serve_command
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
    allowed_groups,
)
from tkg.wire_shapes import (
    EpisodeListOut,
    EpisodeOut,
    FactOut,
    GroupsOut,
    HistoryOut,
    IngestionOut,
    IngestOut,
    RemovalOut,
    SearchOut,
)

if TYPE_CHECKING:
    from mcp.server.mcpserver import MCPServer

    from tkg.background import BackgroundIngestor

__all__ = ["INSTRUCTIONS", "create_server", "main"]

T = TypeVar("T")

INSTRUCTIONS = """\
Long-term memory as a temporal knowledge graph. Episodes (chat messages, texts, JSON documents) are kept verbatim \
and turned into entities and facts; every fact has a valid time (valid_at - invalid_at: when it held in the world) \
and a transaction time (created_at - expired_at: when the memory learnt it, and learnt that it ended). Nothing is \
overwritten: a contradicted fact is ended, and stays readable as history.

- Before answering about the user or the world, call get_context (or search_facts) with the question.
- Store what you learn with add_episode (free text or "Speaker: message"), or add_facts for known triples.
- Questions about the past: pass as_of (what held then) or known_at (what the memory knew then).
- Timestamps are ISO-8601 with a UTC offset, e.g. 2024-05-01T12:00:00Z; times without an offset are refused.
- group_id / group_ids pick the tenant (a user, a project); omit them to use the server's default group.
"""

_GroupArg = Annotated[
    GroupId | None,
    Field(description="Group (tenant) to write to; omitted: the server's default group."),
]
_Content = Annotated[
    str,
    Field(
        min_length=1,
        description='The episode, kept verbatim. source="message": "Speaker: text" (the speaker becomes an entity). '
        'source="text": free text. source="json": a JSON document as a string.',
    ),
]
_SourceArg = Annotated[Source, Field(description="What content is: message (default), text or json.")]
_ReferenceTime = Annotated[
    ReferenceTimestamp,
    Field(
        description="When the episode happened (ISO-8601 with offset); relative dates in it ('last week') count "
        "from here. Omitted: now."
    ),
]
_SourceDescription = Annotated[str, Field(max_length=500, description="Where it came from, e.g. 'support chat'.")]
_Title = Annotated[str, Field(max_length=500, description="An optional title.")]
_EpisodeId = Annotated[RecordId, Field(description="Id of an episode, as returned by add_episode or list_episodes.")]
_EntityId = Annotated[RecordId, Field(description="Id of an entity, as returned by search_entities or in a fact.")]
_FactId = Annotated[RecordId, Field(description="Id of a fact, as returned by search_facts or entity_history.")]
_EndedAt = Annotated[
    Timestamp, Field(description="When the fact stopped holding (ISO-8601 with offset); omitted: now.")
]


def _require_mcp() -> Any:
    try:
        import mcp.server.mcpserver as sdk
    except ImportError:
        raise ConfigurationError('the MCP server needs the "mcp" extra: pip install "tkg[mcp]"') from None
    return sdk


def _strict(base: type[Any], tool_error: type[Exception]) -> type[Any]:
    """``base`` (the SDK's server) refusing a tool call that names an argument the tool does not take, as the HTTP
    door refuses an unknown field: a misspelt ``asof`` must not answer as if no time had been asked."""

    class StrictServer(base):  # type: ignore[misc, valid-type]
        async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
            tool = next((t for t in await self.list_tools() if t.name == name), None)
            if tool is not None:
                takes = set((tool.input_schema or {}).get("properties", {}))
                unknown = sorted(set(arguments) - takes)
                if unknown:
                    raise tool_error(f"{name} takes no argument(s) {unknown}; it takes {sorted(takes)}")
            return await super().call_tool(name, arguments, context)

    return StrictServer


def create_server(
    memory: Memory,
    *,
    groups: Collection[str] | None = None,
    default_group: str | None = None,
    after_write: Callable[[], object] | None = None,
    ingestor: BackgroundIngestor | None = None,
    name: str = "tkg",
) -> MCPServer:
    """An MCP server whose tools read and write ``memory``.

    ``groups`` limits the tools to those groups (``None``: every group); ``default_group`` is where writes go when
    a tool call names no group (default: the first of ``groups``, else the memory's default group).
    ``after_write`` runs after every successful write, under the write lock (e.g. saving a snapshot). With an
    ``ingestor`` (:class:`tkg.BackgroundIngestor` over ``memory``; the caller closes it) the server also offers
    ``queue_episode``, which returns at once while extraction runs in the background.
    """
    sdk = _require_mcp()
    from mcp.server.mcpserver.exceptions import ToolError
    from mcp_types import ToolAnnotations

    from tkg import __version__

    allowed = allowed_groups(groups)
    default = default_group if default_group is not None else (allowed[0] if allowed else None)
    if ingestor is not None and ingestor.memory is not memory:
        raise ConfigurationError("the background ingestor must work on the memory the server serves")
    scoped = ScopedMemory(memory, allowed, default_group=default, after_write=after_write, ingestor=ingestor)
    server: MCPServer = _strict(sdk.MCPServer, ToolError)(name, instructions=INSTRUCTIONS, version=__version__)

    def run(action: Callable[[], T]) -> T:
        try:
            return action()
        except TkgError as exc:
            # The model's mistake (or a known failure): an error result it can read and correct.
            raise ToolError(str(exc)) from None

    reading = ToolAnnotations(read_only_hint=True, open_world_hint=False)
    writing = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)

    @server.tool(title="Add an episode", annotations=writing)
    def add_episode(
        content: _Content,
        group_id: _GroupArg = None,
        source: _SourceArg = "message",
        reference_time: _ReferenceTime = None,
        source_description: _SourceDescription = "",
        name: _Title = "",
    ) -> IngestOut:
        """Remember an episode: a chat message, a text or a JSON document. It is stored verbatim and, when the
        server has an LLM, its entities and facts are extracted (contradicted older facts are ended, not deleted).
        Returns the stored episode (its id is what delete_episode takes) and the entities and facts it created or
        changed."""
        return run(
            lambda: scoped.add_episode(
                content,
                group_id=group_id,
                source=source,
                reference_time=reference_time,
                source_description=source_description,
                name=name,
            )
        )

    if ingestor is not None:

        @server.tool(title="Queue an episode (background)", annotations=writing)
        def queue_episode(
            content: _Content,
            group_id: _GroupArg = None,
            source: _SourceArg = "message",
            reference_time: _ReferenceTime = None,
            source_description: _SourceDescription = "",
            name: _Title = "",
        ) -> IngestionOut:
            """Like add_episode, but returns at once: the episode is stored (and searchable as an episode) and
            its entities and facts are extracted in the background, in order within each group. Use it for long
            or many episodes; check progress with episode_status."""
            return run(
                lambda: scoped.queue_episode(
                    content,
                    group_id=group_id,
                    source=source,
                    reference_time=reference_time,
                    source_description=source_description,
                    name=name,
                )
            )

    @server.tool(title="Episode ingestion state", annotations=reading)
    def episode_status(episode_id: _EpisodeId) -> IngestionOut:
        """Where an episode's extraction stands: queued, running, done, or failed (with the error and whether a
        retry may help); for a recent background ingestion, what it wrote once done."""
        return run(lambda: scoped.ingestion_status(episode_id))

    @server.tool(title="Add structured facts", annotations=writing)
    def add_facts(
        facts: Annotated[
            list[FactIn],
            Field(
                min_length=1,
                max_length=MAX_FACTS,
                description="Facts as subject-relation-object triples, e.g. "
                '{"subject": "Alice", "relation": "WORKS_AT", "object": "Acme", '
                '"valid_at": "2021-01-01T00:00:00Z"}.',
            ),
        ],
        group_id: _GroupArg = None,
        reference_time: Annotated[
            Timestamp,
            Field(
                description="When these facts were stated (ISO-8601 with offset); a fact without valid_at "
                "holds from here. Omitted: now."
            ),
        ] = None,
    ) -> IngestOut:
        """Add facts you already know as triples, with no LLM involved. Each becomes a bi-temporal fact between
        two entities (created if new); a verbatim repeat only adds provenance. The facts are kept together as one
        JSON episode, so delete_episode on the returned episode id removes them all again."""
        return run(lambda: scoped.add_facts(facts, group_id=group_id, reference_time=reference_time))

    @server.tool(title="Search facts", annotations=reading)
    def search_facts(
        query: Query,
        group_ids: GroupIds = None,
        limit: Limit = DEFAULT_LIMIT,
        as_of: AsOf = None,
        known_at: KnownAt = None,
        include_invalidated: IncludeInvalidated = False,
    ) -> SearchOut:
        """Find facts relevant to a question (hybrid semantic + keyword search), best first. By default only facts
        that hold now; as_of asks about another moment of the world, known_at about what the memory knew at a
        moment, include_invalidated returns ended facts too. Each fact has its sentence, both entity names and
        ids, and its four timestamps."""
        return run(
            lambda: scoped.search(
                query,
                targets=("facts",),
                group_ids=group_ids,
                limit=limit,
                as_of=as_of,
                known_at=known_at,
                include_invalidated=include_invalidated,
            )
        )

    @server.tool(title="Search entities", annotations=reading)
    def search_entities(
        query: Query,
        group_ids: GroupIds = None,
        limit: Limit = DEFAULT_LIMIT,
        as_of: AsOf = None,
        known_at: KnownAt = None,
    ) -> SearchOut:
        """Find entities (people, places, organisations, things) by name or description, best first. Use an
        entity's id with entity_history. as_of / known_at restrict to entities connected by facts that held /
        were known at that moment."""
        return run(
            lambda: scoped.search(
                query, targets=("entities",), group_ids=group_ids, limit=limit, as_of=as_of, known_at=known_at
            )
        )

    @server.tool(title="Search communities", annotations=reading)
    def search_communities(
        query: Query,
        group_ids: GroupIds = None,
        limit: Limit = 5,
        as_of: AsOf = None,
        known_at: KnownAt = None,
    ) -> SearchOut:
        """Find communities: clusters of closely connected entities, each with a name and a summary. Useful for a
        broad overview ("what do I know about the user's work?")."""
        return run(
            lambda: scoped.search(
                query, targets=("communities",), group_ids=group_ids, limit=limit, as_of=as_of, known_at=known_at
            )
        )

    @server.tool(title="Get context for a question", annotations=reading)
    def get_context(
        query: Query,
        group_ids: GroupIds = None,
        max_chars: Annotated[
            int,
            Field(ge=0, le=MAX_CONTEXT_CHARS, strict=True, description="Budget for the whole text in characters."),
        ] = DEFAULT_CONTEXT_CHARS,
        limit: Limit = DEFAULT_LIMIT,
        include_episodes: Annotated[
            bool | None,
            Field(
                strict=True, description="Also include the source episodes (raw messages); null: when no fact is found."
            ),
        ] = None,
        as_of: AsOf = None,
        known_at: KnownAt = None,
    ) -> str:
        """The memory's context for a question, ready to put in a prompt: relevant facts with the period each
        held ('present' = still holds), entities with summaries and community summaries, best first within
        max_chars. Empty when nothing relevant is known."""
        return run(
            lambda: (
                scoped.context(
                    query,
                    group_ids=group_ids,
                    limit=limit,
                    max_chars=max_chars,
                    include_episodes=include_episodes,
                    as_of=as_of,
                    known_at=known_at,
                ).text
            )
        )

    @server.tool(title="List episodes", annotations=reading)
    def list_episodes(
        group_ids: GroupIds = None,
        limit: Annotated[int, Field(ge=1, le=MAX_PAGE, strict=True, description="Episodes per page.")] = DEFAULT_PAGE,
        offset: Annotated[int, Field(ge=0, strict=True, description="Episodes to skip (for the next page).")] = 0,
    ) -> EpisodeListOut:
        """List stored episodes, newest first (by when they happened), with their ids, content and extraction
        status; total says how many there are."""
        return run(lambda: scoped.list_episodes(group_ids=group_ids, limit=limit, offset=offset))

    @server.tool(title="Get an episode", annotations=reading)
    def get_episode(episode_id: _EpisodeId) -> EpisodeOut:
        """One stored episode by id: its verbatim content, source, reference time and extraction status."""
        return run(lambda: scoped.get_episode(episode_id))

    @server.tool(
        title="Delete an episode",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False),
    )
    def delete_episode(episode_id: _EpisodeId) -> RemovalOut:
        """Forget an episode completely, as if it had never been added: facts only it supported are deleted,
        facts it had ended hold again, entities nothing else mentions are deleted. Returns the ids of what
        changed. Cannot be undone."""
        return run(lambda: scoped.delete_episode(episode_id))

    @server.tool(
        title="End a fact",
        annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False),
    )
    def invalidate_fact(fact_id: _FactId, at: _EndedAt = None) -> FactOut:
        """Say that a fact no longer holds, from `at` (default now): for a user's correction ("I left that job").
        Nothing is deleted: searches as of an earlier time still find it, and entity_history shows the change.
        Returns the fact with its new invalid_at."""
        return run(lambda: scoped.invalidate_fact(fact_id, at))

    @server.tool(title="Entity history", annotations=reading)
    def entity_history(entity_id: _EntityId) -> HistoryOut:
        """Everything the memory holds about one entity over time: the entity and all facts touching it, ended
        and superseded ones included, oldest first, each with valid_at / invalid_at (when it held) and
        created_at / expired_at (when the memory learnt it and learnt it had ended)."""
        return run(lambda: scoped.entity_history(entity_id))

    @server.tool(title="List groups", annotations=reading)
    def list_groups() -> GroupsOut:
        """The groups (tenants) these tools can use, with how many episodes, entities and facts each holds."""
        return run(scoped.list_groups)

    return server


# ----------------------------------------------------------------------------------------------------------
# command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tkg.mcp_server",
        description="Serve a tkg memory over the Model Context Protocol (stdio or streamable HTTP).",
    )
    add_serving_options(
        parser, background="offer queue_episode: extraction in the background (queued episodes left over are resumed)"
    )
    parser.add_argument(
        "--group",
        action="append",
        help="limit the tools to this group (repeatable); the first is where writes go by default",
    )
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio", help="default: stdio")
    parser.add_argument(
        "--host", default="127.0.0.1", help="for --transport http (default 127.0.0.1; there is no authentication)"
    )
    parser.add_argument("--port", type=int, default=8765, help="for --transport http (default 8765)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the server until its transport closes; returns the exit status (2 on a configuration error)."""
    args = build_parser().parse_args(argv)

    def start(served: Served) -> Callable[[], object]:
        default = args.group[0] if args.group else ("demo" if args.demo else None)
        server = create_server(
            served.memory,
            groups=args.group,
            default_group=default,
            ingestor=served.ingestor,
        )
        if args.transport == "stdio":
            return lambda: server.run("stdio")
        if args.host not in {"127.0.0.1", "localhost", "::1"}:
            # The MCP transport has no keys here: anyone who reaches the port reads and writes the memory.
            print(
                f"tkg-mcp: warning: serving on {args.host} without authentication; put it behind an authenticating "
                "proxy, or use tkg.http_service (API keys per tenant)",
                file=sys.stderr,
            )
        return lambda: server.run("streamable-http", host=args.host, port=args.port)

    return serve_command("tkg-mcp", args, start)


if __name__ == "__main__":
    raise SystemExit(main())
