"""The clock seam: where tkg reads "now" (transaction time), with a fixed clock for tests."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Protocol, runtime_checkable

from tkg.timeutil import to_utc


@runtime_checkable
class Clock(Protocol):
    def now(self) -> datetime:
        """The current time, aware UTC."""
        ...


class SystemClock:
    """The wall clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)


class FixedClock:
    """A clock that says what it is told, for deterministic tests.

    >>> clock = FixedClock("2024-01-01T00:00:00Z")
    >>> clock.advance(hours=1).isoformat()
    '2024-01-01T01:00:00+00:00'
    """

    def __init__(self, start: datetime | str = "2024-01-01T00:00:00Z", *, tick: timedelta | None = None) -> None:
        self._now = to_utc(start, "start")
        self._tick = tick

    def now(self) -> datetime:
        current = self._now
        if self._tick is not None:
            self._now = current + self._tick
        return current

    def set(self, value: datetime | str) -> None:
        self._now = to_utc(value, "value")

    def advance(self, **delta: float) -> datetime:
        self._now = self._now + timedelta(**delta)
        return self._now
