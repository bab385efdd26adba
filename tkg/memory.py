"""The public facade: add episodes and facts, search, build context, snapshot."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from tkg import snapshot
from tkg.clock import Clock, SystemClock
from tkg.community_tier import CommunityConfig, CommunityReport, CommunityTier
from tkg.config import MemoryConfig
from tkg.context import Context, TokenCounter, approx_tokens, construct
from tkg.drafts import Draft, add_fact
from tkg.embedders.base import Embedder, check_vectors
from tkg.errors import (
    ConfigurationError,
    EpisodeError,
    ExtractionFailedError,
    LLMError,
    NotFoundError,
    TimestampError,
    UnknownGroupError,
    ValidationError,
)
from tkg.ingest import EpisodeResult, Ingestor, RemovalResult
from tkg.llm.base import LLMClient, LLMUsage
from tkg.llm.guard import GuardedLLM
from tkg.llm.schema import GraphExtraction
from tkg.models import (
    Episode,
    EpisodeSource,
    EpisodeStatus,
    Fact,
    Kind,
    Mention,
    Record,
    Vector,
    check_group_id,
    check_id,
    new_id,
)
from tkg.ontology import Ontology
from tkg.rerankers import CrossEncoder, EmbeddingScorer, LLMScorer
from tkg.search import SearchResults, search
from tkg.search_config import TARGET_KINDS, Reranker, SearchConfig, TargetConfig, preset
from tkg.storage import Store, WriteBatch
from tkg.temporal import resolve_time
from tkg.timeline import Filters, make_scope
from tkg.timeutil import optional_utc, to_utc

__all__ = ["EpisodeInput", "EpisodeResult", "FactInput", "Memory", "RemovalResult"]


@dataclass(frozen=True, slots=True)
class FactInput:
    """A structured fact for :meth:`Memory.add_facts` (no LLM involved).

    ``valid_at`` / ``invalid_at`` take datetimes, ISO-8601 strings, or time phrases ("two weeks ago", "in 2019")
    resolved against the call's reference time.

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
        if not isinstance(data, Mapping):
            raise ValidationError(f"a fact must be a FactInput or a mapping, got {type(data).__name__}")
        try:
            return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        except TypeError as exc:
            raise ValidationError(f"a fact needs subject, relation and object: {exc}") from None


@dataclass(frozen=True, slots=True)
class EpisodeInput:
    """One episode for :meth:`Memory.add_episodes` (the arguments of :meth:`Memory.add_episode`)."""

    content: str | Mapping[str, Any] | list[Any]
    group_id: str | None = None
    source: EpisodeSource | str = EpisodeSource.MESSAGE
    reference_time: datetime | str | None = None
    source_description: str = ""
    name: str = ""
    episode_id: str | None = None

    @classmethod
    def of(cls, item: EpisodeInput | Mapping[str, Any] | str) -> EpisodeInput:
        if isinstance(item, EpisodeInput):
            return item
        if isinstance(item, str):
            return cls(item)
        if isinstance(item, Mapping):
            unknown = sorted(set(item) - set(cls.__dataclass_fields__))
            if unknown:
                raise ValidationError(f"unknown episode fields {unknown}")
            try:
                return cls(**item)
            except TypeError as exc:
                raise ValidationError(f"an episode needs content: {exc}") from None
        raise ValidationError(f"an episode must be an EpisodeInput, a mapping or a string, not {type(item).__name__}")


