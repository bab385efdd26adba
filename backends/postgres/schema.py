"""The PostgreSQL schema of tkg: tables, indexes, and the migrations that build and upgrade them.

All of tkg's tables live in one PostgreSQL schema (``tkg`` unless told otherwise). Its ``meta`` table records
the schema version, the vector dimension and the text-search configuration. Opening a store runs the missing
migrations in one transaction, under an advisory lock so that processes opening the same database at once do not
race; a schema newer than this tkg knows is refused with a clear error (upgrade tkg), never written to.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from tkg.errors import BackendError
from tkg.models import VECTOR_FIELD, Community, Entity, Episode, Fact, Kind, Membership, Mention, Record
from tkg.names import name_keys
from tkg.vector_sketches import BITS

from .connection import connect, describe

log = logging.getLogger(__name__)

#: The schema version this tkg writes. Bump it and add a migration to change the schema.
SCHEMA_VERSION = 13


@dataclass(frozen=True)
class Table:
    name: str
    record: type[Record]
    key: tuple[str, ...]  # the primary key columns (the record's id, or its two ends)


TABLES: dict[Kind, Table] = {
    Kind.EPISODE: Table("episodes", Episode, ("id",)),
    Kind.ENTITY: Table("entities", Entity, ("id",)),
    Kind.FACT: Table("facts", Fact, ("id",)),
    Kind.COMMUNITY: Table("communities", Community, ("id",)),
    Kind.MENTION: Table("mentions", Mention, ("episode_id", "entity_id")),
    Kind.MEMBERSHIP: Table("memberships", Membership, ("community_id", "entity_id")),
}

# Version 1. `seq` orders records by first insertion (a replace keeps it), as the Store interface's "insertion
# order" requires. `tsv` holds the full-text document (tkg.models.search_text), computed at write time. Vectors
# are stored as given (cosine ignores length), so records come back exactly as they were put. Attribute maps are
# `json`, not `jsonb`: json keeps the text as written, so every number comes back as the same Python value.
_V1 = """
CREATE TABLE {s}.meta (key text PRIMARY KEY, value text NOT NULL);
CREATE SEQUENCE {s}.record_seq;
CREATE TABLE {s}.counts (
    kind text NOT NULL, group_id text NOT NULL, n bigint NOT NULL, PRIMARY KEY (kind, group_id)
);
CREATE TABLE {s}.episodes (
    seq bigint NOT NULL DEFAULT nextval('{s_raw}.record_seq') UNIQUE,
    id text PRIMARY KEY,
    group_id text NOT NULL,
    content text NOT NULL,
    source text NOT NULL,
    reference_time timestamptz NOT NULL,
    created_at timestamptz NOT NULL,
    source_description text NOT NULL,
    name text NOT NULL,
    status text NOT NULL,
    error text NOT NULL,
    attributes json NOT NULL,
    embedding {vector},
    tsv tsvector NOT NULL
);
CREATE INDEX episodes_timeline ON {s}.episodes (group_id, reference_time, seq);
CREATE TABLE {s}.entities (
    seq bigint NOT NULL DEFAULT nextval('{s_raw}.record_seq') UNIQUE,
    id text PRIMARY KEY,
    group_id text NOT NULL,
    name text NOT NULL,
    created_at timestamptz NOT NULL,
    summary text NOT NULL,
    labels text[] NOT NULL,
    attributes json NOT NULL,
    aliases text[] NOT NULL,
    names text[] NOT NULL,
    name_embedding {vector},
    tsv tsvector NOT NULL
);
CREATE INDEX entities_group ON {s}.entities (group_id, seq);
CREATE INDEX entities_names ON {s}.entities USING gin (names);
CREATE TABLE {s}.facts (
    seq bigint NOT NULL DEFAULT nextval('{s_raw}.record_seq') UNIQUE,
    id text PRIMARY KEY,
    group_id text NOT NULL,
    source_id text NOT NULL,
    target_id text NOT NULL,
    relation text NOT NULL,
    fact text NOT NULL,
    created_at timestamptz NOT NULL,
    valid_at timestamptz,
    invalid_at timestamptz,
    expired_at timestamptz,
    episodes text[] NOT NULL,
    attributes json NOT NULL,
    invalidated_by text,
    prior_invalid_at timestamptz,
    embedding {vector},
    tsv tsvector NOT NULL
);
CREATE INDEX facts_group ON {s}.facts (group_id, seq);
CREATE INDEX facts_source ON {s}.facts (source_id);
CREATE INDEX facts_target ON {s}.facts (target_id);
CREATE INDEX facts_episodes ON {s}.facts USING gin (episodes);
CREATE TABLE {s}.communities (
    seq bigint NOT NULL DEFAULT nextval('{s_raw}.record_seq') UNIQUE,
    id text PRIMARY KEY,
    group_id text NOT NULL,
    name text NOT NULL,
    created_at timestamptz NOT NULL,
    summary text NOT NULL,
    name_embedding {vector},
    tsv tsvector NOT NULL
);
CREATE INDEX communities_group ON {s}.communities (group_id, seq);
CREATE TABLE {s}.mentions (
    seq bigint NOT NULL DEFAULT nextval('{s_raw}.record_seq') UNIQUE,
    episode_id text NOT NULL,
    entity_id text NOT NULL,
    group_id text NOT NULL,
    created_at timestamptz NOT NULL,
    name text NOT NULL,
    label text NOT NULL,
    summary text NOT NULL,
    attributes json NOT NULL,
    PRIMARY KEY (episode_id, entity_id)
);
CREATE INDEX mentions_entity ON {s}.mentions (entity_id);
CREATE TABLE {s}.memberships (
    seq bigint NOT NULL DEFAULT nextval('{s_raw}.record_seq') UNIQUE,
    community_id text NOT NULL,
    entity_id text NOT NULL,
    group_id text NOT NULL,
    created_at timestamptz NOT NULL,
    PRIMARY KEY (community_id, entity_id)
);
CREATE INDEX memberships_entity ON {s}.memberships (entity_id);
"""

#: Version 1's full-text indexes (tsvector + GIN); version 3 replaced them by BM25 postings (:mod:`.terms`).
_V1_TEXT_INDEXES = [
    f"CREATE INDEX IF NOT EXISTS {table}_tsv ON {{s}}.{table} USING gin (tsv)"
    for table in ("episodes", "entities", "facts", "communities")
]

#: The tables with a vector column, and the column.
VECTOR_TABLES: dict[Kind, tuple[str, str]] = {kind: (TABLES[kind].name, field) for kind, field in VECTOR_FIELD.items()}

# Version 1's vector indexes: every row of a table in its HNSW index (version 10 made them partial).
_V1_SEARCH_INDEXES = [
    f"CREATE INDEX IF NOT EXISTS {table}_hnsw ON {{s}}.{table} USING hnsw ({column} vector_cosine_ops)"
    for table, column in VECTOR_TABLES.values()
]

#: The vector indexes, kept apart so that a bulk load can drop them and build each once at the end. Each holds the
#: rows marked ``indexed``: a write marks the rows it puts unindexed and the store's worker indexes them after it
#: (:mod:`.worker`), so that no HNSW insert waits in a writer's transaction; a search scores the unindexed rows
#: exactly, found by their own small index (:data:`UNINDEXED_INDEXES`).
SEARCH_INDEXES: dict[str, str] = {
    f"{table}_hnsw": (
        f"CREATE INDEX IF NOT EXISTS {table}_hnsw ON {{s}}.{table} USING hnsw ({column} vector_cosine_ops) "
        "WHERE indexed"
    )
    for table, column in VECTOR_TABLES.values()
}

#: The rows of each vector table not in its HNSW index yet.
UNINDEXED_INDEXES = [
    f"CREATE INDEX IF NOT EXISTS {table}_unindexed ON {{s}}.{table} (seq) WHERE NOT indexed"
    for table, _ in VECTOR_TABLES.values()
]

#: Visibility maps of the facts and postings tables (index-only scans), after a bulk load.
VACUUM_LOADED = "VACUUM {s}.facts, {s}.facts_terms, {s}.entities_terms, {s}.episodes_terms, {s}.communities_terms"

#: Fresh planner statistics for the tables searches read.
ANALYZE = (
    "ANALYZE {s}.facts, {s}.entities, {s}.episodes, {s}.communities, {s}.facts_terms, {s}.entities_terms, "
    "{s}.episodes_terms, {s}.communities_terms, {s}.fact_verdicts"
)


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def render(text: str, schema: str, vector: str = "") -> sql.Composed:
    """``text`` with ``{s}`` as the quoted schema name (``{s_raw}`` inside a string literal); no values inside."""
    return sql.SQL(text).format(
        s=sql.Identifier(schema),
        s_raw=sql.SQL(quote_ident(schema).replace("'", "''")),
        vector=sql.SQL(vector),
    )


class Statements:
    """Statements of one schema: ``statements(text)`` is :func:`render`'s, made once per text and then cached."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self._made: dict[str, sql.Composed] = {}

    def __call__(self, text: str) -> sql.Composed:
        found = self._made.get(text)
        if found is None:
            found = self._made[text] = render(text, self.schema)
        return found


