"""The public facade: add episodes and facts, search, build context, snapshot."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tkg import snapshot
from tkg.clock import Clock, SystemClock
from tkg.config import MemoryConfig
from tkg.context import build_context
from tkg.embedders.base import Embedder, check_vectors
from tkg.errors import ConfigurationError, EpisodeError, NotFoundError, UnknownGroupError, ValidationError
from tkg.extraction import GraphBuilder, embedding_texts, speaker_of
from tkg.llm.base import LLMClient, LLMUsage
from tkg.llm.prompts import extraction_prompt
from tkg.llm.schema import GraphExtraction
from tkg.models import Entity, Episode, EpisodeSource, Fact, Kind, Mention, Record, check_group_id, check_id, new_id
from tkg.search import TARGETS, SearchResults, hybrid_search
from tkg.storage import Store, WriteBatch
from tkg.timeline import make_scope
from tkg.timeutil import optional_utc, to_utc


@dataclass(frozen=True, slots=True)
class FactInput:
    """A structured fact for :meth:`Memory.add_facts` (no LLM involved).

    >>> FactInput("Alice", "WORKS_AT", "Acme", valid_at="2021-01-01T00:00:00Z").relation
    'WORKS_AT'
    """

    subject: str
    relation: str
    object: str
    fact: str | None = None
    valid_at: datetime | str | None = None
    invalid_at: datetime | str | None = None
    subject_label: str = "Entity"
    object_label: str = "Entity"

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> FactInput:
        try:
            return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        except TypeError as exc:
            raise ValidationError(f"a fact needs subject, relation and object: {exc}") from None


@dataclass(frozen=True, slots=True)
class EpisodeResult:
    """What one ingestion wrote: the episode, the entities and facts it created or touched, and its LLM cost."""

    episode: Episode
    entities: list[Entity] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    usage: LLMUsage = field(default_factory=LLMUsage)
    warnings: list[str] = field(default_factory=list)


class Memory:
    """An embedded temporal knowledge-graph memory.

    >>> from tkg import Memory, HashEmbedder, FixedClock
    >>> memory = Memory(embedder=HashEmbedder(), clock=FixedClock("2024-05-01T00:00:00Z"))
    >>> _ = memory.add_facts([FactInput("Alice", "WORKS_AT", "Acme")], group_id="demo")
    >>> memory.search("where does Alice work?", group_ids=["demo"]).facts[0].record.fact
    'Alice works at Acme'
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        embedder: Embedder,
        llm: LLMClient | None = None,
        clock: Clock | None = None,
        config: MemoryConfig | None = None,
    ) -> None:
        if store is None:
            from tkg.backends.memory import InMemoryStore

            store = InMemoryStore(dim=embedder.dim)
        if store.dim != embedder.dim:
            raise ConfigurationError(f"the store holds {store.dim}-d vectors but the embedder makes {embedder.dim}-d")
        self.store = store
        self.embedder = embedder
        self.llm = llm
        self.clock = clock or SystemClock()
        self.config = config or MemoryConfig()

    # ------------------------------------------------------------------------------------------------------
    # ingestion
    def add_episode(
        self,
        content: str | Mapping[str, Any] | list[Any],
        *,
        group_id: str | None = None,
        source: EpisodeSource | str = EpisodeSource.MESSAGE,
        reference_time: datetime | str | None = None,
        source_description: str = "",
        name: str = "",
        episode_id: str | None = None,
    ) -> EpisodeResult:
        """Store an episode and, with an LLM configured, extract its entities and facts (one LLM call).

        ``content`` is kept verbatim. For ``source="message"`` write ``"Speaker: text"``; the speaker becomes an
        entity even without an LLM. ``reference_time`` (default: now) anchors relative dates in the text.
        """
        now = self.clock.now()
        episode = self._episode(content, group_id, source, reference_time, source_description, name, episode_id, now)
        builder = GraphBuilder(self.store, episode, now, self.config.date_languages)
        usage = LLMUsage()
        speaker = speaker_of(episode.content) if episode.source is EpisodeSource.MESSAGE else None
        if self.llm is not None:
            previous = self.store.recent_episodes(
                episode.group_id, episode.reference_time, self.config.context_episodes
            )
            prompt = extraction_prompt(episode, previous, speaker)
            usage.record(prompt)
            extraction = self.llm.generate(prompt, GraphExtraction)
            builder.add_extraction(extraction, speaker)
        elif speaker:
            builder.entity(speaker, "Person")
        return self._commit(episode, builder, usage)

    def add_facts(
        self,
        facts: Iterable[FactInput | Mapping[str, Any]],
        *,
        group_id: str | None = None,
        reference_time: datetime | str | None = None,
        source_description: str = "structured facts",
    ) -> EpisodeResult:
        """Ingest structured facts with no LLM at all.

        The input is kept as one JSON episode (the facts' provenance). A fact without ``valid_at`` is taken to
        hold from the reference time (default: now); ``invalid_at`` closes it.
        """
        items = [f if isinstance(f, FactInput) else FactInput.from_mapping(f) for f in facts]
        if not items:
            raise ValidationError("add_facts needs at least one fact")
        for item in items:
            for part in (item.subject, item.relation, item.object):
                if not isinstance(part, str) or not part.strip():
                    raise ValidationError(f"fact {item!r} has an empty subject, relation or object")
        now = self.clock.now()
        parsed = [
            (item, optional_utc(item.valid_at, "valid_at"), optional_utc(item.invalid_at, "invalid_at"))
            for item in items
        ]
        for item, start, end in parsed:
            if start is not None and end is not None and end < start:
                raise ValidationError(
                    f"fact {item.subject} {item.relation} {item.object}: invalid_at is before valid_at"
                )
        document = [
            {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in vars_of(item).items() if v is not None}
            for item in items
        ]
        episode = self._episode(
            document, group_id, EpisodeSource.JSON, reference_time, source_description, "", None, now
        )
        builder = GraphBuilder(self.store, episode, now, self.config.date_languages)
        for item, start, end in parsed:
            builder.entity(item.subject, item.subject_label)
            builder.entity(item.object, item.object_label)
            builder.fact(item.subject, item.relation, item.object, item.fact, start or episode.reference_time, end)
        return self._commit(episode, builder, LLMUsage())

    def _episode(
        self,
        content: str | Mapping[str, Any] | list[Any],
        group_id: str | None,
        source: EpisodeSource | str,
        reference_time: datetime | str | None,
        source_description: str,
        name: str,
        episode_id: str | None,
        now: datetime,
    ) -> Episode:
        try:
            kind = EpisodeSource(source)
        except ValueError:
            raise EpisodeError(f"source {source!r} is unknown; use one of message, text, json") from None
        if kind is EpisodeSource.JSON and not isinstance(content, str):
            try:
                content = json.dumps(content, ensure_ascii=False, sort_keys=True)
            except (TypeError, ValueError) as exc:
                raise EpisodeError(f"JSON episode content is not serialisable: {exc}") from None
        if not isinstance(content, str):
            raise EpisodeError(
                f"episode content must be a string (or a JSON value for source='json'), got {type(content).__name__}"
            )
        if not content.strip():
            raise EpisodeError("episode content is empty or whitespace; nothing to remember")
        if len(content) > self.config.max_episode_chars:
            raise EpisodeError(
                f"episode has {len(content):,} characters, more than MemoryConfig.max_episode_chars "
                f"({self.config.max_episode_chars:,}); split it into several episodes"
            )
        if kind is EpisodeSource.JSON:
            try:
                json.loads(content)
            except ValueError as exc:
                raise EpisodeError(f"source='json' but the content is not valid JSON: {exc}") from None
        return Episode(
            id=check_id(episode_id, "episode_id") if episode_id is not None else new_id(),
            group_id=check_group_id(group_id if group_id is not None else self.config.default_group),
            content=content,
            source=kind,
            reference_time=to_utc(reference_time, "reference_time") if reference_time is not None else now,
            created_at=now,
            source_description=str(source_description),
            name=str(name),
        )

    def _commit(self, episode: Episode, builder: GraphBuilder, usage: LLMUsage) -> EpisodeResult:
        if self.store.get(Kind.EPISODE, [episode.id])[0] is not None:
            raise ValidationError(f"episode {episode.id} already exists; episodes are immutable")
        plan = builder.plan
        names, sentences = embedding_texts(plan)
        texts = [episode.content, *names, *sentences]
        vectors = check_vectors(self.embedder.embed(texts), self.embedder.dim, len(texts))
        episode = dataclasses.replace(episode, embedding=vectors[0])
        for i, entity_id in enumerate(plan.fresh_entities, start=1):
            plan.entities[entity_id] = dataclasses.replace(plan.entities[entity_id], name_embedding=vectors[i])
        offset = 1 + len(names)
        for i, fact_id in enumerate(plan.fresh_facts):
            plan.facts[fact_id] = dataclasses.replace(plan.facts[fact_id], embedding=vectors[offset + i])
        puts: list[Record] = [episode, *plan.entities.values(), *plan.facts.values(), *plan.mentions]
        self.store.write(WriteBatch(puts=puts))
        return EpisodeResult(
            episode=episode,
            entities=list(plan.entities.values()),
            facts=list(plan.facts.values()),
            usage=usage,
            warnings=list(plan.warnings),
        )

    # ------------------------------------------------------------------------------------------------------
    # retrieval
    def search(
        self,
        query: str,
        *,
        group_ids: Sequence[str] | str | None = None,
        limit: int | None = None,
        as_of: datetime | str | None = None,
        known_at: datetime | str | None = None,
        include_invalidated: bool = False,
        targets: Sequence[str] = ("facts", "entities", "episodes"),
    ) -> SearchResults:
        """Hybrid search (cosine + BM25, fused by RRF) over facts, entities and episodes.

        By default only facts that hold now are returned. ``as_of`` asks what held in the world at that time;
        ``known_at`` what the memory believed at that time; ``include_invalidated`` returns history too.
        """
        if not isinstance(query, str) or not query.strip():
            raise ValidationError("search query is empty")
        limit = self.config.search_limit if limit is None else limit
        if not isinstance(limit, int) or limit < 1:
            raise ValidationError(f"limit must be a positive integer, got {limit!r}")
        unknown = [t for t in targets if t not in TARGETS]
        if unknown:
            raise ValidationError(f"unknown search targets {unknown}; choose from {sorted(TARGETS)}")
        scope = make_scope(self.clock.now(), group_ids, as_of, known_at, include_invalidated)
        self._check_groups(scope.group_ids)
        vector = check_vectors(self.embedder.embed([query]), self.embedder.dim, 1)[0]
        return hybrid_search(
            self.store,
            query,
            vector,
            scope,
            limit=limit,
            targets=targets,
            candidate_factor=self.config.candidate_factor,
            rrf_k=self.config.rrf_k,
        )

    def context(
        self,
        query: str,
        *,
        max_chars: int | None = None,
        include_episodes: bool = False,
        **search_args: Any,
    ) -> str:
        """The context string for a query: relevant facts with their date ranges, then entities with summaries."""
        return build_context(self.search(query, **search_args), max_chars=max_chars, include_episodes=include_episodes)

    def _check_groups(self, group_ids: frozenset[str] | None) -> None:
        if group_ids is None:
            return
        missing = sorted(group_ids - self.store.groups())
        if missing:
            raise UnknownGroupError(f"group(s) {missing} hold nothing in this memory; add an episode there first")

    # ------------------------------------------------------------------------------------------------------
    # reads
    def get(self, kind: Kind | str, record_id: str) -> Record:
        record = self.store.get(Kind(kind), [record_id])[0]
        if record is None:
            raise NotFoundError(f"no {kind} with id {record_id!r}")
        return record

    def facts_about(self, entity_id: str, *, include_invalidated: bool = True) -> list[Fact]:
        """Every fact touching an entity (its history, by default including ended facts), oldest first."""
        self.get(Kind.ENTITY, entity_id)
        scope = None if include_invalidated else make_scope(self.clock.now())
        return sorted(self.store.facts_of([entity_id], scope), key=lambda f: (f.valid_at or f.created_at, f.id))

    def episode_mentions(self, episode_id: str) -> list[Mention]:
        return self.store.mentions(episode_ids=[episode_id])

    def stats(self) -> dict[str, Any]:
        counts = {kind.value: self.store.count(kind) for kind in Kind}
        return {"records": counts, "groups": sorted(self.store.groups()), "embedder": self.embedder.name}

    # ------------------------------------------------------------------------------------------------------
    # snapshots
    def save(self, path: str | Path) -> int:
        """Write the whole memory to one msgpack file, atomically. Returns the file size in bytes."""
        meta = {"embedder": self.embedder.name, "dim": self.embedder.dim, "saved_at": self.clock.now().isoformat()}
        return snapshot.save(self.store, path, meta)

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        embedder: Embedder,
        llm: LLMClient | None = None,
        clock: Clock | None = None,
        config: MemoryConfig | None = None,
        store: Store | None = None,
        check_embedder: bool = True,
    ) -> Memory:
        """Open a snapshot into a new memory (a fresh in-memory store unless an empty ``store`` is given)."""
        meta, records = snapshot.read(path)
        if meta.get("dim") != embedder.dim:
            raise ConfigurationError(
                f"snapshot {path} holds {meta.get('dim')}-d vectors; the embedder makes {embedder.dim}-d"
            )
        if check_embedder and meta.get("embedder") != embedder.name:
            raise ConfigurationError(
                f"snapshot {path} was embedded with {meta.get('embedder')!r}, not {embedder.name!r}; "
                "pass the same embedder, or check_embedder=False to mix them knowingly"
            )
        memory = cls(store, embedder=embedder, llm=llm, clock=clock, config=config)
        loader = getattr(memory.store, "load", None)
        decoded = list(records)
        if loader is not None:
            loader(decoded)
        else:
            memory.store.write(WriteBatch(puts=decoded))
        return memory


def vars_of(item: FactInput) -> dict[str, Any]:
    return {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
