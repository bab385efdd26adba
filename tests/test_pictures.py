"""Pictures of memory: the fact timeline (PNG / SVG through matplotlib) and the neighbourhood page (offline HTML),
through the library and the ``tkg timeline`` / ``tkg graph`` commands; the page is also loaded in headless
Chromium when it is installed. The page's template, CSS and JS are package data (``tkg/pictures/assets``): checked
here to be inlined as they are, admitted by their hashes, and listed for the wheel."""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import importlib.util
import itertools
import json
import re
import sys
import tomllib
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from helpers_doors import load_in_chromium, needs_chromium

from tkg import FactInput, FixedClock, HashEmbedder, Memory, Ontology, RelationType
from tkg.cli import main
from tkg.errors import ConfigurationError, NotFoundError, TimestampError, ValidationError
from tkg.models import Entity, Fact
from tkg.pictures import (
    MAX_TIMELINE_FACTS,
    find_entity,
    layout_timeline,
    neighbourhood_layout,
    render_neighbourhood,
    render_timeline,
    timeline_layout,
)

EVIL = "</script><img src=x onerror=alert(1)>"
MATHY = "Price $5 and $10 ^_^ \\alpha"  # matplotlib would read "$...$" as mathtext
T1 = "2024-05-01T00:00:00Z"
T2 = datetime(2024, 5, 31, tzinfo=UTC)  # when the second batch arrives


def at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def build() -> tuple[Memory, FixedClock]:
    """Ann's history: a move (the Oslo fact is superseded a month later), a job that ended, an incoming fact, and
    two entities whose names are hostile to HTML and to matplotlib."""
    clock = FixedClock(T1)
    memory = Memory(
        embedder=HashEmbedder(dim=32),
        clock=clock,
        ontology=Ontology(relations={"LIVES_IN": RelationType(single_valued=True)}),
    )
    memory.add_facts(
        [
            FactInput("Ann", "LIVES_IN", "Oslo", valid_at="2019-01-01T00:00:00Z"),
            FactInput("Ann", "WORKS_AT", "Acme", valid_at="2018-01-01T00:00:00Z", invalid_at="2022-01-01T00:00:00Z"),
            FactInput("Bob", "KNOWS", "Ann", valid_at="2015-01-01T00:00:00Z"),
            FactInput("Bob", "LIVES_IN", "Bergen", valid_at="2016-01-01T00:00:00Z"),
        ],
        group_id="g",
    )
    clock.advance(days=30)
    memory.add_facts(
        [
            FactInput("Ann", "LIVES_IN", "Bergen", valid_at="2023-06-01T00:00:00Z"),
            FactInput("Ann", "OWNS", EVIL, fact=f"Ann owns {EVIL}\nwith a newline", valid_at="2021-06-01T00:00:00Z"),
            FactInput("Ann", "LIKES", MATHY, valid_at="2022-02-02T00:00:00Z"),
        ],
        group_id="g",
    )
    return memory, clock


@pytest.fixture
def graph() -> tuple[Memory, str]:
    memory, _ = build()
    return memory, find_entity(memory, "Ann").id


def fact_by(memory: Memory, entity_id: str, relation: str, other: str) -> Fact:
    for fact in memory.facts_about(entity_id):
        ends = {memory.get("entity", fact.source_id).name, memory.get("entity", fact.target_id).name}  # type: ignore[attr-defined]
        if fact.relation == relation and other in ends:
            return fact
    raise AssertionError(f"no {relation} {other} fact")


# -- the timeline layout (pure, no matplotlib) -------------------------------------------------------------------


def test_timeline_layout_has_one_bar_per_fact_with_both_timelines(graph: tuple[Memory, str]) -> None:
    memory, ann = graph
    layout = timeline_layout(memory, ann)
    assert {b.fact_id for b in layout.bars} == {f.id for f in memory.facts_about(ann)}
    assert len(layout.bars) == 6 and layout.total == 6 and layout.omitted == 0
    starts = [b.valid_at for b in layout.bars]
    assert starts == sorted(starts)  # oldest first
    by_label = {b.label: b for b in layout.bars}
    oslo = by_label["LIVES_IN → Oslo"]
    assert oslo.status == "superseded"
    assert oslo.invalid_at == at("2023-06-01T00:00:00Z") and oslo.expired_at == T2 and not oslo.open_end
    assert oslo.created_at == at(T1)
    assert by_label["WORKS_AT → Acme"].status == "ended" and by_label["WORKS_AT → Acme"].expired_at is None
    bergen = by_label["LIVES_IN → Bergen"]
    assert bergen.status == "current" and bergen.open_end and bergen.end == layout.x_max
    incoming = by_label["KNOWS ← Bob"]
    assert not incoming.outgoing and incoming.other_name == "Bob"
    owns = next(b for b in layout.bars if b.relation == "OWNS")
    assert "\n" not in owns.text and owns.text.startswith("Ann owns </script>")
    assert layout.x_min < min(b.start for b in layout.bars) and layout.x_max > max(b.created_at for b in layout.bars)


