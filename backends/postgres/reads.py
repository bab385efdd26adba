"""Reads of a PostgreSQL store: records by id, scans in keyset pages, counts, names, a fact's endpoints, the
graph walk, links and episode windows. Each read is one statement, retried once on a new connection."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from tkg.models import Entity, Episode, Fact, Kind, Membership, Mention, Record
from tkg.names import normalize_name
from tkg.timeline import Scope

from .connection import describe
from .records import COLUMNS, from_row, from_rows, key_filter, key_params, keys_of, select
from .schema import VECTOR_TABLES
from .scope import scope_where
from .session import Session

_PAGE = 2000
#: The seqs of the facts with an end among %(ids)s and relation %(relation)s.
_NEIGHBOURHOOD = (
    "SELECT seq FROM {s}.facts WHERE source_id = ANY(%(ids)s::text[]) AND relation = %(relation)s UNION "
    "SELECT seq FROM {s}.facts WHERE target_id = ANY(%(ids)s::text[]) AND relation = %(relation)s"
)


class Reads(Session):
    def get(self, kind: Kind, ids: Sequence[str]) -> list[Record | None]:
        kind = Kind(kind)
        if not ids:
            return []
        keys = keys_of((kind, str(i)) for i in ids).get(kind, [])
        if not keys:
            return [None] * len(ids)
        statement = self._q(f"{select(kind)} WHERE {key_filter(kind)}")
        found = self._read(lambda cur: cur.execute(statement, key_params(keys)).fetchall())
        by_id = {r.id: r for r in from_rows(kind, found)}
        return [by_id.get(str(i)) for i in ids]

    def scan(self, kind: Kind, group_ids: frozenset[str] | None = None) -> Iterator[Record]:
        kind = Kind(kind)
        where = "TRUE" if group_ids is None else "group_id = ANY(%(groups)s::text[])"
        statement = self._q(f"{select(kind)} WHERE seq > %(after)s AND {where} ORDER BY seq LIMIT {_PAGE}")
        params: dict[str, Any] = {"after": 0, "groups": sorted(group_ids or ())}
        while True:  # keyset pages: the connection is free between pages for other calls
            rows = self._read(lambda cur: cur.execute(statement, params).fetchall())
            yield from from_rows(kind, rows)
            if len(rows) < _PAGE:
                return
            params["after"] = rows[-1][0]

    def count(self, kind: Kind, group_ids: frozenset[str] | None = None) -> int:
        where = "" if group_ids is None else " AND group_id = ANY(%(groups)s::text[])"
        statement = self._q(f"SELECT coalesce(sum(n), 0) FROM {{s}}.counts WHERE kind = %(kind)s{where}")
        params = {"kind": Kind(kind).value, "groups": sorted(group_ids or ())}
        row = self._read(lambda cur: cur.execute(statement, params).fetchone())
        return int(row[0]) if row else 0

    def groups(self) -> set[str]:
        rows = self._read(lambda cur: cur.execute(self._q("SELECT DISTINCT group_id FROM {s}.counts")).fetchall())
        return {r[0] for r in rows}

    def entities_by_name(self, group_id: str, names: Sequence[str]) -> dict[str, list[Entity]]:
        keys = sorted({normalize_name(n) for n in names})
        if not keys:
            return {}
        statement = self._q(
            f"SELECT seq, {', '.join(COLUMNS[Kind.ENTITY])}, names FROM {{s}}.entities "
            "WHERE group_id = %s AND names && %s::text[] ORDER BY seq"
        )
        rows = self._read(lambda cur: cur.execute(statement, [group_id, keys]).fetchall())
        wanted = set(keys)
        out: dict[str, list[Entity]] = {}
        for row in rows:
            entity = from_row(Kind.ENTITY, row[:-1])
            assert isinstance(entity, Entity)
            for key in row[-1]:
                if key in wanted:
                    out.setdefault(key, []).append(entity)
        return out

    def facts_of(self, entity_ids: Sequence[str], scope: Scope | None = None) -> list[Fact]:
        if not entity_ids:
            return []
        params: dict[str, Any] = {"ids": list(entity_ids)}
        where = scope_where(Kind.FACT, scope, params)
        base = select(Kind.FACT)
        statement = self._q(
            f"{base} WHERE seq IN (SELECT seq FROM {{s}}.facts WHERE source_id = ANY(%(ids)s::text[]) UNION "
            f"SELECT seq FROM {{s}}.facts WHERE target_id = ANY(%(ids)s::text[])) AND {where} ORDER BY seq"
        )
        rows = self._read(lambda cur: cur.execute(statement, params).fetchall())
        return from_rows(Kind.FACT, rows)

    def fact_ends(self, scope: Scope) -> tuple[list[str], list[str]]:
        params: dict[str, Any] = {}
        where = scope_where(Kind.FACT, scope, params)
        statement = self._q(f"SELECT source_id, target_id FROM {{s}}.facts WHERE {where} ORDER BY seq")
        rows = self._read(lambda cur: cur.execute(statement, params).fetchall())
        return [r[0] for r in rows], [r[1] for r in rows]

    # The neighbourhood of a new fact: each read one statement on the (end, relation) and pair indexes (schema 4)
    # and the verdicts table (schema 5), never every fact of a hot entity.
    def facts_between(self, pairs: Sequence[tuple[str, str]]) -> list[Fact]:
        if not pairs:
            return []
        params = {"a": [p[0] for p in pairs], "b": [p[1] for p in pairs]}
        join = "FROM unnest(%(a)s::text[], %(b)s::text[]) AS p(a, b) JOIN {s}.facts f ON "
        statement = self._q(
            f"{select(Kind.FACT)} WHERE seq IN (SELECT f.seq {join} f.source_id = p.a AND f.target_id = p.b "
            f"UNION SELECT f.seq {join} f.source_id = p.b AND f.target_id = p.a) ORDER BY seq"
        )
        return from_rows(Kind.FACT, self._read(lambda cur: cur.execute(statement, params).fetchall()))

    def facts_with(self, entity_ids: Sequence[str], relation: str) -> list[Fact]:
        params: dict[str, Any] = {"ids": list(entity_ids), "relation": relation}
        statement = self._q(f"{select(Kind.FACT)} WHERE seq IN ({_NEIGHBOURHOOD}) ORDER BY seq")
        return from_rows(Kind.FACT, self._read(lambda cur: cur.execute(statement, params).fetchall()))

    def facts_judging(self, fact_ids: Sequence[str], entity_ids: Sequence[str]) -> list[Fact]:
        if not fact_ids or not entity_ids:
            return []
        params: dict[str, Any] = {"named": list(fact_ids), "ids": list(entity_ids)}
        statement = self._q(
            f"{select(Kind.FACT)} WHERE seq IN "
            "(SELECT seq FROM {s}.fact_verdicts WHERE named = ANY(%(named)s::text[])) "
            "AND (source_id = ANY(%(ids)s::text[]) OR target_id = ANY(%(ids)s::text[])) ORDER BY seq"
        )
        return from_rows(Kind.FACT, self._read(lambda cur: cur.execute(statement, params).fetchall()))

    def bfs(self, seeds: Sequence[str], depth: int, scope: Scope, limit: int | None = None) -> dict[str, int]:
        if not seeds:
            return {}
        params: dict[str, Any] = {"seeds": list(dict.fromkeys(seeds)), "depth": int(depth)}
        entity_where = scope_where(Kind.ENTITY, scope, params)
        fact_where = scope_where(Kind.FACT, scope, params)
        params["limit"] = limit if limit is not None else 2**62
        # Level by level: each step carries the frontier and every entity seen so far, so an entity is expanded
        # once (a plain recursive join would revisit it along every path). Each entity carries the order in which
        # a walk in memory meets it: its seed's place, then the seq of each fact on its path (fixed-width text, so
        # text order is that order; the least path per entity). A limit keeps the entities met first, as the
        # in-memory and reference stores do.

        def step(other: str, near: str) -> str:  # the entities one fact away from the frontier, by one end
            return (
                f"SELECT f.{other} AS other, c.path || lpad(f.seq::text, 19, '0') AS path "
                "FROM unnest(walk.frontier, walk.paths) AS c(id, path) "
                f"JOIN {{s}}.facts f ON f.{near} = c.id WHERE {fact_where}"
            )

        statement = self._q(
            "WITH RECURSIVE walk(frontier, paths, seen, hop) AS ("
            " SELECT array_agg(e.id ORDER BY s.n), array_agg(lpad(s.n::text, 19, '0') ORDER BY s.n), array_agg(e.id),"
            " 0 FROM unnest(%(seeds)s::text[]) WITH ORDINALITY AS s(id, n) JOIN {s}.entities e ON e.id = s.id"
            f" WHERE {entity_where}"
            " UNION ALL"
            " SELECT step.found, step.paths, walk.seen || step.found, walk.hop + 1 FROM walk CROSS JOIN LATERAL ("
            "  SELECT array_agg(n.other ORDER BY n.path) AS found, array_agg(n.path ORDER BY n.path) AS paths FROM ("
            "   SELECT x.other, min(x.path) AS path FROM ("
            f"    {step('target_id', 'source_id')} UNION ALL"
            f"    {step('source_id', 'target_id')}"
            "   ) x WHERE NOT x.other = ANY(walk.seen) GROUP BY x.other"
            "  ) n"
            " ) step"
            " WHERE walk.hop < %(depth)s AND step.found IS NOT NULL AND cardinality(walk.seen) < %(limit)s"
            ") SELECT unnest(frontier), unnest(paths), hop FROM walk WHERE frontier IS NOT NULL"
        )
        rows = self._read(lambda cur: cur.execute(statement, params).fetchall())
        hops: dict[str, int] = {}
        for entity_id, _, hop in sorted(rows, key=lambda r: (r[2], r[1])):
            if limit is not None and hop > 0 and len(hops) >= limit:
                break
            hops.setdefault(entity_id, hop)
        return hops

    def mentions(
        self, episode_ids: Sequence[str] | None = None, entity_ids: Sequence[str] | None = None
    ) -> list[Mention]:
        return self._links(Kind.MENTION, "episode_id", episode_ids, entity_ids)

    def memberships(
        self, community_ids: Sequence[str] | None = None, entity_ids: Sequence[str] | None = None
    ) -> list[Membership]:
        return self._links(Kind.MEMBERSHIP, "community_id", community_ids, entity_ids)

    def _links(self, kind: Kind, first: str, firsts: Sequence[str] | None, entities: Sequence[str] | None) -> list[Any]:
        parts = ["TRUE"]
        params: dict[str, Any] = {}
        if firsts is not None:
            parts.append(f"{first} = ANY(%(firsts)s::text[])")
            params["firsts"] = list(firsts)
        if entities is not None:
            parts.append("entity_id = ANY(%(entities)s::text[])")
            params["entities"] = list(entities)
        statement = self._q(f"{select(kind)} WHERE {' AND '.join(parts)} ORDER BY seq")
        rows = self._read(lambda cur: cur.execute(statement, params).fetchall())
        return from_rows(kind, rows)

    def episode_facts(self, episode_id: str) -> list[Fact]:
        statement = self._q(f"{select(Kind.FACT)} WHERE episodes @> ARRAY[%s::text] ORDER BY seq")
        rows = self._read(lambda cur: cur.execute(statement, [episode_id]).fetchall())
        return from_rows(Kind.FACT, rows)

    def recent_episodes(self, group_id: str, before: datetime, n: int) -> list[Episode]:
        if n <= 0:
            return []
        statement = self._q(
            f"{select(Kind.EPISODE)} WHERE group_id = %s AND reference_time <= %s "
            "ORDER BY reference_time DESC, seq DESC LIMIT %s"
        )
        rows = self._read(lambda cur: cur.execute(statement, [group_id, before, n]).fetchall())
        return from_rows(Kind.EPISODE, reversed(rows))

    def episode_window(self, episode_id: str, before: int, after: int) -> list[Episode]:
        base = select(Kind.EPISODE)
        statement = self._q(
            "WITH me AS (SELECT group_id, reference_time, seq FROM {s}.episodes WHERE id = %(id)s) "
            f"(SELECT * FROM ({base} e WHERE e.group_id = (SELECT group_id FROM me) AND (e.reference_time, e.seq) < "
            "(SELECT reference_time, seq FROM me) ORDER BY e.reference_time DESC, e.seq DESC LIMIT %(before)s) b) "
            f"UNION ALL ({base} WHERE id = %(id)s) "
            f"UNION ALL (SELECT * FROM ({base} e WHERE e.group_id = (SELECT group_id FROM me) AND "
            "(e.reference_time, e.seq) > (SELECT reference_time, seq FROM me) ORDER BY e.reference_time, e.seq "
            "LIMIT %(after)s) a)"
        )
        params = {"id": episode_id, "before": max(0, before), "after": max(0, after)}
        rows = self._read(lambda cur: cur.execute(statement, params).fetchall())
        ordered = sorted(rows, key=lambda r: (r[1 + COLUMNS[Kind.EPISODE].index("reference_time")], r[0]))
        return from_rows(Kind.EPISODE, ordered)

    def stats(self) -> dict[str, Any]:
        rows = self._read(
            lambda cur: cur.execute(self._q("SELECT kind, sum(n) FROM {s}.counts GROUP BY kind")).fetchall()
        )
        counts = {str(k): int(n) for k, n in rows}
        unindexed = self._read(
            lambda cur: cur.execute(
                self._q(
                    " UNION ALL ".join(
                        f"SELECT '{kind.value}', count(*) FROM {{s}}.{table} WHERE NOT indexed"
                        for kind, (table, _) in VECTOR_TABLES.items()
                    )
                )
            ).fetchall()
        )
        return {
            "records": {kind.value: counts.get(kind.value, 0) for kind in Kind},
            # rows the worker has not entered into their HNSW index yet (searched exactly meanwhile)
            "unindexed_vectors": {str(k): int(n) for k, n in unindexed},
            "groups": len(self.groups()),
            "backend": f"postgres ({describe(self._dsn)}, schema {self.schema})",
        }
