"""What the ``tkg`` command line prints: search results as text (facts with the period each held, entities,
episodes), counts in words, the one-line notes and errors on stderr, and the progress of a long command (with
Ctrl-C stopping it cleanly)."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, redirect_stdout
from datetime import datetime, time
from typing import Any, TypeVar

from tqdm import tqdm

from tkg.models import Entity, Episode, EpisodeSource, Fact, Kind
from tkg.search import SearchResults
from tkg.timeutil import calendar_text

__all__ = [
    "EXIT_ERROR",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "count_line",
    "error",
    "fact_range",
    "format_results",
    "interruptible",
    "note",
    "plural",
    "progress_bar",
]

#: The exit status of a user's error (bad input, missing files, mismatched embedders), as argparse uses for usage.
EXIT_ERROR = 2
#: The exit status of a command that finished but some of whose work failed (listed on stderr; a re-run retries it).
EXIT_FAILED = 1
#: The exit status after Ctrl-C, as shells report SIGINT.
EXIT_INTERRUPTED = 130

T = TypeVar("T")

_PREVIEW_CHARS = 100
PLURALS = {kind.value: kind.value + "s" for kind in Kind} | {"entity": "entities", "community": "communities"}


#: C0 and C1 control characters, but newline and tab, each as a visible escape (``\\x1b``).
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0))}


def terminal_safe(text: str) -> str:
    """``text`` with its control characters (but newlines and tabs) written as visible escapes: a terminal runs an
    escape sequence in user text (a name that sets the window title, clears the screen or rewrites a line)."""
    return text.translate(_CONTROLS)


class TerminalSafe:
    """A text stream that writes :func:`terminal_safe` text into ``stream`` (the rest of the stream as it is)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        written: int = self._stream.write(terminal_safe(text))
        return written

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextmanager
def safe_terminal_output() -> Iterator[None]:
    """While it lasts, what is printed to a terminal shows user text's control characters as escapes (a file or a
    pipe gets the text as it is)."""
    if not sys.stdout.isatty():
        yield
        return
    with redirect_stdout(TerminalSafe(sys.stdout)):  # type: ignore[type-var]
        yield


def note(message: str) -> None:
    """A note for the user on stderr (stdout stays the command's answer)."""
    print(f"tkg: note: {message}", file=sys.stderr)


def error(message: str) -> int:
    """Report a user's error as one line on stderr; returns the exit status for it."""
    print(f"tkg: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def plural(count: int, word: str) -> str:
    """``1 fact``, ``2 facts``, ``3 entities``."""
    return f"{count} {word}" if count == 1 else f"{count} {PLURALS.get(word, word + 's')}"


def count_line(counts: Mapping[str, int]) -> str:
    """``4 episodes, 5 entities, 3 facts``."""
    return ", ".join(plural(counts.get(kind, 0), kind) for kind in ("episode", "entity", "fact"))


def _when(value: datetime | None, missing: str) -> str:
    if value is None:
        return missing
    return calendar_text(value, time_of_day=value.time() != time(0))


def fact_range(fact: Fact) -> str:
    """``(2019-03-01 - 2023-02-28)``: when the fact held; ``present`` when it has not ended."""
    return f"({_when(fact.valid_at, 'unknown')} - {_when(fact.invalid_at, 'present')})"


def _preview(text: str, limit: int = _PREVIEW_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_results(results: SearchResults, indent: str = "") -> list[str]:
    """Search results as text: facts with their validity ranges, entities, episodes; each with its score."""
    sections: list[tuple[str, list[str]]] = [
        ("facts", [f"{s.score:.4f}  {s.record.fact}  {fact_range(s.record)}" for s in results.facts]),
        ("entities", [f"{s.score:.4f}  {_entity_line(s.record)}" for s in results.entities]),
        ("episodes", [f"{s.score:.4f}  {_episode_line(s.record)}" for s in results.episodes]),
    ]
    lines: list[str] = []
    for title, rows in sections:
        lines.append(f"{indent}{title}: none" if not rows else f"{indent}{title}")
        lines += [f"{indent}  {row}" for row in rows]
    return lines


def _entity_line(entity: Entity) -> str:
    labels = [label for label in entity.labels if label != "Entity"]
    kinds = f" ({', '.join(labels)})" if labels else ""
    summary = f": {_preview(entity.summary, 80)}" if entity.summary else ""
    return f"{entity.name}{kinds}{summary}"


def _episode_line(episode: Episode) -> str:
    stamp = calendar_text(episode.reference_time)
    if episode.source is EpisodeSource.MESSAGE:
        return f"[{stamp}] {_preview(episode.content)}"
    origin = f" {episode.source_description}" if episode.source_description else ""
    return f"[{stamp}] ({episode.source.value}{origin}) {_preview(episode.content, _PREVIEW_CHARS - len(origin))}"


# ----------------------------------------------------------------------------------------------------------
# long commands


@contextmanager
def progress_bar(total: int, what: str, *, enabled: bool | None = None) -> Iterator[tqdm]:
    """A progress bar on stderr with rate and time left (tqdm); ``enabled`` None: only when stderr is a terminal."""
    bar = tqdm(total=total, desc=what, unit="line", file=sys.stderr, disable=None if enabled is None else not enabled)
    try:
        yield bar
    finally:
        bar.close()


def interruptible(work: Callable[[], T], stop: threading.Event) -> T:
    """Run ``work`` on a thread and return what it returns (or raise what it raises). The first Ctrl-C sets
    ``stop`` (``work`` checks it between steps and returns early); a second one ends the process at once. Work
    never sees a KeyboardInterrupt halfway through a write: signals reach only this, the main thread."""
    outcome: dict[str, object] = {}
    finished = threading.Event()  # waited on, not Thread.join: a join interrupted by Ctrl-C breaks the thread's state

    def run() -> None:
        try:
            outcome["value"] = work()
        except BaseException as exc:  # handed to the caller below
            outcome["error"] = exc
        finally:
            finished.set()

    threading.Thread(target=run, name="tkg-work", daemon=True).start()
    while not finished.is_set():
        try:
            finished.wait(0.1)
        except KeyboardInterrupt:
            if stop.is_set():
                note("stopped at once; what was written is on disk (the journal), run the command again to resume")
                sys.stderr.flush()
                os._exit(EXIT_INTERRUPTED)
            stop.set()
            note("interrupted: finishing the work in flight, then saving (Ctrl-C again to stop at once)")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["value"]  # type: ignore[return-value]
