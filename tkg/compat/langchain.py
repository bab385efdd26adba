"""LangChain adapters (``pip install "tkg[langchain]"``): a chat message history kept as tkg episodes, and a
retriever over tkg's hybrid search.

>>> from tkg.compat.langchain import TkgChatMessageHistory, TkgRetriever     # doctest: +SKIP
>>> history = TkgChatMessageHistory(memory, group_id="user-42")             # doctest: +SKIP
>>> history.add_user_message("I moved to Lisbon in May.")                  # doctest: +SKIP
>>> TkgRetriever(memory=memory, group_ids=["user-42"], k=4).invoke("where does the user live?")  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables.config import run_in_executor
from pydantic import ConfigDict

from tkg.compat.hits import merged, passage, unextracted
from tkg.compat.messages import episode_inputs, message_of, parse_messages, split_long
from tkg.memory import Memory
from tkg.models import Episode, Fact
from tkg.search import SearchResults

__all__ = ["TkgChatMessageHistory", "TkgRetriever", "documents"]

#: The source description of the episodes the chat history writes.
SOURCE = "langchain"
_ROLES = {"human": "user", "ai": "assistant", "system": "system"}
_CLASS_ROLES = ((HumanMessage, "user"), (AIMessage, "assistant"), (SystemMessage, "system"))


class TkgChatMessageHistory(BaseChatMessageHistory):
    """The messages of one conversation, kept as episodes of ``group_id`` in a tkg memory. Each message added is
    an episode (extracted into facts when the memory has an LLM, unless ``extract=False``), so the same memory
    answers ``search`` and ``context`` over the conversation. ``clear`` removes this history's episodes (and
    the facts only they support) and nothing else of the group. What is kept is each message's text: tool calls
    are not (an AI message comes back without them; one with no text is left out), and a tool's result comes
    back as a ``ChatMessage`` of role ``"tool"``; a message longer than an episode may be is kept in parts."""

    def __init__(self, memory: Memory, group_id: str, *, extract: bool | None = None) -> None:
        self.memory = memory
        self.group_id = group_id
        self.extract = extract

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return [_langchain_message(*message_of(e, SOURCE)) for e in self._episodes()]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        # A message with no text (an AI message that only calls tools) has nothing to remember: left out, as the
        # LlamaIndex block leaves it out, so an agent's turn is kept with the rest of its messages.
        # A message longer than an episode may be is kept in parts (in a chain, an error here is only logged by
        # the framework's tracer: the turn would be lost unseen).
        plain = [_plain(message) for message in messages]
        parsed = parse_messages([m for m in plain if not isinstance(m["content"], str) or m["content"].strip()])
        parsed = split_long(parsed, self.memory.config.max_episode_chars)
        if parsed:
            self.memory.add_episodes(episode_inputs(parsed, self.group_id, SOURCE), extract=self.extract)

    def clear(self) -> None:
        for episode in self._episodes():
            self.memory.remove_episode(episode.id)

    def _episodes(self) -> list[Episode]:
        if self.group_id not in self.memory.groups():
            return []
        return [e for e in self.memory.episodes(self.group_id) if e.source_description == SOURCE]


class TkgRetriever(BaseRetriever):
    """tkg's hybrid search as a LangChain retriever: the ``k`` best facts (and, with ``episodes``, messages) of
    ``group_ids`` for a query, as :class:`Document` objects whose metadata holds the record's id, kind, score and
    times. ``as_of`` / ``known_at`` read the memory at another time."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: Memory
    group_ids: list[str] | None = None
    k: int = 4
    episodes: bool = True
    as_of: datetime | None = None
    known_at: datetime | None = None

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun, k: int | None = None
    ) -> list[Document]:
        # ``k`` given to invoke() overrides the retriever's (the framework passes it on when the signature has it)
        k = self.k if k is None else k
        targets = ("facts", "episodes") if self.episodes else ("facts",)
        found = self.memory.search(
            query, group_ids=self.group_ids, limit=k, targets=targets, as_of=self.as_of, known_at=self.known_at
        )
        return documents(found, k)

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun, k: int | None = None
    ) -> list[Document]:
        return await run_in_executor(None, self._get_relevant_documents, query, run_manager=run_manager.get_sync(), k=k)


def documents(found: SearchResults, k: int) -> list[Document]:
    """The ``k`` best records of a search as documents, facts and the episodes no fact stands for
    (:func:`tkg.compat.hits.unextracted`) merged by score."""
    return [_document(record, score) for score, record in merged(found, keep=unextracted)[:k]]


def _document(record: Fact | Episode, score: float) -> Document:
    text, meta = passage(record)
    return Document(page_content=text, metadata={"id": record.id, "score": score, **meta})


def _plain(message: BaseMessage) -> dict[str, Any]:
    # By class, not by type name: a streamed answer is an AIMessageChunk (a subclass of AIMessage, of type
    # "AIMessageChunk"), and it was stored under that name as its role and speaker.
    if isinstance(message, ChatMessage):
        role = message.role
    else:
        role = next((r for cls, r in _CLASS_ROLES if isinstance(message, cls)), _ROLES.get(message.type, message.type))
    content = message.content if isinstance(message.content, str) else message.text
    return {"role": role, "content": content, "name": message.name}


def _langchain_message(role: str, speaker: str, content: str) -> BaseMessage:
    name = speaker if speaker and speaker != role.title() else None
    if role == "user":
        return HumanMessage(content=content, name=name)
    if role == "assistant":
        return AIMessage(content=content, name=name)
    if role == "system":
        return SystemMessage(content=content, name=name)
    return ChatMessage(role=role, content=content, name=name)
