#!/usr/bin/env python
"""Core micro-benchmark of tkg: the in-memory backend, the hash embedder and a scripted LLM.

For each graph size N (facts) it measures:

1. building a base graph of N facts directly from records (no add_episode), bulk-loaded with
   ``InMemoryStore.load`` -- record construction, embedding and index build timed separately;
2. ``Memory.add_episode`` engine time: wall time minus the time spent inside the LLM handler and inside the
   embedder (both wrapped and timed), p50/p95/mean/max, plus LLM calls and prompt characters per episode;
3. ``Memory.search`` (hybrid: facts, entities, episodes; limit 10) latency, with and without query embedding;
4. snapshot ``save`` / ``Memory.load`` time and file size;
5. peak RSS of the process at the end of the size.

Everything is seeded (``random.Random(0)``, fixed clock with a tick), so two runs do the same work.

    python benchmarks/bench_core.py                       # sizes 10000,100000; 200 episodes; 200 queries
    python benchmarks/bench_core.py --quick               # CI smoke: 2000 facts, 30 episodes, 30 queries
    python benchmarks/bench_core.py --profile add,search  # also cProfile both operations at the largest size

Results are printed as tables and written to ``benchmarks/out/core.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import gc
import io
import json
import multiprocessing
import os
import platform
import pstats
import random
import re
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any


def _pin_blas_threads(argv: Sequence[str]) -> str | None:
    """Apply ``--blas-threads N`` before numpy is imported (BLAS reads its thread count at load time)."""
    for i, arg in enumerate(argv):
        value = arg.split("=", 1)[1] if arg.startswith("--blas-threads=") else None
        if arg == "--blas-threads" and i + 1 < len(argv):
            value = argv[i + 1]
        if value:
            for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
                os.environ[var] = value
            return value
    return None


if __name__ == "__main__":
    _pin_blas_threads(sys.argv[1:])

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import render  # noqa: E402  (benchmarks/render.py: the suite's JSON contract)
from measure import summarise_ms  # noqa: E402  (the one percentile definition)

import tkg  # noqa: E402
from tkg.backends.memory import InMemoryStore  # noqa: E402
from tkg.models import Entity, Episode, EpisodeSource, Fact, Mention, Record  # noqa: E402
from tkg.storage import Store  # noqa: E402
from tkg.timeline import Scope  # noqa: E402

OUT_DIR = Path(__file__).resolve().parent / "out"
GROUP = "bench"
DIM = 384
SEED = 0
EMBED_BATCH = 2048
CLOCK_START = datetime(2024, 6, 1, tzinfo=UTC)  # "now" of the benchmark; the base graph lies before it
BASE_START = datetime(2023, 1, 1, tzinfo=UTC)
BASE_END = datetime(2024, 5, 31, tzinfo=UTC)
VALID_EARLIEST = datetime(2015, 1, 1, tzinfo=UTC)
TARGET_MS = 5.0

# ----------------------------------------------------------------------------------------------------------
# vocabulary

FIRST = (
    "Alice Bob Carol David Erin Frank Grace Heidi Ivan Judy Karl Laura Mallory Nina Oscar Peggy Quentin Rita "
    "Sybil Trent Ursula Victor Wendy Xavier Yara Zoe Aaron Bianca Chen Dmitri Elena Farid Gita Hiro Ines Jonas "
    "Kemal Lena Mateo Noor Olga Pavel Rosa Sanjay Tomas Uma Vera Wei Ximena Yusuf Zara Amir Beatriz Chiara "
    "Diego Emma Felix Hana Igor Jana Kofi Leila Marco"
).split()
INITIALS = [f"{c}." for c in "ABCDEFGHJKLMNPRSTVW"]
LAST = (
    "Smith Chen Garcia Müller Rossi Kowalski Nguyen Okafor Silva Tanaka Novak Johansson Kim Dubois Schmidt Ivanova "
    "Haddad Patel Moreau Costa Jensen Fischer Romero Sato Ali Wagner Lopez Murphy Bianchi Kaya Petrov Andersen "
    "Suzuki Weber Martin Hoffmann Singh Park Ferrari Horvat Lindqvist Mendes Ortiz Yilmaz Dvorak Nakamura Popescu "
    "Becker Richter Fontaine Castro Adeyemi Berg Keller Lambert Morales Nowak Pereira Quinn Reyes Stewart Vogel "
    "Walsh Zimmermann"
).split()
PERSON_SUFFIXES = ["", " Jr.", " Sr.", " II", " III"]
ORG_STEMS = (
    "Acme Globex Initech Umbrella Hooli Vandelay Stark Wayne Wonka Cyberdyne Tyrell Soylent Nakatomi Oscorp "
    "Aperture Black Mesa Blue Sun Monarch Pied Piper Dunder Gringotts Ollivander Vehement Prestige Massive Dynamic "
    "Northwind Contoso Fabrikam Litware Tailspin Adatum Proseware Wingtip Alpine Lucerne Fourth Coffee Margie "
    "Humongous Woodgrove Trey Coho Relecloud Wide World Southridge Bellows Zenith Orbit Helix Quantum Kestrel "
    "Falcon Aurora Summit Meridian Cobalt Granite Harbor Lumen Nimbus Polaris"
).split()
ORG_SECTORS = (
    "Robotics Analytics Bank Studios Logistics Pharma Energy Foods Motors Software Labs Capital Media Insurance "
    "Airlines Textiles Biotech Mining Telecom Ventures Systems Foundry Consulting Health Security Games Optics "
    "Materials Semiconductors Brewing"
).split()
ORG_FORMS = ["", " Group", " Inc", " GmbH", " Ltd", " Partners", " Holdings", " AG"]
CITIES = (
    "Berlin;Paris;London;Madrid;Lisbon;Rome;Vienna;Prague;Warsaw;Amsterdam;Brussels;Copenhagen;Stockholm;Oslo;"
    "Helsinki;Dublin;Zurich;Geneva;Munich;Hamburg;Milan;Barcelona;Porto;Athens;Istanbul;Budapest;Krakow;Tallinn;"
    "Riga;Vilnius;New York;Boston;Chicago;Seattle;Denver;Austin;Toronto;Montreal;Vancouver;Mexico City;Bogota;Lima;"
    "Santiago;Buenos Aires;Sao Paulo;Rio de Janeiro;Lagos;Nairobi;Accra;Cairo;Casablanca;Cape Town;Johannesburg;"
    "Dubai;Doha;Mumbai;Delhi;Bangalore;Chennai;Karachi;Dhaka;Bangkok;Hanoi;Singapore;Kuala Lumpur;Jakarta;Manila;"
    "Seoul;Busan;Tokyo;Osaka;Kyoto;Beijing;Shanghai;Shenzhen;Hong Kong;Taipei;Sydney;Melbourne;Auckland;Perth;"
    "Brisbane;Wellington;Reykjavik;Edinburgh;Glasgow;Manchester;Lyon;Marseille;Valencia;Seville;Naples;Turin;"
    "Cologne;Frankfurt;Leipzig;Gdansk;Bratislava;Ljubljana;Zagreb;Sofia;Bucharest"
).split(";")
DISTRICTS = ["", " Harbour", " Old Town", " Riverside", " Airport", " Central", " Hills", " Park", " Docks"]

# relation, source kind, target kind, third-person sentence, first-person clause, weight
FACT_TEMPLATES = [
    ("WORKS_AT", "person", "org", "{s} works at {t}", "I work at {t}", 18),
    ("LIVES_IN", "person", "place", "{s} lives in {t}", "I live in {t}", 14),
    ("KNOWS", "person", "person", "{s} knows {t}", "I know {t}", 14),
    ("MANAGES", "person", "person", "{s} manages {t}", "I manage {t}", 6),
    ("VISITED", "person", "place", "{s} visited {t}", "I visited {t}", 10),
    ("FOUNDED", "person", "org", "{s} founded {t}", "I founded {t}", 3),
    ("STUDIED_AT", "person", "org", "{s} studied at {t}", "I studied at {t}", 6),
    ("CUSTOMER_OF", "person", "org", "{s} is a customer of {t}", "I am a customer of {t}", 6),
    ("HEADQUARTERED_IN", "org", "place", "{s} is headquartered in {t}", "{s} is headquartered in {t}", 8),
    ("PARTNERS_WITH", "org", "org", "{s} partners with {t}", "{s} partners with {t}", 5),
    ("ACQUIRED", "org", "org", "{s} acquired {t}", "{s} acquired {t}", 2),
]

# Episodes for the add_episode benchmark: (template, weight). {S} speaker, {P}/{Q} people, {O} org, {L} place.
EPISODE_TEMPLATES = [
    ("{S}: I started working at {O} in {L} last week.", 5),
    ("{S}: I moved to {L} two months ago.", 3),
    ("{S}: I had lunch with {P} at {O} today.", 3),
    ("{S}: I joined {O} as an engineer in 2021.", 3),
    ("{S}: I visited {L} with {P} last summer.", 2),
    ("{S}: I am studying at {O} now.", 2),
    ("{S}: I met {P} and {Q} at a conference in {L}.", 2),
]

QUERY_TEMPLATES = [
    "where does {P} work?",
    "who lives in {L}?",
    "{O} headquarters",
    "who knows {P}",
    "companies founded by {P}",
    "what did {P} visit last summer",
    "{P} and {O}",
    "{sector} companies in {city}",
    "who studied at {O}?",
    "{first}'s manager",
    "partners of {O}",
    "customers of {O} living in {city}",
]

# The scripted LLM's "understanding": verb phrase -> (relation, present-tense text for the fact sentence).
VERBS = [
    ("started working at", "WORKS_AT", "works at"),
    ("moved to", "LIVES_IN", "lives in"),
    ("had lunch with", "MET", "had lunch with"),
    ("joined", "JOINED", "joined"),
    ("visited", "VISITED", "visited"),
    ("studying at", "STUDIES_AT", "studies at"),
    ("met", "MET", "met"),
]
TIME_PHRASE = re.compile(r"\b(last week|two months ago|in \d{4}|last summer|today|yesterday|now)\b")
CAPITALISED = re.compile(r"[A-Z][\w.'-]*(?:\s+[A-Z][\w.'-]*)*")
NOT_ENTITIES = {"I", "My", "We", "Our"}
PREP_LABEL = {
    "with": "Person",
    "and": "Person",
    "met": "Person",
    "in": "Place",
    "to": "Place",
    "at": "Organization",
    "joined": "Organization",
}


# ----------------------------------------------------------------------------------------------------------
# instrumentation


class TimedEmbedder:
    """Wraps an embedder and accumulates the time spent in ``embed``."""

    def __init__(self, inner: tkg.Embedder) -> None:
        self.inner = inner
        self.seconds = 0.0
        self.texts = 0

    @property
    def dim(self) -> int:
        return self.inner.dim

    @property
    def name(self) -> str:
        return self.inner.name

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        start = time.perf_counter()
        try:
            return self.inner.embed(texts)
        finally:
            self.seconds += time.perf_counter() - start
            self.texts += len(texts)


class TimedHandler:
    """Wraps a ScriptedLLM handler and accumulates the time spent in it."""

    def __init__(self, handler: Callable[..., Any]) -> None:
        self.handler = handler
        self.seconds = 0.0

    def __call__(self, prompt: tkg.Prompt, model: type) -> Any:
        start = time.perf_counter()
        try:
            return self.handler(prompt, model)
        finally:
            self.seconds += time.perf_counter() - start


RULES = tkg.RulesLLM()


def extraction_handler(prompt: tkg.Prompt, model: type) -> dict[str, Any]:
    """A deterministic stand-in for the LLM: entities are the speaker plus the capitalised runs of the message;
    one fact from the speaker to each other entity, its relation from the message's verb; the time phrase, if
    any, becomes valid_from. The batched resolution call (only made when a name or fact is ambiguous) is answered
    with "nothing to merge or invalidate"; community summaries as :class:`tkg.RulesLLM` does."""
    if model is tkg.llm.Resolution:
        return {}
    if model is not tkg.GraphExtraction:  # community summaries of the refresh policy
        return RULES.generate(prompt, model).model_dump()
    inputs = prompt.inputs
    content: str = inputs["content"]
    speaker: str | None = inputs.get("speaker")
    body = content.split(":", 1)[1] if speaker else content
    relation, verb_text = "MENTIONS", "mentioned"
    for phrase, rel, text in VERBS:
        if phrase in body:
            relation, verb_text = rel, text
            break
    when = TIME_PHRASE.search(body)
    valid_from = when.group(1) if when else None
    entities: list[dict[str, str]] = []
    targets: list[tuple[str, str]] = []  # (name, preceding word)
    for match in CAPITALISED.finditer(body):
        name = match.group(0)
        words = name.split()
        while words and words[0] in NOT_ENTITIES:
            words.pop(0)
        if not words:
            continue
        if len(words[-1]) > 2 and words[-1].endswith("."):  # sentence end, not an initial
            words[-1] = words[-1][:-1]
        name = " ".join(words)
        before = body[: match.start()].split()
        prep = before[-1].lower() if before else ""
        entities.append({"name": name, "label": PREP_LABEL.get(prep, "Entity")})
        targets.append((name, prep))
    facts = []
    if speaker:
        entities.insert(0, {"name": speaker, "label": "Person"})
        first = targets[0][0] if targets else ""
        for i, (name, prep) in enumerate(targets):
            sentence = f"{speaker} {verb_text} {name}" if i == 0 else f"{speaker} {verb_text} {first} {prep} {name}"
            facts.append(
                {"source": speaker, "target": name, "relation": relation, "fact": sentence, "valid_from": valid_from}
            )
    return {"entities": entities, "facts": facts}


# ----------------------------------------------------------------------------------------------------------
# base graph


@dataclass
class Vocabulary:
    people: list[str]
    orgs: list[str]
    places: list[str]
    people_ids: list[str] = field(default_factory=list)
    org_ids: list[str] = field(default_factory=list)
    place_ids: list[str] = field(default_factory=list)


def _decode(index: int, radices: Sequence[Sequence[str]]) -> list[str]:
    parts = []
    for choices in radices:
        index, digit = divmod(index, len(choices))
        parts.append(choices[digit])
    return parts


def _unique_names(rng: random.Random, count: int, radices: Sequence[Sequence[str]], join: Callable) -> list[str]:
    total = 1
    for choices in radices:
        total *= len(choices)
    count = min(count, total)
    return [join(_decode(i, radices)) for i in rng.sample(range(total), count)]


def make_vocabulary(rng: random.Random, n_entities: int) -> Vocabulary:
    n_places = min(len(CITIES) * len(DISTRICTS), max(30, n_entities // 25))
    n_orgs = max(10, n_entities // 5)
    places = [c + d for d, c in zip(*_product_order(DISTRICTS, CITIES), strict=True)][:n_places]
    orgs = _unique_names(rng, n_orgs, [ORG_STEMS, ORG_SECTORS, ORG_FORMS], lambda p: f"{p[0]} {p[1]}{p[2]}")
    n_people = max(10, n_entities - len(places) - len(orgs))
    people = _unique_names(
        rng, n_people, [FIRST, INITIALS, LAST, PERSON_SUFFIXES], lambda p: f"{p[0]} {p[1]} {p[2]}{p[3]}"
    )
    if len(people) < n_people:
        raise SystemExit(f"size too large for the name vocabulary ({n_people:,} people wanted, {len(people):,} made)")
    return Vocabulary(people=people, orgs=orgs, places=places)


def _product_order(districts: Sequence[str], cities: Sequence[str]) -> tuple[list[str], list[str]]:
    """Plain city names first, then districts of them: the first places are the familiar ones."""
    ds, cs = [], []
    for d in districts:
        for c in cities:
            ds.append(d)
            cs.append(c)
    return ds, cs


def _rid(rng: random.Random) -> str:
    return f"{rng.getrandbits(128):032x}"


def _embed_all(embedder: tkg.Embedder, texts: list[str]) -> np.ndarray:
    out = np.empty((len(texts), embedder.dim), dtype=np.float32)
    for start in range(0, len(texts), EMBED_BATCH):
        out[start : start + EMBED_BATCH] = embedder.embed(texts[start : start + EMBED_BATCH])
    return out


def build_records(n_facts: int, rng: random.Random, embedder: tkg.Embedder) -> tuple[list[Record], Vocabulary, dict]:
    """Entities, facts, episodes and mentions of a base graph of ``n_facts`` facts, with vectors."""
    timings: dict[str, Any] = {}
    t0 = time.perf_counter()
    vocab = make_vocabulary(rng, max(30, n_facts // 3))
    kinds = {"person": vocab.people, "org": vocab.orgs, "place": vocab.places}
    labels = {"person": "Person", "org": "Organization", "place": "Place"}
    weights = [t[5] for t in FACT_TEMPLATES]
    n_episodes = (n_facts + 2) // 3
    step = (BASE_END - BASE_START) / max(1, n_episodes)

    # Plan the text first (ids, names, sentences), embed everything in batches, then build the records.
    episode_rows = []  # (id, content, created, [(fact id, tpl, src name, src kind, tgt name, tgt kind, sentence)])
    fact_count = 0
    for j in range(n_episodes):
        created = BASE_START + step * j
        speaker = rng.choice(vocab.people)
        clauses, facts = [], []
        for _ in range(min(3, n_facts - fact_count)):
            tpl = rng.choices(FACT_TEMPLATES, weights)[0]
            rel, src_kind, tgt_kind, third, first, _w = tpl
            src = speaker if src_kind == "person" else rng.choice(kinds[src_kind])
            tgt = rng.choice(kinds[tgt_kind])
            while tgt == src:
                tgt = rng.choice(kinds[tgt_kind])
            sentence = third.format(s=src, t=tgt)
            clause = first.format(s=src, t=tgt)
            clauses.append(clause[0].upper() + clause[1:] + ("" if clause.endswith(".") else "."))
            facts.append((_rid(rng), rel, src, src_kind, tgt, tgt_kind, sentence))
            fact_count += 1
        episode_rows.append((_rid(rng), f"{speaker}: " + " ".join(clauses), created, speaker, facts))
    timings["plan_s"] = time.perf_counter() - t0

    names = [(kind, name) for kind in ("person", "org", "place") for name in kinds[kind]]
    sentences = [f[6] for row in episode_rows for f in row[4]]
    contents = [row[1] for row in episode_rows]
    t1 = time.perf_counter()
    name_vecs = _embed_all(embedder, [n for _, n in names])
    fact_vecs = _embed_all(embedder, sentences)
    episode_vecs = _embed_all(embedder, contents)
    timings["embed_s"] = time.perf_counter() - t1
    timings["embedded_texts"] = len(names) + len(sentences) + len(contents)

    t2 = time.perf_counter()
    records: list[Record] = []
    entity_id: dict[str, str] = {}
    for i, (kind, name) in enumerate(names):
        eid = _rid(rng)
        entity_id[name] = eid
        summary = f"{name.split()[1]} company" if kind == "org" else ""
        records.append(
            Entity(
                id=eid,
                group_id=GROUP,
                name=name,
                created_at=BASE_START,
                summary=summary,
                labels=("Entity", labels[kind]),
                name_embedding=name_vecs[i],
            )
        )
    vocab.people_ids = [entity_id[n] for n in vocab.people]
    vocab.org_ids = [entity_id[n] for n in vocab.orgs]
    vocab.place_ids = [entity_id[n] for n in vocab.places]
    k = 0
    for j, (ep_id, content, created, speaker, facts) in enumerate(episode_rows):
        records.append(
            Episode(
                id=ep_id,
                group_id=GROUP,
                content=content,
                source=EpisodeSource.MESSAGE,
                reference_time=created,
                created_at=created,
                embedding=episode_vecs[j],
            )
        )
        mentioned = {entity_id[speaker]}
        for fid, rel, src, _sk, tgt, _tk, sentence in facts:
            valid_at = None
            if rng.random() < 0.85:
                span = (created - VALID_EARLIEST).total_seconds()
                valid_at = VALID_EARLIEST + timedelta(seconds=rng.random() * span)
            invalid_at = expired_at = None
            if valid_at is not None and rng.random() < 0.12:  # ended facts, learnt a little later
                invalid_at = valid_at + (created - valid_at) * rng.random()
                expired_at = min(created + timedelta(days=rng.uniform(0, 60)), BASE_END)
            records.append(
                Fact(
                    id=fid,
                    group_id=GROUP,
                    source_id=entity_id[src],
                    target_id=entity_id[tgt],
                    relation=rel,
                    fact=sentence,
                    created_at=created,
                    valid_at=valid_at,
                    invalid_at=invalid_at,
                    expired_at=expired_at,
                    episodes=(ep_id,),
                    embedding=fact_vecs[k],
                )
            )
            k += 1
            mentioned.update((entity_id[src], entity_id[tgt]))
        records.extend(Mention(ep_id, e, GROUP, created) for e in sorted(mentioned))
    timings["records_s"] = time.perf_counter() - t2
    timings["counts"] = {
        "entities": len(names),
        "facts": len(sentences),
        "episodes": len(episode_rows),
        "mentions": sum(1 for r in records if isinstance(r, Mention)),
    }
    return records, vocab, timings


# ----------------------------------------------------------------------------------------------------------
# workloads


def _person(rng: random.Random, vocab: Vocabulary, new_share: float = 0.2) -> str:
    if rng.random() < new_share:  # someone the graph may not know yet
        return f"{rng.choice(FIRST)} {rng.choice(INITIALS)} {rng.choice(LAST)}"
    return rng.choice(vocab.people)


def episode_texts(rng: random.Random, vocab: Vocabulary, count: int) -> list[str]:
    weights = [w for _, w in EPISODE_TEMPLATES]
    out = []
    for _ in range(count):
        template = rng.choices(EPISODE_TEMPLATES, weights)[0][0]
        org = rng.choice(vocab.orgs) if rng.random() < 0.85 else f"{rng.choice(ORG_STEMS)} {rng.choice(ORG_SECTORS)}"
        out.append(
            template.format(
                S=_person(rng, vocab),
                P=_person(rng, vocab, 0.1),
                Q=_person(rng, vocab, 0.1),
                O=org,
                L=rng.choice(vocab.places),
            )
        )
    return out


def query_texts(rng: random.Random, vocab: Vocabulary, count: int) -> list[str]:
    out = []
    for _ in range(count):
        person = rng.choice(vocab.people)
        out.append(
            rng.choice(QUERY_TEMPLATES).format(
                P=person,
                first=person.split()[0],
                O=rng.choice(vocab.orgs),
                L=rng.choice(vocab.places),
                city=rng.choice(CITIES),
                sector=rng.choice(ORG_SECTORS).lower(),
            )
        )
    return out


def in_fresh_process(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a new Python process (spawned, not forked), so that what one measurement leaves behind --
    a large heap, threads, caches -- never weighs on the next, and resident memory is that measurement's own."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def summarise(values_s: Sequence[float]) -> dict[str, float]:
    """p50/p95/mean/max in ms (the one percentile definition, in ``measure``)."""
    return summarise_ms(values_s)


RECALL_QUERIES = 50  # queries whose exact top 10 is computed by exact_cuts (a scan of every fact)
RECALL_K = 10


def _unit(rows: npt.ArrayLike) -> npt.NDArray[np.float64]:
    matrix = np.asarray(rows, dtype=np.float64)
    return matrix / np.maximum(np.linalg.norm(matrix, axis=-1, keepdims=True), 1e-12)


#: The vector a fact is scored by in recall measurements.
VectorOf = Callable[[Fact], npt.NDArray[np.float32]]


def _held(fact: Fact) -> npt.NDArray[np.float32]:
    assert fact.embedding is not None
    return fact.embedding


def exact_cuts(
    store: Store, vectors: npt.NDArray[np.float32], scope: Scope, k: int, truth: VectorOf | None = None
) -> npt.NDArray[np.float64]:
    """Per query vector, the exact k-th best cosine (float64) over every fact of ``GROUP`` that ``scope`` admits;
    ``truth``: the vector each fact is scored by (default: the one the store holds)."""
    truth = truth or _held
    queries = _unit(vectors)
    best = np.full((len(queries), k), -np.inf)
    rows: list[npt.NDArray[np.float32]] = []

    def score() -> None:
        scores = _unit(rows) @ queries.T  # (facts, queries)
        best[:] = -np.sort(-np.concatenate([best, scores.T], axis=1), axis=1)[:, :k]
        rows.clear()

    for fact in store.scan(tkg.Kind.FACT, frozenset({GROUP})):
        if fact.embedding is not None and scope.admits(fact):
            rows.append(truth(fact))
            if len(rows) == 65_536:
                score()
    if rows:
        score()
    return best[:, -1]


def fact_recall(
    store: Store,
    vectors: npt.NDArray[np.float32],
    cuts: npt.NDArray[np.float64],
    scope: Scope,
    k: int,
    truth: VectorOf | None = None,
) -> dict[str, Any]:
    """recall@k of ``store``'s cosine search over facts (its index, approximate or not) against exact search, and
    the time of each of those calls: of the exact top k (``cuts``, from :func:`exact_cuts` with the same scope and
    ``truth``), the share returned; a returned fact counts when its exact score reaches the k-th best (ties at the
    cut: equal texts have equal vectors)."""
    truth = truth or _held
    found, times = 0, []
    for vector, cut in zip(vectors, cuts.tolist(), strict=True):
        start = time.perf_counter()
        hits = store.vector_search(tkg.Kind.FACT, vector, k, scope)
        times.append(time.perf_counter() - start)
        facts = store.get(tkg.Kind.FACT, [hit.id for hit in hits])
        exact = _unit([truth(fact) for fact in facts if fact is not None]) @ _unit(vector)
        found += int(np.count_nonzero(exact >= cut - 1e-6))
    return {"recall": found / (k * len(vectors)), "queries": len(vectors), "k": k, "ms": summarise(times)}


def rss_mb() -> tuple[float, float]:
    """(peak RSS of the process, current RSS) in MiB."""
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    peak = peak_kb / 1024 / (1024 if sys.platform == "darwin" else 1)
    current = float("nan")
    try:
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        pass
    return peak, current


@dataclass
class Bench:
    memory: tkg.Memory
    embedder: TimedEmbedder
    handler: TimedHandler


def run_add_episodes(bench: Bench, texts: Sequence[str]) -> dict[str, Any]:
    memory, embedder, handler = bench.memory, bench.embedder, bench.handler
    wall, engine, llm, embed, calls, chars, warnings = [], [], [], [], [], [], 0
    for text in texts:
        handler.seconds = embedder.seconds = 0.0
        start = time.perf_counter()
        result = memory.add_episode(text, group_id=GROUP)
        elapsed = time.perf_counter() - start
        wall.append(elapsed)
        llm.append(handler.seconds)
        embed.append(embedder.seconds)
        engine.append(elapsed - handler.seconds - embedder.seconds)
        calls.append(result.usage.calls)
        chars.append(result.usage.prompt_chars)
        warnings += len(result.warnings)
    return {
        "engine_ms": summarise(engine),
        "wall_ms": summarise(wall),
        "llm_handler_ms": summarise(llm),
        "embed_ms": summarise(embed),
        "llm_calls_per_episode": float(np.mean(calls)) if calls else 0.0,
        "prompt_chars_per_episode": float(np.mean(chars)) if chars else 0.0,
        "warnings": warnings,
    }


#: Searches at past times (bench_scale, bench_postgres): as of a random time in the base graph's event span, or
#: known at a random time in its transaction span (what the memory had recorded by then).
PAST_TIMES = (
    ("search_as_of", "as_of", (VALID_EARLIEST, CLOCK_START)),
    ("search_known_at", "known_at", (BASE_START, BASE_END)),
)


def past_times(count: int, seed: int = SEED + 2) -> dict[str, list[dict[str, datetime]]]:
    """For each search of :data:`PAST_TIMES`, ``count`` searches' time arguments, one random time each."""
    rng = random.Random(seed)
    return {
        name: [{argument: first + (last - first) * rng.random()} for _ in range(count)]
        for name, argument, (first, last) in PAST_TIMES
    }


