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
    ExtractionFailedError,
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
from tkg.llm import GraphExtraction, LLMClient, LLMPolicy, LLMUsage, Prompt, ScriptedLLM
from tkg.llm.rules import RulesLLM
from tkg.memory import EpisodeInput, EpisodeResult, FactInput, Memory, RemovalResult
from tkg.models import Community, Entity, Episode, EpisodeSource, EpisodeStatus, Fact, Kind, Membership, Mention
from tkg.ontology import Ontology, RelationType
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
    "EpisodeInput",
    "EpisodeResult",
    "EpisodeSource",
    "EpisodeStatus",
    "ExtractionFailedError",
    "Fact",
    "FactInput",
    "FixedClock",
    "GraphExtraction",
    "HashEmbedder",
    "Hit",
    "Kind",
    "LLMClient",
    "LLMError",
    "LLMPolicy",
    "LLMUsage",
    "Membership",
    "Memory",
    "MemoryConfig",
    "Mention",
    "NotFoundError",
    "Ontology",
    "Prompt",
    "RelationType",
    "RemovalResult",
    "RulesLLM",
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
