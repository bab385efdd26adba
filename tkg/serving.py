"""How the servers start from their command lines (``tkg-mcp``, ``tkg-http``): the options they share, the memory
they serve (a durable snapshot, or the demo), the run from start to a clean stop, and the exit on a configuration
error.

A server's ``main`` parses its own options plus :func:`add_serving_options`, then hands :func:`serve_command` a
``start`` function that builds the server around a :class:`Served` memory and returns what runs it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tkg.background import BackgroundIngestor
from tkg.demo import build_demo
from tkg.environment import add_log_option, add_model_options, llm_from_env, logging_to_stderr, make_embedder
from tkg.errors import TkgError, ValidationError
from tkg.llm.base import LLMClient
from tkg.memory import Memory
from tkg.snapshot_paths import check_target, open_memory

__all__ = ["Served", "add_serving_options", "open_for_serving", "serve_command", "serving_error"]

#: A server's exit status on a configuration error (as for a usage error argparse reports).
EXIT_CONFIGURATION = 2


@dataclass(frozen=True, slots=True)
class Served:
    """What a server serves when started from its command line: the memory and, with ``--background``, the
    background ingestor over it."""

    memory: Memory
    ingestor: BackgroundIngestor | None


def open_for_serving(
    snapshot: Path | None,
    *,
    embedder: str = "auto",
    demo: bool = False,
    llm: LLMClient | None = None,
) -> Memory:
    """The memory a server serves.

    * ``demo``: the offline demo memory ``tkg demo`` builds (group ``demo``); with a snapshot path it is written
      there first, which must not exist yet.
    * with a snapshot path the memory is opened durably (:meth:`tkg.Memory.open`): the snapshot and its
      write-ahead journal, created if missing; every write is on disk before it is answered, and the journal is
      folded into the snapshot in the background, so a write never rewrites the whole file.
    """
    if snapshot is None and not demo:
        raise ValidationError("give --snapshot PATH (created on the first write if missing), or --demo")
    if snapshot is not None:
        if demo and snapshot.exists():
            raise ValidationError(
                f"{snapshot} already exists; --demo writes a new snapshot: drop --demo to serve {snapshot}, "
                "or pick another path"
            )
        check_target(snapshot)
    chosen = make_embedder(embedder)
    if snapshot is None:
        memory = Memory(embedder=chosen, llm=llm)
        build_demo(memory)
        return memory
    memory = open_memory(snapshot, chosen, llm, create=True, durable=True)
    if demo:
        build_demo(memory)
        memory.compact()
    return memory


def add_serving_options(parser: argparse.ArgumentParser, *, background: str) -> None:
    """Add the options both servers share: which memory to serve (``--snapshot``, ``--demo``), with which embedder,
    with or without the LLM, and ``--background`` (``background`` is its help text, naming the server's own way to
    queue an episode)."""
    parser.add_argument(
        "--snapshot",
        type=Path,
        help="memory to serve: its snapshot, every write journalled beside it (PATH.journal.*; created if missing)",
    )
    parser.add_argument("--demo", action="store_true", help="start from the offline demo memory (group 'demo')")
    add_model_options(parser)
    add_log_option(parser, default="info")
    parser.add_argument("--background", action="store_true", help=background)


def serve_command(prog: str, args: argparse.Namespace, start: Callable[[Served], Callable[[], object]]) -> int:
    """Run a server from its parsed command line (the options of :func:`add_serving_options`); returns the exit
    status.

    Opens the memory (:func:`open_for_serving`; the LLM from ``TKG_LLM_BASE_URL`` unless ``--no-llm``), starts the
    background ingestor with ``--background`` (resuming episodes a previous run left queued), and calls ``start``,
    which builds the server and returns what runs it until it stops. A :class:`~tkg.errors.TkgError` before then
    is a configuration error: its message goes to stderr and the status is 2. On the way out, what was accepted is
    finished, so nothing accepted is lost on a normal shutdown.
    """
    with logging_to_stderr(args.log_level):
        return _serve(prog, args, start)


def _serve(prog: str, args: argparse.Namespace, start: Callable[[Served], Callable[[], object]]) -> int:
    ingestor: BackgroundIngestor | None = None
    memory: Memory | None = None
    try:
        llm = None if args.no_llm else llm_from_env()
        memory = open_for_serving(args.snapshot, embedder=args.embedder, demo=args.demo, llm=llm)
        ingestor = BackgroundIngestor(memory, resume=True) if args.background else None
        run = start(Served(memory, ingestor))
    except TkgError as exc:
        if ingestor is not None:  # nothing was served: what it resumed stays queued in the memory
            ingestor.close(drain=False)
        if memory is not None:
            memory.close()
        return serving_error(prog, exc)
    try:
        run()
    finally:
        if ingestor is not None:
            ingestor.close(drain=True)
        memory.close()  # the journal closed; every write was on disk already
    return 0


def serving_error(prog: str, exc: TkgError) -> int:
    """Report a server's configuration error on stderr; returns the exit status for it (2)."""
    print(f"{prog}: error: {exc}", file=sys.stderr)
    return EXIT_CONFIGURATION
