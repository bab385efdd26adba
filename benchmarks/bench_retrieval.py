#!/usr/bin/env python
"""Retrieval benchmark on real multi-session conversations: LongMemEval_S and LoCoMo dev splits.

tkg against plain BM25 (bm25s), plain dense (all-MiniLM-L6-v2 int8 ONNX) and their RRF hybrid, in the same run,
under the protocol of ``shared/research/retrieval_baselines.md``:

* every question's history is ingested into a fresh :class:`tkg.Memory` as message episodes
  (``"Speaker: text"``, ``source="message"``, the session's timestamp, no LLM: each speaker becomes an entity);
* the question is asked with its own date (the reference for relative time phrases);
* turns, sessions (ranked by their best turn) and whole-session documents are scored with recall_any@k,
  recall_all@k, recall_frac@k and NDCG@k (the official LongMemEval DCG) at k = 5 and 10, overall and by type.

Embeddings are cached on disk (``benchmarks/out/emb_cache/``, keyed by model, max length and text), so each
distinct text is embedded once, ever. Data files are read from ``shared/data`` and never copied.

    python benchmarks/bench_retrieval.py --quick     # 1 LoCoMo conversation, 6 LongMemEval questions
    python benchmarks/bench_retrieval.py             # both dev splits in full (first run embeds ~50k texts)
    python benchmarks/bench_retrieval.py --latency   # also: hybrid search p50/p95 over 100k facts
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import hashlib
import json
import math
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import shared_data
import turn_ranking  # benchmarks/ is the script's own folder, first on sys.path
from measure import percentile

ROOT = Path(__file__).resolve().parent
OUT_DIR = ROOT / "out"
KS = (5, 10)
LEVELS = ("turn", "session", "session_doc")

# ----------------------------------------------------------------------------------------------------------
# data


@dataclass(slots=True)
class Turn:
    id: str
    session: str
    speaker: str
    text: str  # the text every system indexes (LoCoMo: "Speaker: text"; LongMemEval: the user's content)
    time: datetime | None  # None: the variant without timestamps (tkg then stamps the turn when it is added)


@dataclass(slots=True)
class Question:
    id: str
    group: str  # question type (LongMemEval) or "catN name" (LoCoMo)
    query: str
    date: datetime | None  # None: asked without a date (tkg's clock gives "now")
    turns: list[Turn]  # the haystack, in conversation order
    relevant_turns: set[str]
    relevant_sessions: set[str]
    history: str  # which haystack the question is asked against (questions of one LoCoMo conversation share it)


@dataclass(slots=True)
class Dataset:
    name: str
    questions: list[Question]
    excluded: str
    variant: str = "as-is"

    @property
    def label(self) -> str:
        return self.name if self.variant == "as-is" else f"{self.name} [{self.variant}]"


# ----------------------------------------------------------------------------------------------------------
# robustness variants: the same questions over histories that say less


#: What each variant removes from the histories (issue 19: no signal may lower recall in these settings).
VARIANTS = {
    "as-is": "the data as published",
    "one-speaker": "only one speaker's turns are indexed (LoCoMo: the first speaker of each conversation; "
    "questions keep the evidence that speaker said, and those left with none are dropped)",
    "no-names": "turns carry no speaker name (LoCoMo's 'Speaker: ' prefix removed; tkg ingests the bare text)",
    "no-dates": "turns and questions carry no timestamp (tkg stamps each turn when it is added, and asks 'now')",
}


def vary(ds: Dataset, variant: str) -> Dataset | None:
    """``ds`` with what ``variant`` removes removed; None when it changes nothing (LongMemEval already indexes
    one speaker)."""
    if variant == "as-is":
        return ds
    if variant == "one-speaker" and ds.name != "LoCoMo":
        return None
    histories: dict[str, list[Turn]] = {}
    questions: list[Question] = []
    dropped = 0
    for q in ds.questions:
        if q.history not in histories:
            histories[q.history] = _vary_turns(q.turns, variant)
        turns = histories[q.history]
        kept = {t.id for t in turns}
        relevant = q.relevant_turns & kept
        if not relevant:
            dropped += 1
            continue
        by_id = {t.id: t for t in turns}
        questions.append(
            Question(
                id=q.id,
                group=q.group,
                query=q.query,
                date=None if variant == "no-dates" else q.date,
                turns=turns,
                relevant_turns=relevant,
                relevant_sessions={by_id[t].session for t in relevant},
                history=q.history,
            )
        )
    excluded = ds.excluded + (f", {dropped} with no evidence left in the variant" if dropped else "")
    return Dataset(ds.name, questions, excluded, variant)


def _vary_turns(turns: Sequence[Turn], variant: str) -> list[Turn]:
    if variant == "one-speaker":
        first = turns[0].speaker if turns else ""
        return [t for t in turns if t.speaker == first]
    if variant == "no-names":
        out = []
        for t in turns:
            prefix = f"{t.speaker}: "
            text = t.text[len(prefix) :] if t.text.startswith(prefix) else t.text
            out.append(Turn(t.id, t.session, "", text, t.time))
        return out
    if variant == "no-dates":
        return [Turn(t.id, t.session, t.speaker, t.text, None) for t in turns]
    raise ValueError(f"unknown variant {variant!r}")


def data_dir(explicit: str | None) -> Path:
    found = shared_data.data_dir(explicit)
    if found is None:
        sys.exit(shared_data.missing_message("the data sets"))
    return found


def load_longmemeval(root: Path, limit: int | None) -> Dataset:
    with gzip.open(root / shared_data.LONGMEMEVAL, "rt") as fh:
        records = json.load(fh)
    questions: list[Question] = []
    skipped_abs = skipped_noevidence = 0
    for record in records:
        if record["question_id"].endswith("_abs"):
            skipped_abs += 1
            continue
        turns: list[Turn] = []
        relevant: set[str] = set()
        seen: set[str] = set()
        for sid, date, session in zip(
            record["haystack_session_ids"], record["haystack_dates"], record["haystack_sessions"], strict=True
        ):
            if sid in seen:  # three distractor sessions appear twice with identical content: drop the copy
                continue
            seen.add(sid)
            when = datetime.strptime(date, "%Y/%m/%d (%a) %H:%M").replace(tzinfo=UTC)
            for j, turn in enumerate(session):
                if turn["role"] != "user":  # the official protocol indexes user turns only
                    continue
                tid = f"{sid}_{j + 1}"
                turns.append(Turn(tid, sid, "user", turn["content"], when))
                if turn.get("has_answer"):
                    relevant.add(tid)
        if not relevant:
            skipped_noevidence += 1
            continue
        by_id = {t.id: t for t in turns}
        questions.append(
            Question(
                id=record["question_id"],
                group=record["question_type"],
                query=record["question"],
                date=datetime.strptime(record["question_date"], "%Y/%m/%d (%a) %H:%M").replace(tzinfo=UTC),
                turns=turns,
                relevant_turns=relevant,
                relevant_sessions={by_id[t].session for t in relevant},
                history=record["question_id"],
            )
        )
    if limit is not None:
        questions = _spread(questions, limit)
    excluded = f"{skipped_abs} abstention (_abs), {skipped_noevidence} no user-side evidence turn"
    return Dataset("LongMemEval_S", questions, excluded)


_LOCOMO_CATEGORY = {1: "cat1 multi-hop", 2: "cat2 temporal", 3: "cat3 open-domain", 4: "cat4 single-hop"}


def _evidence_ids(entries: Iterable[str], known: set[str]) -> set[str]:
    found: set[str] = set()
    for entry in entries:
        for part in re.split(r"[;\s]+", str(entry)):
            m = re.match(r"^D:?(\d+):0*(\d+)$", part.strip())
            if m:
                tid = f"D{int(m.group(1))}:{int(m.group(2))}"
                if tid in known:
                    found.add(tid)
    return found


def load_locomo(root: Path, limit: int | None) -> Dataset:
    records = json.loads((root / shared_data.LOCOMO).read_text())
    if limit is not None:
        records = records[: max(1, limit)]
    questions: list[Question] = []
    skipped_cat5 = skipped_empty = 0
    for record in records:
        turns: list[Turn] = []
        last = datetime.min.replace(tzinfo=UTC)
        for n, when, session in shared_data.locomo_sessions(record):
            last = max(last, when)
            turns.extend(
                Turn(turn["dia_id"], f"D{n}", turn["speaker"], shared_data.turn_line(turn), when) for turn in session
            )
        known = {t.id for t in turns}
        for i, qa in enumerate(record["qa"]):
            if qa.get("category") not in _LOCOMO_CATEGORY:
                skipped_cat5 += 1
                continue
            relevant = _evidence_ids(qa.get("evidence", []), known)
            if not relevant:
                skipped_empty += 1
                continue
            questions.append(
                Question(
                    id=f"{record['sample_id']}#{i}",
                    group=_LOCOMO_CATEGORY[qa["category"]],
                    query=qa["question"],
                    # LoCoMo questions carry no date: they are asked a day after the last session.
                    date=last + timedelta(days=1),
                    turns=turns,
                    relevant_turns=relevant,
                    relevant_sessions={t.split(":")[0] for t in relevant},
                    history=record["sample_id"],
                )
            )
    excluded = f"{skipped_empty} no valid evidence id, {skipped_cat5} category 5 (adversarial)"
    return Dataset("LoCoMo", questions, excluded)


def _spread(questions: list[Question], limit: int) -> list[Question]:
    """``limit`` questions spread over the types (the file is sorted by type)."""
    if limit >= len(questions):
        return questions
    step = len(questions) / limit
    return [questions[int(i * step)] for i in range(limit)]


def session_docs(turns: Sequence[Turn], sep: str) -> tuple[list[str], list[str]]:
    order: list[str] = []
    texts: dict[str, list[str]] = {}
    for turn in turns:
        if turn.session not in texts:
            order.append(turn.session)
            texts[turn.session] = []
        texts[turn.session].append(turn.text)
    return order, [sep.join(texts[s]) for s in order]


# ----------------------------------------------------------------------------------------------------------
# embeddings, cached on disk


class EmbeddingCache:
    """Vectors by text, persisted as one ``.npy`` matrix plus its keys (sha1 of model key and text)."""

    def __init__(self, path: Path, model: Callable[[], Any], model_key: str) -> None:
        self.path, self._model_factory, self.model_key = path, model, model_key
        self._model: Any = None
        self._vectors: dict[str, npt.NDArray[np.float32]] = {}
        self.computed = 0
        self.seconds = 0.0
        keys_file, matrix_file = path / "keys.json", path / "vectors.npy"
        if keys_file.exists() and matrix_file.exists():
            keys = json.loads(keys_file.read_text())
            matrix = np.load(matrix_file)
            if len(keys) == len(matrix):
                self._vectors = dict(zip(keys, matrix, strict=True))
        self.cached_at_start = len(self._vectors)
        self._dirty = False

    def _key(self, text: str) -> str:
        return hashlib.sha1(f"{self.model_key}\x00{text}".encode()).hexdigest()

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        keys = [self._key(t) for t in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in self._vectors))
        if missing:
            if self._model is None:
                self._model = self._model_factory()
            by_key = dict(zip(keys, texts, strict=True))
            start = time.perf_counter()
            vectors = self._model.embed([by_key[k] for k in missing])
            self.seconds += time.perf_counter() - start
            self.computed += len(missing)
            self._vectors.update(zip(missing, np.asarray(vectors, dtype=np.float32), strict=True))
            self._dirty = True
        return np.stack([self._vectors[k] for k in keys]) if keys else np.zeros((0, 384), dtype=np.float32)

    def save(self) -> None:
        if not self._dirty:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        keys = list(self._vectors)
        tmp = self.path / "vectors.tmp.npy"
        np.save(tmp, np.stack([self._vectors[k] for k in keys]))
        tmp.replace(self.path / "vectors.npy")
        (self.path / "keys.json").write_text(json.dumps(keys))
        self._dirty = False


class CachedEmbedder:
    """The tkg Embedder seam over the cache, so tkg's ingestion reuses the vectors the baselines computed."""

    def __init__(self, cache: EmbeddingCache, name: str) -> None:
        self._cache, self._name = cache, name
        self.calls = 0
        self.seconds = 0.0

    @property
    def dim(self) -> int:
        return 384

    @property
    def name(self) -> str:
        return self._name

    def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        start = time.perf_counter()
        out = self._cache.embed(texts)
        self.calls += 1
        self.seconds += time.perf_counter() - start
        return out


