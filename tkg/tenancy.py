"""One caller's view of a memory: :class:`ScopedMemory`, a :class:`~tkg.Memory` seen through the groups (tenants)
one caller may touch. The MCP server and the HTTP service both call it, so the tenant boundary is drawn once.

Every read is filtered to the caller's groups; naming another group, or the id of a record in one, is a
:class:`~tkg.errors.NotFoundError` whose text is the same whether the thing exists elsewhere or not at all.
Writes are serialised with the ``after_write`` hook (e.g. a snapshot save), so a saved file is never half a write.
ScopedMemory reads and writes only through the :class:`~tkg.Memory` facade; it takes request values
(:mod:`tkg.wire_requests`) and answers with shapes (:mod:`tkg.wire_shapes`).

>>> from tkg import FixedClock, HashEmbedder, Memory
>>> scoped = ScopedMemory(Memory(embedder=HashEmbedder(), clock=FixedClock("2024-05-01T00:00:00Z")), {"u1"})
>>> _ = scoped.add_facts([{"subject": "Ann", "relation": "LIVES_IN", "object": "Oslo"}], group_id="u1")
>>> scoped.search("where does Ann live?", targets=("facts",)).facts[0].valid_at
'2024-05-01T00:00:00Z'
>>> scoped.search("Ann", group_ids=["u2"])
Traceback (most recent call last):
...
tkg.errors.NotFoundError: group 'u2' not found
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from tkg.background import BackgroundIngestor, IngestionStatus
from tkg.errors import ExtractionFailedError, NotFoundError, TimestampError, ValidationError
from tkg.memory import FactInput, Memory
from tkg.models import Kind, check_group_id, check_id
from tkg.wire_requests import (
    DEFAULT_CONTEXT_CHARS,
    DEFAULT_LIMIT,
    DEFAULT_PAGE,
    MAX_CONTEXT_CHARS,
    MAX_FACTS,
    MAX_LIMIT,
    MAX_PAGE,
    SEARCH_TARGETS,
    FactIn,
    allowed_groups,
    check_content,
    parse_fact,
    parse_groups,
    parse_limit,
    parse_time,
)
from tkg.wire_shapes import (
    ContextOut,
    EpisodeListOut,
    EpisodeOut,
    FactOut,
    GroupOut,
    GroupsOut,
    HistoryOut,
    IngestionOut,
    IngestOut,
    RemovalOut,
    SearchOut,
    context_out,
    entity_names,
    entity_out,
    episode_out,
    fact_out,
    ingest_out,
    ingestion_out,
    removal_out,
    search_out,
)

__all__ = ["ScopedMemory"]


class ScopedMemory:
    """A :class:`~tkg.Memory` seen through the groups one caller may touch (``groups=None``: all of them).

    Every operation takes plain request values, validates them strictly (:func:`~tkg.wire_requests.parse_time`,
    :func:`~tkg.wire_requests.parse_limit`, group and record ids) before anything is read or written, and returns
    one of the shapes of :mod:`tkg.wire_shapes`. Reads see only the allowed groups; a group outside them, and a
    record id whose record lives outside them, raise :class:`~tkg.errors.NotFoundError` with the same text as a
    group or id that does not exist at all, so a caller learns nothing about other tenants. Writes hold one lock
    across the write and ``after_write`` (e.g. saving a snapshot), which views made by :meth:`narrow` share.

    ``default_group`` is where a write that names no group goes; without one, a caller allowed exactly one group
    writes there and any other must name the group. With an ``ingestor`` (:class:`tkg.BackgroundIngestor`),
    :meth:`queue_episode` returns at once and extraction runs behind its queue.
    """

    def __init__(
        self,
        memory: Memory,
        groups: Collection[str] | None = None,
        *,
        default_group: str | None = None,
        after_write: Callable[[], object] | None = None,
        write_lock: AbstractContextManager[Any] | None = None,
        ingestor: BackgroundIngestor | None = None,
    ) -> None:
        allowed = allowed_groups(groups)
        self.memory = memory
        self.ingestor = ingestor
        self.groups: frozenset[str] | None = None if allowed is None else frozenset(allowed)
        if default_group is not None:
            check_group_id(default_group)
        self.default_group = default_group
        self._after_write = after_write
        self._write_lock: AbstractContextManager[Any] = write_lock if write_lock is not None else threading.RLock()

    def narrow(self, groups: Collection[str], *, default_group: str | None = None) -> ScopedMemory:
        """The same memory, lock and ``after_write`` hook, for a caller allowed only ``groups``."""
        named = frozenset(allowed_groups(groups) or ())
        allowed = named if self.groups is None else named & self.groups
        return ScopedMemory(
            self.memory,
            allowed,
            default_group=default_group,
            after_write=self._after_write,
            write_lock=self._write_lock,
            ingestor=self.ingestor,
        )

    # -- scope -------------------------------------------------------------------------------------------
    def _not_found_group(self, group: str) -> NotFoundError:
        return NotFoundError(f"group {group!r} not found")

    def readable(self, group_ids: object = None) -> frozenset[str] | None:
        """The groups a read may see: ``None`` means every group (only for an unrestricted view).

        Named groups must be allowed; an allowed group that holds nothing yet is simply empty.
        """
        named = parse_groups(group_ids)
        if named is None:
            return None if self.groups is None else self.groups
        if self.groups is not None:
            for group in named:
                if group not in self.groups:
                    raise self._not_found_group(group)
            return frozenset(named)
        existing = set(self.memory.groups())
        for group in named:
            if group not in existing:
                raise self._not_found_group(group)
        return frozenset(named)

    def writable(self, group_id: object = None) -> str:
        """The group a write goes to."""
        if group_id is None:
            if self.default_group is not None and (self.groups is None or self.default_group in self.groups):
                return self.default_group
            if self.groups is not None and len(self.groups) == 1:
                return next(iter(self.groups))
            if self.groups is None:
                return self.memory.config.default_group
            raise ValidationError(f"name the group_id to write to; this caller may use {sorted(self.groups)}")
        group = check_group_id(group_id)
        if self.groups is not None and group not in self.groups:
            raise self._not_found_group(group)
        return group

    def _searchable(self, group_ids: object) -> list[str] | None:
        """Groups to hand to Memory.search: never an empty list (that would not mean "nothing")."""
        visible = self.readable(group_ids)
        if visible is None:
            return None
        return sorted(visible & set(self.memory.groups()))

    def _owned(self, kind: Kind, record_id: object) -> Any:
        what = f"{kind.value}_id"
        check_id(record_id, what)
        assert isinstance(record_id, str)
        record = self.memory.get_many(kind, [record_id])[0]
        if record is None or (self.groups is not None and record.group_id not in self.groups):
            raise NotFoundError(f"no {kind.value} with id {record_id!r}")
        return record

    def _write(self, action: Callable[[], Any]) -> Any:
        with self._write_lock:
            try:
                result = action()
            except ExtractionFailedError:
                # The episode is stored, marked failed (Memory's contract): persist it so a retry can find it.
                self._saved()
                raise
            self._saved()
            return result

    def _saved(self) -> None:
        if self._after_write is not None:
            self._after_write()

    # -- writes ------------------------------------------------------------------------------------------
    def add_episode(
        self,
        content: str | Mapping[str, Any] | list[Any],
        *,
        group_id: str | None = None,
        source: str = "message",
        reference_time: object = None,
        source_description: str = "",
        name: str = "",
    ) -> IngestOut:
        """Store an episode and extract what it says (with the memory's LLM; without one it is stored, indexed
        and linked to entities already known by name)."""
        args = self._episode_args(content, group_id, source, reference_time, source_description, name)
        result = self._write(lambda: self.memory.add_episode(content, **args))
        return ingest_out(self.memory, result)

    def queue_episode(
        self,
        content: str | Mapping[str, Any] | list[Any],
        *,
        group_id: str | None = None,
        source: str = "message",
        reference_time: object = None,
        source_description: str = "",
        name: str = "",
    ) -> IngestionOut:
        """Store an episode as ``queued`` and return at once; the background ingestor extracts it later (see
        :meth:`ingestion_status`). The queued episode is persisted by ``after_write`` before this returns, so an
        accepted episode survives a restart; ``after_write`` runs again once its extraction has finished."""
        ingestor = self.ingestor
        if ingestor is None:
            raise ValidationError("this server runs without background ingestion; add the episode synchronously")
        args = self._episode_args(content, group_id, source, reference_time, source_description, name)
        episode_id: str = self._write(lambda: ingestor.submit(content, **args))
        # Saved again when the worker is done (on its thread; a finished one calls back at once).
        ingestor.future(episode_id).add_done_callback(lambda _: self._write(lambda: None))
        return ingestion_out(self.memory, ingestor.status(episode_id))

    def _episode_args(
        self,
        content: object,
        group_id: object,
        source: str,
        reference_time: object,
        source_description: object,
        name: object,
    ) -> dict[str, Any]:
        """The keyword arguments an episode is stored with (by add_episode and queue_episode alike), validated:
        the group this caller writes to, an aware reference time, and storable text. ``source`` and the content's
        shape are left to :meth:`tkg.Memory.add_episode`, which checks them for every way in."""
        group = self.writable(group_id)
        when = parse_time(reference_time, "reference_time", keep_offset=True)
        check_content(content)
        for what, value in (("source_description", source_description), ("name", name)):
            if not isinstance(value, str):
                raise ValidationError(f"{what} must be a string")
            check_content(value, what)
        return {
            "group_id": group,
            "source": source,
            "reference_time": when,
            "source_description": source_description,
            "name": name,
        }

    def ingestion_status(self, episode_id: object) -> IngestionOut:
        """Where an episode's extraction stands: from the background ingestor while it tracks the episode, else
        from the stored record (extracted or stored: done)."""
        episode = self._owned(Kind.EPISODE, episode_id)
        status = self.ingestor.status(episode.id) if self.ingestor is not None else IngestionStatus.of(episode)
        return ingestion_out(self.memory, status)

    def add_facts(
        self,
        facts: Sequence[FactIn | Mapping[str, Any]],
        *,
        group_id: str | None = None,
        reference_time: object = None,
    ) -> IngestOut:
        """Add structured facts with no LLM; they are kept together as one JSON episode (their provenance)."""
        group = self.writable(group_id)
        when = parse_time(reference_time, "reference_time", keep_offset=True)
        if isinstance(facts, str | bytes | Mapping) or not isinstance(facts, Sequence):
            raise ValidationError("facts must be a list of facts")
        if not 1 <= len(facts) <= MAX_FACTS:
            raise ValidationError(f"facts must hold 1 to {MAX_FACTS} facts, got {len(facts)}")
        parsed = [parse_fact(f, f"facts[{i}]") for i, f in enumerate(facts)]
        inputs = [
            FactInput(
                f.subject,
                f.relation,
                f.object,
                fact=f.fact,
                valid_at=f.valid_at,
                invalid_at=f.invalid_at,
                subject_label=f.subject_label,
                object_label=f.object_label,
            )
            for f in parsed
        ]
        for i, f in enumerate(parsed):
            if f.valid_at is not None and f.invalid_at is not None and f.invalid_at < f.valid_at:
                raise TimestampError(f"facts[{i}]: invalid_at is before valid_at")
        result = self._write(lambda: self.memory.add_facts(inputs, group_id=group, reference_time=when))
        return ingest_out(self.memory, result)

    def delete_episode(self, episode_id: object) -> RemovalOut:
        """Remove an episode as if it had never been added (facts only it supported go, invalidations it caused
        are reverted, orphaned entities go)."""
        episode = self._owned(Kind.EPISODE, episode_id)
        return removal_out(self._write(lambda: self.memory.remove_episode(episode.id)))

    def invalidate_fact(self, fact_id: object, at: object = None) -> FactOut:
        """End a fact: it no longer holds from ``at`` (default now). Nothing is deleted: searches "as of" an
        earlier time still find it, and its history keeps the change."""
        fact = self._owned(Kind.FACT, fact_id)
        when = parse_time(at, "at")
        ended = self._write(lambda: self.memory.invalidate_fact(fact.id, at=when))
        return fact_out(ended, entity_names(self.memory, [ended]))

    # -- reads -------------------------------------------------------------------------------------------
    def search(
        self,
        query: str,
        *,
        targets: Sequence[str] = ("facts", "entities", "episodes"),
        group_ids: object = None,
        limit: object = None,
        as_of: object = None,
        known_at: object = None,
        include_invalidated: bool = False,
    ) -> SearchOut:
        """Hybrid search over the chosen kinds of record, within the caller's groups."""
        args = self._search_args(query, targets, group_ids, limit, as_of, known_at, include_invalidated)
        if args is None:
            return SearchOut(query=query)
        return search_out(self.memory, self.memory.search(query, **args))

    def context(
        self,
        query: str,
        *,
        group_ids: object = None,
        limit: object = None,
        max_chars: object = None,
        include_episodes: bool | None = None,
        as_of: object = None,
        known_at: object = None,
    ) -> ContextOut:
        """The context string for a query (facts with their date ranges, entities, communities, and episodes
        when asked or when no fact is found), within a character budget (default
        :data:`~tkg.wire_requests.DEFAULT_CONTEXT_CHARS`)."""
        budget = parse_limit(
            max_chars, "max_chars", default=DEFAULT_CONTEXT_CHARS, maximum=MAX_CONTEXT_CHARS, minimum=0
        )
        if include_episodes is not None and not isinstance(include_episodes, bool):
            raise ValidationError("include_episodes must be true, false or null (when no fact is found)")
        targets = ("facts", "entities", "communities") + (("episodes",) if include_episodes is not False else ())
        args = self._search_args(query, targets, group_ids, limit, as_of, known_at, False)
        if args is None:
            return ContextOut(query=query, text="")
        context = self.memory.retrieve(query, max_chars=budget, include_episodes=include_episodes, **args)
        return context_out(self.memory, query, context)

    def _search_args(
        self,
        query: object,
        targets: Sequence[str],
        group_ids: object,
        limit: object,
        as_of: object,
        known_at: object,
        include_invalidated: object,
    ) -> dict[str, Any] | None:
        """Validated arguments for Memory.search, or None when the caller's groups hold nothing yet."""
        if not isinstance(query, str) or not query.strip():
            raise ValidationError("query is empty; say what to look for")
        if len(query) > self.memory.config.max_query_chars:
            raise ValidationError(
                f"query has {len(query):,} characters, more than {self.memory.config.max_query_chars:,}"
            )
        unknown = [t for t in targets if t not in SEARCH_TARGETS]
        if unknown or not targets:
            raise ValidationError(f"unknown search targets {unknown}; choose from {list(SEARCH_TARGETS)}")
        if not isinstance(include_invalidated, bool):
            raise ValidationError("include_invalidated must be true or false")
        args: dict[str, Any] = {
            "limit": parse_limit(limit, default=DEFAULT_LIMIT, maximum=MAX_LIMIT),
            "as_of": parse_time(as_of, "as_of"),
            "known_at": parse_time(known_at, "known_at"),
            "include_invalidated": include_invalidated,
            "targets": tuple(targets),
        }
        groups = self._searchable(group_ids)
        if groups is not None and not groups:
            return None
        args["group_ids"] = groups
        return args

    def list_episodes(self, *, group_ids: object = None, limit: object = None, offset: object = None) -> EpisodeListOut:
        """Episodes of the caller's groups, newest first by reference time."""
        size = parse_limit(limit, default=DEFAULT_PAGE, maximum=MAX_PAGE)
        start = parse_limit(offset, "offset", default=0, maximum=10**9, minimum=0)
        groups = self._searchable(group_ids)
        if groups is not None and not groups:
            return EpisodeListOut(episodes=[], total=0, offset=start, limit=size)
        found = sorted(self.memory.episodes(groups), key=lambda e: (e.reference_time, e.created_at, e.id), reverse=True)
        page = found[start : start + size]
        return EpisodeListOut(episodes=[episode_out(e) for e in page], total=len(found), offset=start, limit=size)

    def get_episode(self, episode_id: object) -> EpisodeOut:
        """One episode by id."""
        return episode_out(self._owned(Kind.EPISODE, episode_id))

    def entity_history(self, entity_id: object) -> HistoryOut:
        """An entity and every fact touching it, ended and superseded ones included, oldest first."""
        entity = self._owned(Kind.ENTITY, entity_id)
        facts = self.memory.facts_about(entity.id, include_invalidated=True)
        # A fact never crosses groups, but filter anyway: this is the tenant boundary.
        facts = [f for f in facts if self.groups is None or f.group_id in self.groups]
        names = entity_names(self.memory, facts)
        return HistoryOut(entity=entity_out(entity), facts=[fact_out(f, names) for f in facts])

    def list_groups(self) -> GroupsOut:
        """The groups this caller may use (for an unrestricted view: every group that holds something)."""
        groups = sorted(self.groups if self.groups is not None else self.memory.groups())
        counts = {g: self.memory.stats(g)["records"] for g in groups}
        return GroupsOut(
            groups=[
                GroupOut(group_id=g, episodes=c["episode"], entities=c["entity"], facts=c["fact"])
                for g, c in counts.items()
            ]
        )
