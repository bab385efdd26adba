"""The community tier (§2.3 of the Zep paper): clusters of strongly connected entities, with names and summaries,
kept current cheaply as data arrives.

:class:`CommunityTier` reads a group's entity graph through the :class:`~tkg.storage.Store` interface (so it works
on any backend), runs :func:`tkg.communities.label_propagation` and writes :class:`~tkg.models.Community` and
:class:`~tkg.models.Membership` records:

* :meth:`CommunityTier.refresh` -- a full run for one group, written in one batch. Community ids are kept where a
  new community is the mutual best match of an old one; only communities whose membership changed are
  summarised and embedded again, so a refresh of an unchanged graph writes nothing. Label propagation is not
  stable under small changes (two seeds disagree by ~0.04 in ``1 - NMI`` on the benchmark graph), so after many
  additions a full run moves most communities a little; ``warm=True`` re-converges from the stored communities
  instead, and only the regions that changed need new summaries (after 1,000 additions: 7% of the communities
  against 80% at 10,000 entities, 1% against 73% at 100,000; see ``benchmarks/bench_communities.py``).
* :meth:`CommunityTier.extend` -- the paper's dynamic extension, for the caller's own write batch: each entity
  without a community joins the one held by the weighted plurality of its neighbours (a neighbour that has no
  community counts as a community of one, so two such entities pair up, as one step of label propagation would
  do); that community's name and summary are updated. An entity with no live neighbours waits.
* :meth:`CommunityTier.drift` -- how far the stored (incrementally extended) communities are from a full run:
  ``1 - NMI`` over the entities that have live facts (:func:`tkg.communities.partition_distance`).
* :meth:`CommunityTier.maybe_refresh` -- the refresh policy: after ``refresh_after_changes`` graph changes, or
  when a periodic drift check exceeds ``refresh_drift``.

Edges are weighted by the number of live facts between two entities (those a query at "now" admits, see
:mod:`tkg.timeline`); invalidated and future facts weigh nothing, self-loops are ignored, and nothing crosses a
group_id. An entity is in at most one community; one with no live facts is in none (it waits).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field, replace
from datetime import datetime

import numpy as np

from tkg.clock import Clock, SystemClock
from tkg.communities import Propagation, WeightedGraph, label_propagation, partition_distance, plurality
from tkg.community_summaries import CommunityDigest, Member, SummaryLLM, fallback_digest, summarize, update_summary
from tkg.config import CommunityConfig
from tkg.embedders.base import Embedder, check_vectors
from tkg.errors import ValidationError
from tkg.llm.base import LLMUsage
from tkg.models import Community, Entity, Fact, Kind, Membership, Record, check_group_id
from tkg.storage import Store, WriteBatch
from tkg.timeline import Scope, make_scope


@dataclass(frozen=True, slots=True)
class CommunityReport:
    """What one :meth:`CommunityTier.refresh` did."""

    group_id: str
    #: Communities and member entities after the run.
    communities: int
    members: int
    #: Communities new, re-summarised (membership changed), untouched, and deleted.
    created: int
    updated: int
    unchanged: int
    removed: int
    #: Label propagation sweeps, and whether it reached a fixed point within the bound.
    iterations: int
    converged: bool
    #: Started from the stored communities rather than from singletons.
    warm: bool
    #: Records written and deleted (0 and 0: the refresh changed nothing).
    puts: int
    deletes: int
    usage: LLMUsage = field(default_factory=LLMUsage)


@dataclass(frozen=True, slots=True)
class CommunityUpdate:
    """What :meth:`CommunityTier.extend` wants written, for the caller to add to its own batch."""

    puts: list[Record] = field(default_factory=list)
    deletes: list[tuple[Kind, str]] = field(default_factory=list)
    #: Entity id -> the community it joined (including a waiting neighbour pulled into a new community).
    assigned: dict[str, str] = field(default_factory=dict)
    #: Entities left without a community: no live neighbours yet.
    waiting: list[str] = field(default_factory=list)
    usage: LLMUsage = field(default_factory=LLMUsage)


#: What :attr:`tkg.models.Community.summarised` holds for a name and summary the LLM is still to write (tkg's own
#: stand-in, or the LLM's of other members): the fingerprint of no member set.
UNSUMMARISED = "-"

#: A community to write: id, group, name and summary, created_at, the fingerprint of the members they came from.
Changed = tuple[str, str, CommunityDigest, datetime, str]


def community_id(group_id: str, member_ids: Iterable[str]) -> str:
    """A deterministic id for a new community, from its group and members (stable across runs and machines)."""
    text = "\x00".join([group_id, *sorted(member_ids)])
    return "community-" + hashlib.blake2b(text.encode(), digest_size=12).hexdigest()


def members_fingerprint(member_ids: Iterable[str]) -> str:
    """What :attr:`tkg.models.Community.summarised` holds for a summary written from these members."""
    return hashlib.blake2b("\x00".join(sorted(member_ids)).encode(), digest_size=8).hexdigest()


def content_order(entity: Entity) -> tuple[str, str, str]:
    """The order in which detection and extension take entities: by name, then id. Ids are random, so an
    order by id alone would give the same graph different communities from one run to the next; by name, the
    same memory gives the same communities wherever it is built (ids only break ties between namesakes)."""
    return (entity.name.casefold(), entity.name, entity.id)


def read_entity_graph(store: Store, group_id: str, scope: Scope) -> tuple[WeightedGraph, dict[str, Entity]]:
    """A group's entities (admitted by ``scope``) and the facts between them that ``scope`` admits, as a graph
    weighted by the number of such facts, its vertices in :func:`content_order`; through :class:`Store` calls
    only, so any backend will do."""
    groups = frozenset({group_id})
    admits = scope.admits
    entities: dict[str, Entity] = {e.id: e for e in store.scan(Kind.ENTITY, groups) if admits(e)}  # type: ignore[misc]
    keys = sorted(entities, key=lambda k: content_order(entities[k]))
    index = {key: i for i, key in enumerate(keys)}
    within = groups if scope.group_ids is None else groups & scope.group_ids
    sources, targets = store.fact_ends(replace(scope, group_ids=within))
    src = np.fromiter((index.get(a, -1) for a in sources), dtype=np.int64, count=len(sources))
    dst = np.fromiter((index.get(b, -1) for b in targets), dtype=np.int64, count=len(targets))
    keep = (src >= 0) & (dst >= 0)
    graph = WeightedGraph.from_arrays(keys, src[keep], dst[keep], np.ones(int(keep.sum()), dtype=np.int64))
    return graph, entities


def inside_weights(graph: WeightedGraph, labels: np.ndarray) -> np.ndarray:
    """Per vertex, the total weight of its edges to vertices with the same label (its weight inside its
    community; ranks members for summaries and names)."""
    src = np.repeat(np.arange(graph.n, dtype=np.int64), graph.degree())
    same = labels[src] == labels[graph.indices]
    return np.bincount(src[same], weights=graph.weights[same], minlength=graph.n).astype(np.int64)


@dataclass(frozen=True, slots=True)
class Detection:
    """A full detection run over one group, before anything is written."""

    group_id: str
    graph: WeightedGraph
    entities: dict[str, Entity]
    propagation: Propagation

    def member_sets(self) -> list[list[str]]:
        """Entity ids of each community of two or more (sorted), ordered by their smallest id."""
        keys = self.graph.keys
        return [[keys[v] for v in group] for group in self.propagation.communities() if len(group) > 1]


class CommunityTier:
    """Detects, extends, summarises and refreshes communities; see the module notes.

    >>> from tkg import FixedClock, HashEmbedder, Memory
    >>> from tkg.backends.memory import InMemoryStore
    >>> from tkg.memory import FactInput
    >>> store = InMemoryStore(dim=HashEmbedder().dim)
    >>> memory = Memory(store, embedder=HashEmbedder(), clock=FixedClock("2024-05-01T00:00:00Z"))
    >>> _ = memory.add_facts([FactInput("Alice", "WORKS_AT", "Acme"), FactInput("Bob", "WORKS_AT", "Acme")],
    ...                      group_id="demo")
    >>> tier = CommunityTier(memory.embedder, clock=memory.clock)
    >>> report = tier.refresh(store, "demo")
    >>> report.communities, report.members, [c.name for c in store.scan(Kind.COMMUNITY)]
    (1, 3, ['Acme, Alice, Bob'])
    """

    def __init__(
        self,
        embedder: Embedder,
        llm: SummaryLLM | None = None,
        clock: Clock | None = None,
        config: CommunityConfig | None = None,
    ) -> None:
        self.embedder = embedder
        self.llm = llm
        self.clock = clock or SystemClock()
        self.config = config or CommunityConfig()
        self._changes: Counter[str] = Counter()
        self._since_drift_check: Counter[str] = Counter()
        #: The last drift measured per group (by :meth:`drift` or the policy).
        self.last_drift: dict[str, float] = {}

    # ------------------------------------------------------------------------------------------------------
    # full runs
    def detect(self, store: Store, group_id: str, *, now: datetime | None = None, warm: bool = False) -> Detection:
        """Run label propagation over a group's live entity graph; writes nothing. ``warm``: start from the
        stored communities (retention only) instead of from singletons."""
        check_group_id(group_id)
        scope = make_scope(now or self.clock.now(), group_id)
        graph, entities = read_entity_graph(store, group_id, scope)
        initial = None
        if warm:
            memberships = store.scan(Kind.MEMBERSHIP, frozenset({group_id}))
            stored = {m.entity_id: m.community_id for m in memberships}  # type: ignore[union-attr]
            codes = {cid: i for i, cid in enumerate(sorted(set(stored.values())))}
            initial = [codes[stored[k]] if k in stored else len(codes) + v for v, k in enumerate(graph.keys)]
        result = label_propagation(
            graph,
            seed=self.config.seed,
            max_iterations=self.config.max_iterations,
            explore_sweeps=0 if warm else self.config.explore_sweeps,
            initial=initial,
        )
        return Detection(group_id, graph, entities, result)

    def refresh(self, store: Store, group_id: str, *, warm: bool | None = None) -> CommunityReport:
        """Community detection for one group, written in one batch (old memberships replaced).

        By default (``CommunityConfig.warm_refresh`` False) a full run from singletons, the reference that
        :meth:`drift` measures against. ``warm=True`` re-converges from the stored communities instead: only
        where the graph changed do memberships move, so far fewer communities need a new summary.
        Raises whatever the LLM seam raises (:class:`tkg.errors.LLMError`); then nothing is written.
        """
        warm = self.config.warm_refresh if warm is None else warm
        batch, report = self.plan_refresh(store, group_id, warm=warm)
        if batch:
            store.write(batch)
        self._changes[group_id] = 0
        self._since_drift_check[group_id] = 0
        if warm:
            self.last_drift.pop(group_id, None)
        else:
            self.last_drift[group_id] = 0.0
        return report

    def plan_refresh(self, store: Store, group_id: str, *, warm: bool = False) -> tuple[WriteBatch, CommunityReport]:
        """What :meth:`refresh` would write, without writing it."""
        now = self.clock.now()
        found = self.detect(store, group_id, now=now, warm=warm)
        graph, labels = found.graph, found.propagation.labels
        weight_inside = inside_weights(graph, labels)
        vertex_of = {key: i for i, key in enumerate(graph.keys)}
        new_sets = found.member_sets()

        groups = frozenset({group_id})
        old_records = {c.id: c for c in store.scan(Kind.COMMUNITY, groups) if isinstance(c, Community)}
        old_members: dict[str, set[str]] = {}
        for m in store.scan(Kind.MEMBERSHIP, groups):
            if isinstance(m, Membership):
                old_members.setdefault(m.community_id, set()).add(m.entity_id)
        ids = _match(group_id, new_sets, old_members)

        usage = LLMUsage()
        puts: list[Record] = []
        changed: list[Changed] = []
        created = updated = unchanged = 0
        for cid, members in zip(ids, new_sets, strict=True):
            member_set = set(members)
            before = old_members.get(cid, set())
            if cid in old_records and before == member_set and _summarised(old_records[cid], member_set):
                unchanged += 1
                continue
            if cid in old_records:
                updated += 1
            else:
                created += 1
            ranked = [
                Member(found.entities[e].name, found.entities[e].summary, int(weight_inside[vertex_of[e]]))
                for e in members
            ]
            since = old_records[cid].created_at if cid in old_records else now
            changed.append((cid, group_id, self._digest(ranked, usage), since, members_fingerprint(members)))
            puts.extend(
                Membership(community_id=cid, entity_id=e, group_id=group_id, created_at=now)
                for e in members
                if e not in before
            )
        puts[:0] = self._community_records(changed)

        kept = set(ids)
        new_pairs = {(cid, e) for cid, members in zip(ids, new_sets, strict=True) for e in members}
        deletes: list[tuple[Kind, str]] = [
            (Kind.MEMBERSHIP, f"{cid}>{e}")
            for cid in sorted(old_members)
            for e in sorted(old_members[cid])
            if (cid, e) not in new_pairs
        ]
        removed = sorted(set(old_records) - kept)
        deletes.extend((Kind.COMMUNITY, cid) for cid in removed)
        report = CommunityReport(
            group_id=group_id,
            communities=len(new_sets),
            members=sum(len(m) for m in new_sets),
            created=created,
            updated=updated,
            unchanged=unchanged,
            removed=len(removed),
            iterations=found.propagation.iterations,
            converged=found.propagation.converged,
            warm=warm,
            puts=len(puts),
            deletes=len(deletes),
            usage=usage,
        )
        return WriteBatch(puts=puts, deletes=deletes), report

    # ------------------------------------------------------------------------------------------------------
    # dynamic extension
    def extend(
        self,
        store: Store,
        entities: Iterable[Entity],
        facts: Iterable[Fact],
        *,
        now: datetime | None = None,
    ) -> CommunityUpdate:
        """Place newly arrived entities into communities, for the caller's write batch (nothing is written here).

        ``entities`` and ``facts`` are the records the caller is about to write (new ones, and new versions of
        existing ones such as invalidated facts); they are read as if already stored. Every entity among them, or
        at an end of one of the facts, that has no community yet joins the community of the weighted plurality of
        its live neighbours (:func:`tkg.communities.plurality`), in :func:`content_order`, each seeing the ones
        before.
        Entities already in a community stay where they are until the next refresh (that is the drift).
        """
        now = now or self.clock.now()
        scope = make_scope(now)
        pending_entities = {e.id: e for e in entities}
        pending_facts = {f.id: f for f in facts}
        self._count_changes(store, pending_entities, pending_facts, scope, now)
        candidates = set(pending_entities)
        for f in pending_facts.values():
            candidates.update((f.source_id, f.target_id))
        community_of = {m.entity_id: m.community_id for m in store.memberships(entity_ids=sorted(candidates))}
        todo = self._in_content_order(store, sorted(candidates - set(community_of)), pending_entities)
        if not todo:
            return CommunityUpdate()

        neighbours = self._live_neighbours(store, todo, pending_facts, scope)
        outside = sorted({n for ws in neighbours.values() for n in ws} - candidates)
        community_of.update((m.entity_id, m.community_id) for m in store.memberships(entity_ids=outside))

        joined: dict[str, list[str]] = {}  # community id -> entities added by this call
        founded: set[str] = set()
        sizes: dict[str, int] = {}
        assigned: dict[str, str] = {}
        waiting: list[str] = []
        for entity_id in todo:
            if entity_id in community_of:  # pulled into a new community by an earlier entity of this call
                continue
            weights: dict[tuple[str, str], int] = {}
            for other, w in neighbours.get(entity_id, {}).items():
                label = ("c", community_of[other]) if other in community_of else ("e", other)
                weights[label] = weights.get(label, 0) + w
            top = max(weights.values(), default=0)
            tied = [label for label, w in weights.items() if w == top]
            label_sizes = {label: self._size(store, label, sizes, joined) for label in tied} if len(tied) > 1 else None
            winner = plurality(weights, label_sizes, seed=self.config.seed)
            if winner is None:
                waiting.append(entity_id)
                continue
            kind, target = winner
            if kind == "c":
                cid = target
                newcomers = [entity_id]
            else:
                group = self._group_of(entity_id, pending_entities, store)
                cid = community_id(group, [entity_id, target])
                founded.add(cid)
                newcomers = [entity_id, target]
            for e in newcomers:
                community_of[e] = cid
                assigned[e] = cid
                joined.setdefault(cid, []).append(e)

        usage = LLMUsage()
        update = CommunityUpdate(assigned=assigned, waiting=waiting, usage=usage)
        if not joined:
            return update
        changed: list[Changed] = []
        kept: list[Record] = []
        memberships: list[Record] = []
        for cid in sorted(joined):
            group = self._group_of(joined[cid][0], pending_entities, store)
            old = None if cid in founded else store.get(Kind.COMMUNITY, [cid])[0]
            digest, written_from = self._extended_digest(
                store, cid, old, joined[cid], pending_entities, pending_facts, scope, usage
            )
            if not isinstance(old, Community):
                changed.append((cid, group, digest, now, written_from))
            elif (digest.name, digest.summary) != (old.name, old.summary):
                changed.append((cid, group, digest, old.created_at, written_from))
            elif written_from != old.summarised:  # the same text, now of these members: nothing to re-embed
                kept.append(replace(old, summarised=written_from))
            memberships.extend(
                Membership(community_id=cid, entity_id=e, group_id=group, created_at=now) for e in joined[cid]
            )
        update.puts.extend(self._community_records(changed))
        update.puts.extend(kept)
        update.puts.extend(memberships)
        return update

    @staticmethod
    def _in_content_order(store: Store, ids: Sequence[str], pending: dict[str, Entity]) -> list[str]:
        stored = {e.id: e for e in store.get(Kind.ENTITY, [i for i in ids if i not in pending]) if e is not None}
        known = {**stored, **pending}

        def key(entity_id: str) -> tuple[str, str, str]:
            entity = known.get(entity_id)
            return content_order(entity) if isinstance(entity, Entity) else ("", "", entity_id)

        return sorted(ids, key=key)

    def _live_neighbours(
        self, store: Store, entity_ids: Sequence[str], pending: dict[str, Fact], scope: Scope
    ) -> dict[str, dict[str, int]]:
        """entity id -> neighbour id -> number of live facts between them (pending versions win)."""
        facts = {f.id: f for f in store.facts_of(entity_ids)}
        wanted = set(entity_ids)
        facts.update((fid, f) for fid, f in pending.items() if f.source_id in wanted or f.target_id in wanted)
        out: dict[str, dict[str, int]] = {}
        for f in facts.values():
            if f.source_id == f.target_id or not scope.admits(f):
                continue
            for a, b in ((f.source_id, f.target_id), (f.target_id, f.source_id)):
                if a in wanted:
                    out.setdefault(a, {})
                    out[a][b] = out[a].get(b, 0) + 1
        return out

    @staticmethod
    def _size(store: Store, label: tuple[str, str], cache: dict[str, int], joined: dict[str, list[str]]) -> int:
        kind, target = label
        if kind == "e":
            return 1
        if target not in cache:
            cache[target] = len(store.memberships(community_ids=[target]))
        return cache[target] + len(joined.get(target, ()))

    @staticmethod
    def _group_of(entity_id: str, pending: dict[str, Entity], store: Store) -> str:
        entity = pending.get(entity_id) or store.get(Kind.ENTITY, [entity_id])[0]
        if entity is None:
            raise ValidationError(f"a fact points to entity {entity_id!r}, which is neither stored nor in the batch")
        return entity.group_id

    def _extended_digest(
        self,
        store: Store,
        cid: str,
        old: Record | None,
        newcomers: Sequence[str],
        pending_entities: dict[str, Entity],
        pending_facts: dict[str, Fact],
        scope: Scope,
        usage: LLMUsage,
    ) -> tuple[CommunityDigest, str]:
        """The community's name and summary with ``newcomers`` in it, and the fingerprint of the members they
        were written from (:attr:`tkg.models.Community.summarised`)."""
        if isinstance(old, Community) and self.llm is not None and not self.config.summarize_on_extend:
            # kept as the LLM wrote it (no read of the members on this path, taken by most episodes with an LLM):
            # the next refresh writes it again
            return CommunityDigest(name=old.name, summary=old.summary), UNSUMMARISED
        member_ids = {m.entity_id for m in store.memberships(community_ids=[cid])} | set(newcomers)
        if isinstance(old, Community) and self.llm is not None:
            members = [self._member(e, pending_entities, store, 0) for e in newcomers]
            updated = update_summary(
                self.llm, old.summary, old.name, members, chunk_chars=self.config.chunk_chars, usage=usage
            )
            return updated, members_fingerprint(member_ids)
        # A new community, or no LLM: (re)build from all members, ranked by their weight inside the community.
        members = self._ranked(store, member_ids, pending_entities, pending_facts, scope, frozenset())
        use_llm = self.config.summarize_on_extend
        return self._digest(members, usage, use_llm=use_llm), self._written_from(member_ids, use_llm)

    def _ranked(
        self,
        store: Store,
        member_ids: Set[str],
        pending_entities: Mapping[str, Entity],
        pending_facts: Mapping[str, Fact],
        scope: Scope,
        gone: Set[str],
    ) -> list[Member]:
        """The members, each weighted by its live facts inside the community (``pending_facts`` read as stored,
        the facts ``gone`` as removed)."""
        facts = {f.id: f for f in store.facts_of(sorted(member_ids)) if f.id not in gone}
        facts.update(
            (fid, f) for fid, f in pending_facts.items() if f.source_id in member_ids or f.target_id in member_ids
        )
        inside: Counter[str] = Counter()
        for f in facts.values():
            ends = (f.source_id, f.target_id)
            if f.source_id != f.target_id and all(e in member_ids for e in ends) and scope.admits(f):
                inside[f.source_id] += 1
                inside[f.target_id] += 1
        return [self._member(e, pending_entities, store, inside[e]) for e in sorted(member_ids)]

    def after_removal(
        self,
        store: Store,
        remaining: Mapping[str, Set[str]],
        entities: Mapping[str, Entity],
        facts: Mapping[str, Fact],
        gone: Set[str],
        now: datetime,
    ) -> list[Record]:
        """New records of the communities an episode's removal took members from (``remaining``: community id
        -> the members left, two or more), their names and summaries rebuilt from those members without the LLM,
        so that no removed entity's name stays in them (``entities`` and ``facts``: the removal's new versions;
        ``gone``: the facts it deletes)."""
        scope = make_scope(now)
        changed: list[Changed] = []
        olds = store.get(Kind.COMMUNITY, sorted(remaining))
        for old in olds:
            if not isinstance(old, Community):
                continue
            members = self._ranked(store, remaining[old.id], entities, facts, scope, gone)
            digest = self._digest(members, LLMUsage(), use_llm=False)
            if (digest.name, digest.summary) != (old.name, old.summary):
                written_from = self._written_from(remaining[old.id], use_llm=False)
                changed.append((old.id, old.group_id, digest, old.created_at, written_from))
        return self._community_records(changed)

    def _written_from(self, member_ids: Iterable[str], use_llm: bool) -> str:
        """:attr:`tkg.models.Community.summarised` of a digest of these members made with the LLM (``use_llm``,
        when there is one) or without: tkg's stand-in where there is an LLM waits for its words at the next
        refresh."""
        return members_fingerprint(member_ids) if use_llm or self.llm is None else UNSUMMARISED

    @staticmethod
    def _member(entity_id: str, pending: Mapping[str, Entity], store: Store, weight: int) -> Member:
        entity = pending.get(entity_id) or store.get(Kind.ENTITY, [entity_id])[0]
        if not isinstance(entity, Entity):
            return Member(entity_id, "", weight)
        return Member(entity.name, entity.summary, weight)

    # ------------------------------------------------------------------------------------------------------
    # drift and the refresh policy
    def drift(self, store: Store, group_id: str) -> float:
        """How far the stored communities are from what a full run would give now: ``1 - NMI`` between the two
        partitions of the group's entities that have live facts (an entity without a community counts as one of
        its own). 0.0: a refresh would change no membership; values towards 1.0: little in common."""
        found = self.detect(store, group_id)
        active = np.flatnonzero(found.graph.degree() > 0)
        keys = [found.graph.keys[v] for v in active]
        memberships = store.scan(Kind.MEMBERSHIP, frozenset({group_id}))
        stored = {m.entity_id: m.community_id for m in memberships}  # type: ignore[union-attr]
        value = partition_distance(found.propagation.labels[active], [stored.get(k, "~" + k) for k in keys])
        self.last_drift[group_id] = value
        return value

    def forget(self, group_id: str) -> None:
        """Drop what the refresh policy counts for a group (the group was erased)."""
        for counts in (self._changes, self._since_drift_check):
            counts.pop(group_id, None)
        self.last_drift.pop(group_id, None)

    def pending_changes(self, group_id: str) -> int:
        """Graph changes (entities arrived, facts added or ended) seen by :meth:`extend` since the last refresh."""
        return self._changes[group_id]

    def due(self, store: Store, group_id: str) -> bool:
        """Whether the refresh policy asks for a full run of this group now (may measure the drift)."""
        changes = self._changes[group_id]
        limit = self.config.refresh_after_changes
        since = self._since_drift_check[group_id]
        check_every = self.config.drift_check_every
        if (limit is None or changes < limit) and (self.config.refresh_drift is None or since < check_every):
            return False  # the cheap answer, without counting the group
        scaled = int(self.config.policy_fraction * store.count(Kind.ENTITY, frozenset({group_id})))
        if limit is not None and changes >= max(limit, scaled):
            return True
        if self.config.refresh_drift is None or since < max(check_every, scaled):
            return False
        self._since_drift_check[group_id] = 0
        return self.drift(store, group_id) > self.config.refresh_drift

    def maybe_refresh(self, store: Store, group_id: str) -> CommunityReport | None:
        """Refresh the group if the policy says so; ``None`` otherwise."""
        return self.refresh(store, group_id) if self.due(store, group_id) else None

    def _count_changes(
        self, store: Store, entities: dict[str, Entity], facts: dict[str, Fact], scope: Scope, now: datetime
    ) -> None:
        """Entities that arrive and facts that start or stop being live count as changes. Records stamped with
        this transaction's ``now`` count even when already written (``extend`` called just after the write)."""
        stored_entities = store.get(Kind.ENTITY, list(entities))
        stored_facts = store.get(Kind.FACT, list(facts))
        for entity, before in zip(entities.values(), stored_entities, strict=True):
            if before is None or entity.created_at == now:
                self._bump(entity.group_id)
        for fact, previous in zip(facts.values(), stored_facts, strict=True):
            # Equal, not identical: a backend may hand back a fresh copy of what was just written (PostgreSQL
            # does), and counts must not depend on the backend.
            was_live = isinstance(previous, Fact) and previous != fact and scope.admits(previous)
            if was_live != scope.admits(fact) or now in (fact.created_at, fact.expired_at):
                self._bump(fact.group_id)

    def _bump(self, group_id: str) -> None:
        self._changes[group_id] += 1
        self._since_drift_check[group_id] += 1

    # ------------------------------------------------------------------------------------------------------
    # names, summaries, embeddings
    def _digest(self, members: Sequence[Member], usage: LLMUsage, use_llm: bool = True) -> CommunityDigest:
        if self.llm is None or not use_llm:
            return fallback_digest(members, name_members=self.config.name_members, max_chars=self.config.summary_chars)
        return summarize(
            self.llm,
            members,
            chunk_chars=self.config.chunk_chars,
            max_members=self.config.summary_members,
            usage=usage,
        )

    def _community_records(self, changed: Sequence[Changed]) -> list[Record]:
        """Community records for (id, group, digest, created_at, fingerprint of the members it was written from),
        their name and summary embedded in one call."""
        if not changed:
            return []
        texts = [f"{digest.name}\n{digest.summary}" for _, _, digest, _, _ in changed]
        vectors = check_vectors(self.embedder.embed(texts), self.embedder.dim, len(texts))
        return [
            Community(
                id=cid,
                group_id=group_id,
                name=digest.name,
                created_at=created,
                summary=digest.summary,
                name_embedding=vector,
                summarised=written_from,
            )
            for (cid, group_id, digest, created, written_from), vector in zip(changed, vectors, strict=True)
        ]


