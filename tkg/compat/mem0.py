"""Mem0's ``Memory`` API over a tkg memory: change the import line of a Mem0 script and it runs on tkg.

>>> from tkg.compat.mem0 import Memory          # instead of: from mem0 import Memory
>>> m = Memory.from_config({"embedder": {"provider": "hash"}})
>>> added = m.add("I moved to Lisbon.", user_id="alice")
>>> [r["event"] for r in added["results"]]
['ADD']
>>> m.search("where does alice live?", filters={"user_id": "alice"})["results"][0]["memory"]
'I moved to Lisbon.'

What a Mem0 user should know (the README's "Coming from Mem0" has the full table):

* **A memory** is a current fact tkg extracted (with an LLM), or a message kept as it was (``infer=False``, or no
  LLM configured); a message whose facts were extracted is not listed again beside them.
* **Scopes**: ``user_id`` / ``agent_id`` / ``run_id`` name one tkg group per combination (:mod:`.mem0_filters`);
  a read covers every group that includes the ids it names.
* **Nothing is lost where Mem0 would lose it**: ``delete`` and ``update`` of a fact end it (``history`` keeps it,
  and ``as_of`` on :attr:`Memory.tkg` and ``show_expired`` still find it); a contradiction ends the older fact instead
  of overwriting it (reported as ``DELETE`` with ``invalid_at``); ``update`` adds the new text as a new fact with a
  new id, linked to the old one. ``delete_all`` and ``reset`` erase whole scopes (privacy requests), as in Mem0;
  ``delete`` of a kept message erases that message.
* Beyond Mem0 OSS: ``timestamp`` on ``add`` is the messages' time (relative dates are read against it);
  ``as_of``, ``known_at`` and ``show_expired`` on ``search`` / ``get_all``; every item carries ``valid_at``,
  ``invalid_at`` and ``expired_at``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import threading
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import UTC, date, datetime
from typing import Any, Self, TypeVar, overload

import numpy as np
import numpy.typing as npt

from tkg.compat.hits import merged, unextracted
from tkg.compat.mem0_filters import (
    ANY,
    SCOPE_KEYS,
    check_scope_id,
    matches,
    scope_group,
    scope_of,
    scopes_covered,
)
from tkg.compat.mem0_filters import split_filters as _split
from tkg.compat.messages import Message, episode_inputs, message_of, parse_messages
from tkg.embedders.base import Embedder
from tkg.errors import ConfigurationError, NotFoundError, TkgError, ValidationError
from tkg.inputs import EpisodeInput, FactInput, make_episode
from tkg.invalidation import ENDED_BY_HAND
from tkg.memory import Memory as TkgMemory
from tkg.models import Entity, Episode, EpisodeSource, Fact, Kind
from tkg.timeutil import iso_offset, to_aware, to_utc

__all__ = ["AsyncMemory", "Memory", "MemoryNotFoundError"]

log = logging.getLogger(__name__)
R = TypeVar("R")

#: The source description of the episodes this facade writes, and the role a message without one has.
SOURCE = "mem0"
#: Metadata keys this facade keeps for itself (a caller's metadata may not use the prefix).
RESERVED = "tkg."
_REPLACES = "tkg.replaces"
_PREVIOUS = "tkg.previous"
_SHOWN_VECTORS = 4096  # the vectors of kept messages' texts remembered for threshold (forgotten all at once)
_SAID_BY = "tkg.said_by"  # an updated fact's (role, actor_id): those of the message the first version came from
#: Mem0's expiration date of a memory (YYYY-MM-DD), kept in its metadata and shown beside it, as Mem0 keeps it.
EXPIRES = "expiration_date"
_UNSET: Any = object()  # update(): an argument not given (None is a value: no expiration date)
#: Mem0 configuration keys that have no meaning here (tkg has its own storage and ranking).
_IGNORED_CONFIG = ("vector_store", "graph_store", "history_db_path", "reranker", "version", "custom_instructions")


#: The lock of the updates and deletes made through facades over each tkg memory (one per memory, however many
#: facades wrap it; gone with the memory).
_EDIT_LOCKS: weakref.WeakKeyDictionary[TkgMemory, threading.Lock] = weakref.WeakKeyDictionary()
_EDIT_LOCKS_GUARD = threading.Lock()


def _edit_lock(memory: TkgMemory) -> threading.Lock:
    with _EDIT_LOCKS_GUARD:
        return _EDIT_LOCKS.setdefault(memory, threading.Lock())


class MemoryNotFoundError(NotFoundError, ValueError):
    """No memory has this id, or it has ended already (a ``ValueError`` as in Mem0, and a tkg error)."""


class Memory:
    """Mem0's ``Memory`` over a :class:`tkg.Memory` (``memory=``), or over one built from a Mem0-style
    ``config``: ``{"llm": {"provider": "openai", "config": {"model", "api_key", "openai_base_url"}},
    "embedder": {"provider": "auto" | "minilm" | "hash" | "openai", "config": {"model", "embedding_dims", "api_key",
    "openai_base_url"}}}`` (the config of the openai embedder only). Without an ``llm`` the LLM comes from
    ``TKG_LLM_BASE_URL`` (:func:`tkg.environment.llm_from_env`), and without one messages are kept as they are."""

    def __init__(self, config: Mapping[str, Any] | None = None, *, memory: TkgMemory | None = None) -> None:
        if memory is not None and config:
            raise ConfigurationError("give either a config or a tkg memory, not both")
        self._memory = memory if memory is not None else _memory_from_config(config or {})
        self._shown_vectors: dict[str, Any] = {}  # a kept message's text -> its vector (see _above)
        # An update or a delete reads a memory's latest version, then writes: one at a time, so that two of them
        # (threads, AsyncMemory's coroutines, or two facades over one tkg memory) never both replace one version.
        self._edits = _edit_lock(self._memory)

    @classmethod
    def from_config(cls, config_dict: Mapping[str, Any]) -> Self:
        return cls(config_dict)

    @property
    def tkg(self) -> TkgMemory:
        """The tkg memory underneath: every tkg call (time travel, pictures, export) works on it."""
        return self._memory

    def close(self) -> None:
        self._memory.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------------------
    # writes

    def add(
        self,
        messages: str | Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        user_id: Any = None,
        agent_id: Any = None,
        run_id: Any = None,
        metadata: Mapping[str, Any] | None = None,
        infer: bool = True,
        timestamp: datetime | str | int | float | None = None,
        memory_type: str | None = None,
        prompt: str | None = None,
        expiration_date: date | str | None = None,
    ) -> dict[str, list[dict[str, Any]]]:
        """Add messages (a string, one ``{"role", "content"}`` dict, or a list of them; ``system`` messages are
        skipped) to the scope the ids name. Each message is one episode whose speaker is its ``name``, else its
        role. With an LLM and ``infer`` its facts are extracted (one call per message, concurrently); otherwise it
        is kept as it is. Returns ``{"results": [...]}``: ``ADD`` for a new fact or kept message, ``NOOP`` for a
        fact stated again, ``DELETE`` for a fact the new one ended (kept, with its ``invalid_at``).
        ``expiration_date`` (YYYY-MM-DD): from the day after, the memories of these messages are left out of
        ``search`` and ``get_all`` unless ``show_expired`` (as in Mem0; nothing is erased)."""
        if memory_type is not None:
            raise ValidationError(f"memory_type {memory_type!r} is not supported by tkg (no procedural memories)")
        if prompt is not None:
            raise ValidationError("a custom extraction prompt is not supported by tkg; use an Ontology")
        scope = _scope(user_id, agent_id, run_id)
        if ANY in scope.values():
            raise ValidationError(f"{ANY!r} is not an id: in a read's filters it stands for any id")
        group = scope_group(scope)
        extra = _caller_metadata(metadata)
        expires = _expiration(expiration_date)
        if expires is not None:
            extra[EXPIRES] = expires
        when = _when(timestamp)
        inputs = episode_inputs(
            parse_messages(messages, skip_system=True), group, SOURCE, reference_time=when, metadata=extra
        )
        if not inputs:
            return {"results": []}
        extract = bool(infer) and self._memory.llm is not None
        results = self._memory.add_episodes(inputs, extract=extract)
        items: list[dict[str, Any]] = []
        for result in results:
            episode = result.episode
            if unextracted(episode):
                items.append({**self._episode_item(episode), "event": "ADD"})
                continue
            items.extend(self._fact_event(fact, episode) for fact in result.facts)
        return {"results": items}

    def update(
        self,
        memory_id: str,
        text: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        data: str | None = None,
        expiration_date: Any = _UNSET,
    ) -> dict[str, Any]:
        """Give a memory new text and/or metadata. A fact is ended now and the new version added as a new fact
        (its id is returned; the old id keeps working: reads, updates and deletes go to its latest version, and
        ``history`` of either shows every version). A kept message keeps its id, its earlier text in its
        history. ``expiration_date``: a new one (YYYY-MM-DD), or None for none."""
        text = text if text is not None else data
        if text is None and metadata is None and expiration_date is _UNSET:
            raise ValidationError("give text, metadata or expiration_date")
        if text is not None and (not isinstance(text, str) or not text.strip()):
            raise ValidationError("text must be a non-empty string")
        changes = _caller_metadata(metadata)
        if expiration_date is not _UNSET:
            changes[EXPIRES] = _expiration(expiration_date)
        with self._edits:
            record = self._latest(self._record(memory_id))
            if isinstance(record, Fact):
                new_id = self._update_fact(record, text, changes)
            else:
                new_id = self._update_message(record, text, changes)
        return {"message": "Memory updated successfully!", "id": new_id, "previous_id": record.id}

    def _update_fact(self, fact: Fact, text: str | None, changes: dict[str, Any]) -> str:
        now = self._memory.clock.now()
        self._require_current(fact, now)
        source, target = self._memory.get_many(Kind.ENTITY, [fact.source_id, fact.target_id])
        assert isinstance(source, Entity) and isinstance(target, Entity)
        start = max(now, fact.valid_at) if fact.valid_at is not None else now
        # the new version first (a restatement of the old one while that holds), then the old one ends where it
        # starts: the truth-maintenance sweep lets the new one hold from there
        added = self._memory.add_facts(
            [
                FactInput(
                    source.name,
                    fact.relation,
                    target.name,
                    fact=text or fact.fact,
                    valid_at=start,
                    invalid_at=fact.invalid_at,  # a known end stays the new version's end
                )
            ],
            group_id=fact.group_id,
            source_description=SOURCE,
            metadata={**self._metadata_of(fact), **changes, _REPLACES: fact.id, _SAID_BY: list(self._said_by(fact))},
        )
        new_id = added.facts[0].id if added.facts else fact.id
        if new_id != fact.id:
            try:
                self._memory.invalidate_fact(fact.id, at=start, note={"replaced_by": new_id})
            except TkgError:
                # Another writer (another process over the same store) ended the old version meanwhile: this
                # update is undone whole, the new version with it, and the caller told.
                self._memory.remove_episode(added.episode.id)
                raise
        return new_id

    def _update_message(self, episode: Episode, text: str | None, changes: dict[str, Any]) -> str:
        _, speaker, old_text = _parts(episode)
        before = self._metadata_of(episode, reserved=True)
        versions = [*before.get(_PREVIOUS, []), {"memory": old_text, "created_at": episode.created_at.isoformat()}]
        item = EpisodeInput(
            f"{speaker}: {text if text is not None else old_text}" if speaker else (text or old_text),
            episode.group_id,
            source=episode.source,
            reference_time=episode.local_reference,  # the speaker's offset kept
            source_description=episode.source_description,
            name=episode.name,
            episode_id=episode.id,
            metadata={**self._metadata_of(episode), **changes, _PREVIOUS: versions},
        )
        # Checked, and embedded once, before the old one goes: a bad text or an embedder that fails leaves the
        # message as it was. (The removal and the new version are two writes; facts are updated the other way
        # round, the new version first.)
        make_episode(item, self._memory.config, self._memory.clock.now())
        self._memory.embedder.embed([str(item.content)])
        self._memory.remove_episode(episode.id)
        return self._memory.add_episodes([item], extract=False)[0].episode.id

    def delete(self, memory_id: str) -> dict[str, str]:
        """Delete a memory: a fact is ended now (nothing is erased: ``history`` and ``as_of`` still find it); a kept
        message is erased."""
        with self._edits:
            record = self._latest(self._record(memory_id))
            if isinstance(record, Fact):
                now = self._memory.clock.now()
                self._require_current(record, now)
                self._memory.invalidate_fact(record.id, at=max(now, record.valid_at) if record.valid_at else now)
            else:
                self._memory.remove_episode(record.id)
        return {"message": "Memory deleted successfully!"}

    def delete_all(self, user_id: Any = None, agent_id: Any = None, run_id: Any = None) -> dict[str, str]:
        """Erase everything added in the scopes these ids cover (a privacy request: unlike ``delete``, nothing of
        it is kept). At least one id is required; :meth:`reset` erases every scope."""
        wanted = _scope(user_id, agent_id, run_id)
        if ANY in wanted.values():
            raise ValidationError(f"delete_all erases the scopes it names: {ANY!r} names none (reset() erases all)")
        for group in scopes_covered(self._memory.groups(), wanted):
            self._memory.delete_group(group)
        return {"message": "Memories deleted successfully!"}

    def reset(self) -> None:
        """Erase every scope this facade wrote (groups not made by it are left alone)."""
        for group in self._memory.groups():
            if scope_of(group) is not None:
                self._memory.delete_group(group)

    # ------------------------------------------------------------------------------------------------------
    # reads

    def get(self, memory_id: str) -> dict[str, Any] | None:
        """The memory with this id (a fact or a kept message; an updated fact's newest version), or None."""
        try:
            record = self._latest(self._record(memory_id))
        except NotFoundError:
            return None
        if isinstance(record, Fact):
            # A deleted (ended) memory is not found, as in Mem0: history() and get_all(show_expired=True) show it.
            return None if _ended(record, self._memory.clock.now()) else self._fact_items([record])[0]
        return self._episode_item(record)

    def get_all(
        self,
        *,
        filters: Mapping[str, Any] | None = None,
        top_k: int | None = None,
        limit: int | None = None,
        show_expired: bool = False,
        user_id: Any = None,
        agent_id: Any = None,
        run_id: Any = None,
        as_of: datetime | str | None = None,
        known_at: datetime | str | None = None,
    ) -> dict[str, list[dict[str, Any]]]:
        """The memories of the scopes named in ``filters`` (or by the ids; Mem0's older form), newest first:
        current facts and kept messages, with the metadata conditions of ``filters``. ``show_expired`` adds facts
        that have ended; ``as_of`` / ``known_at`` read the memory at another time."""
        count = _count(top_k, limit, default=100)
        groups, condition = self._read_scope(filters, user_id, agent_id, run_id)
        if not groups:
            return {"results": []}
        facts = self._memory.get_all(groups, as_of=as_of, known_at=known_at, include_invalidated=show_expired)
        seen_at = to_utc(known_at, "known_at") if known_at is not None else None
        said_by = to_utc(as_of, "as_of") if as_of is not None else None
        kept = [
            item
            for e in self._memory.episodes(groups)
            if unextracted(e) and (said_by is None or e.reference_time <= said_by)
            for item in [self._episode_item(e, seen_at)]
            if item is not None
        ]
        items = [*self._fact_items(facts, seen_at), *kept]
        today = None if show_expired else self._today(as_of)
        items = [item for item in items if matches(_filterable(item), condition) and not _expired(item, today)]
        items.sort(key=lambda item: item["created_at"], reverse=True)
        return {"results": items[:count]}

    def search(
        self,
        query: str,
        *,
        filters: Mapping[str, Any] | None = None,
        top_k: int | None = None,
        limit: int | None = None,
        threshold: float | None = None,
        rerank: bool = False,
        show_expired: bool = False,
        user_id: Any = None,
        agent_id: Any = None,
        run_id: Any = None,
        as_of: datetime | str | None = None,
        known_at: datetime | str | None = None,
    ) -> dict[str, list[dict[str, Any]]]:
        """tkg's hybrid search (cosine + BM25 + graph, fused) over the scopes named in ``filters`` (or by the ids),
        best first, each item with its ``score``. ``threshold`` (0-1) drops memories whose cosine similarity to the
        query is lower; ``rerank`` is accepted for compatibility (tkg's ranking always fuses its signals)."""
        if not isinstance(query, str) or not query.strip():
            raise ValidationError("query must be a non-empty string")
        if threshold is not None and (
            not isinstance(threshold, int | float) or isinstance(threshold, bool) or not 0 <= threshold <= 1
        ):
            raise ValidationError(f"threshold must be a number between 0 and 1, got {threshold!r}")
        count = _count(top_k, limit, default=20)
        groups, condition = self._read_scope(filters, user_id, agent_id, run_id)
        if not groups or count == 0:
            return {"results": []}
        seen_at = to_utc(known_at, "known_at") if known_at is not None else None
        today = None if show_expired else self._today(as_of)
        fetch = max(3 * count, 30)
        while True:
            found = self._memory.search(
                query,
                group_ids=groups,
                targets=("facts", "episodes"),
                limit=fetch,
                as_of=as_of,
                known_at=known_at,
                include_invalidated=show_expired,
            )
            scored = merged(found, keep=unextracted)
            if threshold is not None:
                scored = self._above(query, scored, threshold)
            facts = self._fact_items([r for _, r in scored if isinstance(r, Fact)], seen_at)
            by_id = {item["id"]: item for item in facts}
            items = []
            for score, record in scored:
                item = by_id[record.id] if isinstance(record, Fact) else self._episode_item(record)
                if matches(_filterable(item), condition) and not _expired(item, today):
                    items.append({**item, "score": score})
            # A metadata filter (and an expiration date) applies to what the search found: when it leaves fewer than
            # asked while the search had more to give, ask for more (as Mem0 filters before it ranks).
            if len(items) >= count or max(len(found.facts), len(found.episodes)) < fetch:
                return {"results": items[:count]}
            fetch *= 4

    def history(self, memory_id: str) -> list[dict[str, Any]]:
        """The changes of a memory, oldest first, in Mem0's shape (``event`` ADD / UPDATE / DELETE, ``old_memory``,
        ``new_memory``, ``created_at`` of the memory and ``updated_at`` of the change, ``is_deleted``), each row
        with its version's ``valid_at``, ``invalid_at`` and ``expired_at`` added. Every version of an updated fact
        is in it, whichever id is given; an unknown id has no history."""
        try:
            record = self._record(memory_id)
        except NotFoundError:
            return []
        events: list[dict[str, Any]] = []
        if isinstance(record, Episode):
            text = _parts(record)[2]
            versions = [*self._metadata_of(record, reserved=True).get(_PREVIOUS, []), None]
            previous: str | None = None
            for version in versions:
                current = text if version is None else version["memory"]
                when = record.created_at if version is None else datetime.fromisoformat(version["created_at"])
                event = "UPDATE" if previous else "ADD"
                events.append(_event(record.id, event, previous, current, when, record, _role_and_actor(record)))
                previous = current
        else:
            chain = self._versions(record)
            episodes = self._episodes_of(chain)
            said_by = self._said_by(chain[0], episodes)
            for n, fact in enumerate(chain):
                old = chain[n - 1].fact if n else None
                events.append(_event(fact.id, "UPDATE" if n else "ADD", old, fact.fact, fact.created_at, fact, said_by))
                for update in _restating_updates(fact, episodes):  # its metadata changed, its text kept
                    events.append(_event(fact.id, "UPDATE", fact.fact, fact.fact, update.created_at, fact, said_by))
            last = chain[-1]
            for entry in last.attributes.get(ENDED_BY_HAND, ()):
                when = datetime.fromisoformat(entry["recorded_at"])
                events.append(_event(last.id, "DELETE", last.fact, None, when, last, said_by))
            if last.expired_at is not None:
                ended = _event(last.id, "DELETE", last.fact, None, last.expired_at, last, said_by)
                events.append({**ended, "invalidated_by": last.invalidated_by})
        events.sort(key=lambda e: datetime.fromisoformat(e["updated_at"]))
        # as in Mem0, every row carries when the memory was created (its first version), the change's own time
        # being updated_at
        first = events[0]["created_at"] if events else None
        return [{**e, "created_at": first, "id": f"{memory_id}.{n}"} for n, e in enumerate(events)]

    # ------------------------------------------------------------------------------------------------------
    # helpers

    def _record(self, memory_id: str) -> Fact | Episode:
        if not isinstance(memory_id, str) or not memory_id:
            raise ValidationError(f"memory_id must be a non-empty string, got {memory_id!r}")
        fact, episode = (self._memory.get_many(kind, [memory_id])[0] for kind in (Kind.FACT, Kind.EPISODE))
        record = fact or episode
        if not isinstance(record, Fact | Episode) or scope_of(record.group_id) is None:
            raise MemoryNotFoundError(f"Memory with id {memory_id} not found")
        return record

    def _today(self, as_of: datetime | str | None) -> date:
        """The day an expiration date is judged on: the read's ``as_of``, else the clock's (UTC)."""
        return (to_utc(as_of, "as_of") if as_of is not None else to_utc(self._memory.clock.now())).date()

    @staticmethod
    def _require_current(fact: Fact, now: datetime) -> None:
        if _ended(fact, now):
            raise MemoryNotFoundError(f"memory {fact.id} has ended already; history({fact.id!r}) shows when")

    def _read_scope(
        self, filters: Mapping[str, Any] | None, user_id: Any, agent_id: Any, run_id: Any
    ) -> tuple[list[str], dict[str, Any]]:
        wanted, condition = _split(filters)
        for key, value in (("user_id", user_id), ("agent_id", agent_id), ("run_id", run_id)):
            checked = check_scope_id(value, key)
            if checked is not None:
                if wanted.get(key, checked) not in (checked, ANY):  # a named id narrows a "*" of the filters
                    raise ValidationError(f"{key} is {checked!r} but filters say {wanted[key]!r}")
                wanted[key] = checked
        if not wanted:
            raise ValidationError("filters must name at least one of user_id, agent_id, run_id")
        return scopes_covered(self._memory.groups(), wanted), condition

    def _metadata_of(self, record: Fact | Episode, *, reserved: bool = False) -> dict[str, Any]:
        if isinstance(record, Fact):
            meta = self._facts_metadata([record])[0][0]
        else:
            meta = dict(record.attributes.get("metadata", {}))
        return meta if reserved else {k: v for k, v in meta.items() if not k.startswith(RESERVED)}

    def _facts_metadata(
        self, facts: Sequence[Fact], known_at: datetime | None = None, episodes: Mapping[str, Episode] | None = None
    ) -> list[tuple[dict[str, Any], datetime | None]]:
        """Each fact's metadata: its first episode's, then, laid over it in order, the caller's metadata of each
        metadata update that restated this same fact (:func:`_restating_updates`); at ``known_at``, those made
        by then. With it, when the last of those updates was made (None: none). ``episodes``: the facts'
        episodes, when read already."""
        episodes = self._episodes_of(facts) if episodes is None else episodes
        out = []
        for fact in facts:
            first = episodes.get(fact.episodes[0]) if fact.episodes else None
            meta = dict(first.attributes.get("metadata", {})) if first is not None else {}
            updated = None
            for update in _restating_updates(fact, episodes):
                if known_at is None or update.created_at <= known_at:
                    later = update.attributes["metadata"]
                    meta.update((k, v) for k, v in later.items() if not k.startswith(RESERVED))
                    updated = update.created_at
            out.append((meta, updated))
        return out

    def _episodes_of(self, facts: Sequence[Fact]) -> dict[str, Episode]:
        wanted = list(dict.fromkeys(e for f in facts for e in f.episodes))
        return {e.id: e for e in self._memory.get_many(Kind.EPISODE, wanted) if isinstance(e, Episode)}

    def _latest(self, record: Fact | Episode) -> Fact | Episode:
        """The newest version of a memory: an updated fact names the fact that replaced it."""
        seen = {record.id}
        while isinstance(record, Fact) and (following := _replaced_by(record)) and following not in seen:
            newer = self._memory.get_many(Kind.FACT, [following])[0]
            if not isinstance(newer, Fact):
                break
            record = newer
            seen.add(record.id)
        return record

    def _versions(self, fact: Fact) -> list[Fact]:
        """Every version of an updated fact, oldest first."""
        chain = [fact]
        while (previous := self._metadata_of(chain[0], reserved=True).get(_REPLACES)) and len(chain) < 1000:
            older = self._memory.get_many(Kind.FACT, [str(previous)])[0]
            if not isinstance(older, Fact) or older in chain:
                break
            chain.insert(0, older)
        newest = self._latest(fact)
        while chain[-1].id != newest.id and len(chain) < 1000:
            following = _replaced_by(chain[-1])
            newer = self._memory.get_many(Kind.FACT, [following])[0] if following else None
            if not isinstance(newer, Fact):
                break
            chain.append(newer)
        return chain

    def _said_by(self, fact: Fact, episodes: Mapping[str, Episode] | None = None) -> tuple[str | None, str | None]:
        """(role, actor_id) of the message a fact was extracted from (an updated fact: its first version's), as
        Mem0 keeps them on the memories of a message; (None, None) for facts given as facts."""
        episodes = self._episodes_of([fact]) if episodes is None else episodes
        first = episodes.get(fact.episodes[0]) if fact.episodes else None
        if first is None:
            return None, None
        kept = first.attributes.get("metadata", {}).get(_SAID_BY)
        if isinstance(kept, list) and len(kept) == 2:
            return kept[0], kept[1]
        if first.source is not EpisodeSource.MESSAGE:
            return None, None
        return _role_and_actor(first)

    def _fact_items(self, facts: Sequence[Fact], known_at: datetime | None = None) -> list[dict[str, Any]]:
        items = []
        episodes = self._episodes_of(facts)
        for fact, (meta, restated) in zip(facts, self._facts_metadata(facts, known_at, episodes), strict=True):
            role, actor = self._said_by(fact, episodes)
            ends = fact.attributes.get(ENDED_BY_HAND, ())
            # updated: the last end given by hand, or the last update that restated the fact (its metadata)
            times = [t for t in (ends[-1]["recorded_at"] if ends else None, restated and restated.isoformat()) if t]
            items.append(
                {
                    **_item(fact.id, fact.fact, fact.group_id, fact.created_at, meta),
                    "updated_at": max(times, key=datetime.fromisoformat) if times else fact.created_at.isoformat(),
                    "kind": "fact",
                    "role": role,
                    "actor_id": actor,
                    "valid_at": iso_offset(fact.valid_at),
                    "invalid_at": iso_offset(fact.invalid_at),
                    "expired_at": iso_offset(fact.expired_at),
                }
            )
        return items

    @overload
    def _episode_item(self, episode: Episode) -> dict[str, Any]: ...
    @overload
    def _episode_item(self, episode: Episode, known_at: datetime | None) -> dict[str, Any] | None: ...
    def _episode_item(self, episode: Episode, known_at: datetime | None = None) -> dict[str, Any] | None:
        """The kept message as Mem0's item; as it read at ``known_at`` when given (an updated message: the version
        of then), None if it was not kept yet then."""
        role, actor = _role_and_actor(episode)
        text = _parts(episode)[2]
        # an updated message keeps its id, so it is Mem0's one memory: created first, updated at each new version
        versions = [*(self._metadata_of(episode, reserved=True).get(_PREVIOUS) or []), None]  # None: the current
        if known_at is not None and known_at < episode.created_at:
            versions = [v for v in versions[:-1] if datetime.fromisoformat(v["created_at"]) <= known_at]
            if not versions:
                return None
        shown = versions[-1]
        item = _item(
            episode.id,
            text if shown is None else shown["memory"],
            episode.group_id,
            episode.created_at if shown is None else datetime.fromisoformat(shown["created_at"]),
            episode.attributes.get("metadata", {}),
        )
        if len(versions) > 1:
            item["created_at"], item["updated_at"] = versions[0]["created_at"], item["created_at"]
        return {
            **item,
            "kind": "message",
            "role": role,
            "actor_id": actor,
            "valid_at": iso_offset(episode.local_reference),
            "invalid_at": None,
            "expired_at": None,
        }

    def _fact_event(self, fact: Fact, episode: Episode) -> dict[str, Any]:
        item = self._fact_items([fact])[0]
        if fact.episodes and fact.episodes[0] == episode.id:
            return {**item, "event": "ADD"}
        if episode.id in fact.episodes:
            return {**item, "event": "NOOP"}
        return {**item, "event": "DELETE" if fact.invalidated_by is not None else "NOOP"}

    def _above(
        self, query: str, scored: list[tuple[float, Fact | Episode]], threshold: float
    ) -> list[tuple[float, Fact | Episode]]:
        """The memories whose text is at least ``threshold`` similar to the query by cosine: a fact's stored vector;
        a kept message's stored vector is of "Speaker: text", not of the memory shown, so a message that it does
        not pass is judged again on its text, embedded here (each text once: remembered for later searches)."""
        vector = _unit(self._memory.embedder.embed([query])[0])
        first = [(score, record, _cosine(vector, record.embedding)) for score, record in scored]
        again = {  # the kept messages their stored vector does not pass: their shown text
            r.id: _parts(r)[2] for _, r, c in first if isinstance(r, Episode) and (c is None or c < threshold)
        }
        texts = [t for t in dict.fromkeys(again.values()) if t not in self._shown_vectors]
        if texts:
            if len(self._shown_vectors) + len(texts) > _SHOWN_VECTORS:
                self._shown_vectors.clear()
            self._shown_vectors.update(zip(texts, self._memory.embedder.embed(texts), strict=True))
        kept = []
        for score, record, cosine in first:
            if record.id in again:
                cosine = _cosine(vector, self._shown_vectors.get(again[record.id]))
            if cosine is not None and cosine >= threshold:
                kept.append((score, record))
        return kept


def _awaited(method: Callable[..., R]) -> Callable[..., Coroutine[Any, Any, R]]:
    """``method`` of :class:`Memory` as a coroutine of :class:`AsyncMemory`, run on a thread of the event loop's
    default pool (the memory serialises store access itself)."""

    @functools.wraps(method)
    async def call(self: AsyncMemory, *args: Any, **kwargs: Any) -> R:
        return await asyncio.to_thread(method, self.sync, *args, **kwargs)

    return call


class AsyncMemory:
    """Mem0's ``AsyncMemory``: the calls of :class:`Memory`, awaited. Each runs on a thread, so the event loop
    keeps running while an extraction waits for its LLM; cancelling an ``await`` does not undo its call."""

    def __init__(self, config: Mapping[str, Any] | None = None, *, memory: TkgMemory | None = None) -> None:
        self.sync = Memory(config, memory=memory)

    @classmethod
    def from_config(cls, config_dict: Mapping[str, Any]) -> Self:
        return cls(config_dict)

    @property
    def tkg(self) -> TkgMemory:
        """The tkg memory underneath."""
        return self.sync.tkg

    add = _awaited(Memory.add)
    update = _awaited(Memory.update)
    delete = _awaited(Memory.delete)
    delete_all = _awaited(Memory.delete_all)
    reset = _awaited(Memory.reset)
    get = _awaited(Memory.get)
    get_all = _awaited(Memory.get_all)
    search = _awaited(Memory.search)
    history = _awaited(Memory.history)
    close = _awaited(Memory.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


# ----------------------------------------------------------------------------------------------------------
# pure helpers


def _memory_from_config(config: Mapping[str, Any]) -> TkgMemory:
    from tkg.environment import EMBEDDERS, llm_from_env, make_embedder

    unknown = sorted(set(config) - {"llm", "embedder", *_IGNORED_CONFIG})
    if unknown:
        raise ConfigurationError(f"unknown config key(s) {unknown}; tkg reads llm and embedder")
    for key in _IGNORED_CONFIG:
        if key in config:
            log.warning("config[%r] is ignored: tkg keeps its own storage, history and ranking", key)
    for key in ("llm", "embedder"):
        if config.get(key) is not None and not isinstance(config[key], Mapping):
            raise ConfigurationError(f"config[{key!r}] must be a dict such as {{'provider': ..., 'config': {{...}}}}")
    embedder_config = config.get("embedder") or {}
    provider = embedder_config.get("provider", "auto")
    if provider not in EMBEDDERS:
        raise ConfigurationError(f"embedder provider {provider!r}: tkg has {', '.join(EMBEDDERS)}")
    embedder_settings = embedder_config.get("config") or {}
    if not isinstance(embedder_settings, Mapping):
        raise ConfigurationError(
            "config['embedder']['config'] must be a dict such as {'model': ..., 'embedding_dims': ...}"
        )
    if provider == "openai":
        embedder = _openai_embedder(embedder_settings)
    else:
        if embedder_settings:
            log.warning("config['embedder']['config'] is ignored: the %r embedder takes no settings", provider)
        embedder = make_embedder(provider)
    llm_config = config.get("llm")
    if llm_config is None:
        return TkgMemory(embedder=embedder, llm=llm_from_env())
    if llm_config.get("provider", "openai") not in ("openai", "openai_structured", "lmstudio", "vllm", "ollama"):
        raise ConfigurationError(
            f"llm provider {llm_config.get('provider')!r}: tkg talks to any OpenAI-compatible endpoint; give "
            "provider 'openai' with its base URL (openai_base_url)"
        )
    from tkg.llm.openai import OpenAILLM

    settings = llm_config.get("config") or {}
    base_url = settings.get("openai_base_url") or settings.get("base_url") or settings.get("ollama_base_url")
    llm = OpenAILLM(
        settings.get("model") or "gpt-4o-mini", base_url=base_url, api_key=settings.get("api_key") or "sk-no-key"
    )
    return TkgMemory(embedder=embedder, llm=llm)


def _openai_embedder(settings: Mapping[str, Any]) -> Embedder:
    """Mem0's ``{"provider": "openai", "config": {...}}`` embedder: ``model`` (default text-embedding-3-small),
    ``embedding_dims`` (default 1536, as Mem0's; asked of text-embedding-3 models), ``api_key`` (default
    ``OPENAI_API_KEY``) and ``openai_base_url`` (default ``OPENAI_BASE_URL``) of any OpenAI-compatible
    ``/embeddings`` endpoint."""
    from tkg.embedders.openai import OpenAIEmbedder

    unknown = sorted(set(settings) - {"model", "embedding_dims", "api_key", "openai_base_url", "base_url"})
    if unknown:
        raise ConfigurationError(
            f"config['embedder']['config']: unknown key(s) {unknown}; the openai embedder reads model, "
            "embedding_dims, api_key and openai_base_url"
        )
    model = settings.get("model") or "text-embedding-3-small"
    dims = settings.get("embedding_dims", 1536)
    if not isinstance(model, str):
        raise ConfigurationError(f"config['embedder']['config']['model'] must be a string, got {model!r}")
    if isinstance(dims, bool) or not isinstance(dims, int) or dims < 1:
        raise ConfigurationError(f"config['embedder']['config']['embedding_dims'] must be a positive int, got {dims!r}")
    base_url = settings.get("openai_base_url") or settings.get("base_url") or os.environ.get("OPENAI_BASE_URL")
    api_key = settings.get("api_key") or os.environ.get("OPENAI_API_KEY") or "sk-no-key"
    # As Mem0 does, text-embedding-3 models are asked for vectors of embedding_dims (they shorten to any size).
    ask_dim = model.startswith("text-embedding-3")
    return OpenAIEmbedder(model, dims, base_url=base_url or None, api_key=api_key, ask_dim=ask_dim)


def _scope(user_id: Any, agent_id: Any, run_id: Any) -> dict[str, str]:
    scope = {}
    for key, value in (("user_id", user_id), ("agent_id", agent_id), ("run_id", run_id)):
        checked = check_scope_id(value, key)
        if checked is not None:
            scope[key] = checked
    if not scope:
        raise ValidationError("at least one of user_id, agent_id or run_id is required")
    return scope


def _caller_metadata(metadata: Mapping[str, Any] | None) -> dict[str, Any]:
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise ValidationError(f"metadata must be a dict, got {type(metadata).__name__}")
    clean = {}
    for key, value in metadata.items():
        if isinstance(key, str) and key.startswith(RESERVED):
            raise ValidationError(f"metadata key {key!r}: the prefix {RESERVED!r} is tkg's own")
        if key in SCOPE_KEYS or key == "actor_id":
            log.warning("metadata[%r] is ignored: scopes are set by user_id, agent_id and run_id", key)
            continue
        clean[key] = value
    return clean


def _when(timestamp: datetime | str | int | float | None) -> datetime | None:
    if timestamp is None:
        return None
    if isinstance(timestamp, int | float) and not isinstance(timestamp, bool):
        try:
            return datetime.fromtimestamp(timestamp, tz=UTC)
        except (ValueError, OverflowError, OSError):
            raise ValidationError(f"timestamp {timestamp!r} is not a time in Unix seconds tkg can hold") from None
    if isinstance(timestamp, datetime | str):
        return to_aware(timestamp, "timestamp")  # in its own offset: relative dates are read on that calendar
    raise ValidationError(f"timestamp must be a datetime, an ISO-8601 string or Unix seconds, got {timestamp!r}")


def _parts(episode: Episode) -> Message:
    return message_of(episode, SOURCE)


def _unit(vector: Any) -> npt.NDArray[np.float32]:
    row = np.asarray(vector, dtype=np.float32)
    return row / (float(np.linalg.norm(row)) or 1.0)


def _cosine(unit_query: npt.NDArray[np.float32], vector: Any) -> float | None:
    """The cosine of a unit query and a vector (None: no vector)."""
    return None if vector is None else float(unit_query @ _unit(vector))


def _role_and_actor(episode: Episode) -> tuple[str, str | None]:
    """A message's role, and its actor (the speaker's name, when it is not the role's)."""
    role, speaker, _ = _parts(episode)
    return role, speaker if speaker and speaker != role.title() else None


def _item(record_id: str, text: str, group: str, created_at: datetime, metadata: Mapping[str, Any]) -> dict[str, Any]:
    scope = scope_of(group) or {}
    shown = {k: v for k, v in metadata.items() if not k.startswith(RESERVED) and k != EXPIRES}
    return {
        "id": record_id,
        "memory": text,
        "hash": hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest(),  # Mem0's content hash
        "metadata": shown or None,
        "created_at": created_at.isoformat(),
        "updated_at": created_at.isoformat(),  # as Mem0: a new memory was last updated when it was created
        **({EXPIRES: metadata[EXPIRES]} if EXPIRES in metadata else {}),  # beside the metadata, as Mem0 shows it
        **scope,
    }


def _filterable(item: Mapping[str, Any]) -> dict[str, Any]:
    """What a metadata filter sees: the message's actor and role, the memory's ``created_at`` / ``updated_at`` (as
    times), the metadata, and the memory's own scope ids (last: a filter on ``user_id`` inside ``AND`` / ``OR`` /
    ``NOT`` reads the scope it was added in)."""
    fields: dict[str, Any] = {key: item[key] for key in ("actor_id", "role", EXPIRES) if item.get(key) is not None}
    fields.update((key, datetime.fromisoformat(item[key])) for key in ("created_at", "updated_at") if item.get(key))
    scope = {key: item[key] for key in SCOPE_KEYS if item.get(key) is not None}
    return {**fields, **(item.get("metadata") or {}), **scope}


def _expiration(value: Any) -> str | None:
    """An expiration date as Mem0 keeps it: None, or the ISO date (YYYY-MM-DD) of a date, a datetime or a string."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.date().isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, str):
        try:
            return date.fromisoformat(value.strip()).isoformat()
        except ValueError:
            raise ValidationError(f"expiration_date must be a date in YYYY-MM-DD format, got {value!r}") from None
    raise ValidationError(f"expiration_date must be a date in YYYY-MM-DD format, got {value!r}")


def _expired(item: Mapping[str, Any], today: date | None) -> bool:
    """Has the memory's expiration date passed by ``today`` (None: expired memories are shown)? One given in the
    metadata counts too (Mem0 keeps both in one payload); a value that is no date expires nothing, as in Mem0."""
    expires = item.get(EXPIRES)
    if today is None or not isinstance(expires, str):
        return False
    try:
        return date.fromisoformat(expires) < today
    except ValueError:
        return False


def _ended(fact: Fact, now: datetime) -> bool:
    """Whether a fact is over: superseded, ended by now, or holding for no time at all (a memory that had not
    started yet when it was deleted ends where it starts)."""
    end = fact.invalid_at
    return fact.expired_at is not None or (
        end is not None and (end <= now or (fact.valid_at is not None and end <= fact.valid_at))
    )


def _event(
    memory_id: str,
    event: str,
    old: str | None,
    new: str | None,
    when: datetime,
    record: Fact | Episode,
    said_by: tuple[str | None, str | None],
) -> dict[str, Any]:
    """One row of a memory's history: the change made ``when``; ``said_by``: the (role, actor_id) of its message."""
    fact = record if isinstance(record, Fact) else None
    return {
        "memory_id": memory_id,
        "old_memory": old,
        "new_memory": new,
        "event": event,
        "created_at": when.isoformat(),
        "updated_at": when.isoformat(),
        "is_deleted": event == "DELETE",
        "role": said_by[0],
        "actor_id": said_by[1],
        "valid_at": iso_offset(fact.valid_at) if fact else iso_offset(record.local_reference),  # type: ignore[union-attr]
        "invalid_at": iso_offset(fact.invalid_at) if fact else None,
        "expired_at": iso_offset(fact.expired_at) if fact else None,
    }


def _restating_updates(fact: Fact, episodes: Mapping[str, Episode]) -> list[Episode]:
    """The episodes of ``fact`` (in ``episodes``) after its first that are updates of this same fact: an update
    whose new version restates the fact -- same text, same times, as when the fact has not started yet -- adds
    its episode to the fact instead of a new fact, so its metadata lives there."""
    return [
        e
        for e in (episodes.get(i) for i in fact.episodes[1:])
        if e is not None and e.attributes.get("metadata", {}).get(_REPLACES) == fact.id
    ]


def _replaced_by(fact: Fact) -> str | None:
    """The fact that replaced this one in an update (the note of its last end given by hand), if any."""
    ends = fact.attributes.get(ENDED_BY_HAND, ())
    note = ends[-1].get("note") or {} if ends else {}
    following = note.get("replaced_by")
    return str(following) if following else None


def _count(top_k: int | None, limit: int | None, *, default: int) -> int:
    value = top_k if top_k is not None else limit if limit is not None else default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValidationError(f"top_k must be a non-negative integer, got {value!r}")
    return value
