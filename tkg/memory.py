"""The public facade, and the only door to a memory: add episodes and facts, search, build context, read,
snapshot. Servers, the CLI, pictures and background ingestion all come in through here (see :mod:`tkg.locks`)."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tkg import persistence
from tkg.bulk import ingest_batch
from tkg.clock import Clock, SystemClock
from tkg.community_tier import CommunityReport, CommunityTier
from tkg.config import CommunityConfig, MemoryConfig
from tkg.context import Context, TokenCounter, approx_tokens, construct
from tkg.embedders.base import Embedder, check_vectors
from tkg.errors import (
    ConfigurationError,
    UnknownGroupError,
    ValidationError,
)
from tkg.ingest import EpisodeResult, Ingestor, RemovalResult
from tkg.inputs import EpisodeInput, FactInput, check_metadata, make_episode, not_a_batch, structured_facts
from tkg.journal import JournalPolicy
from tkg.llm.base import LLMClient, LLMUsage
from tkg.llm.guard import GuardedLLM
from tkg.llm.schema import GraphExtraction
from tkg.locks import MemoryLocks
from tkg.memory_files import MemoryFiles
from tkg.memory_groups import MemoryGroups
from tkg.memory_reads import Groups, MemoryReads
from tkg.models import (
    Episode,
    EpisodeSource,
    EpisodeStatus,
    Fact,
    Kind,
    check_group_id,
    check_id_list,
    check_lookup_id,
)
from tkg.ontology import Ontology
from tkg.reads import Neighbourhood
from tkg.rerankers import CrossEncoder, EmbeddingScorer, LLMScorer
from tkg.search import SearchResults, search
from tkg.search_config import Reranker, SearchConfig, TargetConfig, choose
from tkg.storage import Store, WriteBatch
from tkg.timeline import Filters, make_scope
from tkg.timeutil import to_aware, to_utc

__all__ = ["EpisodeInput", "EpisodeResult", "FactInput", "Memory", "Neighbourhood", "RemovalResult"]


class Memory(MemoryReads, MemoryFiles, MemoryGroups):
    """An embedded temporal knowledge-graph memory.

    >>> from tkg import Memory, HashEmbedder, FixedClock
    >>> memory = Memory(embedder=HashEmbedder(), clock=FixedClock("2024-05-01T00:00:00Z"))
    >>> _ = memory.add_facts([FactInput("Alice", "WORKS_AT", "Acme")], group_id="demo")
    >>> memory.search("where does Alice work?", group_ids=["demo"]).facts[0].record.fact
    'Alice works at Acme'

    Thread-safe: reads run together, writes one at a time, and episodes of one group apply in order (the rule is
    in :mod:`tkg.locks`). LLM calls go through one :class:`~tkg.llm.guard.GuardedLLM` (retries, one concurrency
    limit, one rate limit), and :attr:`usage` sums their cost.

    Configuration is fixed for the life of a memory (``config``, ``clock`` and ``ontology`` are read-only; use
    :meth:`with_config` for another). The LLM and the embedder may be swapped (``memory.llm = ...``); the change
    reaches every part that uses them.
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
        check_embedder: bool = True,
    ) -> None:
        check_seams(embedder, llm, clock, config, ontology)
        if store is None:
            from tkg.backends.memory import InMemoryStore

            store = InMemoryStore(dim=embedder.dim)
        if not isinstance(store, Store):
            raise ConfigurationError(f"store must be a tkg.storage.Store, got {type(store).__name__}")
        if store.dim != embedder.dim:
            raise ConfigurationError(f"the store holds {store.dim}-d vectors but the embedder makes {embedder.dim}-d")
        if check_embedder:
            store.claim_embedder(embedder.name)
        self._store = store
        self._clock = clock or SystemClock()
        self._config = config or MemoryConfig()
        self._ontology = ontology or Ontology()
        self._locks = MemoryLocks()
        self._retry_lock = threading.Lock()
        self._retrying: set[str] = set()  # ids of the episodes a retry() extracts now
        self._usage = LLMUsage()
        self._usage_lock = threading.Lock()
        self._embedder = embedder
        self._llm: LLMClient | None = llm
        self._guarded = GuardedLLM(llm, self._config.llm_policy) if llm is not None else None
        self._communities: CommunityTier | None = (
            CommunityTier(embedder, self._guarded, self._clock, self._config.communities)
            if self._config.communities is not None
            else None
        )
        self._ingestor = Ingestor(
            store, embedder, self._guarded, self._config, self._ontology, self._locks, self._communities
        )
        self._search_default = TargetConfig(
            limit=self._config.search_limit, candidate_factor=self._config.candidate_factor, rrf_k=self._config.rrf_k
        )
        self._files: persistence.DurableFiles | None = None
        self._check_ontology()

    # ------------------------------------------------------------------------------------------------------
    # configuration
    @property
    def config(self) -> MemoryConfig:
        return self._config

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def ontology(self) -> Ontology:
        return self._ontology

    @property
    def embedder(self) -> Embedder:
        return self._embedder

    @embedder.setter
    def embedder(self, embedder: Embedder) -> None:
        check_seams(embedder)
        if embedder.dim != self._store.dim:
            raise ConfigurationError(
                f"the store holds {self._store.dim}-d vectors but the embedder makes {embedder.dim}-d"
            )
        self._store.claim_embedder(embedder.name)
        with self._locks.write():
            self._embedder = embedder
            self._ingestor.embedder = embedder
            if self._communities is not None:
                self._communities.embedder = embedder

    @property
    def llm(self) -> LLMClient | None:
        """The LLM client (its calls go through ``config.llm_policy``); None: no extraction."""
        return self._llm

    @llm.setter
    def llm(self, llm: LLMClient | None) -> None:
        check_seams(self._embedder, llm)
        with self._locks.write():
            self._llm = llm
            self._guarded = GuardedLLM(llm, self._config.llm_policy) if llm is not None else None
            self._ingestor.llm = self._guarded
            if self._communities is not None:
                self._communities.llm = self._guarded

    def with_config(
        self, config: MemoryConfig | None = None, *, clock: Clock | None = None, ontology: Ontology | None = None
    ) -> Memory:
        """A memory over the same store with other configuration (and this one's embedder and LLM). The two share
        the store: use the new one from now on (each serialises its own writes, not the other's)."""
        return Memory(
            self._store,
            embedder=self._embedder,
            llm=self._llm,
            clock=clock or self._clock,
            config=config or self._config,
            ontology=ontology if ontology is not None else self._ontology,  # an empty one is falsy
        )

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
        if not any(r.single_valued for r in self._ontology.relations.values()):
            return
        facts = [f for f in self._store.scan(Kind.FACT) if isinstance(f, Fact)]
        problems = self._ontology.conflicts(facts)
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
        metadata: Mapping[str, Any] | None = None,
    ) -> EpisodeResult:
        """Store an episode and extract its entities and facts: one LLM call, plus one batched resolution call
        only when some name or fact stays ambiguous after the deterministic passes.

        ``content`` is kept verbatim. For ``source="message"`` write ``"Speaker: text"``; the speaker is always an
        entity. ``reference_time`` (default: now) anchors relative dates. ``extract=False`` (the default without
        an LLM) stores and indexes the episode, links it to entities the memory already knows by name or alias
        (in a JSON document: named by its string values), and records the dates its time phrases denote, with no
        LLM at all. ``metadata`` (JSON values) is kept with the episode, in ``episode.attributes["metadata"]``.

        If the LLM fails for good (after the retries of ``config.llm_policy``), the episode is stored with status
        ``failed``, nothing else is written, and :class:`~tkg.errors.ExtractionFailedError` is raised; call
        :meth:`retry` later.
        """
        item = EpisodeInput(content, group_id, source, reference_time, source_description, name, episode_id, metadata)
        episode, now = self._new_episode(item)
        return self._run(episode, now, self._wants_llm(extract))

    def _new_episode(self, item: EpisodeInput) -> tuple[Episode, datetime]:
        now = self._clock.now()
        return make_episode(item, self._config, now), now

    def _wants_llm(self, extract: bool | None) -> bool:
        if extract is not None and not isinstance(extract, bool):
            raise ValidationError(f"extract must be True, False or None, got {extract!r}")
        if extract and self._llm is None:
            raise ConfigurationError("extract=True needs an LLM; pass llm= to Memory, or use extract=False")
        return self._llm is not None if extract is None else bool(extract)

    def _run(
        self,
        episode: Episode,
        now: datetime,
        extract: bool,
        extraction: GraphExtraction | Exception | None = None,
        usage: LLMUsage | None = None,
        started: float | None = None,
        *,
        vectors: dict[str, Any] | None = None,
        replace_stored: bool = False,
    ) -> EpisodeResult:
        usage = usage if usage is not None else LLMUsage()
        try:
            return self._ingestor.ingest(
                episode,
                now,
                extract=extract,
                extraction=extraction,  # type: ignore[arg-type]
                usage=usage,
                started=started,
                vectors=vectors,
                replace_stored=replace_stored,
            )
        finally:
            self._count(usage)

    def add_episodes(
        self, episodes: Iterable[EpisodeInput | Mapping[str, Any] | str], *, extract: bool | None = None
    ) -> list[EpisodeResult]:
        """Ingest many episodes: extraction calls run concurrently (up to ``config.llm_policy.max_concurrency``),
        and graph changes apply in the given order within each group (groups in parallel), so contradictions
        between two episodes of one batch are caught. The graph ends up as sequential :meth:`add_episode` calls
        would leave it, given the same LLM answers.

        Returns one result per episode, in order. An episode whose LLM calls failed for good is stored with
        status ``failed`` (see :meth:`retry`); its result says so and the others are unaffected.
        """
        if not_a_batch(episodes):
            raise ValidationError("add_episodes takes an iterable of episodes (EpisodeInput, mappings or strings)")
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
        with self._locks.read():
            for episode, _ in prepared:
                self._ingestor.check_new(episode)

        def apply(episode: Episode, now: datetime, found: Any, usage: LLMUsage, started: float) -> EpisodeResult:
            return self._run(episode, now, extract_, found, usage, started)

        workers = max(1, self._config.llm_policy.max_concurrency)
        return ingest_batch(self._ingestor, prepared, extract=extract_, workers=workers, apply=apply)

    def retry(self, episode_id: str) -> EpisodeResult:
        """Extract an episode whose extraction failed, now. Raises :class:`NotFoundError` for an unknown id and
        :class:`ValidationError` for an episode that did not fail."""
        episode_id = check_lookup_id(episode_id)
        with self._retry_lock:  # a second retry of it in this process would only pay for an LLM call in vain
            if episode_id in self._retrying:
                raise ValidationError(f"episode {episode_id} is being retried already")
            self._retrying.add(episode_id)
        try:  # read once marked: a retry that ended meanwhile has stored it extracted
            episode = self._stored(episode_id, EpisodeStatus.FAILED, "only failed ones retry")
            return self._extract_stored(episode, self._wants_llm(True))
        finally:
            with self._retry_lock:
                self._retrying.discard(episode_id)

    def failed_episodes(self, group_ids: Groups = None) -> list[Episode]:
        """Episodes whose extraction failed for good and wait for :meth:`retry`, oldest first."""
        return sorted(self.episodes(group_ids, status=EpisodeStatus.FAILED), key=lambda e: e.created_at)

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
        metadata: Mapping[str, Any] | None = None,
    ) -> Episode:
        """Store an episode with status ``queued`` and return it, leaving its extraction to
        :meth:`process_queued`. The episode is kept verbatim, searchable as an episode and saved in snapshots
        at once. Arguments and errors are those of :meth:`add_episode`; on an error nothing is stored."""
        item = EpisodeInput(content, group_id, source, reference_time, source_description, name, episode_id, metadata)
        episode, _ = self._new_episode(item)
        vector = check_vectors(self._embedder.embed([episode.content]), self._embedder.dim, 1)[0]
        queued = dataclasses.replace(episode, status=EpisodeStatus.QUEUED, embedding=vector)
        with self._locks.write():
            self._ingestor.check_new(queued)
            self._store.write(WriteBatch(puts=[queued]))
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
        with self._locks.write():
            episode = self._stored(episode_id, EpisodeStatus.FAILED, "only failed ones retry")
            queued = dataclasses.replace(episode, status=EpisodeStatus.QUEUED, error="")
            self._store.write(WriteBatch(puts=[queued]))
        return queued

    def queued_episodes(self, group_ids: Groups = None) -> list[Episode]:
        """Episodes stored as ``queued`` and not yet extracted, in the order they should apply: by reference
        time, then creation time (within a group, the order :class:`tkg.BackgroundIngestor` resumes them in)."""
        return self.episodes(group_ids, status=EpisodeStatus.QUEUED)

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
        return self._run(fresh, self._clock.now(), extract, vectors=vectors, replace_stored=True)

    def add_facts(
        self,
        facts: Iterable[FactInput | Mapping[str, Any]],
        *,
        group_id: str | None = None,
        reference_time: datetime | str | None = None,
        source_description: str = "structured facts",
        episode_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> EpisodeResult:
        """Ingest structured facts with no LLM at all.

        The input is kept as one JSON episode (the facts' provenance). A fact without ``valid_at`` is taken to
        hold from the reference time (default: now), unless it is given only ``invalid_at``: then its start is
        unknown; ``invalid_at`` closes it. Facts are resolved against the
        graph like extracted ones: a verbatim repeat adds provenance, and for a relation the ontology declares
        single-valued a new object ends the old one (old ``invalid_at`` = new ``valid_at``). ``episode_id`` names
        that episode (default: a new id); an id already taken is refused.
        """
        now = self._clock.now()
        # Time phrases resolve on the caller's calendar day (the offset of reference_time, else UTC).
        reference = to_aware(reference_time, "reference_time") if reference_time is not None else now
        document, draft = structured_facts(facts, reference)
        source = EpisodeInput(
            document, group_id, EpisodeSource.JSON, reference, source_description, "", episode_id, metadata
        )
        episode = make_episode(source, self._config, now)
        return self._ingestor.apply_structured(episode, draft, now)

    def invalidate_fact(
        self, fact_id: str, at: datetime | str | None = None, *, note: Mapping[str, Any] | None = None
    ) -> Fact:
        """End a fact by hand: it stops holding at ``at`` (default now; a datetime or an ISO-8601 string with an
        offset). Nothing is deleted: the fact stays with its new end, and ``as_of`` before ``at`` still finds it.
        The change is recorded in ``fact.attributes["tkg.ended_by_hand"]`` (when, the end it replaced, and
        ``note``: JSON values saying why, e.g. the fact that replaces it); the new end is the fact's own from then
        on, and a ``known_at`` view from before shows the end it replaced. The facts it superseded or restated
        are settled again.

        Raises :class:`NotFoundError` for an unknown id and :class:`ValidationError` for ``at`` before the fact
        starts or a fact that already ends by then; nothing is written in either case. Returns the fact as
        stored now."""
        fact_id = check_lookup_id(fact_id)
        now = self._clock.now()
        end = to_utc(at, "at") if at is not None else now
        return self._ingestor.end_fact(fact_id, end, now, check_metadata(note) if note else None)

    def remove_episode(self, episode_id: str) -> RemovalResult:
        """Remove an episode as if it had never been added: facts it alone supports are deleted (others lose it
        from their provenance), the invalidations those facts caused are reverted, entities left with no facts
        and no mentions are deleted, and the others' names, aliases, labels, summaries and attributes are
        recomputed from the mentions that remain. The communities of the entities deleted or changed are named
        and summarised again from the members left, without the LLM (no removed name stays in them), and one left
        with fewer than two members is deleted. The only way anything is deleted from memory.

        A restored fact of a single-valued relation is settled again against facts recorded after it; other
        contradictions the LLM judged while the episode was present are not asked again."""
        episode = self.get(Kind.EPISODE, episode_id)
        assert isinstance(episode, Episode)
        return self._ingestor.remove(episode, self._clock.now())

    # ------------------------------------------------------------------------------------------------------
    # communities
    def refresh_communities(self, group_id: str | None = None, *, warm: bool | None = None) -> CommunityReport:
        """Run community detection for a group now (label propagation over the live entity graph) and write the
        communities, re-summarising only those whose members changed. ``warm=True`` re-converges from the stored
        communities instead of starting over (fewer summaries to redo; see :class:`CommunityConfig`)."""
        group = check_group_id(group_id if group_id is not None else self._config.default_group)
        tier = self._tier()
        with self._locks.write():
            report = tier.refresh(self._store, group, warm=warm)
        self._count(report.usage)
        return report

    def community_drift(self, group_id: str | None = None) -> float:
        """How far the incrementally kept communities have drifted from a full run: 1 - NMI (0 = identical)."""
        group = check_group_id(group_id if group_id is not None else self._config.default_group)
        tier = self._tier()
        with self._locks.read():
            return tier.drift(self._store, group)

    def _tier(self) -> CommunityTier:
        with self._locks.write():
            if self._communities is None:
                self._communities = CommunityTier(self._embedder, self._guarded, self._clock, CommunityConfig())
                self._ingestor.communities = self._communities
            return self._communities

    # ------------------------------------------------------------------------------------------------------
    # retrieval
    def search(
        self,
        query: str,
        *,
        group_ids: Groups = None,
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
        results, never an error, and so does a group that holds nothing (unless ``MemoryConfig.strict_groups``).
        Errors: an empty or too long query, a bad limit or target, a naive datetime, and a centre or origin that
        is not an entity visible in the searched groups.
        """
        self._check_query(query)
        check_id_list(origins, "origins")
        if cross_encoder is not None and not isinstance(cross_encoder, CrossEncoder):
            raise ValidationError(f"cross_encoder must have score(query, passages), not {cross_encoder!r}")
        chosen = choose(config, limit, targets, default=self._config.search, target_default=self._search_default)
        scope = make_scope(self._clock.now(), group_ids, as_of, known_at, include_invalidated, filters)
        reference = to_aware(reference_time, "reference_time") if reference_time is not None else None
        vector = check_vectors(self._embedder.embed([query]), self._embedder.dim, 1)[0]
        graded: LLMScorer | None = None
        if cross_encoder is None and any(getattr(chosen, t).reranker is Reranker.CROSS_ENCODER for t in chosen.targets):
            graded = LLMScorer(self._guarded) if self._guarded is not None else None
            cross_encoder = graded if graded is not None else EmbeddingScorer(self._embedder)
        try:
            with self._locks.read():
                self._check_groups(scope.group_ids)
                return search(
                    self._store,
                    query,
                    vector,
                    scope,
                    chosen,
                    center=center,
                    origins=origins,
                    cross_encoder=cross_encoder,
                    reference_time=reference,
                    single_valued=self._ontology.single_valued,
                )
        finally:
            if graded is not None:
                self._count(graded.usage)

    def _check_query(self, query: object) -> None:
        if not isinstance(query, str) or not query.strip():
            raise ValidationError("search query is empty")
        if len(query) > self._config.max_query_chars:
            raise ValidationError(
                f"search query has {len(query):,} characters, more than MemoryConfig.max_query_chars "
                f"({self._config.max_query_chars:,}); shorten it to the question being asked"
            )

    def context(
        self,
        query: str,
        *,
        max_chars: int | None = None,
        max_tokens: int | None = None,
        include_episodes: bool | None = None,
        **search_args: Any,
    ) -> str:
        """The context string for a query: relevant facts with their date ranges, entities with summaries,
        community summaries, filled best-first within ``max_chars`` / ``max_tokens``. Episodes (the raw
        messages) too when ``include_episodes`` is True, or by default when no fact is found; False: never.
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
        include_episodes: bool | None = None,
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
        if group_ids is None or not self._config.strict_groups:
            return
        missing = sorted(group_ids - self._store.groups())
        if missing:
            raise UnknownGroupError(f"group(s) {missing} hold nothing in this memory; add an episode there first")

    # ------------------------------------------------------------------------------------------------------
    # snapshots and files (saving, compaction and closing: MemoryFiles)
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
        """A new memory holding what the snapshot at ``path`` holds, and what its journal holds after it (a fresh
        in-memory store unless an empty ``store`` is given). Nothing is kept open: later writes are not saved
        unless :meth:`save` is called; :meth:`open` keeps them durable."""
        filled = persistence.load_snapshot(path, embedder, store, check_embedder=check_embedder)
        return cls(filled, embedder=embedder, llm=llm, clock=clock, config=config, ontology=ontology)

    @classmethod
    def open(
        cls,
        path: str | Path,
        *,
        embedder: Embedder,
        llm: LLMClient | None = None,
        clock: Clock | None = None,
        config: MemoryConfig | None = None,
        ontology: Ontology | None = None,
        check_embedder: bool = True,
        durability: JournalPolicy | None = None,
        create: bool = True,
    ) -> Memory:
        """A durable embedded memory kept in the files at ``path``: the snapshot (if there is one yet) and the
        write-ahead journal beside it (``path.journal.NNNNNN``). Every write is on disk before the call that made
        it returns (see :class:`tkg.journal.JournalPolicy` for the sync policy); past a size the journal is folded
        into a new snapshot in the background (:meth:`compact`). After a crash, open it again: every acknowledged
        write is there, and a write torn by the crash is cut off whole. ``create=False``: the files must exist.
        Call :meth:`close` (or use ``with``) when done.

        >>> import tempfile, os
        >>> from tkg import HashEmbedder
        >>> folder = tempfile.mkdtemp()
        >>> with Memory.open(os.path.join(folder, "m.tkg"), embedder=HashEmbedder()) as memory:
        ...     _ = memory.add_facts([FactInput("Ann", "LIKES", "Tea")], group_id="g")
        >>> Memory.open(os.path.join(folder, "m.tkg"), embedder=HashEmbedder()).stats(["g"])["records"]["fact"]
        1
        """
        check_seams(embedder, llm, clock, config, ontology)  # before any file is made
        if durability is not None and not isinstance(durability, JournalPolicy):
            raise ConfigurationError(f"durability must be a JournalPolicy or None, not {durability!r}")
        files = persistence.DurableFiles.open(
            path, embedder, check_embedder=check_embedder, policy=durability, create=create
        )
        try:
            memory = cls(files.store, embedder=embedder, llm=llm, clock=clock, config=config, ontology=ontology)
        except BaseException:
            files.close()
            raise
        memory._files = files
        files.bind(memory._locks)
        return memory


def check_seams(
    embedder: object,
    llm: object = None,
    clock: object = None,
    config: object = None,
    ontology: object = None,
) -> None:
    """Raise :class:`ConfigurationError` unless each seam given to a memory is one (None: the default), before
    anything uses it: a wrong object failed later with a raw AttributeError, far from its cause."""
    wanted: list[tuple[str, object, type, str]] = [
        ("embedder", embedder, Embedder, "an Embedder (dim, name, embed(texts)), e.g. tkg.HashEmbedder()"),
        ("llm", llm, LLMClient, "an LLMClient (generate(prompt, response_model)) or None"),
        ("clock", clock, Clock, "a Clock (now()) or None"),
        ("config", config, MemoryConfig, "a MemoryConfig or None"),
        ("ontology", ontology, Ontology, "an Ontology or None"),
    ]
    for name, value, kind, what in wanted:
        if (value is not None or name == "embedder") and not isinstance(value, kind):
            raise ConfigurationError(f"{name} must be {what}, not {value!r}")
