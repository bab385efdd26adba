"""The LangChain and LlamaIndex adapters (tkg.compat.langchain, tkg.compat.llamaindex), through each framework's
own public interfaces, with the real libraries (the langchain and llamaindex extras; CI installs both)."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    HumanMessage,
    HumanMessageChunk,
    SystemMessage,
    ToolMessage,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables.history import RunnableWithMessageHistory
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.memory import Memory as ChatMemory
from llama_index.core.schema import QueryBundle

from tkg import FactInput, FixedClock, HashEmbedder, Kind, Memory, Ontology, RelationType
from tkg.compat.langchain import TkgChatMessageHistory, TkgRetriever
from tkg.compat.llamaindex import TkgMemoryBlock
from tkg.compat.llamaindex import TkgRetriever as LlamaRetriever
from tkg.llm.rules import RulesLLM

HOMES = Ontology(relations={"LIVES_IN": RelationType(single_valued=True)})


@pytest.fixture
def memory() -> Memory:
    llm = RulesLLM(exclusive={"LIVES_IN"})
    return Memory(embedder=HashEmbedder(dim=64), llm=llm, clock=FixedClock("2024-05-01T00:00:00Z"), ontology=HOMES)


def homes(memory: Memory, group: str = "u1") -> None:
    memory.add_facts(
        [
            FactInput("Ann", "LIVES_IN", "Paris", valid_at="2019-01-01T00:00:00Z"),
            FactInput("Ann", "LIVES_IN", "Rome", valid_at="2023-01-01T00:00:00Z"),
        ],
        group_id=group,
    )


# -- LangChain ---------------------------------------------------------------------------------------------------


def test_langchain_history_keeps_messages_as_episodes(memory: Memory) -> None:
    history = TkgChatMessageHistory(memory, "u1")
    assert isinstance(history, BaseChatMessageHistory) and history.messages == []
    history.add_messages([SystemMessage("Be brief."), HumanMessage("I LIVES_IN Oslo since 2020.", name="Ann")])
    history.add_ai_message("Noted.")
    assert [(type(m).__name__, m.content, m.name) for m in history.messages] == [
        ("SystemMessage", "Be brief.", None),
        ("HumanMessage", "I LIVES_IN Oslo since 2020.", "Ann"),
        ("AIMessage", "Noted.", None),
    ]
    # the memory extracted the conversation: the same memory answers about it
    assert "Ann lives in Oslo" in {f.fact for f in memory.get_all("u1")}
    homes(memory)  # facts of the same group, not written by the history
    history.clear()
    assert history.messages == []
    assert {f.fact for f in memory.get_all("u1")} == {"Ann lives in Rome"}  # Oslo went with its episode
    assert TkgChatMessageHistory(memory, "nobody").messages == []


def test_langchain_history_keeps_an_agent_turn_with_a_tool_call(memory: Memory) -> None:
    history = TkgChatMessageHistory(memory, "u1", extract=False)
    call = {"name": "weather", "args": {"city": "Oslo"}, "id": "c1"}
    history.add_messages(
        [
            HumanMessage("What is the weather in Oslo?"),
            AIMessage(content="", tool_calls=[call]),  # a tool call carries no text to remember
            ToolMessage(content="sunny, 21C", tool_call_id="c1"),
            AIMessage(content="It is sunny in Oslo."),
        ]
    )
    kept = [m.content for m in history.messages]
    assert kept == ["What is the weather in Oslo?", "sunny, 21C", "It is sunny in Oslo."]


@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")  # still LangChain's chat-history door
def test_langchain_history_in_a_chain(memory: Memory) -> None:
    prompt = ChatPromptTemplate.from_messages([MessagesPlaceholder("history"), ("human", "{question}")])
    chain = prompt | FakeListChatModel(responses=["Hello Ann!", "You live in Rome."])
    histories: dict[str, TkgChatMessageHistory] = {}

    def history_for(session_id: str) -> TkgChatMessageHistory:
        return histories.setdefault(session_id, TkgChatMessageHistory(memory, session_id, extract=False))

    talk = RunnableWithMessageHistory(chain, history_for, input_messages_key="question", history_messages_key="history")
    config = {"configurable": {"session_id": "s1"}}
    assert talk.invoke({"question": "Hi, I am Ann."}, config=config).content == "Hello Ann!"
    assert talk.invoke({"question": "Where do I live?"}, config=config).content == "You live in Rome."
    stored = [(m.type, m.content) for m in TkgChatMessageHistory(memory, "s1").messages]
    assert stored == [
        ("human", "Hi, I am Ann."),
        ("ai", "Hello Ann!"),
        ("human", "Where do I live?"),
        ("ai", "You live in Rome."),
    ]
    assert memory.records(Kind.FACT, "s1") == []  # extract=False: kept, not extracted


def test_langchain_retriever(memory: Memory) -> None:
    homes(memory)
    retriever = TkgRetriever(memory=memory, group_ids=["u1"], k=1, episodes=False)
    docs = retriever.invoke("where does Ann live?")
    assert [(d.page_content, d.metadata["kind"]) for d in docs] == [("Ann lives in Rome", "fact")]
    assert docs[0].metadata["valid_at"].startswith("2023-01-01") and docs[0].metadata["invalid_at"] is None
    past = TkgRetriever(memory=memory, group_ids=["u1"], k=1, episodes=False, as_of="2020-06-01T00:00:00Z")
    assert [d.page_content for d in past.invoke("where does Ann live?")] == ["Ann lives in Paris"]
    batch = TkgRetriever(memory=memory, group_ids=["u1"], k=3).batch(["Ann", "Rome"])
    assert len(batch) == 2 and all(1 <= len(docs) <= 3 for docs in batch)


# -- LlamaIndex --------------------------------------------------------------------------------------------------


def test_llamaindex_memory_block_puts_and_gets(memory: Memory) -> None:
    block = TkgMemoryBlock(name="tkg", memory=memory, group_id="u1")
    asyncio.run(
        block.aput(
            [
                ChatMessage(
                    role=MessageRole.USER, content="I LIVES_IN Paris since 2019.", additional_kwargs={"name": "Ann"}
                ),
                ChatMessage(role=MessageRole.ASSISTANT, content="Nice city."),
            ]
        )
    )
    assert [f.fact for f in memory.get_all("u1")] == ["Ann lives in Paris"]
    text = asyncio.run(block.aget([ChatMessage(role=MessageRole.USER, content="Where does Ann live?")]))
    assert "Ann lives in Paris" in text and len(text) <= block.max_chars
    assert asyncio.run(TkgMemoryBlock(name="t", memory=memory, group_id="none").aget([])) == ""


def test_llamaindex_memory_flushes_into_the_block(memory: Memory) -> None:
    """The framework's own Memory: messages past its short-term budget go to the block, and the block's context
    comes back in what the memory hands the LLM."""
    block = TkgMemoryBlock(name="tkg", memory=memory, group_id="u1", extract=True)
    chat = ChatMemory.from_defaults(
        session_id="s1", token_limit=60, chat_history_token_ratio=0.3, token_flush_size=20, memory_blocks=[block]
    )
    chat.put_messages(
        [
            ChatMessage(role=MessageRole.USER, content="I LIVES_IN Lisbon since 2021, for the record and the future."),
            ChatMessage(role=MessageRole.ASSISTANT, content="Understood, I will remember where you live now."),
        ]
        * 2
        + [ChatMessage(role=MessageRole.USER, content="Where does User live?")]
    )
    handed = chat.get()
    assert any("User lives in Lisbon" in (m.content or "") for m in handed)
    assert "User lives in Lisbon" in {f.fact for f in memory.get_all("u1")}


def test_langchain_history_keeps_a_streamed_answer_as_the_assistants(memory: Memory) -> None:
    """A streamed chat model answers with an AIMessageChunk: it was stored under the role (and speaker)
    "AIMessageChunk" and read back as a ChatMessage of that role."""
    history = TkgChatMessageHistory(memory, "u1", extract=False)
    history.add_messages([HumanMessageChunk(content="hi"), AIMessageChunk(content="hello there")])
    assert [(type(m), m.content) for m in history.messages] == [(HumanMessage, "hi"), (AIMessage, "hello there")]
    assert [e.content for e in memory.episodes("u1")] == ["User: hi", "Assistant: hello there"]


def test_llamaindex_block_answers_a_long_or_blank_user_message() -> None:
    """The framework's get() raised tkg's errors on a pasted text longer than a query (its end is asked now) and on a
    blank message (nothing is asked)."""
    memory = Memory(embedder=HashEmbedder(dim=32))
    memory.add_facts([FactInput("Ann", "LIVES_IN", "Lisbon")], group_id="u1")
    block = TkgMemoryBlock(name="tkg", memory=memory, group_id="u1")
    pasted = "lorem " * 3_000 + "Where does Ann live?"
    assert "Ann lives in Lisbon" in asyncio.run(block.aget([ChatMessage(role=MessageRole.USER, content=pasted)]))
    assert asyncio.run(block.aget([ChatMessage(role=MessageRole.USER, content="   ")])) == ""


def test_llamaindex_block_keeps_a_batch_with_a_message_longer_than_an_episode() -> None:
    """The framework lets the messages go before it hands them to the block: one message over max_episode_chars
    failed the block's one write, and the whole batch was lost. It is kept in parts."""
    memory = Memory(embedder=HashEmbedder(dim=32))
    block = TkgMemoryBlock(name="tkg", memory=memory, group_id="u1", extract=False)
    thesis = "Here is my thesis: " + "lorem " * 20_000
    asyncio.run(
        block.aput(
            [
                ChatMessage(role=MessageRole.USER, content="I moved to Lisbon in May."),
                ChatMessage(role=MessageRole.USER, content=thesis),
                ChatMessage(role=MessageRole.ASSISTANT, content="That is long."),
            ]
        )
    )
    stored = [e.content for e in memory.episodes("u1")]
    assert stored[0] == "User: I moved to Lisbon in May." and stored[-1] == "Assistant: That is long."
    parts = [text.removeprefix("User: ") for text in stored[1:-1]]
    assert len(parts) == 2 and "".join(parts).split() == thesis.split()  # in parts (their edges' spaces trimmed)


