"""The cross-encoder seam: scorers that read the query and each candidate's text together.

A :class:`CrossEncoder` returns one relevance score per passage (higher is better). Three ship with tkg:

* :class:`TermOverlapScorer` -- deterministic and dependency-free: the test double, also a fair lexical scorer;
* :class:`EmbeddingScorer` -- offline, through any :class:`tkg.Embedder` (with the MiniLM embedder it runs on
  CPU with no network). It is a bi-encoder used as a scorer: no cross-encoder model can be installed offline
  here, and the seam takes one unchanged when it can (``score(query, passages)``);
* :class:`LLMScorer` -- one call through the LLM seam that grades every passage (Graphiti makes one call per
  passage; one call for the batch costs far less).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, Field

from tkg.embedders.base import Embedder, check_vectors
from tkg.errors import LLMError
from tkg.llm.base import LLMClient, LLMUsage, Prompt
from tkg.llm.guard import GuardedLLM

_WORD = re.compile(r"\w+", re.UNICODE)
_STOP = frozenset(
    "a an and are as at be by did do does for from had has have how i in is it me my of on or the to was we were "
    "what when where which who why will with you your".split()
)


@runtime_checkable
class CrossEncoder(Protocol):
    """Scores passages against a query; one float per passage, higher is more relevant."""

    def score(self, query: str, passages: Sequence[str]) -> list[float]: ...


def _terms(text: str) -> set[str]:
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


class TermOverlapScorer:
    """The share of the query's content words that a passage contains (0 to 1). Deterministic: a test double.

    >>> TermOverlapScorer().score("where does Alice work", ["Alice works at Acme", "Alice works at Acme; work"])
    [0.5, 1.0]
    """

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        wanted = _terms(query)
        if not wanted:
            return [0.0] * len(passages)
        return [len(wanted & _terms(p)) / len(wanted) for p in passages]


class EmbeddingScorer:
    """Cosine similarity between the query's and each passage's embedding (offline with an offline embedder)."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        if not passages:
            return []
        vectors = check_vectors(self.embedder.embed([query, *passages]), self.embedder.dim, len(passages) + 1)
        return [float(s) for s in np.einsum("ij,j->i", vectors[1:], vectors[0])]


class PassageGrade(BaseModel):
    index: int = Field(description="The passage's number as given in the list.")
    relevance: float = Field(ge=0.0, le=1.0, description="0 = irrelevant to the query, 1 = answers it directly.")


class RelevanceGrades(BaseModel):
    """The LLM's answer: a grade for each passage."""

    grades: list[PassageGrade] = Field(default_factory=list)


_SYSTEM = (
    "You grade search results. For each numbered passage, say how relevant it is to the query, from 0 "
    "(irrelevant) to 1 (answers it directly). Grade every passage, judging each on its own."
)


def relevance_prompt(query: str, passages: Sequence[str]) -> Prompt:
    listing = "\n".join(f"[{i}] {' '.join(p.split())}" for i, p in enumerate(passages))
    user = f"<QUERY>\n{query}\n</QUERY>\n\n<PASSAGES>\n{listing}\n</PASSAGES>"
    return Prompt("rerank", _SYSTEM, user, {"query": query, "passages": list(passages)})


class LLMScorer:
    """Grades passages with one LLM call through the LLM seam (any :class:`tkg.llm.LLMClient`).

    Passages the LLM leaves ungraded score 0; an out-of-range index is an :class:`tkg.errors.LLMError`.

    >>> from tkg.llm import ScriptedLLM
    >>> llm = ScriptedLLM([{"grades": [{"index": 1, "relevance": 0.9}, {"index": 0, "relevance": 0.2}]}])
    >>> LLMScorer(llm).score("q", ["a", "b"])
    [0.2, 0.9]
    """

    def __init__(self, llm: LLMClient | GuardedLLM, *, max_passage_chars: int = 1000) -> None:
        self.llm = llm
        self.max_passage_chars = max_passage_chars
        #: What the grading calls cost (through a :class:`~tkg.llm.guard.GuardedLLM`: with its retries).
        self.usage = LLMUsage()

    def score(self, query: str, passages: Sequence[str]) -> list[float]:
        if not passages:
            return []
        clipped = [p[: self.max_passage_chars] for p in passages]
        prompt = relevance_prompt(query, clipped)
        if isinstance(self.llm, GuardedLLM):
            answer = self.llm.call(prompt, RelevanceGrades, self.usage)
        else:
            answer = self.llm.generate(prompt, RelevanceGrades)
            self.usage.record(prompt)
        scores = [0.0] * len(passages)
        for grade in answer.grades:
            if not 0 <= grade.index < len(passages):
                raise LLMError(f"the reranking LLM graded passage {grade.index}, but only {len(passages)} were given")
            scores[grade.index] = grade.relevance
        return scores
