"""The PostgreSQL backend: ``PostgresStore`` (pgvector + full text + recursive SQL) and ``EmbeddedPostgres``."""

from .embedded import EmbeddedPostgres
from .schema import SCHEMA_VERSION, stored_settings
from .store import PostgresStore

__all__ = ["SCHEMA_VERSION", "EmbeddedPostgres", "PostgresStore", "stored_settings"]