def _migrate_to_1(conn: psycopg.Connection[Any], schema: str, settings: dict[str, str]) -> None:
    dim = int(settings["dim"])
    conn.execute(render(_V1, schema, vector=f"vector({dim})"))
    for statement in [*_V1_TEXT_INDEXES, *_V1_SEARCH_INDEXES]:
        conn.execute(render(statement, schema))
    conn.execute(
        render("INSERT INTO {s}.meta (key, value) VALUES ('dim', %s), ('text_config', %s)", schema),
        [str(dim), settings["text_config"]],
    )


# Version 2: a fact keeps the LLM's verdicts on the facts it was compared with (tkg.invalidation recomputes the
# history from them), and an episode the speaker's UTC offset (calendar phrases are resolved on their day).
_V2 = """
ALTER TABLE {s}.facts ADD COLUMN verdicts json NOT NULL DEFAULT '{{}}';
ALTER TABLE {s}.episodes ADD COLUMN reference_offset integer NOT NULL DEFAULT 0;
"""


def _migrate_to_2(conn: psycopg.Connection[Any], schema: str, settings: dict[str, str]) -> None:
    conn.execute(render(_V2, schema))


# Version 3: full text is BM25 over tkg's own tokens (the formula and tokenizer of every backend), kept in
# postings tables with the corpus statistics (see .terms); PostgreSQL's tsvector and ts_rank are dropped. The
# postings of the records already stored are written in the same transaction by the backfill the store hands to
# ensure_schema (.terms.index_stored: it tokenizes with tkg's code, which this module does not import).
_V3 = """
ALTER TABLE {s}.counts ADD COLUMN tokens bigint NOT NULL DEFAULT 0;
CREATE TABLE {s}.text_df (
    kind text NOT NULL, term text NOT NULL, df bigint NOT NULL, max_tf integer NOT NULL, min_dl integer NOT NULL,
    PRIMARY KEY (kind, term)
);
"""
_V3_TABLE = """
DROP INDEX IF EXISTS {s}.{table}_tsv;
ALTER TABLE {s}.{table} DROP COLUMN tsv;
CREATE TABLE {s}.{table}_terms (
    term text NOT NULL, seq bigint NOT NULL, tf integer NOT NULL, dl integer NOT NULL,
    PRIMARY KEY (term, seq) INCLUDE (tf, dl)
);
CREATE INDEX {table}_terms_seq ON {s}.{table}_terms (seq);
"""