def episode_text(turn: Turn, dataset: str) -> str:
    """What tkg ingests: a message episode ``"Speaker: text"`` (LoCoMo's turn text already is one), or the bare
    text when the variant names no speaker."""
    return turn.text if dataset == "LoCoMo" or not turn.speaker else f"{turn.speaker}: {turn.text}"


def corpus_texts(ds: Dataset) -> list[str]:
    """Every text any system of the run embeds, distinct, in a stable order (for one batched pre-embedding)."""
    texts: dict[str, None] = {}
    done: set[str] = set()
    for q in ds.questions:
        texts[q.query] = None
        if q.history in done:
            continue
        done.add(q.history)
        for t in q.turns:
            texts[t.text] = None
            texts[episode_text(t, ds.name)] = None
            if t.speaker:
                texts[t.speaker] = None
        texts.update(dict.fromkeys(session_docs(q.turns, _DOC_SEP[ds.name])[1]))
    return list(texts)


_DOC_SEP = {"LongMemEval_S": " ", "LoCoMo": "\n"}


def minilm_factory(threads: int) -> Callable[[], Any]:
    def make() -> Any:
        from tkg.embedders.onnx import MiniLMEmbedder

        return MiniLMEmbedder(threads=threads, max_tokens=256)

    return make


# ----------------------------------------------------------------------------------------------------------
# metrics (retrieval_baselines.md "Metrics")


