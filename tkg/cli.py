"""The ``tkg`` command line: ingest JSONL into a memory, search it, build context, show stats, draw pictures, export
and import, run the demo.

Every subcommand works on a memory given by ``--store``: a snapshot file, or a PostgreSQL DSN (see
:mod:`tkg.locations`). Embedders and the optional LLM are configured by
``--embedder`` and by environment variables, which are read when a command runs (never at import; see
:mod:`tkg.environment`).

Errors that come from the user (bad input, missing files, mismatched embedders) are printed as one line,
``tkg: error: ...``, with exit status 2.

This module holds the parser, :func:`main` and the commands; what they read is parsed in :mod:`tkg.cli_input`,
what they print is formatted in :mod:`tkg.cli_output`, and the demo is :mod:`tkg.demo`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tkg import pictures
from tkg.cli_ingest import ingest, lines_of, record_counts
from tkg.cli_input import KINDS, MessageLine, cli_time, parse_input, read_input
from tkg.cli_output import (
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    PLURALS,
    count_line,
    error,
    format_results,
    interruptible,
    note,
    plural,
    progress_bar,
    safe_terminal_output,
)
from tkg.config import MemoryConfig
from tkg.demo import DEMO_GROUP, DEMO_PAST, show_demo
from tkg.environment import (
    add_log_option,
    add_model_options,
    embedder_choice,
    llm_from_env,
    logging_to_stderr,
    make_embedder,
)
from tkg.errors import TkgError, ValidationError
from tkg.export import FORMATS
from tkg.journal import read_segments, segment_paths
from tkg.llm.guard import LLMPolicy
from tkg.locations import (
    Location,
    add_store_options,
    check_output,
    check_target,
    known_meta,
    location_of,
    opened,
    opened_read_only,
)
from tkg.memory import Memory
from tkg.models import Entity, Fact, Kind
from tkg.wire_shapes import results_json

__all__ = ["build_parser", "main"]


# ----------------------------------------------------------------------------------------------------------
# commands


def _search_args(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "group_ids": args.group,
        "limit": args.limit,
        "as_of": cli_time(args.as_of, "--as-of"),
        "known_at": cli_time(args.known_at, "--known-at"),
        "include_invalidated": args.include_invalidated,
    }


def _where(args: argparse.Namespace) -> Location:
    location = location_of(args)
    assert location is not None  # --store is required by every command that calls this
    return location


def _saved(memory: Memory, location: Location) -> str:
    """Fold a snapshot's journal into it (a database has nothing to save); says where the memory is."""
    if location.path is None:
        return f"in {location}"
    size = memory.save(location.path)  # its own file: the journal folded into the snapshot
    return f"{location.path} ({size:,} bytes)"


def cmd_ingest(args: argparse.Namespace) -> int:
    """``tkg ingest``: validate the whole file, then add what an earlier run did not, with progress; Ctrl-C stops
    after the episodes in flight and keeps everything done (a re-run resumes)."""
    path = Path(args.file)
    items = parse_input(str(path), read_input(path), args.kind)
    location = _where(args)
    check_target(location)
    if args.concurrency < 1:
        raise ValidationError(f"--concurrency must be at least 1, got {args.concurrency}")
    llm = None if args.no_llm else llm_from_env()
    config = MemoryConfig(llm_policy=LLMPolicy(max_concurrency=args.concurrency))
    total = sum(lines_of(item) for item in items)
    with (
        _no_empty_memory_left(location),
        opened(location, make_embedder(args.embedder), llm, create=True, durable=True, config=config) as memory,
    ):
        with progress_bar(total, "ingest", enabled=args.progress) as bar:
            stop = threading.Event()
            report = interruptible(
                lambda: ingest(
                    memory,
                    items,
                    name=str(path),
                    group=args.group,
                    chunk=4 * args.concurrency,
                    progress=bar.update,
                    stop=stop,
                ),
                stop,
            )
        where, totals = _saved(memory, location), record_counts(memory)
    for warning in report.warnings:
        note(warning)
    messages = sum(isinstance(item, MessageLine) for item in items)
    print(f"read {path}: {plural(messages, 'message')}, {plural(total - messages, 'fact')}")
    if report.skipped:
        print(f"skipped {plural(report.skipped, 'line')} already in the memory (an earlier run)")
    print(f"added {count_line(report.added)}; LLM calls: {report.llm_calls}")
    if report.messages and llm is None:
        note("no LLM configured: messages were stored as episodes; set TKG_LLM_BASE_URL to extract facts")
    print(f"saved {where}: {count_line(totals)} in total")
    command = (
        f"tkg ingest {shlex.quote(str(path))} --store {shlex.quote(args.store) if location.path is not None else 'DSN'}"
    )
    if report.stopped:
        note(
            f"stopped: {report.done:,} of {plural(report.total, 'line')} done and saved; run `{command} ...` "
            "again to resume (done lines are skipped)"
        )
        return EXIT_INTERRUPTED
    if report.failures:
        for failure in report.failures:
            note(f"failed: {failure.where}: {failure.reason}")
        note(
            f"{plural(len(report.failures), 'episode')} failed and {'is' if len(report.failures) == 1 else 'are'} "
            f"stored as failed; run `{command} ...` again to retry them"
        )
        return EXIT_FAILED
    return 0