def _migrate_to_3(conn: psycopg.Connection[Any], schema: str, settings: dict[str, str]) -> None:
    conn.execute(render(_V3, schema))
    for kind in (Kind.EPISODE, Kind.ENTITY, Kind.FACT, Kind.COMMUNITY):
        conn.execute(render(_V3_TABLE.replace("{table}", TABLES[kind].name), schema))


# Version 4: the neighbourhood of a new fact is read from indexes (an entity's facts of one relation, the facts
# between two entities, the facts whose verdicts name one: the last replaced by version 5), never by reading every
# fact of a hot entity.
_V4 = """
DROP INDEX IF EXISTS {s}.facts_source;
DROP INDEX IF EXISTS {s}.facts_target;
CREATE INDEX facts_source ON {s}.facts (source_id, relation);
CREATE INDEX facts_target ON {s}.facts (target_id, relation);
CREATE INDEX facts_pair ON {s}.facts (source_id, target_id);
CREATE INDEX facts_verdicts ON {s}.facts USING gin ((verdicts::jsonb));
"""


def _migrate_to_4(conn: psycopg.Connection[Any], schema: str, settings: dict[str, str]) -> None:
    conn.execute(render(_V4, schema))


# Version 5: the facts whose verdicts name a fact are read from a table of (named fact, judging fact's seq), kept
# in the write's transaction (.writes). PostgreSQL never chose version 4's GIN index on verdicts::jsonb: it read
# every fact of the entity and parsed each one's json, O(facts of a hot entity) per new fact. The rows of the
# facts already stored are written by the migration itself (json_object_keys).
# A row is kept whole up to a page (toast_tuple_target 8160 bytes) instead of having its vector moved to TOAST
# once it passes 2 kB (a 384-d vector with a fact's ids, text and episodes does; any vector of 512 dimensions or
# more always did): an exact scan then reads one page per row instead of three, a hot entity's closest facts in
# half the time. (Storage MAIN on the vector column would not do: PostgreSQL then moves the row's small arrays
# and texts out instead.) Rows already stored move in when they are next rewritten.
_V5 = """
ALTER TABLE {s}.facts SET (toast_tuple_target = 8160);
ALTER TABLE {s}.episodes SET (toast_tuple_target = 8160);
ALTER TABLE {s}.entities SET (toast_tuple_target = 8160);
ALTER TABLE {s}.communities SET (toast_tuple_target = 8160);
CREATE TABLE {s}.fact_verdicts (named text NOT NULL, seq bigint NOT NULL, PRIMARY KEY (named, seq));
CREATE INDEX fact_verdicts_seq ON {s}.fact_verdicts (seq);
INSERT INTO {s}.fact_verdicts (named, seq)
    SELECT DISTINCT v.named, f.seq FROM {s}.facts f CROSS JOIN LATERAL json_object_keys(f.verdicts) AS v(named);
DROP INDEX IF EXISTS {s}.facts_verdicts;
"""