def dcg(ranked: Sequence[str], relevant: set[str], k: int) -> float:
    # The official LongMemEval DCG: rel_1 + sum_{p=2..k} rel_p / log2(p) (ranks 1 and 2 undiscounted).
    return sum(
        (1.0 if p == 1 else 1.0 / math.log2(p)) for p, item in enumerate(ranked[:k], start=1) if item in relevant
    )


def scores_at(ranked: Sequence[str], relevant: set[str], k: int) -> dict[str, float]:
    top = set(ranked[:k])
    hit = len(top & relevant)
    ideal = dcg([f"\x00{i}" for i in range(min(k, len(relevant)))], {f"\x00{i}" for i in range(len(relevant))}, k)
    return {
        f"recall_any@{k}": float(hit > 0),
        f"recall_all@{k}": float(hit == len(relevant)),
        f"recall_frac@{k}": hit / len(relevant),
        f"ndcg@{k}": dcg(ranked, relevant, k) / ideal if ideal else 0.0,
    }


def sessions_by_best_turn(turns: Sequence[str], session_of: dict[str, str]) -> list[str]:
    return list(dict.fromkeys(session_of[t] for t in turns))


METRIC_ORDER = [f"{m}@{k}" for k in KS for m in ("recall_any", "recall_all", "recall_frac", "ndcg")]


# ----------------------------------------------------------------------------------------------------------
# systems: each ranks the turns (and session documents) of one history for a question


@dataclass(slots=True)
class Ranking:
    turns: list[str]
    session_docs: list[str]
    seconds: float


