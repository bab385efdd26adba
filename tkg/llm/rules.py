"""A deterministic, rule-based stand-in for an LLM: the test double for whole-pipeline tests and benchmarks.

It is not a model and understands nothing; it answers tkg's prompts by fixed rules over the prompts' structured
``inputs``, so that runs are reproducible and engines can be compared with identical "LLM" behaviour.

Extraction (``extract_graph``, ``reflect``), per sentence of the episode (after the ``Speaker:`` prefix):

* a controlled statement ``<Subject> <RELATION> <Object> [since|from <phrase>] [until <phrase>].`` (RELATION in
  SCREAMING_SNAKE_CASE; ``I``/``me``/``my`` stand for the speaker) becomes that fact, dated by the phrases;
* otherwise every capitalised name (a run of capitalised words not at a sentence start, or at one if it is not a
  common word) becomes an entity, and with a speaker, the fact ``<speaker> TALKED_ABOUT <name>``.

Community summaries: the first three member lines name the community, and the lines themselves are the summary.

The rules themselves are pure functions (:func:`extract`, :func:`match_entity`, :func:`judge_fact`) so that another
engine's test double can answer its own prompts by the very same rules (``benchmarks/graphiti_side.py`` does).

Resolution (``resolve``): a new name is the candidate whose name or alias starts or ends with it as whole words
(only when exactly one does); a new fact duplicates a candidate with the same sentence (ignoring case and final
punctuation), and contradicts candidates with the same subject (by that same name rule) and relation but another
object, when the relation is in ``exclusive``. Reflection finds nothing more.

>>> from tkg.llm.base import Prompt
>>> from tkg.llm.schema import GraphExtraction
>>> llm = RulesLLM()
>>> out = llm.generate(Prompt("extract_graph", "", "", {"content": "Ann: I LIVES_IN Paris since 2019.",
...     "speaker": "Ann"}), GraphExtraction)
>>> [(f.source, f.relation, f.target, f.valid_from) for f in out.facts]
[('Ann', 'LIVES_IN', 'Paris', '2019')]
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from tkg.community_summaries import CommunityDigest, PartialSummary
from tkg.errors import LLMError
from tkg.llm.base import Prompt, T
from tkg.llm.schema import (
    EntityDecision,
    ExtractedEntity,
    ExtractedFact,
    FactDecision,
    GraphExtraction,
    Resolution,
)

EXCLUSIVE = frozenset(
    {"LIVES_IN", "WORKS_AT", "WORKS_AS", "MARRIED_TO", "DATING", "LOCATED_IN", "HAS_STATUS", "STUDIES_AT", "OWNS_CAR"}
)
_STATEMENT = re.compile(
    r"^(?P<s>.+?)\s+(?P<rel>[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+|[A-Z]{2,})\s+(?P<o>.+?)"
    r"(?:\s+(?:since|from)\s+(?P<since>.+?))?(?:\s+until\s+(?P<until>.+?))?\s*$"
)
_NAME = re.compile(r"\b[A-Z][a-zA-Z'\-]+(?:\s+[A-Z][a-zA-Z'\-]+)*")
_COMMON = frozenset(
    "I I'm I've I'll I'd The A An And But So Oh Yes No Hey Hi Hello Thanks Thank Wow It It's That This What "
    "When Where Why How Who We You He She They My Your Our Their Just Really Well Sure Okay OK Great Nice Good "
    "Sounds Let Let's Do Did Are Is Was Have Has Had Can Could Would Should Will Also Maybe Anyway Haha Lol "
    "Congrats Congratulations Definitely Absolutely Totally".split()
)
_SELF = frozenset({"i", "me", "my", "myself"})


def _sentences(text: str) -> Iterable[str]:
    for part in re.split(r"(?<=[.!?])\s+|\n+", text):
        part = part.strip().rstrip(".!?").strip()
        if part:
            yield part


def _norm(text: str) -> str:
    return " ".join(text.casefold().split()).rstrip(".!?")


def extract(content: str, speaker: str | None, *, talked_about: bool = True) -> GraphExtraction:
    """The extraction rule (see the module docstring) applied to one episode's ``content``."""
    text = content.split(":", 1)[1] if speaker and ":" in content else content
    entities: dict[str, ExtractedEntity] = {}
    facts: list[ExtractedFact] = []
    if speaker:
        entities[speaker.casefold()] = ExtractedEntity(name=speaker, label="Person")
    for sentence in _sentences(text):
        match = _STATEMENT.match(sentence)
        if match:
            source = _who(match.group("s"), speaker)
            target = _who(match.group("o"), speaker)
            for name in (source, target):
                entities.setdefault(name.casefold(), ExtractedEntity(name=name))
            rel = match.group("rel")
            facts.append(
                ExtractedFact(
                    source=source,
                    target=target,
                    relation=rel,
                    fact=f"{source} {rel.replace('_', ' ').lower()} {target}",
                    valid_from=match.group("since") or ("now" if not match.group("until") else None),
                    valid_until=match.group("until"),
                )
            )
            continue
        for found in _NAME.finditer(sentence):
            words = found.group(0).split()
            while words and words[0] in _COMMON:
                words = words[1:]
            if not words:
                continue
            name = " ".join(words)
            if speaker and name.casefold() == speaker.casefold():
                continue
            if name.casefold() not in entities:
                entities[name.casefold()] = ExtractedEntity(
                    name=name, summary=f"{speaker or 'Someone'} mentioned {name}."
                )
                if speaker and talked_about:
                    facts.append(
                        ExtractedFact(
                            source=speaker,
                            target=name,
                            relation="TALKED_ABOUT",
                            fact=f"{speaker} talked about {name}",
                            valid_from="now",
                        )
                    )
    return GraphExtraction(entities=list(entities.values()), facts=facts)