#: At a terminal a group that holds nothing is more likely a typo than a user not seen yet: say so.
TYPO_GUARD = MemoryConfig(strict_groups=True)


def cmd_search(args: argparse.Namespace) -> int:
    """``tkg search``: hybrid search with the time filters, as text or ``--json``."""
    with opened(_where(args), make_embedder(args.embedder), config=TYPO_GUARD) as memory:
        results = memory.search(args.query, **_search_args(args))
    if args.json:
        print(json.dumps(results_json(memory, results), ensure_ascii=False, indent=2))
    else:
        print("\n".join(format_results(results)))
    return 0


def cmd_context(args: argparse.Namespace) -> int:
    """``tkg context``: the context string an agent would put in its prompt."""
    with opened(_where(args), make_embedder(args.embedder), config=TYPO_GUARD) as memory:
        text = memory.context(
            args.query, max_chars=args.max_chars, include_episodes=args.episodes, **_search_args(args)
        )
    if text:
        print(text)
    else:
        note("nothing relevant found")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """``tkg export``: write a memory for other tools, or losslessly for ``tkg import``."""
    location = _where(args)
    check_output(location, args.out)
    with opened(location, make_embedder(args.embedder), config=TYPO_GUARD) as memory:
        unknown = sorted(set(args.group or ()) - set(memory.groups()))
        if unknown:
            raise ValidationError(f"group(s) {unknown} hold nothing in {location}")
        count = memory.export(args.out, args.format, args.group)
    print(f"wrote {args.out} ({args.format}): {count:,} records")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    """``tkg import``: add the groups of a ``tkg export`` JSONL file to a snapshot, exactly as they were."""
    location = _where(args)
    check_target(location)
    # An import is all or nothing: one into a snapshot that did not exist leaves no file behind when it fails.
    with (
        _no_empty_memory_left(location),
        opened(location, make_embedder(args.embedder), create=True, durable=True) as memory,
    ):
        imported = memory.import_jsonl(args.file)
        where, totals = _saved(memory, location), record_counts(memory)
    print(f"imported {args.file}: {count_line(imported)}")
    print(f"saved {where}: {count_line(totals)} in total")
    return 0


@contextmanager
def _no_empty_memory_left(location: Location) -> Iterator[None]:
    """A command that makes a new memory at ``location`` and fails before it wrote anything leaves no file behind
    (an import or an ingestion refused after the memory was opened); what it wrote, it keeps."""
    path = location.path
    fresh = path is not None and not path.exists() and not segment_paths(path)
    try:
        yield
    except BaseException:
        if fresh and path is not None and not path.exists() and not _journalled(path):
            for made in segment_paths(path):
                made.unlink(missing_ok=True)
        raise


def _journalled(path: Path) -> bool:
    """Whether the journal of ``path`` holds a batch (a damaged one counts: it is kept)."""
    try:
        return bool(read_segments(path, repair=False).entries)
    except TkgError:
        return True


