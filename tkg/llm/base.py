"""The LLM protocol, the prompt value it takes, and usage accounting."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

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
    """Answers a prompt with an instance of ``response_model`` (or raises :class:`tkg.errors.LLMError`).

    A client that knows the tokens a call really used implements :class:`UsageReportingLLM` as well; for the
    others, tokens are estimated from characters (:func:`estimate_tokens`).
    """

    def generate(self, prompt: Prompt, response_model: type[T]) -> T: ...


@runtime_checkable
class UsageReportingLLM(LLMClient, Protocol):
    """An :class:`LLMClient` that also reports the tokens each call used (as the server counted them; None when
    the server did not say). :class:`tkg.llm.guard.GuardedLLM` prefers this method when a client has it."""

    def generate_with_usage(self, prompt: Prompt, response_model: type[T]) -> tuple[T, Tokens | None]: ...


@runtime_checkable
class ReaskingLLM(UsageReportingLLM, Protocol):
    """A :class:`UsageReportingLLM` that asks again by itself when an answer does not fit its schema (the
    validation error goes back to the model: instructor's re-asks). Every request counts as one of the policy's
    attempts: :class:`tkg.llm.guard.GuardedLLM` says how many the call may make (``most_requests``, at least 1)
    and the client answers how many it made, or raises :class:`tkg.errors.LLMError` with ``requests`` set."""

    def generate_within(
        self, prompt: Prompt, response_model: type[T], most_requests: int
    ) -> tuple[T, Tokens | None, int]: ...


class Tokens(NamedTuple):
    """Tokens one call used. ``estimated``: counted as characters / 4, not reported by the server."""

    prompt: int
    completion: int
    estimated: bool = False


def estimate_tokens(prompt: Prompt, answer: BaseModel) -> Tokens:
    """A rough count (4 characters per token) for clients that do not report usage."""
    completion = len(json.dumps(answer.model_dump(mode="json"), ensure_ascii=False))
    return Tokens(prompt=-(-prompt.chars // 4), completion=-(-completion // 4), estimated=True)


@dataclass(slots=True)
class LLMUsage:
    """What one operation (or a whole memory, summed) cost in LLM terms."""

    calls: int = 0
    prompt_chars: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    #: Wall time spent waiting for the LLM (retries and back-off included), in seconds.
    seconds: float = 0.0
    #: Attempts beyond the first (rate limits, server errors, timeouts, malformed output).
    retries: int = 0
    failures: int = 0
    #: True when some token counts are estimates (the client reported none).
    estimated: bool = False
    by_prompt: dict[str, int] = field(default_factory=dict)

    def record(self, prompt: Prompt, tokens: Tokens | None = None, seconds: float = 0.0, retries: int = 0) -> None:
        self.calls += 1
        self.prompt_chars += prompt.chars
        self.by_prompt[prompt.name] = self.by_prompt.get(prompt.name, 0) + 1
        self.seconds += seconds
        self.retries += retries
        if tokens is not None:
            self.prompt_tokens += tokens.prompt
            self.completion_tokens += tokens.completion
            self.estimated = self.estimated or tokens.estimated

    def add(self, other: LLMUsage) -> None:
        """Add another usage into this one (totals)."""
        self.calls += other.calls
        self.prompt_chars += other.prompt_chars
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.seconds += other.seconds
        self.retries += other.retries
        self.failures += other.failures
        self.estimated = self.estimated or other.estimated
        for name, count in other.by_prompt.items():
            self.by_prompt[name] = self.by_prompt.get(name, 0) + count
