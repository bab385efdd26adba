"""An LLM client for any OpenAI-compatible chat endpoint (OpenAI, vLLM, Ollama, llama.cpp), via instructor."""

from __future__ import annotations

from typing import Any

import instructor
import openai
from instructor.core import IncompleteOutputException, InstructorError, InstructorRetryException
from instructor.core import ValidationError as InstructorValidationError
from instructor.core.hooks import Hooks
from pydantic import ValidationError as PydanticValidationError

from tkg.errors import LLMError, ValidationError
from tkg.llm.base import Prompt, T, Tokens

DEFAULT_BASE_URL = "https://api.openai.com/v1"

_MODES: dict[str, instructor.Mode] = {
    "tools": instructor.Mode.TOOLS,
    "json": instructor.Mode.JSON,
    "json_schema": instructor.Mode.JSON_SCHEMA,
    "md_json": instructor.Mode.MD_JSON,
}

_MAX_REASON_CHARS = 600


def make_openai_client(base_url: str | None, api_key: str, timeout: float, http_retries: int) -> openai.OpenAI:
    """Build an ``openai.OpenAI`` client from explicit settings only.

    The base URL is always passed, so ``OPENAI_BASE_URL`` in the environment cannot redirect calls.
    """
    if timeout <= 0:
        raise ValidationError(f"timeout must be positive, got {timeout}")
    if http_retries < 0:
        raise ValidationError(f"http_retries must be >= 0, got {http_retries}")
    return openai.OpenAI(
        base_url=base_url or DEFAULT_BASE_URL, api_key=api_key, timeout=timeout, max_retries=http_retries
    )


def describe_openai_error(exc: BaseException, timeout: float | None = None) -> str:
    """One line saying why an ``openai`` call failed (transport, HTTP status, or anything else)."""
    if isinstance(exc, openai.APITimeoutError):
        return f"the request timed out after {timeout}s" if timeout is not None else "the request timed out"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__ or exc.__context__
        detail = f": {type(cause).__name__}: {cause}" if cause is not None else ""
        # a request that reached the server and lost its answer (the body cut off, the peer gone) is not one
        # that could not connect
        # (by the class's name: the openai package may bring its own copy of httpx)
        reached = cause is not None and not {c.__name__ for c in type(cause).__mro__} & {
            "ConnectError",
            "ConnectTimeout",
        }
        return f"{'the connection broke off' if reached else 'could not connect'}{detail}"
    if isinstance(exc, openai.APIStatusError):
        # exc.message repeats the whole body; the error object's own message is the useful part
        body = exc.body
        message = body.get("message") if isinstance(body, dict) else None
        return f"HTTP {exc.status_code}: {_shorten(str(message) if message else exc.message)}"
    return f"{type(exc).__name__}: {_shorten(str(exc))}"