def cmd_stats(args: argparse.Namespace) -> int:
    """``tkg stats``: what a memory holds. Embeds nothing, so a memory of any embedder opens."""
    location = _where(args)
    now, ended = datetime.now(UTC), 0
    with opened_read_only(location) as memory:
        # a journal without a snapshot records its embedder in its segments (format 2); else the stand-in
        # embedder has its vectors' size
        meta = known_meta(location) or {"dim": memory.embedder.dim}
        counts = memory.stats()["records"]
        groups = memory.groups()
        for fact in memory.records(Kind.FACT):
            assert isinstance(fact, Fact)
            if fact.expired_at is not None or (fact.invalid_at is not None and fact.invalid_at <= now):
                ended += 1
    stored = str(meta.get("embedder", "?"))
    if location.path is not None and location.path.exists():
        print(
            f"snapshot     {location.path} ({location.path.stat().st_size:,} bytes, saved {meta.get('saved_at', '?')})"
        )
    elif location.path is not None:
        journal = sum(p.stat().st_size for p in segment_paths(location.path))
        print(f"snapshot     {location.path}: none yet, its journal holds every write ({journal:,} bytes)")
    else:
        print(f"store        {location}")
    dim = meta.get("dim") or "?"
    if meta.get("embedder"):
        print(f"embedder     {stored} ({dim}-d; --embedder {embedder_choice(stored)})")
    else:
        print(f"embedder     not recorded ({dim}-d vectors; written by an older tkg)")
    print(f"groups       {', '.join(groups) or '-'}")
    for kind in Kind:
        detail = f"  ({counts[kind.value] - ended} current, {ended} ended)" if kind is Kind.FACT else ""
        print(f"{PLURALS[kind.value]:<12} {counts[kind.value]}{detail}")
    return 0


# ----------------------------------------------------------------------------------------------------------
# pictures


def _picture_subject(
    args: argparse.Namespace, stack: ExitStack
) -> tuple[Memory, Entity, datetime | None, datetime | None]:
    """What ``tkg timeline`` and ``tkg graph`` draw: the memory (open until ``stack`` closes), the named entity, and
    the view times."""
    as_of, known_at = cli_time(args.as_of, "--as-of"), cli_time(args.known_at, "--known-at")
    location = _where(args)
    check_output(location, args.out)
    memory = stack.enter_context(opened_read_only(location))
    return memory, pictures.find_entity(memory, args.entity, group_ids=args.group), as_of, known_at


def cmd_timeline(args: argparse.Namespace) -> int:
    """``tkg timeline``: draw an entity's fact timeline as PNG or SVG."""
    with ExitStack() as stack:
        memory, entity, as_of, known_at = _picture_subject(args, stack)
        result = pictures.render_timeline(
            memory,
            entity.id,
            Path(args.out),
            format=args.format,
            as_of=as_of,
            known_at=known_at,
            max_facts=args.max_facts,
        )
    layout = result.layout
    left_out = f" ({layout.omitted} older left out; raise --max-facts)" if layout.omitted else ""
    print(
        f"wrote {args.out} ({len(result.data):,} bytes, {result.format}): {plural(len(layout.bars), 'fact')} "
        f"of {entity.name} ({entity.id}){left_out}"
    )
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    """``tkg graph``: write an entity's neighbourhood as a self-contained HTML page."""
    with ExitStack() as stack:
        memory, entity, as_of, known_at = _picture_subject(args, stack)
        result = pictures.render_neighbourhood(
            memory, entity.id, Path(args.out), depth=args.depth, as_of=as_of, known_at=known_at, limit=args.limit
        )
    layout = result.layout
    left_out = (
        f"; left out {layout.omitted_nodes} entities, {layout.omitted_edges} facts"
        if (layout.omitted_nodes or layout.omitted_edges)
        else ""
    )
    print(
        f"wrote {args.out} ({len(result.data):,} bytes): {plural(len(layout.nodes), 'entity')}, "
        f"{plural(len(layout.edges), 'fact')} within {layout.depth} hop(s) of {entity.name}{left_out}; "
        "open it in a browser (works offline)"
    )
    return 0


# ----------------------------------------------------------------------------------------------------------
# demo