def run_searches(
    memory: tkg.Memory,
    embedder: TimedEmbedder,
    queries: Sequence[str],
    times_asked: Sequence[dict[str, datetime]] | None = None,
) -> dict[str, Any]:
    """Memory.search latency over ``queries``: total and minus the time inside ``embedder`` (the memory's);
    ``times_asked``: each query's ``as_of`` / ``known_at`` arguments (default: none, now)."""
    asked = list(times_asked) if times_asked is not None else [{} for _ in queries]
    total, without_embed, hits = [], [], []
    for query, at in zip(queries, asked, strict=True):
        embedder.seconds = 0.0
        start = time.perf_counter()
        results = memory.search(query, group_ids=[GROUP], limit=10, **at)
        elapsed = time.perf_counter() - start
        total.append(elapsed)
        without_embed.append(elapsed - embedder.seconds)
        hits.append(len(results.facts) + len(results.entities) + len(results.episodes))
    return {
        "total_ms": summarise(total),
        "excluding_embed_ms": summarise(without_embed),
        "results_per_query": float(np.mean(hits)) if hits else 0.0,
    }


def profile(label: str, fn: Callable[[], object], calls: int, top: int = 25) -> str:
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    fn()
    profiler.disable()
    elapsed = time.perf_counter() - start
    stream = io.StringIO()
    stats = pstats.Stats(profiler, stream=stream)
    stats.sort_stats("cumulative").print_stats(top)
    header = f"== cProfile: {label}: {calls} calls, {elapsed * 1000 / max(1, calls):.2f} ms/call under the profiler\n"
    return header + stream.getvalue()