def test_llamaindex_retriever(memory: Memory) -> None:
    homes(memory)
    retriever = LlamaRetriever(memory, ["u1"], similarity_top_k=1, episodes=False)
    nodes = retriever.retrieve("where does Ann live?")
    assert [(n.node.get_content(), n.node.metadata["kind"]) for n in nodes] == [("Ann lives in Rome", "fact")]
    assert nodes[0].score > 0
    assert retriever.retrieve(QueryBundle("Paris"))[0].node.metadata["group_id"] == "u1"


def test_retrievers_take_k_per_call_and_show_no_fact_batch_as_an_episode(memory: Memory) -> None:
    """invoke(q, k=1) gave the retriever's own k (the framework drops keyword arguments a retriever does not
    declare); and both retrievers returned the JSON of add_facts' batches as episodes, the superseded Paris
    among them, beside the facts that stand for them."""
    homes(memory)
    memory.add_episode("Ann: my cat is called Tom.", group_id="u1", extract=False)
    retriever = TkgRetriever(memory=memory, group_ids=["u1"], k=3)
    assert len(retriever.invoke("where does Ann live?", k=1)) == 1
    assert len(asyncio.run(retriever.ainvoke("where does Ann live?", k=1))) == 1
    shown = [(d.metadata["kind"], d.page_content) for d in retriever.invoke("Ann Paris Rome cat", k=10)]
    assert ("fact", "Ann lives in Rome") in shown and ("episode", "Ann: my cat is called Tom.") in shown
    assert all("Paris" not in text for _, text in shown)
    nodes = LlamaRetriever(memory, ["u1"], similarity_top_k=10).retrieve("Ann Paris Rome cat")
    assert sorted(n.node.get_content() for n in nodes) == sorted(text for _, text in shown)