class Baselines:
    """bm25 (bm25s, Snowball stemming, English stop words), dense (MiniLM cosine) and their RRF hybrid (k = 60),
    over the turns and over the session documents of one history."""

    def __init__(self, turns: Sequence[Turn], dataset: str, cache: EmbeddingCache) -> None:
        self.turn_ids = [t.id for t in turns]
        self.session_ids, docs = session_docs(turns, _DOC_SEP[dataset])
        self._turn_index = turn_ranking.bm25_index([t.text for t in turns])
        self._doc_index = turn_ranking.bm25_index(docs)
        self._turn_vectors = cache.embed([t.text for t in turns])
        self._doc_vectors = cache.embed(docs)
        self._cache = cache

    _bm25_rank = staticmethod(turn_ranking.bm25_rank)
    _dense_rank = staticmethod(turn_ranking.dense_rank)
    _rrf = staticmethod(turn_ranking.rrf)

    def rank(self, query: str) -> dict[str, Ranking]:
        out: dict[str, Ranking] = {}
        start = time.perf_counter()
        bm25_turns = self._bm25_rank(self._turn_index, self.turn_ids, query)
        t_bm25 = time.perf_counter() - start
        bm25_docs = self._bm25_rank(self._doc_index, self.session_ids, query)
        start = time.perf_counter()
        qvec = self._cache.embed([query])[0]
        dense_turns = self._dense_rank(self._turn_vectors, self.turn_ids, qvec)
        t_dense = time.perf_counter() - start
        dense_docs = self._dense_rank(self._doc_vectors, self.session_ids, qvec)
        out["bm25"] = Ranking(bm25_turns, bm25_docs, t_bm25)
        out["dense"] = Ranking(dense_turns, dense_docs, t_dense)
        start = time.perf_counter()
        hybrid_turns = self._rrf(bm25_turns, dense_turns)
        out["hybrid"] = Ranking(
            hybrid_turns, self._rrf(bm25_docs, dense_docs), t_bm25 + t_dense + time.perf_counter() - start
        )
        return out


_SAFE_ID = re.compile(r"^[A-Za-z0-9_.:\-]{1,128}$")


class TkgSystem:
    """One :class:`tkg.Memory` per history: every turn a message episode (no LLM), asked through ``search``."""

    def __init__(self, turns: Sequence[Turn], dataset: str, cache: EmbeddingCache, config: Any, group: str) -> None:
        from tkg import FixedClock, Memory
        from tkg.backends.memory import InMemoryStore

        self.group = re.sub(r"[^A-Za-z0-9_.:\-]", "_", group)[:100] or "g"
        self.embedder = CachedEmbedder(cache, "all-MiniLM-L6-v2-int8")
        self.store = InMemoryStore(dim=self.embedder.dim)
        self.memory = Memory(
            self.store, embedder=self.embedder, clock=FixedClock("2030-01-01T00:00:00Z", tick=timedelta(0, 0, 1))
        )
        self.config = config
        self.turn_of: dict[str, str] = {}
        self.session_of = {t.id: t.session for t in turns}
        start = time.perf_counter()
        for i, turn in enumerate(turns):
            if not episode_text(turn, dataset).strip():
                continue  # an empty turn (LongMemEval has a few) without its speaker's name: nothing to remember
            episode_id = turn.id if _SAFE_ID.match(turn.id) else f"t{i}"
            self.turn_of[episode_id] = turn.id
            self.memory.add_episode(
                episode_text(turn, dataset),
                source="message",
                reference_time=turn.time,
                group_id=self.group,
                episode_id=episode_id,
            )
        self.store.flush()  # fold the fresh tails into the bulk indexes, as a long-running memory would have
        self.ingest_seconds = time.perf_counter() - start

    def rank(self, question: Question) -> Ranking:
        start = time.perf_counter()
        results = self.memory.search(
            question.query, group_ids=[self.group], config=self.config, reference_time=question.date
        )
        seconds = time.perf_counter() - start
        turns = [self.turn_of[s.record.id] for s in results.episodes]
        # Whole sessions ranked by the sum of their three best turn scores.
        per_session: dict[str, list[float]] = {}
        for scored in results.episodes:
            per_session.setdefault(self.session_of[self.turn_of[scored.record.id]], []).append(scored.score)
        docs = sorted(per_session, key=lambda s: -sum(sorted(per_session[s], reverse=True)[:3]))
        return Ranking(turns, docs, seconds)


# ----------------------------------------------------------------------------------------------------------
# the run


#: Ablations of the episode_context reranker: each turns signals off (EpisodeContext fields).
ABLATIONS: dict[str, dict[str, Any]] = {
    "tkg -session": {"session_weight": 0.0},
    "tkg -neighbours": {"neighbours": 0},
    "tkg -entity": {"entity_weight": 0.0},
    "tkg -time": {"time_weight": 0.0},
    "tkg text-only": {"session_weight": 0.0, "neighbours": 0, "entity_weight": 0.0, "time_weight": 0.0},
}
#: Mechanisms that are off by default, each measured on top of tkg's defaults (EpisodeContext fields).
EXTENSIONS: dict[str, dict[str, Any]] = {
    "tkg +session-doc": {"session_document": True},
    "tkg +prf": {"expansion_terms": 5},
    "tkg +session-decay": {"session_decay": 0.05},
}


def tkg_configs(args: argparse.Namespace) -> dict[str, Any]:
    from tkg.search_config import EpisodeContext, Reranker, SearchConfig, TargetConfig

    depth = TargetConfig(limit=100, candidate_factor=2)
    context = EpisodeContext(
        bm25_weight=args.bm25_weight,
        cosine_weight=args.cosine_weight,
        session_weight=args.session_weight,
        neighbours=args.neighbours,
        neighbour_weight=args.neighbour_weight,
        entity_weight=args.entity_weight,
        time_weight=args.time_weight,
        session_document=args.session_document,
    )

    def reranked(ctx: EpisodeContext) -> SearchConfig:
        return SearchConfig(
            episodes=TargetConfig(limit=100, candidate_factor=2, reranker=Reranker.EPISODE_CONTEXT, context=ctx)
        )

    configs = {"tkg-rrf": SearchConfig(episodes=depth), "tkg": reranked(context)}
    if args.ablations:
        for name, values in {**ABLATIONS, **EXTENSIONS}.items():
            configs[name] = reranked(dataclasses.replace(context, **values))
    return configs


