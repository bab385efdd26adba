"""A deterministic LLM double shipped with the library, for users' own unit tests."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel
from pydantic import ValidationError as PydanticValidationError

from tkg.errors import LLMError
from tkg.llm.base import Prompt, T

Handler = Callable[[Prompt, type[BaseModel]], BaseModel | dict[str, Any]]


class ScriptedLLM:
    """Answers from a script: a queue of responses, or a handler ``(prompt, response_model) -> answer``.

    Answers may be model instances or plain dicts (validated against the requested model, as a real client's
    JSON would be). Every prompt it receives is kept in :attr:`calls`.

    >>> from tkg.llm import GraphExtraction
    >>> llm = ScriptedLLM([{"entities": [{"name": "Alice"}], "facts": []}])
    >>> llm.generate(Prompt("x", "", ""), GraphExtraction).entities[0].name
    'Alice'
    """

    def __init__(self, responses: Iterable[BaseModel | dict[str, Any]] = (), *, handler: Handler | None = None):
        self._queue: deque[BaseModel | dict[str, Any]] = deque(responses)
        self._handler = handler
        self.calls: list[Prompt] = []

    def push(self, *responses: BaseModel | dict[str, Any]) -> None:
        self._queue.extend(responses)

    def generate(self, prompt: Prompt, response_model: type[T]) -> T:
        self.calls.append(prompt)
        if self._queue:
            answer = self._queue.popleft()
        elif self._handler is not None:
            answer = self._handler(prompt, response_model)
        else:
            raise LLMError(f"ScriptedLLM has no scripted answer left for prompt {prompt.name!r}")
        if isinstance(answer, response_model):
            return answer
        if isinstance(answer, BaseModel):
            answer = answer.model_dump()
        try:
            return response_model.model_validate(answer)
        except PydanticValidationError as exc:
            raise LLMError(f"scripted answer does not fit {response_model.__name__}: {exc}", retryable=True) from None