@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")
def test_langchain_history_keeps_a_message_longer_than_an_episode_in_parts() -> None:
    """In a chain, the history's error is only logged by the framework's tracer: a long question lost the whole
    turn, the answer with it, and invoke() returned as if all was kept."""
    memory = Memory(embedder=HashEmbedder(dim=32))
    history = TkgChatMessageHistory(memory, "u1", extract=False)
    prompt = ChatPromptTemplate.from_messages([MessagesPlaceholder("history"), ("human", "{question}")])
    chain = RunnableWithMessageHistory(
        prompt | FakeListChatModel(responses=["ok"]),
        lambda _: history,
        input_messages_key="question",
        history_messages_key="history",
    )
    question = "Summarise this: " + "lorem ipsum " * 10_000
    chain.invoke({"question": question}, config={"configurable": {"session_id": "s"}})
    kept = [(type(m).__name__, m.content) for m in history.messages]
    assert kept[-1] == ("AIMessage", "ok") and len(kept) > 2
    assert all(name == "HumanMessage" for name, _ in kept[:-1])
    assert " ".join(text for _, text in kept[:-1]).split() == question.split()


def test_llamaindex_block_keeps_messages_whatever_the_episode_limit_and_blank_parts() -> None:
    """A part of a long message holding only blanks failed the whole batch (the blank check read the message, not
    the part); with max_episode_chars of 200 or less the block stored nothing or raised a raw ValueError; and a
    user message ending in many blanks asked an empty query."""
    from tkg import MemoryConfig

    for limit in (60, 150, 200, 1_000):
        memory = Memory(embedder=HashEmbedder(dim=32), config=MemoryConfig(max_episode_chars=limit))
        block = TkgMemoryBlock(name="tkg", memory=memory, group_id="u1", extract=False)
        log = "Build log:" + " " * (3 * limit) + "end"
        said = [("user", "I moved to Lisbon in May."), ("user", log), ("assistant", "Noted.")]
        asyncio.run(block.aput([ChatMessage(role=MessageRole(r), content=c) for r, c in said]))
        stored = [e.content for e in memory.episodes("u1")]
        assert stored[0] == "User: I moved to Lisbon in May." and stored[-1] == "Assistant: Noted.", limit
        assert [t.removeprefix("User: ").strip() for t in stored[1:-1]] == ["Build log:", "end"], limit
        assert all(len(t) <= limit for t in stored)
    memory = Memory(embedder=HashEmbedder(dim=32))
    memory.add_facts([FactInput("Ann", "LIVES_IN", "Lisbon")], group_id="u1")
    block = TkgMemoryBlock(name="tkg", memory=memory, group_id="u1")
    trailing = "Where does Ann live?" + " " * (2 * memory.config.max_query_chars)
    assert "Ann lives in Lisbon" in asyncio.run(block.aget([ChatMessage(role=MessageRole.USER, content=trailing)]))