class OpenAILLM:
    """:class:`tkg.llm.LLMClient` over an OpenAI-compatible ``/chat/completions`` endpoint, using instructor.

    Nothing is read from the environment: pass ``api_key`` yourself (the dummy default suits local servers).
    ``mode`` picks how the schema is enforced: ``tools`` (function calling; best with llama.cpp and OpenAI),
    ``json``, ``json_schema`` or ``md_json``. Every failure is raised as :class:`tkg.errors.LLMError`.

    >>> llm = OpenAILLM("gpt-4o-mini", api_key="sk-...")  # doctest: +SKIP
    >>> llm = OpenAILLM("local", base_url="http://127.0.0.1:8080/v1", mode="json")  # doctest: +SKIP
    >>> prompt = Prompt("extract", "Extract entities and facts.", "Alice moved to Denver.")
    >>> llm.generate(prompt, GraphExtraction).entities  # doctest: +SKIP
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str = "sk-no-key",
        mode: str = "tools",
        temperature: float = 0.0,
        max_tokens: int = 2048,
        max_retries: int = 1,
        timeout: float = 60.0,
        http_retries: int = 0,
        client: openai.OpenAI | None = None,
    ) -> None:
        if not model:
            raise ValidationError("OpenAILLM needs a model name")
        if mode not in _MODES:
            raise ValidationError(f"unknown mode {mode!r}; use one of {', '.join(_MODES)}")
        if max_retries < 0:
            raise ValidationError(f"max_retries must be >= 0, got {max_retries}")
        if max_tokens < 1:
            raise ValidationError(f"max_tokens must be positive, got {max_tokens}")
        self.model = model
        self.mode = mode
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.max_retries = max_retries
        self._timeout = timeout if client is None else None  # a caller's own client has its own timeout
        self._client = client if client is not None else make_openai_client(base_url, api_key, timeout, http_retries)
        self._instructor = instructor.from_openai(self._client, mode=_MODES[mode])

    @property
    def endpoint(self) -> str:
        return str(self._client.base_url).rstrip("/")

    def generate(self, prompt: Prompt, response_model: type[T]) -> T:
        return self.generate_with_usage(prompt, response_model)[0]

    def generate_with_usage(self, prompt: Prompt, response_model: type[T]) -> tuple[T, Tokens | None]:
        """The answer and the tokens the server reported for it (None if it reported none)."""
        answer, tokens, _ = self.generate_within(prompt, response_model, self.max_retries + 1)
        return answer, tokens

    def generate_within(
        self, prompt: Prompt, response_model: type[T], most_requests: int
    ) -> tuple[T, Tokens | None, int]:
        """The answer, its tokens and the requests made for it: up to ``max_retries`` re-asks (the validation
        error sent back to the model), within ``most_requests`` in all (:class:`tkg.llm.ReaskingLLM`)."""
        messages: list[Any] = [
            {"role": "system", "content": prompt.system},
            {"role": "user", "content": prompt.user},
        ]
        made = [0]
        hooks = Hooks()
        hooks.on("completion:kwargs", lambda *_, **__: made.__setitem__(0, made[0] + 1))
        try:
            result, completion = self._instructor.chat.completions.create_with_completion(
                model=self.model,
                response_model=response_model,
                messages=messages,
                max_retries=max(0, min(self.max_retries, most_requests - 1)),
                hooks=hooks,
                temperature=self.temperature,
                max_tokens=self.max_tokens,
            )
        except (openai.OpenAIError, InstructorError, PydanticValidationError, ValueError) as exc:
            retryable, retry_after = _retry_hint(exc)
            raise LLMError(
                f"LLM call {prompt.name!r} to {self.endpoint} (model {self.model!r}) failed: "
                f"{self._reason(exc, response_model)}",
                retryable=retryable,
                retry_after=retry_after,
                spent=_spent(exc),
                requests=max(1, made[0]),
            ) from exc
        if not isinstance(result, response_model):
            raise LLMError(
                f"LLM call {prompt.name!r} to {self.endpoint} (model {self.model!r}) returned "
                f"{type(result).__name__}, not {response_model.__name__}",
                retryable=True,
                requests=max(1, made[0]),
            )
        # instructor returns an instance of its own subclass of response_model carrying the raw completion;
        # rebuild a plain instance (already validated) so results compare, pickle and serialise like any other.
        fields = {name: getattr(result, name) for name in type(result).model_fields}
        plain = response_model.model_construct(
            _fields_set=set(result.model_fields_set), **fields, **(result.__pydantic_extra__ or {})
        )
        usage = getattr(completion, "usage", None)
        tokens = None
        if usage is not None and getattr(usage, "prompt_tokens", None) is not None:
            tokens = Tokens(int(usage.prompt_tokens), int(usage.completion_tokens or 0))
        return plain, tokens, max(1, made[0])

    def _reason(self, exc: BaseException, response_model: type[T]) -> str:
        # instructor wraps both API errors and exhausted validation retries in InstructorRetryException, with
        # the last underlying error as __cause__.
        attempts = None
        if isinstance(exc, InstructorRetryException):
            attempts = exc.n_attempts
            if exc.__cause__ is not None:
                exc = exc.__cause__
        if isinstance(exc, openai.OpenAIError):
            return describe_openai_error(exc, self._timeout)
        if isinstance(exc, IncompleteOutputException):
            return f"the output was cut off at max_tokens={self.max_tokens}; raise max_tokens or shorten the prompt"
        detail = f"{type(exc).__name__}: {_shorten(str(exc))}"
        if isinstance(exc, (PydanticValidationError, InstructorValidationError, ValueError)):
            tries = f" after {attempts} attempt(s)" if attempts else ""
            return f"the output did not fit {response_model.__name__}{tries}: {detail}"
        return detail


def _retry_hint(exc: BaseException) -> tuple[bool, float | None]:
    """Is the failure worth retrying, and after how long did the server ask us to wait?"""
    if isinstance(exc, InstructorRetryException) and exc.__cause__ is not None:
        exc = exc.__cause__
    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError)):
        return True, None
    if isinstance(exc, openai.APIStatusError):
        retry_after = None
        header = exc.response.headers.get("retry-after") if exc.response is not None else None
        if header:
            try:
                retry_after = float(header)
            except ValueError:
                retry_after = None
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500, retry_after
    if isinstance(exc, openai.OpenAIError):
        return False, None
    if isinstance(exc, IncompleteOutputException):
        return False, None
    # output that did not fit the schema: another sample may well fit
    return True, None


def _shorten(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _MAX_REASON_CHARS else text[: _MAX_REASON_CHARS - 3] + "..."


def _spent(exc: BaseException) -> tuple[int, int] | None:
    """The (prompt, completion) tokens the server reported for the answers of a call that failed on them (instructor
    sums its attempts' usage), or None when it sent none."""
    usage = getattr(exc, "total_usage", None) if isinstance(exc, InstructorRetryException) else None
    prompt_tokens = getattr(usage, "prompt_tokens", None)
    if not isinstance(prompt_tokens, int) or not prompt_tokens:
        return None
    completion_tokens = getattr(usage, "completion_tokens", None)
    return prompt_tokens, completion_tokens if isinstance(completion_tokens, int) else 0
