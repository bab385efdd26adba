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
import functools
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np

from tkg import invalidation, revisions
from tkg.drafts import Draft, DraftEntity
from tkg.llm.prompts import AmbiguousName, OpenFact, candidate_numbers
from tkg.llm.schema import Resolution
from tkg.models import Entity, Episode, Fact, Kind, Mention, Vector, Verdict, new_id
from tkg.names import normalize_name
from tkg.ontology import Ontology
from tkg.profiles import ALSO_NAMED, MAX_SUMMARY_CHARS, absorb, merge_summary
from tkg.resolution import ResolutionRules, judge
from tkg.storage import Candidates, Closest, Store
from tkg.timeline import make_scope


@dataclass(frozen=True, slots=True)
class PlanSettings:
    ontology: Ontology = field(default_factory=Ontology)
    rules: ResolutionRules = field(default_factory=ResolutionRules)
    #: Candidate facts per new fact shown to the LLM (the closest by sentence embedding, same pair first).
    max_fact_candidates: int = 6
    #: Facts under another relation that share an endpoint and say something close (sentence cosine at least
    #: ``related_min_similarity``) added to a new fact's candidates ("Ann MOVED_TO Berlin" meets "Ann LIVES_IN
    #: Paris"): at most this many per new fact, inside ``max_fact_candidates``.
    related_candidates: int = 2
    related_min_similarity: float = 0.3
    #: Facts read per round when candidates are read from the store closest first (more rounds when the filters
    #: drop many); the candidates found do not depend on it.
    candidate_batch: int = 32
    #: The most facts read that way per search. It bites only when that many facts tie at the edge of what was
    #: read (a bag-of-words embedder gives thousands of equal scores around a hot entity): the ties not read are
    #: left out, and the statements read are ranked as they are.
    candidate_reads: int = 128
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
    #: The stored entities the planner read, as stored (before this episode absorbed its mentions into them).
    stored: dict[str, Entity] = field(default_factory=dict)

    def count(self, what: str, n: int = 1) -> None:
        self.decisions[what] = self.decisions.get(what, 0) + n

    def changed_entities(self) -> list[Entity]:
        """The entities the episode writes: new ones and stored ones it changed. One mentioned again with nothing
        new to absorb stays as stored: rewriting it would cost every index of the store an update for nothing (on
        PostgreSQL a new row version, so a new HNSW entry for an unchanged vector)."""
        return [e for i, e in self.entities.items() if self.stored.get(i) != e]


