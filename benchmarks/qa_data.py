"""The question-answering benchmarks as one shape: histories (the conversations a memory ingests) and questions
(each about one history, with its date, gold answer and type).

* LongMemEval (``longmemeval``: the S variant, about 48 sessions per question; ``longmemeval-oracle``: only the
  evidence sessions): every question has its own history. Abstention questions (``_abs`` ids) are graded as the
  benchmark says: the right answer is to say the information is not there.
* LoCoMo (``locomo``): ten conversations, each with its questions; categories 1-4 by default (multi-hop,
  temporal, open-domain, single-hop), as the Mem0 paper evaluates; category 5 (adversarial) on request, graded
  against its ``adversarial_answer`` as an abstention. LoCoMo questions carry no date: they are asked a day after
  the conversation's last session.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import shared_data

__all__ = ["DATASETS", "History", "Question", "Turn", "load"]

DATASETS = ("longmemeval", "longmemeval-oracle", "locomo")
LONGMEMEVAL_ORACLE = Path("longmemeval") / "longmemeval_oracle_dev100.json"
LOCOMO_CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
#: Turns of one session are this far apart (the sessions carry one date each).
TURN_SPACING = timedelta(seconds=30)


@dataclass(frozen=True, slots=True)
class Turn:
    """One message of a history: a stable id (its episode id), the speaker, the text and when it was said."""

    id: str
    speaker: str
    text: str
    when: datetime

    @property
    def line(self) -> str:
        return f"[{self.when:%Y-%m-%d %H:%M}] {self.speaker}: {self.text}"


@dataclass(frozen=True, slots=True)
class History:
    id: str
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class Question:
    id: str
    history: str
    kind: str
    question: str
    answer: str
    asked_at: datetime
    abstention: bool


def load(
    dataset: str, root: Path, limit: int | None, categories: frozenset[int] = frozenset({1, 2, 3, 4})
) -> tuple[list[History], list[Question]]:
    """The histories and questions of ``dataset`` in the data folder ``root``; ``limit``: the first questions
    only (LongMemEval) or the first conversations (LoCoMo), with the histories they need."""
    if dataset == "locomo":
        return _locomo(root / shared_data.LOCOMO, limit, categories)
    path = root / (shared_data.LONGMEMEVAL if dataset == "longmemeval" else LONGMEMEVAL_ORACLE)
    return _longmemeval(path, limit)


# ----------------------------------------------------------------------------------------------------------
# LongMemEval


def _longmemeval_time(text: str) -> datetime:
    """``2023/05/30 (Tue) 12:18`` as UTC (the dataset gives no zone)."""
    return datetime.strptime(text.split(" (")[0] + " " + text.rsplit(" ", 1)[1], "%Y/%m/%d %H:%M").replace(tzinfo=UTC)


def _read_json(path: Path) -> Any:
    if path.suffix == ".gz":
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            return json.load(handle)
    return json.loads(path.read_text(encoding="utf-8"))


def _longmemeval(path: Path, limit: int | None) -> tuple[list[History], list[Question]]:
    records = _read_json(path)
    # spread over the question types: the file is sorted by type, so the first N would all be of one
    records = sorted(records, key=lambda r: (_rank_within_type(records, r), r["question_type"]))
    if limit is not None:
        records = records[:limit]
    histories, questions = [], []
    for record in records:
        qid = str(record["question_id"])
        turns = []
        sessions = zip(
            record["haystack_session_ids"], record["haystack_dates"], record["haystack_sessions"], strict=True
        )
        for session_id, date, session in sessions:
            start = _longmemeval_time(date)
            for j, turn in enumerate(session):
                text = " ".join(str(turn.get("content", "")).split())
                if text:
                    speaker = "User" if turn["role"] == "user" else "Assistant"
                    turns.append(Turn(f"{qid}.{session_id}.{j}", speaker, text, start + TURN_SPACING * j))
        turns.sort(key=lambda t: t.when)
        histories.append(History(qid, tuple(turns)))
        questions.append(
            Question(
                id=qid,
                history=qid,
                kind=str(record["question_type"]),
                question=str(record["question"]),
                answer=str(record["answer"]),
                asked_at=_longmemeval_time(record["question_date"]),
                abstention=qid.endswith("_abs"),
            )
        )
    return histories, questions


def _rank_within_type(records: list[dict[str, Any]], record: dict[str, Any]) -> int:
    same = [r["question_id"] for r in records if r["question_type"] == record["question_type"]]
    return same.index(record["question_id"])


# ----------------------------------------------------------------------------------------------------------
# LoCoMo


def _locomo(path: Path, limit: int | None, categories: frozenset[int]) -> tuple[list[History], list[Question]]:
    records = _read_json(path)
    if limit is not None:
        records = records[:limit]
    histories, questions = [], []
    for record in records:
        sample = str(record["sample_id"])
        turns = [
            Turn(_turn_id(sample, turn["dia_id"]), turn["speaker"], _text(turn), when + TURN_SPACING * j)
            for _, when, session in shared_data.locomo_sessions(record)
            for j, turn in enumerate(session)
        ]
        histories.append(History(sample, tuple(turns)))
        asked = max(t.when for t in turns).replace(hour=0, minute=0, second=0) + timedelta(days=1)
        for n, qa in enumerate(record["qa"]):
            category = int(qa.get("category", 0))
            if category not in categories:
                continue
            adversarial = category == 5
            answer = qa.get("adversarial_answer") if adversarial else qa.get("answer")
            questions.append(
                Question(
                    id=f"{sample}#{n}",
                    history=sample,
                    kind=LOCOMO_CATEGORIES.get(category, str(category)),
                    question=str(qa["question"]),
                    answer=str(answer),
                    asked_at=asked,
                    abstention=adversarial,
                )
            )
    return histories, questions


def _turn_id(sample: str, dia_id: str) -> str:
    return f"{sample}.{dia_id}".replace(":", ".")


def _text(turn: dict[str, Any]) -> str:
    """The turn's text with a shared image as its caption (``turn_line`` without the speaker)."""
    return shared_data.turn_line(turn).split(": ", 1)[1]
