"""The bundled demo: a small memory built offline from ``tkg/data`` (structured facts about Alice, Bob and Carol,
then their chat messages), and the tour ``tkg demo`` prints of it: ingestion, search, context and time travel.

``tkg demo``, the MCP server and the HTTP service (``--demo``) all start from :func:`build_demo`'s memory.
"""

from __future__ import annotations

from datetime import datetime
from importlib import resources

from tkg.cli_ingest import IngestReport, ingest, record_counts
from tkg.cli_input import Item, cli_time, parse_jsonl
from tkg.cli_output import count_line, fact_range, format_results
from tkg.environment import describe_llm
from tkg.llm.base import LLMClient
from tkg.memory import Memory
from tkg.models import Entity, Fact, Kind

__all__ = ["DEMO_GROUP", "DEMO_PAST", "build_demo", "show_demo"]

#: The group the demo's records live in.
DEMO_GROUP = "demo"
#: A moment at which Alice still worked at her first employer: the tour's "as of".
DEMO_PAST = "2021-06-01"
DEMO_SEARCH = "Who is hiring backend engineers?"
DEMO_QUESTION = "Where does Alice live and work?"
#: The bundled files in ingestion order, with what their lines are.
DEMO_FILES = (("demo_facts.jsonl", "facts"), ("demo_messages.jsonl", "messages"))


def _demo_items(resource: str, kind: str) -> list[Item]:
    text = resources.files("tkg.data").joinpath(resource).read_text(encoding="utf-8")
    return parse_jsonl(resource, text, kind)


def build_demo(memory: Memory) -> tuple[IngestReport, IngestReport]:
    """Fill ``memory`` with the bundled demo data (group ``demo``): the structured facts, then the chat messages.

    Returns the two ingestion reports.
    """
    facts, messages = (
        ingest(memory, _demo_items(name, kind), name=name, group=DEMO_GROUP) for name, kind in DEMO_FILES
    )
    return facts, messages


def show_demo(memory: Memory, llm: LLMClient | None) -> None:
    """Build the demo in ``memory`` (an empty one, with ``llm`` as its LLM) and print the tour of it."""
    print(f"tkg demo: a temporal knowledge graph (embedder {memory.embedder.name}, LLM {describe_llm(llm)})")
    _demo_ingest(memory, llm)
    _demo_search(memory)
    _demo_context(memory)
    _demo_as_of(memory)


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
    print(f"  memory holds {count_line(record_counts(memory))}; LLM calls: {calls}")


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


def _employer_facts(memory: Memory, as_of: datetime | None) -> list[Fact]:
    """Alice's WORKS_AT facts that held at ``as_of`` (now when ``None``), found through search."""
    results = memory.search("Where does Alice work?", group_ids=[DEMO_GROUP], as_of=as_of, targets=("facts",), limit=20)
    facts = [s.record for s in results.facts if s.record.relation == "WORKS_AT"]
    sources = memory.get_many(Kind.ENTITY, [f.source_id for f in facts])
    return [f for f, e in zip(facts, sources, strict=True) if isinstance(e, Entity) and e.name == "Alice"]
