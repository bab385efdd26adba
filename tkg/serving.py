"""How the servers start from their command lines (``tkg-mcp``, ``tkg-http``): the options they share, the memory
they serve (a durable snapshot, a PostgreSQL schema, or the demo), the run from start to a clean stop, and the exit
on a configuration error.

A server's ``main`` parses its own options plus :func:`add_serving_options`, then hands :func:`serve_command` a
``start`` function that builds the server around a :class:`Served` memory and returns what runs it.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

from tkg.background import BackgroundIngestor
from tkg.demo import DEMO_GROUP, build_demo
from tkg.environment import add_log_option, add_model_options, llm_from_env, logging_to_stderr, make_embedder
from tkg.errors import TkgError, ValidationError
from tkg.llm.base import LLMClient
from tkg.locations import Location, add_store_options, check_target, location_of, opened
from tkg.memory import Memory

__all__ = ["Served", "add_serving_options", "opened_for_serving", "serve_command", "serving_error"]

#: A server's exit status on a configuration error (as for a usage error argparse reports).
EXIT_CONFIGURATION = 2


@dataclass(frozen=True, slots=True)
class Served:
    """What a server serves when started from its command line: the memory and, with ``--background``, the
    background ingestor over it."""

    memory: Memory
    ingestor: BackgroundIngestor | None


@contextmanager
def opened_for_serving(
    location: Location | None,
    *,
    embedder: str = "auto",
    demo: bool = False,
    llm: LLMClient | None = None,
) -> Iterator[Memory]:
    """The memory a server serves, closed on the way out.

    * ``demo``: the offline demo memory ``tkg demo`` builds (group ``demo``); with a location it is written there
      first: a snapshot that must not exist yet, or a database schema that has no ``demo`` group yet.
    * a snapshot path is opened durably (:meth:`tkg.Memory.open`): the snapshot and its write-ahead journal, created
      if missing; every write is on disk before it is answered, and the journal is folded into the snapshot in
      the background, so a write never rewrites the whole file. A PostgreSQL DSN: every write is a transaction.
    """
    if location is None and not demo:
        raise ValidationError(
            "give --store (a snapshot path, created on the first write if missing, or a postgresql:// DSN), or --demo"
        )
    if location is not None:
        if demo and location.path is not None and location.path.exists():
            raise ValidationError(
                f"{location.path} already exists; --demo writes a new snapshot: drop --demo to serve it, "
                "or pick another path"
            )
        check_target(location)
    chosen = make_embedder(embedder)
    if location is None:
        memory = Memory(embedder=chosen, llm=llm)
        build_demo(memory)
        yield memory
        return
    with opened(location, chosen, llm, create=True, durable=True) as memory:
        if demo:
            if DEMO_GROUP in memory.groups():
                raise ValidationError(f"{location} already holds the group {DEMO_GROUP!r}; drop --demo to serve it")
            build_demo(memory)
            memory.compact()
        yield memory


def add_serving_options(parser: argparse.ArgumentParser, *, background: str) -> None:
    """Add the options both servers share: which memory to serve (``--snapshot``, ``--demo``), with which embedder,
    with or without the LLM, and ``--background`` (``background`` is its help text, naming the server's own way to
    queue an episode)."""
    add_store_options(
        parser,
        "memory to serve, created if missing (a snapshot's writes are journalled beside it, PATH.journal.*)",
        required=False,
    )
    parser.add_argument("--demo", action="store_true", help="start from the offline demo memory (group 'demo')")
    add_model_options(parser)
    add_log_option(parser, default="info")
    parser.add_argument("--background", action="store_true", help=background)


def serve_command(prog: str, args: argparse.Namespace, start: Callable[[Served], Callable[[], object]]) -> int:
    """Run a server from its parsed command line (the options of :func:`add_serving_options`); returns the exit
    status.

    Opens the memory (:func:`opened_for_serving`; the LLM from ``TKG_LLM_BASE_URL`` unless ``--no-llm``), starts the
    background ingestor with ``--background`` (resuming episodes a previous run left queued), and calls ``start``,
    which builds the server and returns what runs it until it stops. A :class:`~tkg.errors.TkgError` before then
    is a configuration error: its message goes to stderr and the status is 2. On the way out, what was accepted is
    finished, so nothing accepted is lost on a normal shutdown.
    """
    with logging_to_stderr(args.log_level):
        return _serve(prog, args, start)


def _serve(prog: str, args: argparse.Namespace, start: Callable[[Served], Callable[[], object]]) -> int:
    with ExitStack() as stack:
        ingestor: BackgroundIngestor | None = None
        try:
            llm = None if args.no_llm else llm_from_env()
            memory = stack.enter_context(
                opened_for_serving(location_of(args), embedder=args.embedder, demo=args.demo, llm=llm)
            )
            ingestor = BackgroundIngestor(memory, resume=True) if args.background else None
            run = start(Served(memory, ingestor))
        except TkgError as exc:
            if ingestor is not None:  # nothing was served: what it resumed stays queued in the memory
                ingestor.close(drain=False)
            return serving_error(prog, exc)
        try:
            run()
        finally:
            if ingestor is not None:
                ingestor.close(drain=True)
        # leaving the stack closes the memory (the journal, or the database connection); every write was on disk
    return 0


def serving_error(prog: str, exc: TkgError) -> int:
    """Report a server's configuration error on stderr; returns the exit status for it (2)."""
    print(f"{prog}: error: {exc}", file=sys.stderr)
    return EXIT_CONFIGURATION
