"""Where a command line's memory lives, and opening it there: a snapshot file (with its journal) or a schema in a
PostgreSQL database. ``tkg``, ``tkg-mcp`` and ``tkg-http`` share these, with their checks made before any work and
errors that say which command or option fixes them.

``--store`` takes either: a value that starts with ``postgresql://`` or ``postgres://`` is a PostgreSQL DSN (the
tables in ``--schema``, default ``tkg``; needs the ``postgres`` extra), anything else a snapshot path.
``--snapshot`` is the same option under its older name.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tkg import snapshot
from tkg.config import MemoryConfig
from tkg.embedders.base import Embedder
from tkg.embedders.hashing import HashEmbedder
from tkg.environment import embedder_choice
from tkg.errors import ConfigurationError, ValidationError
from tkg.journal import recorded_meta, segment_paths
from tkg.llm.base import LLMClient
from tkg.memory import Memory
from tkg.persistence import unsavable
from tkg.storage import Store

__all__ = [
    "DSN_PREFIXES",
    "Location",
    "add_store_options",
    "check_target",
    "location_of",
    "opened",
    "opened_read_only",
    "require_memory",
    "stored_meta",
]

#: How a ``--store`` value that is a PostgreSQL DSN begins (libpq's URI forms).
DSN_PREFIXES = ("postgresql://", "postgres://")


@dataclass(frozen=True, slots=True)
class Location:
    """A memory's place: a snapshot ``path``, or a PostgreSQL ``dsn`` and ``schema``."""

    path: Path | None = None
    dsn: str | None = None
    schema: str = "tkg"

    @classmethod
    def parse(cls, value: str | Path, schema: str = "tkg") -> Location:
        text = str(value)
        if text.startswith(DSN_PREFIXES):
            return cls(dsn=text, schema=schema)
        if not text.strip():
            raise ValidationError("--store is empty: give a snapshot path or a postgresql:// DSN")
        return cls(path=Path(text))

    @property
    def is_postgres(self) -> bool:
        return self.dsn is not None

    def __str__(self) -> str:
        if self.dsn is not None:
            return f"PostgreSQL schema {self.schema!r} at {_postgres().connection.describe(self.dsn)}"
        return str(self.path)


def add_store_options(parser: argparse.ArgumentParser, help_text: str, *, required: bool = True) -> None:
    """``--store`` (alias ``--snapshot``) and ``--schema`` on ``parser``."""
    parser.add_argument(
        "--store",
        "--snapshot",
        dest="store",
        metavar="PATH|DSN",
        required=required,
        help=f"{help_text}: a snapshot file, or a PostgreSQL DSN (postgresql://user@host/db)",
    )
    parser.add_argument(
        "--schema", default="tkg", help="PostgreSQL schema holding the memory, with a DSN (default: tkg)"
    )


def location_of(args: argparse.Namespace) -> Location | None:
    """The location the parsed options of :func:`add_store_options` name (None: no ``--store`` given)."""
    return None if args.store is None else Location.parse(args.store, args.schema)


# ----------------------------------------------------------------------------------------------------------
# checks before any work


def stored_meta(location: Location) -> dict[str, Any] | None:
    """What the memory at ``location`` records about itself (``embedder``, ``dim``; a snapshot also ``saved_at``),
    or None when nothing is there yet."""
    if location.dsn is not None:
        settings = _postgres().stored_settings(location.dsn, location.schema)
        if settings is None:
            return None
        return {**settings, "dim": int(settings["dim"])}
    assert location.path is not None
    if not location.path.exists():
        return None
    return snapshot.read_meta(location.path)


def known_meta(location: Location) -> dict[str, Any] | None:
    """:func:`stored_meta`, or for a memory whose journal has no snapshot yet (a server stopped before its first
    one) what the journal tells: the vectors' size (``dim``) and the embedder that made them (``embedder``, when
    its segments record it)."""
    meta = stored_meta(location)
    if meta is None and location.path is not None and segment_paths(location.path):
        return recorded_meta(location.path)
    return meta


def require_memory(location: Location) -> None:
    """Raise a helpful error when the memory a read-only command needs is not there."""
    if location.path is not None:
        if location.path.exists() or segment_paths(location.path):
            return
    elif stored_meta(location) is not None:
        return
    if location.path is not None:
        where, missing = str(location.path), f"snapshot {location.path} does not exist"
    else:
        where, missing = "DSN", f"{location} holds no tkg memory"
    raise ValidationError(f"{missing}; create it with `tkg ingest FILE --store {where}` or `tkg demo --store {where}`")


