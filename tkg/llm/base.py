"""The LLM protocol, the prompt value it takes, and usage accounting."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel

T = TypeVar("T", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Prompt:
    """A rendered prompt plus the structured inputs it was rendered from.

    Real clients send ``system`` and ``user``; test doubles may read ``inputs`` instead of parsing text.
    """

    name: str
    system: str
    user: str
    inputs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def chars(self) -> int:
        return len(self.system) + len(self.user)


@runtime_checkable
class LLMClient(Protocol):
    """Answers a prompt with an instance of ``response_model`` (or raises :class:`tkg.errors.LLMError`)."""

    def generate(self, prompt: Prompt, response_model: type[T]) -> T: ...


@dataclass(slots=True)
class LLMUsage:
    """What one operation cost in LLM terms."""

    calls: int = 0
    prompt_chars: int = 0
    by_prompt: dict[str, int] = field(default_factory=dict)

    def record(self, prompt: Prompt) -> None:
        self.calls += 1
        self.prompt_chars += prompt.chars
        self.by_prompt[prompt.name] = self.by_prompt.get(prompt.name, 0) + 1