def cmd_demo(args: argparse.Namespace) -> int:
    """``tkg demo``: build a small memory from the bundled example and show search, context and time travel."""
    location = location_of(args)
    if (
        location is not None
        and location.path is not None
        and (
            location.path.exists() or segment_paths(location.path)  # a memory may live in its journal alone
        )
    ):
        raise ValidationError(
            f"{location.path} already holds a memory; the demo writes a new snapshot: remove it or pick another path"
        )
    if location is not None:
        check_target(location)
    llm = None if args.no_llm else llm_from_env()
    embedder = make_embedder(args.embedder)
    flag = "" if args.embedder == "auto" else f" --embedder {args.embedder}"
    if location is None:
        show_demo(Memory(embedder=embedder, llm=llm), llm)
    elif location.path is not None:
        memory = Memory(embedder=embedder, llm=llm)
        show_demo(memory, llm)
        size = memory.save(location.path)
        store = shlex.quote(str(location.path))  # a command to paste: a path with spaces quoted
        print(
            f"\nsaved {location.path} ({size:,} bytes); try: tkg search Alice --store {store}{flag} --as-of {DEMO_PAST}"
        )
    else:
        with opened(location, embedder, llm, create=True) as memory:
            if DEMO_GROUP in memory.groups():
                raise ValidationError(f"{location} already holds the group {DEMO_GROUP!r}; use another --schema")
            show_demo(memory, llm)
        schema = "" if location.schema == "tkg" else f" --schema {location.schema}"
        print(f"\nsaved in {location}; try: tkg search Alice --store DSN{schema}{flag} --as-of {DEMO_PAST}")
    return 0


# ----------------------------------------------------------------------------------------------------------
# argument parsing and the entry point