def test_timeline_known_at_shows_the_memory_before_it_learnt_of_the_move(graph: tuple[Memory, str]) -> None:
    memory, ann = graph
    layout = timeline_layout(memory, ann, known_at="2024-05-15T00:00:00Z")
    assert len(layout.bars) == 3  # the second batch was not recorded yet
    oslo = next(b for b in layout.bars if b.label == "LIVES_IN → Oslo")
    assert oslo.status == "current" and oslo.invalid_at is None and oslo.expired_at is None and oslo.open_end


def test_timeline_as_of_flags_what_held_then(graph: tuple[Memory, str]) -> None:
    memory, ann = graph
    layout = timeline_layout(memory, ann, as_of="2020-06-01T00:00:00Z")
    held = {b.label for b in layout.bars if b.holds_at_as_of}
    assert held == {"KNOWS ← Bob", "WORKS_AT → Acme", "LIVES_IN → Oslo"}
    assert all(b.holds_at_as_of is None for b in timeline_layout(memory, ann).bars)


def test_timeline_layout_caps_at_the_most_recent_facts() -> None:
    now = datetime(2024, 1, 1, tzinfo=UTC)
    ann = Entity(id="ann", group_id="g", name="Ann", created_at=now)
    others = {f"e{i}": Entity(id=f"e{i}", group_id="g", name=f"Thing {i}", created_at=now) for i in range(250)}
    facts = [
        Fact(
            id=f"f{i:03d}",
            group_id="g",
            source_id="ann",
            target_id=f"e{i}",
            relation="OWNS",
            fact=f"Ann owns thing {i}",
            created_at=now,
            valid_at=now - timedelta(days=1000 - i),
        )
        for i in range(250)
    ]
    layout = layout_timeline(ann, facts, others, now=now)
    assert len(layout.bars) == MAX_TIMELINE_FACTS and layout.total == 250 and layout.omitted == 50
    assert layout.bars[0].fact_id == "f050" and layout.bars[-1].fact_id == "f249"  # the newest 200, oldest first
    assert [b.row for b in layout.bars] == list(range(MAX_TIMELINE_FACTS))


# -- the timeline picture ---------------------------------------------------------------------------------------

needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None,
    reason='matplotlib is not installed (pip install "tkg[pictures]")',
)


def bar_patches(figure: Any) -> list[Any]:
    from matplotlib.patches import Rectangle

    return [
        p
        for ax in figure.axes
        for p in ax.patches
        if isinstance(p, Rectangle) and str(p.get_gid()).startswith("tkg-bar-")
    ]


@needs_matplotlib
def test_png_timeline_has_a_bar_per_fact_and_marks_the_superseded_one(
    graph: tuple[Memory, str], tmp_path: Path
) -> None:
    import matplotlib.image

    memory, ann = graph
    out = tmp_path / "ann.png"
    result = render_timeline(memory, ann, out)
    assert result.format == "png" and result.path == out and out.read_bytes() == result.data
    pixels = matplotlib.image.imread(out)
    assert pixels.shape[1] == 1200 and pixels.shape[0] == round((1.45 + 6 * 0.36 + 0.75) * 100)
    assert pixels[..., :3].std() > 0.05  # something was drawn, not a blank canvas
    bars = bar_patches(result.figure)
    assert sorted(p.get_gid() for p in bars) == sorted(f"tkg-bar-{f.id}" for f in memory.facts_about(ann))
    oslo = fact_by(memory, ann, "LIVES_IN", "Oslo")
    hatched = [p.get_gid() for p in bars if p.get_hatch()]
    assert hatched == [f"tkg-bar-{oslo.id}"]
    markers = [line.get_gid() for ax in result.figure.axes for line in ax.lines if line.get_gid()]
    assert markers.count(f"tkg-invalid-{oslo.id}") == 1
    assert sum(1 for m in markers if m.startswith("tkg-invalid-")) == 1  # only the superseded fact gets the cross
    assert sum(1 for m in markers if m.startswith("tkg-tx-")) == 6  # a transaction lane per fact
    assert sum(1 for m in markers if m.startswith("tkg-open-")) == 4  # KNOWS, OWNS, LIKES, LIVES_IN Bergen
    texts = [t.get_text() for ax in result.figure.axes for t in ax.texts]
    assert any(MATHY in t for t in texts)  # drawn literally, not parsed as mathtext