@dataclass(slots=True)
class Collected:
    rows: dict[tuple[str, str, str], list[dict[str, float]]] = field(default_factory=dict)  # (system, level, group)
    #: The history each row's question is asked against (the unit the confidence intervals resample).
    histories: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    seconds: dict[str, list[float]] = field(default_factory=dict)
    build: dict[str, float] = field(default_factory=dict)

    def add(self, system: str, level: str, group: str, history: str, values: dict[str, float]) -> None:
        for g in ("overall", group):
            self.rows.setdefault((system, level, g), []).append(values)
            self.histories.setdefault((system, level, g), []).append(history)

    def interval(self, key: tuple[str, str, str], metric: str, minus: str | None = None) -> tuple[float, float]:
        """95% bootstrap interval of the mean of ``metric`` over ``key``'s questions (of its difference with
        system ``minus`` on the same questions, when given)."""
        values = np.array([r[metric] for r in self.rows[key]])
        if minus is not None:
            values = values - np.array([r[metric] for r in self.rows[(minus, *key[1:])]])
        return bootstrap_interval(values, self.histories[key])


def bootstrap_interval(
    values: npt.NDArray[np.float64], clusters: Sequence[str], resamples: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """The 95% percentile interval of the mean of ``values`` under a cluster bootstrap: whole clusters (the
    histories; a LoCoMo conversation holds ~100 questions, which are not independent) are drawn with replacement,
    ``resamples`` times, with a fixed seed so a run is reproducible.

    >>> bootstrap_interval(np.array([1.0, 1.0, 1.0]), ["a", "b", "c"])
    (1.0, 1.0)
    """
    if len(values) == 0:
        return (float("nan"), float("nan"))
    names, index = np.unique(np.asarray(clusters), return_inverse=True)
    sums = np.bincount(index, weights=values, minlength=len(names))
    counts = np.bincount(index, minlength=len(names)).astype(np.float64)
    draws = np.random.default_rng(seed).integers(0, len(names), size=(resamples, len(names)))
    means = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return (float(low), float(high))


def evaluate(ds: Dataset, cache: EmbeddingCache, args: argparse.Namespace) -> Collected:
    out = Collected()
    configs = tkg_configs(args)
    by_history: dict[str, list[Question]] = {}
    for q in ds.questions:
        by_history.setdefault(q.history, []).append(q)
    for n, (history, questions) in enumerate(by_history.items(), start=1):
        turns = questions[0].turns
        session_of = {t.id: t.session for t in turns}
        start = time.perf_counter()
        baselines = Baselines(turns, ds.name, cache)
        out.build["baselines"] = out.build.get("baselines", 0.0) + time.perf_counter() - start
        memory = TkgSystem(turns, ds.name, cache, None, history)  # one memory; each tkg config searches it
        out.build["tkg ingest"] = out.build.get("tkg ingest", 0.0) + memory.ingest_seconds
        for q in questions:
            rankings = baselines.rank(q.query)
            for name, config in configs.items():
                memory.config = config
                rankings[name] = memory.rank(q)
            for system, ranking in rankings.items():
                out.seconds.setdefault(system, []).append(ranking.seconds)
                levels = {
                    "turn": (ranking.turns, q.relevant_turns),
                    "session": (sessions_by_best_turn(ranking.turns, session_of), q.relevant_sessions),
                    "session_doc": (ranking.session_docs, q.relevant_sessions),
                }
                for level, (ranked, relevant) in levels.items():
                    values: dict[str, float] = {}
                    for k in KS:
                        values.update(scores_at(ranked, relevant, k))
                    out.add(system, level, q.group, q.history, values)
        if args.progress:
            print(f"  {ds.name}: {n}/{len(by_history)} histories, {len(turns)} turns", file=sys.stderr, flush=True)
    cache.save()
    return out


SYSTEM_ORDER = ["bm25", "dense", "hybrid", "tkg-rrf", "tkg"]
HEADLINE = [(level, m) for level in LEVELS for m in ("recall_all@5", "recall_all@10", "ndcg@10")]
_SHORT = {"recall_all@5": "R_all@5", "recall_all@10": "R_all@10", "ndcg@10": "NDCG@10"}


def mean_of(rows: list[dict[str, float]], metric: str) -> float:
    return statistics.fmean(r[metric] for r in rows) if rows else float("nan")


def headline_table(results: list[tuple[Dataset, Collected]]) -> str:
    head = "| dataset (n) | system | " + " | ".join(f"{lv} {_SHORT[m]}" for lv, m in HEADLINE) + " |"
    lines = [head, "|---|---|" + "---:|" * len(HEADLINE)]
    for ds, col in results:
        systems = [s for s in SYSTEM_ORDER if (s, "turn", "overall") in col.rows]
        best = {key: max(mean_of(col.rows[(s, key[0], "overall")], key[1]) for s in systems) for key in HEADLINE}
        for system in systems:
            cells = []
            for key in HEADLINE:
                value = mean_of(col.rows[(system, key[0], "overall")], key[1])
                cells.append(f"**{value:.3f}**" if abs(value - best[key]) < 1e-12 else f"{value:.3f}")
            lines.append(f"| {ds.label} ({len(ds.questions)}) | {system} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_tables(ds: Dataset, col: Collected) -> str:
    systems = [s for s in (*SYSTEM_ORDER, *ABLATIONS, *EXTENSIONS) if (s, "turn", "overall") in col.rows]
    groups = ["overall", *sorted({q.group for q in ds.questions}, key=_group_order)]
    parts = [f"### {ds.label} / dev\n", f"Scorable questions: {len(ds.questions)} (excluded: {ds.excluded}).\n"]
    for level in LEVELS:
        parts.append(f"#### {ds.label} / dev: level `{level}`\n")
        parts.append("| group | system | n | " + " | ".join(METRIC_ORDER) + " |")
        parts.append("|---|---|---|" + "---|" * len(METRIC_ORDER))
        for group in groups:
            for system in systems:
                rows = col.rows.get((system, level, group), [])
                if rows:
                    cells = " | ".join(f"{mean_of(rows, m):.3f}" for m in METRIC_ORDER)
                    parts.append(f"| {group} | {system} | {len(rows)} | {cells} |")
        parts.append("")
    parts.append(f"#### {ds.label} / dev: timing\n")
    parts.append("| system | queries | mean (ms) | p50 (ms) | p95 (ms) |")
    parts.append("|---|---|---|---|---|")
    for system in systems:
        ms = [s * 1000 for s in col.seconds.get(system, [])]
        if ms:
            parts.append(
                f"| {system} | {len(ms)} | {statistics.fmean(ms):.2f} | {percentile(ms, 50):.2f} "
                f"| {percentile(ms, 95):.2f} |"
            )
    parts.append("")
    parts.append(
        "Build: " + ", ".join(f"{k} {v:.1f} s" for k, v in col.build.items()) + " (embeddings come from the cache)."
    )
    return "\n".join(parts)


_TYPE_ORDER = [
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "multi-session",
    "knowledge-update",
    "temporal-reasoning",
]


def _group_order(group: str) -> tuple[int, str]:
    return (_TYPE_ORDER.index(group), group) if group in _TYPE_ORDER else (len(_TYPE_ORDER), group)


# ----------------------------------------------------------------------------------------------------------
# latency of a full hybrid search over a large in-memory graph


def latency(n_facts: int, n_queries: int) -> dict[str, Any]:
    """p50/p95 of ``Memory.search`` with the ``hybrid_bfs`` preset (facts and entities by cosine, BM25 and BFS
    from the hits; episodes by cosine and BM25; all fused by RRF) over the core benchmark's synthetic graph."""
    import random

    import bench_core

    import tkg
    from tkg.backends.memory import InMemoryStore

    rng = random.Random(0)
    hasher = tkg.HashEmbedder(dim=384)
    start = time.perf_counter()
    records, vocab, _ = bench_core.build_records(n_facts, rng, hasher)
    store = InMemoryStore(dim=384)
    store.load(records)
    build_s = time.perf_counter() - start
    del records
    queries = bench_core.query_texts(rng, vocab, n_queries + 20)
    vectors = dict(zip(queries, hasher.embed(queries), strict=True))

    class Precomputed:  # the query vectors are made beforehand: this measures the search, not the embedder
        dim, name = 384, hasher.name

        def embed(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
            return np.stack([vectors[t] for t in texts])

    memory = tkg.Memory(store, embedder=Precomputed(), clock=tkg.FixedClock(bench_core.CLOCK_START))
    out: dict[str, Any] = {"facts": n_facts, "build_s": build_s}
    for name in ("hybrid", "hybrid_bfs"):
        for q in queries[:20]:  # warm-up
            memory.search(q, group_ids=[bench_core.GROUP], config=name)
        times = []
        for q in queries[20:]:
            t0 = time.perf_counter()
            memory.search(q, group_ids=[bench_core.GROUP], config=name)
            times.append((time.perf_counter() - t0) * 1000)
        out[name] = {
            "p50_ms": percentile(times, 50),
            "p95_ms": percentile(times, 95),
            "mean_ms": statistics.fmean(times),
        }
    return out


#: The metrics issue 19 sets its targets on, per data set: (recall metric, NDCG metric, target values).
TARGETS: dict[str, tuple[str, str, float, float]] = {
    "LongMemEval_S": ("recall_all@5", "ndcg@10", 0.80, 0.85),
    "LoCoMo": ("recall_all@10", "ndcg@10", 0.65, 0.60),
}
_BASELINES = ("bm25", "dense", "hybrid")


def _ci(col: Collected, key: tuple[str, str, str], metric: str, minus: str | None = None) -> str:
    """``mean [low, high]`` (of the paired difference with ``minus`` when given), 95% bootstrap interval."""
    rows = col.rows[key]
    mean = mean_of(rows, metric)
    if minus is not None:
        mean -= mean_of(col.rows[(minus, *key[1:])], metric)
    low, high = col.interval(key, metric, minus)
    sign = "+" if minus is not None else ""
    return f"{mean:{sign}.3f} [{low:{sign}.3f}, {high:{sign}.3f}]"


def contract(results: list[tuple[Dataset, Collected]], lat: dict[str, Any] | None) -> dict[str, Any]:
    """The suite's ``tables`` / ``plots`` / ``targets`` (benchmarks/README.md)."""
    import render  # benchmarks/ is on the path: this runs as a script from there

    quality = {
        "title": "Retrieval quality, dev splits (overall)",
        "columns": ["dataset (n)", "system", *(f"{lv} {_SHORT[m]}" for lv, m in HEADLINE)],
        "rows": [],
        "notes": [
            "R_all@k: share of questions with every relevant item in the top k; NDCG@10 over the relevant items. "
            "Protocol: shared/research/retrieval_baselines.md. A dataset in brackets is a robustness variant: "
            + "; ".join(f"{k}: {v}" for k, v in VARIANTS.items() if k != "as-is")
            + "."
        ],
    }
    intervals = {
        "title": "Turn level with 95% bootstrap intervals (the metrics issue 19 sets its targets on)",
        "columns": ["dataset (n)", "system", "recall", "NDCG@10", "recall vs best baseline"],
        "rows": [],
        "notes": [
            "Cluster bootstrap: histories (a LongMemEval question, a LoCoMo conversation) drawn with replacement, "
            "2,000 resamples, seed 0; the last column is the paired difference with the baseline of best mean "
            "recall, on the same resamples. Recall is R_all@5 for LongMemEval_S and R_all@10 for LoCoMo."
        ],
    }
    ablation = {
        "title": "Ablations and extensions of tkg's episode_context reranker (turn level, paired with tkg)",
        "columns": ["dataset (n)", "signal off / mechanism on", "recall", "delta recall", "delta NDCG@10"],
        "rows": [],
        "notes": [
            "For a signal turned off, a positive delta means the run without it did better: the signal lowered it. "
            "'text-only' turns every signal off (BM25 + cosine, normalised and summed); tkg-rrf is the plain RRF "
            "preset. Rows marked + turn on a mechanism that is off by default ("
            + "; ".join(f"{k.removeprefix('tkg ')}: {v}" for k, v in EXTENSIONS.items())
            + "): a positive delta is its gain."
        ],
    }
    timing = {
        "title": "Query latency per system (ms, query embedding excluded)",
        "columns": ["dataset", "system", "queries", "mean", "p50", "p95"],
        "rows": [],
        "notes": [],
    }
    by_type: list[dict[str, Any]] = []
    targets = []
    for ds, col in results:
        systems = [s for s in SYSTEM_ORDER if (s, "turn", "overall") in col.rows]
        recall, ndcg, recall_goal, ndcg_goal = TARGETS[ds.name]
        named = f"{ds.label} ({len(ds.questions)})"
        best = max(_BASELINES, key=lambda b: mean_of(col.rows[(b, "turn", "overall")], recall))
        for system in systems:
            key = (system, "turn", "overall")
            quality["rows"].append(
                [named, system] + [mean_of(col.rows[(system, lv, "overall")], m) for lv, m in HEADLINE]
            )
            vs = _ci(col, key, recall, best) if system not in _BASELINES else "-"
            intervals["rows"].append([named, system, _ci(col, key, recall), _ci(col, key, ndcg), vs])
        for system in [s for s in (*SYSTEM_ORDER, *ABLATIONS, *EXTENSIONS) if (s, "turn", "overall") in col.rows]:
            ms = [x * 1000 for x in col.seconds.get(system, [])]
            if ms:
                timing["rows"].append(
                    [ds.label, system, len(ms), statistics.fmean(ms), percentile(ms, 50), percentile(ms, 95)]
                )
        for name in [a for a in (*ABLATIONS, "tkg-rrf", *EXTENSIONS) if (a, "turn", "overall") in col.rows]:
            key = (name, "turn", "overall")
            off = name.removeprefix("tkg -").removeprefix("tkg ")
            ablation["rows"].append(
                [named, off, mean_of(col.rows[key], recall), _ci(col, key, recall, "tkg"), _ci(col, key, ndcg, "tkg")]
            )
            if name in ABLATIONS:
                delta = mean_of(col.rows[key], recall) - mean_of(col.rows[("tkg", "turn", "overall")], recall)
                what = "every signal" if name == "tkg text-only" else f"the {off} signal"
                targets.append(
                    render.target(
                        f"{ds.label}: turning {what} off does not raise {recall}", delta, 0.0, "", strict=False
                    )
                )
        if ds.variant == "as-is":
            overall = ("tkg", "turn", "overall")
            for metric, goal in ((recall, recall_goal), (ndcg, ndcg_goal)):
                targets.append(
                    render.target(
                        f"{ds.name} dev turn {metric} >= {goal} (issue 19 judges held-out)",
                        mean_of(col.rows[overall], metric),
                        goal,
                        "",
                        lower_is_better=False,
                        strict=False,
                    )
                )
            groups = sorted({q.group for q in ds.questions}, key=_group_order)
            by_type.append(
                {
                    "title": f"{ds.name} per question type: turn {_SHORT.get(recall, recall)} with 95% intervals",
                    "columns": ["type (n)", *systems],
                    "rows": [
                        [
                            f"{g} ({len(col.rows[('tkg', 'turn', g)])})",
                            *(_ci(col, (s, "turn", g), recall) for s in systems),
                        ]
                        for g in groups
                    ],
                    "notes": [],
                }
            )
    tables = [quality, intervals, *by_type, ablation, timing]
    if lat is not None:
        tables.append(
            {
                "title": f"Memory.search latency over {lat['facts']:,} facts in memory (ms, query vectors precomputed)",
                "columns": ["preset", "p50", "p95", "mean"],
                "rows": [
                    [name, lat[name]["p50_ms"], lat[name]["p95_ms"], lat[name]["mean_ms"]] for name in PRESETS_TIMED
                ],
                "notes": [f"graph build and index load: {lat['build_s']:.1f} s"],
            }
        )
        for name in PRESETS_TIMED:
            targets.append(
                render.target(f"{name} search p95 < 5 ms at {lat['facts']:,} facts", lat[name]["p95_ms"], 5.0, "ms")
            )
    return {"tables": tables, "plots": [], "targets": targets}


PRESETS_TIMED = ("hybrid", "hybrid_bfs")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 LoCoMo conversation and 6 LongMemEval questions")
    p.add_argument("--datasets", default="longmemeval,locomo", help="comma-separated: longmemeval, locomo")
    p.add_argument("--lme-limit", type=int, help="LongMemEval questions (spread over the types)")
    p.add_argument("--locomo-limit", type=int, help="LoCoMo conversations")
    p.add_argument("--data", help=shared_data.HELP)
    p.add_argument("--threads", type=int, default=2, help="onnxruntime threads for embedding (default 2)")
    p.add_argument("--latency", action="store_true", help="also measure hybrid search latency over --latency-facts")
    p.add_argument("--latency-facts", type=int, default=100_000)
    p.add_argument("--latency-queries", type=int, default=300)
    p.add_argument("--out", default=str(OUT_DIR / "retrieval.json"))
    p.add_argument("--cache", default=str(OUT_DIR / "emb_cache"), help="embedding cache folder")
    p.add_argument("--progress", action="store_true", help="print progress per history to stderr")
    p.add_argument(
        "--variants",
        default="as-is",
        help="comma-separated robustness variants, or 'all': " + ", ".join(f"{k} ({v})" for k, v in VARIANTS.items()),
    )
    p.add_argument("--no-ablations", dest="ablations", action="store_false", help="skip the ablation rows")
    # the episode_context reranker's weights (defaults: tkg.search_config.EpisodeContext's)
    p.add_argument("--bm25-weight", type=float, default=1.0)
    p.add_argument("--cosine-weight", type=float, default=1.0)
    p.add_argument("--session-weight", type=float, default=0.3)
    p.add_argument("--neighbours", type=int, default=1)
    p.add_argument("--neighbour-weight", type=float, default=0.15)
    p.add_argument("--entity-weight", type=float, default=0.1)
    p.add_argument("--time-weight", type=float, default=0.2)
    p.add_argument(
        "--session-document",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="score sessions as documents, or (default) by their three best turns",
    )
    args = p.parse_args(argv)
    args.variants = list(VARIANTS) if args.variants == "all" else [v.strip() for v in args.variants.split(",")]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {', '.join(unknown)}; choose from {', '.join(VARIANTS)} or 'all'")
    if args.quick:
        args.lme_limit = args.lme_limit or 6
        args.locomo_limit = args.locomo_limit or 1
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import bench_core  # the machine description every benchmark records
    import render

    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    command = render.command_line()
    machine = bench_core.machine()
    root = data_dir(args.data)
    cache = EmbeddingCache(Path(args.cache), minilm_factory(args.threads), "all-MiniLM-L6-v2-int8/256")
    results: list[tuple[Dataset, Collected]] = []
    wall = time.perf_counter()
    for name in args.datasets.split(","):
        loader = {"longmemeval": load_longmemeval, "locomo": load_locomo}[name.strip()]
        published = loader(root, args.lme_limit if name.strip() == "longmemeval" else args.locomo_limit)
        for variant in args.variants:
            ds = vary(published, variant)
            if ds is None:
                print(f"{published.name} [{variant}]: same as the data as published, skipped", file=sys.stderr)
                continue
            before = cache.computed
            t0 = time.perf_counter()
            cache.embed(corpus_texts(ds))  # one batched pass over every distinct text the run needs
            cache.save()
            print(
                f"{ds.label}: {len(ds.questions)} questions; embedded {cache.computed - before} new texts in "
                f"{time.perf_counter() - t0:.1f} s ({cache.cached_at_start} cached at start)",
                file=sys.stderr,
                flush=True,
            )
            results.append((ds, evaluate(ds, cache, args)))
    print("## Headline: dev splits\n")
    print(headline_table(results))
    print()
    for ds, col in results:
        print(detail_tables(ds, col))
        print()
    report: dict[str, Any] = {
        "bench": "retrieval",
        "command": command,
        "machine": machine,
        "started": started_at,
        "args": render.plain_args(args),
        "wall_s": time.perf_counter() - wall,
    }
    for ds, col in results:
        report[ds.label] = {
            f"{s}|{lv}|{g}": {m: mean_of(rows, m) for m in METRIC_ORDER} | {"n": len(rows)}
            for (s, lv, g), rows in col.rows.items()
        }
    if args.latency:
        lat = latency(args.latency_facts, args.latency_queries)
        report["latency"] = lat
        print(f"### Latency: Memory.search over {lat['facts']:,} facts in memory (query vectors precomputed)\n")
        print("| preset | p50 (ms) | p95 (ms) | mean (ms) | target p95 < 5 ms |")
        print("|---|---|---|---|---|")
        for name in ("hybrid", "hybrid_bfs"):
            r = lat[name]
            verdict = "PASS" if r["p95_ms"] < 5 else "MISS"
            print(f"| {name} | {r['p50_ms']:.2f} | {r['p95_ms']:.2f} | {r['mean_ms']:.2f} | {verdict} |")
        print(f"\n(graph build and index load: {lat['build_s']:.1f} s)")
    report.update(contract(results, report.get("latency")))
    report["seconds"] = time.perf_counter() - wall
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, separators=(",", ":"), default=str))
    print(f"\nwall time {time.perf_counter() - wall:.0f} s; written {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
