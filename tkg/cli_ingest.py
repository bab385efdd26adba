"""The loop of ``tkg ingest``: the lines of an input file (parsed and checked by :mod:`tkg.cli_input`) added to a
memory in chunks through the bulk path (:meth:`tkg.Memory.add_episodes`: extraction calls concurrent, graph
changes in order), resumable, with progress and a clean stop between chunks.

Resumable: each line's episode gets an id derived from the line itself (its group, its fields, and how many
identical lines came before it), or the line's own ``"id"``. A run first looks those ids up: a line whose episode is
in the memory is skipped, one whose extraction failed is tried again, so running the same command twice adds
nothing the second time, and a run stopped half-way (Ctrl-C) continues where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

from tkg.cli_input import FactLines, Item, MessageLine
from tkg.errors import TkgError, ValidationError
from tkg.ingest import EpisodeResult
from tkg.inputs import EpisodeInput, make_episode, structured_facts
from tkg.memory import Memory
from tkg.models import Episode, EpisodeSource, EpisodeStatus, Kind
from tkg.timeutil import iso

__all__ = ["Failure", "IngestReport", "episode_ids", "ingest", "lines_of", "record_counts"]


@dataclass(frozen=True, slots=True)
class Failure:
    """An input line whose episode was stored as failed: its extraction failed for good (a re-run retries it)."""

    where: str
    episode_id: str
    reason: str


@dataclass(slots=True)
class IngestReport:
    """What an ingestion did: lines added (messages, facts) and skipped as done before, records added, LLM calls,
    the builder's warnings, the lines whose extraction failed, and whether it stopped before the end."""

    messages: int = 0
    facts: int = 0
    skipped: int = 0
    llm_calls: int = 0
    added: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    stopped: bool = False
    total: int = 0

    @property
    def done(self) -> int:
        """Input lines in the memory now (added by this run or an earlier one)."""
        return self.messages + self.facts + self.skipped


def record_counts(memory: Memory) -> dict[str, int]:
    """How many episodes, entities and facts ``memory`` holds (what an ingestion report counts)."""
    counts = memory.stats()["records"]
    return {kind.value: counts[kind.value] for kind in (Kind.EPISODE, Kind.ENTITY, Kind.FACT)}


def lines_of(item: Item) -> int:
    """How many input lines ``item`` stands for (a run of fact lines is one episode)."""
    return 1 if isinstance(item, MessageLine) else len(item.facts)


def episode_ids(items: Sequence[Item], group_id: str) -> list[str]:
    """The episode id of each item: the line's own ``"id"``, else ``in-`` and a digest of the group, the item's
    fields and how many identical items came before it in the file. Stable across runs, so a re-run finds what
    an earlier one added; identical lines (two "ok" messages) stay two episodes."""
    seen: Counter[str] = Counter()
    ids: list[str] = []
    for item in items:
        if isinstance(item, MessageLine) and item.episode_id is not None:
            ids.append(item.episode_id)
            continue
        key = json.dumps(_identity(item), sort_keys=True, ensure_ascii=False, default=str)
        digest = hashlib.sha256(f"{group_id}\0{key}\0{seen[key]}".encode()).hexdigest()[:32]
        seen[key] += 1
        ids.append(f"in-{digest}")
    duplicates = sorted(i for i, n in Counter(ids).items() if n > 1)
    if duplicates:
        raise ValidationError(f"episode id(s) {duplicates[:3]} given to more than one line")
    return ids


def _identity(item: Item) -> object:
    if isinstance(item, MessageLine):
        when = iso(item.reference_time) if item.reference_time is not None else None
        return ["message", item.content, item.source, when, item.source_description, item.name]
    return ["facts", [asdict(fact) for fact in item.facts]]


# ----------------------------------------------------------------------------------------------------------
# the loop


