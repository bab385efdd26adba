"""Retries, back-off, rate and concurrency limits, and usage: the guard alone, and a real openai client talking to
a local OpenAI-compatible server that answers with rate limits, server errors and malformed JSON."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fake_openai_server import FakeOpenAIServer
from pydantic import BaseModel

from tkg import HashEmbedder, Kind, Memory, MemoryConfig
from tkg.errors import ConfigurationError, ExtractionFailedError, LLMError
from tkg.llm import GraphExtraction, LLMPolicy, LLMUsage, Prompt, ScriptedLLM
from tkg.llm.guard import GuardedLLM
from tkg.llm.openai import OpenAILLM

PROMPT = Prompt("extract_graph", "system", "user text")
ANSWER = {"entities": [{"name": "Alice", "label": "Person"}], "facts": []}


class Sleeper:
    """A fake sleep that records the waits instead of waiting."""

    def __init__(self) -> None:
        self.waits: list[float] = []
        self.now = 0.0

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds

    def monotonic(self) -> float:
        return self.now


def failing(times: int, retryable: bool = True, retry_after: float | None = None) -> ScriptedLLM:
    state = {"n": 0}

    def handler(prompt: Prompt, model: type[BaseModel]) -> Any:
        state["n"] += 1
        if state["n"] <= times:
            raise LLMError("HTTP 429: slow down", retryable=retryable, retry_after=retry_after)
        return ANSWER

    return ScriptedLLM(handler=handler)


def test_retryable_errors_back_off_exponentially_then_succeed() -> None:
    sleeper = Sleeper()
    guard = GuardedLLM(
        failing(3), LLMPolicy(backoff_initial=1.0, jitter=0.0), sleep=sleeper.sleep, monotonic=sleeper.monotonic
    )
    usage = LLMUsage()
    assert guard.call(PROMPT, GraphExtraction, usage).entities[0].name == "Alice"
    assert sleeper.waits == [1.0, 2.0, 4.0] and usage.calls == 1 and usage.retries == 3 and usage.seconds == 7.0


def test_the_server_retry_after_is_respected_and_capped() -> None:
    sleeper = Sleeper()
    guard = GuardedLLM(
        failing(1, retry_after=12.0),
        LLMPolicy(backoff_initial=0.5, backoff_max=10.0, jitter=0.0),
        sleep=sleeper.sleep,
        monotonic=sleeper.monotonic,
    )
    guard.call(PROMPT, GraphExtraction, LLMUsage())
    assert sleeper.waits == [10.0]


def test_non_retryable_errors_fail_at_once_and_exhausted_retries_say_so() -> None:
    sleeper = Sleeper()
    usage = LLMUsage()
    with pytest.raises(LLMError, match="slow down") as info:
        GuardedLLM(failing(5, retryable=False), sleep=sleeper.sleep).call(PROMPT, GraphExtraction, usage)
    assert sleeper.waits == [] and usage.failures == 1 and "gave up" not in str(info.value)
    with pytest.raises(LLMError, match="gave up after 2 attempts"):
        GuardedLLM(failing(5), LLMPolicy(max_attempts=2), sleep=sleeper.sleep).call(PROMPT, GraphExtraction, usage)


def test_a_users_client_raising_its_own_exception_becomes_an_llm_error() -> None:
    class Broken:
        def generate(self, prompt: Prompt, response_model: type[BaseModel]) -> Any:
            raise RuntimeError("socket on fire")

    with pytest.raises(LLMError, match="socket on fire"):
        GuardedLLM(Broken()).call(PROMPT, GraphExtraction, LLMUsage())  # type: ignore[arg-type]


def test_requests_per_minute_spaces_the_calls() -> None:
    sleeper = Sleeper()
    guard = GuardedLLM(
        ScriptedLLM(handler=lambda p, m: ANSWER),
        LLMPolicy(requests_per_minute=120),
        sleep=sleeper.sleep,
        monotonic=sleeper.monotonic,
    )
    for _ in range(4):
        guard.call(PROMPT, GraphExtraction, LLMUsage())
    assert sleeper.waits == [0.5, 0.5, 0.5]


def test_one_concurrency_limit_is_shared_by_all_threads() -> None:
    active, peak = [0], [0]
    lock = threading.Lock()

    def slow(prompt: Prompt, model: type[BaseModel]) -> Any:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.02)
        with lock:
            active[0] -= 1
        return ANSWER

    guard = GuardedLLM(ScriptedLLM(handler=slow), LLMPolicy(max_concurrency=2))
    threads = [threading.Thread(target=guard.call, args=(PROMPT, GraphExtraction, LLMUsage())) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 2


def test_policy_rejects_impossible_settings() -> None:
    for bad in ({"max_attempts": 0}, {"max_concurrency": 0}, {"jitter": 2.0}, {"requests_per_minute": 0}):
        with pytest.raises(ConfigurationError):
            LLMPolicy(**bad)  # type: ignore[arg-type]


# -- a real openai client against a local server ------------------------------------------------------------------
@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(chat=lambda request: ANSWER) as srv:
        yield srv


def memory_for(srv: FakeOpenAIServer, **policy: Any) -> Memory:
    llm = OpenAILLM("fake-model", base_url=srv.base_url, timeout=5.0, max_retries=0)
    config = MemoryConfig(llm_policy=LLMPolicy(backoff_initial=0.01, backoff_max=0.05, **policy))
    return Memory(embedder=HashEmbedder(dim=32), llm=llm, config=config)


def test_rate_limits_and_server_errors_are_retried_with_real_tokens_counted(server: FakeOpenAIServer) -> None:
    server.fail_next(1, status=429, message="rate limited", retry_after=0.01)
    server.fail_next(1, status=503, message="overloaded")
    memory = memory_for(server)
    result = memory.add_episode("Alice: hello", group_id="g")
    assert len(server.requests) == 3 and result.usage.retries == 2
    assert result.usage.prompt_tokens > 0 and not result.usage.estimated  # the server reported usage


def test_malformed_json_is_retried_as_invalid_output() -> None:
    answers = iter(["{not json", ANSWER])
    with FakeOpenAIServer(chat=lambda request: next(answers)) as srv:
        result = memory_for(srv).add_episode("Alice: hello", group_id="g")
    assert result.usage.retries == 1 and [e.name for e in result.entities] == ["Alice"]


def test_the_tokens_of_answers_that_could_not_be_used_are_counted_too() -> None:
    """The server bills every answer it sends: a malformed one retried, or all of a call that failed for good. The
    usage kept only the last answer's tokens (0 for a failed call)."""
    billed: list[tuple[int, int]] = []

    def answer(request: dict[str, Any]) -> str:
        text = "{not json" if len(billed) % 2 == 0 else ANSWER
        prompt_tokens = sum(len(str(m.get("content") or "")) // 4 for m in request["messages"])
        billed.append((prompt_tokens, len(text if isinstance(text, str) else json.dumps(text)) // 4))
        return text

    with FakeOpenAIServer(chat=answer) as srv:
        memory = memory_for(srv)
        result = memory.add_episode("Alice: hello", group_id="g")
        assert result.usage.retries == 1 and len(billed) == 2
        assert (result.usage.prompt_tokens, result.usage.completion_tokens) == _total(billed)
    billed.clear()
    with FakeOpenAIServer(chat=lambda request: _malformed(request, billed)) as srv:
        memory = memory_for(srv, max_attempts=3)
        with pytest.raises(ExtractionFailedError, match="gave up after 3 attempts"):
            memory.add_episode("Alice: hello", group_id="g")
        usage = memory.usage
        assert usage.failures == 1 and len(billed) == 3
        assert (usage.prompt_tokens, usage.completion_tokens) == _total(billed)


def _total(billed: list[tuple[int, int]]) -> tuple[int, int]:
    return sum(p for p, _ in billed), sum(c for _, c in billed)


def _malformed(request: dict[str, Any], billed: list[tuple[int, int]]) -> str:
    billed.append((sum(len(str(m.get("content") or "")) // 4 for m in request["messages"]), len("{not json") // 4))
    return "{not json"


def test_a_client_error_is_not_retried_and_the_episode_waits_for_retry(server: FakeOpenAIServer) -> None:
    server.fail_next(1, status=401, message="bad key")
    memory = memory_for(server)
    with pytest.raises(ExtractionFailedError, match="bad key"):
        memory.add_episode("Alice: hello", group_id="g")
    assert len(server.requests) == 1 and len(memory.records(Kind.ENTITY)) == 0
    assert memory.retry(memory.failed_episodes()[0].id).entities[0].name == "Alice"


def test_persistent_server_errors_give_up_after_the_policy_attempts(server: FakeOpenAIServer) -> None:
    server.fail_next(10, status=500, message="exploded")
    memory = memory_for(server, max_attempts=3)
    with pytest.raises(ExtractionFailedError, match="gave up after 3 attempts"):
        memory.add_episode("Alice: hello", group_id="g")
    assert len(server.requests) == 3 and memory.usage.failures == 1


def test_a_users_client_that_reports_usage_is_believed_and_one_that_does_not_is_estimated() -> None:
    from tkg.environment import describe_llm
    from tkg.llm import Tokens, UsageReportingLLM

    class Reporting:
        def generate(self, prompt: Prompt, response_model: type[Any]) -> Any:
            raise AssertionError("generate_with_usage is preferred when the client has it")

        def generate_with_usage(self, prompt: Prompt, response_model: type[Any]) -> tuple[Any, Tokens | None]:
            return GraphExtraction.model_validate(ANSWER), Tokens(prompt=1234, completion=56)

    assert isinstance(Reporting(), UsageReportingLLM) and not isinstance(ScriptedLLM([]), UsageReportingLLM)
    usage = LLMUsage()
    GuardedLLM(Reporting(), LLMPolicy()).call(Prompt("p", "s", "u"), GraphExtraction, usage)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.estimated) == (1234, 56, False)
    usage = LLMUsage()
    scripted = ScriptedLLM([GraphExtraction.model_validate(ANSWER)])
    GuardedLLM(scripted, LLMPolicy()).call(Prompt("p", "s", "u"), GraphExtraction, usage)
    assert usage.estimated
    assert describe_llm(scripted) == "ScriptedLLM" and describe_llm(None) == "none"
    assert describe_llm(OpenAILLM("m", base_url="http://127.0.0.1:9/v1")) == "m at http://127.0.0.1:9/v1"


def test_a_reasking_clients_requests_count_against_the_attempts_whatever_it_returns() -> None:
    """A client that asks again by itself (tkg.llm.ReaskingLLM) and gives back an answer of the wrong type: the
    guard counted one request where it had made several, and made 8 for max_attempts=4."""
    from tkg.llm import ReaskingLLM, Tokens

    class Other(BaseModel):
        text: str = "no"

    class Reasking:
        def __init__(self) -> None:
            self.requests = 0
            self.calls = 0

        def generate(self, prompt: Prompt, response_model: type[Any]) -> Any:
            return self.generate_within(prompt, response_model, 1)[0]

        def generate_with_usage(self, prompt: Prompt, response_model: type[Any]) -> tuple[Any, Tokens | None]:
            return self.generate_within(prompt, response_model, 3)[:2]

        def generate_within(
            self, prompt: Prompt, response_model: type[Any], most_requests: int
        ) -> tuple[Any, Tokens | None, int]:
            made = min(3, most_requests)
            self.requests += made
            self.calls += 1
            return Other(), Tokens(1, 1), made  # never the model asked for

    client = Reasking()
    assert isinstance(client, ReaskingLLM)
    usage = LLMUsage()
    with pytest.raises(LLMError, match="gave up after 4 attempts"):
        GuardedLLM(client, LLMPolicy(max_attempts=4, backoff_initial=0.0)).call(PROMPT, GraphExtraction, usage)
    assert (client.requests, client.calls, usage.retries) == (4, 2, 3)
