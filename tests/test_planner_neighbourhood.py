"""The planner's reads of a new fact's neighbourhood (tkg/extraction.py), on every backend: candidates read from the
store closest first, a batch at a time, must be those a read of the whole neighbourhood gives."""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np
import pytest

from tkg.drafts import Draft, DraftEntity, DraftFact
from tkg.extraction import EpisodePlanner, PlanSettings
from tkg.models import Entity, Episode, Fact
from tkg.storage import Store, WriteBatch

DIM = 8
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def toward(cosine: float, axis: int) -> np.ndarray:
    """A unit vector at ``cosine`` to the first axis, leaning on another."""
    vector = np.zeros(DIM, dtype=np.float32)
    vector[0], vector[axis] = cosine, math.sqrt(1 - cosine * cosine)
    return vector


def plan_candidates(store: Store, settings: PlanSettings) -> list[list[str]]:
    """The candidates the planner shows the LLM for "Ann likes paris" (sentence vector along the first axis)."""
    episode = Episode(id="ep", group_id="g", content="Ann likes Paris", source="text", reference_time=T0, created_at=T0)
    draft = Draft(
        entities=[DraftEntity("Ann"), DraftEntity("Paris")],
        facts=[DraftFact("Ann", "LIKES", "Paris", "Ann likes paris", datetime(2022, 1, 1, tzinfo=UTC), None)],
    )
    questions = EpisodePlanner(store, episode, T0, settings, {"Ann likes paris": toward(1.0, 1)}).questions(draft)
    return [[c.fact for c in item.candidates] for item in questions.facts]


@pytest.mark.parametrize("batch", [1, 2, 10**6])
def test_a_statement_met_through_one_restatement_is_read_whole(make_store: Callable[[int], Store], batch: int) -> None:
    """ "Ann likes rome" is the closest fact to the new one, so its statement is the closest (a statement is as close
    as its closest sentence still holding), but the restatement shown to the LLM is the statement's earliest, "ANN
    LIKES ROME", which is far. Read one fact at a time, a planner that took the statement's first restatement read
    for the whole would show "Ann likes rome"."""
    store = make_store(DIM)
    names = ["Ann", "Rome", "Oslo", "Lima", "Kiev", "Bern"]
    entities = [Entity(id=f"e{i}", group_id="g", name=n, created_at=T0) for i, n in enumerate(names)]
    rows = [  # (target, sentence, valid year, cosine to the new fact)
        ("e1", "Ann likes rome", 2021, 0.9),
        ("e2", "Ann likes oslo", 2021, 0.8),
        ("e3", "Ann likes lima", 2021, 0.6),
        ("e4", "Ann likes kiev", 2021, 0.58),
        ("e5", "Ann likes bern", 2021, 0.56),
        ("e1", "ANN LIKES ROME", 2020, 0.1),
    ]
    facts = [
        Fact(
            id=f"f{i}",
            group_id="g",
            source_id="e0",
            target_id=target,
            relation="LIKES",
            fact=sentence,
            created_at=T0,
            valid_at=datetime(year, 1, 1, tzinfo=UTC),
            embedding=toward(cosine, 1 + i % (DIM - 1)),
        )
        for i, (target, sentence, year, cosine) in enumerate(rows)
    ]
    store.write(WriteBatch(puts=[*entities, *facts]))
    settings = PlanSettings(max_fact_candidates=1, related_candidates=0, candidate_batch=batch)
    assert plan_candidates(store, settings) == [["ANN LIKES ROME"]]
    store.close()


@pytest.mark.parametrize("batch", [1, 2, 3, 10**6])
def test_a_statement_holding_only_through_a_fact_without_a_vector_stands_as_the_reads_find_it(
    make_store: Callable[[int], Store], batch: int
) -> None:
    """The store's closest-first reads return only facts with a sentence vector. "Ann likes kiev" holds only
    through a restatement without one ("ANN LIKES KIEV"), so it stands as superseded, scored by its other
    restatement: the two shown are the holding "rome" and the closest superseded, "oslo", whatever the batch (read
    two at a time, the planner showed "oslo" where a whole read showed "kiev")."""
    store = make_store(DIM)
    names = ["Ann", "Rome", "Oslo", "Lima", "Kiev"]
    entities = [Entity(id=f"e{i}", group_id="g", name=n, created_at=T0) for i, n in enumerate(names)]
    rows = [  # (target, sentence, cosine to the new fact (None: no vector), superseded)
        ("e1", "Ann likes rome", 0.5, False),
        ("e2", "Ann likes oslo", 0.9, True),
        ("e3", "Ann likes lima", 0.8, True),
        ("e4", "Ann likes kiev", 0.1, True),
        ("e4", "ANN LIKES KIEV", None, False),
    ]
    facts = [
        Fact(
            id=f"f{i}",
            group_id="g",
            source_id="e0",
            target_id=target,
            relation="LIKES",
            fact=sentence,
            created_at=T0,
            valid_at=datetime(2021, 1, 1, tzinfo=UTC),
            expired_at=T0 if superseded else None,
            embedding=None if cosine is None else toward(cosine, 1 + i % (DIM - 1)),
        )
        for i, (target, sentence, cosine, superseded) in enumerate(rows)
    ]
    store.write(WriteBatch(puts=[*entities, *facts]))
    settings = PlanSettings(max_fact_candidates=2, related_candidates=0, candidate_batch=batch)
    assert plan_candidates(store, settings) == [["Ann likes rome", "Ann likes oslo"]]
    store.close()