@dataclass(slots=True)
class Questions:
    """What the deterministic passes could not decide, for one batched LLM call."""

    names: list[AmbiguousName] = field(default_factory=list)
    facts: list[OpenFact] = field(default_factory=list)
    #: Draft fact index of each open fact (same order as ``facts``).
    fact_index: list[int] = field(default_factory=list)
    #: For each open fact (same order as ``facts``), each fact shown -> the facts of its statement that concern that
    #: open fact (a duplicate or a contradiction applies to all of them; two facts of one episode shown the same
    #: statement may each concern different facts of it).
    members: list[dict[str, list[str]]] = field(default_factory=list)
    #: Verdicts a draft fact (by index) inherits from the statement it restates, without asking.
    inherited: dict[int, dict[str, Verdict]] = field(default_factory=dict)

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
        self._named: dict[str, list[Entity]] = {}  # normalised name -> the stored entities of that exact name
        self._entities: dict[str, Entity] = {}  # the stored entities read so far, by id
        self._pairs: dict[tuple[str, str], list[Fact]] = {}
        self._new: set[str] = set()  # ids of the entities this plan creates: no stored fact touches them
        self._slots: dict[tuple[str, str], list[Fact]] = {}
        self._times: dict[str, datetime] = {}

    # -- phase 1 --------------------------------------------------------------------------------------------
    def questions(self, draft: Draft) -> Questions:
        out = Questions()
        self._look_up([e.name for e in draft.entities])
        for entity in draft.entities:
            match, maybe, _ = self._verdict(entity.name)
            if match is None and maybe:
                out.names.append(AmbiguousName(entity.name, entity.label, entity.summary, maybe))
        for index, item in enumerate(draft.facts):
            ends = [self._possible_ids(item.source), self._possible_ids(item.target)]
            sources = {i for i in ends[0] if i}
            targets = {i for i in ends[1] if i}
            probe = self._probe(item.relation, item.sentence, item.valid_at, item.invalid_at)
            undecided, inherited, members = self._undecided(probe, sources, targets, len(ends[0]) == len(ends[1]) == 1)
            if inherited:
                out.inherited[index] = inherited
            if undecided:
                out.facts.append(OpenFact(probe, item.source, item.target, undecided))
                out.fact_index.append(index)
                out.members.append(members)
        return out

    def _undecided(
        self, probe: Fact, sources: set[str], targets: set[str], resolved: bool
    ) -> tuple[list[Fact], dict[str, Verdict], dict[str, list[str]]]:
        """The facts the LLM must judge against a new one (``probe``, whose ends may be any of ``sources`` x
        ``targets``): those that may concern it (superseded ones included) and that neither the sentence nor the
        ontology decides, the closest first, bounded; the verdicts the new fact inherits instead of asking; and for
        each fact shown, the facts of its statement that concern the new one.

        A verbatim restatement inherits what is known of the statement it repeats: the verdicts given on its
        earlier restatements, and "compatible" for the facts stated in the same episode as one of them (one
        episode said both). A contradiction or a duplicate is copied onto the new fact, so that it holds even once
        the restatement it came from is removed (exactly what a consistent LLM, asked again, would say);
        "compatible" is what no verdict means, so it needs no copy. Nor is it asked again about a statement one of
        whose facts was judged against one of the earlier restatements (a verdict names the fact that was shown,
        "compatible" that one only), whichever of that statement's facts it meets now: the statement's strongest
        verdict is copied onto each fact of it met that concerns the new one, as above.

        Nothing here reads all the facts of an entity: the candidates are the facts between the two ends, the
        closest facts of the same relation (read closest first until the shown statements are certain), the
        related facts (:meth:`_related`) and the facts judged against a restatement, each read from the store's
        indexes."""
        near = sources | targets
        single = self.settings.ontology.single_valued(probe.relation)
        pairs = [(s, t) for s in sorted(sources) for t in sorted(targets)]
        related, first = self._first_reads(probe, sorted(near), single, pairs)
        paired = self._between(pairs)
        key = invalidation.text_key(probe.fact)
        mates = [
            f
            for f in paired
            if resolved
            and f.source_id in sources
            and f.target_id in targets
            and f.relation == probe.relation
            and invalidation.text_key(f.fact) == key
        ]
        mate_ids = {m.id for m in mates}
        together = {e for m in mates for e in m.episodes}
        # What the statement's earlier restatements were judged to be against each other fact (either side).
        known: dict[str, list[Fact]] = {}
        judged: dict[str, Fact] = {}
        for m in mates:
            for other in m.verdicts:
                known.setdefault(other, []).append(m)
        if mates:
            by_id = {m.id: m for m in mates}
            for f in self.store.facts_judging(sorted(mate_ids), sorted(near)):
                judged[f.id] = f
                for m_id in mate_ids.intersection(f.verdicts):
                    known.setdefault(f.id, []).append(by_id[m_id])
            forward = sorted(known.keys() - judged.keys())
            judged.update((f.id, f) for f in self.store.get(Kind.FACT, forward) if isinstance(f, Fact))

        def concerns(old: Fact) -> bool:
            return (
                old.id not in mate_ids
                and _may_concern(old, sources, targets, near, probe.relation, old.id in related)
                and invalidation.overlaps_as_stated(probe, old)
                and not (single and old.relation == probe.relation)  # a single-valued relation: the ontology decides
            )

        # A verdict holds for the whole statement: the strongest carried on any of its facts. A statement one of
        # whose facts was judged against (or judged) a restatement is not asked about again, whichever of its facts
        # is met ("compatible" names the one fact that was shown); a fact of it that concerns the new one takes its
        # verdict as its own copy, as if asked (so that it holds once the facts it was carried on are removed).
        judged_statements: dict[tuple[str, ...], Verdict] = {}
        keyed = [(old, invalidation.statement_key(old)) for old in judged.values()]
        for old, said in keyed:
            carried = [v for m in known[old.id] if (v := invalidation.verdict_between(m, old)) is not None]
            judged_statements[said] = min(
                [*carried, judged_statements.get(said, Verdict.COMPATIBLE)], key=_STRENGTH.index
            )
        inherited: dict[str, Verdict] = {}

        def inherit(old: Fact, said: tuple[str, ...]) -> None:
            verdict = judged_statements[said]
            if verdict is not Verdict.COMPATIBLE:  # "compatible" is what no verdict means: not copied
                inherited[old.id] = verdict

        for old, said in keyed:
            if concerns(old):
                inherit(old, said)
        # One question per statement (restatements share the verdict), the closest statements first.
        statements: dict[tuple[str, ...], list[Fact]] = {}
        seen: set[str] = set()

        def take(facts: Sequence[Fact]) -> None:
            for old in facts:
                if old.id in seen:
                    continue
                seen.add(old.id)
                if old.id in known or not concerns(old) or together.intersection(old.episodes):
                    continue
                said = invalidation.statement_key(old)
                if said in judged_statements:
                    inherit(old, said)
                else:
                    statements.setdefault(said, []).append(old)

        take(paired)
        take(list(related.values()))
        if not single:
            self._same_relation(probe, sorted(near), statements, seen, take, first)
        shown = self._closest(probe.fact, list(statements.values()))
        members = {f.id: [m.id for m in statements[invalidation.statement_key(f)]] for f in shown}
        return shown, inherited, members

    def _first_reads(
        self, probe: Fact, near: list[str], single: bool, pairs: list[tuple[str, str]]
    ) -> tuple[dict[str, Fact], list[tuple[Fact, float]] | None]:
        """The related facts (:meth:`_related`, every fact of each statement) and the first batch of the new fact's
        own relation around its ends (None when not read so: a single-valued relation, no sentence vector). The
        two closest-first reads go to the store in one call (a database makes them on two connections at once),
        then one call reads the facts between the new fact's ends (``pairs``), between those of each related
        statement and between those of the first batch (later reads hit the per-episode cache)."""
        vector, k, settings = self.vectors.get(probe.fact), self._reads()[0], self.settings
        around = [
            Closest(near, vector, k, probe.relation, same, holding=same)
            for same, wanted in (
                (False, settings.related_candidates > 0),
                (True, not single and settings.max_fact_candidates > 0),
            )
            if vector is not None and wanted
        ]
        firsts = dict(zip((a.same for a in around), self.store.closest_facts_together(around), strict=True))
        ranked = self._related(probe, near, firsts.get(False))
        first = firsts.get(True)
        ahead = [(old.source_id, old.target_id) for old, _ in first or ()]
        self._read_between([*pairs, *((source, target) for source, target, *_ in ranked), *ahead])
        related = {
            f.id: f
            for source, target, *_ in ranked
            for f in self._between([(source, target)])
            if f.embedding is not None and invalidation.statement_key(f) in ranked
        }
        return related, first

    def _same_relation(
        self,
        probe: Fact,
        near: list[str],
        statements: dict[tuple[str, ...], list[Fact]],
        seen: set[str],
        take: Callable[[Sequence[Fact]], None],
        first: list[tuple[Fact, float]] | None,
    ) -> None:
        """Adds to ``statements`` (through ``take``) the facts of the new fact's relation around its ends that can
        be among the ``max_fact_candidates`` statements shown (:meth:`_closest`: those still holding first). First
        the facts still holding, read from the store closest first, until that many holding statements known are
        certainly closer than any holding fact not read yet; when fewer hold, then the facts of every standing,
        closest first, until the superseded statements that fill the rest are certain. Each fact is read with the
        rest of its statement. Without a sentence vector, all of them. ``first``: the first round's read of the
        holding facts, already made."""
        vector = self.vectors.get(probe.fact)
        limit = self.settings.max_fact_candidates
        if vector is None:
            take(self.store.facts_with(near, probe.relation))
            return
        if limit <= 0:
            return

        def closer(edge: float, superseded: bool) -> int:
            """Statements known of this standing whose closeness is above ``edge``."""
            return sum(s == superseded and score > edge for s, score in _standing(list(statements.values()), vector))

        def holding() -> int:
            return sum(not s for s, _ in _standing(list(statements.values()), vector))

        read = functools.partial(self._read_closest, near, vector, probe.relation, seen, take)
        read(first, True, lambda edge: closer(edge, False) >= limit)
        if holding() < limit:
            read(None, False, lambda edge: closer(edge, True) >= limit - holding())

    def _read_closest(
        self,
        near: list[str],
        vector: Vector,
        relation: str,
        seen: set[str],
        take: Callable[[Sequence[Fact]], None],
        found: list[tuple[Fact, float]] | None,
        holding: bool,
        certain: Callable[[float], bool],
    ) -> None:
        """Read the facts of ``relation`` around ``near`` (only those still holding: ``holding``) closest first, a
        batch at a time, each with every fact between its two ends (``take``), until the store has no more, as
        many as may be read are read, or ``certain`` is true of the last score read (no fact not read yet scores
        above it). ``found``: the first batch, already read."""
        k, most = self._reads()
        while True:
            if found is None:
                found = self.store.closest_facts(near, vector, k, relation, holding=holding)
            take(self._between([(old.source_id, old.target_id) for old, _ in found if old.id not in seen]))
            if len(found) < k or k >= most or certain(found[-1][1] + _SCORE_NOISE):
                return
            k, found = most, None

    def _related(self, probe: Fact, near: list[str], first: list[tuple[Fact, float]] | None) -> set[tuple[str, ...]]:
        """Facts under another relation that share an endpoint with the new fact (``near``) and say something
        close (sentence embeddings): "Ann LIVES_IN Paris" for "Ann MOVED_TO Berlin". At most
        ``related_candidates`` statements (their keys, :func:`invalidation.statement_key`); the caller reads
        every fact of each. ``first``: the first round's read, already made."""
        limit = self.settings.related_candidates
        vector = self.vectors.get(probe.fact)
        if limit <= 0 or vector is None:
            return set()
        # Counted by statement, not by fact: restatements of one statement share one verdict. Walked from the
        # closest down, so a statement's first score is its best; the walk stops past the limit-th statement
        # (ties with it kept, then broken by content) or below the similarity floor. The store gives the closest
        # facts a batch at a time; scores above the batch's last one (give or take float noise) are certain.
        floor = self.settings.related_min_similarity
        k, most = self._reads()
        got = first
        while True:
            if got is None:
                got = self.store.closest_facts(near, vector, k, probe.relation, same=False)
            found = [f for f, _ in got]
            last = len(found) < k or k >= most  # all of them, or as many as are read
            scores = _closeness(found, vector)
            edge = -math.inf if last else got[-1][1] + _SCORE_NOISE
            best, decided = _best_statements(found, scores, edge, floor, limit)
            if decided or last:
                break
            k, got = most, None
        return set(sorted(best, key=lambda key: (-best[key], key))[:limit])

    def _reads(self) -> tuple[int, int]:
        """Facts read in the first round of a closest-first search, and the most read in all."""
        most = max(1, self.settings.candidate_reads)
        return min(max(1, self.settings.candidate_batch), most), most

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
        self._look_up([name])
        exact = self._named[key]
        if len(exact) == 1:
            result: tuple[str | None, tuple[Entity, ...], str] = (exact[0].id, (), "exact")
        else:
            candidates: dict[str, Entity] = {e.id: e for e in exact}
            cosines: dict[str, float] = {}
            vector = self.vectors.get(name)
            k = self.settings.entity_candidates
            if vector is None:
                text_hits = self.store.text_search(Kind.ENTITY, name, k, self._scope)
            else:  # both lists in one store call (a database reads them on two connections at once)
                asks = [Candidates("cosine", Kind.ENTITY, k), Candidates("bm25", Kind.ENTITY, k)]
                cosine_hits, text_hits = self.store.candidates(asks, name, vector, self._scope)
                cosines.update((hit.id, hit.score) for hit in cosine_hits)
            ids = [i for i in [*cosines, *(h.id for h in text_hits)] if i not in candidates]
            for record in self.store.get(Kind.ENTITY, list(dict.fromkeys(ids))):
                if isinstance(record, Entity):
                    candidates[record.id] = self._entities[record.id] = record
            verdict = judge(name, list(candidates.values()), cosines, self.settings.rules)
            result = (verdict.match, verdict.ambiguous, verdict.reason)
        self._verdicts[key] = result
        return result

    def _look_up(self, names: Sequence[str]) -> None:
        """Read the stored entities of each of ``names`` not read yet, in one call (the store does not change while
        an episode is planned: the group's lock is held)."""
        missing: dict[str, str] = {}
        for name in names:
            key = normalize_name(name)
            if key not in self._named:
                missing.setdefault(key, name)
        if missing:
            found = self.store.entities_by_name(self.group, list(missing.values()))
            for key in missing:
                self._named[key] = found.get(key, [])
                self._entities.update((e.id, e) for e in self._named[key])

    def _between(self, pairs: Sequence[tuple[str, str]]) -> list[Fact]:
        """The stored facts between the two entities of any pair, either way round (cached per episode: the store
        does not change while an episode is planned; an entity this plan creates has none)."""
        keys = self._read_between(pairs)
        cache = self._pairs
        if len(keys) == 1:
            return cache[keys[0]]
        return sorted({f.id: f for k in keys for f in cache[k]}.values(), key=lambda f: f.id)

    def _read_between(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """Read the facts between the pairs not read yet into the episode's cache, in one store call; returns the
        pairs as its keys."""
        cache = self._pairs
        keys = list(dict.fromkeys((min(a, b), max(a, b)) for a, b in pairs))
        missing = [k for k in keys if k not in cache]
        for k in missing:
            cache[k] = []
        missing = [k for k in missing if not self._new.intersection(k)]
        if missing:
            for fact in self.store.facts_between(missing):
                a, b = fact.source_id, fact.target_id
                cache[min(a, b), max(a, b)].append(fact)
        return keys

    def _closest(self, sentence: str, statements: list[list[Fact]]) -> list[Fact]:
        """The ``max_fact_candidates`` statements shown to the LLM (each by its representative restatement): those
        still holding before those a later fact already superseded, each the closest first (:func:`_standing`).
        A new fact can end only what holds: shown the values a chain of changes went through, closest by wording,
        the LLM was often not shown the one holding now ("lives in city79" shown 76, 73, 42, 77, 7, 1, not 78), which
        then held on beside the new one. A superseded statement is still worth a verdict (it holds again if what
        ended it is removed), after those."""
        standing = _standing(statements, self.vectors.get(sentence))
        # Ties by content, never by arrival.
        order = sorted(
            range(len(statements)),
            key=lambda i: (standing[i][0], -standing[i][1], invalidation.statement_key(statements[i][0])),
        )
        return [min(statements[i], key=_representative) for i in order[: self.settings.max_fact_candidates]]

    # -- phase 2 --------------------------------------------------------------------------------------------
    def build(self, draft: Draft, questions: Questions | None = None, answer: Resolution | None = None) -> GraphPlan:
        """The plan for ``draft``, applying ``answer`` (the LLM's reply to ``questions``) where it is valid."""
        plan = GraphPlan(warnings=list(draft.warnings), stored=self._entities)
        questions = questions if questions is not None else Questions()
        for open_fact in questions.facts:  # what the batched resolution call was asked, for the cost reports
            plan.count("fact_questions")
            plan.count("fact_candidates", len(open_fact.candidates))
            plan.count(
                "fact_candidates_other_relation",
                sum(c.relation != open_fact.fact.relation for c in open_fact.candidates),
            )
        same_as = self._entity_answers(questions, answer, plan)
        self._look_up([e.name for e in draft.entities])
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
            self._settle(new, {**questions.inherited.get(index, {}), **fact_answers.get(index, {})}, plan)
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
    ) -> dict[int, dict[str, Verdict]]:
        """The LLM's verdict on every candidate each open fact was shown with (``compatible`` for those it named
        neither a duplicate nor contradicted), by draft fact index."""
        out: dict[int, dict[str, Verdict]] = {}
        if answer is None:
            return out
        numbers = candidate_numbers([item.candidates for item in questions.facts])
        decisions = {d.new: d for d in answer.facts if 1 <= d.new <= len(questions.facts)}
        for number, item in enumerate(questions.facts, start=1):
            allowed = {c.id for c in item.candidates}
            shown: dict[str, Verdict] = dict.fromkeys(sorted(allowed), Verdict.COMPATIBLE)
            decision = decisions.get(number)
            if decision is not None:
                picked = [numbers.get(n) for n in [*decision.duplicates, *decision.contradicts]]
                if any(p is None or p not in allowed for p in picked):
                    plan.warnings.append(f"the LLM named facts outside F{number}'s candidates; those were ignored")
                # Named both ways, a fact is a duplicate (as it always was with the one duplicate of the old form).
                for n, verdict in [
                    *((n, Verdict.CONTRADICTS) for n in decision.contradicts),
                    *((n, Verdict.SAME) for n in decision.duplicates),
                ]:
                    if numbers.get(n) in allowed:
                        shown[numbers[n]] = verdict
            # A duplicate or a contradiction holds against every restatement of the statement shown (each is a
            # link of the history); "compatible" is kept against the fact shown only: it links nothing, and only
            # tells later restatements of either statement that the pair was judged (see _undecided). Kept on
            # every restatement, a statement said N times held N of them for each fact judged beside it.
            members = questions.members[number - 1]
            out[questions.fact_index[number - 1]] = {
                member: verdict
                for fid, verdict in shown.items()
                for member in (members.get(fid, [fid]) if verdict is not Verdict.COMPATIBLE else [fid])
            }
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
            current = plan.entities.get(target) or self._entities.get(target)
            if current is None:
                record = self.store.get(Kind.ENTITY, [target])[0]
                if isinstance(record, Entity):
                    current = self._entities[record.id] = record
        if current is None:
            plan.count("entity_new")
            current = Entity(id=new_id(), group_id=self.group, name=entity.name, created_at=self.now)
            plan.fresh_entities.append(current.id)
            self._new.add(current.id)
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
        if previous is not None:  # two names of this episode resolved to one entity: one mention keeps both
            names = [previous.name, *previous.attributes.get(ALSO_NAMED, ())]
            attributes = {**mention.attributes, **previous.attributes}
            if normalize_name(entity.name) not in {normalize_name(n) for n in names}:
                attributes[ALSO_NAMED] = [*names[1:], entity.name]
            mention = dataclasses.replace(
                previous,
                summary=merge_summary(previous.summary, mention.summary, max_chars=1 << 30),
                label=previous.label or mention.label,
                attributes=attributes,
            )
        plan.mentions[mention.id] = mention
        updated = absorb(current, mention, self.settings.max_summary_chars)
        if updated.name != current.name and current.id not in plan.fresh_entities:
            plan.fresh_entities.append(current.id)
        plan.entities[current.id] = updated
        return current.id

    def _settle(self, new: Fact, verdicts: dict[str, Verdict] | None, plan: GraphPlan) -> None:
        """Add ``new`` to the plan with the LLM's ``verdicts`` on its candidates, and settle the history of every
        fact linked to it (:func:`tkg.invalidation.history`): a verbatim repeat with the same interval only adds
        provenance; anything else is a fact of its own, which may restate, supersede or be superseded."""
        ends = (new.source_id, new.target_id)
        pool = {f.id: plan.facts.get(f.id, f) for f in self._between([ends])}
        pool.update((f.id, f) for f in plan.facts.values() if {f.source_id, f.target_id} == set(ends))
        key = invalidation.text_key(new.fact)
        repeat = next(
            (
                f
                for f in pool.values()
                if (f.source_id, f.target_id, f.relation) == (new.source_id, new.target_id, new.relation)
                and invalidation.text_key(f.fact) == key
                and f.valid_at == new.valid_at
                and invalidation.own_end(f) == new.invalid_at
            ),
            None,
        )
        if repeat is not None:
            # Only provenance changes; but the time the statement was first made may now be earlier, which can
            # change the order of facts that start at the same instant: settled again below.
            plan.count("fact_verbatim")
            repeat = revisions.stated_again(repeat, self.episode.id, self.now)
            plan.facts[repeat.id] = repeat
            new = repeat
        else:
            if verdicts:
                new = dataclasses.replace(new, verdicts=verdicts)
                plan.count("fact_llm_duplicate", sum(v is Verdict.SAME for v in verdicts.values()))
                plan.count("fact_llm_contradiction", sum(v is Verdict.CONTRADICTS for v in verdicts.values()))
            plan.count("fact_new")
            plan.facts[new.id] = new
            plan.fresh_facts.append(new.id)
        single = self.settings.ontology.single_valued
        if repeat is None:
            ended = self._ended_by_last(new, plan)
            if ended is not None:
                for fact_id, fact in ended.items():
                    plan.count("fact_restated" if fact_id == new.id else "invalidated")
                    plan.facts[fact_id] = fact
                return
        pool = self._component(new, plan)
        linked = list(pool.values())
        stated = self._stated(linked, plan)
        settled = invalidation.history(linked, stated, single, self.now, said_last=last_sayings(linked, self._times))
        for fact_id, fact in settled.items():
            before = pool[fact_id]
            if fact is before:  # history() gives back the facts it does not change
                continue
            if fact_id == new.id:
                if fact.invalidated_by is not None:
                    restated = invalidation.same_statement(fact, pool[fact.invalidated_by], single) or (
                        invalidation.verdict_between(fact, pool[fact.invalidated_by]) is Verdict.SAME
                    )
                    plan.count("fact_restated" if restated else "arrived_invalidated")
            elif fact.invalidated_by is not None and fact.invalidated_by != before.invalidated_by:
                plan.count("invalidated")
            elif fact.invalidated_by is None and before.invalidated_by is not None:
                plan.count("restored")
            plan.facts[fact_id] = fact

    def _ended_by_last(self, new: Fact, plan: GraphPlan) -> dict[str, Fact] | None:
        """:func:`tkg.invalidation.ended_by_last` for ``new``: what settling its component changes when it comes
        last, read from the statements it contradicts (whole) and the facts that ended them, not from the whole
        component, which a chain of changes makes as long as the chain. None: settle the whole component (also
        when another fact of this episode is among them, or one of its statement)."""
        single = self.settings.ontology.single_valued
        if single(new.relation):
            return self._ended_in_slot(new, plan)
        key = invalidation.statement_key(new)
        said = [f for f in self._between([(new.source_id, new.target_id)]) if invalidation.statement_key(f) == key]
        if said:
            return self._restated_last(new, said, plan)
        if not invalidation.may_end_last(new, single):
            return None
        if any(f.id != new.id and invalidation.statement_key(f) == key for f in plan.facts.values()):
            return None
        contradicted = self._whole_statements(sorted(i for i, v in new.verdicts.items() if v is Verdict.CONTRADICTS))
        if contradicted is None or any(f.id in plan.facts for f in contradicted):
            return None
        # a fact of this episode in one of those statements (their restatement, or "same" as one of their facts):
        # not in the store yet, and the statement is then said in this episode too
        ids, keys = {f.id for f in contradicted}, {invalidation.statement_key(f) for f in contradicted}
        for f in plan.facts.values():
            same = any(v is Verdict.SAME and i in ids for i, v in f.verdicts.items())
            if f.id != new.id and (same or invalidation.statement_key(f) in keys):
                return None
        named = sorted({f.invalidated_by for f in contradicted if f.invalidated_by is not None})
        enders = {f.id: f for f in self.store.get(Kind.FACT, named) if isinstance(f, Fact)}
        if plan.facts.keys() & enders.keys():
            return None
        everyone = [new, *contradicted, *enders.values()]
        self._stated(everyone, plan)
        said_last = last_sayings(everyone, self._times)
        return invalidation.ended_by_last(new, contradicted, enders, said_last, single, self.now)

    def _ended_in_slot(self, new: Fact, plan: GraphPlan) -> dict[str, Fact] | None:
        """:func:`tkg.invalidation.ended_in_slot` for ``new``, of a single-valued relation: read from the facts of its
        slot (subject and relation) and the facts judging them, not from the whole component (the slot and
        everything linked to it), whose history a value changed N times makes N facts long. None: settle the whole
        component (also when another fact of this episode is in the slot or judges one of its facts)."""
        if not invalidation.may_settle_alone(new):
            return None
        slot = self._slot(new.source_id, new.relation)
        if self._planned_beside(
            new, plan, {f.id for f in slot}, lambda f: (f.source_id, f.relation) == (new.source_id, new.relation)
        ):
            return None
        ends = sorted({new.source_id, *(f.target_id for f in slot)})
        judging = self.store.facts_judging(sorted(f.id for f in slot), ends) if slot else []
        return invalidation.ended_in_slot(new, slot, judging, self.settings.ontology.single_valued, self.now)

    def _restated_last(self, new: Fact, statement: list[Fact], plan: GraphPlan) -> dict[str, Fact] | None:
        """:func:`tkg.invalidation.restated_last` for ``new``, which restates verbatim the stored facts
        ``statement``: read from them and the facts judging them, not from the whole component, which a statement
        said N times makes N facts long. None: settle the whole component (also when another fact of this episode
        is of the statement or judges one of its facts)."""
        if not invalidation.may_settle_alone(new):
            return None
        key = invalidation.statement_key(new)
        if self._planned_beside(new, plan, {f.id for f in statement}, lambda f: invalidation.statement_key(f) == key):
            return None
        judging = self.store.facts_judging(sorted(f.id for f in statement), [new.source_id, new.target_id])
        return invalidation.restated_last(new, statement, judging, self.settings.ontology.single_valued, self.now)

    @staticmethod
    def _planned_beside(new: Fact, plan: GraphPlan, ids: set[str], alike: Callable[[Fact], bool]) -> bool:
        """Does another fact of this episode's plan belong with ``ids`` (``alike``, or one of them as the plan now
        has it) or hold a verdict other than "compatible" on one of them or on ``new``?"""
        named = {*ids, new.id}
        return any(
            f.id != new.id
            and (f.id in ids or alike(f) or any(v != Verdict.COMPATIBLE and i in named for i, v in f.verdicts.items()))
            for f in plan.facts.values()
        )

    def _whole_statements(self, ids: Sequence[str]) -> list[Fact] | None:
        """The stored facts ``ids`` and every fact of their statements: their restatements and the facts a "same"
        verdict joins them to, either way round, transitively (a few store reads a step). None when one of
        ``ids`` is not stored."""
        step = [f for f in self.store.get(Kind.FACT, list(ids)) if isinstance(f, Fact)]
        if len(step) != len(ids):
            return None
        found: dict[str, Fact] = {}
        while step:
            found.update((f.id, f) for f in step)
            self._read_between([(f.source_id, f.target_id) for f in step])
            links = [
                m
                for f in step
                for m in self._between([(f.source_id, f.target_id)])
                if invalidation.statement_key(m) == invalidation.statement_key(f)
            ]
            same = sorted({i for f in step for i, v in f.verdicts.items() if v is Verdict.SAME} - found.keys())
            links += [f for f in self.store.get(Kind.FACT, same) if isinstance(f, Fact)]
            judged = sorted(f.id for f in step)
            ends = sorted({e for f in step for e in (f.source_id, f.target_id)})
            for m in self.store.facts_judging(judged, ends):
                if any(m.verdicts.get(i) is Verdict.SAME for i in judged):
                    links.append(m)
            step = list({m.id: m for m in links if m.id not in found}.values())
        return list(found.values())

    def _component(self, seed: Fact, plan: GraphPlan) -> dict[str, Fact]:
        """The facts linked to ``seed`` through statements or contradictions (:func:`tkg.invalidation.component`),
        as the plan now has them, wherever the links lead: a fact reached has its end settled from all its links,
        so a link to a fact of other entities is followed too (a verdict against a fact whose slot holds a fact
        that superseded it: left out, that supersession was undone). Walked link by link from the store (the same
        slot, the same statement, a verdict either way round) instead of reading every fact of the entities
        reached; the facts reached at one step are followed together, a few store reads a step (a statement
        restated a thousand times is one step, not a thousand reads)."""
        single = self.settings.ontology.single_valued
        planned = list(plan.facts.values())

        def current(facts: Sequence[object]) -> list[Fact]:
            return [plan.facts.get(f.id, f) for f in facts if isinstance(f, Fact)]

        found = {seed.id: seed}
        step = [seed]
        walked: set[tuple[str, ...]] = set()
        while step:
            links: list[Fact] = []
            named: set[str] = set()
            # the facts between the ends of this step's statements, in one store read
            self._read_between([(f.source_id, f.target_id) for f in step if not single(f.relation)])
            for fact in step:
                if single(fact.relation):  # one slot: every object contradicts every other
                    slot = (fact.source_id, fact.relation)
                    if slot not in walked:
                        walked.add(slot)
                        links += [f for f in current(self._slot(*slot)) if f.source_id == fact.source_id]
                        links += [f for f in planned if (f.source_id, f.relation) == slot]
                else:  # the same statement: same ends, relation and sentence
                    statement = invalidation.statement_key(fact)
                    if statement not in walked:
                        walked.add(statement)
                        pair = current(self._between([(fact.source_id, fact.target_id)])) + planned
                        links += [f for f in pair if invalidation.statement_key(f) == statement]
                named.update(i for i, v in fact.verdicts.items() if v is not Verdict.COMPATIBLE and i not in found)
            if named:
                links += current([plan.facts[i] for i in sorted(named) if i in plan.facts])
                links += current(self.store.get(Kind.FACT, sorted(i for i in named if i not in plan.facts)))
            judged = {fact.id for fact in step}
            # a verdict is between a fact and one of its candidates, which shares one of its ends
            ends = sorted({end for fact in step for end in (fact.source_id, fact.target_id)})
            for f in [*current(self.store.facts_judging(sorted(judged), ends)), *planned]:
                if any(v is not Verdict.COMPATIBLE and i in judged for i, v in f.verdicts.items()):
                    links.append(f)
            step = []
            for f in links:
                if f.id not in found:
                    found[f.id] = f
                    step.append(f)
        return found

    def _slot(self, source_id: str, relation: str) -> list[Fact]:
        """The stored facts of a subject and relation (cached per episode)."""
        key = (source_id, relation)
        if key not in self._slots:
            self._slots[key] = [f for f in self.store.facts_with([source_id], relation) if f.source_id == source_id]
        return self._slots[key]

    def _stated(self, facts: Sequence[Fact], plan: GraphPlan) -> dict[str, datetime]:
        self._times[self.episode.id] = self.episode.reference_time
        return stated_times(self.store, facts, self._times, self.now)