def _migrate_to_5(conn: psycopg.Connection[Any], schema: str, settings: dict[str, str]) -> None:
    conn.execute(render(_V5, schema))


# Version 6: a fact's vector also has its bit sketch (tkg.vector_sketches), written with the row, and the indexes of
# an entity's facts by relation carry it (with seq, and the source of a fact found by its target): the closest facts
# around a hot entity are found by an index-only scan of those sketches, and only the closest by sketch are read
# from the table and scored exactly (.search). Before, the HNSW walk under the neighbourhood filter was crowded out
# by the facts it refuses: at 10,000 facts of one entity it found 0.3-0.5 of the true 32 closest of other relations.
# The sketches of facts already stored are written by the backfill the store hands to ensure_schema.
_V6 = f"""
ALTER TABLE {{s}}.facts ADD COLUMN sketch bit({BITS});
DROP INDEX IF EXISTS {{s}}.facts_source;
DROP INDEX IF EXISTS {{s}}.facts_target;
CREATE INDEX facts_source ON {{s}}.facts (source_id, relation) INCLUDE (seq, sketch);
CREATE INDEX facts_target ON {{s}}.facts (target_id, relation) INCLUDE (source_id, seq, sketch);
"""


def _migrate_to_6(conn: psycopg.Connection[Any], schema: str, settings: dict[str, str]) -> None:
    conn.execute(render(_V6, schema))


