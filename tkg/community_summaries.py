"""Community names and summaries: map-reduce over member summaries through the LLM seam, or built from the
members alone when no LLM is configured.

With an LLM (as in the Zep paper, after GraphRAG): the members' ``name: summary`` lines are cut into chunks of at
most ``chunk_chars``; each chunk is summarised (map), the partial summaries are summarised again in chunks until
one text remains (reduce), and the last call also returns the community's name: a few key terms and subjects,
which is what community search matches. A community whose lines fit in one chunk costs one call. A newcomer
joining a community costs one call too (:func:`update_summary`: the old summary plus the new members' lines).

Without an LLM the name is the names of the best-connected members and the summary lists members with their own
summaries, so a community is still found by cosine and BM25 search on its members' names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, TypeVar, runtime_checkable

from pydantic import BaseModel, Field

from tkg.llm.base import LLMClient, LLMUsage, Prompt

T = TypeVar("T", bound=BaseModel)


@runtime_checkable
class AccountingLLM(Protocol):
    """A client that records its own cost (and may retry and rate-limit), such as the guarded client ``Memory``
    wraps its LLM in: ``call(prompt, response_model, usage)``."""

    def call(self, prompt: Prompt, response_model: type[T], usage: LLMUsage) -> T: ...


#: What summarisation accepts: a plain :class:`~tkg.llm.base.LLMClient` or an :class:`AccountingLLM`.
SummaryLLM: TypeAlias = LLMClient | AccountingLLM


def ask(llm: SummaryLLM, prompt: Prompt, response_model: type[T], usage: LLMUsage) -> T:
    """One LLM call, its cost added to ``usage`` (by the client itself when it keeps accounts)."""
    if isinstance(llm, AccountingLLM):
        return llm.call(prompt, response_model, usage)
    usage.record(prompt)
    return llm.generate(prompt, response_model)


SUMMARIZE_MEMBERS = "summarize_community_members"
SUMMARIZE_COMMUNITY = "summarize_community"
UPDATE_COMMUNITY = "update_community"


class PartialSummary(BaseModel):
    """The map step's answer: what one chunk of members has in common."""

    summary: str = Field(description="A short paragraph on who or what these entities are and how they relate.")


class CommunityDigest(BaseModel):
    """The reduce step's answer: a community's summary and its name."""

    summary: str = Field(description="A short paragraph summarising the community: its members and their relations.")
    name: str = Field(
        description="A few key terms and subjects the community is about, comma-separated (e.g. 'Acme Robotics, "
        "Berlin office, hiring')."
    )


@dataclass(frozen=True, slots=True)
class Member:
    """What summarisation needs of one member entity. ``weight`` ranks members (weighted degree inside the
    community): the best-connected come first and name the community when there is no LLM."""

    name: str
    summary: str = ""
    weight: int = 0

    @property
    def line(self) -> str:
        return f"{self.name}: {self.summary}" if self.summary else self.name


def rank_members(members: Sequence[Member]) -> list[Member]:
    """Best-connected first, then by name: the order every function here reads members in."""
    return sorted(members, key=lambda m: (-m.weight, m.name.casefold(), m.name))


def fallback_digest(members: Sequence[Member], *, name_members: int = 3, max_chars: int = 1000) -> CommunityDigest:
    """Name and summary built from the members, with no LLM.

    >>> d = fallback_digest([Member("Acme", "a robotics firm", 3), Member("Alice", "", 2), Member("Berlin", "", 1)])
    >>> d.name
    'Acme, Alice, Berlin'
    >>> d.summary
    '3 members: Acme (a robotics firm); Alice; Berlin'
    """
    ranked = rank_members(members)
    name = ", ".join(m.name for m in ranked[:name_members])
    summary = f"{len(ranked)} members: "
    for i, m in enumerate(ranked):
        part = f"{m.name} ({m.summary})" if m.summary else m.name
        longer = summary + ("; " if i else "") + part
        room = max_chars - (len("; …") if i + 1 < len(ranked) else 0)  # what follows must still fit its mark
        if len(longer) <= room:
            summary = longer
        elif i:  # the members so far, and a mark for the rest (room was kept for it)
            summary += "; …"
            break
        else:  # the first member alone is too long: cut
            summary = longer[: max(0, max_chars - 1)] + "…"
            break
    return CommunityDigest(name=name, summary=summary)