# ----------------------------------------------------------------------------------------------------------
# one size


def bench_size(n_facts: int, args: argparse.Namespace) -> dict[str, Any]:
    rng = random.Random(SEED)
    np.random.seed(SEED)
    gc.collect()
    result: dict[str, Any] = {"facts": n_facts}

    # 1. base graph
    raw_embedder = tkg.HashEmbedder(dim=DIM)
    t0 = time.perf_counter()
    records, vocab, timings = build_records(n_facts, rng, raw_embedder)
    store = InMemoryStore(dim=DIM, threads=args.threads)
    t1 = time.perf_counter()
    store.load(records)
    load_s = time.perf_counter() - t1
    del records
    embedder = TimedEmbedder(tkg.HashEmbedder(dim=DIM))
    handler = TimedHandler(extraction_handler)
    clock = tkg.FixedClock(CLOCK_START, tick=timedelta(seconds=1))
    memory = tkg.Memory(store, embedder=embedder, llm=tkg.ScriptedLLM(handler=handler), clock=clock)
    result["build"] = {
        "plan_s": timings["plan_s"],
        "embed_s": timings["embed_s"],
        "records_s": timings["records_s"],
        "store_load_s": load_s,
        "total_s": time.perf_counter() - t0,
        "embedded_texts": timings["embedded_texts"],
        "counts": timings["counts"],
    }
    bench = Bench(memory, embedder, handler)
    # The ScriptedLLM keeps every prompt in .calls; drop them so the list does not grow through the run.
    llm = memory.llm
    assert isinstance(llm, tkg.ScriptedLLM)

    # 2. add_episode
    texts = episode_texts(
        rng, vocab, args.warmup + args.episodes + (args.profile_calls if "add" in args.profile else 0)
    )
    gc.collect()
    run_add_episodes(bench, texts[: args.warmup])
    result["add_episode"] = run_add_episodes(bench, texts[args.warmup : args.warmup + args.episodes])
    llm.calls.clear()

    # 3. search
    queries = query_texts(
        rng, vocab, args.warmup + args.queries + (args.profile_calls if "search" in args.profile else 0)
    )
    gc.collect()
    run_searches(bench.memory, bench.embedder, queries[: args.warmup])
    result["search"] = run_searches(bench.memory, bench.embedder, queries[args.warmup : args.warmup + args.queries])

    # 4. snapshot
    with tempfile.TemporaryDirectory(prefix="tkg-bench-") as tmp:
        path = Path(tmp) / "core.tkg"
        gc.collect()
        t = time.perf_counter()
        size = memory.save(path)
        save_s = time.perf_counter() - t
        gc.collect()
        t = time.perf_counter()
        loaded = tkg.Memory.load(path, embedder=tkg.HashEmbedder(dim=DIM))
        load_snapshot_s = time.perf_counter() - t
        loaded_facts = loaded.stats()["records"]["fact"]
        del loaded
    result["snapshot"] = {
        "save_s": save_s,
        "load_s": load_snapshot_s,
        "bytes": size,
        "loaded_facts": loaded_facts,
    }

    # optional profiles, after everything measured
    profiles = {}
    if n_facts == max(args.sizes):
        if "add" in args.profile:
            rest = texts[args.warmup + args.episodes :]
            profiles["add_episode"] = profile(
                f"add_episode at N={n_facts:,}", functools.partial(run_add_episodes, bench, rest), len(rest)
            )
        if "search" in args.profile:
            rest_q = queries[args.warmup + args.queries :]
            profiles["search"] = profile(
                f"search at N={n_facts:,}",
                functools.partial(run_searches, bench.memory, bench.embedder, rest_q),
                len(rest_q),
            )
    result["profiles"] = profiles

    # 5. memory
    peak, current = rss_mb()
    result["rss_mb"] = {"peak": peak, "current": current}
    result["store_records"] = memory.stats()["records"]
    result["targets"] = {
        "add_episode_engine_p50_ms": _target(result["add_episode"]["engine_ms"]["p50"]),
        "search_p95_ms": _target(result["search"]["total_ms"]["p95"]),
    }
    del memory, bench, store
    gc.collect()
    return result