def check_target(location: Location) -> None:
    """Fail before any work when a snapshot could not be saved at the location (a database is checked when it is
    opened)."""
    problem = None if location.path is None else unsavable(location.path)
    if problem is not None:
        raise ValidationError(f"cannot save {location.path}: {problem}")


def check_output(location: Location, out: str | Path) -> None:
    """Fail before any work when a command's output file ``out`` is the memory it reads: the snapshot at the
    location or one of its journal segments (writing there would destroy the memory)."""
    if location.path is None:
        return
    snapshot, target = location.path.resolve(), Path(out).resolve()
    if target == snapshot or (target.parent == snapshot.parent and target.name.startswith(f"{snapshot.name}.journal.")):
        raise ValidationError(f"--out {out} is the memory itself ({location.path}); write the output elsewhere")


# ----------------------------------------------------------------------------------------------------------
# opening


@contextmanager
def opened(
    location: Location,
    embedder: Embedder,
    llm: LLMClient | None = None,
    *,
    create: bool = False,
    durable: bool = False,
    config: MemoryConfig | None = None,
    check_embedder: bool = True,
) -> Iterator[Memory]:
    """The memory at ``location``, closed (with its database connection) on the way out.

    ``create``: a missing memory is an empty one instead of an error. ``durable``: a snapshot is opened with
    :meth:`tkg.Memory.open`, so every write is journalled (a database is durable anyway). ``check_embedder=False``:
    ``embedder`` stands in for the one that made the memory (a reader that embeds nothing).
    """
    if not create:
        require_memory(location)
    store: Store | None = None
    try:
        try:
            store = _open_store(location, embedder.dim) if location.is_postgres else None
            memory = _memory_at(location, store, embedder, llm, create, durable, config, check_embedder)
        except ConfigurationError as exc:
            raise _embedder_hint(location, embedder, exc) from None
        try:
            yield memory
        finally:
            memory.close()
    finally:
        if store is not None:
            store.close()


def _memory_at(
    location: Location,
    store: Store | None,
    embedder: Embedder,
    llm: LLMClient | None,
    create: bool,
    durable: bool,
    config: MemoryConfig | None,
    check_embedder: bool,
) -> Memory:
    path = location.path
    if store is not None:
        return Memory(store, embedder=embedder, llm=llm, config=config, check_embedder=check_embedder)
    assert path is not None
    if durable:
        return Memory.open(
            path, embedder=embedder, llm=llm, create=create, config=config, check_embedder=check_embedder
        )
    if create and not path.exists() and not segment_paths(path):
        return Memory(embedder=embedder, llm=llm, config=config)
    return Memory.load(path, embedder=embedder, llm=llm, config=config, check_embedder=check_embedder)


def _embedder_hint(location: Location, embedder: Embedder, exc: ConfigurationError) -> ConfigurationError:
    """``exc`` or, when the memory records another embedder, an error that names the ``--embedder`` to pass."""
    meta = known_meta(location) or {}
    stored = str(meta.get("embedder", ""))
    if not stored or (stored == embedder.name and meta.get("dim") == embedder.dim):
        return exc
    return ConfigurationError(
        f"{location} was made with the embedder {stored!r} ({meta.get('dim')}-d), not "
        f"{embedder.name!r} ({embedder.dim}-d); pass --embedder {embedder_choice(stored)}"
    )


@contextmanager
def opened_read_only(location: Location) -> Iterator[Memory]:
    """The memory at ``location`` for commands that embed nothing (pictures, stats): a hash embedder of the stored
    size stands in for whichever embedder made it, so any memory opens with no model to load."""
    meta = known_meta(location)
    if meta is None:
        require_memory(location)
    dim = (meta or {}).get("dim")
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 2:
        raise ValidationError(f"{location} does not record a usable vector size (dim={dim!r})")
    with opened(location, HashEmbedder(dim=dim), check_embedder=False) as memory:
        yield memory


def _open_store(location: Location, dim: int) -> Store:
    assert location.dsn is not None
    store: Store = _postgres().PostgresStore(location.dsn, dim=dim, schema=location.schema)
    return store


def _postgres() -> Any:
    try:
        import tkg.backends.postgres as postgres
    except ImportError as exc:
        raise ConfigurationError(
            f"a PostgreSQL --store needs the postgres extra (pip install 'tkg[postgres]'): {exc}"
        ) from None
    return postgres