# Version 7: BM25 takes a term's document frequency from its postings, which a query reads whole and scores in the
# client (.search), no longer from text_df, which kept it (and bounds for pruning in SQL) at the cost of two
# statements in every write.
def _migrate_to_7(conn: psycopg.Connection[Any], schema: str, settings: dict[str, str]) -> None:
    conn.execute(render("DROP TABLE {s}.text_df", schema))


# Version 8: each text table's postings are also kept packed per term (.terms: <table>_packs, <table>_stale and the
# kind's upto in packed), so that a query reads a common term's postings as one value. The packs of the records
# already stored are written by the backfill the store hands to ensure_schema (nothing packed is also correct:
# every posting is then read from the postings table).
_V8 = """
CREATE TABLE {s}.packed (kind text PRIMARY KEY, upto bigint NOT NULL, records bigint NOT NULL);
"""
_V8_TABLE = """
CREATE TABLE {s}.{table}_packs (term text PRIMARY KEY, postings bytea NOT NULL);
ALTER TABLE {s}.{table}_packs ALTER COLUMN postings SET STORAGE EXTERNAL;
CREATE TABLE {s}.{table}_stale (seq bigint PRIMARY KEY);
"""


def _migrate_to_8(conn: psycopg.Connection[Any], schema: str, settings: dict[str, str]) -> None:
    conn.execute(render(_V8, schema))
    for kind in (Kind.EPISODE, Kind.ENTITY, Kind.FACT, Kind.COMMUNITY):
        conn.execute(render(_V8_TABLE.replace("{table}", TABLES[kind].name), schema))


# Version 9: a repack no longer makes the writers wait while it packs (.terms, repack_steps). The packs of a kind
# carry a generation (the one readers take is packed.gen), so a repack writes the next one beside the current; the
# kind's packed.pending is the upto of a repack under way (writes mark a rewritten record stale up to it too); a
# stale record's mark is the transaction that marked it, so the repack clears only the marks its snapshot saw.
_V9 = """
ALTER TABLE {s}.packed ADD COLUMN gen bigint NOT NULL DEFAULT 0, ADD COLUMN pending bigint;
"""
_V9_TABLE = """
ALTER TABLE {s}.{table}_packs ADD COLUMN gen bigint NOT NULL DEFAULT 0;
ALTER TABLE {s}.{table}_packs DROP CONSTRAINT {table}_packs_pkey, ADD PRIMARY KEY (term, gen);
ALTER TABLE {s}.{table}_stale ADD COLUMN mark bigint NOT NULL DEFAULT 0;
"""


def _migrate_to_9(conn: psycopg.Connection[Any], schema: str, settings: dict[str, str]) -> None:
    conn.execute(render(_V9, schema))
    for kind in (Kind.EPISODE, Kind.ENTITY, Kind.FACT, Kind.COMMUNITY):
        conn.execute(render(_V9_TABLE.replace("{table}", TABLES[kind].name), schema))


# Version 10: HNSW inserts leave the writers' transactions. A row carries ``indexed``; a write puts its rows
# unindexed (false), and the store's worker marks them indexed after the write committed, which enters them into the
# partial HNSW index (:data:`SEARCH_INDEXES`); searches score the unindexed rows exactly. Before, each new or
# rewritten row's HNSW insert ran inside add_episode's transaction: 10 of a 44 ms add_episode at 1M facts. Rows
# already stored count as indexed; the HNSW indexes are rebuilt partial, with the store's build memory (ensure_schema):
# once, on opening a store written by an earlier tkg (bench_postgres's 100,000 facts, 167,000 vectors: 43 s).
_V10_TABLE = """
ALTER TABLE {s}.{table} ADD COLUMN indexed boolean NOT NULL DEFAULT true;
ALTER TABLE {s}.{table} ALTER COLUMN indexed SET DEFAULT false;
DROP INDEX IF EXISTS {s}.{table}_hnsw;
"""