_EARLIEST = datetime.min.replace(tzinfo=UTC)


def last_sayings(facts: Sequence[Fact], times: Mapping[str, datetime]) -> dict[str, tuple[datetime, datetime]]:
    """When each fact was last said: of its episodes (their reference ``times``, as :func:`stated_times` read
    them), the latest reference time, and when the memory learnt that episode's word (the fact's ``created_at``
    for its first episode, the time recorded for each that stated it again); the fact's own statement time and
    ``created_at`` when none is known."""
    out = {}
    for fact in facts:
        learnt = {episode: at for episode, at in revisions.restated(fact)}
        sayings = [(times[e], learnt.get(e, fact.created_at)) for e in fact.episodes if e in times]
        out[fact.id] = max(sayings) if sayings else (fact.created_at, fact.created_at)
    return out


#: How far a store's cosine may differ from the planner's own product for the same two vectors (float32 rounding
#: in another order): a store score is trusted to order facts only beyond it.
_SCORE_NOISE = 1e-4
#: Verdicts from strongest to weakest, when restatements of one statement were judged differently.
_STRENGTH = (Verdict.CONTRADICTS, Verdict.SAME, Verdict.COMPATIBLE)


def _closeness(facts: Sequence[Fact], vector: Vector) -> list[float]:
    """The cosine of each fact's sentence embedding with the unit ``vector`` (0.0 for a fact without one), in one
    product: np.array, not np.stack (the same matrix without stack's per-row checks in Python); einsum, not `@`
    (multithreaded OpenBLAS spins when another process, a database server, holds a core). The rows are scaled to
    unit length: a store may hand back vectors that are not quite (reduced precision rounds them), and these
    scores are compared with the store's own."""
    out = [0.0] * len(facts)
    embedded = [i for i, f in enumerate(facts) if f.embedding is not None]
    if embedded:
        matrix = np.array([facts[i].embedding for i in embedded], dtype=np.float32)
        norms = np.sqrt(np.einsum("ij,ij->i", matrix, matrix))
        dots = np.einsum("ij,j->i", matrix, vector) / np.where(norms > 0, norms, 1.0)
        for i, value in zip(embedded, dots.tolist(), strict=True):
            out[i] = value
    return out


