"""LlamaIndex adapters (``pip install "tkg[llamaindex]"``): a memory block that feeds tkg's context into an
agent's prompt and keeps the messages it is given, and a retriever over tkg's hybrid search.

>>> from llama_index.core.memory import Memory as ChatMemory                  # doctest: +SKIP
>>> from tkg.compat.llamaindex import TkgMemoryBlock, TkgRetriever             # doctest: +SKIP
>>> block = TkgMemoryBlock(name="tkg", memory=memory, group_id="user-42")     # doctest: +SKIP
>>> chat_memory = ChatMemory.from_defaults(session_id="s1", memory_blocks=[block])  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from llama_index.core.base.llms.types import ChatMessage
from llama_index.core.callbacks.base import CallbackManager
from llama_index.core.memory import BaseMemoryBlock
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from tkg.compat.hits import merged, passage, unextracted
from tkg.compat.messages import episode_inputs, parse_messages, split_long
from tkg.memory import Memory
from tkg.models import Episode, Fact

__all__ = ["TkgMemoryBlock", "TkgRetriever"]

#: The source description of the episodes the memory block writes.
SOURCE = "llamaindex"


class TkgMemoryBlock(BaseMemoryBlock[str]):
    """A LlamaIndex memory block over one group of a tkg memory: what it is given (messages the short-term
    memory lets go of) becomes episodes, extracted when the memory has an LLM; what it returns is tkg's context
    string for the latest user message (facts with their dates, entities, and episodes when no fact matches),
    at most ``max_chars`` long."""

    memory: Memory
    group_id: str
    max_chars: int = 2000
    extract: bool | None = None

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        query = next(
            (m.content for m in reversed(messages or []) if m.role.value == "user" and (m.content or "").strip()), None
        )
        if not query or self.group_id not in self.memory.groups():
            return ""
        # A user message longer than a query may be (a pasted text, its question last): its end is asked, so that
        # the agent's turn goes on (the framework's get() raised)
        query = query.strip()[-self.memory.config.max_query_chars :].strip()
        return await asyncio.to_thread(self.memory.context, query, group_ids=[self.group_id], max_chars=self.max_chars)

    async def _aput(self, messages: list[ChatMessage]) -> None:
        # One write for the batch, all or nothing; the framework has let these messages go already, so a message
        # longer than an episode may be is kept in parts (else the whole batch was lost).
        plain = [
            {"role": m.role.value, "content": m.content, "name": m.additional_kwargs.get("name")}
            for m in messages
            if isinstance(m.content, str) and m.content.strip()
        ]
        parsed = split_long(parse_messages(plain), self.memory.config.max_episode_chars)
        if parsed:
            inputs = episode_inputs(parsed, self.group_id, SOURCE)
            await asyncio.to_thread(self.memory.add_episodes, inputs, extract=self.extract)


class TkgRetriever(BaseRetriever):
    """tkg's hybrid search as a LlamaIndex retriever: the ``similarity_top_k`` best facts (and, with ``episodes``,
    episodes) of ``group_ids``, as text nodes whose metadata holds the record's kind and times."""

    def __init__(
        self,
        memory: Memory,
        group_ids: list[str] | None = None,
        *,
        similarity_top_k: int = 4,
        episodes: bool = True,
        as_of: datetime | None = None,
        callback_manager: CallbackManager | None = None,
    ) -> None:
        self._memory = memory
        self._group_ids = group_ids
        self._k = similarity_top_k
        self._targets = ("facts", "episodes") if episodes else ("facts",)
        self._as_of = as_of
        super().__init__(callback_manager=callback_manager)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        found = self._memory.search(
            query_bundle.query_str, group_ids=self._group_ids, limit=self._k, targets=self._targets, as_of=self._as_of
        )
        best = merged(found, keep=unextracted)[: self._k]
        return [NodeWithScore(node=_node(record), score=score) for score, record in best]


def _node(record: Fact | Episode) -> TextNode:
    text, meta = passage(record)
    return TextNode(id_=record.id, text=text, metadata=meta)
