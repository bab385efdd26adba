"""Shared by the truth-maintenance tests: what a memory holds of its facts' ends, now or at a past transaction time."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from tkg import Memory


def held(memory: Memory, known_at: datetime | None = None, group_id: str = "g") -> dict[str, tuple[Any, ...]]:
    """Every fact of the group (superseded ones too) with its end, what ended it and when that was learnt, the
    episodes that stated it and its attributes (the history tkg keeps there), as the memory holds it (or held it at
    ``known_at``)."""
    facts = memory.get_all(group_id, include_invalidated=True, known_at=known_at)
    return {f.id: (f.invalid_at, f.invalidated_by, f.expired_at, f.episodes, f.attributes) for f in facts}
