"""tkg: an embedded temporal knowledge-graph memory for AI agents.

>>> from tkg import Memory, HashEmbedder
>>> memory = Memory(embedder=HashEmbedder())
"""

from tkg.clock import Clock, FixedClock, SystemClock
from tkg.config import MemoryConfig
from tkg.embedders import Embedder, HashEmbedder
from tkg.errors import (
    BackendError,
    ConfigurationError,
    EmbeddingError,
    EpisodeError,
    LLMError,
    NotFoundError,
    SnapshotError,
    SnapshotFormatError,
    SnapshotVersionError,
    TimestampError,
    TkgError,
    UnknownGroupError,
    ValidationError,
)
from tkg.llm import GraphExtraction, LLMClient, Prompt, ScriptedLLM
from tkg.memory import EpisodeResult, FactInput, Memory
from tkg.models import Community, Entity, Episode, EpisodeSource, Fact, Kind, Membership, Mention
from tkg.search import Scored, SearchResults
from tkg.storage import Hit, Store, WriteBatch

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "Clock",
    "Community",
    "ConfigurationError",
    "Embedder",
    "EmbeddingError",
    "Entity",
    "Episode",
    "EpisodeError",
    "EpisodeResult",
    "EpisodeSource",
    "Fact",
    "FactInput",
    "FixedClock",
    "GraphExtraction",
    "HashEmbedder",
    "Hit",
    "Kind",
    "LLMClient",
    "LLMError",
    "Membership",
    "Memory",
    "MemoryConfig",
    "Mention",
    "NotFoundError",
    "Prompt",
    "Scored",
    "ScriptedLLM",
    "SearchResults",
    "SnapshotError",
    "SnapshotFormatError",
    "SnapshotVersionError",
    "Store",
    "SystemClock",
    "TimestampError",
    "TkgError",
    "UnknownGroupError",
    "ValidationError",
    "WriteBatch",
]
