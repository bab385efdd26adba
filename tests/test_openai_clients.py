"""OpenAILLM and OpenAIEmbedder against a loopback OpenAI-compatible server, with the real openai client."""

from __future__ import annotations

import json
import math
import socket
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from fake_openai_server import FakeOpenAIServer, default_embed
from pydantic import ValidationError as PydanticValidationError

from tkg.embedders.base import Embedder
from tkg.embedders.openai import OpenAIEmbedder
from tkg.errors import EmbeddingError, LLMError, TkgError, ValidationError
from tkg.llm.base import LLMClient, Prompt
from tkg.llm.openai import OpenAILLM
from tkg.llm.schema import FactDecision, GraphExtraction, Resolution

PROMPT = Prompt("extract_graph", "You extract entities and facts.", "Alice: I moved to Denver last month.")

ANSWER: dict[str, Any] = {
    "entities": [
        {"name": "Alice", "label": "Person", "summary": "Alice moved to Denver."},
        {"name": "Denver", "label": "Place", "summary": ""},
    ],
    "facts": [
        {
            "source": "Alice",
            "target": "Denver",
            "relation": "LIVES_IN",
            "fact": "Alice lives in Denver.",
            "valid_from": "last month",
            "valid_until": None,
        }
    ],
}

BAD_ANSWER: dict[str, Any] = {"entities": "Alice", "facts": [{"source": 1}]}


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(chat=lambda request: ANSWER) as srv:
        yield srv


def llm_for(srv: FakeOpenAIServer, **kwargs: Any) -> OpenAILLM:
    options: dict[str, Any] = {"timeout": 5.0, "http_retries": 0, **kwargs}
    return OpenAILLM("fake-model", base_url=srv.base_url, **options)


def closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def chat_requests(srv: FakeOpenAIServer) -> list[dict[str, Any]]:
    return [body for path, body in srv.requests if path == "/v1/chat/completions"]


# -- OpenAILLM ---------------------------------------------------------------------------------------------------


def test_llm_satisfies_protocol(server: FakeOpenAIServer) -> None:
    assert isinstance(llm_for(server), LLMClient)


def test_tools_mode_returns_validated_model_and_sends_schema_as_tool(server: FakeOpenAIServer) -> None:
    result = llm_for(server, mode="tools").generate(PROMPT, GraphExtraction)

    assert result == GraphExtraction.model_validate(ANSWER)
    (request,) = chat_requests(server)
    assert request["model"] == "fake-model"
    assert request["messages"][:2] == [
        {"role": "system", "content": PROMPT.system},
        {"role": "user", "content": PROMPT.user},
    ]
    assert request["temperature"] == 0.0
    assert request["max_tokens"] == 2048
    (tool,) = request["tools"]
    name = tool["function"]["name"]
    assert request["tool_choice"] == {"type": "function", "function": {"name": name}}
    parameters = tool["function"]["parameters"]
    schema = GraphExtraction.model_json_schema()
    assert parameters["properties"] == schema["properties"]
    assert parameters["$defs"] == schema["$defs"]


@pytest.mark.parametrize(
    ("decision", "duplicates"),
    [
        ({"new": 1, "duplicates": [2, 3], "contradicts": [1]}, [2, 3]),
        ({"new": 1, "duplicate_of": 2, "contradicts": [1]}, [2]),  # the earlier form of the answer
        ({"new": 1, "duplicate_of": None}, []),
    ],
)
def test_a_resolution_names_every_duplicate_and_an_answer_in_the_one_duplicate_form_is_still_read(
    decision: dict[str, Any], duplicates: list[int]
) -> None:
    with FakeOpenAIServer(chat=lambda request: {"reasoning": "", "facts": [decision]}) as srv:
        result = llm_for(srv, mode="tools").generate(PROMPT, Resolution)
        (request,) = chat_requests(srv)
    assert result.facts == [FactDecision(new=1, duplicates=duplicates, contradicts=decision.get("contradicts", []))]
    # the schema sent asks for a list of duplicates; the one-number form is read, not asked for
    sent = request["tools"][0]["function"]["parameters"]["$defs"]["FactDecision"]["properties"]
    assert sent["duplicates"]["type"] == "array" and "duplicate_of" not in sent


def test_an_answer_giving_both_forms_of_duplicates_is_invalid() -> None:
    with pytest.raises(PydanticValidationError, match="not both"):
        FactDecision.model_validate({"new": 1, "duplicates": [2], "duplicate_of": 3})


@pytest.mark.parametrize("mode", ["json", "json_schema", "md_json"])
def test_content_modes_return_validated_model(server: FakeOpenAIServer, mode: str) -> None:
    if mode == "md_json":  # what a model told to answer "within a ```json codeblock" sends
        server.chat = lambda request: f"Here you go:\n```json\n{json.dumps(ANSWER)}\n```"

    result = llm_for(server, mode=mode).generate(PROMPT, GraphExtraction)

    assert result == GraphExtraction.model_validate(ANSWER)
    (request,) = chat_requests(server)
    assert "tools" not in request
    assert request["messages"][-1]["role"] == "user"
    assert request["messages"][-1]["content"].startswith(PROMPT.user)  # md_json appends an instruction
    # instructor puts the schema into the system message or the response_format; either way it is sent
    assert "valid_from" in json.dumps(request)
    if mode == "json":
        assert request["response_format"] == {"type": "json_object"}
        assert request["messages"][0]["role"] == "system"
        assert request["messages"][0]["content"].startswith(PROMPT.system)


