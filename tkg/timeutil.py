"""Timezone-aware UTC at every boundary: conversion and validation of timestamps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from tkg.errors import TimestampError

# Timestamps outside this window are almost always a unit mix-up (ms vs s) or a typo; reject them early.
EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, tzinfo=UTC)
#: The range, as error messages name it.
SUPPORTED_RANGE = f"{EARLIEST.date().isoformat()} to {LATEST.date().isoformat()}, in UTC"

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def to_utc(value: datetime | str, what: str = "timestamp") -> datetime:
    """Return ``value`` as an aware UTC datetime.

    Accepts an aware ``datetime`` or an ISO-8601 string with an offset (``Z`` allowed). Naive datetimes are
    rejected: tkg never guesses a timezone.
    """
    if isinstance(value, str):
        text = value.strip()
        try:
            parsed = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
        except ValueError as exc:
            raise TimestampError(f"{what} {value!r} is not an ISO-8601 timestamp: {exc}") from None
        value = parsed
    if not isinstance(value, datetime):
        raise TimestampError(f"{what} must be a timezone-aware datetime or ISO-8601 string, got {type(value).__name__}")
    if value.tzinfo is None or value.tzinfo.utcoffset(value) is None:
        raise TimestampError(
            f"{what} {value.isoformat()} is naive (no timezone); pass an aware datetime, e.g. datetime(..., tzinfo=UTC)"
        )
    try:
        result = value.astimezone(UTC)
    except OverflowError:
        raise TimestampError(f"{what} {value.isoformat()} is outside the supported range ({SUPPORTED_RANGE})") from None
    if not (EARLIEST <= result <= LATEST):
        raise TimestampError(f"{what} {result.isoformat()} is outside the supported range ({SUPPORTED_RANGE})")
    return result


def to_aware(value: datetime | str, what: str = "timestamp") -> datetime:
    """``value`` as an aware datetime in its own UTC offset (the speaker's clock), validated as :func:`to_utc`
    validates it; for calendar arithmetic on the speaker's day."""
    utc = to_utc(value, what)
    return utc.astimezone(timezone(timedelta(seconds=utc_offset(value, what))))


def utc_offset(value: datetime | str, what: str = "timestamp") -> int:
    """The UTC offset of an aware datetime or an ISO-8601 string, in whole seconds (0 for UTC); the value must be
    one :func:`to_utc` accepts."""
    to_utc(value, what)
    if isinstance(value, str):
        text = value.strip()
        value = datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    offset = value.utcoffset()
    return 0 if offset is None else int(offset.total_seconds())


def optional_utc(value: datetime | str | None, what: str = "timestamp") -> datetime | None:
    return None if value is None else to_utc(value, what)


def to_micros(value: datetime) -> int:
    """Microseconds since the Unix epoch (exact, no float rounding)."""
    delta = value - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(value: int) -> datetime:
    return _EPOCH + timedelta(microseconds=value)


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat().replace("+00:00", "Z")


def iso_offset(value: datetime | None) -> str | None:
    """``value.isoformat()`` with its offset written out (``+00:00`` for UTC), or None."""
    return None if value is None else value.isoformat()


def calendar_text(value: datetime, *, time_of_day: bool = True) -> str:
    """``2024-05-01 09:30`` (the seconds when there are any), or the day alone: the year always in four digits
    (glibc's ``%Y`` writes year 5 as ``5``)."""
    day = f"{value.year:04d}-{value:%m-%d}"
    if not time_of_day:
        return day
    return f"{day} {value:%H:%M}" + (f":{value.second:02d}" if value.second else "")