def _summarised(community: Community, members: Set[str]) -> bool:
    """Were the community's name and summary written from these members? (Not known: taken as yes, so that
    communities written before tkg kept it are not all summarised again at once.)"""
    return community.summarised in ("", members_fingerprint(members))


def _match(group_id: str, new_sets: Sequence[Sequence[str]], old_members: dict[str, set[str]]) -> list[str]:
    """An id for each new community: an old community's id when each is the other's best match (largest
    overlap; ties to the smaller id / earlier community), else a fresh deterministic id."""
    old_of: dict[str, str] = {}
    for cid in sorted(old_members, reverse=True):  # an entity in several communities counts for the smallest id
        for e in old_members[cid]:
            old_of[e] = cid
    overlaps = [Counter(old_of[e] for e in members if e in old_of) for members in new_sets]
    best_old = [min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0] if c else None for c in overlaps]
    best_new: dict[str, tuple[int, int]] = {}  # old id -> (overlap, new index)
    for i, counts in enumerate(overlaps):
        for cid, overlap in counts.items():
            if cid not in best_new or overlap > best_new[cid][0]:
                best_new[cid] = (overlap, i)
    kept = {cid: i for i, cid in enumerate(best_old) if cid is not None and best_new[cid][1] == i}
    taken = set(kept) | set(old_members)
    ids: list[str] = []
    for i, members in enumerate(new_sets):
        old = best_old[i]
        if old is not None and kept.get(old) == i:
            ids.append(old)
            continue
        cid = community_id(group_id, members)
        while cid in taken:
            cid = community_id(group_id, [*members, cid])
        taken.add(cid)
        ids.append(cid)
    return ids
