"""Retries, back-off, one shared concurrency limit and one requests-per-minute limit for every LLM call a memory
makes (not per call site), plus usage accounting.

>>> from tkg.llm import ScriptedLLM, GraphExtraction, Prompt
>>> guard = GuardedLLM(ScriptedLLM([{"entities": [], "facts": []}]), LLMPolicy(max_attempts=2))
>>> usage = LLMUsage()
>>> guard.call(Prompt("x", "", "hello"), GraphExtraction, usage).facts, usage.calls
([], 1)
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from tkg.config_fields import check_field_types
from tkg.errors import ConfigurationError, LLMError
from tkg.llm.base import LLMClient, LLMUsage, Prompt, ReaskingLLM, T, Tokens, UsageReportingLLM, estimate_tokens


@dataclass(frozen=True, slots=True)
class LLMPolicy:
    """How a memory calls its LLM.

    A retryable :class:`tkg.errors.LLMError` (rate limit, server error, timeout, output that does not fit the
    schema) is tried again up to ``max_attempts`` requests in all (a client's own re-asks among them: see
    :class:`tkg.llm.ReaskingLLM`), waiting ``backoff_initial * 2**n`` seconds (capped at
    ``backoff_max``, at least the server's ``Retry-After``, with up to ``jitter`` of it added at random).
    ``max_concurrency`` calls run at once and at most ``requests_per_minute`` start per minute (None: no limit),
    across every thread of the memory.
    """

    max_attempts: int = 4
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    jitter: float = 0.1
    max_concurrency: int = 8
    requests_per_minute: float | None = None

    def __post_init__(self) -> None:
        check_field_types(self)
        if self.max_attempts < 1 or self.max_concurrency < 1:
            raise ConfigurationError("LLMPolicy.max_attempts and max_concurrency must be at least 1")
        if self.backoff_initial < 0 or self.backoff_max < 0 or not 0 <= self.jitter <= 1:
            raise ConfigurationError("LLMPolicy back-off times must be >= 0 and jitter within [0, 1]")
        if self.requests_per_minute is not None and self.requests_per_minute <= 0:
            raise ConfigurationError("LLMPolicy.requests_per_minute must be positive (or None)")


class GuardedLLM:
    """Wraps an :class:`~tkg.llm.base.LLMClient` with an :class:`LLMPolicy`. Thread-safe.

    ``sleep`` and ``monotonic`` are seams for tests (default: :func:`time.sleep`, :func:`time.monotonic`).
    """

    def __init__(
        self,
        client: LLMClient,
        policy: LLMPolicy | None = None,
        *,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        seed: int = 0,
    ) -> None:
        self.client = client
        # what the client can do, decided once (a runtime Protocol check walks its methods: ~20 us a call)
        self._reasks = isinstance(client, ReaskingLLM)
        self._reports = isinstance(client, UsageReportingLLM)
        self.policy = policy or LLMPolicy()
        self._sleep = sleep
        self._monotonic = monotonic
        self._slots = threading.BoundedSemaphore(self.policy.max_concurrency)
        self._lock = threading.Lock()
        self._next_start = 0.0
        self._random = random.Random(seed)

    def call(self, prompt: Prompt, response_model: type[T], usage: LLMUsage) -> T:
        """One logical call (with its retries); its cost is added to ``usage``. Raises :class:`LLMError` once
        retries are exhausted or the error is not retryable."""
        started = self._monotonic()
        attempt = 0
        requests = 0  # every request counts against max_attempts, a client's own re-asks too (ReaskingLLM)
        spent: Tokens | None = None  # the tokens of answers that could not be used: billed all the same
        while True:
            attempt += 1
            self._wait_for_rate()
            try:
                with self._slots:
                    answer, tokens, made = self._generate(prompt, response_model, self.policy.max_attempts - requests)
            except LLMError as exc:
                requests += max(1, exc.requests)
                if exc.spent is not None:
                    spent = _plus(spent, Tokens(*exc.spent))
                if not exc.retryable or requests >= self.policy.max_attempts:
                    usage.failures += 1
                    usage.record(prompt, spent, self._monotonic() - started, requests - 1)
                    if requests > 1:
                        raise LLMError(
                            f"{exc} (gave up after {requests} attempts)",
                            retryable=exc.retryable,
                            spent=None if spent is None else (spent.prompt, spent.completion),
                            requests=requests,
                        ) from exc
                    raise
                self._sleep(self._delay(attempt, exc.retry_after))
                continue
            requests += made
            usage.record(prompt, _plus(spent, tokens), self._monotonic() - started, requests - 1)
            return answer

    def _generate(self, prompt: Prompt, response_model: type[T], most_requests: int) -> tuple[T, Tokens, int]:
        """The answer, its tokens and the requests made for it (at most ``most_requests``)."""
        client = self.client
        made = 1
        try:
            if self._reasks:
                reasking = cast(ReaskingLLM, client)
                answer, tokens, made = reasking.generate_within(prompt, response_model, max(1, most_requests))
            elif self._reports:
                answer, tokens = cast(UsageReportingLLM, client).generate_with_usage(prompt, response_model)
            else:
                answer = self.client.generate(prompt, response_model)
                tokens = None
        except LLMError:
            raise
        except Exception as exc:  # a user's client raising its own error type: report it as tkg's
            raise LLMError(f"LLM client raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(answer, response_model):
            raise LLMError(
                f"LLM client returned {type(answer).__name__}, not {response_model.__name__}",
                retryable=True,
                requests=made,
            )
        return answer, tokens if tokens is not None else estimate_tokens(prompt, answer), max(1, made)

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        base = min(self.policy.backoff_max, self.policy.backoff_initial * 2 ** (attempt - 1))
        base = max(base, min(retry_after or 0.0, self.policy.backoff_max))
        with self._lock:
            return base * (1 + self.policy.jitter * self._random.random())

    def _wait_for_rate(self) -> None:
        rpm = self.policy.requests_per_minute
        if rpm is None:
            return
        interval = 60.0 / rpm
        with self._lock:
            now = self._monotonic()
            start = max(now, self._next_start)
            self._next_start = start + interval
        if start > now:
            self._sleep(start - now)


def _plus(a: Tokens | None, b: Tokens) -> Tokens:
    """Two calls' tokens together (estimated if either was)."""
    if a is None:
        return b
    return Tokens(a.prompt + b.prompt, a.completion + b.completion, a.estimated or b.estimated)
