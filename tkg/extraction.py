"""From an LLM extraction (or structured input) to graph records: resolve names, build facts, date them.

Resolution here is by exact normalised name within the episode's group (the cheapest deterministic pass).
Everything is computed before anything is written, so a failure leaves the store untouched.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from datetime import datetime

from tkg.llm.schema import GraphExtraction
from tkg.models import Entity, Episode, Fact, Mention, new_id, relation_name
from tkg.names import normalize_name
from tkg.storage import Store
from tkg.temporal import resolve_time

_SPEAKER = re.compile(r"^\s*([^:\n]{1,80}?)\s*:\s+\S")


def speaker_of(content: str) -> str | None:
    """The speaker of a ``"Speaker: text"`` message, if it has one."""
    match = _SPEAKER.match(content)
    return match.group(1).strip() if match else None


@dataclass(slots=True)
class GraphPlan:
    """Records an episode will write. ``fresh_*`` hold ids that still need an embedding."""

    entities: dict[str, Entity] = field(default_factory=dict)
    facts: dict[str, Fact] = field(default_factory=dict)
    mentions: list[Mention] = field(default_factory=list)
    fresh_entities: list[str] = field(default_factory=list)
    fresh_facts: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class GraphBuilder:
    """Collects the entities and facts of one episode, resolving names against the store as it goes."""

    def __init__(self, store: Store, episode: Episode, now: datetime, languages: tuple[str, ...] = ("en",)):
        self.store = store
        self.episode = episode
        self.now = now
        self.languages = languages
        self.plan = GraphPlan()
        self._by_name: dict[str, str] = {}  # normalised name -> entity id
        self._mentioned: set[str] = set()

    # -- entities -------------------------------------------------------------------------------------------
    def entity(self, name: str, label: str = "Entity", summary: str = "") -> str:
        """The id of the entity called ``name`` in this group, creating it if the graph has none."""
        name = " ".join(name.split())
        key = normalize_name(name)
        if key in self._by_name:
            entity_id = self._by_name[key]
            self._merge(entity_id, label, summary)
            return entity_id
        found = self.store.entities_by_name(self.episode.group_id, [name]).get(key)
        if found:
            entity = found[0]
            self.plan.entities[entity.id] = entity
            self._by_name[key] = entity.id
            self._merge(entity.id, label, summary)
        else:
            labels = ("Entity",) if label in ("", "Entity") else ("Entity", label)
            entity = Entity(
                id=new_id(),
                group_id=self.episode.group_id,
                name=name,
                created_at=self.now,
                summary=summary.strip(),
                labels=labels,
            )
            self.plan.entities[entity.id] = entity
            self.plan.fresh_entities.append(entity.id)
            self._by_name[key] = entity.id
        if entity.id not in self._mentioned:
            self._mentioned.add(entity.id)
            self.plan.mentions.append(Mention(self.episode.id, entity.id, self.episode.group_id, self.now))
        return entity.id

    def _merge(self, entity_id: str, label: str, summary: str) -> None:
        entity = self.plan.entities[entity_id]
        changes: dict[str, object] = {}
        if label and label != "Entity" and label not in entity.labels:
            changes["labels"] = (*entity.labels, label)
        if summary.strip() and not entity.summary:
            changes["summary"] = summary.strip()
        if changes:
            self.plan.entities[entity_id] = dataclasses.replace(entity, **changes)  # type: ignore[arg-type]

    # -- facts ----------------------------------------------------------------------------------------------
    def fact(
        self,
        source: str,
        relation: str,
        target: str,
        text: str | None = None,
        valid_at: datetime | None = None,
        invalid_at: datetime | None = None,
    ) -> str:
        """Add the fact ``source -relation-> target`` (or reuse an identical live one); returns its id."""
        source_id, target_id = self.entity(source), self.entity(target)
        rel = relation_name(relation)
        sentence = " ".join((text or f"{source} {rel.replace('_', ' ').lower()} {target}").split())
        if valid_at is not None and invalid_at is not None and invalid_at < valid_at:
            self.plan.warnings.append(
                f"fact {sentence!r}: its end ({invalid_at.isoformat()}) is before its start "
                f"({valid_at.isoformat()}); the end was dropped"
            )
            invalid_at = None
        same = self._existing(source_id, target_id, rel, sentence)
        if same is not None:
            if self.episode.id not in same.episodes:
                same = dataclasses.replace(same, episodes=(*same.episodes, self.episode.id))
            self.plan.facts[same.id] = same
            return same.id
        record = Fact(
            id=new_id(),
            group_id=self.episode.group_id,
            source_id=source_id,
            target_id=target_id,
            relation=rel,
            fact=sentence,
            created_at=self.now,
            valid_at=valid_at,
            invalid_at=invalid_at,
            episodes=(self.episode.id,),
        )
        self.plan.facts[record.id] = record
        self.plan.fresh_facts.append(record.id)
        return record.id

    def _existing(self, source_id: str, target_id: str, relation: str, sentence: str) -> Fact | None:
        """An identical fact already recorded and not ended: the same statement seen again."""
        key = sentence.casefold()
        candidates = [f for f in self.plan.facts.values()]
        if source_id not in self.plan.fresh_entities:
            candidates += self.store.facts_of([source_id])
        for fact in candidates:
            if (
                fact.source_id == source_id
                and fact.target_id == target_id
                and fact.relation == relation
                and fact.expired_at is None
                and fact.fact.casefold() == key
            ):
                return self.plan.facts.get(fact.id, fact)
        return None

    # -- LLM output -----------------------------------------------------------------------------------------
    def add_extraction(self, extraction: GraphExtraction, speaker: str | None) -> None:
        if speaker:
            self.entity(speaker, "Person")
        for named in extraction.entities:
            if named.name.strip():
                self.entity(named.name, named.label, named.summary)
        reference = self.episode.reference_time
        for item in extraction.facts:
            if not item.source.strip() or not item.target.strip() or not item.fact.strip():
                self.plan.warnings.append(f"skipped a fact with an empty source, target or sentence: {item!r}")
                continue
            valid_at = resolve_time(item.valid_from, reference, self.languages) if item.valid_from else None
            invalid_at = resolve_time(item.valid_until, reference, self.languages) if item.valid_until else None
            if item.valid_from and valid_at is None:
                self.plan.warnings.append(f"could not date {item.valid_from!r}; used the episode time")
            self.fact(item.source, item.relation, item.target, item.fact, valid_at or reference, invalid_at)


def embedding_texts(plan: GraphPlan) -> tuple[list[str], list[str]]:
    """Texts to embed for the new entities (their names) and new facts (their sentences), in plan order."""
    names = [plan.entities[i].name for i in plan.fresh_entities]
    facts = [plan.facts[i].fact for i in plan.fresh_facts]
    return names, facts
