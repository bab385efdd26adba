"""The benchmark suite's renderer (benchmarks/render.py): tables, plots and RESULTS.md from a small JSON fixture,
and the runner's handling of missing, failing and mismatched benchmarks (benchmarks/run.py, no benchmark run)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import render  # noqa: E402

FIXTURE: dict[str, Any] = {
    "bench": "demo",
    "command": "python benchmarks/bench_demo.py --quick --out benchmarks/out/quick/demo.json",
    "machine": {
        "cpu_count": 2,
        "cpus_usable": 2,
        "processor": "x86_64",
        "implementation": "CPython",
        "python": "3.11.9",
        "platform": "Linux-6.1",
        "tkg": "0.1.0",
        "packages": {"numpy": "2.1.0"},
        "others_cpu_busy_at_start": 0.05,
        "load_average": [0.1, 0.2, 0.3],
    },
    "args": {"quick": True},
    "started": "2026-01-02T03:04:05+00:00",
    "seconds": 12.5,
    "tables": [
        {
            "title": "Engine | time",
            "columns": ["metric", "tkg", "graphiti", "ratio"],
            "rows": [["engine ms/episode p50", 1.234, 180.0, "146x"], ["episodes", 1000, None, "-"]],
            "notes": ["engine = wall minus time inside the fakes"],
        }
    ],
    "plots": [
        {
            "file": "latency.png",
            "title": "Latency against size",
            "x_label": "facts",
            "y_label": "ms",
            "log_x": True,
            "log_y": False,
            "x": [100, 1000, 10000],
            "series": {"tkg p50": [1.0, 1.5, 2.0], "graphiti p50": [150.0, 190.0, None]},
        }
    ],
    "targets": [
        {"name": "search p95 < 10 ms", "value": 7.1, "limit": 10.0, "unit": "ms", "pass": True},
        {"name": "engine 50x less", "value": 20.0, "limit": 50.0, "unit": "x", "pass": False},
        {"name": "1M facts snapshot", "value": None, "limit": 30.0, "unit": "s", "pass": None},
    ],
}


def fixture() -> dict[str, Any]:
    return copy.deepcopy(FIXTURE)


def test_format_cell_is_short_and_marks_missing_values() -> None:
    assert [render.format_cell(v) for v in (1234567, 1234.56, 12.345, 1.2345, 0.012345, 0.0, None, float("nan"))] == [
        "1,234,567",
        "1,235",
        "12.3",
        "1.23",
        "0.012",
        "0",
        "-",
        "-",
    ]
    assert render.format_cell(True) == "yes" and render.format_cell("146x") == "146x"


def test_text_table_aligns_columns_and_prints_notes() -> None:
    text = render.text_table(fixture()["tables"][0])
    lines = text.splitlines()
    assert lines[0] == "Engine | time"
    header, rule, first, second = lines[1:5]
    assert header.split() == ["metric", "tkg", "graphiti", "ratio"]
    # text columns start together, number columns end together
    assert header.index("ratio") == first.index("146x") == second.rindex("-")
    assert header.index("graphiti") + len("graphiti") == first.index("180") + 3 == second.rindex("-", 0, -3) + 1
    assert first.split()[-3:] == ["1.23", "180", "146x"]
    assert second.split()[-3:] == ["1,000", "-", "-"]
    assert set(rule.strip()) <= {"-", " "}
    assert lines[-1].strip() == "engine = wall minus time inside the fakes"


def test_markdown_table_escapes_pipes_and_right_aligns_numbers() -> None:
    text = render.markdown_table(fixture()["tables"][0])
    lines = text.splitlines()
    assert lines[0] == "| metric | tkg | graphiti | ratio |"
    assert lines[1] == "|---|---:|---:|---|"
    assert lines[2] == "| engine ms/episode p50 | 1.23 | 180 | 146x |"
    payload = fixture()
    payload["tables"][0]["rows"][0][0] = "a | b"
    assert "| a \\| b |" in render.markdown_table(payload["tables"][0])


def test_contract_problems_name_what_is_wrong() -> None:
    assert render.contract_problems(fixture()) == []
    assert render.contract_problems([1, 2]) == ["the file holds a JSON list, not an object"]
    broken = fixture()
    del broken["command"]
    broken["tables"][0]["rows"].append(["too", "short"])
    broken["plots"][0]["series"]["tkg p50"] = [1.0]
    problems = render.contract_problems(broken)
    assert "missing key 'command'" in problems
    assert any("row 2 does not have 4 cells" in p for p in problems)
    assert any("series 'tkg p50' does not have 3 values" in p for p in problems)


def test_load_result_refuses_bad_files(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(fixture()))
    assert render.load_result(good)["bench"] == "demo"
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(render.ContractError, match="cannot read a JSON result"):
        render.load_result(bad)
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"results": []}))
    with pytest.raises(render.ContractError, match="missing key 'bench'"):
        render.load_result(old)


def test_target_helper_passes_and_misses() -> None:
    assert render.target("a", 4.0, 5.0, "ms")["pass"] is True
    assert render.target("a", 5.0, 5.0, "ms")["pass"] is False
    assert render.target("a", 5.0, 5.0, "ms", strict=False)["pass"] is True
    assert render.target("a", 60.0, 50.0, "x", lower_is_better=False)["pass"] is True
    assert render.target("a", None, 5.0, "ms") == {"name": "a", "value": None, "limit": 5.0, "unit": "ms", "pass": None}


def test_command_line_is_relative_to_the_working_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "benchmarks").mkdir()
    monkeypatch.chdir(tmp_path)
    line = render.command_line([str(tmp_path / "benchmarks" / "bench_x.py"), "--quick", "--out", "a b.json"])
    assert line == "python benchmarks/bench_x.py --quick --out 'a b.json'"


def test_render_plot_writes_a_png_and_skips_missing_points(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = render.render_plot(fixture()["plots"][0], tmp_path / "p" / "latency.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = fixture()["plots"][0]
    bad["series"]["tkg p50"] = [1.0]
    with pytest.raises(render.ContractError, match="has 1 values for 3 x values"):
        render.render_plot(bad, tmp_path / "bad.png")
    assert not (tmp_path / "bad.png").exists()


def test_results_md_has_header_targets_tables_plots_and_missing(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rendered = render.render_results(
        [fixture()],
        tmp_path,
        title="tkg benchmarks: quick",
        command="python benchmarks/run.py --quick",
        date="2026-01-02T03:05:00+00:00",
        machine=FIXTURE["machine"],
        missing=[("graphiti", "benchmarks/bench_graphiti.py does not exist yet")],
    )
    text = rendered.results_md.read_text()
    assert rendered.results_md == tmp_path / "RESULTS.md"
    assert text.startswith("# tkg benchmarks: quick\n")
    assert "- Date: 2026-01-02T03:05:00+00:00" in text
    assert "- Command: `python benchmarks/run.py --quick`" in text
    assert "2 CPUs, x86_64, CPython 3.11.9, Linux-6.1" in text
    assert "1 PASS, 1 MISS, 1 not measured." in text
    assert "| demo | search p95 < 10 ms | 7.10 ms | 10.0 ms | PASS |" in text
    assert "| demo | engine 50x less | 20.0 x | 50.0 x | **MISS** |" in text
    assert "| demo | 1M facts snapshot | - | 30.0 s | - |" in text
    assert "- **graphiti**: benchmarks/bench_graphiti.py does not exist yet" in text
    assert f"`{FIXTURE['command']}`" in text
    assert "### Engine | time" in text and "| engine ms/episode p50 | 1.23 | 180 | 146x |" in text
    assert "![Latency against size](plots/demo_latency.png)" in text
    assert [p.name for p in rendered.plots] == ["demo_latency.png"]
    assert (tmp_path / "plots" / "demo_latency.png").exists()
    assert rendered.plot_errors == []
    assert "Not rerun" not in text
    mixed = render.results_markdown(
        [fixture()], title="t", command="c", date="d", machine=FIXTURE["machine"], reused=["demo", "other"]
    )
    assert "Not rerun by the command above, kept from earlier runs: demo. Each heading" in mixed


def test_results_md_notes_plots_it_could_not_draw(tmp_path: Path) -> None:
    payload = fixture()
    payload["plots"][0]["x"] = [1, 2]  # series of 3 values for 2 x: rejected, the rest still renders
    rendered = render.render_results([payload], tmp_path, title="t", command="c", date="d", machine={}, missing=[])
    text = rendered.results_md.read_text()
    assert "(plot 'Latency against size' not drawn)" in text
    assert len(rendered.plot_errors) == 1 and "demo" in rendered.plot_errors[0]
    assert "- Machine: not recorded" in text


# -- the runner, without running a benchmark -----------------------------------------------------------------


def test_runner_collects_only_valid_results_of_its_mode(tmp_path: Path) -> None:
    import run

    quick = fixture()
    quick["bench"] = "core"
    (tmp_path / "core.json").write_text(json.dumps(quick))
    full = fixture()
    full["bench"], full["args"] = "extraction", {"quick": False}
    (tmp_path / "extraction.json").write_text(json.dumps(full))
    (tmp_path / "throughput.json").write_text("[]")
    results, missing = run.collect(tmp_path, ["core", "extraction", "throughput", "scale"], quick=True)
    assert [r["bench"] for r in results] == ["core"]
    reasons = dict(missing)
    assert "comes from a full run" in reasons["extraction"]
    assert "not an object" in reasons["throughput"]
    assert "no result file" in reasons["scale"]


def test_runner_reports_a_missing_script_and_a_failing_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import run

    (tmp_path / "bench_ok.py").write_text(
        "import json, sys\n"
        "out = sys.argv[sys.argv.index('--out') + 1]\n"
        f"payload = {json.dumps(fixture())!r}\n"
        "data = json.loads(payload); data['bench'] = 'ok'\n"
        "open(out, 'w').write(json.dumps(data))\n"
        "print('... working')\n"
    )
    (tmp_path / "bench_boom.py").write_text("import sys\nprint('about to fail')\nsys.exit(3)\n")
    (tmp_path / "bench_liar.py").write_text("print('exits 0 but writes nothing')\n")
    monkeypatch.setattr(run, "HERE", tmp_path)
    monkeypatch.setattr(run, "ROOT", tmp_path)
    monkeypatch.setattr(
        run,
        "BENCHMARKS",
        (
            run.Benchmark("ok", "bench_ok.py"),
            run.Benchmark("boom", "bench_boom.py"),
            run.Benchmark("liar", "bench_liar.py"),
            run.Benchmark("absent", "bench_absent.py"),
        ),
    )
    monkeypatch.setattr(run, "BY_NAME", {b.name: b for b in run.BENCHMARKS})
    out_dir = tmp_path / "results"
    code = run.main(["--quick", "--json-dir", str(tmp_path / "json"), "--out-dir", str(out_dir), "--no-tables"])
    printed = capsys.readouterr()
    assert code == 1
    assert "FAILED: boom, liar" in printed.err
    assert "exit status 3" in printed.out and "about to fail" in printed.out  # the log's tail is shown
    assert "   ... working" in printed.out  # progress lines pass through
    assert "absent: missing" in printed.out
    text = (out_dir / "RESULTS.md").read_text()
    assert "## ok" in text and "## boom" not in text
    assert "- **boom**: exit status 3" in text
    assert "- **absent**: benchmarks/bench_absent.py does not exist yet" in text
    assert "- **liar**:" in text and "no such file" in text.lower()


def test_runner_stops_a_benchmark_past_its_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import run

    (tmp_path / "bench_slow.py").write_text("import time\nprint('... started', flush=True)\ntime.sleep(60)\n")
    monkeypatch.setattr(run, "HERE", tmp_path)
    monkeypatch.setattr(run, "ROOT", tmp_path)
    args = run.parse_args(["--quick", "--timeout", "1"])
    args.verbose = False
    outcome = run.run_one(run.Benchmark("slow", "bench_slow.py"), args, tmp_path)
    assert outcome.status == "FAILED"
    assert "timed out after 1 s" in outcome.detail
    assert outcome.seconds is not None and outcome.seconds < 15


def test_runner_skips_a_benchmark_whose_data_is_missing_and_passes_data_to_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import run

    (tmp_path / "bench_needs.py").write_text("raise SystemExit('must not run without its data')\n")
    (tmp_path / "bench_echo.py").write_text("import sys\nprint('argv', sys.argv[1:])\n")
    monkeypatch.setattr(run, "HERE", tmp_path)
    monkeypatch.setattr(run, "ROOT", tmp_path)
    empty = tmp_path / "nodata"
    empty.mkdir()
    args = run.parse_args(["--quick", "--data", str(empty)])
    args.verbose = False
    outcome = run.run_one(run.Benchmark("needs", "bench_needs.py", data="required"), args, tmp_path)
    assert outcome.status == "skipped" and "--data" in outcome.detail and "TKG_BENCH_DATA" in outcome.detail

    data = tmp_path / "data"
    (data / "locomo").mkdir(parents=True)
    args = run.parse_args(["--quick", "--data", str(data)])
    args.verbose = False
    run.run_one(run.Benchmark("echo", "bench_echo.py", data="optional"), args, tmp_path)
    assert "'--data', 'data'" in (tmp_path / "echo.log").read_text()  # relative to the checkout, never absolute


def test_data_folder_comes_from_the_argument_then_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shared_data

    there = tmp_path / "there"
    (there / "locomo").mkdir(parents=True)
    monkeypatch.setenv(shared_data.ENV, str(there))
    assert shared_data.data_dir() == there
    assert shared_data.data_dir(tmp_path) is None  # an explicit folder without locomo/ is not silently replaced
    assert shared_data.locomo_file() is None  # the folder is there, the file is not
    (there / shared_data.LOCOMO).write_text("[]")
    assert shared_data.locomo_file() == there / shared_data.LOCOMO


def test_results_carry_no_path_of_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    monkeypatch.chdir(tmp_path)  # the suite runs from the repository root
    args = argparse.Namespace(
        out=tmp_path / "out" / "x.json", data=str(tmp_path.parent / "shared"), sizes={3, 1}, dsn="postgresql://h/db"
    )
    plain = render.plain_args(args, leave_out=["dsn"])
    assert plain == {"out": "out/x.json", "data": "../shared", "sizes": [1, 3]}
    render.write_result(tmp_path / "out" / "x.json", {"args": plain})
    assert json.loads((tmp_path / "out" / "x.json").read_text()) == {"args": plain}


@pytest.mark.parametrize(
    ("variant", "subtitle"),
    [
        ("restate", "one statement restated in every episode"),
        ("moves", "a single-valued value changed in every episode"),
        ("changes", "a value changed in every episode, judged by the LLM"),
    ],
)
def test_hot_entity_variants_add_one_fact_an_episode_and_set_no_targets(
    tmp_path: Path, variant: str, subtitle: str
) -> None:
    """bench_hot_entity --restate / --moves / --changes: each message also restates "I KNOWS Bob." (all of them one
    statement) or says "I LIVES_IN city<i>." (a new one each time: single-valued, or judged by the LLM): a second
    fact of the user's an episode, and one LIVES_IN value holds; its tables say so and carry no targets, also when
    its JSON is rendered again with --reuse."""
    import bench_hot_entity

    (row,) = bench_hot_entity.run([30], 10, variant=variant)
    assert row["user_facts"] == 60 and row["block"] == 10
    assert row.get("holding") == (None if variant == "restate" else 1)  # one value of LIVES_IN holds
    assert bench_hot_entity.run([30], 10)[0]["user_facts"] == 30
    run = {**FIXTURE, "bench": "hot_entity", "started": "2026-11-28T10:00:00+00:00", "results": {"memory": [row]}}
    (tmp_path / "run.json").write_text(json.dumps({**run, "args": {variant: True}}))
    out = tmp_path / "out.json"
    bench_hot_entity.main(["--reuse", str(tmp_path / "run.json"), "--out", str(out)])
    payload = json.loads(out.read_text())
    assert payload["tables"][0]["title"].endswith(subtitle)
    assert payload["targets"] == []
    assert ("LIVES_IN values holding" in payload["tables"][0]["columns"]) == (variant != "restate")
    other = next(name for name in bench_hot_entity.VARIANTS if name != variant)
    with pytest.raises(SystemExit):  # a run of one variant is not shown as the other
        bench_hot_entity.main(["--reuse", str(tmp_path / "run.json"), f"--{other}", "--out", str(out)])


def test_hot_entity_shows_an_earlier_run_beside_a_measured_one(tmp_path: Path) -> None:
    """bench_hot_entity --reuse RUN --before OLD: the run's own tables and targets, and the earlier run's rows in
    tables of their own, without measuring anything again."""
    import bench_hot_entity

    def run(started: str, p50: float) -> dict[str, Any]:
        row = {"episodes": 1000, "user_facts": 1000, "p50_ms": p50, "p95_ms": 2 * p50, "max_ms": 3 * p50, "block": 200}
        return {**FIXTURE, "bench": "hot_entity", "started": started, "args": {}, "results": {"memory": [row]}}

    (tmp_path / "run.json").write_text(json.dumps(run("2026-11-27T10:00:00+00:00", 3.0)))
    (tmp_path / "old.json").write_text(json.dumps(run("2026-11-20T10:00:00+00:00", 40.0)))
    out = tmp_path / "out.json"
    bench_hot_entity.main(
        ["--reuse", str(tmp_path / "run.json"), "--before", str(tmp_path / "old.json"), "--out", str(out)]
    )
    payload = json.loads(out.read_text())
    assert payload["started"] == "2026-11-27T10:00:00+00:00"
    assert [t["rows"][0][2] for t in payload["tables"]] == [3.0, 40.0]
    assert payload["tables"][1]["title"].startswith("Before: the same benchmark on 2026-11-20")
    assert [t["pass"] for t in payload["targets"]] == [True, True]  # the run's targets only