def test_invalid_output_raises_llm_error_after_retries(server: FakeOpenAIServer) -> None:
    server.chat = lambda request: BAD_ANSWER

    with pytest.raises(LLMError, match="did not fit GraphExtraction after 2 attempt") as info:
        llm_for(server, max_retries=1).generate(PROMPT, GraphExtraction)

    assert "fake-model" in str(info.value)
    assert server.base_url in str(info.value)
    assert len(chat_requests(server)) == 2  # the first answer plus one re-ask


def test_invalid_then_valid_output_recovers_on_retry(server: FakeOpenAIServer) -> None:
    answers = iter([BAD_ANSWER, ANSWER])
    server.chat = lambda request: next(answers)

    result = llm_for(server, max_retries=1).generate(PROMPT, GraphExtraction)

    assert result.entities[0].name == "Alice"
    retry = chat_requests(server)[1]
    assert len(retry["messages"]) > 2  # instructor re-asks with the validation error appended


@pytest.mark.parametrize("mode", ["tools", "json"])
def test_non_json_output_raises_llm_error(server: FakeOpenAIServer, mode: str) -> None:
    server.chat = lambda request: "Sure! Alice moved to Denver."

    with pytest.raises(LLMError, match="did not fit GraphExtraction"):
        llm_for(server, mode=mode, max_retries=0).generate(PROMPT, GraphExtraction)


def test_http_500_raises_llm_error(server: FakeOpenAIServer) -> None:
    server.fail_next(1, status=500, message="model exploded")

    with pytest.raises(LLMError, match="HTTP 500") as info:
        llm_for(server).generate(PROMPT, GraphExtraction)

    assert "model exploded" in str(info.value)
    assert len(server.requests) == 1  # http_retries=0 and no instructor re-ask for transport errors


def test_http_400_raises_llm_error(server: FakeOpenAIServer) -> None:
    server.fail_next(1, status=400, message="unsupported response_format")

    with pytest.raises(LLMError, match=r"HTTP 400: unsupported response_format"):
        llm_for(server, mode="json_schema").generate(PROMPT, GraphExtraction)


def test_http_retries_are_passed_to_the_openai_client(server: FakeOpenAIServer) -> None:
    server.fail_next(1, status=503)

    result = llm_for(server, http_retries=1).generate(PROMPT, GraphExtraction)

    assert result.entities
    assert len(server.requests) == 2


def test_refused_connection_raises_llm_error_quickly() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    llm = OpenAILLM("fake-model", base_url=url, timeout=2.0, http_retries=0)

    started = time.monotonic()
    with pytest.raises(LLMError, match="could not connect") as info:
        llm.generate(PROMPT, GraphExtraction)

    assert time.monotonic() - started < 2.0
    assert url in str(info.value)
    assert isinstance(info.value, TkgError)