def _who(text: str, speaker: str | None) -> str:
    text = text.strip()
    return speaker if speaker and text.casefold() in _SELF else text


def match_entity(name: str, candidates: Sequence[Sequence[str]]) -> int | None:
    """The entity-identity rule: the index of the only candidate (given as its name and aliases) one of whose
    forms starts or ends with ``name`` as whole words, or is it; None when no candidate or several do."""
    wanted = _norm(name)
    hits = [i for i, forms in enumerate(candidates) if any(_affix(wanted, _norm(form)) for form in forms)]
    return hits[0] if len(hits) == 1 else None


def judge_fact(
    new: Mapping[str, str], candidates: Sequence[Mapping[str, str]], exclusive: Iterable[str] = EXCLUSIVE
) -> tuple[int | None, list[int]]:
    """The duplicate and contradiction rule for one new fact against existing ones, each a mapping with
    ``fact``, ``relation``, ``source`` and ``target`` (names). Returns (index of the first candidate with the same
    sentence or None, indexes of the candidates it contradicts: same subject and relation, another object, for a
    relation in ``exclusive``)."""
    exclusive = exclusive if isinstance(exclusive, frozenset) else frozenset(exclusive)
    duplicate = next((i for i, c in enumerate(candidates) if _norm(c["fact"]) == _norm(new["fact"])), None)
    contradicts = [
        i
        for i, c in enumerate(candidates)
        if new["relation"] in exclusive
        and c["relation"] == new["relation"]
        and _affix(_norm(new["source"]), _norm(c["source"]))
        and not _affix(_norm(new["target"]), _norm(c["target"]))
    ]
    return duplicate, contradicts


class RulesLLM:
    """See the module docstring. ``calls`` keeps every prompt received."""

    def __init__(self, exclusive: Iterable[str] = EXCLUSIVE, *, talked_about: bool = True) -> None:
        self.exclusive = frozenset(exclusive)
        self.talked_about = talked_about
        self.calls: list[Prompt] = []

    def generate(self, prompt: Prompt, response_model: type[T]) -> T:
        self.calls.append(prompt)
        answer: BaseModel
        if response_model is GraphExtraction:
            answer = GraphExtraction() if prompt.name == "reflect" else self._extract(prompt.inputs)
        elif response_model is Resolution:
            answer = self._resolve(prompt.inputs)
        elif response_model is PartialSummary:
            answer = PartialSummary(summary=" ".join(prompt.inputs.get("lines", []))[:400])
        elif response_model is CommunityDigest:
            lines = [str(x) for x in prompt.inputs.get("lines", prompt.inputs.get("parts", []))]
            heads = [re.split(r"[:(]", line.lstrip("-* "), maxsplit=1)[0].strip()[:40] for line in lines]
            name = ", ".join(h for h in heads[:3] if h) or str(prompt.inputs.get("name", "community"))
            summary = " ".join([str(prompt.inputs.get("summary", "")), *lines]).strip()[:400]
            answer = CommunityDigest(summary=summary or name, name=name)
        else:
            raise LLMError(f"RulesLLM has no rule for {response_model.__name__}")
        return response_model.model_validate(answer.model_dump())

    def _extract(self, inputs: dict[str, Any] | Any) -> GraphExtraction:
        return extract(str(inputs.get("content", "")), inputs.get("speaker"), talked_about=self.talked_about)

    def _resolve(self, inputs: dict[str, Any] | Any) -> Resolution:
        entities = []
        for i, item in enumerate(inputs.get("names", []), start=1):
            candidates = item["candidates"]
            hit = match_entity(item["name"], [[c["name"], *c.get("aliases", [])] for c in candidates])
            if hit is not None:
                entities.append(EntityDecision(new=i, same_as=candidates[hit]["number"]))
        facts = []
        for i, item in enumerate(inputs.get("facts", []), start=1):
            candidates = item["candidates"]
            duplicate, contradicts = judge_fact(item, candidates, self.exclusive)
            if duplicate is not None or contradicts:
                facts.append(
                    FactDecision(
                        new=i,
                        duplicates=[] if duplicate is None else [candidates[duplicate]["number"]],
                        contradicts=[candidates[j]["number"] for j in contradicts],
                    )
                )
        return Resolution(reasoning="rules", entities=entities, facts=facts)


def _affix(short: str, long: str) -> bool:
    """``short`` is ``long``, or its first or last whole words ("alice" ~ "alice smith")."""
    if short == long:
        return True
    return long.startswith(short + " ") or long.endswith(" " + short) or short.startswith(long + " ")
