"""Ingestion: one episode from raw input to one atomic write, and its exact undo.

An episode costs one extraction call; a second, batched resolution call is made only when some name or fact stays
ambiguous after the deterministic passes (:mod:`tkg.extraction`); an optional reflection call adds one more. If
the LLM fails for good, the episode is stored marked ``failed`` (retry it later) and no entity or fact of it is
written. Everything the episode changes is computed first and written in one :class:`~tkg.storage.WriteBatch`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tkg import invalidation, revisions
from tkg.community_tier import CommunityTier
from tkg.config import CommunityConfig, MemoryConfig
from tkg.drafts import Draft, from_extraction, name_grams, speaker_of, time_mentions
from tkg.embedders.base import Embedder, check_vectors
from tkg.errors import ExtractionFailedError, LLMError, NotFoundError, TkgError, ValidationError
from tkg.extraction import (
    EpisodePlanner,
    GraphPlan,
    PlanSettings,
    Questions,
    last_sayings,
    linked_facts,
    stated_times,
)
from tkg.llm.base import LLMUsage
from tkg.llm.guard import GuardedLLM
from tkg.llm.prompts import extraction_prompt, reflection_prompt, resolution_prompt
from tkg.llm.schema import GraphExtraction, Resolution
from tkg.locks import MemoryLocks
from tkg.models import (
    Entity,
    Episode,
    EpisodeSource,
    EpisodeStatus,
    Fact,
    Kind,
    Record,
    Vector,
    check_name,
    check_relation,
    check_storable,
    check_text,
    evolve,
)
from tkg.names import normalize_name
from tkg.ontology import Ontology
from tkg.profiles import fold
from tkg.storage import Store, WriteBatch
from tkg.timeutil import to_utc

#: Stored episodes an ingestion may write over: a failed one (a new add replaces it), and for a run that extracts
#: a stored episode (a retry, or one taken from the queue) also its own queued record.
_REPLACEABLE = frozenset({EpisodeStatus.FAILED})
_REPLACEABLE_STORED = frozenset({EpisodeStatus.FAILED, EpisodeStatus.QUEUED})

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EpisodeResult:
    """What one ingestion wrote: the episode, the entities and facts it created or changed (invalidated facts
    included), its LLM cost, and how each decision was made."""

    episode: Episode
    entities: list[Entity] = field(default_factory=list)
    facts: list[Fact] = field(default_factory=list)
    usage: LLMUsage = field(default_factory=LLMUsage)
    warnings: list[str] = field(default_factory=list)
    decisions: dict[str, int] = field(default_factory=dict)
    #: Wall time of the whole ingestion (LLM included), in seconds.
    seconds: float = 0.0

    @property
    def status(self) -> EpisodeStatus:
        return self.episode.status


@dataclass(frozen=True, slots=True)
class RemovalResult:
    """What :meth:`tkg.Memory.remove_episode` changed."""

    episode_id: str
    deleted_facts: list[str] = field(default_factory=list)
    deleted_entities: list[str] = field(default_factory=list)
    restored_facts: list[str] = field(default_factory=list)
    updated_facts: list[str] = field(default_factory=list)
    updated_entities: list[str] = field(default_factory=list)


class Ingestor:
    """The ingestion machinery behind :class:`tkg.Memory` (one per memory). It reads the store under the
    memory's read lock and writes under its write lock (:mod:`tkg.locks`); LLM calls are made without holding
    either, and a group's lock is held for the whole ingestion of one of its episodes."""

    def __init__(
        self,
        store: Store,
        embedder: Embedder,
        llm: GuardedLLM | None,
        config: MemoryConfig,
        ontology: Ontology,
        locks: MemoryLocks,
        communities: CommunityTier | None = None,
    ) -> None:
        self.store = store
        self.communities = communities
        self.embedder = embedder
        self.llm = llm
        self.config = config
        self.ontology = ontology
        self.locks = locks
        self.settings = PlanSettings(
            ontology=ontology,
            rules=config.resolution,
            max_fact_candidates=config.max_fact_candidates,
            related_candidates=config.related_fact_candidates,
            related_min_similarity=config.related_min_similarity,
            max_summary_chars=config.max_summary_chars,
        )

    # -- the LLM steps --------------------------------------------------------------------------------------
    def previous(self, episode: Episode, earlier: Sequence[Episode] = ()) -> list[Episode]:
        """The episodes before ``episode`` given to the extraction prompt as context (``earlier``: episodes of
        the same batch not yet stored)."""
        n = self.config.context_episodes
        if n == 0:
            return []
        want = n + len(earlier) + 1
        while True:
            with self.locks.read():
                found = self.store.recent_episodes(episode.group_id, episode.reference_time, want)
            # A queued episode is not yet part of what the memory knows: sequential ingestion would not have seen
            # it (a group's queue applies in order, so those queued before this one are already extracted).
            stored = [e for e in found if e.status is not EpisodeStatus.QUEUED]
            if len(found) < want or len(stored) >= n + len(earlier) + 1:
                break
            want *= 2
        pending = [e for e in earlier if e.group_id == episode.group_id and e.reference_time <= episode.reference_time]
        # a failed episode the batch adds again is stored too: shown once, as the batch has it
        replaced = {e.id for e in pending} | {episode.id}
        merged = [e for e in stored if e.id not in replaced] + pending
        merged.sort(key=lambda e: e.reference_time)  # stable: stored first, then batch order
        return merged[-n:]

    def extract(self, episode: Episode, previous: Sequence[Episode], usage: LLMUsage) -> GraphExtraction:
        """Extraction call (and the reflection call, when configured). Raises :class:`LLMError`."""
        assert self.llm is not None
        speaker = speaker_of(episode.content) if episode.source is EpisodeSource.MESSAGE else None
        types = self.ontology.describe() if self.ontology else ""
        found = self.llm.call(extraction_prompt(episode, previous, speaker, types), GraphExtraction, usage)
        if self.config.reflection:
            more = self.llm.call(reflection_prompt(episode, previous, found), GraphExtraction, usage)
            found = GraphExtraction(entities=[*found.entities, *more.entities], facts=[*found.facts, *more.facts])
        return found

    def group_lock(self, group_id: str) -> contextlib.AbstractContextManager[None]:
        """Held while one episode of the group is ingested or removed: episodes of one group apply one at a time,
        in order (a shared store's own group lock included, so two processes never plan from the same state)."""
        return self.locks.group(group_id, self.store)

    def stored_episode(self, episode_id: str) -> Episode | None:
        with self.locks.read():
            found = self.store.get(Kind.EPISODE, [episode_id])[0]
        return found if isinstance(found, Episode) else None

    # -- one episode ----------------------------------------------------------------------------------------
    def ingest(
        self,
        episode: Episode,
        now: datetime,
        *,
        extraction: GraphExtraction | LLMError | None = None,
        extract: bool,
        usage: LLMUsage | None = None,
        vectors: dict[str, Vector] | None = None,
        started: float | None = None,
        replace_stored: bool = False,
    ) -> EpisodeResult:
        """Ingest a validated, not yet stored episode. With ``extract`` the LLM extracts, unless ``extraction``
        is given (bulk ingestion: the extraction, or the error its call failed with). Raises
        :class:`ExtractionFailedError` after storing the episode as failed if the LLM fails for good.
        ``replace_stored``: the episode is stored already (queued, or failed) and this run replaces that record."""
        with self.group_lock(episode.group_id):
            return self._ingest(episode, now, extraction, extract, usage, vectors, started, replace_stored)

    def _ingest(
        self,
        episode: Episode,
        now: datetime,
        extraction: GraphExtraction | LLMError | None,
        extract: bool,
        usage: LLMUsage | None,
        vectors: dict[str, Vector] | None,
        started: float | None,
        replace_stored: bool = False,
    ) -> EpisodeResult:
        started = time.perf_counter() if started is None else started
        usage = usage if usage is not None else LLMUsage()
        speaker = speaker_of(episode.content) if episode.source is EpisodeSource.MESSAGE else None
        try:
            if isinstance(extraction, LLMError):
                raise extraction  # the extraction call of a bulk ingestion failed for good
            if extract:
                if extraction is None:
                    extraction = self.extract(episode, self.previous(episode), usage)
                draft = self._draft_of(extraction, episode, speaker)
                status = EpisodeStatus.EXTRACTED
            else:
                draft = self._linked_draft(episode, speaker)
                status = EpisodeStatus.STORED
                times = time_mentions(episode.content, episode.local_reference, self.config.date_languages)
                if times and episode.source is not EpisodeSource.JSON:
                    episode = dataclasses.replace(episode, attributes={**episode.attributes, "times": times})
            episode = dataclasses.replace(episode, status=status, error="")
            return self._apply(
                episode, draft, now, usage, ask=extract, vectors=vectors, started=started, replace_stored=replace_stored
            )
        except LLMError as exc:
            if not extract:  # the embedder's failure, on an episode kept without extraction: nothing to retry
                raise
            failed = dataclasses.replace(episode, status=EpisodeStatus.FAILED, error=str(exc))
            instead = self._store_failed(failed, vectors, replace_stored)
            if instead is not None:  # another run stored the episode meanwhile, or it was removed: not failed
                raise ExtractionFailedError(
                    f"extraction of episode {episode.id} failed: {exc}. Nothing was written: the episode was {instead} "
                    "meanwhile.",
                    episode_id=episode.id,
                ) from exc
            log.warning("episode %s of group %s stored as failed: %s", episode.id, episode.group_id, exc)
            raise ExtractionFailedError(
                f"extraction of episode {episode.id} failed: {exc}. The episode is stored (status 'failed'); "
                "call Memory.retry() once the LLM is back.",
                episode_id=episode.id,
            ) from exc

    def _draft_of(self, extraction: GraphExtraction, episode: Episode, speaker: str | None) -> Draft:
        """The draft of an LLM's extraction. An answer tkg cannot store (a date out of range or not a date, a NUL
        character or a lone surrogate in a name or sentence) is the LLM's failure, not the
        caller's: it raises :class:`LLMError`, and the episode is stored as failed for a retry."""
        try:
            draft = from_extraction(
                extraction, speaker, episode.local_reference, self.config.date_languages, self.ontology
            )
            for entity in draft.entities:
                check_name(entity.name)
                check_text(entity.label, "an entity label")
                check_text(entity.summary, "an entity summary")
                check_storable(entity.attributes, "an entity's attributes")
            for fact in draft.facts:
                check_text(fact.sentence, "a fact sentence")
                check_relation(fact.relation)
                for when in (fact.valid_at, fact.invalid_at):
                    if when is not None:
                        to_utc(when, "a fact's date")
                check_storable(fact.attributes, "a fact's attributes")
        except LLMError:
            raise
        except (TkgError, ValueError, TypeError, OverflowError) as exc:
            # retryable: asked again, the LLM may answer what can be stored (the failed episode is for retry())
            raise LLMError(f"the LLM's answer cannot be stored: {exc}", retryable=True) from None
        return draft

    def apply_structured(self, episode: Episode, draft: Draft, now: datetime) -> EpisodeResult:
        """Write a draft built from structured input (no LLM): deterministic resolution only."""
        with self.group_lock(episode.group_id):
            episode = dataclasses.replace(episode, status=EpisodeStatus.EXTRACTED)
            return self._apply(episode, draft, now, LLMUsage(), ask=False, vectors=None, started=time.perf_counter())

    def _linked_draft(self, episode: Episode, speaker: str | None) -> Draft:
        """No extraction: the speaker, and the entities the memory already knows that the text names (of a JSON
        document: that its string values name, each alone; not its keys)."""
        draft = Draft()
        if speaker:
            draft.add_entity(speaker, "Person")
        texts = _json_strings(episode.content) if episode.source is EpisodeSource.JSON else [episode.content]
        grams = list(dict.fromkeys(g for text in texts for g in name_grams(text)))
        with self.locks.read():
            found = self.store.entities_by_name(episode.group_id, grams) if grams else {}
        for gram in grams:
            entities = found.get(normalize_name(gram))
            if entities and len(entities) == 1:
                draft.add_entity(gram)
        return draft

    def _apply(
        self,
        episode: Episode,
        draft: Draft,
        now: datetime,
        usage: LLMUsage,
        *,
        ask: bool,
        vectors: dict[str, Vector] | None,
        started: float,
        replace_stored: bool = False,
    ) -> EpisodeResult:
        texts = [episode.content, *(e.name for e in draft.entities), *(f.sentence for f in draft.facts)]
        vectors = dict(vectors or {})
        missing = [t for t in dict.fromkeys(texts) if t not in vectors]
        if missing:
            made = check_vectors(self.embedder.embed(missing), self.embedder.dim, len(missing))
            vectors.update(zip(missing, made, strict=True))
        with self.locks.read():
            self.check_new(episode, replace_stored=replace_stored)
            planner = EpisodePlanner(self.store, episode, now, self.settings, vectors)
            questions = planner.questions(draft) if ask and self.llm is not None else Questions()
        answer = None
        if questions:
            assert self.llm is not None
            names = self._entity_names(questions)
            answer = self.llm.call(
                resolution_prompt(episode, questions.names, questions.facts, names), Resolution, usage
            )
        with self.locks.read():
            plan = planner.build(draft, questions, answer)
        episode = dataclasses.replace(episode, embedding=vectors[episode.content])
        self._embed_plan(plan, vectors)
        with self.locks.write():
            # Checked again where it is written: another writer (another group, or the queue) may have stored an
            # episode with this id while this one was planned and its LLM answered.
            self.check_new(episode, replace_stored=replace_stored)
            puts: list[Record] = [episode, *plan.changed_entities(), *plan.facts.values(), *plan.mentions.values()]
            deletes: list[tuple[Kind, str]] = []
            if self.communities is not None and (plan.entities or plan.facts):
                update = self.communities.extend(self.store, plan.entities.values(), plan.facts.values(), now=now)
                puts.extend(update.puts)
                deletes.extend(update.deletes)
                usage.add(update.usage)
            self.store.write(WriteBatch(puts=puts, deletes=deletes))
        warnings = list(plan.warnings)
        self._maintain_communities(episode.group_id, usage, warnings)
        result = EpisodeResult(
            episode=episode,
            entities=list(plan.entities.values()),
            facts=list(plan.facts.values()),
            usage=usage,
            warnings=warnings,
            decisions=dict(plan.decisions),
            seconds=time.perf_counter() - started,
        )
        log.debug(
            "episode %s of group %s %s: %d entities, %d facts written, %d LLM calls, %.1f ms",
            episode.id,
            episode.group_id,
            episode.status.value,
            len(result.entities),
            len(result.facts),
            usage.calls,
            result.seconds * 1000,
        )
        return result

    def _maintain_communities(self, group_id: str, usage: LLMUsage, warnings: list[str]) -> None:
        """Run the community refresh policy after the episode is written. A refresh that fails (its LLM
        summaries, or anything else) changes nothing and does not fail the episode: the policy tries again on a
        later one."""
        if self.communities is None:
            return
        try:
            with self.locks.write():
                refreshed = self.communities.maybe_refresh(self.store, group_id)
        except Exception as exc:  # the episode is written: failing it now would report stored work as lost
            if isinstance(exc, LLMError):
                usage.failures += 1
            warnings.append(f"community refresh of group {group_id} failed and was left for later: {exc}")
            log.warning("community refresh of group %s failed and was left for later: %s", group_id, exc)
            return
        if refreshed is not None:
            usage.add(refreshed.usage)

    def _entity_names(self, questions: Questions) -> dict[str, str]:
        ids = {c.source_id for f in questions.facts for c in f.candidates}
        ids |= {c.target_id for f in questions.facts for c in f.candidates}
        with self.locks.read():
            records = self.store.get(Kind.ENTITY, sorted(ids))
        return {r.id: r.name for r in records if isinstance(r, Entity)}

    def _embed_plan(self, plan: GraphPlan, vectors: dict[str, Vector]) -> None:
        texts = [plan.entities[i].name for i in plan.fresh_entities] + [plan.facts[i].fact for i in plan.fresh_facts]
        missing = [t for t in dict.fromkeys(texts) if t not in vectors]
        if missing:
            made = check_vectors(self.embedder.embed(missing), self.embedder.dim, len(missing))
            vectors.update(zip(missing, made, strict=True))
        for i in plan.fresh_entities:
            plan.entities[i] = dataclasses.replace(plan.entities[i], name_embedding=vectors[plan.entities[i].name])
        for i in plan.fresh_facts:
            plan.facts[i] = dataclasses.replace(plan.facts[i], embedding=vectors[plan.facts[i].fact])

    def _store_failed(
        self, episode: Episode, vectors: dict[str, Vector] | None, replace_stored: bool = False
    ) -> str | None:
        """Store ``episode`` as failed: ``None`` when written, else what became of the stored one meanwhile. When
        the embedder fails too (its service down: what failed may have been the embedding), the episode is stored
        without its vector, which :meth:`tkg.Memory.retry` makes."""
        vector = (vectors or {}).get(episode.content)
        if vector is None:
            try:
                vector = check_vectors(self.embedder.embed([episode.content]), self.embedder.dim, 1)[0]
            except LLMError:
                vector = None
        with self.locks.write():
            current = self.store.get(Kind.EPISODE, [episode.id])[0]
            replaceable = _REPLACEABLE_STORED if replace_stored else _REPLACEABLE
            # A stored episode removed meanwhile stays removed (current is None): nothing is written back.
            first = current is None and not replace_stored
            if first or (isinstance(current, Episode) and current.status in replaceable):
                self.store.write(WriteBatch(puts=[dataclasses.replace(episode, embedding=vector)]))
                return None
            return f"{current.status.value} by another run" if isinstance(current, Episode) else "removed"

    def check_new(self, episode: Episode, *, replace_stored: bool = False) -> None:
        """Refuse to write ``episode`` over another record with its id (a failed one may be replaced). With
        ``replace_stored`` the episode's own stored record (queued or failed) must still be there: it is what the
        run replaces, and one removed meanwhile must not come back."""
        current = self.store.get(Kind.EPISODE, [episode.id])[0]
        if replace_stored:
            if current is None:
                raise NotFoundError(f"episode {episode.id} was removed before its extraction ran; nothing written")
            if not (isinstance(current, Episode) and current.status in _REPLACEABLE_STORED):
                raise ValidationError(
                    f"episode {episode.id} is {getattr(current, 'status', 'not an episode')} already; only a queued "
                    "or failed episode is extracted again"
                )
            return
        if current is not None and not (isinstance(current, Episode) and current.status in _REPLACEABLE):
            raise ValidationError(f"episode {episode.id} already exists; episodes are immutable")

    # -- undo -----------------------------------------------------------------------------------------------
    def remove(self, episode: Episode, now: datetime) -> RemovalResult:
        """Remove an episode and everything only it supports; restore what it invalidated (see
        :meth:`tkg.Memory.remove_episode`)."""
        with self.group_lock(episode.group_id), self.locks.write():
            return self._remove(episode, now)

    def end_fact(self, fact_id: str, at: datetime, now: datetime, note: dict[str, Any] | None = None) -> Fact:
        """End a fact by hand at ``at`` (see :meth:`tkg.Memory.invalidate_fact`) and settle its history again;
        returns the fact as written."""
        found = self.store.get(Kind.FACT, [fact_id])[0]
        if not isinstance(found, Fact):
            raise NotFoundError(f"no fact with id {fact_id!r}")
        with self.group_lock(found.group_id), self.locks.write():
            fact = self.store.get(Kind.FACT, [fact_id])[0]
            if not isinstance(fact, Fact):
                raise NotFoundError(f"fact {fact_id} was removed meanwhile; nothing written")
            if fact.valid_at is not None and at < fact.valid_at:
                raise ValidationError(
                    f"cannot end fact {fact_id} at {at.isoformat()}: it holds from {fact.valid_at.isoformat()}"
                )
            end = invalidation.own_end(fact)
            if end is not None and end <= at:
                raise ValidationError(f"fact {fact_id} already ends at {end.isoformat()}, not after {at.isoformat()}")
            puts: dict[tuple[Kind, str], Record] = {(Kind.FACT, fact_id): invalidation.end_by_hand(fact, at, now, note)}
            self._settle_without({}, puts, RemovalResult(""), now)
            self.store.write(WriteBatch(puts=list(puts.values())))
        log.info("fact %s ended by hand at %s", fact_id, at.isoformat())
        ended = puts[(Kind.FACT, fact_id)]
        assert isinstance(ended, Fact)
        return ended

    def _settle_without(
        self,
        gone: dict[str, Fact],
        puts: dict[tuple[Kind, str], Record],
        result: RemovalResult,
        now: datetime,
        learnt: Set[datetime] = frozenset(),
    ) -> None:
        """Settle again the history of every fact linked to what changed: the facts an episode took away
        (``gone``) and the facts in ``puts`` (its share of others' provenance, or an end given by hand), as if the
        episode had never been added: the verdicts the LLM gave are kept on the facts, so nothing is asked again
        (those on the facts taken away go with them). ``learnt``: when the episode's word on facts it stated again
        was learnt (a change learnt then is undone with it, as one learnt with a fact it took away)."""
        changed = [f for f in puts.values() if isinstance(f, Fact)]
        if not gone and not changed:
            return
        single = self.ontology.single_valued
        overrides = {f.id: f for f in changed}
        ends = sorted({e for f in [*gone.values(), *changed] for e in (f.source_id, f.target_id)})
        around = [overrides.get(f.id, f) for f in self.store.facts_of(ends) if f.id not in gone]
        seeds = [
            f
            for f in around
            if f.id in overrides
            or f.invalidated_by in gone
            or gone.keys() & f.verdicts.keys()
            or any(
                invalidation.same_statement(f, g, single) or invalidation.single_valued_conflict(f, g, single)
                for g in gone.values()
            )
            or any(g.verdicts.get(f.id) for g in gone.values())
        ]
        if not seeds:
            return
        linked = linked_facts(self.store, seeds, overrides, gone, single)
        cache: dict[str, datetime] = {}
        stated = stated_times(self.store, linked, cache, now)
        previous = {f.id: f for f in linked}
        undone = {g.created_at for g in gone.values()} | set(learnt)
        said_last = last_sayings(linked, cache)
        for fact_id, fact in invalidation.history(linked, stated, single, now, undone, said_last).items():
            before = previous[fact_id]
            stored = fact
            if gone.keys() & fact.verdicts.keys():  # a verdict on a fact taken away: as if never given (not reported:
                stored = evolve(fact, verdicts={k: v for k, v in fact.verdicts.items() if k not in gone})  # no history)
            if stored != before or fact_id in overrides:
                puts[(Kind.FACT, fact_id)] = stored
                if fact.invalidated_by is None and before.invalidated_by is not None:
                    result.restored_facts.append(fact_id)
                elif fact_id not in result.updated_facts and fact != before:
                    result.updated_facts.append(fact_id)

    def _remove(self, episode: Episode, now: datetime) -> RemovalResult:
        store = self.store
        result = RemovalResult(episode.id)
        puts: dict[tuple[Kind, str], Record] = {}
        deletes: list[tuple[Kind, str]] = []
        gone: dict[str, Fact] = {}
        learnt: set[datetime] = set()  # when its word on facts it stated again was learnt
        for fact in store.episode_facts(episode.id):
            if any(e != episode.id for e in fact.episodes):
                puts[(Kind.FACT, fact.id)] = revisions.without_episode(fact, episode.id)
                result.updated_facts.append(fact.id)
                learnt.update(at for said, at in revisions.restated(fact) if said == episode.id)
            else:
                gone[fact.id] = fact
                deletes.append((Kind.FACT, fact.id))
                result.deleted_facts.append(fact.id)
        self._settle_without(gone, puts, result, now, learnt)
        mentions = store.mentions(episode_ids=[episode.id])
        deletes.extend((Kind.MENTION, m.id) for m in mentions)
        touched = [m.entity_id for m in mentions]
        entities = {e.id: e for e in store.get(Kind.ENTITY, touched) if isinstance(e, Entity)}
        remaining_facts: dict[str, int] = {}
        for fact in store.facts_of(touched):
            if fact.id not in gone:
                for end in (fact.source_id, fact.target_id):
                    remaining_facts[end] = remaining_facts.get(end, 0) + 1
        renamed: list[Entity] = []
        dropped: set[str] = set()
        for entity_id, entity in entities.items():
            others = [m for m in store.mentions(entity_ids=[entity_id]) if m.episode_id != episode.id]
            if not others and not remaining_facts.get(entity_id):
                deletes.append((Kind.ENTITY, entity_id))
                dropped.add(entity_id)
                result.deleted_entities.append(entity_id)
                continue
            others.sort(key=lambda m: m.created_at)
            profile = fold(entity, others, self.config.max_summary_chars) if others else entity
            if profile != entity:
                result.updated_entities.append(entity_id)
                if profile.name != entity.name:
                    renamed.append(profile)
                else:
                    puts[(Kind.ENTITY, entity_id)] = profile
        if renamed:
            vectors = check_vectors(self.embedder.embed([e.name for e in renamed]), self.embedder.dim, len(renamed))
            for entity, vector in zip(renamed, vectors, strict=True):
                puts[(Kind.ENTITY, entity.id)] = dataclasses.replace(entity, name_embedding=vector)
        # The communities of the entities removed or changed: one left with fewer than two members goes (with its
        # last membership); the others get a name and summary of the members left (never a removed name).
        changed = dropped | set(result.updated_entities)
        if changed:
            touched_communities = sorted({m.community_id for m in store.memberships(entity_ids=sorted(changed))})
            remaining: dict[str, set[str]] = {c: set() for c in touched_communities}
            for m in store.memberships(community_ids=touched_communities):
                if m.entity_id in dropped:
                    deletes.append((Kind.MEMBERSHIP, m.id))
                else:
                    remaining[m.community_id].add(m.entity_id)
            for cid, members in remaining.items():
                if len(members) < 2:
                    deletes.append((Kind.COMMUNITY, cid))
                    deletes.extend((Kind.MEMBERSHIP, f"{cid}>{e}") for e in sorted(members))
            # (with no tier, as a memory whose config has no communities over a store that has some)
            tier = self.communities or CommunityTier(self.embedder, self.llm, config=CommunityConfig())
            left = {c: m for c, m in remaining.items() if len(m) >= 2}
            new_entities = {k[1]: r for k, r in puts.items() if isinstance(r, Entity)}
            new_facts = {k[1]: r for k, r in puts.items() if isinstance(r, Fact)}
            for record in tier.after_removal(store, left, new_entities, new_facts, set(gone), now):
                puts[(Kind.COMMUNITY, record.id)] = record
        deletes.append((Kind.EPISODE, episode.id))
        store.write(WriteBatch(puts=list(puts.values()), deletes=deletes))
        return result


def _json_strings(content: str) -> list[str]:
    """The string values of a JSON document, in document order (keys left out: they name fields, not things)."""
    found: list[str] = []
    pending: list[Any] = [json.loads(content)]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            pending.extend(reversed(list(value.values())))
        elif isinstance(value, list):
            pending.extend(reversed(value))
    return found