def test_an_answer_cut_off_in_its_body_is_not_called_a_failure_to_connect() -> None:
    """The request reached the server and the body broke off: it said "could not connect"."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def answer_half() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n{"id": ')
        conn.close()

    threading.Thread(target=answer_half, daemon=True).start()
    llm = OpenAILLM("fake-model", base_url=f"http://127.0.0.1:{listener.getsockname()[1]}/v1", timeout=5.0)
    with pytest.raises(LLMError, match="the connection broke off") as info:
        llm.generate(PROMPT, GraphExtraction)
    listener.close()
    assert info.value.retryable and "could not connect" not in str(info.value)


def test_timeout_raises_llm_error(server: FakeOpenAIServer) -> None:
    def slow(request: dict[str, Any]) -> dict[str, Any]:
        time.sleep(1.0)
        return ANSWER

    server.chat = slow

    with pytest.raises(LLMError, match=r"timed out after 0\.2s"):
        llm_for(server, timeout=0.2).generate(PROMPT, GraphExtraction)


def test_an_existing_openai_client_can_be_passed_in(server: FakeOpenAIServer) -> None:
    import openai

    client = openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)

    result = OpenAILLM("fake-model", client=client).generate(PROMPT, GraphExtraction)

    assert result.facts[0].relation == "LIVES_IN"


@pytest.mark.parametrize(
    "kwargs",
    [{"mode": "xml"}, {"max_retries": -1}, {"max_tokens": 0}, {"timeout": 0.0}, {"http_retries": -1}],
)
def test_bad_configuration_is_rejected(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        OpenAILLM("fake-model", base_url="http://127.0.0.1:1/v1", **kwargs)


# -- OpenAIEmbedder ----------------------------------------------------------------------------------------------


def embedder_for(srv: FakeOpenAIServer, dim: int = 8, **kwargs: Any) -> OpenAIEmbedder:
    options: dict[str, Any] = {"timeout": 5.0, "http_retries": 0, **kwargs}
    return OpenAIEmbedder("fake-embed", dim, base_url=srv.base_url, **options)


def expected_vectors(texts: list[str]) -> np.ndarray:
    raw = np.asarray(default_embed(texts), dtype=np.float64)
    return raw / np.linalg.norm(raw, axis=1, keepdims=True)


def test_embedder_satisfies_protocol(server: FakeOpenAIServer) -> None:
    embedder = embedder_for(server)
    assert isinstance(embedder, Embedder)
    assert embedder.dim == 8
    assert embedder.name == "openai:fake-embed:8"


def test_embedder_returns_normalised_float32_in_request_order(server: FakeOpenAIServer) -> None:
    server.reverse_embeddings = True
    texts = ["alpha", "beta", "gamma"]

    vectors = embedder_for(server).embed(texts)

    assert vectors.dtype == np.float32
    assert vectors.shape == (3, 8)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(vectors, expected_vectors(texts), rtol=1e-5, atol=1e-6)
    ((path, body),) = server.requests
    assert path == "/v1/embeddings"
    assert body["model"] == "fake-embed"
    assert body["input"] == texts


def test_embedder_batches_requests(server: FakeOpenAIServer) -> None:
    texts = ["a", "b", "c", "d", "e"]

    vectors = embedder_for(server, batch_size=2).embed(texts)

    assert [body["input"] for _, body in server.requests] == [["a", "b"], ["c", "d"], ["e"]]
    np.testing.assert_allclose(vectors, expected_vectors(texts), rtol=1e-5, atol=1e-6)


def test_embedder_empty_input_makes_no_request(server: FakeOpenAIServer) -> None:
    vectors = embedder_for(server).embed([])

    assert vectors.shape == (0, 8)
    assert vectors.dtype == np.float32
    assert server.requests == []


def test_embedder_wrong_dimension_raises_embedding_error(server: FakeOpenAIServer) -> None:
    with pytest.raises(EmbeddingError, match="expected"):
        embedder_for(server, dim=16).embed(["alpha"])


def test_embedder_wrong_count_raises_embedding_error(server: FakeOpenAIServer) -> None:
    server.embed = lambda texts: default_embed(texts)[:-1]

    with pytest.raises(EmbeddingError, match="1 vectors for 2 texts"):
        embedder_for(server).embed(["alpha", "beta"])


def test_embedder_nan_raises_embedding_error(server: FakeOpenAIServer) -> None:
    server.embed = lambda texts: [[math.nan] * 8 for _ in texts]

    with pytest.raises(EmbeddingError, match="NaN"):
        embedder_for(server).embed(["alpha"])


def test_embedder_http_500_raises_llm_error(server: FakeOpenAIServer) -> None:
    server.fail_next(1, status=500, message="embedding model not loaded")

    with pytest.raises(LLMError, match=r"embeddings endpoint .* HTTP 500: embedding model not loaded"):
        embedder_for(server).embed(["alpha"])


def test_embedder_refused_connection_raises_llm_error() -> None:
    embedder = OpenAIEmbedder("fake-embed", 8, base_url=f"http://127.0.0.1:{closed_port()}/v1", http_retries=0)

    with pytest.raises(LLMError, match=r"embeddings endpoint .* could not connect"):
        embedder.embed(["alpha"])


@pytest.mark.parametrize("kwargs", [{"dim": 0}, {"batch_size": 0}, {"model": ""}])
def test_embedder_bad_configuration_is_rejected(kwargs: dict[str, Any]) -> None:
    options: dict[str, Any] = {"model": "m", "dim": 8, **kwargs}
    with pytest.raises(ValidationError):
        OpenAIEmbedder(options.pop("model"), options.pop("dim"), base_url="http://127.0.0.1:1/v1", **options)


@pytest.mark.parametrize(("bad_answers", "max_attempts"), [(99, 4), (99, 1), (1, 4), (2, 3)])
def test_every_request_counts_against_the_policys_attempts(bad_answers: int, max_attempts: int) -> None:
    """OpenAILLM's re-asks (max_retries: the validation error goes back to the model) ran inside each of the
    guard's attempts: 8 requests for max_attempts=4, and LLMUsage.retries counted 3 of the 7 requests past the
    first (none when one bad answer was re-asked)."""
    from tkg.llm import LLMPolicy, LLMUsage
    from tkg.llm.guard import GuardedLLM

    answers = iter([BAD_ANSWER] * bad_answers)
    with FakeOpenAIServer(chat=lambda request: next(answers, ANSWER)) as srv:
        guard = GuardedLLM(llm_for(srv, max_retries=1), LLMPolicy(max_attempts=max_attempts, backoff_initial=0.0))
        usage = LLMUsage()
        if bad_answers >= max_attempts:
            with pytest.raises(LLMError):
                guard.call(PROMPT, GraphExtraction, usage)
        else:
            assert guard.call(PROMPT, GraphExtraction, usage).entities
        made = len(chat_requests(srv))
    assert made == min(bad_answers + 1, max_attempts)
    assert (usage.calls, usage.retries) == (1, made - 1)
