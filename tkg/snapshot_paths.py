"""The memory at a snapshot path, as the command lines open it: checks made before any work, and errors that say
which command or option fixes them (``tkg``, ``tkg-mcp`` and ``tkg-http`` share these)."""

from __future__ import annotations

from pathlib import Path

from tkg import snapshot
from tkg.config import MemoryConfig
from tkg.embedders.base import Embedder
from tkg.embedders.hashing import HashEmbedder
from tkg.environment import embedder_choice
from tkg.errors import ConfigurationError, ValidationError
from tkg.journal import segment_paths
from tkg.llm.base import LLMClient
from tkg.memory import Memory

__all__ = ["check_target", "open_for_pictures", "open_memory", "require_snapshot"]


def require_snapshot(path: Path) -> None:
    """Raise a helpful error when the snapshot a read-only command needs is missing."""
    if not path.exists() and not segment_paths(path):
        raise ValidationError(
            f"snapshot {path} does not exist; create it with `tkg ingest FILE --snapshot {path}` "
            f"or `tkg demo --snapshot {path}`"
        )


def check_target(path: Path) -> None:
    """Fail before any work when a snapshot could not be saved at ``path``."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise ValidationError(f"cannot save {path}: directory {directory} does not exist")
    if path.is_dir():
        raise ValidationError(f"cannot save {path}: it is a directory")


def open_memory(
    path: Path,
    embedder: Embedder,
    llm: LLMClient | None = None,
    *,
    create: bool = False,
    durable: bool = False,
    config: MemoryConfig | None = None,
) -> Memory:
    """The memory at ``path`` (its snapshot and journal); with ``create``, a missing one gives an empty memory
    instead of an error; ``durable``: opened with :meth:`tkg.Memory.open`, so every write is journalled."""
    if not create:
        require_snapshot(path)
    try:
        if durable:
            return Memory.open(path, embedder=embedder, llm=llm, create=create, config=config)
        if create and not path.exists() and not segment_paths(path):
            return Memory(embedder=embedder, llm=llm, config=config)
        return Memory.load(path, embedder=embedder, llm=llm, config=config)
    except ConfigurationError:
        meta = snapshot.read(path)[0]
        stored = str(meta.get("embedder", ""))
        raise ConfigurationError(
            f"snapshot {path} was made with the embedder {stored!r} ({meta.get('dim')}-d), not "
            f"{embedder.name!r} ({embedder.dim}-d); pass --embedder {embedder_choice(stored)}"
        ) from None


def open_for_pictures(path: Path) -> Memory:
    """Load a snapshot for drawing. Pictures never embed anything, so a hash embedder of the stored size stands
    in for whichever embedder made the snapshot: any snapshot opens, with no model to load."""
    require_snapshot(path)
    dim = snapshot.read(path)[0].get("dim")
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 2:
        raise ValidationError(f"snapshot {path} does not record a usable vector size (dim={dim!r})")
    return Memory.load(path, embedder=HashEmbedder(dim=dim), check_embedder=False)