def _chunks(lines: Sequence[str], max_chars: int) -> list[list[str]]:
    out: list[list[str]] = [[]]
    used = 0
    for line in lines:
        line = line[:max_chars]
        if out[-1] and used + len(line) + 1 > max_chars:
            out.append([])
            used = 0
        out[-1].append(line)
        used += len(line) + 1
    return out if out[0] else []


_MAP_SYSTEM = """You summarise a group of related entities from a knowledge graph. \
Given entity lines ("name: what is known about it") or summaries of parts of the group, write one short \
paragraph saying who or what they are and how they relate. Use only the given information; keep names exact."""

_REDUCE_SYSTEM = """You summarise a community of related entities from a knowledge graph. \
Given descriptions of its members, write one short paragraph summarising the community, and a name for it: \
a few comma-separated key terms and subjects that someone searching for this community would use. \
Use only the given information; keep names exact."""

_UPDATE_SYSTEM = """You maintain the summary of a community of related entities in a knowledge graph. \
New members have joined. Rewrite the summary so it also covers them (one short paragraph), and give the \
community a name: a few comma-separated key terms and subjects. Use only the given information."""


def members_prompt(lines: Sequence[str]) -> Prompt:
    return Prompt(
        name=SUMMARIZE_MEMBERS,
        system=_MAP_SYSTEM,
        user="ENTITIES:\n" + "\n".join(lines),
        inputs={"lines": list(lines)},
    )


def community_prompt(parts: Sequence[str]) -> Prompt:
    return Prompt(
        name=SUMMARIZE_COMMUNITY,
        system=_REDUCE_SYSTEM,
        user="MEMBERS:\n" + "\n".join(parts),
        inputs={"parts": list(parts)},
    )


def update_prompt(summary: str, name: str, lines: Sequence[str]) -> Prompt:
    return Prompt(
        name=UPDATE_COMMUNITY,
        system=_UPDATE_SYSTEM,
        user=f"COMMUNITY: {name}\nSUMMARY: {summary or '(none)'}\n\nNEW MEMBERS:\n" + "\n".join(lines),
        inputs={"summary": summary, "name": name, "lines": list(lines)},
    )


def summarize(
    llm: SummaryLLM, members: Sequence[Member], *, chunk_chars: int, max_members: int, usage: LLMUsage
) -> CommunityDigest:
    """Map-reduce summary and name of a community from its ``max_members`` best-connected members."""
    lines = [m.line for m in rank_members(members)[:max_members]]
    chunks = _chunks(lines, chunk_chars)
    # Map, then reduce, until what is left fits one call; that last call names the community. Partial summaries
    # are cut to under half a chunk, so every reduce round at least halves their number: it always ends.
    while len(chunks) > 1:
        parts: list[str] = []
        for chunk in chunks:
            answer = ask(llm, members_prompt(chunk), PartialSummary, usage)
            parts.append(answer.summary.strip()[: (chunk_chars - 2) // 2])
        chunks = _chunks(parts, chunk_chars)
    final = community_prompt(chunks[0] if chunks else [])
    return _clean(ask(llm, final, CommunityDigest, usage), members)


def update_summary(
    llm: SummaryLLM,
    summary: str,
    name: str,
    newcomers: Sequence[Member],
    *,
    chunk_chars: int,
    usage: LLMUsage,
) -> CommunityDigest:
    """One call: the community's current summary and name, plus the lines of the members that just joined."""
    lines = [m.line[:chunk_chars] for m in rank_members(newcomers)]
    budget = max(chunk_chars - len(summary), chunk_chars // 2)
    kept = _chunks(lines, budget)[0] if lines else []
    prompt = update_prompt(summary[:chunk_chars], name, kept)
    return _clean(ask(llm, prompt, CommunityDigest, usage), newcomers)


def _clean(digest: CommunityDigest, members: Sequence[Member]) -> CommunityDigest:
    """An LLM may return an empty name; fall back to the members' names so the community stays findable."""
    name = " ".join(digest.name.split())
    summary = digest.summary.strip()
    if not name:
        name = fallback_digest(members).name
    return CommunityDigest(name=name, summary=summary)