def _standing(statements: Sequence[Sequence[Fact]], vector: Vector | None) -> list[tuple[bool, float]]:
    """Each statement's standing among the candidates: whether a later fact superseded every fact of it, and its
    closeness to ``vector``: the best cosine among its facts still holding (among all of them, when none holds).
    Scored by its holding facts, a statement none of whose holding facts was read scores no more than the last
    holding fact read, whatever its superseded restatements score. With a ``vector``, only facts with a sentence
    embedding count, as the store's closest-first reads return only those: a statement whose holding facts have
    none stands as superseded, scored by its other facts (-inf when none has one). Without a ``vector`` (every
    fact is read), all score 0.0."""
    flat = [f for m in statements for f in m]
    scores = _closeness(flat, vector) if vector is not None else [0.0] * len(flat)
    out = []
    at = 0
    for m in statements:
        mine = [
            (f.expired_at is None, score)
            for f, score in zip(m, scores[at : at + len(m)], strict=True)
            if vector is None or f.embedding is not None
        ]
        at += len(m)
        held = [score for holds, score in mine if holds]
        out.append((not held, max(held or [score for _, score in mine] or [-math.inf])))
    return out


def _best_statements(
    facts: Sequence[Fact], scores: Sequence[float], edge: float, floor: float, limit: int
) -> tuple[dict[tuple[str, ...], float], bool]:
    """Each statement's best score, walking ``facts`` from the closest down until past the ``limit``-th
    statement (ties with it kept) or below ``floor``; and whether that is certain, given that facts not among
    ``facts`` score at most ``edge``."""
    best: dict[tuple[str, ...], float] = {}

    def stops(score: float) -> bool:
        return score < floor or (len(best) >= limit and score < min(best.values()))

    for i in sorted(range(len(facts)), key=scores.__getitem__, reverse=True):
        if scores[i] <= edge:
            break
        if stops(scores[i]):
            return best, True
        best.setdefault(invalidation.statement_key(facts[i]), scores[i])
    return best, stops(edge)


