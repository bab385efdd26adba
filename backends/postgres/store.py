"""The PostgreSQL backend: pgvector HNSW for cosine, BM25 postings tables for full text, recursive SQL for the graph.

One :class:`PostgresStore` holds one connection (calls from several threads take turns on it), and for searches
up to ``search_connections - 1`` reader connections more, opened when first needed: the candidate lists of one
search (cosine and BM25 per target, :meth:`~tkg.storage.Store.candidates`) are read on them at once, as the server
answers each in its own process (at 100,000 facts, a search's six lists took ~7 ms on two connections against ~11
one after the other). Every
:meth:`~PostgresStore.write` is one transaction: a failure, a refused record or a dropped connection leaves
nothing of the batch behind. Several processes may share a database; :meth:`PostgresStore.group_lock` is the
cross-process lock on one group that keeps two writers' read-modify-write cycles from interleaving.
Full text keeps its postings also packed per term (:mod:`.terms`); once a quarter of a kind's records are new
since the last pack, or 1/32 rewritten (in their search text) or deleted, 2,048 at most, a worker thread of the
store that wrote (:mod:`.worker`, on a connection of its own) repacks them beside the writers, who wait only for
its cut, one short statement (they used to wait for the whole repack: 0.4 s for the facts at 100,000, 6.6 s at a
million); readers never wait. The same worker enters the rows a write put into their HNSW index after the write
(a write puts them unindexed: no HNSW insert runs in its transaction), once the store has put
:data:`.writes.INDEX_EVERY` of a kind (and as it closes, those left); a cosine search walks the index and scores
the rows not in it yet exactly.

Reads are one statement each (a text search reads its terms' postings in one, then checks the best documents
against the scope in another, rarely more); a read whose connection dropped is retried
once on a new connection. Every value travels as a query parameter; only the schema name, checked against a
strict pattern and quoted, is spliced into statement text.
"""

from __future__ import annotations

from .reads import Reads
from .search import Search
from .writes import Writes


class PostgresStore(Writes, Reads, Search):
    """A tkg store in a PostgreSQL database (>= 15, with pgvector >= 0.5).

    ``dsn`` is a libpq connection string or URI (``"postgresql://user:pass@host:5432/db"``). The tables live in
    ``schema`` (created, or upgraded, on open). ``dim`` must match the database's vectors once it holds a memory.
    ``build_memory_mb`` is the memory the server may use to build a search index in :meth:`load`
    (``maintenance_work_mem``): pgvector builds an HNSW graph quickly while it fits in it (~2 KB per 384-d vector)
    and about ten times more slowly past that; raise it to ~4,096 to load a million facts at 384-d.
    ``search_connections`` (1-16, default 2) is how many connections one search reads its candidate lists on at
    once (and an episode its first reads around a new fact, :meth:`~tkg.storage.Store.closest_facts_together`, and
    a new name's candidate entities); 1 reads them in turn on the store's own connection and opens no other.
    ``pack_cache_mb`` (default 64; 0: none) bounds the packed postings kept decoded in the client
    (:mod:`.pack_cache`): a search is sent only the packs of its words that the store does not hold for the
    generation in use.

    >>> from tkg.backends.postgres import EmbeddedPostgres  # doctest: +SKIP
    >>> server = EmbeddedPostgres()  # doctest: +SKIP
    >>> store = PostgresStore(server.dsn, dim=384)  # doctest: +SKIP
    >>> store.count("fact")  # doctest: +SKIP
    0
    """
