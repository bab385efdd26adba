"""Bulk ingestion: many episodes, their extraction calls concurrent, their graph changes applied in order.

Extraction calls do not depend on each other (each sees the episodes before it as context, stored or in the same
batch), so they run concurrently up to the LLM policy's concurrency. Graph changes do depend on order: they apply
one episode at a time within each group (groups in parallel), so the graph ends up as sequential
:meth:`tkg.Memory.add_episode` calls would leave it, given the same LLM answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

from tkg.errors import ExtractionFailedError, LLMError
from tkg.ingest import EpisodeResult, Ingestor
from tkg.llm.base import LLMUsage
from tkg.llm.schema import GraphExtraction
from tkg.models import Episode

#: Applies one prepared episode: (episode, now, extraction or its error, usage, start of the batch) -> result.
Apply = Callable[[Episode, datetime, GraphExtraction | LLMError | None, LLMUsage, float], EpisodeResult]


def ingest_batch(
    ingestor: Ingestor,
    prepared: Sequence[tuple[Episode, datetime]],
    *,
    extract: bool,
    workers: int,
    apply: Apply,
) -> list[EpisodeResult]:
    """Ingest validated, not yet stored episodes; one result per episode, in order. An episode whose extraction
    failed for good is stored as failed and its result says so; the others are unaffected."""
    started = time.perf_counter()
    usages = [LLMUsage() for _ in prepared]
    extractions: list[GraphExtraction | LLMError | None] = [None] * len(prepared)
    if extract:

        def extract_one(i: int) -> GraphExtraction | LLMError:
            episode = prepared[i][0]
            earlier = [e for e, _ in prepared[:i]]
            try:
                return ingestor.extract(episode, ingestor.previous(episode, earlier), usages[i])
            except LLMError as exc:
                return exc

        with ThreadPoolExecutor(max_workers=workers) as pool:
            extractions = list(pool.map(extract_one, range(len(prepared))))
    by_group: dict[str, list[int]] = {}
    for i, (episode, _) in enumerate(prepared):
        by_group.setdefault(episode.group_id, []).append(i)
    results: list[EpisodeResult | None] = [None] * len(prepared)

    def apply_group(indexes: list[int]) -> None:
        for i in indexes:
            episode, now = prepared[i]
            try:
                results[i] = apply(episode, now, extractions[i], usages[i], started)
            except ExtractionFailedError as exc:
                stored = ingestor.stored_episode(episode.id)
                results[i] = EpisodeResult(episode=stored or episode, usage=usages[i], warnings=[str(exc)])

    with ThreadPoolExecutor(max_workers=min(workers, max(1, len(by_group)))) as pool:
        for future in [pool.submit(apply_group, indexes) for indexes in by_group.values()]:
            future.result()
    return [r for r in results if r is not None]