class Memory:
    """An embedded temporal knowledge-graph memory.

    >>> from tkg import Memory, HashEmbedder, FixedClock
    >>> memory = Memory(embedder=HashEmbedder(), clock=FixedClock("2024-05-01T00:00:00Z"))
    >>> _ = memory.add_facts([FactInput("Alice", "WORKS_AT", "Acme")], group_id="demo")
    >>> memory.search("where does Alice work?", group_ids=["demo"]).facts[0].record.fact
    'Alice works at Acme'

    Thread-safe: calls from several threads are serialised on the store, and episodes of one group are applied
    one at a time. LLM calls go through one :class:`~tkg.llm.guard.GuardedLLM` (retries, one concurrency limit,
    one rate limit), and :attr:`usage` sums their cost.
    """

    def __init__(
        self,
        store: Store | None = None,
        *,
        embedder: Embedder,
        llm: LLMClient | None = None,
        clock: Clock | None = None,
        config: MemoryConfig | None = None,
        ontology: Ontology | None = None,
    ) -> None:
        if store is None:
            from tkg.backends.memory import InMemoryStore

            store = InMemoryStore(dim=embedder.dim)
        if store.dim != embedder.dim:
            raise ConfigurationError(f"the store holds {store.dim}-d vectors but the embedder makes {embedder.dim}-d")
        self.store = store
        self.clock = clock or SystemClock()
        self.config = config or MemoryConfig()
        self.ontology = ontology or Ontology()
        self._check_ontology()
        self._lock = threading.RLock()
        self._usage = LLMUsage()
        self._usage_lock = threading.Lock()
        self.communities: CommunityTier | None = (
            CommunityTier(embedder, None, self.clock, self.config.communities)
            if self.config.communities is not None
            else None
        )
        self._ingestor = Ingestor(store, embedder, None, self.config, self.ontology, self._lock, self.communities)
        self._embedder = embedder
        self._llm: LLMClient | None = None
        self.llm = llm

    @property
    def embedder(self) -> Embedder:
        return self._embedder

    @embedder.setter
    def embedder(self, embedder: Embedder) -> None:
        if embedder.dim != self.store.dim:
            raise ConfigurationError(
                f"the store holds {self.store.dim}-d vectors but the embedder makes {embedder.dim}-d"
            )
        self._embedder = embedder
        self._ingestor.embedder = embedder
        if self.communities is not None:
            self.communities.embedder = embedder

    @property
    def llm(self) -> LLMClient | None:
        """The LLM client (its calls go through ``config.llm_policy``); None: no extraction."""
        return self._llm

    @llm.setter
    def llm(self, llm: LLMClient | None) -> None:
        self._llm = llm
        guarded = GuardedLLM(llm, self.config.llm_policy) if llm is not None else None
        self._ingestor.llm = guarded
        if self.communities is not None:
            self.communities.llm = guarded

    @property
    def usage(self) -> LLMUsage:
        """LLM cost of everything this memory has ingested so far (a copy)."""
        with self._usage_lock:
            total = LLMUsage()
            total.add(self._usage)
            return total

    def _count(self, usage: LLMUsage) -> None:
        with self._usage_lock:
            self._usage.add(usage)

    def _check_ontology(self) -> None:
        if not any(r.single_valued for r in self.ontology.relations.values()):
            return
        facts = [f for f in self.store.scan(Kind.FACT) if isinstance(f, Fact)]
        problems = self.ontology.conflicts(facts)
        if problems:
            shown = "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "")
            raise ConfigurationError(f"the ontology conflicts with the data already in memory: {shown}")

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
        extract: bool | None = None,
    ) -> EpisodeResult:
        """Store an episode and extract its entities and facts: one LLM call, plus one batched resolution call
        only when some name or fact stays ambiguous after the deterministic passes.

        ``content`` is kept verbatim. For ``source="message"`` write ``"Speaker: text"``; the speaker is always an
        entity. ``reference_time`` (default: now) anchors relative dates. ``extract=False`` (the default without
        an LLM) stores and indexes the episode, links it to entities the memory already knows by name or alias,
        and records the dates its time phrases denote, with no LLM at all.

        If the LLM fails for good (after the retries of ``config.llm_policy``), the episode is stored with status
        ``failed``, nothing else is written, and :class:`~tkg.errors.ExtractionFailedError` is raised; call
        :meth:`retry` later.
        """
        item = EpisodeInput(content, group_id, source, reference_time, source_description, name, episode_id)
        episode, now = self._new_episode(item)
        return self._run(episode, now, self._wants_llm(extract))

    def _new_episode(self, item: EpisodeInput) -> tuple[Episode, datetime]:
        """The validated episode for the arguments of :meth:`add_episode` (the one place they are checked, for
        every way in), stamped now; and that now."""
        now = self.clock.now()
        episode = self._episode(
            item.content,
            item.group_id,
            item.source,
            item.reference_time,
            item.source_description,
            item.name,
            item.episode_id,
            now,
        )
        return episode, now

    def _wants_llm(self, extract: bool | None) -> bool:
        if extract and self.llm is None:
            raise ConfigurationError("extract=True needs an LLM; pass llm= to Memory, or use extract=False")
        return self.llm is not None if extract is None else bool(extract)

    def _run(
        self,
        episode: Episode,
        now: datetime,
        extract: bool,
        extraction: GraphExtraction | LLMError | None = None,
        usage: LLMUsage | None = None,
        started: float | None = None,
        *,
        vectors: dict[str, Vector] | None = None,
        replace_stored: bool = False,
    ) -> EpisodeResult:
        usage = usage if usage is not None else LLMUsage()
        try:
            return self._ingestor.ingest(
                episode,
                now,
                extract=extract,
                extraction=extraction,
                usage=usage,
                started=started,
                vectors=vectors,
                replace_stored=replace_stored,
            )
        finally:
            self._count(usage)

    def add_episodes(
        self,
        episodes: Iterable[EpisodeInput | Mapping[str, Any] | str],
        *,
        extract: bool | None = None,
    ) -> list[EpisodeResult]:
        """Ingest many episodes: extraction calls run concurrently (up to ``config.llm_policy.max_concurrency``),
        and graph changes apply in the given order within each group (groups in parallel), so contradictions
        between two episodes of one batch are caught. The graph ends up as sequential :meth:`add_episode` calls
        would leave it, given the same LLM answers.

        Returns one result per episode, in order. An episode whose LLM calls failed for good is stored with
        status ``failed`` (see :meth:`retry`); its result says so and the others are unaffected.
        """
        inputs = [EpisodeInput.of(item) for item in episodes]
        extract_ = self._wants_llm(extract)
        prepared: list[tuple[Episode, datetime]] = []
        seen: set[str] = set()
        for item in inputs:
            episode, now = self._new_episode(item)
            if episode.id in seen:
                raise ValidationError(f"episode id {episode.id} appears twice in the batch")
            seen.add(episode.id)
            prepared.append((episode, now))
        with self._lock:
            for episode, _ in prepared:
                self._ingestor.check_new(episode)
        started = time.perf_counter()
        workers = max(1, self.config.llm_policy.max_concurrency)
        usages = [LLMUsage() for _ in prepared]
        extractions: list[GraphExtraction | LLMError | None] = [None] * len(prepared)
        if extract_:

            def extract_one(i: int) -> GraphExtraction | LLMError:
                episode = prepared[i][0]
                earlier = [e for e, _ in prepared[:i]]
                try:
                    return self._ingestor.extract(episode, self._ingestor.previous(episode, earlier), usages[i])
                except LLMError as exc:
                    return exc

            with ThreadPoolExecutor(max_workers=workers) as pool:
                extractions = list(pool.map(extract_one, range(len(prepared))))
        by_group: dict[str, list[int]] = {}
        for i, (episode, _) in enumerate(prepared):
            by_group.setdefault(episode.group_id, []).append(i)
        results: list[EpisodeResult | None] = [None] * len(prepared)

        def apply_group(indexes: list[int]) -> None:
            for i in indexes:
                episode, now = prepared[i]
                try:
                    results[i] = self._run(episode, now, extract_, extractions[i], usages[i], started)
                except ExtractionFailedError as exc:
                    stored = self.store.get(Kind.EPISODE, [episode.id])[0]
                    assert isinstance(stored, Episode)
                    results[i] = EpisodeResult(episode=stored, usage=usages[i], warnings=[str(exc)])

        with ThreadPoolExecutor(max_workers=min(workers, max(1, len(by_group)))) as pool:
            for future in [pool.submit(apply_group, indexes) for indexes in by_group.values()]:
                future.result()
        return [r for r in results if r is not None]

    def retry(self, episode_id: str) -> EpisodeResult:
        """Extract an episode whose extraction failed, now. Raises :class:`NotFoundError` for an unknown id and
        :class:`ValidationError` for an episode that did not fail."""
        episode = self._stored(episode_id, EpisodeStatus.FAILED, "only failed ones retry")
        return self._extract_stored(episode, self._wants_llm(True))

    def failed_episodes(self, group_ids: Sequence[str] | str | None = None) -> list[Episode]:
        """Episodes whose extraction failed for good and wait for :meth:`retry`, oldest first."""
        return sorted(self._episodes_with(EpisodeStatus.FAILED, group_ids), key=lambda e: e.created_at)

    # -- deferred extraction: the two halves of add_episode, which tkg.BackgroundIngestor runs apart ----------
    def queue_episode(
        self,
        content: str | Mapping[str, Any] | list[Any],
        *,
        group_id: str | None = None,
        source: EpisodeSource | str = EpisodeSource.MESSAGE,
        reference_time: datetime | str | None = None,
        source_description: str = "",
        name: str = "",
        episode_id: str | None = None,
    ) -> Episode:
        """Store an episode with status ``queued`` and return it, leaving its extraction to
        :meth:`process_queued`. The episode is kept verbatim, searchable as an episode and saved in snapshots
        at once. Arguments and errors are those of :meth:`add_episode`; on an error nothing is stored."""
        item = EpisodeInput(content, group_id, source, reference_time, source_description, name, episode_id)
        episode, _ = self._new_episode(item)
        vector = check_vectors(self.embedder.embed([episode.content]), self.embedder.dim, 1)[0]
        queued = dataclasses.replace(episode, status=EpisodeStatus.QUEUED, embedding=vector)
        with self._lock:
            self._ingestor.check_new(queued)
            self.store.write(WriteBatch(puts=[queued]))
        return queued

    def process_queued(self, episode_id: str) -> EpisodeResult:
        """Extract a queued episode now, as :meth:`add_episode` would have (with the LLM when the memory has
        one); it ends ``extracted``, ``stored`` or ``failed`` (then :class:`ExtractionFailedError` is raised, as
        by :meth:`add_episode`). Raises :class:`NotFoundError` for an unknown (or removed) episode and
        :class:`ValidationError` for one that is not queued."""
        episode = self._stored(episode_id, EpisodeStatus.QUEUED, "only queued ones are processed")
        return self._extract_stored(episode, self._wants_llm(None))

    def requeue(self, episode_id: str) -> Episode:
        """Mark a failed episode ``queued`` again, for :meth:`process_queued` to retry it later; returns it."""
        self._wants_llm(True)
        with self._lock:
            episode = self._stored(episode_id, EpisodeStatus.FAILED, "only failed ones retry")
            queued = dataclasses.replace(episode, status=EpisodeStatus.QUEUED, error="")
            self.store.write(WriteBatch(puts=[queued]))
        return queued

    def queued_episodes(self, group_ids: Sequence[str] | str | None = None) -> list[Episode]:
        """Episodes stored as ``queued`` and not yet extracted, in the order they should apply: by reference
        time, then creation time (within a group, the order :class:`tkg.BackgroundIngestor` resumes them in)."""
        found = self._episodes_with(EpisodeStatus.QUEUED, group_ids)
        return sorted(found, key=lambda e: (e.reference_time, e.created_at))

    def _stored(self, episode_id: str, status: EpisodeStatus, hint: str) -> Episode:
        episode = self.get(Kind.EPISODE, episode_id)
        assert isinstance(episode, Episode)
        if episode.status is not status:
            raise ValidationError(f"episode {episode_id} has status {episode.status.value!r}; {hint}")
        return episode

    def _extract_stored(self, episode: Episode, extract: bool) -> EpisodeResult:
        """The one path that extracts an episode already stored (failed, or queued), replacing its record."""
        fresh = dataclasses.replace(episode, status=EpisodeStatus.STORED, error="", embedding=None)
        vectors = {episode.content: episode.embedding} if episode.embedding is not None else None
        return self._run(fresh, self.clock.now(), extract, vectors=vectors, replace_stored=True)

    def _episodes_with(self, status: EpisodeStatus, group_ids: Sequence[str] | str | None) -> list[Episode]:
        groups = None if group_ids is None else frozenset([group_ids] if isinstance(group_ids, str) else group_ids)
        with self._lock:
            return [e for e in self.store.scan(Kind.EPISODE, groups) if isinstance(e, Episode) and e.status is status]

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
        hold from the reference time (default: now); ``invalid_at`` closes it. Facts are resolved against the
        graph like extracted ones: a verbatim repeat adds provenance, and for a relation the ontology declares
        single-valued a new object ends the old one (old ``invalid_at`` = new ``valid_at``).
        """
        if isinstance(facts, (str, bytes, Mapping)):
            raise ValidationError("add_facts takes an iterable of facts (FactInput or mappings), not one value")
        items = [f if isinstance(f, FactInput) else FactInput.from_mapping(f) for f in facts]
        if not items:
            raise ValidationError("add_facts needs at least one fact")
        for item in items:
            for part in (item.subject, item.relation, item.object):
                if not isinstance(part, str) or not part.strip():
                    raise ValidationError(f"fact {item!r} has an empty subject, relation or object")
        now = self.clock.now()
        reference = to_utc(reference_time, "reference_time") if reference_time is not None else now
        parsed = [
            (item, _when(item.valid_at, "valid_at", reference), _when(item.invalid_at, "invalid_at", reference))
            for item in items
        ]
        for item, start, end in parsed:
            if start is not None and end is not None and end < start:
                raise TimestampError(
                    f"fact {item.subject} {item.relation} {item.object}: invalid_at is before valid_at"
                )
        document = [
            {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in vars_of(item).items() if v is not None}
            for item in items
        ]
        episode = self._episode(document, group_id, EpisodeSource.JSON, reference, source_description, "", None, now)
        draft = Draft()
        for item, start, end in parsed:
            draft.add_entity(item.subject, item.subject_label)
            draft.add_entity(item.object, item.object_label)
            add_fact(draft, item.subject, item.relation, item.object, item.fact, start or reference, end)
        return self._ingestor.apply_structured(episode, draft, now)

    def remove_episode(self, episode_id: str) -> RemovalResult:
        """Remove an episode as if it had never been added: facts it alone supports are deleted (others lose it
        from their provenance), the invalidations those facts caused are reverted, entities left with no facts
        and no mentions are deleted, and the others' names, aliases, labels, summaries and attributes are
        recomputed from the mentions that remain. The only way anything is deleted from memory.

        A restored fact of a single-valued relation is settled again against facts recorded after it; other
        contradictions the LLM judged while the episode was present are not asked again."""
        episode = self.get(Kind.EPISODE, episode_id)
        assert isinstance(episode, Episode)
        with self._ingestor.group_lock(episode.group_id):
            return self._ingestor.remove(episode, self.clock.now())

    # ------------------------------------------------------------------------------------------------------
    # communities
    def refresh_communities(self, group_id: str | None = None, *, warm: bool | None = None) -> CommunityReport:
        """Run community detection for a group now (label propagation over the live entity graph) and write the
        communities, re-summarising only those whose members changed. ``warm=True`` re-converges from the stored
        communities instead of starting over (fewer summaries to redo; see :class:`CommunityConfig`)."""
        group = check_group_id(group_id if group_id is not None else self.config.default_group)
        tier = self._tier()
        with self._lock:
            report = tier.refresh(self.store, group, warm=warm)
        self._count(report.usage)
        return report

    def community_drift(self, group_id: str | None = None) -> float:
        """How far the incrementally kept communities have drifted from a full run: 1 - NMI (0 = identical)."""
        group = check_group_id(group_id if group_id is not None else self.config.default_group)
        tier = self._tier()
        with self._lock:
            return tier.drift(self.store, group)

    def _tier(self) -> CommunityTier:
        if self.communities is None:
            self.communities = CommunityTier(self.embedder, self._ingestor.llm, self.clock, CommunityConfig())
        return self.communities

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
        targets: Sequence[str] | None = None,
        config: SearchConfig | str | None = None,
        filters: Filters | None = None,
        center: str | None = None,
        origins: Sequence[str] = (),
        cross_encoder: CrossEncoder | None = None,
        reference_time: datetime | str | None = None,
    ) -> SearchResults:
        """Search facts, entities, episodes and communities; by default hybrid (cosine + BM25, fused by RRF) over
        the first three.

        ``config`` is a :class:`tkg.search_config.SearchConfig` or a preset name (see
        :data:`tkg.search_config.PRESETS`); ``limit`` and ``targets`` narrow it for this call. By default only facts
        that hold now are returned. ``as_of`` asks what held in the world at that time; ``known_at`` what the memory
        believed at that time; ``include_invalidated`` returns history too. ``filters`` narrows by entity labels,
        relation types and date ranges. ``center`` (an entity id) is what the node-distance reranker measures from;
        ``origins`` are entity ids that breadth-first search starts from when configured so. The cross-encoder
        reranker uses ``cross_encoder``, else an :class:`tkg.rerankers.LLMScorer` over this memory's LLM, else an
        :class:`tkg.rerankers.EmbeddingScorer` over its embedder. ``reference_time`` (default: the time searched)
        anchors time phrases in the query ("last week") for the ``conversation`` preset.

        A filter naming a label or relation that nothing has, or a limit beyond the corpus, gives fewer (or no)
        results, never an error. Errors: an empty or too long query, a bad limit or target, a naive datetime, an
        unknown group, and a centre or origin that is not an entity visible in the searched groups.
        """
        if not isinstance(query, str) or not query.strip():
            raise ValidationError("search query is empty")
        if len(query) > self.config.max_query_chars:
            raise ValidationError(
                f"search query has {len(query):,} characters, more than MemoryConfig.max_query_chars "
                f"({self.config.max_query_chars:,}); shorten it to the question being asked"
            )
        if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
            raise ValidationError(f"limit must be a positive integer, got {limit!r}")
        if targets is not None:
            targets = [targets] if isinstance(targets, str) else list(targets)
            unknown = [t for t in targets if t not in TARGET_KINDS]
            if unknown or not targets:
                raise ValidationError(f"unknown search targets {unknown}; choose from {list(TARGET_KINDS)}")
        if filters is not None and not isinstance(filters, Filters):
            raise ValidationError("filters must be a tkg.timeline.Filters value")
        chosen = self._search_config(config, limit, targets)
        scope = make_scope(self.clock.now(), group_ids, as_of, known_at, include_invalidated, filters)
        self._check_groups(scope.group_ids)
        vector = check_vectors(self.embedder.embed([query]), self.embedder.dim, 1)[0]
        graded: LLMScorer | None = None
        if cross_encoder is None and any(getattr(chosen, t).reranker is Reranker.CROSS_ENCODER for t in chosen.targets):
            guarded = self._ingestor.llm
            graded = LLMScorer(guarded) if guarded is not None else None
            cross_encoder = graded if graded is not None else EmbeddingScorer(self.embedder)
        try:
            with self._lock:
                return search(
                    self.store,
                    query,
                    vector,
                    scope,
                    chosen,
                    center=center,
                    origins=origins,
                    cross_encoder=cross_encoder,
                    reference_time=optional_utc(reference_time, "reference_time"),
                )
        finally:
            if graded is not None:
                self._count(graded.usage)

    def _search_config(
        self, config: SearchConfig | str | None, limit: int | None, targets: Sequence[str] | None
    ) -> SearchConfig:
        if isinstance(config, str):
            config = preset(config)
        elif config is None:
            config = self.config.search
            if config is None:
                default = TargetConfig(
                    limit=self.config.search_limit,
                    candidate_factor=self.config.candidate_factor,
                    rrf_k=self.config.rrf_k,
                )
                config = SearchConfig(**{t: default for t in targets or ("facts", "entities", "episodes")})
        elif not isinstance(config, SearchConfig):
            raise ValidationError(f"config must be a SearchConfig or a preset name, got {type(config).__name__}")
        if targets is not None:
            missing = [t for t in targets if getattr(config, t) is None]
            if missing:
                raise ValidationError(f"the search config does not search {missing}; add them to it or drop them")
            config = config.only(targets)
        return config if limit is None else config.with_limit(limit)

    def context(
        self,
        query: str,
        *,
        max_chars: int | None = None,
        max_tokens: int | None = None,
        include_episodes: bool = False,
        **search_args: Any,
    ) -> str:
        """The context string for a query: relevant facts with their date ranges, entities with summaries,
        community summaries (and episodes when asked), filled best-first within ``max_chars`` / ``max_tokens``.
        ``search_args`` are those of :meth:`search`."""
        return self.retrieve(
            query, max_chars=max_chars, max_tokens=max_tokens, include_episodes=include_episodes, **search_args
        ).text

    def retrieve(
        self,
        query: str,
        *,
        max_chars: int | None = None,
        max_tokens: int | None = None,
        count_tokens: TokenCounter = approx_tokens,
        include_episodes: bool = False,
        **search_args: Any,
    ) -> Context:
        """The paper's f(α) = χ(ρ(φ(α))): search, rerank, and construct the context, returned as a
        :class:`tkg.context.Context` (the string, plus the facts, entities, communities and episodes it holds).
        ``count_tokens`` counts tokens for ``max_tokens`` (default: about four characters per token)."""
        return construct(
            self.search(query, **search_args),
            max_chars=max_chars,
            max_tokens=max_tokens,
            count_tokens=count_tokens,
            include_episodes=include_episodes,
        )

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
        # Under the write lock: the snapshot reads each kind and the indexes separately, and a background worker
        # writing in between would leave a file whose facts name entities it does not hold.
        with self._lock:
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
        ontology: Ontology | None = None,
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
        memory = cls(store, embedder=embedder, llm=llm, clock=clock, config=config, ontology=ontology)
        snapshot.restore(memory.store, records)  # reuses saved indexes where the store can
        memory._check_ontology()
        return memory


def _when(value: datetime | str | None, what: str, reference: datetime) -> datetime | None:
    """A datetime, an ISO-8601 string, or a time phrase resolved against ``reference``."""
    if value is None or isinstance(value, datetime):
        return optional_utc(value, what)
    try:
        return optional_utc(value, what)
    except TimestampError:
        resolved = resolve_time(value, reference)
        if resolved is None:
            raise TimestampError(f"{what} {value!r} is neither a date nor a time phrase tkg can resolve") from None
        return resolved


def vars_of(item: FactInput) -> dict[str, Any]:
    return {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
