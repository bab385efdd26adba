"""Shared by the truth-maintenance tests: what a memory holds of its facts' ends, now or at a past transaction time."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest

from tkg import Memory, invalidation
from tkg.extraction import EpisodePlanner, GraphPlan, last_sayings
from tkg.models import Fact


def held(memory: Memory, known_at: datetime | None = None, group_id: str = "g") -> dict[str, tuple[Any, ...]]:
    """Every fact of the group (superseded ones too) with its end, what ended it and when that was learnt, the
    episodes that stated it and its attributes (the history tkg keeps there), as the memory holds it (or held it at
    ``known_at``)."""
    facts = memory.get_all(group_id, include_invalidated=True, known_at=known_at)
    return {f.id: (f.invalid_at, f.invalidated_by, f.expired_at, f.episodes, f.attributes) for f in facts}


def state(fact: Fact) -> tuple[Any, ...]:
    """What settling a fact's history may change of it."""
    return (fact.invalid_at, fact.invalidated_by, fact.prior_invalid_at, fact.expired_at, fact.attributes)


@contextmanager
def settling_last_checked() -> Iterator[list[str]]:
    """While open, every time the planner settles a new fact that comes last from the statements it contradicts
    alone (:meth:`EpisodePlanner._ended_by_last`), it also settles the whole component (:func:`invalidation.history`),
    and the two must change the same facts in the same way. Yields the ids of the facts settled so."""
    original = EpisodePlanner._ended_by_last
    taken: list[str] = []

    def checked(self: EpisodePlanner, new: Fact, plan: GraphPlan) -> dict[str, Fact] | None:
        fast = original(self, new, plan)
        if fast is not None:
            pool = self._component(new, plan)
            linked = list(pool.values())
            stated = self._stated(linked, plan)
            single = self.settings.ontology.single_valued
            whole = invalidation.history(linked, stated, single, self.now, said_last=last_sayings(linked, self._times))
            changed = {i: state(f) for i, f in whole.items() if f is not pool[i]}
            assert changed == {i: state(f) for i, f in fast.items()}, (new, changed, fast)
            taken.append(new.id)
        return fast

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(EpisodePlanner, "_ended_by_last", checked)
        yield taken