def _migrate_to_10(conn: psycopg.Connection[Any], schema: str, settings: dict[str, str]) -> None:
    for table, _ in VECTOR_TABLES.values():
        conn.execute(render(_V10_TABLE.replace("{table}", table), schema))
    for statement in [*UNINDEXED_INDEXES, *SEARCH_INDEXES.values()]:
        conn.execute(render(statement, schema))


# Version 11: a name's final "+" or "#" is part of it (tkg.names.normalize_name: "C++", "C#" and "C" are three
# names, not one). The name keys of the entities whose name or an alias holds one are computed again.
def _migrate_to_11(conn: psycopg.Connection[Any], schema: str, settings: dict[str, str]) -> None:
    rows = conn.execute(
        render(
            "SELECT seq, name, aliases FROM {s}.entities WHERE name ~ '[+#]' OR array_to_string(aliases, ' ') ~ '[+#]'",
            schema,
        )
    ).fetchall()
    if rows:
        with conn.cursor() as cur:
            cur.executemany(
                render("UPDATE {s}.entities SET names = %s WHERE seq = %s", schema),
                [(name_keys(name, aliases), seq) for seq, name, aliases in rows],
            )


# Version 12: a community keeps the fingerprint of the members its name and summary were written from
# (tkg.models.Community.summarised), so that a refresh summarises again one whose members changed since. Communities
# already stored get "" (not known: taken as written from their members).
def _migrate_to_12(conn: psycopg.Connection[Any], schema: str, settings: dict[str, str]) -> None:
    conn.execute(render("ALTER TABLE {s}.communities ADD COLUMN summarised text NOT NULL DEFAULT ''", schema))


# Version 13: the facts still holding (no later fact superseded them: expired_at null) have indexes of their own by
# entity and relation, which carry the same columns as version 6's: the planner reads the closest holding facts of a
# new fact's relation around its ends (tkg.extraction), and in a long chain of changes most of an entity's facts of
# that relation are superseded ones.
_V13 = """
CREATE INDEX facts_source_holding ON {s}.facts (source_id, relation) INCLUDE (seq, sketch) WHERE expired_at IS NULL;
CREATE INDEX facts_target_holding ON {s}.facts (target_id, relation) INCLUDE (source_id, seq, sketch)
    WHERE expired_at IS NULL;
"""


def _migrate_to_13(conn: psycopg.Connection[Any], schema: str, settings: dict[str, str]) -> None:
    conn.execute(render(_V13, schema))


#: MIGRATIONS[n] takes a schema at version n - 1 to version n.
MIGRATIONS: dict[int, Callable[[psycopg.Connection[Any], str, dict[str, str]], None]] = {
    1: _migrate_to_1,
    2: _migrate_to_2,
    3: _migrate_to_3,
    4: _migrate_to_4,
    5: _migrate_to_5,
    6: _migrate_to_6,
    7: _migrate_to_7,
    8: _migrate_to_8,
    9: _migrate_to_9,
    10: _migrate_to_10,
    11: _migrate_to_11,
    12: _migrate_to_12,
    13: _migrate_to_13,
}


def read_version(conn: psycopg.Connection[Any], schema: str) -> int:
    """The schema version stored in ``schema`` (0: no tkg schema there yet)."""
    row = conn.execute("SELECT to_regclass(%s)", [quote_ident(schema) + ".meta"]).fetchone()
    if row is None or row[0] is None:
        return 0
    found = conn.execute(render("SELECT value FROM {s}.meta WHERE key = 'schema_version'", schema)).fetchone()
    return int(found[0]) if found else 0


