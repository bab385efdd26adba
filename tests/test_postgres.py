"""The PostgreSQL backend beyond the shared conformance suite: tkg on top of it, moving memories between backends,
schema versions and migrations, several processes at once, and bad input (each a clear tkg error, nothing
half-written)."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import multiprocessing
import string
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest
from conftest import T0, new_postgres_schema, searchable_records
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.conninfo import make_conninfo

from tkg import FactInput, FixedClock, HashEmbedder, Memory
from tkg.backends.memory import InMemoryStore
from tkg.backends.postgres import SCHEMA_VERSION, EmbeddedPostgres, PostgresStore
from tkg.backends.postgres import schema as pg_schema
from tkg.errors import BackendError, ConfigurationError, ValidationError
from tkg.models import Community, Entity, Episode, Fact, Kind, Membership, Mention, Record, Verdict
from tkg.storage import Candidates, WriteBatch
from tkg.timeline import make_scope

DIM = 32
EMB = HashEmbedder(dim=DIM)
NOW = T0 + timedelta(days=30)


@pytest.fixture
def server(postgres_server: EmbeddedPostgres) -> EmbeddedPostgres:
    return postgres_server


@pytest.fixture
def store(server: EmbeddedPostgres) -> Iterator[PostgresStore]:
    with PostgresStore(server.dsn, dim=DIM, schema=new_postgres_schema()) as opened:
        yield opened


def admin(server: EmbeddedPostgres, dsn: str | None = None) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn or server.dsn, autocommit=True)


def table_counts(server: EmbeddedPostgres, schema: str) -> dict[str, int]:
    with admin(server) as conn:
        return {
            t.name: conn.execute(f'SELECT count(*) FROM "{schema}".{t.name}').fetchone()[0]  # type: ignore[index]
            for t in pg_schema.TABLES.values()
        }


# -- tkg on PostgreSQL ----------------------------------------------------------------------------------------
def test_memory_on_postgres_answers_like_memory_in_process(store: PostgresStore) -> None:
    facts = [
        FactInput("Alice", "WORKS_AT", "Acme", valid_at="2023-01-01T00:00:00Z"),
        FactInput("Alice", "LIVES_IN", "Berlin"),
        FactInput("Bob", "WORKS_AT", "Initech"),
    ]
    answers = []
    for backing in (InMemoryStore(dim=DIM), store):
        memory = Memory(backing, embedder=EMB, clock=FixedClock(NOW))
        memory.add_facts(facts, group_id="team")
        memory.add_episode("Alice: I moved to Berlin last year", group_id="team")
        found = memory.search("where does Alice work?", group_ids=["team"], limit=5)
        answers.append(
            ([s.record.fact for s in found.facts], sorted(e.record.name for e in found.entities), memory.stats())
        )
    assert answers[0] == answers[1]


def test_data_outlives_the_store(server: EmbeddedPostgres) -> None:
    schema = new_postgres_schema()
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as first:
        Memory(first, embedder=EMB, clock=FixedClock(NOW)).add_facts([FactInput("Ann", "KNOWS", "Bo")], group_id="g")
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as again:
        assert again.count(Kind.FACT) == 1 and again.groups() == {"g"}
        with pytest.raises(ConfigurationError, match="holds 32-d vectors"):
            PostgresStore(server.dsn, dim=DIM * 2, schema=schema)


def test_a_schema_refuses_vectors_of_another_embedder_of_the_same_size(server: EmbeddedPostgres) -> None:
    schema = new_postgres_schema()
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as first:
        Memory(first, embedder=EMB, clock=FixedClock(NOW)).add_facts([FactInput("Ann", "KNOWS", "Bo")], group_id="g")
    other = HashEmbedder(dim=DIM, trigrams=False)  # 32-d as well, other vectors
    assert other.name != EMB.name
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as again:
        with pytest.raises(ConfigurationError, match=f"embedder {EMB.name!r}"):
            Memory(again, embedder=other)
        memory = Memory(again, embedder=EMB)  # the embedder that wrote it still opens it
        assert memory.get_all(["g"])
        with pytest.raises(ConfigurationError):
            memory.embedder = other  # nor can it be swapped in afterwards
        assert memory.embedder is EMB
    Memory(embedder=other).embedder = EMB  # an in-process store keeps no record: swapping is the caller's call


# -- moving between backends ------------------------------------------------------------------------------------
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
NAMES = st.text(alphabet=string.ascii_letters + " éß", min_size=1, max_size=12).filter(str.strip)
TIMES = st.datetimes(
    min_value=datetime(1900, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)  # microseconds included
# the codecs' tags among the keys: a user's map that looks like a tagged value must come back as that map
KEYS = TEXT | st.sampled_from(["__dt__", "__map__", "__float__", "__bytes__"])
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | TEXT | TIMES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=6,
)
ATTRS = st.dictionaries(KEYS, JSON, max_size=3)
VECTOR = st.none() | st.lists(
    st.floats(width=32, allow_nan=False, allow_infinity=False, min_value=-1e6, max_value=1e6),
    min_size=DIM,
    max_size=DIM,
).map(lambda v: np.array(v, dtype=np.float32))


@st.composite
def graphs(draw: st.DrawFn) -> list[Record]:
    n_entities = draw(st.integers(1, 5))
    entities = [
        Entity(
            id=f"e{i}",
            group_id="g",
            name=draw(NAMES),
            created_at=draw(TIMES),
            summary=draw(TEXT),
            labels=tuple(draw(st.lists(st.sampled_from(["Entity", "Person", "Place"]), min_size=1, max_size=2))),
            attributes=draw(ATTRS),
            aliases=tuple(draw(st.lists(NAMES, max_size=2))),
            name_embedding=draw(VECTOR),
        )
        for i in range(n_entities)
    ]
    episodes = [
        Episode(
            id=f"ep{i}",
            group_id="g",
            content=draw(TEXT.filter(str.strip)),
            source=draw(st.sampled_from(["message", "text", "json"])),
            reference_time=draw(TIMES),
            created_at=draw(TIMES),
            status=draw(st.sampled_from(["extracted", "stored", "failed"])),
            error=draw(TEXT),
            attributes=draw(ATTRS),
            embedding=draw(VECTOR),
        )
        for i in range(draw(st.integers(0, 3)))
    ]
    facts = []
    for i in range(draw(st.integers(0, 5))):
        created = draw(TIMES)
        valid = draw(st.none() | TIMES)
        invalid = draw(st.none() | TIMES.filter(lambda t, v=valid: v is None or t >= v))
        facts.append(
            Fact(
                id=f"f{i}",
                group_id="g",
                source_id=f"e{draw(st.integers(0, n_entities - 1))}",
                target_id=f"e{draw(st.integers(0, n_entities - 1))}",
                relation=draw(st.sampled_from(["KNOWS", "WORKS_AT"])),
                fact=draw(TEXT.filter(str.strip)),
                created_at=created,
                valid_at=valid,
                invalid_at=invalid,
                expired_at=draw(st.none() | st.just(created + timedelta(microseconds=draw(st.integers(0, 10**12))))),
                episodes=tuple(e.id for e in episodes if draw(st.booleans())),
                attributes=draw(ATTRS),
                invalidated_by=draw(st.none() | st.just("f0")),
                prior_invalid_at=draw(st.none() | TIMES),
                embedding=draw(VECTOR),
            )
        )
    mentions = [
        Mention(ep.id, e.id, "g", draw(TIMES), name=draw(TEXT), label=draw(TEXT), attributes=draw(ATTRS))
        for ep in episodes
        for e in entities
        if draw(st.booleans())
    ]
    communities = [
        Community(id="c0", group_id="g", name=draw(TEXT), created_at=draw(TIMES), name_embedding=draw(VECTOR))
    ]
    members = [Membership("c0", e.id, "g", draw(TIMES)) for e in entities if draw(st.booleans())]
    return [*episodes, *entities, *communities, *facts, *mentions, *members]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(records=graphs())
def test_snapshot_moves_a_memory_between_backends_losslessly(
    server: EmbeddedPostgres, tmp_path_factory: pytest.TempPathFactory, records: list[Record]
) -> None:
    """in-memory -> snapshot -> PostgreSQL -> snapshot -> in-memory gives the same graph, record for record."""
    folder = tmp_path_factory.mktemp("snap")
    source_store = InMemoryStore(dim=DIM)
    source = Memory(source_store, embedder=EMB, clock=FixedClock(NOW))
    source_store.write(WriteBatch(puts=records))
    source.save(folder / "a.tkg")
    with PostgresStore(server.dsn, dim=DIM, schema=new_postgres_schema()) as pg:
        on_pg = Memory.load(folder / "a.tkg", embedder=EMB, store=pg)
        on_pg.save(folder / "b.tkg")
        back = Memory.load(folder / "b.tkg", embedder=EMB)
        for kind in Kind:
            original = list(source.records(kind))
            assert list(pg.scan(kind)) == original, kind
            assert list(back.records(kind)) == original, kind
            assert pg.count(kind) == len(original)


def _form(value: Any) -> Any:
    """What a field's value is beyond equality: its type, a timestamp's zone, a vector's dtype and writability, a
    map's values' types (a verdict must be the member, not its text)."""
    if isinstance(value, datetime):
        return datetime, value.tzinfo
    if isinstance(value, np.ndarray):
        return np.ndarray, value.dtype, value.flags.writeable, value.flags.c_contiguous
    if isinstance(value, dict):
        return dict, sorted((k, type(v)) for k, v in value.items())
    return type(value)


def test_records_read_back_are_made_as_the_models_make_them(server: EmbeddedPostgres) -> None:
    """The rows read are not validated again (they were when written): each field must still come back in the form
    the model's own constructor gives it (UTC whatever the session's time zone, members of enums, tuples,
    read-only float32 vectors), so that code comparing verdicts by identity or times by their zone works alike."""
    vector = np.arange(DIM, dtype=np.float32)
    when = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    records: list[Record] = [
        Episode(
            id="ep",
            group_id="g",
            content="hi",
            source="json",
            reference_time=when,
            created_at=when,
            status="failed",
            attributes={"k": when, "n": {"x": [1, 2.5]}},
            embedding=vector,
        ),
        Entity(
            id="a",
            group_id="g",
            name="Ann",
            created_at=when,
            labels=("Person",),
            aliases=("Annie",),
            attributes={"age": 3},
            name_embedding=vector,
        ),
        Entity(id="b", group_id="g", name="Bo", created_at=when),
        Fact(
            id="f0",
            group_id="g",
            source_id="a",
            target_id="b",
            relation="KNOWS",
            fact="Ann knows Bo",
            created_at=when,
            valid_at=when,
            invalid_at=when + timedelta(days=1),
            expired_at=when,
            episodes=("ep",),
            invalidated_by="f1",
            prior_invalid_at=when,
            embedding=vector,
        ),
        Fact(
            id="f1",
            group_id="g",
            source_id="a",
            target_id="b",
            relation="KNOWS",
            fact="Ann met Bo",
            created_at=when,
            verdicts={"f0": "contradicts"},
            embedding=vector,
        ),
        Fact(  # a verdict on a fact whose id is one of the codec's tags: the map is wrapped when written
            id="f2",
            group_id="g",
            source_id="b",
            target_id="a",
            relation="KNOWS",
            fact="Bo knows Ann",
            created_at=when,
            verdicts={"__map__": "same"},
        ),
        Community(id="c", group_id="g", name="c", created_at=when, name_embedding=vector),
        Mention("ep", "a", "g", when, name="Ann", attributes={"a": "b"}),
        Membership("c", "a", "g", when),
    ]
    elsewhere = make_conninfo(server.dsn, options="-c TimeZone=Asia/Kolkata")  # the driver's times are +05:30
    with PostgresStore(elsewhere, dim=DIM, schema=new_postgres_schema()) as pg:
        pg.write(WriteBatch(puts=records))
        read = {(r.kind, r.id): r for kind in Kind for r in pg.scan(kind)}
        read.update({(f.kind, f.id): f for f in pg.facts_of(["a"])})  # the facts' own read path
    for record in records:
        back = read[(record.kind, record.id)]
        assert back == record
        for field in dataclasses.fields(record):
            assert _form(getattr(back, field.name)) == _form(getattr(record, field.name)), (record.kind, field.name)
    assert read[(Kind.FACT, "f1")].verdicts["f0"] is Verdict.CONTRADICTS
    assert read[(Kind.FACT, "f2")].verdicts == {"__map__": Verdict.SAME}


def test_load_needs_an_empty_store(store: PostgresStore) -> None:
    store.write(WriteBatch(puts=[Entity(id="e1", group_id="g", name="A", created_at=T0)]))
    with pytest.raises(BackendError, match="empty store"):
        store.load([Entity(id="e2", group_id="g", name="B", created_at=T0)])
    assert store.count(Kind.ENTITY) == 1


def test_load_builds_its_indexes_with_the_memory_it_is_given(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``build_memory_mb`` is the server's maintenance_work_mem while load() builds the search indexes (pgvector
    builds HNSW ten times faster while the graph fits in it), and only then; out of range, a clear error."""
    seen: list[str] = []
    real = psycopg.Cursor.execute

    def spy(cur: psycopg.Cursor[Any], query: Any, params: Any = None, **kw: Any) -> Any:
        text = query if isinstance(query, str) else query.as_string(cur.connection)
        if "USING hnsw" in text:
            seen.append(real(cur, "SHOW maintenance_work_mem").fetchone()[0])
        return real(cur, query, params, **kw)

    with PostgresStore(server.dsn, dim=DIM, schema=new_postgres_schema(), build_memory_mb=96) as store:
        monkeypatch.setattr(psycopg.Cursor, "execute", spy)
        store.load([Entity(id="e1", group_id="g", name="A", created_at=T0, name_embedding=EMB.embed(["A"])[0])])
        monkeypatch.undo()
        assert seen and set(seen) == {"96MB"}
        with store._connection().cursor() as cur:
            assert cur.execute("SHOW maintenance_work_mem").fetchone()[0] != "96MB"
        assert [h.id for h in store.vector_search(Kind.ENTITY, EMB.embed(["A"])[0], 1, make_scope(T0, ["g"]))] == ["e1"]
    for wrong in (0, 63, 2**21 + 1, 1.5, "1GB"):
        with pytest.raises(ValidationError, match="build_memory_mb"):
            PostgresStore(server.dsn, dim=DIM, schema=new_postgres_schema(), build_memory_mb=wrong)  # type: ignore[arg-type]


