"""Graphiti's side of the tkg vs Graphiti benchmark (``benchmarks/bench_graphiti.py``).

graphiti-core over its embedded Kuzu driver, given test doubles that make it build its graph by the same rules as
tkg's double, :class:`tkg.llm.rules.RulesLLM`:

* :class:`GraphitiRules` answers Graphiti's prompts (dispatched on the response model, as Graphiti's own GLiNER2
  client does) by calling the pure rule functions of :mod:`tkg.llm.rules`: ``extract`` for ``ExtractedEntities``
  and ``ExtractedEdges``, ``match_entity`` for ``NodeResolutions``, ``judge_fact`` for ``EdgeDuplicate``. Dates
  are the ones tkg derives from the same extraction (``tkg.temporal.resolve_time``; "now" is the episode time),
  written as ISO-8601 because Graphiti's edge prompt asks for that. Graphiti shows the deduplication judge only
  the fact sentences, so the double keeps what it extracted (sentence -> subject, relation, object), much as an
  LLM reads them off the sentence; tkg's prompt carries those fields itself;
* the embedder is ``tkg.HashEmbedder`` behind Graphiti's ``EmbedderClient``; the cross-encoder is tkg's
  ``TermOverlapScorer`` behind ``CrossEncoderClient`` (Graphiti requires one; the searches measured do not use it).

Every double adds the time spent inside it to a :class:`Meter`, so engine time = wall time - time in the doubles.

This module imports graphiti-core only in :class:`GraphitiEngine` (its benchmark venv has it; tkg's does not), so
the rules can be tested anywhere. Set ``GRAPHITI_TELEMETRY_ENABLED=false``, ``EMBEDDING_DIM`` and a dummy
``OPENAI_API_KEY`` in the environment before constructing :class:`GraphitiEngine` (the benchmark's child process
does).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tkg import HashEmbedder, TermOverlapScorer
from tkg.drafts import speaker_of
from tkg.errors import ValidationError
from tkg.llm import rules
from tkg.llm.schema import GraphExtraction
from tkg.temporal import resolve_time


@dataclass
class Meter:
    """Time spent inside the test doubles (wall and this thread's CPU), and what was asked of them."""

    seconds: float = 0.0
    cpu_seconds: float = 0.0
    llm_calls: int = 0
    prompt_chars: int = 0
    by_prompt: Counter[str] = field(default_factory=Counter)
    embed_calls: int = 0
    embed_texts: int = 0

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            yield
        finally:
            self.cpu_seconds += time.thread_time() - cpu
            self.seconds += time.perf_counter() - wall

    def snapshot(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "cpu_seconds": self.cpu_seconds,
            "llm_calls": self.llm_calls,
            "prompt_chars": self.prompt_chars,
            "by_prompt": dict(self.by_prompt),
            "embed_calls": self.embed_calls,
            "embed_texts": self.embed_texts,
        }


def block(text: str, tag: str) -> str:
    """The content of the first ``<TAG>...</TAG>`` block of a Graphiti prompt; ValidationError if it has none."""
    match = re.search(rf"<{re.escape(tag)}>\n?(.*?)\n?</{re.escape(tag)}>", text, re.S)
    if match is None:
        raise ValidationError(f"the Graphiti prompt has no <{tag}> block; graphiti-core changed its prompts?")
    return match.group(1)


def reference_time(text: str) -> datetime:
    """Graphiti writes the reference time as ``str(datetime)``, sometimes followed by a ``# comment``."""
    raw = text.split("#", 1)[0].strip()
    try:
        value = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise ValidationError(f"the Graphiti prompt's reference time {raw!r} is not ISO-8601") from None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class GraphitiRules:
    """Answers Graphiti's prompts with the rules of :class:`tkg.llm.rules.RulesLLM` (see the module docstring).

    ``answer(model_name, prompt_text)`` returns the JSON object Graphiti expects for that response model.
    """

    def __init__(self, exclusive: Sequence[str] = tuple(rules.EXCLUSIVE), *, talked_about: bool = True) -> None:
        self.exclusive = frozenset(exclusive)
        self.talked_about = talked_about
        #: fact sentence -> the fact as extracted (fact, relation, source, target), for the deduplication judge
        self.facts: dict[str, dict[str, str]] = {}
        self._handlers: dict[str, Callable[[str], dict[str, Any]]] = {
            "ExtractedEntities": self.entities,
            "ExtractedEdges": self.edges,
            "NodeResolutions": self.node_resolutions,
            "NodeDuplicate": self.node_duplicate,
            "EdgeDuplicate": self.edge_duplicate,
            "EdgeTimestamps": self.edge_timestamps,
            "SummarizedEntities": self.summaries,
        }

    def answer(self, model: str, prompt: str) -> dict[str, Any]:
        handler = self._handlers.get(model)
        if handler is None:
            raise ValidationError(f"no rule answers Graphiti's {model} prompt; add one to GraphitiRules")
        return handler(prompt)

    def _extract(self, content: str) -> GraphExtraction:
        return rules.extract(content, speaker_of(content), talked_about=self.talked_about)

    def entities(self, prompt: str) -> dict[str, Any]:
        found = self._extract(block(prompt, "CURRENT MESSAGE"))
        return {"extracted_entities": [{"name": e.name, "entity_type_id": 0} for e in found.entities]}

    def edges(self, prompt: str) -> dict[str, Any]:
        reference = reference_time(block(prompt, "REFERENCE_TIME"))
        out = []
        for fact in self._extract(block(prompt, "CURRENT_MESSAGE")).facts:
            # as tkg.drafts.from_extraction dates a fact: the phrase, else the episode time unless it only ended
            valid = resolve_time(fact.valid_from, reference) if fact.valid_from else None
            invalid = resolve_time(fact.valid_until, reference) if fact.valid_until else None
            if valid is None and fact.valid_until is None:
                valid = reference
            self.facts[fact.fact] = {
                "fact": fact.fact,
                "relation": fact.relation,
                "source": fact.source,
                "target": fact.target,
            }
            out.append(
                {
                    "source_entity_name": fact.source,
                    "target_entity_name": fact.target,
                    "relation_type": fact.relation,
                    "fact": fact.fact,
                    "valid_at": _iso(valid),
                    "invalid_at": _iso(invalid),
                }
            )
        return {"edges": out}

    def node_resolutions(self, prompt: str) -> dict[str, Any]:
        extracted = json.loads(block(prompt, "ENTITIES"))
        existing = json.loads(block(prompt, "EXISTING ENTITIES"))
        return {"entity_resolutions": [self._resolve_node(e["id"], e["name"], existing) for e in extracted]}

    def node_duplicate(self, prompt: str) -> dict[str, Any]:
        new = json.loads(block(prompt, "NEW ENTITY"))
        existing = json.loads(block(prompt, "EXISTING ENTITIES"))
        name = new.get("name", "") if isinstance(new, Mapping) else str(new)
        return self._resolve_node(0, name, existing)

    @staticmethod
    def _resolve_node(number: int, name: str, existing: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        hit = rules.match_entity(name, [[str(c.get("name", ""))] for c in existing])
        same = -1 if hit is None else int(existing[hit]["candidate_id"])
        return {"id": number, "name": name, "duplicate_candidate_id": same}

    def _view(self, sentence: str) -> dict[str, str]:
        return self.facts.get(sentence, {"fact": sentence, "relation": "", "source": "", "target": ""})

    def edge_duplicate(self, prompt: str) -> dict[str, Any]:
        # Graphiti lists the candidates as Python reprs: [{'idx': 0, 'fact': '...'}, ...]
        existing = ast.literal_eval(block(prompt, "EXISTING FACTS").strip() or "[]")
        others = ast.literal_eval(block(prompt, "FACT INVALIDATION CANDIDATES").strip() or "[]")
        listed = [*existing, *others]
        duplicate, contradicts = rules.judge_fact(
            self._view(block(prompt, "NEW FACT").strip()), [self._view(c["fact"]) for c in listed], self.exclusive
        )
        # Graphiti accepts duplicates only among EXISTING FACTS (the same endpoints); contradictions from both
        return {
            "duplicate_facts": [listed[duplicate]["idx"]]
            if duplicate is not None and duplicate < len(existing)
            else [],
            "contradicted_facts": [listed[i]["idx"] for i in contradicts],
        }

    def edge_timestamps(self, prompt: str) -> dict[str, Any]:
        # the rules date every extracted fact already; a fact asked about here holds as of the episode
        return {"valid_at": _iso(reference_time(block(prompt, "REFERENCE TIME"))), "invalid_at": None}

    def summaries(self, prompt: str) -> dict[str, Any]:
        # RulesLLM's summary rule: the text it was given, truncated to 400 characters
        entities = json.loads(block(prompt, "ENTITIES"))
        return {"summaries": [{"name": e["name"], "summary": str(e.get("summary", ""))[:400]} for e in entities]}


class GraphitiEngine:
    """graphiti-core with Kuzu (in memory, or in ``db_path``), the rules doubles and a hash embedder; synchronous
    calls over one event loop. ``meter`` accumulates what the doubles did and the time they took."""

    name = "graphiti"

    def __init__(self, dim: int, db_path: str | None = None) -> None:
        import warnings

        from graphiti_core import Graphiti
        from graphiti_core.cross_encoder.client import CrossEncoderClient
        from graphiti_core.driver.kuzu_driver import KuzuDriver
        from graphiti_core.embedder.client import EmbedderClient
        from graphiti_core.llm_client.client import LLMClient
        from graphiti_core.llm_client.config import LLMConfig
        from graphiti_core.nodes import EpisodeType
        from graphiti_core.search.search_config_recipes import COMBINED_HYBRID_SEARCH_RRF

        meter = self.meter = Meter()
        self.rules = answerer = GraphitiRules()
        embedder = HashEmbedder(dim=dim)
        scorer = TermOverlapScorer()

        class RulesLLMClient(LLMClient):
            """Overrides only ``_generate_response``: Graphiti's own request preparation stays engine time."""

            async def _generate_response(
                self, messages: Any, response_model: Any = None, max_tokens: int = 0, model_size: Any = None, **_: Any
            ) -> dict[str, Any]:
                with meter.timing():
                    name = response_model.__name__ if response_model is not None else "None"
                    meter.llm_calls += 1
                    meter.prompt_chars += sum(len(m.content) for m in messages)
                    meter.by_prompt[name] += 1
                    return answerer.answer(name, messages[-1].content)

        class HashEmbedderClient(EmbedderClient):
            async def create(self, input_data: Any) -> list[float]:
                text = input_data if isinstance(input_data, str) else next(iter(input_data))
                with meter.timing():
                    meter.embed_calls += 1
                    meter.embed_texts += 1
                    return [float(x) for x in embedder.embed([str(text)])[0]]

            async def create_batch(self, input_data_list: list[str]) -> list[list[float]]:
                with meter.timing():
                    meter.embed_calls += 1
                    meter.embed_texts += len(input_data_list)
                    return embedder.embed(list(input_data_list)).tolist()  # type: ignore[no-any-return]

        class OverlapCrossEncoder(CrossEncoderClient):
            async def rank(self, query: str, passages: list[str]) -> list[tuple[str, float]]:
                with meter.timing():
                    scores = scorer.score(query, passages)
                    return sorted(zip(passages, scores, strict=True), key=lambda x: -x[1])

        self._episode_type = EpisodeType.message
        self._combined = COMBINED_HYBRID_SEARCH_RRF
        self.runner = asyncio.Runner()

        async def open_graph() -> Any:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)  # "the Kuzu backend is deprecated"
                driver = KuzuDriver(db=db_path or ":memory:")
            driver._database = "kuzu"  # graphiti-core never sets it on Kuzu: add_episode(group_id=...) needs it
            # Graphiti.build_indices_and_constraints() is a no-op on Kuzu; without the FTS indexes bm25 search fails
            await driver.graph_ops.build_indices_and_constraints(driver)
            llm = RulesLLMClient(LLMConfig(api_key="unused", model="rules", small_model="rules"))
            return Graphiti(
                graph_driver=driver, llm_client=llm, embedder=HashEmbedderClient(), cross_encoder=OverlapCrossEncoder()
            )

        self.graphiti = self.runner.run(open_graph())

    def add(self, content: str, group_id: str, reference: datetime, name: str, description: str) -> None:
        self.runner.run(
            self.graphiti.add_episode(
                name=name,
                episode_body=content,
                source_description=description,
                reference_time=reference,
                source=self._episode_type,
                group_id=group_id,
            )
        )

    def search_facts(self, query: str, group_id: str, limit: int) -> int:
        """Graphiti.search: facts only, hybrid (BM25 + cosine, RRF). Returns the number of results."""
        return len(self.runner.run(self.graphiti.search(query, group_ids=[group_id], num_results=limit)))

    def search_all(self, query: str, group_id: str, limit: int) -> int:
        """search_ with COMBINED_HYBRID_SEARCH_RRF: facts, entities, episodes (and communities), hybrid, RRF."""
        config = self._combined.model_copy(update={"limit": limit})
        found = self.runner.run(self.graphiti.search_(query, config=config, group_ids=[group_id]))
        return len(found.edges) + len(found.nodes) + len(found.episodes) + len(found.communities)

    def counts(self) -> dict[str, int]:
        """Entities, facts and invalidated facts in the graph (Kuzu reifies facts as RelatesToNode_ nodes)."""
        queries = {
            "entities": "MATCH (n:Entity) RETURN count(n) AS c",
            "facts": "MATCH (e:RelatesToNode_) RETURN count(e) AS c",
            "invalidated_facts": "MATCH (e:RelatesToNode_) WHERE e.invalid_at IS NOT NULL RETURN count(e) AS c",
            "episodes": "MATCH (n:Episodic) RETURN count(n) AS c",
        }
        out = {}
        for key, query in queries.items():
            records, _, _ = self.runner.run(self.graphiti.driver.execute_query(query))
            out[key] = int(records[0]["c"]) if records else 0
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.runner.run(self.graphiti.close())
        self.runner.close()