Backfill = Callable[[psycopg.Connection[Any], str], None]


def ensure_schema(
    conn: psycopg.Connection[Any],
    schema: str,
    dim: int,
    text_config: str,
    backfills: Mapping[int, Backfill] | None = None,
    build_memory_mb: int | None = None,
) -> dict[str, str]:
    """Create or upgrade the tkg schema; returns its ``meta`` settings. ``conn`` must be in autocommit mode.
    ``backfills[n]`` runs right after the migration to version ``n`` (same transaction), on an existing schema
    only: the data work a migration needs from code outside this module (version 3: the BM25 postings).
    ``build_memory_mb``: PostgreSQL's maintenance_work_mem while migrating (the indexes a migration builds)."""
    began = time.perf_counter()
    with conn.transaction():
        # One process migrates at a time; the others wait here and then find the schema current.
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", [f"tkg-schema:{schema}"])
        version = read_version(conn, schema)
        if version > SCHEMA_VERSION:
            raise BackendError(
                f"the tkg schema {schema!r} in this database is at version {version}, newer than this tkg knows "
                f"({SCHEMA_VERSION}); it was written by a newer tkg. Upgrade tkg (pip install -U tkg) to open it; "
                "nothing was changed"
            )
        if version < SCHEMA_VERSION:
            try:
                conn.execute(render("CREATE SCHEMA IF NOT EXISTS {s}", schema))
            except psycopg.errors.InsufficientPrivilege:
                raise BackendError(
                    f"cannot create the PostgreSQL schema {schema!r}: the role lacks the CREATE privilege on this "
                    "database. Grant it, or create the schema for this role first"
                ) from None
            settings = {"dim": str(dim), "text_config": text_config}
            if build_memory_mb is not None:
                conn.execute("SELECT set_config('maintenance_work_mem', %s, true)", [f"{build_memory_mb}MB"])
            if version > 0:  # an upgrade works over every record stored: minutes for a large memory, said first
                log.warning(
                    "upgrading the tkg schema %r from version %d to %d: a migration works over every record it "
                    "holds, which can take minutes for a large memory (README: Schema and migrations); other "
                    "processes opening it wait",
                    schema,
                    version,
                    SCHEMA_VERSION,
                )
            for target in range(version + 1, SCHEMA_VERSION + 1):
                MIGRATIONS[target](conn, schema, settings)
                backfill = (backfills or {}).get(target)
                if backfill is not None and version > 0:
                    backfill(conn, schema)
            conn.execute(
                render(
                    "INSERT INTO {s}.meta (key, value) VALUES ('schema_version', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    schema,
                ),
                [str(SCHEMA_VERSION)],
            )
        rows = conn.execute(render("SELECT key, value FROM {s}.meta", schema)).fetchall()
    if 0 < version < SCHEMA_VERSION:  # committed
        log.info(
            "upgraded the tkg schema %r to version %d in %.1f s", schema, SCHEMA_VERSION, time.perf_counter() - began
        )
    return {str(k): str(v) for k, v in rows}


def stored_settings(dsn: str, schema: str = "tkg", *, connect_timeout: int = 10) -> dict[str, str] | None:
    """What the tkg schema ``schema`` at ``dsn`` records (``dim``, ``text_config``, ``schema_version`` and, once a
    memory has written, ``embedder``), or None when the database holds no tkg schema by that name. Creates and
    changes nothing: this is how a tool learns which embedder to open a memory with."""
    conn = connect(dsn, connect_timeout=connect_timeout)
    try:
        if read_version(conn, schema) == 0:
            return None
        rows = conn.execute(render("SELECT key, value FROM {s}.meta", schema)).fetchall()
    except psycopg.Error as exc:
        raise BackendError(f"cannot read the tkg schema {schema!r} at {describe(dsn)}: {exc}") from None
    finally:
        conn.close()
    return {str(k): str(v) for k, v in rows}