def _target(value: float) -> dict[str, Any]:
    return {"value": value, "limit": TARGET_MS, "pass": bool(value < TARGET_MS)}


# ----------------------------------------------------------------------------------------------------------
# report


def others_cpu_busy(seconds: float = 0.5) -> float | None:
    """Fraction of all CPUs busy over ``seconds`` while this process sleeps, i.e. used by other processes
    (Linux /proc/stat; None elsewhere)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return sum(values), idle

    try:
        total0, idle0 = sample()
        time.sleep(seconds)
        total1, idle1 = sample()
    except (OSError, ValueError, IndexError):
        return None
    total = total1 - total0
    return None if total <= 0 else round(1.0 - (idle1 - idle0) / total, 3)


def machine() -> dict[str, Any]:
    try:
        affinity: int | None = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = os.cpu_count()
    versions = {}
    for name in ("numpy", "hnswlib", "bm25s", "igraph", "msgpack", "pydantic", "dateparser"):
        try:
            from importlib.metadata import version

            versions[name] = version({"igraph": "igraph"}.get(name, name))
        except Exception:
            versions[name] = "?"
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {
        "load_average": load,
        "others_cpu_busy_at_start": others_cpu_busy(),
        "blas_threads_env": {
            v: os.environ.get(v) for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
        },
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "processor": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "tkg": tkg.__version__,
        "packages": versions,
    }


def print_report(info: dict[str, Any], results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    sizes = [r["facts"] for r in results]
    width = 14

    def row(label: str, values: Sequence[str]) -> None:
        print(f"  {label:<44}" + "".join(f"{v:>{width}}" for v in values))

    def num(path: Sequence[str], fmt: str = "{:.2f}") -> list[str]:
        out = []
        for r in results:
            value: Any = r
            for key in path:
                value = value[key]
            out.append(fmt.format(value))
        return out

    print()
    row("graph size N (facts)", [f"{n:,}" for n in sizes])
    print("  " + "-" * (44 + width * len(sizes)))
    print("  build (no add_episode; InMemoryStore.load)")
    row(
        "records: entities / episodes",
        [f"{r['build']['counts']['entities']:,}/{r['build']['counts']['episodes']:,}" for r in results],
    )
    row("plan text (s)", num(["build", "plan_s"]))
    row("embed texts (s)", num(["build", "embed_s"]))
    row("construct records (s)", num(["build", "records_s"]))
    row("InMemoryStore.load: index build (s)", num(["build", "store_load_s"]))
    row("total build (s)", num(["build", "total_s"]))
    print(f"  add_episode ({args.episodes} episodes, after {args.warmup} warm-up)")
    for key in ("p50", "p95", "mean", "max"):
        row(f"engine {key} (ms)", num(["add_episode", "engine_ms", key]))
    row(
        "wall p50 / p95 (ms)",
        [f"{r['add_episode']['wall_ms']['p50']:.2f}/{r['add_episode']['wall_ms']['p95']:.2f}" for r in results],
    )
    row(
        "embedder p50 / mean (ms)",
        [f"{r['add_episode']['embed_ms']['p50']:.2f}/{r['add_episode']['embed_ms']['mean']:.2f}" for r in results],
    )
    row("scripted-LLM handler mean (ms)", num(["add_episode", "llm_handler_ms", "mean"]))
    row("LLM calls per episode", num(["add_episode", "llm_calls_per_episode"]))
    row("prompt chars per episode", num(["add_episode", "prompt_chars_per_episode"], "{:,.0f}"))
    print(f"  search: hybrid, facts+entities+episodes, limit 10 ({args.queries} queries)")
    for key in ("p50", "p95", "mean", "max"):
        row(f"total {key} (ms)", num(["search", "total_ms", key]))
    for key in ("p50", "p95", "mean"):
        row(f"excluding query embedding {key} (ms)", num(["search", "excluding_embed_ms", key]))
    row("results per query", num(["search", "results_per_query"], "{:.1f}"))
    print("  snapshot (msgpack)")
    row("Memory.save (s)", num(["snapshot", "save_s"]))
    row("file size (MiB)", [f"{r['snapshot']['bytes'] / 2**20:.1f}" for r in results])
    row("Memory.load: decode + index build (s)", num(["snapshot", "load_s"]))
    print("  process memory")
    row("peak RSS so far (MiB)", num(["rss_mb", "peak"], "{:,.0f}"))
    row("current RSS at end of size (MiB)", num(["rss_mb", "current"], "{:,.0f}"))
    print()
    print("  targets (set for N = 10,000 and 100,000)")
    row(
        "add_episode engine p50 < 5 ms",
        [
            f"{r['targets']['add_episode_engine_p50_ms']['value']:.2f} "
            f"{'PASS' if r['targets']['add_episode_engine_p50_ms']['pass'] else 'MISS'}"
            for r in results
        ],
    )
    row(
        "search p95 < 5 ms",
        [
            f"{r['targets']['search_p95_ms']['value']:.2f} "
            f"{'PASS' if r['targets']['search_p95_ms']['pass'] else 'MISS'}"
            for r in results
        ],
    )
    print()
    for r in results:
        for text in r.get("profiles", {}).values():
            print(text)


def contract(results: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    """The suite's ``tables`` / ``plots`` / ``targets`` (benchmarks/README.md) from the per-size results."""

    def pick(path: str) -> list[Any]:
        out = []
        for r in results:
            value: Any = r
            for key in path.split("."):
                value = value[key]
            out.append(value / 2**20 if path == "snapshot.bytes" else value)
        return out

    rows: list[tuple[str, str]] = [
        ("build: plan text s", "build.plan_s"),
        ("build: embed texts s", "build.embed_s"),
        ("build: construct records s", "build.records_s"),
        ("build: InMemoryStore.load (index build) s", "build.store_load_s"),
        ("build: total s", "build.total_s"),
        ("add_episode engine p50 ms", "add_episode.engine_ms.p50"),
        ("add_episode engine p95 ms", "add_episode.engine_ms.p95"),
        ("add_episode engine mean ms", "add_episode.engine_ms.mean"),
        ("add_episode engine max ms", "add_episode.engine_ms.max"),
        ("add_episode wall p50 ms", "add_episode.wall_ms.p50"),
        ("embedder p50 ms", "add_episode.embed_ms.p50"),
        ("LLM calls per episode", "add_episode.llm_calls_per_episode"),
        ("prompt chars per episode", "add_episode.prompt_chars_per_episode"),
        ("search total p50 ms", "search.total_ms.p50"),
        ("search total p95 ms", "search.total_ms.p95"),
        ("search total max ms", "search.total_ms.max"),
        ("search excl. query embedding p50 ms", "search.excluding_embed_ms.p50"),
        ("search excl. query embedding p95 ms", "search.excluding_embed_ms.p95"),
        ("snapshot save s", "snapshot.save_s"),
        ("snapshot size MiB", "snapshot.bytes"),
        ("snapshot load (decode + index build) s", "snapshot.load_s"),
        ("peak RSS so far MiB", "rss_mb.peak"),
        ("current RSS at end of size MiB", "rss_mb.current"),
    ]
    sizes = [r["facts"] for r in results]
    table = {
        "title": f"Core: in-memory backend, HashEmbedder({DIM}), scripted LLM; {args.episodes} episodes, "
        f"{args.queries} queries per size",
        "columns": ["metric", *(f"{n:,} facts" for n in sizes)],
        "rows": [[label, *pick(path)] for label, path in rows],
        "notes": [
            "engine = add_episode wall time minus time inside the scripted LLM and the embedder.",
            "search = Memory.search(limit=10), hybrid cosine + BM25 with RRF over facts, entities, episodes.",
            "peak RSS is the process's peak so far (sizes run smallest first).",
        ],
    }
    plots = [
        {
            "file": "latency_vs_size.png",
            "title": "tkg core: latency against graph size",
            "x_label": "facts",
            "y_label": "milliseconds",
            "log_x": True,
            "log_y": False,
            "x": sizes,
            "series": {
                "add_episode engine p50": pick("add_episode.engine_ms.p50"),
                "add_episode engine p95": pick("add_episode.engine_ms.p95"),
                "search p50": pick("search.total_ms.p50"),
                "search p95": pick("search.total_ms.p95"),
            },
        }
    ]
    targets = []
    for r in results:
        n = f"{r['facts']:,}"
        targets.append(
            render.target(
                f"add_episode engine p50 < 5 ms at {n} facts", r["add_episode"]["engine_ms"]["p50"], TARGET_MS, "ms"
            )
        )
        search_p95 = r["search"]["total_ms"]["p95"]
        targets.append(render.target(f"search p95 < 5 ms at {n} facts", search_p95, TARGET_MS, "ms"))
    return {"tables": [table], "plots": plots, "targets": targets}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sizes", default="10000,100000", help="graph sizes in facts, comma-separated")
    parser.add_argument("--episodes", type=int, default=200, help="measured add_episode calls per size")
    parser.add_argument("--queries", type=int, default=200, help="measured searches per size")
    parser.add_argument("--warmup", type=int, default=5, help="unmeasured iterations before each measurement")
    parser.add_argument("--threads", type=int, default=1, help="InMemoryStore(threads=...) for the HNSW build")
    parser.add_argument(
        "--blas-threads",
        default=None,
        help="set OPENBLAS/OMP/MKL_NUM_THREADS (default: leave the environment alone); 1 makes search latency\n"
        "robust to other processes competing for the CPUs",
    )
    parser.add_argument("--quick", action="store_true", help="CI smoke: sizes 2000, 30 episodes, 30 queries")
    parser.add_argument("--profile", default="", help="cProfile at the largest size: 'add', 'search' or 'add,search'")
    parser.add_argument("--profile-calls", type=int, default=100, help="calls profiled per operation")
    parser.add_argument("--out", default=str(OUT_DIR / "core.json"), help="where the JSON results go")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.episodes, args.queries = "2000", 30, 30
    try:
        args.sizes = [int(s.replace("_", "")) for s in str(args.sizes).split(",") if s.strip()]
    except ValueError:
        parser.error("--sizes takes comma-separated integers, e.g. 10000,100000")
    if not args.sizes or min(args.sizes) < 10:
        parser.error("--sizes needs sizes of at least 10 facts")
    if args.episodes < 1 or args.queries < 1 or args.warmup < 0:
        parser.error("--episodes and --queries must be >= 1, --warmup >= 0")
    args.profile = {p.strip() for p in args.profile.split(",") if p.strip()}
    if args.profile - {"add", "search"}:
        parser.error("--profile takes 'add', 'search' or 'add,search'")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    info = machine()
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    print(f"tkg {info['tkg']} core benchmark -- {started_at}")
    print(
        f"machine: {info['cpu_count']} CPUs ({info['cpus_usable']} usable), {info['processor']}, "
        f"{info['implementation']} {info['python']}, {info['platform']}"
    )
    print("packages: " + ", ".join(f"{k} {v}" for k, v in info["packages"].items()))
    blas = info["blas_threads_env"]["OPENBLAS_NUM_THREADS"] or "library default (env unset)"
    busy = info["others_cpu_busy_at_start"]
    print(
        f"BLAS threads: {blas}; CPU busy with other processes at start: "
        f"{'?' if busy is None else f'{busy:.0%}'}; load average: {info['load_average']}"
    )
    if busy is not None and busy > 0.2:
        print(
            "WARNING: the machine is busy. Latencies of numpy matrix products (brute-force vector search) can grow "
            "several-fold when BLAS threads compete with other processes; rerun on an idle machine or with "
            "--blas-threads 1."
        )
    print(
        f"config: sizes={','.join(map(str, args.sizes))} episodes={args.episodes} queries={args.queries} "
        f"warmup={args.warmup} embedder=HashEmbedder(dim={DIM}) store=InMemoryStore(threads={args.threads}) "
        f"blas_threads={args.blas_threads or 'default'} seed={SEED} group={GROUP!r}"
    )
    results = []
    for n in sorted(args.sizes):
        t = time.perf_counter()
        print(f"... N={n:,} facts", flush=True)
        results.append(bench_size(n, args))
        print(f"    done in {time.perf_counter() - t:.1f} s", flush=True)
    print_report(info, results, args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "bench": "core",
        "command": render.command_line(),
        "started": started_at,
        "seconds": time.perf_counter() - started,
        **contract(results, args),
        "benchmark": "core",
        "machine": info,
        "args": render.plain_args(args),
        "targets_ms": {"add_episode_engine_p50": TARGET_MS, "search_p95": TARGET_MS},
        "results": results,
        "elapsed_s": time.perf_counter() - started,
        "others_cpu_busy_at_end": others_cpu_busy(),
    }
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    busy_end = payload["others_cpu_busy_at_end"]
    print(f"CPU busy with other processes at end: {'?' if busy_end is None else f'{busy_end:.0%}'}")
    print(f"wrote {out} ({time.perf_counter() - started:.1f} s in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
