"""Export and import: tkg's JSONL rebuilds the same memory (every record, timestamp and vector), bad imports
change nothing, and the CSV, GraphML and Neo4j files hold what other tools expect."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from tkg import FactInput, FixedClock, HashEmbedder, Kind, Memory, Ontology, RelationType
from tkg.cli import main
from tkg.codec import encode_record
from tkg.errors import ConfigurationError, ValidationError

EMB = HashEmbedder(dim=32)
HOMES = Ontology(relations={"LIVES_IN": RelationType(single_valued=True)})


def memory_with_history(embedder: HashEmbedder = EMB) -> Memory:
    memory = Memory(embedder=embedder, clock=FixedClock("2025-01-01T00:00:00Z"), ontology=HOMES)
    for group in ("ann", "bob"):
        memory.add_facts(
            [
                FactInput("Ann", "LIVES_IN", "Oslo", valid_at="2020-01-01T00:00:00Z"),
                FactInput("Ann", "LIVES_IN", "Rome", valid_at="2022-01-01T00:00:00Z"),  # Oslo ends: history
                FactInput("Ann", "KNOWS", "Zoë Müller"),
            ],
            group_id=group,
        )
        memory.add_episode("Ann: Zoë visited me last weekend.", group_id=group, extract=False)
        memory.refresh_communities(group)
    return memory


def dump(memory: Memory) -> dict[str, list[Any]]:
    return {
        kind.value: sorted(
            (json.dumps(encode_record(r, json=True), sort_keys=True) for r in memory.records(kind)),
        )
        for kind in Kind
    }


def test_jsonl_rebuilds_the_same_memory(tmp_path: Path) -> None:
    memory = memory_with_history()
    out = tmp_path / "all.jsonl"
    written = memory.export(out)
    assert written == sum(len(v) for v in dump(memory).values())
    copy = Memory(embedder=EMB, clock=FixedClock("2025-01-01T00:00:00Z"), ontology=HOMES)
    imported = copy.import_jsonl(out)
    assert dump(copy) == dump(memory)  # every record, every timestamp, every vector
    assert imported["fact"] == 6 and imported["community"] >= 2
    for as_of in (None, "2021-01-01T00:00:00Z"):
        a = memory.search("where does Ann live?", group_ids=["ann"], as_of=as_of)
        b = copy.search("where does Ann live?", group_ids=["ann"], as_of=as_of)
        assert [(s.record.id, s.score) for s in a.facts] == [(s.record.id, s.score) for s in b.facts]
    one = tmp_path / "bob.jsonl"
    memory.export(one, group_ids=["bob"])
    alone = Memory(embedder=EMB)
    alone.import_jsonl(one)
    assert alone.groups() == ["bob"] and len(alone.records(Kind.FACT)) == 3


def test_a_bad_import_changes_nothing(tmp_path: Path) -> None:
    memory = memory_with_history()
    out = tmp_path / "all.jsonl"
    memory.export(out)
    before = dump(memory)
    with pytest.raises(ValidationError, match="already hold records"):
        memory.import_jsonl(out)  # its groups are here already
    assert dump(memory) == before
    # an export edited to another group and imported back: its ids are in use, and would move ann's records
    memory.export(out, group_ids=["ann"])
    renamed = tmp_path / "renamed.jsonl"
    renamed.write_text(out.read_text().replace('"group_id": "ann"', '"group_id": "ann-copy"'))
    assert '"ann-copy"' in renamed.read_text()
    with pytest.raises(ValidationError, match="in use in this memory"):
        memory.import_jsonl(renamed)
    assert dump(memory) == before and memory.groups() == ["ann", "bob"]
    with pytest.raises(ConfigurationError, match="embedder"):
        Memory(embedder=HashEmbedder(dim=16)).import_jsonl(out)
    lines = out.read_text().splitlines()
    broken = tmp_path / "broken.jsonl"
    broken.write_text("\n".join([*lines[:5], '{"kind": "fact", "record": {"id": 3}}', *lines[5:]]) + "\n")
    fresh = Memory(embedder=EMB)
    with pytest.raises(ValidationError, match=r"broken.jsonl:6"):
        fresh.import_jsonl(broken)
    assert fresh.groups() == []
    # a fact whose history attributes were edited into something tkg never writes
    facts_at = [i for i, line in enumerate(lines) if '"kind": "fact"' in line]
    assert facts_at
    for bad in (
        '"tkg.revisions": 3',
        '"tkg.ended_by_hand": [{"at": "x"}]',
        '"tkg.revisions": [{"invalid_at": "2024"}]',
        '"tkg.ended_by_hand": [{"at": "2020-01-01", "recorded_at": "2024-01-01T00:00:00+00:00", '
        '"previous_end": "2021-01-01T00:00:00"}]',  # a time without its offset
        '"tkg.restated_by": [{"episode": "e1"}]',  # when it was learnt is missing
    ):
        edited = tmp_path / "edited.jsonl"
        line = lines[facts_at[0]].replace('"attributes": {}', '"attributes": {' + bad + "}", 1)
        assert line != lines[facts_at[0]]
        edited.write_text("\n".join([*lines[: facts_at[0]], line, *lines[facts_at[0] + 1 :]]) + "\n")
        with pytest.raises(ValidationError, match=r"history attribute|malformed"):
            fresh.import_jsonl(edited)
        assert fresh.groups() == []
    snapshot = tmp_path / "m.tkg"  # a snapshot given for an export: binary, not UTF-8
    memory.save(snapshot)
    with pytest.raises(ValidationError, match="not UTF-8 text"):
        fresh.import_jsonl(snapshot)
    assert fresh.groups() == []
    twice = tmp_path / "twice.jsonl"
    twice.write_text("\n".join([*lines, lines[-1]]) + "\n")  # a record listed twice
    with pytest.raises(ValidationError, match="twice"):
        fresh.import_jsonl(twice)
    assert fresh.groups() == []
    (tmp_path / "plain.jsonl").write_text('{"fact": "not an export"}\n')
    with pytest.raises(ValidationError, match="not a tkg export"):
        fresh.import_jsonl(tmp_path / "plain.jsonl")
    with pytest.raises(ValidationError):
        memory.export(tmp_path / "missing" / "x.jsonl")
    with pytest.raises(ValidationError):
        memory.export(tmp_path / "x.xml", format="xml")
    assert not list(tmp_path.glob(".x*"))  # no temporary file left behind


def test_csv_graphml_and_neo4j_hold_the_graph(tmp_path: Path) -> None:
    import igraph

    memory = memory_with_history()
    memory.export(tmp_path / "facts.csv", "csv", ["ann"])
    rows = list(csv.DictReader((tmp_path / "facts.csv").open(encoding="utf-8")))
    assert len(rows) == 3
    oslo = next(r for r in rows if r["target"] == "Oslo")
    assert oslo["source"] == "Ann" and oslo["valid_at"].startswith("2020-01-01T00:00:00")
    assert oslo["invalid_at"].startswith("2022-01-01") and oslo["expired_at"]  # the history, not only the present
    assert any(r["target"] == "Zoë Müller" for r in rows)

    memory.export(tmp_path / "graph.graphml", "graphml", ["ann"])
    graph = igraph.Graph.Read_GraphML(str(tmp_path / "graph.graphml"))
    assert graph.vcount() == len(memory.records(Kind.ENTITY, ["ann"])) and graph.ecount() == 3
    assert sorted(graph.es["relation"]) == ["KNOWS", "LIVES_IN", "LIVES_IN"]
    assert "Zoë Müller" in graph.vs["name"]
    # control characters tkg stores (XML cannot hold them) are written as U+FFFD, not a failed export
    memory.add_facts([FactInput("Bell\x07", "KNOWS", "Unit\x1fSeparator", fact="Bell\x07 knows\x0b")], group_id="odd")
    memory.export(tmp_path / "odd.graphml", "graphml", ["odd"])
    odd = igraph.Graph.Read_GraphML(str(tmp_path / "odd.graphml"))
    assert sorted(odd.vs["name"]) == ["Bell\ufffd", "Unit Separator"]  # stored names: whitespace normalised
    assert odd.es["fact"] == ["Bell\ufffd knows"]

    memory.export(tmp_path / "neo4j", "neo4j", ["ann"])
    entities = list(csv.reader((tmp_path / "neo4j" / "entities.csv").open(encoding="utf-8")))
    facts = list(csv.reader((tmp_path / "neo4j" / "facts.csv").open(encoding="utf-8")))
    assert entities[0] == ["id:ID", "name", "group_id", "summary", ":LABEL"] and len(entities) == 5
    assert facts[0][:3] == [":START_ID", ":END_ID", ":TYPE"] and len(facts) == 4
    ids = {row[0] for row in entities[1:]}
    assert all(row[0] in ids and row[1] in ids for row in facts[1:])


def test_command_line_export_and_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    snap, copy, out = tmp_path / "m.tkg", tmp_path / "copy.tkg", tmp_path / "m.jsonl"
    memory_with_history(HashEmbedder()).save(snap)  # the command line's hash embedder (384-d)
    hashed = ["--embedder", "hash"]
    assert main(["export", "--snapshot", str(snap), "--out", str(out), *hashed]) == 0
    assert main(["import", str(out), "--snapshot", str(copy), *hashed]) == 0
    assert "imported" in capsys.readouterr().out
    original, rebuilt = Memory.load(snap, embedder=HashEmbedder()), Memory.load(copy, embedder=HashEmbedder())
    assert dump(rebuilt) == dump(original)
    assert main(["import", str(out), "--snapshot", str(copy), *hashed]) == 2  # its groups are there already
    assert "already hold records" in capsys.readouterr().err
    assert dump(Memory.load(copy, embedder=HashEmbedder())) == dump(original)
    csv_args = ["export", "--snapshot", str(snap), "--out", str(tmp_path / "f.csv"), "--format", "csv", *hashed]
    assert main([*csv_args, "--group", "nobody"]) == 2 and "nobody" in capsys.readouterr().err
    assert main([*csv_args, "--group", "ann"]) == 0 and len((tmp_path / "f.csv").read_text().splitlines()) == 4


@pytest.mark.parametrize("format", ["jsonl", "csv", "graphml"])
def test_an_export_to_a_directory_is_refused_naming_it(tmp_path: Path, format: str) -> None:
    """It failed at the rename with an OSError naming the temporary file ('.out.x1y2: Is a directory')."""
    with pytest.raises(ValidationError, match=f"cannot write {tmp_path}: it is a directory"):
        memory_with_history().export(tmp_path, format)
    assert list(tmp_path.iterdir()) == []  # no temporary file left either


def _edited(lines: list[str], kind: str, edit: Any) -> list[str]:
    """``lines`` with the record of the first line of ``kind`` replaced by ``edit(record)``."""
    at = next(i for i, line in enumerate(lines) if f'"kind": "{kind}"' in line)
    item = json.loads(lines[at])
    item["record"] = edit(item["record"])
    return [*lines[:at], json.dumps(item), *lines[at + 1 :]]


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("kind", "edit"),
    [
        ("episode", lambda r: {**r, "content": 5}),  # it was written, then failed in the text index: half applied
        ("episode", lambda r: {**r, "name": ["a"]}),  # it was imported, then no save worked
        ("entity", lambda r: {**r, "summary": {"a": 1}}),
        ("entity", lambda r: {**r, "aliases": [1]}),
        ("fact", lambda r: {**r, "fact": "Ann \ud800"}),  # a lone surrogate: saves and exports failed after
        ("fact", lambda r: {**r, "source_id": ["x"]}),
        ("fact", lambda r: {**r, "verdicts": ["x"]}),
        ("fact", lambda r: {**r, "valid_at": {"__dt__": 2**70}}),
        ("episode", lambda r: {**r, "attributes": {"n": 2**70}}),
        ("episode", lambda r: {**r, "attributes": _nested(600)}),
        ("mention", lambda r: {**r, "label": 3}),
        ("community", lambda r: {**r, "summary": None}),
        ("fact", lambda r: None),
    ],
)
def test_an_import_of_a_record_tkg_cannot_store_is_refused_whole(tmp_path: Path, kind: str, edit: Any) -> None:
    """A record with a field of the wrong type or text no store can write is refused with the line it is on,
    before anything is written: the memory, its journal and its files stay as they were, and the good file
    imports after it (such a record was written half, or whole and then made every save, or every open of a
    journalled memory, fail)."""
    source = memory_with_history()
    good = tmp_path / "good.jsonl"
    source.export(good, group_ids=["ann"])
    bad = tmp_path / "bad.jsonl"
    lines = _edited(good.read_text(encoding="utf-8").splitlines(), kind, edit)
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    path = tmp_path / "m.tkg"
    with Memory.open(path, embedder=EMB, ontology=HOMES) as memory:
        with pytest.raises(ValidationError, match=r"bad.jsonl:\d+: not a tkg record"):
            memory.import_jsonl(bad)
        assert memory.groups() == []
        memory.import_jsonl(good)
        expected = dump(memory)
    with Memory.open(path, embedder=EMB, ontology=HOMES) as reopened:
        assert dump(reopened) == expected


def test_a_failed_export_leaves_every_file_as_it_was(tmp_path: Path) -> None:
    """A neo4j export whose facts.csv cannot be written leaves entities.csv as it was (it was overwritten first,
    then a raw IsADirectoryError); a neo4j export to a plain file, or any export or import given something that
    is not a path, is a ValidationError."""
    memory = memory_with_history()
    folder = tmp_path / "neo4j"
    folder.mkdir()
    (folder / "entities.csv").write_text("old entities\n")
    (folder / "facts.csv").mkdir()  # cannot be replaced by a file
    with pytest.raises(ValidationError, match=r"facts.csv"):
        memory.export(folder, "neo4j")
    assert (folder / "entities.csv").read_text() == "old entities\n"
    assert sorted(p.name for p in folder.iterdir()) == ["entities.csv", "facts.csv"]  # no temporary left
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(ValidationError, match="is a file"):
        memory.export(plain, "neo4j")
    for bad in (5, "", "a\x00b"):
        with pytest.raises(ValidationError, match="path"):
            memory.export(bad)  # type: ignore[arg-type]
        with pytest.raises(ValidationError, match="path"):
            memory.import_jsonl(bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="path"):
        Memory.open(str(tmp_path / "a\x00b"), embedder=EMB)
    assert memory.export(folder / "facts.csv" / "all.jsonl") > 0  # and a good export still works


def test_exports_and_pictures_are_made_with_the_umask_s_permissions(tmp_path: Path) -> None:
    """They came out 0600 (tempfile.mkstemp's), whatever the umask: neo4j-admin import, running as its own user,
    could not read them, nor a web server the graph page."""
    import os

    from tkg.pictures import render_neighbourhood

    memory = memory_with_history()
    ann = memory.find_entities("Ann", group_ids=["ann"])[0]
    previous = os.umask(0o022)
    try:
        for format, name in (("jsonl", "m.jsonl"), ("csv", "m.csv"), ("graphml", "m.graphml"), ("neo4j", "neo")):
            memory.export(tmp_path / name, format=format)
        render_neighbourhood(memory, ann.id, tmp_path / "ann.html")
    finally:
        os.umask(previous)
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(written) == 6 and {oct(p.stat().st_mode & 0o777) for p in written} == {"0o644"}


def test_a_label_holding_the_separator_is_refused_and_an_llm_s_is_cut_there(tmp_path: Path) -> None:
    """ "Tea Lover;Admin" was stored as one label and came out as three in Neo4j's :LABEL column ('Admin' made up)."""
    from tkg import ScriptedLLM

    memory = Memory(embedder=EMB, clock=FixedClock("2025-01-01T00:00:00Z"))
    with pytest.raises(ValidationError, match="give one label"):
        memory.add_facts([FactInput("Ann", "LIKES", "Tea", subject_label="Tea Lover;Admin")], group_id="g")
    llm = ScriptedLLM([{"entities": [{"name": "Ann", "label": "Person;Admin"}], "facts": []}])
    memory = Memory(embedder=EMB, llm=llm, clock=FixedClock("2025-01-01T00:00:00Z"))
    memory.add_episode("Ann: hello", group_id="g")
    assert [e.labels for e in memory.records(Kind.ENTITY)] == [("Entity", "Person")]


def test_a_graphml_export_without_facts_or_entities_declares_its_attributes_as_text(tmp_path: Path) -> None:
    """igraph declared every attribute of an empty list boolean: tools that take the columns from the keys (Gephi)
    got boolean columns."""
    import igraph

    memory = Memory(embedder=EMB, clock=FixedClock("2025-01-01T00:00:00Z"))
    memory.export(tmp_path / "empty.graphml", format="graphml")
    memory.add_episode("Ann: hello", group_id="g", extract=False)  # an entity (the speaker), no fact
    memory.export(tmp_path / "nodes.graphml", format="graphml")
    for name in ("empty.graphml", "nodes.graphml"):
        text = (tmp_path / name).read_text(encoding="utf-8")
        assert 'attr.type="boolean"' not in text and text.count('attr.type="string"') == 12
        igraph.Graph.Read_GraphML(str(tmp_path / name))
