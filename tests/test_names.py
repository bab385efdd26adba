"""Names in every script: folding keeps the letters of every script, accents are a second, fuzzy key, and
entities with such names resolve the same through the memory as ASCII names do."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from tkg import FactInput, FixedClock, HashEmbedder, Kind, Memory
from tkg.models import Entity
from tkg.names import fold_accents, normalize_name
from tkg.resolution import fuzzy_form, judge, shingles

T = datetime(2024, 1, 1, tzinfo=UTC)


def entity(eid: str, name: str) -> Entity:
    return Entity(id=eid, group_id="g", name=name, created_at=T)


@pytest.mark.parametrize(
    ("name", "folded"),
    [
        ("Zoë", "zoe"),
        ("Łukasz", "łukasz"),
        ("José Álvarez-Núñez", "jose alvarez nunez"),
        ("Иван Петров", "иван петров"),
        ("Андрей", "андрей"),  # й is a letter of its own, not an accented и
        ("東京タワー", "東京タワー"),
        ("ガス", "ガス"),  # the dakuten makes another kana
        ("Straße", "strasse"),
    ],
)
def test_fuzzy_form_keeps_letters_of_every_script(name: str, folded: str) -> None:
    assert fuzzy_form(name) == folded
    assert shingles(name)  # never empty for a name with letters


def test_exact_key_keeps_accents_and_the_fuzzy_key_drops_them() -> None:
    assert normalize_name("Zoë") != normalize_name("Zoe")  # exact matches stay exact
    assert fold_accents(normalize_name("Zoë")) == normalize_name("Zoe")


def test_names_that_differ_only_in_non_ascii_letters_are_not_merged() -> None:
    # With ASCII-only folding both read "m ller gmbh" and merged without asking.
    verdict = judge("Möller Gmbh", [entity("m", "Müller GmbH")])
    assert verdict.match is None
    assert judge("Сергей Смирнов", [entity("i", "Иван Петров")]).reason == "new"
    assert judge("大阪タワー", [entity("t", "東京タワー")]).match is None


def test_accents_alone_do_not_make_another_entity() -> None:
    assert judge("Jose Alvarez", [entity("j", "José Álvarez")]).match == "j"
    assert judge("Иван Петров", [entity("i", "иван  петров")]).match == "i"  # case and spacing, exact
    assert judge("Zoe", [entity("z", "Zoë")]).reason == "ambiguous"  # too short to merge without asking


def test_memory_resolves_names_of_every_script() -> None:
    memory = Memory(embedder=HashEmbedder(), clock=FixedClock("2025-01-01T00:00:00Z"))
    memory.add_facts(
        [
            FactInput("Łukasz Nowak", "WORKS_AT", "Müller GmbH"),
            FactInput("Иван Петров", "LIVES_IN", "東京"),
            FactInput("José Álvarez", "KNOWS", "Zoë Kim"),
        ],
        group_id="g",
    )
    memory.add_facts(
        [
            FactInput("Łukasz Nowak", "KNOWS", "Иван Петров"),
            FactInput("Jose Alvarez", "WORKS_AT", "Möller GmbH"),
            FactInput("иван петров", "VISITED", "大阪"),
        ],
        group_id="g",
    )
    names = sorted(e.name for e in memory.records(Kind.ENTITY, ["g"]))  # type: ignore[union-attr]
    assert names == sorted(
        ["Łukasz Nowak", "Müller GmbH", "Иван Петров", "東京", "José Álvarez", "Zoë Kim", "Möller GmbH", "大阪"]
    )
    found = memory.find_entities("ИВАН ПЕТРОВ", group_ids=["g"])
    assert [e.name for e in found] == ["Иван Петров"]
