"""From a draft (what an episode says) to graph changes: resolve entities and facts against the store, decide
duplicates and contradictions, and settle invalidations. Nothing is written here; the result is a
:class:`GraphPlan` that :class:`tkg.Memory` writes in one atomic batch.

Two phases, so an episode costs at most one LLM call beyond extraction:

1. :meth:`EpisodePlanner.questions` runs the deterministic passes (exact name or alias, fuzzy 3-grams; verbatim
   repeats, single-valued relations) and returns only what stays ambiguous: names that may be known entities,
   facts that may repeat or contradict known facts (candidates share the entity pair, or an endpoint and the
   relation -- never the whole group).
2. :meth:`EpisodePlanner.build` applies the answer to those questions (or none) and builds the plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from tkg import invalidation
from tkg.drafts import Draft, DraftEntity
from tkg.llm.prompts import AmbiguousName, OpenFact, candidate_numbers
from tkg.llm.schema import Resolution
from tkg.models import Entity, Episode, Fact, Kind, Mention, Vector, new_id
from tkg.names import normalize_name
from tkg.ontology import Ontology
from tkg.profiles import MAX_SUMMARY_CHARS, absorb
from tkg.resolution import ResolutionRules, judge
from tkg.storage import Store
from tkg.timeline import make_scope


@dataclass(frozen=True, slots=True)
class PlanSettings:
    ontology: Ontology = field(default_factory=Ontology)
    rules: ResolutionRules = field(default_factory=ResolutionRules)
    #: Candidate facts per new fact shown to the LLM (the closest by sentence embedding, same pair first).
    max_fact_candidates: int = 6
    #: Entities fetched by each of cosine and BM25 when looking for resolution candidates.
    entity_candidates: int = 8
    max_summary_chars: int = MAX_SUMMARY_CHARS


@dataclass(slots=True)
class GraphPlan:
    """Records one episode writes. ``fresh_*``: ids whose vector must be (re)computed."""

    entities: dict[str, Entity] = field(default_factory=dict)
    facts: dict[str, Fact] = field(default_factory=dict)
    mentions: dict[str, Mention] = field(default_factory=dict)
    fresh_entities: list[str] = field(default_factory=list)
    fresh_facts: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    #: How each decision was made: exact / fuzzy / llm entity merges, verbatim / llm duplicates, invalidations ...
    decisions: dict[str, int] = field(default_factory=dict)

    def count(self, what: str, n: int = 1) -> None:
        self.decisions[what] = self.decisions.get(what, 0) + n


@dataclass(slots=True)
class Questions:
    """What the deterministic passes could not decide, for one batched LLM call."""

    names: list[AmbiguousName] = field(default_factory=list)
    facts: list[OpenFact] = field(default_factory=list)
    #: Draft fact index of each open fact (same order as ``facts``).
    fact_index: list[int] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.names or self.facts)


class EpisodePlanner:
    """Plans one episode's changes. ``vectors`` maps texts (entity names, fact sentences) to their embeddings."""

    def __init__(
        self,
        store: Store,
        episode: Episode,
        now: datetime,
        settings: PlanSettings,
        vectors: Mapping[str, Vector] | None = None,
    ) -> None:
        self.store = store
        self.episode = episode
        self.group = episode.group_id
        self.now = now
        self.settings = settings
        self.vectors = dict(vectors or {})
        self._scope = make_scope(now, [self.group], include_invalidated=True)
        self._verdicts: dict[str, tuple[str | None, tuple[Entity, ...], str]] = {}
        self._facts_of: dict[str, list[Fact]] = {}

    # -- phase 1 --------------------------------------------------------------------------------------------
    def questions(self, draft: Draft) -> Questions:
        out = Questions()
        for entity in draft.entities:
            match, maybe, _ = self._verdict(entity.name)
            if match is None and maybe:
                out.names.append(AmbiguousName(entity.name, entity.label, entity.summary, maybe))
        for index, item in enumerate(draft.facts):
            ends = [self._possible_ids(item.source), self._possible_ids(item.target)]
            pool = self._pool([i for ids in ends for i in ids if i])
            sources = {i for i in ends[0] if i}
            targets = {i for i in ends[1] if i}
            candidates = [old for old in pool if _may_concern(old, sources, targets, item.relation)]
            if not candidates:
                continue
            key = self._text_key(item.sentence, item.relation)
            if any(self._verbatim_key(old) == key for old in candidates):
                continue  # a verbatim repeat: decided without the LLM
            single = self.settings.ontology.single_valued(item.relation)
            undecided = [old for old in candidates if not (single and old.relation == item.relation)]
            if not undecided:
                continue  # single-valued relation: decided by the ontology
            probe = self._probe(item.relation, item.sentence, item.valid_at, item.invalid_at)
            out.facts.append(OpenFact(probe, item.source, item.target, self._closest(item.sentence, undecided)))
            out.fact_index.append(index)
        return out

    def _possible_ids(self, name: str) -> list[str | None]:
        match, candidates, _ = self._verdict(name)
        if match is not None:
            return [match]
        return [None, *(c.id for c in candidates)]

    def _probe(self, relation: str, sentence: str, valid_at: datetime | None, invalid_at: datetime | None) -> Fact:
        return Fact(
            id=new_id(),
            group_id=self.group,
            source_id="?s",
            target_id="?t",
            relation=relation,
            fact=sentence,
            created_at=self.now,
            valid_at=valid_at,
            invalid_at=invalid_at,
        )

    def _verdict(self, name: str) -> tuple[str | None, tuple[Entity, ...], str]:
        key = normalize_name(name)
        if key in self._verdicts:
            return self._verdicts[key]
        exact = self.store.entities_by_name(self.group, [name]).get(key, [])
        if len(exact) == 1:
            result: tuple[str | None, tuple[Entity, ...], str] = (exact[0].id, (), "exact")
        else:
            candidates: dict[str, Entity] = {e.id: e for e in exact}
            cosines: dict[str, float] = {}
            vector = self.vectors.get(name)
            k = self.settings.entity_candidates
            if vector is not None:
                for hit in self.store.vector_search(Kind.ENTITY, vector, k, self._scope):
                    cosines[hit.id] = hit.score
            text_hits = self.store.text_search(Kind.ENTITY, name, k, self._scope)
            ids = [i for i in [*cosines, *(h.id for h in text_hits)] if i not in candidates]
            for record in self.store.get(Kind.ENTITY, list(dict.fromkeys(ids))):
                if isinstance(record, Entity):
                    candidates[record.id] = record
            verdict = judge(name, list(candidates.values()), cosines, self.settings.rules)
            result = (verdict.match, verdict.ambiguous, verdict.reason)
        self._verdicts[key] = result
        return result

    def _pool(self, entity_ids: Sequence[str]) -> list[Fact]:
        """Live facts touching these entities, from the store (cached per episode)."""
        missing = [i for i in entity_ids if i not in self._facts_of]
        if missing:
            for i in missing:
                self._facts_of[i] = []
            for fact in self.store.facts_of(missing):
                for end in {fact.source_id, fact.target_id}:
                    if end in self._facts_of and fact.expired_at is None:
                        self._facts_of[end].append(fact)
        seen: dict[str, Fact] = {}
        for i in entity_ids:
            for fact in self._facts_of[i]:
                seen.setdefault(fact.id, fact)
        return list(seen.values())

    def _closest(self, sentence: str, candidates: list[Fact]) -> list[Fact]:
        vector = self.vectors.get(sentence)
        limit = self.settings.max_fact_candidates

        def score(fact: Fact) -> float:
            if vector is None or fact.embedding is None:
                return 0.0
            return float(np.einsum("i,i->", vector, fact.embedding))

        return sorted(candidates, key=lambda f: -score(f))[:limit]

    @staticmethod
    def _text_key(sentence: str, relation: str) -> tuple[str, str]:
        return (" ".join(sentence.casefold().split()).rstrip("."), relation)

    def _verbatim_key(self, fact: Fact) -> tuple[str, str]:
        return self._text_key(fact.fact, fact.relation)

    # -- phase 2 --------------------------------------------------------------------------------------------
    def build(self, draft: Draft, questions: Questions | None = None, answer: Resolution | None = None) -> GraphPlan:
        """The plan for ``draft``, applying ``answer`` (the LLM's reply to ``questions``) where it is valid."""
        plan = GraphPlan(warnings=list(draft.warnings))
        questions = questions or Questions()
        same_as = self._entity_answers(questions, answer, plan)
        ids: dict[str, str] = {}
        for entity in draft.entities:
            ids[normalize_name(entity.name)] = self._place(entity, same_as, plan)
        fact_answers = self._fact_answers(questions, answer, plan)
        for index, item in enumerate(draft.facts):
            source_id = ids[normalize_name(item.source)]
            target_id = ids[normalize_name(item.target)]
            relation, attributes = self._typed(item.relation, item.attributes, source_id, target_id, plan)
            new = Fact(
                id=new_id(),
                group_id=self.group,
                source_id=source_id,
                target_id=target_id,
                relation=relation,
                fact=item.sentence,
                created_at=self.now,
                valid_at=item.valid_at,
                invalid_at=item.invalid_at,
                episodes=(self.episode.id,),
                attributes=attributes,
            )
            self._settle(new, fact_answers.get(index), plan)
        return plan

    def _typed(
        self, relation: str, attributes: dict[str, object], source_id: str, target_id: str, plan: GraphPlan
    ) -> tuple[str, dict[str, object]]:
        """A declared relation whose ends do not have the declared entity types becomes RELATES_TO (its
        attributes dropped), with a warning: the ontology is a contract, not a hint."""
        declared = self.settings.ontology.relations.get(relation)
        if declared is None:
            return relation, attributes
        for allowed, end in ((declared.sources, source_id), (declared.targets, target_id)):
            labels = plan.entities[end].labels
            if allowed and not set(allowed) & set(labels):
                plan.warnings.append(
                    f"{relation} needs {'/'.join(allowed)} at its {'source' if end == source_id else 'target'}, "
                    f"but {plan.entities[end].name!r} is {'/'.join(labels)}; stored as RELATES_TO"
                )
                return "RELATES_TO", {}
        return relation, attributes

    def _entity_answers(self, questions: Questions, answer: Resolution | None, plan: GraphPlan) -> dict[str, str]:
        chosen: dict[str, str] = {}
        if answer is None:
            return chosen
        numbers = candidate_numbers([item.candidates for item in questions.names])
        for decision in answer.entities:
            if not 1 <= decision.new <= len(questions.names) or decision.same_as is None:
                continue
            item = questions.names[decision.new - 1]
            target = numbers.get(decision.same_as)
            if target is None or target not in {c.id for c in item.candidates}:
                plan.warnings.append(
                    f"the LLM matched {item.name!r} to E{decision.same_as}, which is not one of its candidates; "
                    "kept it as a new entity"
                )
                continue
            chosen[normalize_name(item.name)] = target
        return chosen

    def _fact_answers(
        self, questions: Questions, answer: Resolution | None, plan: GraphPlan
    ) -> dict[int, tuple[str | None, list[str]]]:
        out: dict[int, tuple[str | None, list[str]]] = {}
        if answer is None:
            return out
        numbers = candidate_numbers([item.candidates for item in questions.facts])
        for decision in answer.facts:
            if not 1 <= decision.new <= len(questions.facts):
                continue
            allowed = {c.id for c in questions.facts[decision.new - 1].candidates}
            picked = [numbers.get(n) for n in [decision.duplicate_of, *decision.contradicts] if n is not None]
            if any(p is None or p not in allowed for p in picked):
                plan.warnings.append(f"the LLM named facts outside F{decision.new}'s candidates; those were ignored")
            duplicate = numbers.get(decision.duplicate_of) if decision.duplicate_of is not None else None
            contradicted = [numbers[n] for n in decision.contradicts if numbers.get(n) in allowed]
            out[questions.fact_index[decision.new - 1]] = (duplicate if duplicate in allowed else None, contradicted)
        return out

    def _place(self, entity: DraftEntity, same_as: Mapping[str, str], plan: GraphPlan) -> str:
        """The id ``entity`` resolves to; creates or updates its record and its mention in ``plan``."""
        key = normalize_name(entity.name)
        match, _, reason = self._verdict(entity.name)
        target = match or same_as.get(key)
        if target is not None:
            plan.count(f"entity_{reason if match else 'llm'}")
        current: Entity | None = None
        if target is not None:
            current = plan.entities.get(target)
            if current is None:
                record = self.store.get(Kind.ENTITY, [target])[0]
                current = record if isinstance(record, Entity) else None
        if current is None:
            plan.count("entity_new")
            current = Entity(id=new_id(), group_id=self.group, name=entity.name, created_at=self.now)
            plan.fresh_entities.append(current.id)
        mention = Mention(
            self.episode.id,
            current.id,
            self.group,
            self.now,
            name=entity.name,
            label="" if entity.label == "Entity" else entity.label,
            summary=entity.summary,
            attributes=entity.attributes,
        )
        previous = plan.mentions.get(mention.id)
        if previous is not None:  # two names of this episode resolved to one entity
            mention = dataclasses.replace(
                previous,
                summary=previous.summary or mention.summary,
                label=previous.label or mention.label,
                attributes={**mention.attributes, **previous.attributes},
            )
        plan.mentions[mention.id] = mention
        updated = absorb(current, mention, self.settings.max_summary_chars)
        if updated.name != current.name and current.id not in plan.fresh_entities:
            plan.fresh_entities.append(current.id)
        plan.entities[current.id] = updated
        return current.id

    def _settle(self, new: Fact, llm: tuple[str | None, list[str]] | None, plan: GraphPlan) -> None:
        pool = {f.id: plan.facts.get(f.id, f) for f in self._pool([new.source_id, new.target_id])}
        for fact in plan.facts.values():
            if fact.source_id in (new.source_id, new.target_id) or fact.target_id in (new.source_id, new.target_id):
                pool[fact.id] = fact
        candidates = [f for f in pool.values() if invalidation.is_candidate(new, f)]
        key = self._text_key(new.fact, new.relation)
        duplicate = next(
            (
                f
                for f in candidates
                if f.source_id == new.source_id and f.target_id == new.target_id and self._verbatim_key(f) == key
            ),
            None,
        )
        reason = "fact_verbatim"
        if duplicate is None and llm is not None and llm[0] is not None:
            duplicate = next((f for f in candidates if f.id == llm[0] and invalidation.same_pair(new, f)), None)
            reason = "fact_llm_duplicate"
        single = self.settings.ontology.single_valued(new.relation)
        if duplicate is None and single:
            duplicate = next(
                (
                    f
                    for f in candidates
                    if f.source_id == new.source_id and f.target_id == new.target_id and f.relation == new.relation
                ),
                None,
            )
            reason = "fact_single_valued_duplicate"
        if duplicate is not None:
            plan.count(reason)
            if self.episode.id not in duplicate.episodes:
                duplicate = dataclasses.replace(duplicate, episodes=(*duplicate.episodes, self.episode.id))
            plan.facts[duplicate.id] = duplicate
            return
        contradicted: dict[str, Fact] = {}
        if llm is not None:
            for fid in llm[1]:
                found = next((f for f in candidates if f.id == fid), None)
                if found is not None:
                    contradicted[fid] = found
        if single:
            for f in candidates:
                if invalidation.single_valued_conflict(new, f):
                    contradicted[f.id] = f
        for old in sorted(contradicted.values(), key=lambda f: (f.valid_at is not None, f.valid_at or self.now)):
            new, changed = invalidation.settle(new, old, self.now)
            if changed is not old:
                plan.count("invalidated")
                plan.facts[changed.id] = changed
        if new.expired_at is not None:
            plan.count("arrived_invalidated")
        plan.count("fact_new")
        plan.facts[new.id] = new
        plan.fresh_facts.append(new.id)


def _may_concern(old: Fact, sources: set[str], targets: set[str], relation: str) -> bool:
    """Could ``old`` be a candidate of a new fact whose ends are among ``sources`` x ``targets`` (the possible
    resolutions of two names)? The rule of :func:`tkg.invalidation.is_candidate`, over every combination."""
    if old.expired_at is not None:
        return False
    ends = {old.source_id, old.target_id}
    if old.relation == relation and ends & (sources | targets):
        return True
    return any(ends == {s, t} for s in sources & ends for t in targets & ends)