@needs_matplotlib
def test_svg_timeline_names_every_bar_and_is_byte_stable(graph: tuple[Memory, str], tmp_path: Path) -> None:
    memory, ann = graph
    result = render_timeline(memory, ann, tmp_path / "ann.svg", as_of="2020-06-01T00:00:00Z")
    svg = (tmp_path / "ann.svg").read_text(encoding="utf-8")
    facts = memory.facts_about(ann)
    assert svg.count('id="tkg-bar-') == len(facts) == 6
    for fact in facts:
        assert f'id="tkg-bar-{fact.id}"' in svg
    oslo = fact_by(memory, ann, "LIVES_IN", "Oslo")
    assert f'id="tkg-invalid-{oslo.id}"' in svg and 'id="tkg-as-of"' in svg
    assert "<dc:date>" not in svg and "<img" not in svg and EVIL not in svg  # the name is escaped in comments
    again = render_timeline(memory, ann, "svg", as_of="2020-06-01T00:00:00Z")
    assert again.data == result.data and again.path is None
    png = [render_timeline(memory, ann, "png").data for _ in range(2)]
    assert png[0] == png[1] and png[0].startswith(b"\x89PNG")


@needs_matplotlib
def test_timeline_bytes_only_and_explicit_format(
    graph: tuple[Memory, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory, ann = graph
    monkeypatch.chdir(tmp_path)
    result = render_timeline(memory, ann, "SVG")
    assert result.path is None and result.data.lstrip().startswith(b"<?xml") and list(tmp_path.iterdir()) == []
    written = render_timeline(memory, ann, tmp_path / "ann.image", format="png")
    assert written.format == "png" and (tmp_path / "ann.image").read_bytes().startswith(b"\x89PNG")


@needs_matplotlib
def test_timeline_leaves_global_matplotlib_state_alone(graph: tuple[Memory, str]) -> None:
    import matplotlib

    memory, ann = graph
    before = dict(matplotlib.rcParams)
    backend = matplotlib.get_backend()
    render_timeline(memory, ann, "svg")
    assert dict(matplotlib.rcParams) == before and matplotlib.get_backend() == backend


@needs_matplotlib
def test_timeline_cap_is_noted_in_the_picture(tmp_path: Path) -> None:
    memory = Memory(embedder=HashEmbedder(dim=32), clock=FixedClock(T1))
    memory.add_facts(
        [FactInput("Ann", "VISITED", f"Place {i}", valid_at=f"20{10 + i}-01-01T00:00:00Z") for i in range(12)],
        group_id="g",
    )
    result = render_timeline(memory, find_entity(memory, "Ann").id, "png", max_facts=5)
    assert len(bar_patches(result.figure)) == 5 and result.layout.omitted == 7
    notes = [t.get_text() for t in result.figure.texts]
    assert any("showing the 5 most recent of 12 facts (7 left out)" in t for t in notes)
    assert [b.other_name for b in result.layout.bars] == [f"Place {i}" for i in range(7, 12)]


def test_timeline_errors_write_nothing(graph: tuple[Memory, str], tmp_path: Path) -> None:
    memory, ann = graph
    with pytest.raises(NotFoundError, match="no entity with id 'nobody'"):
        render_timeline(memory, "nobody", tmp_path / "x.png")
    with pytest.raises(ValidationError, match=r"name it \.png or \.svg"):
        render_timeline(memory, ann, tmp_path / "x.jpg")
    with pytest.raises(ValidationError, match=r"named \.png but format='svg'"):
        render_timeline(memory, ann, tmp_path / "x.png", format="svg")
    with pytest.raises(ValidationError, match="does not exist"):
        render_timeline(memory, ann, tmp_path / "missing" / "x.png")
    with pytest.raises(ValidationError, match="it is a directory"):
        render_timeline(memory, ann, tmp_path, format="png")
    with pytest.raises(TimestampError, match="naive"):
        render_timeline(memory, ann, tmp_path / "x.png", as_of=datetime(2020, 1, 1))
    with pytest.raises(ValidationError, match="max_facts"):
        render_timeline(memory, ann, tmp_path / "x.png", max_facts=0)
    with pytest.raises(NotFoundError, match="after known_at"):
        render_timeline(memory, ann, tmp_path / "x.png", known_at="2020-01-01T00:00:00Z")
    assert list(tmp_path.iterdir()) == []


def test_timeline_without_matplotlib_names_the_extra(
    graph: tuple[Memory, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory, ann = graph
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    with pytest.raises(ConfigurationError, match=re.escape('pip install "tkg[pictures]"')):
        render_timeline(memory, ann, tmp_path / "x.png")
    assert list(tmp_path.iterdir()) == []
    page = render_neighbourhood(memory, ann, tmp_path / "n.html")  # the HTML page needs no matplotlib
    assert page.path is not None and page.path.exists()


# -- the neighbourhood page ---------------------------------------------------------------------------------------


class Dom(HTMLParser):
    """Elements of an HTML document with their attributes, and the text of each element kind."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str]]] = []
        self.text: dict[str, list[str]] = {}
        self._open: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, {k: v or "" for k, v in attrs}))
        self._open.append(tag)

    def handle_endtag(self, tag: str) -> None:
        while self._open and self._open.pop() != tag:
            pass

    def handle_data(self, data: str) -> None:
        if self._open:
            self.text.setdefault(self._open[-1], []).append(data)

    def tags(self, name: str, **attrs: str) -> list[dict[str, str]]:
        return [a for t, a in self.elements if t == name and all(a.get(k) == v for k, v in attrs.items())]


def page_data(text: str) -> dict[str, Any]:
    match = re.search(r'<script type="application/json" id="tkg-data">(.*?)</script>', text, re.S)
    assert match is not None
    return json.loads(match.group(1))  # type: ignore[no-any-return]


def test_neighbourhood_page_holds_every_node_and_fact(graph: tuple[Memory, str], tmp_path: Path) -> None:
    memory, ann = graph
    out = tmp_path / "ann.html"
    result = render_neighbourhood(memory, ann, out)
    text = out.read_text(encoding="utf-8")
    assert text == result.html and result.data == text.encode("utf-8")
    data = page_data(text)
    names = {n["name"] for n in data["nodes"]}
    assert names == {"Ann", "Oslo", "Acme", "Bob", "Bergen", EVIL, MATHY}  # depth 1
    assert {e["id"] for e in data["edges"]} == {f.id for f in memory.facts_about(ann)} | {
        fact_by(memory, find_entity(memory, "Bob").id, "LIVES_IN", "Bergen").id  # between two neighbours
    }
    oslo = fact_by(memory, ann, "LIVES_IN", "Oslo")
    edge = next(e for e in data["edges"] if e["id"] == oslo.id)
    assert edge["status"] == "superseded" and edge["relation"] == "LIVES_IN"
    assert (edge["valid_at"], edge["invalid_at"], edge["created_at"], edge["expired_at"]) == (
        "2019-01-01T00:00:00Z",
        "2023-06-01T00:00:00Z",
        "2024-05-01T00:00:00Z",
        "2024-05-31T00:00:00Z",
    )
    assert {e["status"] for e in data["edges"]} == {"current", "ended", "superseded"}
    centre = next(n for n in data["nodes"] if n["id"] == ann)
    assert (centre["x"], centre["y"], centre["hop"]) == (0.0, 0.0, 0)
    assert render_neighbourhood(memory, ann).html == text  # deterministic


def test_neighbourhood_page_is_offline_and_injection_safe(graph: tuple[Memory, str]) -> None:
    memory, ann = graph
    text = render_neighbourhood(memory, ann).html
    assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", text, re.I)
    dom = Dom(text)
    assert not [a for _, a in dom.elements if "src" in a or "href" in a]
    assert {t for t, _ in dom.elements} <= {
        "html", "head", "meta", "title", "style", "body", "header", "h1", "div", "main", "svg", "aside", "h2", "p",
        "span", "script",
    }  # fmt: skip
    assert len(dom.tags("script")) == 2 and "<img" not in text and EVIL not in text
    csp = dom.tags("meta", **{"http-equiv": "Content-Security-Policy"})[0]["content"]
    assert "default-src 'none'" in csp and "unsafe-inline" not in csp
    evil_page = render_neighbourhood(memory, find_entity(memory, EVIL).id).html
    assert EVIL not in evil_page and "&lt;/script&gt;&lt;img" in evil_page  # title and heading, escaped
    assert Dom(evil_page).text["h1"] == [EVIL]
    assert any(n["name"] == EVIL for n in page_data(evil_page)["nodes"])  # and the JSON gives it back intact


def test_neighbourhood_depth_limit_and_time(tmp_path: Path) -> None:
    memory = Memory(embedder=HashEmbedder(dim=32), clock=FixedClock(T1))
    chain = ["A", "B", "C", "D"]
    memory.add_facts(
        [FactInput(a, "NEXT_TO", b, valid_at="2020-01-01T00:00:00Z") for a, b in itertools.pairwise(chain)]
        + [FactInput("A", "KNOWS", f"Friend {i}", valid_at="2020-01-01T00:00:00Z") for i in range(5)]
        + [FactInput("A", "KNEW", "Old", valid_at="2010-01-01T00:00:00Z", invalid_at="2011-01-01T00:00:00Z")],
        group_id="g",
    )
    a = find_entity(memory, "A").id
    hops = {n.name: n.hop for n in neighbourhood_layout(memory, a, depth=2).nodes}
    assert hops == {"A": 0, "B": 1, "Old": 1, "C": 2} | {f"Friend {i}": 1 for i in range(5)}
    assert {n.name for n in neighbourhood_layout(memory, a, depth=3).nodes} >= {"D"}
    capped = neighbourhood_layout(memory, a, depth=2, limit=4)
    assert [n.name for n in capped.nodes] == ["A", "B", "Friend 0", "Friend 1"] and capped.omitted_nodes == 5
    assert "Old" not in {n.name for n in neighbourhood_layout(memory, a, as_of="2015-01-01T00:00:00Z").nodes}
    rings = neighbourhood_layout(memory, a, depth=2)
    radius = {n.hop: round((n.x**2 + n.y**2) ** 0.5) for n in rings.nodes}
    assert radius[0] == 0 < radius[1] < radius[2]
    with pytest.raises(ValidationError, match="depth"):
        render_neighbourhood(memory, a, tmp_path / "x.html", depth=0)
    with pytest.raises(NotFoundError):
        render_neighbourhood(memory, "nobody", tmp_path / "x.html")
    assert list(tmp_path.iterdir()) == []


def test_parallel_facts_are_bent_apart(graph: tuple[Memory, str]) -> None:
    memory, _ = graph
    memory.add_facts([FactInput("Bob", "VISITS", "Bergen"), FactInput("Bergen", "HOSTS", "Bob")], group_id="g")
    bob, bergen = find_entity(memory, "Bob").id, find_entity(memory, "Bergen").id
    edges = [e for e in neighbourhood_layout(memory, bob).edges if {e.source, e.target} == {bob, bergen}]
    assert sorted(e.relation for e in edges) == ["HOSTS", "LIVES_IN", "VISITS"]
    # Measured in one orientation (left of low id -> high id), the three curves sit at distinct offsets.
    low = min(bob, bergen)
    offsets = sorted(e.bend if e.source == low else -e.bend for e in edges)
    assert offsets == [-34.0, 0.0, 34.0]
    single = [e for e in neighbourhood_layout(memory, bob).edges if {e.source, e.target} != {bob, bergen}]
    assert single and all(e.bend == 0.0 for e in single)


# -- the page's assets (package data) ------------------------------------------------------------------------------

ASSETS = resources.files("tkg.pictures") / "assets"
ASSET_NAMES = ("neighbourhood.css", "neighbourhood.html", "neighbourhood.js")
PLACEHOLDERS = ("__CSP__", "__DATA__", "__HEADING__", "__SCRIPT__", "__STYLE__", "__SUBTITLE__", "__TITLE__")


def asset(name: str) -> str:
    return (ASSETS / name).read_text(encoding="utf-8")


def sha256_source(text: str) -> str:
    """A CSP hash source for ``text``, computed here rather than by tkg.pictures.page."""
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode("ascii") + "'"


def inline_parts(text: str) -> tuple[str, str, dict[str, list[str]]]:
    """A page's one inline style, its one executable script, and its Content-Security-Policy by directive."""
    styles = re.findall(r"<style>(.*?)</style>", text, re.S)
    scripts = re.findall(r"<script>(.*?)</script>", text, re.S)  # the data element has attributes
    assert len(styles) == 1 and len(scripts) == 1
    policy = Dom(text).tags("meta", **{"http-equiv": "Content-Security-Policy"})[0]["content"]
    directives = {part.split()[0]: part.split()[1:] for part in policy.split(";") if part.strip()}
    return styles[0], scripts[0], directives


def test_the_page_inlines_its_assets_and_its_policy_admits_exactly_them(graph: tuple[Memory, str]) -> None:
    memory, ann = graph
    page = render_neighbourhood(memory, ann).html
    style, script, policy = inline_parts(page)
    assert style == asset("neighbourhood.css") and script == asset("neighbourhood.js")
    assert policy["script-src"] == [sha256_source(script)] and policy["style-src"] == [sha256_source(style)]
    assert policy["default-src"] == policy["img-src"] == policy["base-uri"] == policy["form-action"] == ["'none'"]
    assert not [token for token in PLACEHOLDERS if token in page]


def test_the_template_holds_each_placeholder_once_flush_against_its_tags() -> None:
    template = asset("neighbourhood.html")
    assert sorted(re.findall(r"__[A-Z]+__", template)) == sorted(PLACEHOLDERS)
    # The policy hashes the asset's text, so the element must hold that text and nothing more (not even a newline).
    assert "<style>__STYLE__</style>" in template and "<script>__SCRIPT__</script>" in template


def test_names_that_look_like_placeholders_stay_names() -> None:
    memory = Memory(embedder=HashEmbedder(dim=32), clock=FixedClock(T1))
    name = "__SCRIPT__ __STYLE__ __CSP__ __DATA__"
    memory.add_facts([FactInput(name, "KNOWS", "__TITLE__", fact="__SCRIPT__ knows __HEADING__")], group_id="g")
    page = render_neighbourhood(memory, find_entity(memory, name).id).html
    style, script, _ = inline_parts(page)  # one style, one script: nothing was inlined twice
    assert style == asset("neighbourhood.css") and script == asset("neighbourhood.js")
    dom = Dom(page)
    assert dom.text["h1"] == [name] and dom.text["title"] == [f"{name}: neighbourhood (tkg)"]
    data = page_data(page)
    assert {n["name"] for n in data["nodes"]} == {name, "__TITLE__"}
    assert [e["fact"] for e in data["edges"]] == ["__SCRIPT__ knows __HEADING__"]


def test_the_assets_are_package_data_of_listed_packages() -> None:
    """An editable install finds the assets in the source tree whatever pyproject.toml says; a wheel holds only
    what it lists. So: the assets are where importlib.resources looks, and pyproject.toml lists them."""
    pyproject = Path(__file__).resolve().parents[1] / "pyproject.toml"
    setuptools = tomllib.loads(pyproject.read_text(encoding="utf-8"))["tool"]["setuptools"]
    assert {"tkg.pictures", "tkg.pictures.assets"} <= set(setuptools["packages"])
    globs = setuptools["package-data"]["tkg.pictures.assets"]
    for name in ASSET_NAMES:
        assert (ASSETS / name).is_file(), name
        assert any(fnmatch.fnmatch(name, pattern) for pattern in globs), f"{name} is not in the wheel's package data"


def test_missing_assets_say_to_reinstall(
    graph: tuple[Memory, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tkg.pictures import page

    memory, ann = graph
    (tmp_path / "assets").mkdir()
    monkeypatch.setattr(page.resources, "files", lambda _package: tmp_path)  # a package installed without them
    page._assets.cache_clear()
    try:
        with pytest.raises(ConfigurationError, match=r"missing from the installed tkg .*reinstall tkg"):
            render_neighbourhood(memory, ann, tmp_path / "ann.html")
    finally:
        page._assets.cache_clear()
    assert [item.name for item in tmp_path.iterdir()] == ["assets"]  # and nothing written


# -- finding entities ---------------------------------------------------------------------------------------------


def test_find_entity_by_id_name_alias_and_group() -> None:
    memory = Memory(embedder=HashEmbedder(dim=32), clock=FixedClock(T1))
    memory.add_facts([FactInput("Ann", "LIVES_IN", "Oslo")], group_id="one")
    memory.add_facts([FactInput("Ann", "LIVES_IN", "Rome")], group_id="two")
    ones = find_entity(memory, "Oslo")
    assert find_entity(memory, ones.id) is not None and find_entity(memory, ones.id).id == ones.id
    assert find_entity(memory, "oslo").id == ones.id  # falls back to ignoring case
    with pytest.raises(ValidationError, match="2 entities are named 'Ann'") as caught:
        find_entity(memory, "Ann")
    for group in ("one", "two"):
        assert f"group {group}" in str(caught.value)
    assert find_entity(memory, "Ann", group_ids=["two"]).group_id == "two"
    with pytest.raises(NotFoundError, match="'Zed'"):
        find_entity(memory, "Zed")
    with pytest.raises(ValidationError):
        find_entity(memory, "  ")


# -- headless Chromium ----------------------------------------------------------------------------------------------


@needs_chromium
def test_the_chromium_harness_sees_script_errors(tmp_path: Path) -> None:
    """The check below could fail: a page with a script error is caught by the same harness."""
    broken = tmp_path / "broken.html"
    broken.write_text("<!DOCTYPE html><svg id=graph></svg><script>undefinedFunction();</script>", encoding="utf-8")
    _, console = load_in_chromium(broken, tmp_path / "profile")
    assert any("Uncaught ReferenceError" in line for line in console)


@needs_chromium
def test_the_chromium_harness_sees_a_script_the_policy_refuses(graph: tuple[Memory, str], tmp_path: Path) -> None:
    """And a page whose policy does not admit its own script (a stale hash) is caught too, and draws nothing."""
    memory, ann = graph
    page = render_neighbourhood(memory, ann).html
    stale = re.sub(r"script-src 'sha256-[^']+'", "script-src 'sha256-c3RhbGU='", page)
    assert stale != page
    (tmp_path / "stale.html").write_text(stale, encoding="utf-8")
    dom_text, console = load_in_chromium(tmp_path / "stale.html", tmp_path / "profile")
    assert any("Content Security Policy" in line for line in console)
    assert "data-drawn" not in Dom(dom_text).tags("svg", id="graph")[0]


@needs_chromium
def test_neighbourhood_page_draws_in_headless_chromium(graph: tuple[Memory, str], tmp_path: Path) -> None:
    memory, ann = graph
    page = render_neighbourhood(memory, ann, tmp_path / "ann.html", depth=2)
    dom_text, console = load_in_chromium(tmp_path / "ann.html", tmp_path / "profile")
    assert console == []  # no script errors, no CSP violations, nothing logged
    dom = Dom(dom_text)
    layout = page.layout
    assert len(dom.tags("circle")) == len(layout.nodes) == 7
    assert len(dom.tags("path", **{"class": "line"})) == len(layout.edges)
    assert sorted(a["data-fact"] for a in dom.tags("g") if "data-fact" in a) == sorted(e.id for e in layout.edges)
    assert sorted(a["data-entity"] for a in dom.tags("g") if "data-entity" in a) == sorted(n.id for n in layout.nodes)
    svg = dom.tags("svg", id="graph")[0]
    assert svg["data-drawn"] == str(len(layout.nodes) + len(layout.edges)) and svg["viewbox"]
    assert not dom.tags("img")  # the hostile name stayed text
    assert EVIL in dom.text["text"] or any(EVIL[:20] in t for t in dom.text["text"])
    dashed = {a["class"] for a in dom.tags("g") if "data-fact" in a}
    assert {"edge superseded", "edge ended", "edge current"} <= dashed


# -- the command line -----------------------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.fixture
def demo_snapshot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "demo.tkg"
    code, _, err = run(capsys, "demo", "--snapshot", str(path), "--embedder", "hash", "--no-llm")
    assert code == 0, err
    return path


@needs_matplotlib
def test_cli_timeline_against_the_demo(demo_snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png, svg = tmp_path / "alice.png", tmp_path / "alice.svg"
    code, out, err = run(capsys, "timeline", "Alice", "--snapshot", str(demo_snapshot), "--out", str(png))
    assert code == 0, err
    assert png.read_bytes().startswith(b"\x89PNG") and "7 facts of Alice" in out
    code, out, err = run(
        capsys, "timeline", "alice", "--snapshot", str(demo_snapshot), "--out", str(svg), "--as-of", "2021-06-01",
        "--known-at", "2100-01-01",
    )  # fmt: skip
    assert code == 0, err
    assert svg.read_text(encoding="utf-8").count('id="tkg-bar-') == 7 and 'id="tkg-as-of"' in svg.read_text()


def test_cli_graph_against_the_demo(demo_snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_file = tmp_path / "alice.html"
    code, out, err = run(
        capsys, "graph", "Alice", "--snapshot", str(demo_snapshot), "--out", str(out_file), "--depth", "2"
    )
    assert code == 0, err
    data = page_data(out_file.read_text(encoding="utf-8"))
    names = {n["name"] for n in data["nodes"]}
    assert {"Alice", "Acme", "Globex", "Bob", "Carol", "Lumen Labs", "Boston Chess Club"} <= names
    assert "Austin" not in names  # three hops away
    assert f"{len(data['nodes'])} entities, {len(data['edges'])} facts within 2 hop(s) of Alice" in out
    assert any(e["status"] == "ended" for e in data["edges"])


def test_cli_picture_errors(demo_snapshot: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "x.html"
    code, _, err = run(capsys, "graph", "Nobody", "--snapshot", str(demo_snapshot), "--out", str(target))
    assert code == 2 and "no entity has the id, name or alias 'Nobody'" in err
    code, _, err = run(capsys, "graph", "Alice", "--snapshot", str(demo_snapshot), "--out", str(target), "--depth", "9")
    assert code == 2 and "depth must be an integer from 1 to 3" in err
    code, _, err = run(capsys, "timeline", "Alice", "--snapshot", str(demo_snapshot), "--out", str(tmp_path / "a.gif"))
    assert code == 2 and "name it .png or .svg" in err
    code, _, err = run(capsys, "timeline", "Alice", "--snapshot", str(tmp_path / "none.tkg"), "--out", str(target))
    assert code == 2 and "does not exist" in err
    code, _, err = run(
        capsys, "timeline", "Alice", "--snapshot", str(demo_snapshot), "--out", str(tmp_path / "a.png"),
        "--as-of", "yesterday",
    )  # fmt: skip
    assert code == 2 and "--as-of 'yesterday' is not an ISO-8601" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.tkg"]


def test_cli_ambiguous_name_lists_the_candidates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    memory = Memory(embedder=HashEmbedder(dim=48), clock=FixedClock(T1))
    memory.add_facts([FactInput("Ann", "LIVES_IN", "Oslo")], group_id="one")
    memory.add_facts([FactInput("Ann", "LIVES_IN", "Rome")], group_id="two")
    snapshot = tmp_path / "two.tkg"
    memory.save(snapshot)
    ids = [find_entity(memory, "Ann", group_ids=[group]).id for group in ("one", "two")]
    target = tmp_path / "ann.html"
    code, _, err = run(capsys, "graph", "Ann", "--snapshot", str(snapshot), "--out", str(target))
    assert code == 2 and "2 entities are named 'Ann'" in err
    assert f"(id {ids[0]}, group one)" in err and f"(id {ids[1]}, group two)" in err
    assert not target.exists()
    code, _, err = run(capsys, "graph", "Ann", "--snapshot", str(snapshot), "--out", str(target), "--group", "two")
    assert code == 0, err
    assert {n["name"] for n in page_data(target.read_text(encoding="utf-8"))["nodes"]} == {"Ann", "Rome"}


@pytest.mark.slow
def test_readme_commands_against_the_default_demo(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's copy-paste lines: the demo with its default embedder, then both pictures of Alice."""
    snapshot = tmp_path / "demo.tkg"
    assert run(capsys, "demo", "--snapshot", str(snapshot), "--no-llm")[0] == 0
    code, _, err = run(capsys, "graph", "Alice", "--snapshot", str(snapshot), "--out", str(tmp_path / "alice.html"))
    assert code == 0, err
    if importlib.util.find_spec("matplotlib") is not None:
        code, _, err = run(
            capsys, "timeline", "Alice", "--snapshot", str(snapshot), "--out", str(tmp_path / "alice.svg"),
            "--as-of", "2021-06-01",
        )  # fmt: skip
        assert code == 0, err
        assert (tmp_path / "alice.svg").read_text(encoding="utf-8").count('id="tkg-bar-') == 7


@needs_matplotlib
def test_timelines_drawn_from_several_threads_match_one_drawn_alone(graph: tuple[Memory, str]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    memory, ann = graph
    alone = render_timeline(memory, ann, "svg").data
    with ThreadPoolExecutor(max_workers=4) as pool:
        drawn = list(pool.map(lambda _: render_timeline(memory, ann, "svg").data, range(4)))
    assert drawn == [alone] * 4


@needs_matplotlib
@pytest.mark.parametrize(
    ("valid_at", "invalid_at"), [("0041-01-24T00:00:00Z", "0054-10-13T00:00:00Z"), ("9999-11-01T00:00:00Z", None)]
)
def test_timeline_of_facts_at_the_ends_of_the_calendar(valid_at: str, invalid_at: str | None) -> None:
    """A fact tkg accepts is drawn, however early or late: the axis is padded within the dates Python holds (a
    fact of the first century raised a raw OverflowError)."""
    memory = Memory(embedder=HashEmbedder(dim=32), clock=FixedClock("2024-05-01T00:00:00Z"))
    memory.add_facts([FactInput("Claudius", "RULED", "Rome", valid_at=valid_at, invalid_at=invalid_at)], group_id="g")
    entity = memory.find_entities("Claudius", group_ids=["g"])[0]
    result = render_timeline(memory, entity.id, "svg")
    assert result.data.lstrip().startswith(b"<?xml") and b"RULED" in result.data