#: The input format of ``tkg ingest`` (its ``--help`` epilog; the README says the same).
INGEST_FORMAT = """\
input: one JSON object per line (UTF-8; blank lines skipped). The whole file is checked before anything is added.
  message line: {"content": "Alice: I moved to Paris."}  or  {"speaker": "Alice", "text": "I moved to Paris."}
      optional: "reference_time" (ISO-8601, what relative dates mean; default now), "source" (message, text,
      json: content may then be any JSON value), "source_description", "name", "id" (the episode's id)
  fact line: {"subject": "Alice", "relation": "LIVES_IN", "object": "Paris"}
      optional: "fact" (the sentence), "valid_at", "invalid_at" (ISO-8601), "subject_label", "object_label"
  Consecutive fact lines are added together as one JSON episode, with no LLM. Times need a UTC offset.
  FILE.csv: a table of facts with a header row: subject (or source), relation (or type), object (or target),
      optional fact, valid_at, invalid_at, subject_label, object_label (tkg export --format csv writes one).

resuming: each line's episode id comes from the line itself (or its "id"), so running the same command again
skips what is already in the memory and retries what failed. Ctrl-C stops after the episodes in flight and
saves what is done. Exit status: 0 done, 1 some episodes failed (listed; stored as failed), 2 bad input,
130 stopped.
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``tkg`` argument parser with its subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    add_model_options(common)
    filters = argparse.ArgumentParser(add_help=False)
    add_store_options(filters, "memory to read")
    filters.add_argument("--group", action="append", help="search only this group (repeatable); default: all")
    filters.add_argument("--limit", type=int, help="results per kind (default 10)")
    filters.add_argument("--as-of", help="what held in the world at this time (ISO-8601; no offset means UTC)")
    filters.add_argument("--known-at", help="what the memory knew at this time (ISO-8601; no offset means UTC)")
    filters.add_argument("--include-invalidated", action="store_true", help="include facts that have ended")

    parser = argparse.ArgumentParser(prog="tkg", description="Embedded temporal knowledge-graph memory.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ingest_p = _command(
        commands, "ingest", cmd_ingest, "add messages and facts from a JSONL file", [common], epilog=INGEST_FORMAT
    )
    ingest_p.add_argument("file", metavar="FILE", help="JSONL: message lines and/or fact lines (see below)")
    add_store_options(ingest_p, "memory to add to (created if missing)")
    ingest_p.add_argument("--kind", choices=KINDS, default="auto", help="what the lines are (auto: decide per line)")
    ingest_p.add_argument("--group", help="group (tenant) to add to; default: 'default'")
    ingest_p.add_argument(
        "--concurrency", type=int, default=LLMPolicy().max_concurrency, help="LLM calls at once (default %(default)s)"
    )
    shown = ingest_p.add_mutually_exclusive_group()
    shown.add_argument(
        "--progress", action="store_true", default=None, help="show a progress bar (default: when stderr is a terminal)"
    )
    shown.add_argument("--no-progress", dest="progress", action="store_false", help="never show the progress bar")

    search_p = _command(
        commands, "search", cmd_search, "hybrid search over facts, entities, episodes", [common, filters]
    )
    search_p.add_argument("query", metavar="QUERY")
    search_p.add_argument("--json", action="store_true", help="print machine-readable JSON")

    context_p = _command(commands, "context", cmd_context, "print the context string for a query", [common, filters])
    context_p.add_argument("query", metavar="QUERY")
    context_p.add_argument("--max-chars", type=int, help="budget for the whole context string")
    episodes = context_p.add_mutually_exclusive_group()
    episodes.add_argument(
        "--episodes", action="store_true", default=None, help="include source episodes (default: when no fact is found)"
    )
    episodes.add_argument("--no-episodes", dest="episodes", action="store_false", help="never include episodes")

    export_p = _command(
        commands,
        "export",
        cmd_export,
        "write a memory out (jsonl: lossless; csv, graphml, neo4j: for other tools)",
        [common],
    )
    add_store_options(export_p, "memory to read")
    export_p.add_argument("--format", choices=FORMATS, default="jsonl", help="default jsonl (see the README)")
    export_p.add_argument("--out", required=True, help="file to write (neo4j: a folder)")
    export_p.add_argument("--group", action="append", help="export only this group (repeatable); default: all")

    import_p = _command(commands, "import", cmd_import, "add the groups of a 'tkg export' JSONL file", [common])
    import_p.add_argument("file", metavar="FILE", help="a file written by 'tkg export --format jsonl'")
    add_store_options(import_p, "memory to add to (created if missing)")

    stats_p = _command(commands, "stats", cmd_stats, "what a memory holds", [common])
    add_store_options(stats_p, "memory to read (any embedder's)")

    pictures_common = argparse.ArgumentParser(add_help=False)
    pictures_common.add_argument("entity", metavar="ENTITY", help="entity id, or its exact name or alias")
    add_store_options(pictures_common, "memory to read (any embedder's)")
    pictures_common.add_argument("--group", action="append", help="look for ENTITY only in this group (repeatable)")
    pictures_common.add_argument("--known-at", help="the memory as it stood at this time (ISO-8601; no offset: UTC)")
    timeline_p = _command(
        commands, "timeline", cmd_timeline, "draw an entity's fact timeline (PNG or SVG)", [pictures_common]
    )
    timeline_p.add_argument("--out", required=True, help="image to write: FILE.png or FILE.svg")
    timeline_p.add_argument("--format", choices=("png", "svg"), help="image format (default: from --out's suffix)")
    timeline_p.add_argument("--as-of", help="mark this moment and fade facts that did not hold then (ISO-8601)")
    timeline_p.add_argument("--max-facts", type=int, default=200, help="draw at most this many, newest (default 200)")
    graph_p = _command(
        commands, "graph", cmd_graph, "write an entity's neighbourhood as an offline HTML page", [pictures_common]
    )
    graph_p.add_argument("--out", required=True, help="HTML file to write")
    graph_p.add_argument("--depth", type=int, default=1, help="hops from the entity, 1 to 3 (default 1)")
    graph_p.add_argument("--as-of", help="only facts that held at this time (ISO-8601); default: all, ended dashed")
    graph_p.add_argument("--limit", type=int, default=100, help="entities drawn at most, nearest first (default 100)")

    demo_p = _command(commands, "demo", cmd_demo, "build a small example memory and query it (offline)", [common])
    add_store_options(demo_p, "also save the demo memory here (a new snapshot file, or a schema)", required=False)
    return parser


def _command(
    commands: Any,
    name: str,
    func: Callable[[argparse.Namespace], int],
    help_text: str,
    parents: list[argparse.ArgumentParser],
    epilog: str | None = None,
) -> argparse.ArgumentParser:
    sub: argparse.ArgumentParser = commands.add_parser(
        name,
        help=help_text,
        description=help_text,
        parents=parents,
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_log_option(sub, default="error")  # what goes wrong is reported by the command itself
    sub.set_defaults(func=func)
    return sub


def _version() -> str:
    from tkg import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    """Run the ``tkg`` command line; returns the exit status (0 on success, 2 on a user error)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help / --version, or a usage error argparse has already printed
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_ERROR)
    try:
        with logging_to_stderr(args.log_level), safe_terminal_output():
            return int(args.func(args))
    except TkgError as exc:
        return error(str(exc))
    except BrokenPipeError:  # e.g. `tkg search ... | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except FileNotFoundError as exc:
        return error(f"{exc.filename}: no such file or directory")
    except OSError as exc:
        return error(f"{exc.filename or 'I/O'}: {exc.strerror or exc}")
    except KeyboardInterrupt:
        print("tkg: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
