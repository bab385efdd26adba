"""The one exception hierarchy of tkg.

Every error tkg raises on purpose is a :class:`TkgError`; catch that to handle them all. Each message says what
was wrong and what to do about it. Whenever one of these is raised, memory and files are left as they were.
"""

from __future__ import annotations


class TkgError(Exception):
    """Base class of every error tkg raises on purpose."""


class ValidationError(TkgError, ValueError):
    """An argument or a record is malformed (empty text, bad id, wrong type)."""


class TimestampError(ValidationError):
    """A timestamp is naive (no timezone), unparseable, impossible or out of order."""


class EpisodeError(ValidationError):
    """An episode cannot be accepted: empty, too large, or of an unknown source type."""


class EmbeddingError(ValidationError):
    """An embedding has the wrong dimension, or contains NaN or infinite values."""


class UnknownGroupError(TkgError, LookupError):
    """A group_id was named that holds nothing in this memory."""


class NotFoundError(TkgError, LookupError):
    """A record with the given id does not exist."""


class LLMError(TkgError):
    """The LLM could not be reached, or returned something that does not fit the expected schema.

    ``retryable`` says whether trying again may help (rate limits, server errors, timeouts, malformed output);
    ``retry_after`` is the server's requested wait in seconds, when it sent one; ``spent`` the (prompt,
    completion) tokens the server reported for the answers it sent that could not be used (they are billed);
    ``requests`` the requests the failed call made (a client that asks again by itself makes several).
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = False,
        retry_after: float | None = None,
        spent: tuple[int, int] | None = None,
        requests: int = 1,
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.retry_after = retry_after
        self.spent = spent
        self.requests = requests


class ExtractionFailedError(LLMError):
    """Extraction of an episode failed for good. The episode is stored, marked failed, and can be retried with
    :meth:`tkg.Memory.retry`; the graph holds nothing half-applied from it."""

    def __init__(self, message: str, *, episode_id: str) -> None:
        super().__init__(message, retryable=True)
        self.episode_id = episode_id


class QueueFullError(TkgError):
    """The background ingestion queue is full (see ``max_queue`` of :class:`tkg.BackgroundIngestor`); nothing
    was stored. Wait for the queue to drain, or allow a longer queue."""


class IngestorClosedError(TkgError):
    """The background ingestor (or the :class:`tkg.AsyncMemory` around it) was closed and accepts no more work;
    nothing was stored."""


class WaitTimeoutError(TkgError, TimeoutError):
    """Waiting for a background ingestion took longer than the timeout given; the work goes on."""


class ConfigurationError(TkgError):
    """tkg was configured in a way that cannot work (for example a feature that needs an LLM without one)."""


class SnapshotError(TkgError):
    """Base class of snapshot problems."""


class SnapshotFormatError(SnapshotError):
    """The file is not a tkg snapshot, or it is truncated or corrupt."""


class SnapshotVersionError(SnapshotError):
    """The snapshot was written by a newer tkg whose format this version cannot read."""


class JournalError(SnapshotError):
    """The write-ahead journal beside a snapshot cannot be written, or is damaged where it cannot be repaired
    (a torn tail is repaired on open, not raised)."""


class MemoryInUseError(SnapshotError):
    """The files of a memory are open for writing elsewhere (:meth:`tkg.Memory.open`, in this process or another):
    one writer at a time, or the two would append to one journal and leave it unreadable."""


class BackendError(TkgError):
    """A storage backend failed, or was asked for something it does not support."""
