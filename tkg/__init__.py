"""tkg: an embedded temporal knowledge-graph memory for AI agents.

>>> from tkg import Memory, HashEmbedder
>>> memory = Memory(embedder=HashEmbedder())
"""

from tkg.aio import AsyncMemory
from tkg.background import BackgroundIngestor, IngestionStatus
from tkg.clock import Clock, FixedClock, SystemClock
from tkg.config import MemoryConfig
from tkg.context import Context
from tkg.embedders import Embedder, HashEmbedder
from tkg.errors import (
    BackendError,
    ConfigurationError,
    EmbeddingError,
    EpisodeError,
    ExtractionFailedError,
    IngestorClosedError,
    LLMError,
    MemoryInUseError,
    NotFoundError,
    QueueFullError,
    SnapshotError,
    SnapshotFormatError,
    SnapshotVersionError,
    TimestampError,
    TkgError,
    UnknownGroupError,
    ValidationError,
    WaitTimeoutError,
)
from tkg.llm import GraphExtraction, LLMClient, LLMPolicy, LLMUsage, Prompt, ScriptedLLM
from tkg.llm.rules import RulesLLM
from tkg.memory import EpisodeInput, EpisodeResult, FactInput, Memory, RemovalResult
from tkg.models import Community, Entity, Episode, EpisodeSource, EpisodeStatus, Fact, Kind, Membership, Mention
from tkg.ontology import Ontology, RelationType
from tkg.rerankers import CrossEncoder, EmbeddingScorer, LLMScorer, TermOverlapScorer
from tkg.search import Scored, SearchResults
from tkg.search_config import PRESETS, Method, Reranker, SearchConfig, TargetConfig, preset
from tkg.storage import Hit, Store, WriteBatch
from tkg.timeline import DateRange, Filters

__version__ = "0.1.0"

__all__ = [
    "PRESETS",
    "AsyncMemory",
    "BackendError",
    "BackgroundIngestor",
    "Clock",
    "Community",
    "ConfigurationError",
    "Context",
    "CrossEncoder",
    "DateRange",
    "Embedder",
    "EmbeddingError",
    "EmbeddingScorer",
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
    "Filters",
    "FixedClock",
    "GraphExtraction",
    "HashEmbedder",
    "Hit",
    "IngestionStatus",
    "IngestorClosedError",
    "Kind",
    "LLMClient",
    "LLMError",
    "LLMPolicy",
    "LLMScorer",
    "LLMUsage",
    "Membership",
    "Memory",
    "MemoryConfig",
    "MemoryInUseError",
    "Mention",
    "Method",
    "NotFoundError",
    "Ontology",
    "Prompt",
    "QueueFullError",
    "RelationType",
    "RemovalResult",
    "Reranker",
    "RulesLLM",
    "Scored",
    "ScriptedLLM",
    "SearchConfig",
    "SearchResults",
    "SnapshotError",
    "SnapshotFormatError",
    "SnapshotVersionError",
    "Store",
    "SystemClock",
    "TargetConfig",
    "TermOverlapScorer",
    "TimestampError",
    "TkgError",
    "UnknownGroupError",
    "ValidationError",
    "WaitTimeoutError",
    "WriteBatch",
    "preset",
]