def _representative(fact: Fact) -> tuple[object, ...]:
    """Which restatement of a statement is shown to the LLM: the earliest, by content (then the first recorded)."""
    end = invalidation.own_end(fact)
    return (
        fact.valid_at is not None,
        fact.valid_at or _EARLIEST,
        end is None,
        end or _EARLIEST,
        fact.fact,
        fact.created_at,
        fact.id,
    )


def stated_times(
    store: Store, facts: Sequence[Fact], cache: dict[str, datetime], default: datetime
) -> dict[str, datetime]:
    """When each fact was stated: the earliest reference time of its episodes (``cache`` holds the episodes'
    times already known, and is extended)."""
    wanted = sorted({e for f in facts for e in f.episodes if e not in cache})
    if wanted:
        for record in store.get(Kind.EPISODE, wanted):
            if isinstance(record, Episode):
                cache[record.id] = record.reference_time
    return {f.id: min((cache[e] for e in f.episodes if e in cache), default=default) for f in facts}


def linked_facts(
    store: Store,
    seeds: Sequence[Fact],
    overrides: Mapping[str, Fact],
    gone: Collection[str],
    single_valued: Callable[[str], bool],
    max_entities: int = 256,
) -> list[Fact]:
    """Every fact linked to ``seeds`` through statements or contradictions (:func:`tkg.invalidation.component`),
    read from the store with ``overrides`` applied and ``gone`` left out, following links to other entities'
    facts (up to ``max_entities`` entities: a bound for hub entities, past which far links are not followed)."""
    ends = {e for f in seeds for e in (f.source_id, f.target_id)}
    loaded: set[str] = set()
    facts: dict[str, Fact] = {f.id: f for f in seeds}
    while ends - loaded and len(loaded) < max_entities:
        batch = sorted(ends - loaded)[: max_entities - len(loaded)]
        loaded.update(batch)
        for fact in store.facts_of(batch):
            if fact.id not in gone:
                facts.setdefault(fact.id, overrides.get(fact.id, fact))
        for fact in overrides.values():
            if fact.id not in gone and {fact.source_id, fact.target_id} & loaded:
                facts[fact.id] = fact
        found = invalidation.component([f.id for f in seeds], list(facts.values()), single_valued)
        ends |= {e for f in found for e in (f.source_id, f.target_id)}
    return invalidation.component([f.id for f in seeds], list(facts.values()), single_valued)


def _may_concern(old: Fact, sources: set[str], targets: set[str], near: set[str], relation: str, similar: bool) -> bool:
    """Could ``old`` be a candidate of a new fact whose ends are among ``sources`` x ``targets`` (the possible
    resolutions of two names; ``near`` is their union)? The rule of :func:`tkg.invalidation.may_concern` (time
    aside), over every combination; ``similar``: the two sentences are close, so another relation counts too."""
    a, b = old.source_id, old.target_id
    if (old.relation == relation or similar) and (a in near or b in near):
        return True
    return (a in sources and b in targets) or (b in sources and a in targets)