def ingest(
    memory: Memory,
    items: Sequence[Item],
    *,
    name: str,
    group: str | None = None,
    chunk: int = 32,
    progress: Callable[[int], object] | None = None,
    stop: threading.Event | None = None,
) -> IngestReport:
    """Add the items to ``memory`` in order, skipping those an earlier run added.

    Consecutive messages go ``chunk`` at a time through :meth:`tkg.Memory.add_episodes`; ``progress`` is called
    with the number of input lines each step finished (first with those skipped); ``stop``, once set, ends the run
    after the chunk in flight (``report.stopped``). Every episode is checked before anything is written, so a bad
    one fails the run at once, naming its line; an episode whose extraction fails is stored as failed and listed
    in ``report.failures``.
    """
    group_id = group if group is not None else memory.config.default_group
    ids = episode_ids(items, group_id)
    _check_all(memory, items, ids, name, group)
    found = memory.get_many(Kind.EPISODE, ids)
    for item, stored in zip(items, found, strict=True):
        if stored is not None and stored.group_id != group_id:
            raise ValidationError(
                f"{_where(name, item)}: episode id {stored.id!r} is in use in group {stored.group_id!r}, not "
                f"{group_id!r}: give the line another id"
            )
    todo = [
        (item, episode_id)
        for item, episode_id, stored in zip(items, ids, found, strict=True)
        if not (isinstance(stored, Episode) and stored.status is not EpisodeStatus.FAILED)
    ]
    report = IngestReport(total=sum(lines_of(item) for item in items))
    report.skipped = report.total - sum(lines_of(item) for item, _ in todo)
    if progress is not None and report.skipped:
        progress(report.skipped)
    before = record_counts(memory)
    start = 0
    while start < len(todo):
        if stop is not None and stop.is_set():
            report.stopped = True
            break
        step = _next_step(todo, start, max(1, chunk))
        _run_step(memory, step, name, group, report)
        start += len(step)
        if progress is not None:
            progress(sum(lines_of(item) for item, _ in step))
    after = record_counts(memory)
    report.added = {kind: after[kind] - before[kind] for kind in after}
    return report


def _next_step(todo: Sequence[tuple[Item, str]], start: int, chunk: int) -> list[tuple[Item, str]]:
    """One run of fact lines, or up to ``chunk`` consecutive messages."""
    if isinstance(todo[start][0], FactLines):
        return [todo[start]]
    end = start
    while end < len(todo) and end - start < chunk and isinstance(todo[end][0], MessageLine):
        end += 1
    return list(todo[start:end])


def _span(first: Item, last: Item) -> str:
    """The input lines from ``first`` to ``last``: ``7`` or ``7-12``."""
    start = first.line if isinstance(first, MessageLine) else first.first
    end = last.line if isinstance(last, MessageLine) else last.last
    return f"{start}" if start == end else f"{start}-{end}"


def _where(name: str, item: Item) -> str:
    return f"{name}:{_span(item, item)}"


def _episode_input(item: MessageLine, episode_id: str, group: str | None) -> EpisodeInput:
    return EpisodeInput(
        item.content, group, item.source, item.reference_time, item.source_description, item.name, episode_id
    )


def _check_all(memory: Memory, items: Sequence[Item], ids: Sequence[str], name: str, group: str | None) -> None:
    """Every message as :meth:`tkg.Memory.add_episode` would check it, and every run of facts as
    :meth:`tkg.Memory.add_facts` would (each fact, then their episode), before anything is written."""
    now = datetime.now(UTC)
    for item, episode_id in zip(items, ids, strict=True):
        if isinstance(item, MessageLine):
            try:
                make_episode(_episode_input(item, episode_id, group), memory.config, now)
            except TkgError as exc:
                raise ValidationError(f"{_where(name, item)}: {exc}") from None
            continue
        try:
            document, _ = structured_facts(item.facts, now)
        except TkgError as exc:  # a fact tkg cannot store: named by its own line when it has one
            one_a_line = item.last - item.first + 1 == len(item.facts)
            where = _where(name, item)
            for n, fact in enumerate(item.facts):
                try:
                    structured_facts([fact], now)
                except TkgError:
                    where = f"{name}:{item.first + n}" if one_a_line else where
                    break
            raise ValidationError(f"{where}: {exc}") from None
        try:
            episode = EpisodeInput(document, group, EpisodeSource.JSON, now, episode_id=episode_id)
            make_episode(episode, memory.config, now)
        except TkgError as exc:
            raise ValidationError(f"{_where(name, item)}: {exc}") from None


def _run_step(
    memory: Memory, step: Sequence[tuple[Item, str]], name: str, group: str | None, report: IngestReport
) -> None:
    first = step[0][0]
    where = f"{name}:{_span(first, step[-1][0])}"
    results: list[EpisodeResult]
    try:
        if isinstance(first, FactLines):
            results = [
                memory.add_facts(
                    first.facts,
                    group_id=group,
                    source_description=f"{name} lines {_span(first, first)}",
                    episode_id=step[0][1],
                )
            ]
        else:
            inputs = [
                _episode_input(item, episode_id, group) for item, episode_id in step if isinstance(item, MessageLine)
            ]
            results = memory.add_episodes(inputs)
    except TkgError as exc:
        raise TkgError(f"{where}: {exc}") from exc
    for (item, episode_id), result in zip(step, results, strict=True):
        here = _where(name, item)
        report.llm_calls += result.usage.calls
        if result.status is EpisodeStatus.FAILED:
            reason = "; ".join(result.warnings) or "the extraction failed"
            report.failures.append(Failure(here, episode_id, reason))
            continue
        if isinstance(item, MessageLine):
            report.messages += 1
        else:
            report.facts += len(item.facts)
        report.warnings += [f"{here}: {warning}" for warning in result.warnings]
