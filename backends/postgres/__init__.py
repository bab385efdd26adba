"""The PostgreSQL backend: ``PostgresStore`` (pgvector + full text + recursive SQL) and ``EmbeddedPostgres``."""

from .embedded import EmbeddedPostgres
from .schema import SCHEMA_VERSION
from .store import PostgresStore

__all__ = ["SCHEMA_VERSION", "EmbeddedPostgres", "PostgresStore"]