# -- schema versions and migrations -----------------------------------------------------------------------------
def test_a_newer_schema_is_refused_and_left_alone(server: EmbeddedPostgres) -> None:
    schema = new_postgres_schema()
    PostgresStore(server.dsn, dim=DIM, schema=schema).close()
    with admin(server) as conn:
        conn.execute(f"UPDATE \"{schema}\".meta SET value = '{SCHEMA_VERSION + 1}' WHERE key = 'schema_version'")
    with pytest.raises(BackendError, match=rf"version {SCHEMA_VERSION + 1}, newer than this tkg knows.*Upgrade tkg"):
        PostgresStore(server.dsn, dim=DIM, schema=schema)
    with admin(server) as conn:
        row = conn.execute(f"SELECT value FROM \"{schema}\".meta WHERE key = 'schema_version'").fetchone()
    assert row == (str(SCHEMA_VERSION + 1),)


def test_migrations_run_once_in_order(server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch) -> None:
    schema = new_postgres_schema()
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as old:
        old.write(WriteBatch(puts=[Entity(id="e1", group_id="g", name="Ann", created_at=T0)]))
    ran: list[int] = []

    def to_next(conn: psycopg.Connection[Any], name: str, settings: dict[str, str]) -> None:
        ran.append(SCHEMA_VERSION + 1)
        conn.execute(pg_schema.render("ALTER TABLE {s}.entities ADD COLUMN note text", name))

    monkeypatch.setattr(pg_schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    monkeypatch.setitem(pg_schema.MIGRATIONS, SCHEMA_VERSION + 1, to_next)
    for _ in range(2):  # the second open finds the schema current
        with PostgresStore(server.dsn, dim=DIM, schema=schema) as upgraded:
            assert [e.name for e in upgraded.scan(Kind.ENTITY)] == ["Ann"]  # type: ignore[attr-defined]
    assert ran == [SCHEMA_VERSION + 1]
    with admin(server) as conn:
        assert conn.execute(f"SELECT value FROM \"{schema}\".meta WHERE key = 'schema_version'").fetchone() == (
            str(SCHEMA_VERSION + 1),
        )


def schema_at(server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch, version: int) -> str:
    """A new tkg schema as a tkg writing schema ``version`` created it."""
    schema = new_postgres_schema()
    with monkeypatch.context() as patch:
        patch.setattr(pg_schema, "SCHEMA_VERSION", version)
        PostgresStore(server.dsn, dim=DIM, schema=schema).close()
    return schema


def put_rows(conn: psycopg.Connection[Any], schema: str, records: list[Record]) -> None:
    """The records' rows alone, as an older tkg wrote them (nothing a later schema derives from them)."""
    from tkg.backends.postgres.records import ADDED_COLUMNS, COLUMNS, row_values
    from tkg.backends.postgres.vectors import register_vector

    register_vector(conn)
    for record in records:
        # The record's columns (and an entity's names); not a fact's sketch (schema 6) nor indexed (schema 10),
        # nor a column a later schema added (records.ADDED_COLUMNS).
        values = dict(zip(COLUMNS[record.kind], row_values(record, DIM), strict=False))
        if record.kind is Kind.ENTITY:
            values["names"] = row_values(record, DIM)[len(COLUMNS[record.kind])]
        for kind, column in ADDED_COLUMNS:
            if kind is record.kind:
                values.pop(column)
        columns = list(values)
        table = pg_schema.TABLES[record.kind].name
        statement = f"INSERT INTO {{s}}.{table} ({', '.join(columns)}) VALUES ({', '.join(['%s'] * len(columns))})"
        conn.execute(pg_schema.render(statement, schema), list(values.values()))


def test_a_version_2_schema_gets_bm25_postings_of_its_records_on_upgrade(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schema 3 replaced tsvector by BM25 postings: opening a version 2 schema indexes the records it holds, and
    its full-text search then answers exactly as the reference store does over the same records."""
    from tkg.backends.reference import ReferenceStore

    schema = schema_at(server, monkeypatch, 2)
    words = ["coffee", "tea", "Paris", "Berlin", "works", "lives", "the", "and"]
    rng = np.random.default_rng(3)
    entities = [
        Entity(
            id=f"e{i}",
            group_id=["g", "h"][i % 2],
            name=f"Person {i}",
            created_at=T0,
            summary=" ".join(rng.choice(words, size=int(rng.integers(0, 6)))),
        )
        for i in range(60)
    ]
    with admin(server) as conn:  # rows as tkg 0.1 with schema 2 wrote them
        conn.execute(pg_schema.render("ALTER TABLE {s}.entities ALTER COLUMN tsv SET DEFAULT ''", schema))
        put_rows(conn, schema, entities)
        conn.execute(pg_schema.render("INSERT INTO {s}.counts VALUES ('entity', 'g', 30), ('entity', 'h', 30)", schema))
    oracle = ReferenceStore(dim=DIM)
    oracle.write(WriteBatch(puts=entities))
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as upgraded:
        assert upgraded.count(Kind.ENTITY) == 60
        for query in ("coffee", "tea in Paris", "person works", "Berlin lives 7"):
            for groups in (["g"], None):
                scope = make_scope(T0 + timedelta(days=1), groups)
                ours, theirs = (
                    upgraded.text_search(Kind.ENTITY, query, 8, scope),
                    oracle.text_search(Kind.ENTITY, query, 8, scope),
                )
                assert [(h.id, h.score) for h in ours] == [(h.id, h.score) for h in theirs], query


def test_a_version_4_schema_gets_its_verdicts_indexed_on_upgrade(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schema 5 reads the facts judging a fact from a table of (named fact, judging fact): opening a version 4
    schema fills it from the facts stored, and facts_judging then answers as the reference store does."""
    from tkg.backends.reference import ReferenceStore
    from tkg.models import Verdict

    schema = schema_at(server, monkeypatch, 4)
    rng = np.random.default_rng(11)
    entities = [Entity(id=f"e{i}", group_id="g", name=f"Person {i}", created_at=T0) for i in range(6)]
    facts: list[Fact] = []
    for i in range(80):
        named = rng.choice([f.id for f in facts] + ["gone"], size=min(len(facts) + 1, 3), replace=False)
        facts.append(
            Fact(
                id=f"f{i}",
                group_id="g",
                source_id=f"e{rng.integers(6)}",
                target_id=f"e{rng.integers(6)}",
                relation="KNOWS",
                fact=f"fact {i}",
                created_at=T0,
                verdicts={str(n): list(Verdict)[int(rng.integers(3))] for n in named[: int(rng.integers(0, 4))]},
            )
        )
    with admin(server) as conn:  # rows as tkg with schema 4 wrote them
        put_rows(conn, schema, [*entities, *facts])
    oracle = ReferenceStore(dim=DIM)
    oracle.write(WriteBatch(puts=[*entities, *facts]))
    assert sum(bool(f.verdicts) for f in facts) > 40
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as upgraded:
        for n in range(0, 80, 7):
            named = [f"f{n}", f"f{n + 3}", "gone"]
            for ends in (["e0"], ["e1", "e2"], [f"e{i}" for i in range(6)]):
                assert upgraded.facts_judging(named, ends) == oracle.facts_judging(named, ends), (named, ends)
        assert upgraded.facts_judging(["gone"], ["e0", "e3"])  # a named fact need not exist


def test_a_version_8_schema_keeps_its_packs_and_stale_records_on_upgrade(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schema 9 gave the packs generations and the stale records marks: a version 8 schema (packed, with records
    rewritten and deleted since) opens with its packs in use, searches as the reference store, and repacks."""
    from tkg.backends.postgres import terms
    from tkg.backends.reference import ReferenceStore

    monkeypatch.setattr(terms, "REPACK_MIN", 1)  # the first write packs
    monkeypatch.setattr(terms, "STALE_MIN", 10**6)  # the rewrites stay stale

    schema = new_postgres_schema()
    oracle = ReferenceStore(dim=DIM)
    entities = [
        Entity(id=f"e{i}", group_id="g", name=f"E{i}", created_at=T0, summary=" ".join(["coffee"] * (1 + i % 3)))
        for i in range(8)
    ]
    batches = [
        WriteBatch(puts=entities),
        WriteBatch(puts=[dataclasses.replace(entities[1], summary="espresso coffee")], deletes=[("entity", "e4")]),
    ]
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as store:
        for batch in batches:
            store.write(batch)
            oracle.write(batch)
            assert store.wait_for_maintenance(30)
    assert pack_state(server, schema)[1] == 2  # e1 and e4 stale
    with admin(server) as conn:  # back to schema 8's tables, as tkg with schema 8 left them
        for table in ("episodes", "entities", "facts", "communities"):
            conn.execute(
                f'ALTER TABLE "{schema}".{table}_packs DROP CONSTRAINT {table}_packs_pkey, DROP COLUMN gen, '
                "ADD PRIMARY KEY (term)"
            )
            conn.execute(f'ALTER TABLE "{schema}".{table}_stale DROP COLUMN mark')
            conn.execute(f'ALTER TABLE "{schema}".{table} DROP COLUMN indexed')  # schema 10's, with its indexes
        conn.execute(f'ALTER TABLE "{schema}".packed DROP COLUMN gen, DROP COLUMN pending')
        conn.execute(f'ALTER TABLE "{schema}".communities DROP COLUMN summarised')  # schema 12's
        for end in ("source", "target"):
            conn.execute(f'DROP INDEX "{schema}".facts_{end}_holding')  # schema 13's
        conn.execute(f"UPDATE \"{schema}\".meta SET value = '8' WHERE key = 'schema_version'")
    scope = make_scope(T0 + timedelta(days=1), ["g"])
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as upgraded:
        assert pack_state(server, schema)[:2] != (0, 0)  # still packed, still stale
        for query in ("coffee", "espresso", "coffee espresso"):
            ours = [(h.id, h.score) for h in upgraded.text_search(Kind.ENTITY, query, 20, scope)]
            assert ours == [(h.id, h.score) for h in oracle.text_search(Kind.ENTITY, query, 20, scope)], query
        rewrite = WriteBatch(puts=[dataclasses.replace(entities[2], summary="espresso")])
        upgraded.write(rewrite)
        oracle.write(rewrite)
        monkeypatch.setattr(terms, "STALE_MIN", 1)
        upgraded.flush()
        assert pack_state(server, schema)[1] == 0  # repacked
        for query in ("coffee", "espresso"):
            ours = [(h.id, h.score) for h in upgraded.text_search(Kind.ENTITY, query, 20, scope)]
            assert ours == [(h.id, h.score) for h in oracle.text_search(Kind.ENTITY, query, 20, scope)], query


def test_a_version_5_schema_gets_its_fact_sketches_on_upgrade(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schema 6 finds a large neighbourhood's closest facts by the sketches of their vectors: opening a version 5
    schema sketches the facts stored (as a write would: the same bits), and the closest facts around an entity with
    more facts than are scored exactly come back as the in-memory store finds them."""
    from tkg.vector_sketches import EXACT_UP_TO, sketch_text

    schema = schema_at(server, monkeypatch, 5)
    rng = np.random.default_rng(17)
    entities = [Entity(id=f"e{i}", group_id="g", name=f"Person {i}", created_at=T0) for i in range(4)]
    facts = [
        Fact(
            id=f"f{i}",
            group_id="g",
            source_id="e0",
            target_id=f"e{1 + i % 3}",
            relation=["KNOWS", "LIKES"][i % 2],
            fact=f"fact {i}",
            created_at=T0,
            expired_at=T0 if i % 5 == 0 else None,
            embedding=None if i % 97 == 0 else rng.standard_normal(DIM).astype(np.float32),
        )
        for i in range(2 * EXACT_UP_TO + 300)  # more of each relation than are all scored exactly
    ]
    with admin(server) as conn:  # rows as tkg with schema 5 wrote them
        put_rows(conn, schema, [*entities, *facts])
    memory = InMemoryStore(dim=DIM)
    memory.write(WriteBatch(puts=[*entities, *facts]))
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as upgraded:
        with admin(server) as conn:
            stored = dict(conn.execute(f'SELECT id, sketch::text FROM "{schema}".facts').fetchall())
        for f in facts:
            want = None if f.embedding is None else sketch_text(f.embedding[None, :])[0]
            got = stored[f.id]
            assert (got is None) if want is None else got == f"{int(want[1:], 16):0{len(want[1:]) * 4}b}", f.id
        for n in range(5):
            query = rng.standard_normal(DIM).astype(np.float32)
            for same, holding in itertools.product((True, False), (False, True)):
                ours = upgraded.closest_facts(["e0"], query, 10, "KNOWS", same=same, holding=holding)
                theirs = memory.closest_facts(["e0"], query, 10, "KNOWS", same=same, holding=holding)
                assert [f.id for f, _ in ours] == [f.id for f, _ in theirs], (n, same, holding)
                assert np.allclose([s for _, s in ours], [s for _, s in theirs], atol=1e-5)


def test_bm25_ranks_as_the_reference_through_rewrites_deletions_and_narrow_scopes(server: EmbeddedPostgres) -> None:
    """BM25 over common and rare terms gives the reference's ids and scores, ties included, after rewrites that
    change term frequencies and lengths and after deletions; and in a scope that admits few of the best documents
    (group "x": its documents rank low), so the best are checked against the scope batch after batch."""
    from tkg.backends.reference import ReferenceStore

    rng = np.random.default_rng(5)
    common, rare = ["coffee", "morning", "office"], ["espresso", "Lisbon", "violin", "glacier", "Kyoto"]
    entities = []
    for i in range(400):
        words = [w for w in common if rng.random() < 0.6]
        words += [w for w in rare if rng.random() < 0.02]
        words += ["filler"] * int(rng.integers(0, 5))
        entities.append(Entity(id=f"e{i}", group_id="gh"[i % 2], name=f"P{i}", created_at=T0, summary=" ".join(words)))
    for i in range(6):  # long documents: low scores
        summary = f"{' '.join(common)} {'filler ' * 40}"
        entities.append(Entity(id=f"x{i}", group_id="x", name=f"X{i}", created_at=T0, summary=summary))
    oracle = ReferenceStore(dim=DIM)
    oracle.write(WriteBatch(puts=entities))
    with PostgresStore(server.dsn, dim=DIM, schema=new_postgres_schema()) as store:
        store.write(WriteBatch(puts=entities))

        def same_answers() -> None:
            for query in ("coffee espresso", "morning office Lisbon violin", "coffee glacier", "office Kyoto espresso"):
                for k in (1, 3, 10, 40):
                    for groups in (["g"], ["x"], None):
                        scope = make_scope(T0 + timedelta(days=1), groups)
                        ours = [(h.id, h.score) for h in store.text_search(Kind.ENTITY, query, k, scope)]
                        assert ours == [(h.id, h.score) for h in oracle.text_search(Kind.ENTITY, query, k, scope)]

        same_answers()
        # Rewrites that keep each term's document count but raise its frequency or shorten documents, then
        # deletions.
        changed = [
            dataclasses.replace(e, summary=" ".join(w for w in e.summary.split() if w != "filler") + " office office")
            for e in entities[::7]
        ]
        changed += [dataclasses.replace(e, summary="coffee") for e in entities[3::11]]
        gone = [("entity", e.id) for e in entities[5::13] if e not in changed]
        for target in (store, oracle):
            target.write(WriteBatch(puts=changed))
            target.write(WriteBatch(deletes=gone))
        same_answers()


def test_bm25_follows_a_rewrite_that_raises_a_term_frequency(server: EmbeddedPostgres) -> None:
    """A rewrite that keeps a term's document count but raises its frequency (a document holding "beta" once
    becomes "beta" forty times) raises its score: the rewritten document, which holds no rare term, leads. The
    rare term's documents are long (low scores), the common term's short."""
    from tkg.backends.reference import ReferenceStore

    entities = [
        Entity(id=f"a{i}", group_id="g", name=f"A{i}", created_at=T0, summary=f"alpha {'pad ' * 250}")
        for i in range(100)
    ] + [
        Entity(id=f"b{i}", group_id="g", name=f"B{i}", created_at=T0, summary=f"beta {'pad ' * 9}") for i in range(300)
    ]
    oracle = ReferenceStore(dim=DIM)
    with PostgresStore(server.dsn, dim=DIM, schema=new_postgres_schema()) as store:
        rewritten = [dataclasses.replace(entities[100], summary=" ".join(["beta"] * 40))]
        for batch in (WriteBatch(puts=entities), WriteBatch(puts=rewritten)):
            store.write(batch)
            oracle.write(batch)
            for k in (10, 40):
                scope = make_scope(T0 + timedelta(days=1), ["g"])
                ours = [(h.id, h.score) for h in store.text_search(Kind.ENTITY, "alpha beta", k, scope)]
                assert ours == [(h.id, h.score) for h in oracle.text_search(Kind.ENTITY, "alpha beta", k, scope)]
        assert ours[0][0] == "b0"  # the rewritten document leads


def pack_state(server: EmbeddedPostgres, schema: str) -> tuple[int, int, int]:
    """(upto, stale records, postings written since) of the entities' packed postings."""
    upto = f"(SELECT coalesce(max(upto), 0) FROM \"{schema}\".packed WHERE kind = 'entity')"
    with admin(server) as conn:
        row = conn.execute(
            f'SELECT {upto}, (SELECT count(*) FROM "{schema}".entities_stale), '
            f'(SELECT count(*) FROM "{schema}".entities_terms WHERE seq > {upto})'
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_bm25_over_packed_postings_ranks_as_the_reference_through_rewrites_deletions_and_repacks(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch, data: st.DataObject
) -> None:
    """Random batches of new, rewritten and deleted entities, with repacks of the postings due after a few
    changes: after every batch, text search gives the reference's ids and scores, ties included, whatever is
    packed, stale (rewritten or deleted since the pack: its packed postings ignored) or written since."""
    from tkg.backends.postgres import terms
    from tkg.backends.reference import ReferenceStore

    monkeypatch.setattr(terms, "CHECK_EVERY", 1)
    monkeypatch.setattr(terms, "REPACK_MIN", data.draw(st.integers(1, 12), label="repack_min"))
    monkeypatch.setattr(terms, "REPACK_SHARE", 0.5)
    monkeypatch.setattr(terms, "STALE_MIN", data.draw(st.integers(1, 12), label="stale_min"))
    words = ["coffee", "morning", "office", "espresso", "lisbon", "violin", "glacier", "kyoto"]
    oracle = ReferenceStore(dim=DIM)
    schema = new_postgres_schema()
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as store:
        stored: dict[str, Entity] = {}
        for step in range(data.draw(st.integers(2, 6), label="batches")):
            puts, deletes = [], []
            for _ in range(data.draw(st.integers(1, 8))):
                rid = f"e{data.draw(st.integers(0, 14))}"
                if rid in stored and data.draw(st.booleans()):
                    if all(d[1] != rid for d in deletes) and all(p.id != rid for p in puts):
                        deletes.append(("entity", rid))
                    continue
                summary = " ".join(data.draw(st.lists(st.sampled_from(words), max_size=6)))
                if any(d[1] == rid for d in deletes):
                    continue
                puts = [p for p in puts if p.id != rid]
                puts.append(Entity(id=rid, group_id="gh"[int(rid[1:]) % 2], name=rid, created_at=T0, summary=summary))
            batch = WriteBatch(puts=puts, deletes=deletes)
            for target in (store, oracle):
                target.write(batch)
            if data.draw(st.booleans(), label="flush"):
                store.flush()  # else the searches race the repack the write may have asked for
            for p in puts:
                stored[p.id] = p
            for _, rid in deletes:
                stored.pop(rid, None)
            for query in ("coffee espresso", "morning office lisbon violin", "kyoto", "glacier coffee office"):
                for groups in (["g"], None):
                    scope = make_scope(T0 + timedelta(days=1), groups)
                    for k in (1, 3, 20):
                        ours = [(h.id, h.score) for h in store.text_search(Kind.ENTITY, query, k, scope)]
                        theirs = [(h.id, h.score) for h in oracle.text_search(Kind.ENTITY, query, k, scope)]
                        assert ours == theirs, (step, query, groups, k)


def test_bm25_searches_packs_stale_records_and_new_postings_at_once(server: EmbeddedPostgres, monkeypatch) -> None:
    """One state with all three parts at once -- postings packed, records rewritten and deleted since (stale), and
    records written since -- ranks as the reference."""
    from tkg.backends.postgres import terms
    from tkg.backends.reference import ReferenceStore

    monkeypatch.setattr(terms, "CHECK_EVERY", 1)
    monkeypatch.setattr(terms, "REPACK_MIN", 10)
    monkeypatch.setattr(terms, "STALE_MIN", 10)
    oracle = ReferenceStore(dim=DIM)
    schema = new_postgres_schema()
    entities = [
        Entity(id=f"e{i}", group_id="g", name=f"E{i}", created_at=T0, summary=" ".join(["coffee"] * (1 + i % 3)))
        for i in range(12)
    ]
    batches = [
        WriteBatch(puts=entities),  # 12 >= 10 behind: packed
        WriteBatch(puts=[dataclasses.replace(entities[2], summary="espresso coffee coffee coffee")]),
        WriteBatch(deletes=[("entity", "e5")]),
        WriteBatch(puts=[Entity(id="n1", group_id="g", name="N1", created_at=T0, summary="coffee espresso")]),
    ]
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as store:
        for batch in batches:
            store.write(batch)
            oracle.write(batch)
            store.flush()
        upto, stale, since = pack_state(server, schema)
        assert upto > 0 and stale == 2 and since == 3  # e2 and e5 stale; n1's postings since (name, summary)
        scope = make_scope(T0 + timedelta(days=1), ["g"])
        for query in ("coffee", "espresso", "coffee espresso"):
            ours = [(h.id, h.score) for h in store.text_search(Kind.ENTITY, query, 20, scope)]
            assert ours == [(h.id, h.score) for h in oracle.text_search(Kind.ENTITY, query, 20, scope)]
        assert "e5" not in [h.id for h in store.text_search(Kind.ENTITY, "coffee", 20, scope)]


def test_a_search_is_sent_only_the_packs_it_does_not_hold_and_never_uses_those_of_an_older_generation(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store keeps the packs its searches read (.pack_cache): the next search of the same terms is sent none of
    them. Once another store has rewritten records and repacked (a worker's repack, then an exclusive one, as a
    load runs it), the packs held are of an older generation: the server sends the new ones and the search ranks as
    the reference."""
    from tkg.backends.postgres import search as pg_search
    from tkg.backends.postgres import terms
    from tkg.backends.reference import ReferenceStore
    from tkg.tokens import tokenize

    monkeypatch.setattr(terms, "CHECK_EVERY", 1)
    monkeypatch.setattr(terms, "REPACK_MIN", 1)
    monkeypatch.setattr(terms, "STALE_MIN", 1)
    sent: list[set[str]] = []
    read_postings = pg_search.read_postings

    def spy(terms_: Any, rows: Any, held: Any) -> Any:
        sent.append({row[1] for row in rows if row[0] == 1})
        return read_postings(terms_, rows, held)

    monkeypatch.setattr(pg_search, "read_postings", spy)
    oracle = ReferenceStore(dim=DIM)
    schema = new_postgres_schema()
    scope = make_scope(T0 + timedelta(days=1), ["g"])
    entities = [
        Entity(id=f"e{i}", group_id="g", name=f"E{i}", created_at=T0, summary=["coffee", "coffee espresso"][i % 2])
        for i in range(8)
    ]

    def ranked(store: Any, query: str) -> list[tuple[str, float]]:
        return [(h.id, h.score) for h in store.text_search(Kind.ENTITY, query, 10, scope)]

    with (
        PostgresStore(server.dsn, dim=DIM, schema=schema) as reader,
        PostgresStore(server.dsn, dim=DIM, schema=schema) as writer,
    ):
        for batch in (WriteBatch(puts=entities),):
            writer.write(batch)
            oracle.write(batch)
        writer.flush()
        assert ranked(reader, "coffee espresso") == ranked(oracle, "coffee espresso")
        both = set(tokenize("coffee espresso"))  # as stemmed
        assert sent[-1] == both
        assert reader._pack_cache.stats()["packs"] == 2
        assert ranked(reader, "espresso coffee") == ranked(oracle, "espresso coffee")
        assert sent[-1] == set()  # both held
        assert ranked(reader, "espresso tea") == ranked(oracle, "espresso tea")
        assert sent[-1] == set()  # "tea" has no pack: nothing to send
        changes = [
            WriteBatch(puts=[dataclasses.replace(entities[0], summary="espresso espresso")]),
            WriteBatch(deletes=[("entity", "e3")]),
            WriteBatch(puts=[Entity(id="n1", group_id="g", name="N1", created_at=T0, summary="coffee coffee")]),
        ]
        for batch in changes:
            writer.write(batch)
            oracle.write(batch)
        writer.flush()  # repacked on the writer's worker: stale marks gone, the new records packed
        for query in ("coffee espresso", "espresso", "coffee"):
            assert ranked(reader, query) == ranked(oracle, query), query
        assert sent[-3] == both  # a new generation: sent again
        assert sent[-1] == set()
        batch = WriteBatch(puts=[dataclasses.replace(entities[1], summary="coffee")])
        for target in (writer, oracle):
            target.write(batch)
        with writer._connection().transaction(), writer._connection().cursor() as cur:
            terms.repack(cur, writer._q, Kind.ENTITY, schema)  # exclusive, as a load runs it
        assert ranked(reader, "coffee espresso") == ranked(oracle, "coffee espresso")
        assert sent[-1] == both


def test_a_pack_cache_keeps_one_generation_per_kind_within_its_bound() -> None:
    from tkg.backends.postgres.pack_cache import PackCache

    def pack(n: int) -> Any:
        return np.zeros(n, dtype=[("seq", ">i8"), ("tf", ">i4"), ("dl", ">i4")])

    cache = PackCache(10_000)
    cache.keep(Kind.FACT, 3, {"a": pack(100), "b": pack(100)})  # 1,600 bytes each, plus the overhead
    assert cache.held(Kind.FACT, ["a", "b", "c"]).gen == 3
    assert set(cache.held(Kind.FACT, ["a", "b", "c"]).packs) == {"a", "b"}
    assert cache.held(Kind.ENTITY, ["a"]).gen == -1
    cache.keep(Kind.FACT, 2, {"c": pack(1)})  # a search of an older snapshot: not kept
    assert set(cache.held(Kind.FACT, ["a", "b", "c"]).packs) == {"a", "b"}
    cache.held(Kind.FACT, ["a"])  # a used last
    cache.keep(Kind.FACT, 3, {f"t{i}": pack(100) for i in range(4)})
    assert set(cache.held(Kind.FACT, ["a", "b", "t0", "t1", "t2", "t3"]).packs) == {"a", "t0", "t1", "t2", "t3"}
    assert cache.stats()["bytes"] <= 10_000
    cache.keep(Kind.FACT, 3, {"huge": pack(1000)})  # more than the bound alone: not kept, nothing dropped for it
    assert "huge" not in cache.held(Kind.FACT, ["huge"]).packs and cache.stats()["packs"] == 5
    cache.keep(Kind.FACT, 4, {"b": pack(10)})  # a newer generation replaces the kind's packs
    held = cache.held(Kind.FACT, ["a", "b"])
    assert held.gen == 4 and set(held.packs) == {"b"} and cache.stats()["packs"] == 1
    off = PackCache(0)
    off.keep(Kind.FACT, 1, {"a": pack(1)})
    assert off.held(Kind.FACT, ["a"]).packs == {} and off.stats() == {"packs": 0, "bytes": 0}


@pytest.mark.parametrize("bad", [-1, 2**20 + 1, 1.5, "64"])
def test_pack_cache_mb_is_checked(server: EmbeddedPostgres, bad: Any) -> None:
    with pytest.raises(ValidationError, match="pack_cache_mb"):
        PostgresStore(server.dsn, dim=DIM, schema=new_postgres_schema(), pack_cache_mb=bad)


def test_a_repack_cut_waits_for_a_write_in_flight_and_loses_none_of_its_postings(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write holds the packs' lock shared from its first statement: the cut of a repack started while the write is
    in flight (its record already has its seq, lower than that of a record another store wrote and committed
    since) waits for it, so the write's postings are packed or above the new upto, never lost between the two."""
    from tkg.backends.postgres import terms
    from tkg.backends.postgres import writes as pg_writes

    schema = new_postgres_schema()
    inside, release = threading.Event(), threading.Event()
    real = pg_writes.add_postings

    def slow(cur: Any, q: Any, kind: Kind, records: Any, delta: Any) -> None:
        real(cur, q, kind, records, delta)
        if any(r.id == "slow" for r in records):
            inside.set()
            assert release.wait(30)

    monkeypatch.setattr(pg_writes, "add_postings", slow)
    with (
        PostgresStore(server.dsn, dim=DIM, schema=schema) as first,
        PostgresStore(server.dsn, dim=DIM, schema=schema) as second,
        admin(server) as packer,
    ):
        slow_one = Entity(id="slow", group_id="g", name="Slow", created_at=T0, summary="violin")
        writer = threading.Thread(target=first.write, args=(WriteBatch(puts=[slow_one]),))
        writer.start()
        assert inside.wait(30)
        second.write(WriteBatch(puts=[Entity(id="fast", group_id="g", name="Fast", created_at=T0, summary="violin")]))
        steps = terms.repack_steps(packer, second._q, Kind.ENTITY, schema)
        cutter = threading.Thread(target=next, args=(steps,))  # runs the cut
        cutter.start()
        with admin(server) as conn:  # the cut waits on the advisory lock the write holds
            for _ in range(3000):
                waiting = conn.execute(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                ).fetchone()
                if waiting and waiting[0]:
                    break
                threading.Event().wait(0.01)
            assert waiting and waiting[0] == 1
        release.set()
        writer.join(30)
        cutter.join(30)
        assert list(steps) == ["snapshot", "built", "swapped"]
        assert pack_state(server, schema)[0] > 0
        scope = make_scope(T0 + timedelta(days=1), ["g"])
        assert sorted(h.id for h in second.text_search(Kind.ENTITY, "violin", 10, scope)) == ["fast", "slow"]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.data())
def test_writes_between_the_steps_of_a_repack_rank_as_the_reference_and_never_wait(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch, data: st.DataObject
) -> None:
    """A repack runs beside the writers: new, rewritten and deleted records written between any of its steps (after
    the cut, inside the build's snapshot before and after it packs, after the swap) are neither lost nor counted
    twice -- every search after every write gives the reference's ids and scores -- and no write waits for the
    repack (a write that did would hang this single thread: the statement timeout fails it instead)."""
    from tkg.backends.postgres import terms
    from tkg.backends.reference import ReferenceStore

    words = ["coffee", "morning", "office", "espresso", "lisbon", "violin"]
    oracle = ReferenceStore(dim=DIM)
    schema = new_postgres_schema()
    stored: set[str] = set()
    scope = make_scope(T0 + timedelta(days=1), None)

    def entity(rid: str) -> Entity:
        summary = " ".join(data.draw(st.lists(st.sampled_from(words), max_size=5)))
        return Entity(id=rid, group_id="g", name=rid, created_at=T0, summary=summary)

    def change(store: PostgresStore) -> None:
        rid = f"e{data.draw(st.integers(0, 4))}"
        batch = (
            WriteBatch(deletes=[("entity", rid)])
            if rid in stored and data.draw(st.booleans())
            else WriteBatch(puts=[entity(rid)])
        )
        for target in (store, oracle):
            target.write(batch)
        (stored.discard if batch.deletes else stored.add)(rid)
        for query in ("coffee espresso", "morning lisbon violin", "office"):
            ours = [(h.id, h.score) for h in store.text_search(Kind.ENTITY, query, 20, scope)]
            assert ours == [(h.id, h.score) for h in oracle.text_search(Kind.ENTITY, query, 20, scope)], query

    monkeypatch.setattr(terms, "REPACK_MIN", 10**9)  # the store's own checks never repack: the test's repacks do
    monkeypatch.setattr(terms, "STALE_MIN", 10**9)
    timeout = make_conninfo(server.dsn, options="-c statement_timeout=20s")  # a write that waited fails, not hangs
    with PostgresStore(timeout, dim=DIM, schema=schema) as store, admin(server) as packer:
        for _ in range(data.draw(st.integers(1, 4), label="first writes")):
            change(store)
        for _ in range(data.draw(st.integers(1, 3), label="repacks")):
            steps = []
            for step in terms.repack_steps(packer, store._q, Kind.ENTITY, schema):
                steps.append(step)
                for _ in range(data.draw(st.integers(0, 3), label=f"writes after {step}")):
                    change(store)
            assert steps == ["cut", "snapshot", "built", "swapped"]


def test_a_write_returns_while_its_repack_runs_and_a_failed_repack_is_logged_and_tried_again(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The repack a write asks for runs on the store's worker, after the write committed: the write returns while
    it packs (here held inside its build) and other writes go on; a repack that fails leaves the committed writes,
    is logged, and a later check repacks."""
    from tkg.backends.postgres import terms

    monkeypatch.setattr(terms, "CHECK_EVERY", 1)
    monkeypatch.setattr(terms, "REPACK_MIN", 1)
    real = terms.repack_steps
    inside, release = threading.Event(), threading.Event()

    def held(*args: Any) -> Any:
        for step in real(*args):
            if step == "built":
                inside.set()
                assert release.wait(30)
            yield step

    def broken(*args: Any) -> Any:
        raise psycopg.OperationalError("the server went away")
        yield  # a generator, as the real one

    schema = new_postgres_schema()
    scope = make_scope(T0 + timedelta(days=1), ["g"])
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as store:
        monkeypatch.setattr(terms, "repack_steps", held)
        store.write(WriteBatch(puts=[Entity(id="a", group_id="g", name="A", created_at=T0, summary="violin")]))
        assert inside.wait(30)  # the write has returned; its repack is under way
        store.write(WriteBatch(puts=[Entity(id="b", group_id="g", name="B", created_at=T0, summary="violin")]))
        assert [h.id for h in store.text_search(Kind.ENTITY, "violin", 5, scope)] == ["a", "b"]
        release.set()
        store.wait_for_maintenance()
        assert pack_state(server, schema)[0] > 0
        monkeypatch.setattr(terms, "repack_steps", broken)
        store.write(WriteBatch(puts=[Entity(id="c", group_id="g", name="C", created_at=T0, summary="violin")]))
        store.wait_for_maintenance()
        assert "repacking the entity postings failed (the write was committed)" in caplog.text
        assert pack_state(server, schema)[2] > 0  # c's postings not packed
        assert [h.id for h in store.text_search(Kind.ENTITY, "violin", 5, scope)] == ["a", "b", "c"]
        monkeypatch.setattr(terms, "repack_steps", real)
        store.flush()
        upto, stale, since = pack_state(server, schema)
        assert upto > 0 and stale == 0 and since == 0  # all three packed
        assert [h.id for h in store.text_search(Kind.ENTITY, "violin", 5, scope)] == ["a", "b", "c"]


def test_closing_a_store_cancels_its_repack_under_way_and_the_packs_in_use_stay_whole(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """close() does not wait for a long repack: the statement under way is cancelled, the half-built generation is
    never used, and the next store's repack drops it and packs."""
    import time

    from tkg.backends.postgres import terms

    monkeypatch.setattr(terms, "CHECK_EVERY", 1)
    monkeypatch.setattr(terms, "REPACK_MIN", 1)
    real = terms._pack
    started = threading.Event()

    def slow(cur: Any, q: Any, kind: Kind, gen: int, upto: int | None) -> None:
        real(cur, q, kind, gen, upto)
        if gen > 1:  # the store's second repack: the first (gen 1) packs "a"
            started.set()
            cur.execute("SELECT pg_sleep(60)")

    schema = new_postgres_schema()
    scope = make_scope(T0 + timedelta(days=1), ["g"])
    store = PostgresStore(server.dsn, dim=DIM, schema=schema)
    store.write(WriteBatch(puts=[Entity(id="a", group_id="g", name="A", created_at=T0, summary="violin")]))
    assert store.wait_for_maintenance(30)
    monkeypatch.setattr(terms, "_pack", slow)
    store.write(WriteBatch(puts=[Entity(id="b", group_id="g", name="B", created_at=T0, summary="violin viola")]))
    assert started.wait(30)
    began = time.perf_counter()
    store.close()
    assert time.perf_counter() - began < 10
    monkeypatch.setattr(terms, "_pack", real)
    with admin(server) as conn:
        gens = conn.execute(f"SELECT gen FROM \"{schema}\".packed WHERE kind = 'entity'").fetchall()
        assert gens == [(1,)]  # the cancelled repack swapped nothing
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as again:
        assert [h.id for h in again.text_search(Kind.ENTITY, "violin", 5, scope)] == ["a", "b"]
        again.flush()
        assert pack_state(server, schema)[2] == 0  # b packed too
        assert [h.id for h in again.text_search(Kind.ENTITY, "violin", 5, scope)] == ["a", "b"]


@pytest.mark.parametrize(
    ("limits", "count"),
    [
        ({"STALE_MIN": 3, "STALE_SHARE": 0.0}, 6),
        # a share of 1: all 12 records, were it not for STALE_MAX
        ({"STALE_MIN": 2, "STALE_SHARE": 1.0, "STALE_MAX": 3}, 12),
    ],
    ids=["stale_min", "stale_max"],
)
def test_enough_stale_records_alone_trigger_a_repack(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch, limits: dict[str, float], count: int
) -> None:
    """Rewritten records (stale: found by record, not by term, so dearer to a query) are repacked after fewer of
    them than new records need: here three rewrites, with no new record at all -- STALE_MIN of them, or STALE_MAX
    however many records the kind holds."""
    from tkg.backends.postgres import terms

    monkeypatch.setattr(terms, "CHECK_EVERY", 1)
    monkeypatch.setattr(terms, "REPACK_MIN", 5)
    for name, value in limits.items():
        monkeypatch.setattr(terms, name, value)
    schema = new_postgres_schema()
    entities = [Entity(id=f"e{i}", group_id="g", name=f"E{i}", created_at=T0, summary="coffee") for i in range(count)]
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as store:
        store.write(WriteBatch(puts=entities))
        store.wait_for_maintenance()
        upto = pack_state(server, schema)[0]
        assert upto > 0
        monkeypatch.setattr(terms, "REPACK_MIN", 10**6)  # from here only stale records can call for a repack
        for i, expected in ((0, 1), (1, 2), (2, 0)):
            store.write(WriteBatch(puts=[dataclasses.replace(entities[i], summary="tea")]))
            store.wait_for_maintenance()
            assert pack_state(server, schema) == (upto, expected, 0), i


def test_bm25_ranked_reads_the_stale_seqs_whatever_the_order_of_the_rows() -> None:
    """UNION ALL promises no order (a parallel plan interleaves its parts): packed postings that arrive before the
    row of stale seqs are filtered all the same, so a rewritten record counts once, with its current postings."""
    from tkg.backends.postgres.pack_cache import Held
    from tkg.backends.postgres.search import bm25_ranked, read_postings

    def packed(*postings: tuple[int, int, int]) -> bytes:
        return np.array(list(postings), dtype=[("seq", ">i8"), ("tf", ">i4"), ("dl", ">i4")]).tobytes()

    stats = (0, "1", 3, 9, np.array([2], dtype=">i8").tobytes())
    pack = (1, "coffee", None, None, packed((1, 1, 3), (2, 1, 3), (3, 2, 3)))
    fresh = (2, "coffee", None, None, packed((2, 3, 3)))
    want = bm25_ranked(["coffee"], read_postings(["coffee"], [stats, pack, fresh], Held()))
    assert list(want[0]) == [1, 2, 3]
    for rows in ([pack, stats, fresh], [fresh, pack, stats]):
        got = bm25_ranked(["coffee"], read_postings(["coffee"], rows, Held()))
        assert list(got[0]) == list(want[0]) and list(got[1]) == list(want[1])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from([0.5, 1.0, 1.25, 2.0, 3.5]), max_size=300),
    st.integers(1, 40),
)
def test_best_first_gives_every_document_once_best_first_in_growing_batches(scores: list[float], first: int) -> None:
    """The admission check of a BM25 search reads the documents in these batches until k pass: together they are
    every document, ranked by score then seq (as top_k ranks), the first batch of ``first`` and each later one up
    to three times as many as given before it (four times as many in all)."""
    from tkg.backends.postgres.search import best_first

    seqs = np.arange(len(scores), dtype=np.int64) * 3 + 7  # ascending, as bm25_ranked gives them
    values = np.array(scores, dtype=np.float32)
    batches = list(best_first(seqs, values, first))
    given_seqs = [int(s) for b, _ in batches for s in b]
    assert given_seqs == sorted(seqs.tolist(), key=lambda s: (-values[(s - 7) // 3], s))
    assert [float(v) for _, b in batches for v in b] == [float(values[(s - 7) // 3]) for s in given_seqs]
    sizes = [len(b) for b, _ in batches]
    assert sizes[0] == min(first, len(scores))
    for i in range(1, len(sizes)):
        assert 0 < sizes[i] <= 3 * sum(sizes[:i]) and (sizes[i] == 3 * sum(sizes[:i]) or i == len(sizes) - 1)


@pytest.mark.parametrize("admitted_set", [1024, 3, 1])
def test_episodes_as_of_an_early_time_are_the_best_of_the_few_it_admits(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch, admitted_set: int
) -> None:
    """As of a time before most episodes, the best documents are not admitted: the search finds the best of those
    that are, as the reference store does, whether the admitted records are read at once through the timeline
    index (few of them) or the best documents checked in batches (more than the store reads at once)."""
    from tkg.backends.postgres import search
    from tkg.backends.reference import ReferenceStore

    monkeypatch.setattr(search, "_ADMITTED_SET", admitted_set)
    # Later episodes say "tea" more often (so score higher); two groups, to keep the other one out.
    episodes = [
        Episode(
            id=f"{group}{i}",
            group_id=group,
            content=" ".join(["tea"] * (1 + i % 5) + ["with", f"friend{i % 3}", "at", "noon"]),
            source="text",
            reference_time=T0 + timedelta(days=i),
            created_at=T0 + timedelta(days=i),
        )
        for group in ("g", "h")
        for i in range(40)
    ]
    oracle = ReferenceStore(dim=DIM)
    with PostgresStore(server.dsn, dim=DIM, schema=new_postgres_schema()) as store:
        for s in (store, oracle):
            s.write(WriteBatch(puts=episodes))
        for day, query in ((2, "tea"), (6, "tea friend1"), (9, "tea noon"), (25, "tea friend2"), (-1, "tea")):
            scope = make_scope(T0 + timedelta(days=60), ["g"], as_of=T0 + timedelta(days=day, hours=1))
            for k in (1, 3, 10):
                want = oracle.text_search(Kind.EPISODE, query, k, scope)
                got = store.text_search(Kind.EPISODE, query, k, scope)
                assert [(h.id, round(h.score, 5)) for h in got] == [(h.id, round(h.score, 5)) for h in want], (
                    day,
                    query,
                    k,
                )
                assert all(h.id.startswith("g") and int(h.id[1:]) <= day for h in got)


def test_a_rewrite_that_keeps_the_search_text_keeps_its_postings_and_marks_nothing_stale(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a record's search fields (tkg.models.SEARCH_FIELDS) make its search text: a rewrite of other fields
    keeps its packed postings in use; one of any search field (alias, summary) is indexed again, the old postings
    marked stale. Searches rank as the reference throughout."""
    from tkg.backends.postgres import terms
    from tkg.backends.reference import ReferenceStore

    monkeypatch.setattr(terms, "REPACK_MIN", 2)
    monkeypatch.setattr(terms, "STALE_MIN", 10**6)
    monkeypatch.setattr(terms, "STALE_MAX", 10**6)
    oracle = ReferenceStore(dim=DIM)
    schema = new_postgres_schema()
    entities = [Entity(id=f"e{i}", group_id="g", name=f"E{i}", created_at=T0, summary="coffee") for i in range(3)]
    scope = make_scope(T0 + timedelta(days=1), ["g"])
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as store:

        def write(batch: WriteBatch) -> None:
            store.write(batch)
            oracle.write(batch)
            store.wait_for_maintenance()
            for query in ("coffee", "tea", "mocha", "coffee tea mocha"):
                ours = [(h.id, h.score) for h in store.text_search(Kind.ENTITY, query, 10, scope)]
                assert ours == [(h.id, h.score) for h in oracle.text_search(Kind.ENTITY, query, 10, scope)], query

        write(WriteBatch(puts=entities))
        upto = pack_state(server, schema)[0]
        assert upto > 0
        write(WriteBatch(puts=[dataclasses.replace(entities[0], labels=("Person",), attributes={"age": 3})]))
        assert pack_state(server, schema) == (upto, 0, 0)
        write(WriteBatch(puts=[dataclasses.replace(entities[1], aliases=("Mocha",))]))
        assert pack_state(server, schema)[1] == 1
        write(WriteBatch(puts=[dataclasses.replace(entities[2], summary="tea")]))
        assert pack_state(server, schema)[1] == 2


def test_a_store_checks_the_packs_at_its_first_write(server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch) -> None:
    """A short-lived process writes few postings: its store checks how far the packs are behind at its first write
    of a kind, not only after CHECK_EVERY postings, so records written by others get packed."""
    from tkg.backends.postgres import terms

    monkeypatch.setattr(terms, "REPACK_MIN", 10)
    monkeypatch.setattr(terms, "CHECK_EVERY", 10**6)
    schema = new_postgres_schema()
    entities = [Entity(id=f"e{i}", group_id="g", name=f"E{i}", created_at=T0, summary="coffee") for i in range(13)]
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as first:
        first.write(WriteBatch(puts=entities[:6]))  # checked: 6 behind, under 10
        first.wait_for_maintenance()
        first.write(WriteBatch(puts=entities[6:12]))  # not checked again before 10**6 postings
        first.wait_for_maintenance()
        assert pack_state(server, schema)[0] == 0
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as second:
        second.write(WriteBatch(puts=entities[12:]))
        second.wait_for_maintenance()
        assert pack_state(server, schema)[0] > 0


def test_a_delete_during_a_rewrite_of_the_same_record_leaves_none_of_its_postings(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delete locks the record's row before it drops the postings: a rewrite of that record in flight in another
    store finishes first, and the delete then drops the rewrite's postings too (it used to drop the old ones only,
    leaving the new ones behind, counted by every later search)."""
    import threading

    from tkg.backends.postgres import writes as pg_writes

    schema = new_postgres_schema()
    inside, release = threading.Event(), threading.Event()
    real = pg_writes.add_postings

    def slow(cur: Any, q: Any, kind: Kind, records: Any, delta: Any) -> None:
        real(cur, q, kind, records, delta)
        if any(r.id == "x" and r.summary == "violin" for r in records):
            inside.set()
            assert release.wait(30)

    monkeypatch.setattr(pg_writes, "add_postings", slow)
    x = Entity(id="x", group_id="g", name="X", created_at=T0, summary="coffee")
    with (
        PostgresStore(server.dsn, dim=DIM, schema=schema) as first,
        PostgresStore(server.dsn, dim=DIM, schema=schema) as second,
    ):
        first.write(WriteBatch(puts=[x]))
        rewriter = threading.Thread(
            target=first.write, args=(WriteBatch(puts=[dataclasses.replace(x, summary="violin")]),)
        )
        rewriter.start()
        assert inside.wait(30)
        deleter = threading.Thread(target=second.write, args=(WriteBatch(deletes=[("entity", "x")]),))
        deleter.start()
        with admin(server) as conn:  # the delete waits for the rewrite's row lock
            for _ in range(3000):
                waiting = conn.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()
                if waiting and waiting[0]:
                    break
                threading.Event().wait(0.01)
        release.set()
        rewriter.join(30)
        deleter.join(30)
        with admin(server) as conn:
            left = conn.execute(f'SELECT count(*) FROM "{schema}".entities_terms').fetchone()
        assert left == (0,)
        scope = make_scope(T0 + timedelta(days=1), ["g"])
        assert second.text_search(Kind.ENTITY, "violin", 5, scope) == []


# -- bad input ----------------------------------------------------------------------------------------------------
def test_unreachable_dsn() -> None:
    with pytest.raises(BackendError, match=r"cannot connect to PostgreSQL at .*127.0.0.1.*Is the server running"):
        PostgresStore("postgresql://tkg:secret@127.0.0.1:1/tkg", dim=DIM)
    with pytest.raises(BackendError, match="cannot connect") as caught:
        PostgresStore("host=/nonexistent/socket/dir dbname=tkg password=secret", dim=DIM)
    assert "secret" not in str(caught.value)
    with pytest.raises(BackendError, match="malformed"):
        PostgresStore("this is = not a = dsn 'x", dim=DIM)


def test_wrong_credentials(server: EmbeddedPostgres) -> None:
    with admin(server) as conn:
        conn.execute("DROP ROLE IF EXISTS tkg_pw")
        conn.execute("CREATE ROLE tkg_pw LOGIN PASSWORD 'right'")
    hba = server.data_dir / "pg_hba.conf"
    rules = hba.read_text()
    if "tkg_pw" not in rules:  # the embedded server trusts every local user: ask this one for a password
        hba.write_text("local all tkg_pw scram-sha-256\n" + rules)
        with admin(server) as conn:
            conn.execute("SELECT pg_reload_conf()")
    dsn = psycopg.conninfo.make_conninfo(server.dsn, user="tkg_pw", password="wrong")
    with pytest.raises(BackendError, match=r"refused the credentials.*Check the user name and password") as caught:
        PostgresStore(dsn, dim=DIM)
    assert "wrong" not in str(caught.value)
    unknown = psycopg.conninfo.make_conninfo(server.dsn, user="nobody_here")
    with pytest.raises(BackendError, match="refused the credentials"):
        PostgresStore(unknown, dim=DIM)


def test_database_without_the_vector_extension(server: EmbeddedPostgres) -> None:
    dsn = server.create_database("novector")
    with admin(server) as conn:
        conn.execute("DROP ROLE IF EXISTS tkg_plain")
        conn.execute("CREATE ROLE tkg_plain LOGIN")  # not a superuser: may not CREATE EXTENSION vector
        conn.execute("GRANT CREATE ON DATABASE novector TO tkg_plain")
    plain = psycopg.conninfo.make_conninfo(dsn, user="tkg_plain")
    with pytest.raises(
        BackendError, match="pgvector is installed on the server but not enabled in database 'novector'"
    ):
        PostgresStore(plain, dim=DIM, schema="nothing_here")
    with admin(server, dsn) as conn:
        assert conn.execute("SELECT to_regnamespace('nothing_here')").fetchone() == (None,)
        conn.execute("DROP EXTENSION IF EXISTS vector")


def test_vectors_stay_in_their_rows(server: EmbeddedPostgres) -> None:
    """A 768-d vector (3 kB) makes a row pass PostgreSQL's 2 kB TOAST threshold; the schema keeps such a row whole
    (nothing of it in the TOAST table), so a scan reads one page per row, not the row and two of the TOAST's."""
    schema = new_postgres_schema()
    with PostgresStore(server.dsn, dim=768, schema=schema) as store:
        emb = HashEmbedder(dim=768)
        people = [
            Entity(id=f"e{i}", group_id="g", name=f"P{i}", created_at=T0, name_embedding=emb.embed([f"P{i}"])[0])
            for i in range(2)
        ]
        facts = [
            Fact(
                id=f"f{i}",
                group_id="g",
                source_id="e0",
                target_id="e1",
                relation="KNOWS",
                fact=f"P0 knows P1 {i}",
                created_at=T0,
                embedding=emb.embed([f"P0 knows P1 {i}"])[0],
            )
            for i in range(40)
        ]
        store.write(WriteBatch(puts=[*people, *facts]))
        assert store.get(Kind.FACT, ["f7"]) == [facts[7]]
    with admin(server) as conn:
        for table in ("facts", "entities"):
            toast = conn.execute(
                f"SELECT pg_relation_size(reltoastrelid) FROM pg_class WHERE oid = '\"{schema}\".{table}'::regclass"
            ).fetchone()
            assert toast == (0,), table


def test_values_postgresql_cannot_hold_are_refused_before_writing(store: PostgresStore) -> None:
    ok = Entity(id="e1", group_id="g", name="Ann", created_at=T0)
    with pytest.raises(ValidationError, match="NUL"):
        store.write(WriteBatch(puts=[ok, dataclasses.replace(ok, id="e2", name="A\x00nn")]))
    with pytest.raises(ValidationError, match="JSON-like"):
        store.write(WriteBatch(puts=[ok, dataclasses.replace(ok, id="e3", attributes={"x": object()})]))
    assert store.count(Kind.ENTITY) == 0


def test_connection_dropped_mid_episode_leaves_nothing(server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch):
    schema = new_postgres_schema()
    store = PostgresStore(server.dsn, dim=DIM, schema=schema)
    memory = Memory(store, embedder=EMB, clock=FixedClock(NOW))
    memory.add_facts([FactInput("Alice", "KNOWS", "Bob")], group_id="g")
    before = table_counts(server, schema)
    upsert = PostgresStore._upsert
    dropped: list[str] = []

    def drop_after_first_table(self: PostgresStore, cur: Any, kind: Kind, items: Any, indexed: bool) -> None:
        upsert(self, cur, kind, items, indexed)
        if not dropped:  # the episode row is written inside the transaction; now the connection dies
            dropped.append(kind.value)
            with admin(server) as killer:
                killer.execute("SELECT pg_terminate_backend(%s)", [cur.connection.info.backend_pid])

    monkeypatch.setattr(PostgresStore, "_upsert", drop_after_first_table)
    with pytest.raises(BackendError, match=r"connection to PostgreSQL was lost.*nothing of this batch was written"):
        memory.add_episode("Alice: Bob and I went climbing", group_id="g", episode_id="climb")
    assert dropped == ["episode"]
    assert table_counts(server, schema) == before
    monkeypatch.undo()
    memory.add_episode("Alice: Bob and I went climbing", group_id="g", episode_id="climb")  # reconnects
    assert memory.get_many(Kind.EPISODE, ["climb"])[0] is not None
    assert store.count(Kind.EPISODE) == before["episodes"] + 1
    store.close()


def test_a_write_the_server_committed_before_its_connection_failed_is_not_reported_unwritten(
    server: EmbeddedPostgres, store: PostgresStore, monkeypatch: pytest.MonkeyPatch, caplog: Any
) -> None:
    """The commit reaches the server, which commits, and the client then loses the answer (the connection dropped,
    the pipeline's end failing): the write was reported as "nothing of this batch was written", and a caller who
    wrote it again stored it twice. The transaction's id is looked up instead: committed, the write stands."""
    memory = Memory(store, embedder=EMB, clock=FixedClock(NOW))
    memory.add_facts([FactInput("Alice", "KNOWS", "Bob")], group_id="g")
    conn = store._connection()
    pipeline = conn.pipeline

    depth = [0]

    @contextlib.contextmanager
    def answer_lost_after_the_commit() -> Iterator[Any]:
        """The connection's pipeline, whose outermost use fails once it has ended (the commit sent, run and
        answered); nested uses (psycopg's own, for the commit) are the real pipeline."""
        depth[0] += 1
        try:
            with pipeline() as inside:
                yield inside
            if depth[0] == 1:
                raise psycopg.OperationalError("server closed the connection unexpectedly")
        finally:
            depth[0] -= 1

    monkeypatch.setattr(conn, "pipeline", answer_lost_after_the_commit)
    added = memory.add_episode("Alice: I met Carol.", group_id="g", episode_id="met", extract=False)
    assert added.episode.id == "met" and "the server had committed it" in caplog.text
    monkeypatch.undo()
    assert memory.get_many(Kind.EPISODE, ["met"])[0] is not None
    # not committed (the connection lost inside the transaction): the failure stands, as
    # test_connection_dropped_mid_episode_leaves_nothing checks


def test_a_write_under_a_group_lock_its_dropped_connection_let_go_is_refused(
    server: EmbeddedPostgres, store: PostgresStore, caplog: Any
) -> None:
    """A group lock is a session lock of its own connection: when that connection drops while the lock is held
    (during an episode's LLM call, say), the server lets it go and another process may write the group. The holder
    went on writing as if it held it; now its writes check the lock in their transaction and are refused."""
    ann = Entity(id="e1", group_id="g", name="Ann", created_at=T0)
    bob = Entity(id="e2", group_id="g", name="Bob", created_at=T0)
    with store.group_lock("g"):
        store.write(WriteBatch(puts=[ann]))  # held: written
        assert store._lock_conn is not None
        with admin(server) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", [store._lock_conn.info.backend_pid])
        with pytest.raises(BackendError, match=r"lock of group\(s\) \['g'\] was lost while held"):
            store.write(WriteBatch(puts=[bob]))
    assert "could not release the lock of group 'g'" in caplog.text  # its connection is gone, and the lock
    assert [e.id for e in store.scan(Kind.ENTITY)] == ["e1"]
    with store.group_lock("g"):  # taken again on a new connection
        store.write(WriteBatch(puts=[bob]))
    assert store.count(Kind.ENTITY) == 2


def test_reads_survive_a_dropped_connection(server: EmbeddedPostgres, store: PostgresStore) -> None:
    store.write(WriteBatch(puts=[Entity(id="e1", group_id="g", name="Ann", created_at=T0)]))
    with admin(server) as killer:
        killer.execute("SELECT pg_terminate_backend(%s)", [store._connection().info.backend_pid])
    assert store.count(Kind.ENTITY) == 1


# -- a search's candidate lists on several connections -----------------------------------------------------------
def _searchable(store: PostgresStore) -> tuple[list[Candidates], str, np.ndarray, Any]:
    store.write(WriteBatch(puts=searchable_records(EMB)))
    asks = [Candidates(m, kind, 5) for kind in (Kind.FACT, Kind.ENTITY) for m in ("cosine", "bm25")]
    return asks, "Bob in city 3", EMB.embed(["Bob in city 3"])[0], make_scope(NOW, ["g"])


def _meeting_text_searches(store: PostgresStore) -> set[int]:
    """Make each text search of ``store`` wait, inside a read on its connection, until another one is in a read too
    (BrokenBarrierError after 10 s): two text searches asked at once pass only if read on two connections at
    once. Returns the set the server process ids of those reads go to."""
    barrier = threading.Barrier(2, timeout=10)
    pids: set[int] = set()
    original = store.text_search

    def meet(cur: psycopg.Cursor[Any]) -> int:
        pid = int(cur.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        barrier.wait()  # after the statement: a read retried on a new connection meets the other once
        return pid

    def text_search(kind: Kind, q: str, k: int, scope: Any) -> list[Any]:
        pids.add(store._read(meet))
        return original(kind, q, k, scope)

    store.text_search = text_search  # type: ignore[method-assign]
    return pids


def test_a_search_reads_its_candidate_lists_on_several_connections_at_once(server: EmbeddedPostgres) -> None:
    """Each list waits for the others at a barrier: read one after the other they would never get past it. The
    answers are those of a store that reads them in turn, and the reader connection is kept for the next search."""
    with PostgresStore(server.dsn, dim=DIM, schema=new_postgres_schema(), search_connections=2) as store:
        asks, query, vector, sc = _searchable(store)
        with PostgresStore(server.dsn, dim=DIM, schema=store.schema, search_connections=1) as alone:
            expected = alone.candidates(asks, query, vector, sc)
            assert not alone._spare and alone._workers is None  # one connection: no reader, no thread
        pids = _meeting_text_searches(store)
        bm25 = [a for a in asks if a.method == "bm25"]
        assert store.candidates(bm25, query, vector, sc) == [
            h for a, h in zip(asks, expected, strict=True) if a.method == "bm25"
        ]
        assert len(pids) == 2  # two server sessions
        del store.text_search
        assert len(store._spare) == 1
        assert store.candidates(asks, query, vector, sc) == expected
        spare = store._spare[0]
    assert spare.closed  # close() closes the reader connections too


def test_a_reader_connection_that_dropped_or_cannot_open_leaves_searches_answering(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    with PostgresStore(server.dsn, dim=DIM, schema=new_postgres_schema(), search_connections=3) as store:
        asks, query, vector, sc = _searchable(store)
        expected = [
            store.vector_search(a.kind, vector, a.k, sc)
            if a.method == "cosine"
            else store.text_search(a.kind, query, a.k, sc)
            for a in asks
        ]
        assert store.candidates(asks, query, vector, sc) == expected
        assert store._spare
        killed = {conn.info.backend_pid for conn in store._spare}
        with admin(server) as killer:
            for pid in killed:
                killer.execute("SELECT pg_terminate_backend(%s)", [pid])
        pids = _meeting_text_searches(store)  # a reader must take one of the two text searches
        bm25 = [a for a in asks if a.method == "bm25"]
        assert store.candidates(bm25, query, vector, sc) == [
            h for a, h in zip(asks, expected, strict=True) if a.method == "bm25"
        ]
        assert len(pids) == 2 and not pids & killed  # read on a new connection, not on a dead one
        del store.text_search
        assert store.candidates(asks, query, vector, sc) == expected
        for conn in store._spare:
            conn.close()
        from tkg.backends.postgres import session

        def refused(*args: Any, **kwargs: Any) -> Any:
            raise BackendError("too many clients already")

        monkeypatch.setattr(session, "connect", refused)  # no new connection: the store's own reads them all
        assert store.candidates(asks, query, vector, sc) == expected


def test_a_search_does_not_wait_for_a_reader_thread_busy_elsewhere(server: EmbeddedPostgres) -> None:
    """With the store's one reader thread held up (another search's lists, here a task that waits), a search reads
    all its lists on its own connection and returns, instead of waiting for that thread to come and find nothing
    left to read."""
    with PostgresStore(server.dsn, dim=DIM, schema=new_postgres_schema(), search_connections=2) as store:
        asks, query, vector, sc = _searchable(store)
        expected = store.candidates(asks, query, vector, sc)
        assert store._workers is not None
        release = threading.Event()
        busy = store._workers.submit(release.wait, 30)
        answers: list[Any] = []
        search = threading.Thread(target=lambda: answers.append(store.candidates(asks, query, vector, sc)))
        try:
            search.start()
            search.join(10)
            assert not search.is_alive() and answers == [expected]
        finally:
            release.set()
            busy.result()
            search.join()


def test_every_connection_of_a_store_plans_without_parallel_workers(server: EmbeddedPostgres) -> None:
    """Starting a parallel plan's workers cost more than tkg's short reads (3-6 ms for a search's postings at 1M
    facts, read in 0.3 ms without): the store's own connection and its reader connections plan without them."""
    with PostgresStore(server.dsn, dim=DIM, schema=new_postgres_schema(), search_connections=2) as store:
        asks, query, vector, sc = _searchable(store)
        store.candidates(asks, query, vector, sc)
        connections = [store._connection(), *store._spare]
        assert len(connections) == 2
        for conn in connections:
            assert conn.execute("SHOW max_parallel_workers_per_gather").fetchone() == ("0",)


def test_search_connections_must_be_a_small_positive_integer(server: EmbeddedPostgres) -> None:
    for wrong in (0, 17, 1.5, "2"):
        with pytest.raises(ValidationError, match="search_connections"):
            PostgresStore(server.dsn, dim=DIM, schema=new_postgres_schema(), search_connections=wrong)  # type: ignore[arg-type]


# -- vectors indexed off the writers' path -----------------------------------------------------------------------
def _unindexed(server: EmbeddedPostgres, schema: str) -> dict[str, int]:
    """Rows not in their table's HNSW index yet, by table (read on a connection of its own: also after a store
    closed)."""
    with admin(server) as conn:
        return {
            table: conn.execute(f'SELECT count(*) FROM "{schema}".{table} WHERE NOT indexed').fetchone()[0]  # type: ignore[index]
            for table, _ in pg_schema.VECTOR_TABLES.values()
        }


def _hnsw_definitions(server: EmbeddedPostgres, schema: str) -> list[str]:
    with admin(server) as conn:
        return [
            conn.execute("SELECT pg_get_indexdef(%s::regclass)", [f'"{schema}".{table}_hnsw']).fetchone()[0]  # type: ignore[index]
            for table, _ in pg_schema.VECTOR_TABLES.values()
        ]


def _people(n: int, seed: int, start: int = 0) -> list[Entity]:
    rng = np.random.default_rng(seed)
    return [
        Entity(
            id=f"e{i}",
            group_id="g",
            name=f"E{i}",
            created_at=T0,
            name_embedding=rng.standard_normal(DIM).astype(np.float32),
        )
        for i in range(start, start + n)
    ]


def _same_cosine_answers(store: PostgresStore, oracle: Any, seed: int) -> None:
    rng = np.random.default_rng(seed)
    scope = make_scope(T0 + timedelta(days=1), ["g"])
    for _ in range(12):
        vector = rng.standard_normal(DIM).astype(np.float32)
        for k in (1, 5, 30):
            ours, theirs = (
                store.vector_search(Kind.ENTITY, vector, k, scope),
                oracle.vector_search(Kind.ENTITY, vector, k, scope),
            )
            assert [h.id for h in ours] == [h.id for h in theirs]
            assert [h.score for h in ours] == pytest.approx([h.score for h in theirs], abs=1e-5)


def test_a_write_puts_its_rows_unindexed_and_searches_score_them_exactly_until_the_worker_indexes_them(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No HNSW insert runs in a writer's transaction (schema 10): the rows a write puts, new or rewritten, are out
    of the partial HNSW indexes until the store's worker marks them indexed, and a cosine search meanwhile scores
    them exactly beside the index walk: the reference store's answers before, during and after."""
    from tkg.backends.postgres import writes
    from tkg.backends.reference import ReferenceStore

    monkeypatch.setattr(writes, "INDEX_EVERY", 10**9)  # the worker is asked by flush() alone
    oracle = ReferenceStore(dim=DIM)
    with PostgresStore(server.dsn, dim=DIM, schema=new_postgres_schema()) as store:
        assert all(d.endswith("WHERE indexed") for d in _hnsw_definitions(server, store.schema))
        first = _people(60, seed=1)
        store.write(WriteBatch(puts=first))
        oracle.write(WriteBatch(puts=first))
        assert _unindexed(server, store.schema)["entities"] == 60
        _same_cosine_answers(store, oracle, seed=2)
        store.flush()
        assert _unindexed(server, store.schema)["entities"] == 0
        _same_cosine_answers(store, oracle, seed=2)
        moved = [dataclasses.replace(e, name_embedding=-e.name_embedding) for e in first[:5]]  # type: ignore[operator]
        batch = WriteBatch(puts=[*_people(20, seed=3, start=60), *moved])
        store.write(batch)
        oracle.write(batch)
        assert _unindexed(server, store.schema)["entities"] == 25  # the new rows and the rewritten ones
        assert store.stats()["unindexed_vectors"] == {"episode": 0, "entity": 25, "fact": 0, "community": 0}
        _same_cosine_answers(store, oracle, seed=4)
        store.flush()
        assert _unindexed(server, store.schema)["entities"] == 0
        _same_cosine_answers(store, oracle, seed=4)


def test_the_worker_indexes_a_kind_once_a_store_put_enough_of_its_rows_and_the_rest_on_close(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tkg.backends.postgres import writes

    monkeypatch.setattr(writes, "INDEX_EVERY", 8)
    with PostgresStore(server.dsn, dim=DIM, schema=new_postgres_schema()) as store:
        store.write(WriteBatch(puts=_people(5, seed=1)))
        assert store.wait_for_maintenance(30)
        assert _unindexed(server, store.schema)["entities"] == 5  # fewer than 8 since the last ask
        store.write(WriteBatch(puts=_people(3, seed=2, start=5)))
        assert store.wait_for_maintenance(30)
        assert _unindexed(server, store.schema)["entities"] == 0
        store.write(WriteBatch(puts=_people(2, seed=3, start=8)))
        assert _unindexed(server, store.schema)["entities"] == 2
    assert _unindexed(server, store.schema)["entities"] == 0  # what a store leaves, it indexes as it closes


def test_a_version_9_schema_keeps_its_rows_indexed_and_makes_its_hnsw_indexes_partial_on_upgrade(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Also: the upgrade, which can take minutes, says so before it starts, and how long it took."""
    from tkg.backends.reference import ReferenceStore

    schema = schema_at(server, monkeypatch, 9)
    people = _people(40, seed=5)
    with admin(server) as conn:
        put_rows(conn, schema, people)
        conn.execute(pg_schema.render("INSERT INTO {s}.counts VALUES ('entity', 'g', 40, 0)", schema))
        assert (
            "WHERE" not in conn.execute(f"SELECT pg_get_indexdef('\"{schema}\".entities_hnsw'::regclass)").fetchone()[0]
        )  # type: ignore[index]
    oracle = ReferenceStore(dim=DIM)
    oracle.write(WriteBatch(puts=people))
    with caplog.at_level(logging.INFO, logger="tkg.backends.postgres.schema"):
        upgraded = PostgresStore(server.dsn, dim=DIM, schema=schema)
    said = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "tkg.backends.postgres.schema"]
    assert said[0][0] == logging.WARNING and f"{schema!r} from version 9 to {SCHEMA_VERSION}" in said[0][1]
    assert said[-1][0] == logging.INFO and said[-1][1].startswith(f"upgraded the tkg schema {schema!r} to version")
    with upgraded:
        assert _unindexed(server, schema)["entities"] == 0
        assert all(d.endswith("WHERE indexed") for d in _hnsw_definitions(server, schema))
        _same_cosine_answers(upgraded, oracle, seed=6)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tkg.backends.postgres.schema"):
        PostgresStore(server.dsn, dim=DIM, schema=schema).close()  # current: nothing to say
    assert not [r for r in caplog.records if r.name == "tkg.backends.postgres.schema"]


# -- several processes ----------------------------------------------------------------------------------------------
def _bump_counter(dsn: str, schema: str, rounds: int) -> None:
    with PostgresStore(dsn, dim=DIM, schema=schema) as store:
        for _ in range(rounds):
            with store.group_lock("g"):
                entity = store.get(Kind.ENTITY, ["counter"])[0]
                assert isinstance(entity, Entity)
                n = entity.attributes["n"]
                store.write(WriteBatch(puts=[dataclasses.replace(entity, attributes={"n": n + 1})]))


def _add_facts(dsn: str, schema: str, worker: int, rounds: int) -> None:
    with PostgresStore(dsn, dim=DIM, schema=schema) as store:
        memory = Memory(store, embedder=EMB, clock=FixedClock(NOW))
        for i in range(rounds):  # Memory holds the store's cross-process group lock around each episode
            memory.add_facts([FactInput("Alice", "VISITED", f"Place {worker}-{i}")], group_id="g")


def _run_workers(target: Any, argsets: list[tuple[Any, ...]]) -> None:
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=target, args=args) for args in argsets]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0] * len(workers)


def test_no_lost_updates_between_processes(server: EmbeddedPostgres, store: PostgresStore) -> None:
    store.write(
        WriteBatch(puts=[Entity(id="counter", group_id="g", name="Counter", created_at=T0, attributes={"n": 0})])
    )
    _run_workers(_bump_counter, [(server.dsn, store.schema, 15), (server.dsn, store.schema, 15)])
    assert store.get(Kind.ENTITY, ["counter"])[0].attributes == {"n": 30}  # type: ignore[union-attr]


def test_two_processes_ingest_into_one_group(server: EmbeddedPostgres, store: PostgresStore) -> None:
    _run_workers(_add_facts, [(server.dsn, store.schema, 0, 6), (server.dsn, store.schema, 1, 6)])
    alices = store.entities_by_name("g", ["Alice"])["alice"]
    assert len(alices) == 1  # resolved against each other's writes, never duplicated
    assert store.count(Kind.FACT) == 12 and store.count(Kind.EPISODE) == 12
    assert {f.source_id for f in store.facts_of([alices[0].id])} == {alices[0].id}


# -- the embedded server ----------------------------------------------------------------------------------------
def test_embedded_server_keeps_data_in_a_given_directory(tmp_path: Path) -> None:
    for round_ in range(2):  # stop, start again: the data is still there
        with EmbeddedPostgres(tmp_path / "pg") as kept, PostgresStore(kept.dsn, dim=DIM) as store:
            if round_ == 0:
                store.write(WriteBatch(puts=[Entity(id="e1", group_id="g", name="Ann", created_at=T0)]))
            assert store.count(Kind.ENTITY) == 1


def test_embedded_server_applies_settings_restarting_for_those_read_at_start(tmp_path: Path) -> None:
    with EmbeddedPostgres(tmp_path / "pg") as kept, PostgresStore(kept.dsn, dim=DIM) as store:
        store.write(WriteBatch(puts=[Entity(id="e1", group_id="g", name="Ann", created_at=T0)]))
    settings = {"shared_buffers": "48MB", "work_mem": "5MB"}  # the first takes a restart, the second a reload
    with EmbeddedPostgres(tmp_path / "pg", settings=settings) as kept, PostgresStore(kept.dsn, dim=DIM) as store:
        assert (kept.setting("shared_buffers"), kept.setting("work_mem")) == ("48MB", "5MB")
        assert store.count(Kind.ENTITY) == 1  # the restart kept the data
    with EmbeddedPostgres(settings={"shared_buffers": "40MB"}) as temporary:
        assert (temporary.setting("shared_buffers"), temporary.setting("fsync")) == ("40MB", "off")


def test_embedded_server_refusing_settings_leaves_its_configuration_as_it_was(tmp_path: Path) -> None:
    with EmbeddedPostgres(tmp_path / "pg") as kept, PostgresStore(kept.dsn, dim=DIM) as store:
        store.write(WriteBatch(puts=[Entity(id="e1", group_id="g", name="Ann", created_at=T0)]))
        default = (kept.setting("shared_buffers"), kept.setting("work_mem"))
    conf = tmp_path / "pg" / "postgresql.auto.conf"
    before = conf.read_bytes()
    refused = [
        {"work_mem": "6MB", "shared_buffers": "plenty"},  # not a value: refused by ALTER SYSTEM, after work_mem
        {"shared_buffers": "1000GB"},  # a value the server cannot start with
        {"work_mem; DROP": "1"},  # not a parameter name
    ]
    for wrong in refused:
        with pytest.raises(BackendError):
            EmbeddedPostgres(tmp_path / "pg", settings=wrong)
        assert conf.read_bytes() == before
    with EmbeddedPostgres(tmp_path / "pg") as kept, PostgresStore(kept.dsn, dim=DIM) as store:
        assert (kept.setting("shared_buffers"), kept.setting("work_mem")) == default
        assert store.count(Kind.ENTITY) == 1


def test_embedded_database_helper(server: EmbeddedPostgres) -> None:
    dsn = server.create_database("tkg_extra")
    assert server.create_database("tkg_extra") == dsn  # idempotent
    with PostgresStore(dsn, dim=DIM) as store:
        assert store.count(Kind.FACT) == 0
    with pytest.raises(BackendError):
        server.create_database("bad; name")


_OPENER = """
import sys, time
from pathlib import Path
from tkg.backends.postgres import PostgresStore
go = Path(sys.argv[3])
print("ready", flush=True)
while not go.exists():
    time.sleep(0.005)
try:
    PostgresStore(sys.argv[1], dim=8, schema=sys.argv[2]).close()
    print("ok", flush=True)
except Exception as exc:  # a tkg error says what failed; anything else is the bug this test looks for
    print(f"error {type(exc).__module__}.{type(exc).__name__}: {exc}", flush=True)
"""


@pytest.mark.slow
def test_processes_opening_a_fresh_database_at_once_all_succeed(server: EmbeddedPostgres, tmp_path: Path) -> None:
    """Issue 15: processes that open a fresh database at the same instant used to fail with a raw
    UniqueViolation (CREATE EXTENSION raced outside the schema lock). Now one creates, the others wait."""
    import subprocess
    import sys

    database = f"race_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(server.dsn, autocommit=True)
    try:
        admin.execute(f'CREATE DATABASE "{database}"')
        limit = int(admin.execute("SHOW max_connections").fetchone()[0])  # type: ignore[index]
    finally:
        admin.close()
    dsn = psycopg.conninfo.make_conninfo(server.dsn, dbname=database)
    count = max(8, min(40, limit // 2 - 5))  # each opener holds one connection; leave room for the rest
    go = tmp_path / "go"
    children = [
        subprocess.Popen([sys.executable, "-c", _OPENER, dsn, "tkg", str(go)], stdout=subprocess.PIPE, text=True)
        for _ in range(count)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        go.touch()  # all at once
        outcomes = [child.communicate(timeout=120)[0].strip() for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    assert outcomes == ["ok"] * count, [o for o in outcomes if o != "ok"][:3]
    check = psycopg.connect(dsn, autocommit=True)
    try:
        assert check.execute("SELECT count(*) FROM pg_extension WHERE extname = 'vector'").fetchone() == (1,)
        assert check.execute("SELECT value FROM tkg.meta WHERE key = 'schema_version'").fetchone() is not None
    finally:
        check.close()


def test_a_version_10_schema_keys_names_with_a_final_plus_or_hash_on_upgrade(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schema 11: "C++", "C#" and "C" are three names (normalize_name keeps a final + or #). Opening a version 10
    schema computes again the name keys of the entities stored with the old ones ("c" for all three)."""
    schema = schema_at(server, monkeypatch, 10)
    entities = [
        Entity(id="e1", group_id="g", name="C++", created_at=T0),
        Entity(id="e2", group_id="g", name="C Sharp", aliases=("C#",), created_at=T0),
        Entity(id="e3", group_id="g", name="C", created_at=T0),
    ]
    with admin(server) as conn:
        put_rows(conn, schema, entities)
        conn.execute(pg_schema.render("UPDATE {s}.entities SET names = ARRAY['c'] WHERE id = 'e1'", schema))
        conn.execute(pg_schema.render("UPDATE {s}.entities SET names = ARRAY['c', 'c sharp'] WHERE id = 'e2'", schema))
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as store:
        found = store.entities_by_name("g", ["C++", "C#", "C"])
        assert {key: [e.id for e in hits] for key, hits in found.items()} == {"c++": ["e1"], "c#": ["e2"], "c": ["e3"]}


def test_a_version_11_schema_keeps_its_communities_and_summarises_them_again_only_when_their_members_change(
    server: EmbeddedPostgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Schema 12: a community keeps the fingerprint of the members its summary was written from. The communities
    of an older schema read as written from their members ("" : not known), so an upgrade summarises none again."""
    schema = schema_at(server, monkeypatch, 11)
    community = Community(id="c1", group_id="g", name="Chess club", created_at=T0, summary="players")
    with admin(server) as conn:
        put_rows(conn, schema, [community])
    with PostgresStore(server.dsn, dim=DIM, schema=schema) as store:
        [read] = store.get(Kind.COMMUNITY, ["c1"])
        assert isinstance(read, Community) and (read.name, read.summary, read.summarised) == (
            "Chess club",
            "players",
            "",
        )
        store.write(WriteBatch(puts=[dataclasses.replace(read, summarised="abc")]))
        assert store.get(Kind.COMMUNITY, ["c1"])[0].summarised == "abc"  # type: ignore[union-attr]


def test_cosine_search_finds_the_live_rows_after_many_removals(server: EmbeddedPostgres) -> None:
    """Half the facts removed: pgvector's HNSW walk kept meeting the index entries of the dead rows and missed live
    facts the exact search finds (for ~20 s, until autovacuum came), so the two backends disagreed, and one
    search gave two answers seconds apart. The store's worker vacuums the table once enough of it is dead."""
    import random

    from tkg.search_config import Method, SearchConfig, TargetConfig

    def build(store: Any) -> Memory:
        memory = Memory(store, embedder=HashEmbedder(dim=64), clock=FixedClock("2024-06-01T00:00:00Z"))
        r = random.Random(7)
        places = ["Paris", "Oslo", "Rome", "Lima", "Berlin", "Acme", "Globex", "Initech"]
        said = []
        for _ in range(12):
            facts = [
                FactInput(
                    f"Person{r.randrange(300)}",
                    r.choice(["LIVES_IN", "WORKS_AT", "KNOWS", "LIKES"]),
                    r.choice([*places, f"Thing{r.randrange(50)} alpha beta"]),
                )
                for _ in range(100)
            ]
            said.append(memory.add_facts(facts, group_id="g1").episode.id)
        for episode in said[:6]:
            memory.remove_episode(episode)
        return memory

    cosine = SearchConfig(facts=TargetConfig(limit=30, methods=(Method.COSINE,)))

    def found(memory: Memory) -> list[tuple[str, float]]:
        return [(s.record.fact, round(s.score, 6)) for s in memory.search("Person250 knows", config=cosine).facts]

    exact = found(build(InMemoryStore(dim=64, vector_tail=10**6)))
    with PostgresStore(server.dsn, dim=64, schema=new_postgres_schema()) as store:
        memory = build(store)
        assert store.wait_for_maintenance(60)
        assert found(memory) == exact
