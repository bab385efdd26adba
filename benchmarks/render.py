"""Rendering of the benchmark JSON contract: printed tables, PNG plots and ``RESULTS.md``.

Every benchmark script writes one JSON object (see ``benchmarks/README.md``, "The JSON every benchmark writes"):
``bench``, ``command``, ``machine``, ``args``, ``started``, ``seconds``, and the parts rendered here --
``tables`` (title, columns, rows of numbers or short strings, notes), ``plots`` (x values and named series,
``null`` = not measured) and ``targets`` (name, value, limit, unit, pass).

This module is pure: it reads dicts and writes text and images, and imports neither tkg nor the benchmarks, so
the suite can re-render old results (``python benchmarks/run.py --render``) and its tests run in milliseconds.
matplotlib (the ``bench`` extra) is needed for plots only; without it the plots are skipped with a note.

Benchmark scripts use :func:`command_line` for their ``command`` key and :func:`print_tables` for their stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ContractError",
    "Rendered",
    "command_line",
    "contract_problems",
    "format_cell",
    "load_result",
    "markdown_table",
    "print_tables",
    "render_plot",
    "render_results",
    "results_markdown",
    "target",
    "text_table",
]

REQUIRED_KEYS = ("bench", "command", "machine", "args", "started", "seconds", "tables", "plots", "targets")


class ContractError(ValueError):
    """A result file that does not follow the JSON contract (the message says which key is wrong)."""


# ----------------------------------------------------------------------------------------------------------
# helpers for the benchmark scripts


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that is running, as a user would retype it: ``python benchmarks/bench_x.py --quick ...``.

    The script path is made relative to the current directory when it lies under it (the suite runs from the
    repository root), so the recorded command does not carry this machine's home directory.
    """
    args = list(sys.argv if argv is None else argv)
    if not args:
        return "python"
    script = Path(args[0])
    try:
        shown = str(script.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        shown = str(script)
    return " ".join(["python", shlex.quote(shown), *(shlex.quote(a) for a in args[1:])])


def portable(value: Any) -> Any:
    """``value`` as it may be recorded in a committed result: sets and tuples as lists, and a path of this machine
    (a :class:`~pathlib.Path`, or a string that is an absolute path) relative to the current directory, which is
    the repository root when the suite runs, so no home directory or checkout location travels with a result."""
    if isinstance(value, set | frozenset):
        return sorted(portable(v) for v in value)
    if isinstance(value, list | tuple):
        return [portable(v) for v in value]
    if isinstance(value, Path) or (isinstance(value, str) and os.path.isabs(value)):
        path = Path(value)
        return os.path.relpath(path, Path.cwd()) if path.is_absolute() else str(path)
    return value


def plain_args(args: argparse.Namespace, *, leave_out: Iterable[str] = ()) -> dict[str, Any]:
    """A benchmark's parsed arguments for its result (:func:`portable` values; ``leave_out`` names dropped)."""
    dropped = set(leave_out)
    return {k: portable(v) for k, v in vars(args).items() if k not in dropped}


def header(
    bench: str,
    args: argparse.Namespace,
    machine: Mapping[str, Any],
    started_at: str,
    started: float,
    *,
    leave_out: Iterable[str] = (),
) -> dict[str, Any]:
    """The fields every result JSON opens with: its name, the command, the machine, the arguments, when it started
    and how long it took (``started`` is the ``time.perf_counter()`` of the start)."""
    return {
        "bench": bench,
        "command": command_line(),
        "machine": machine,
        "args": plain_args(args, leave_out=leave_out),
        "started": started_at,
        "seconds": time.perf_counter() - started,
    }


def write_result(path: Path, payload: Mapping[str, Any]) -> None:
    """Write a benchmark's result JSON (creating its folder) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=str))
    print(f"wrote {path}")


def target(
    name: str, value: float | None, limit: float, unit: str, *, lower_is_better: bool = True, strict: bool = True
) -> dict[str, Any]:
    """One entry of a result's ``targets``: ``pass`` is None when the value was not measured.

    Lower is better by default: ``value < limit`` passes (``value <= limit`` with ``strict=False``, for "at
    most"); with ``lower_is_better=False``, ``value > limit`` (or ``>=``).

    >>> target("search p95 < 10 ms", 7.1, 10.0, "ms")["pass"], target("calls <= 2", 2.0, 2.0, "", strict=False)["pass"]
    (True, True)
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return {"name": name, "value": None, "limit": limit, "unit": unit, "pass": None}
    if lower_is_better:
        ok = value < limit if strict else value <= limit
    else:
        ok = value > limit if strict else value >= limit
    return {"name": name, "value": value, "limit": limit, "unit": unit, "pass": bool(ok)}


# ----------------------------------------------------------------------------------------------------------
# reading and checking


def contract_problems(payload: Any) -> list[str]:
    """What is wrong with a result object, as readable lines (empty when it follows the contract)."""
    if not isinstance(payload, Mapping):
        return [f"the file holds a JSON {type(payload).__name__}, not an object"]
    problems = [f"missing key {key!r}" for key in REQUIRED_KEYS if key not in payload]
    for i, table in enumerate(payload.get("tables") or []):
        if not isinstance(table, Mapping) or not isinstance(table.get("columns"), list):
            problems.append(f"tables[{i}] needs a 'columns' list")
            continue
        width = len(table["columns"])
        for j, row in enumerate(table.get("rows") or []):
            if not isinstance(row, list) or len(row) != width:
                problems.append(f"tables[{i}] ({table.get('title', '')!r}) row {j} does not have {width} cells")
    for i, plot in enumerate(payload.get("plots") or []):
        if not isinstance(plot, Mapping) or not plot.get("file") or not isinstance(plot.get("series"), Mapping):
            problems.append(f"plots[{i}] needs 'file' and a 'series' mapping")
            continue
        n = len(plot.get("x") or [])
        for name, values in plot["series"].items():
            if not isinstance(values, list) or len(values) != n:
                problems.append(f"plots[{i}] series {name!r} does not have {n} values (one per x)")
    for i, item in enumerate(payload.get("targets") or []):
        if not isinstance(item, Mapping) or "name" not in item or "pass" not in item:
            problems.append(f"targets[{i}] needs 'name' and 'pass'")
    return problems


def load_result(path: str | Path) -> dict[str, Any]:
    """Read one result file; :class:`ContractError` if it is not JSON or does not follow the contract."""
    path = Path(path)
    try:
        payload = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ContractError(f"{path}: cannot read a JSON result ({exc})") from None
    problems = contract_problems(payload)
    if problems:
        raise ContractError(f"{path}: " + "; ".join(problems))
    return payload  # type: ignore[no-any-return]


# ----------------------------------------------------------------------------------------------------------
# tables


def format_cell(value: Any) -> str:
    """A cell as text: thousands separators, about three significant digits, '-' for not measured."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        magnitude = abs(value)
        if magnitude == 0:
            return "0"
        if magnitude >= 100:
            return f"{value:,.0f}"
        if magnitude >= 10:
            return f"{value:.1f}"
        if magnitude >= 1:
            return f"{value:.2f}"
        if magnitude >= 0.001:
            return f"{value:.3f}"
        return f"{value:.2e}"
    return str(value)


def _is_numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def text_table(table: Mapping[str, Any]) -> str:
    """A table for the terminal: title, aligned columns (numbers right-aligned), notes underneath."""
    columns = [str(c) for c in table.get("columns", [])]
    rows = table.get("rows") or []
    cells = [[format_cell(v) for v in row] for row in rows]
    widths = [len(c) for c in columns]
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
    numeric = [any(_is_numeric(row[i]) for row in rows) and i > 0 for i in range(len(columns))]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric, strict=True)]
        return "  " + "  ".join(parts).rstrip()

    out = [str(table.get("title", "")), line(columns), "  " + "  ".join("-" * w for w in widths)]
    out.extend(line(row) for row in cells)
    out.extend(f"  {note}" for note in table.get("notes") or [])
    return "\n".join(out)


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(table: Mapping[str, Any]) -> str:
    """The same table as GitHub markdown (numbers right-aligned), notes as a paragraph underneath."""
    columns = [str(c) for c in table.get("columns", [])]
    rows = table.get("rows") or []
    numeric = [any(_is_numeric(row[i]) for row in rows) and i > 0 for i in range(len(columns))]
    out = ["| " + " | ".join(_md_escape(c) for c in columns) + " |"]
    out.append("|" + "|".join("---:" if num else "---" for num in numeric) + "|")
    for row in rows:
        out.append("| " + " | ".join(_md_escape(format_cell(v)) for v in row) + " |")
    notes = table.get("notes") or []
    if notes:
        out.append("")
        out.extend(f"{_md_escape(str(n))}  " for n in notes)
    return "\n".join(out)


def print_tables(payload: Mapping[str, Any], file: Any = None) -> None:
    """Print a result's tables and targets, as a benchmark script does at its end."""
    stream = file or sys.stdout
    for table in payload.get("tables") or []:
        print("\n" + text_table(table), file=stream)
    targets = payload.get("targets") or []
    if targets:
        print("\ntargets", file=stream)
        for item in targets:
            print(f"  {_verdict(item):<5} {item['name']}: {_target_value(item)}", file=stream)
    stream.flush()


def _verdict(item: Mapping[str, Any]) -> str:
    return "-" if item.get("pass") is None else ("PASS" if item["pass"] else "MISS")


def _target_value(item: Mapping[str, Any]) -> str:
    unit = f" {item['unit']}" if item.get("unit") else ""
    value = "not measured" if item.get("value") is None else f"{format_cell(item['value'])}{unit}"
    limit = "" if item.get("limit") is None else f" (limit {format_cell(item['limit'])}{unit})"
    return value + limit


# ----------------------------------------------------------------------------------------------------------
# plots


def plot_filename(bench: str, plot: Mapping[str, Any]) -> str:
    """Where a plot goes in the output directory: the benchmark's name keeps two benchmarks' files apart."""
    name = Path(str(plot["file"])).name
    return name if name.startswith(f"{bench}_") else f"{bench}_{name}"


def render_plot(plot: Mapping[str, Any], path: str | Path) -> Path:
    """Draw one plot of the contract as a PNG (matplotlib, Agg). ``None`` values are left out of their series.

    Raises :class:`ContractError` for a series whose length differs from ``x``, ImportError without matplotlib.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = list(plot.get("x") or [])
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    try:
        categorical = any(not _is_numeric(v) for v in x)
        colours: dict[str, str] = {}
        cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color", ["C0"])
        for name, values in (plot.get("series") or {}).items():
            if len(values) != len(x):
                raise ContractError(
                    f"plot {plot.get('file')!r}: series {name!r} has {len(values)} values for {len(x)} x values"
                )
            points = [(i if categorical else xv, v) for i, (xv, v) in enumerate(zip(x, values, strict=True))]
            points = [(px, v) for px, v in points if v is not None and not (isinstance(v, float) and math.isnan(v))]
            # "x p50" and "x p95" share a colour; a p95 (or max) line is dashed
            base, _, last = str(name).rpartition(" ")
            dashed = last in ("p95", "p99", "max")
            family = base if last in ("p50", "p95", "p99", "max", "mean") and base else str(name)
            colour = colours.setdefault(family, cycle[len(colours) % len(cycle)])
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker="o", label=str(name), color=colour, linestyle="--" if dashed else "-")
        if categorical:
            ax.set_xticks(range(len(x)), [str(v) for v in x])
        elif plot.get("log_x"):
            ax.set_xscale("log")
        if plot.get("log_y"):
            ax.set_yscale("log")
        ax.set_title(str(plot.get("title", "")))
        ax.set_xlabel(str(plot.get("x_label", "")))
        ax.set_ylabel(str(plot.get("y_label", "")))
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        fig.tight_layout()
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    finally:
        plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------------------
# RESULTS.md


@dataclass
class Rendered:
    """What :func:`render_results` wrote."""

    results_md: Path
    plots: list[Path] = field(default_factory=list)
    plot_errors: list[str] = field(default_factory=list)


def _machine_lines(machine: Mapping[str, Any]) -> list[str]:
    if not machine:
        return ["- Machine: not recorded"]
    cpus = machine.get("cpu_count")
    usable = machine.get("cpus_usable")
    parts = [
        f"{cpus} CPUs" + (f" ({usable} usable)" if usable not in (None, cpus) else ""),
        str(machine.get("processor", "")),
        f"{machine.get('implementation', 'Python')} {machine.get('python', '')}".strip(),
        str(machine.get("platform", "")),
    ]
    lines = ["- Machine: " + ", ".join(p for p in parts if p)]
    if machine.get("tkg"):
        packages = machine.get("packages") or {}
        lines.append(f"- tkg {machine['tkg']}; " + ", ".join(f"{k} {v}" for k, v in packages.items()))
    busy = machine.get("others_cpu_busy_at_start")
    if busy is not None:
        lines.append(
            f"- CPU busy with other processes when the suite started: {busy:.0%}; load average "
            f"{machine.get('load_average')}" + (" (numbers are noisy: the machine was shared)" if busy > 0.2 else "")
        )
    return lines


def results_markdown(
    results: Sequence[Mapping[str, Any]],
    *,
    title: str,
    command: str,
    date: str,
    machine: Mapping[str, Any],
    plot_files: Mapping[tuple[str, int], str] | None = None,
    missing: Iterable[tuple[str, str]] = (),
    reused: Iterable[str] = (),
) -> str:
    """The text of RESULTS.md: header (date, command, machine), all targets, then each benchmark's command,
    tables and plots. ``plot_files`` maps (bench, plot index) to the image's path relative to RESULTS.md (plots
    not in it are listed as not drawn); ``missing`` lists (benchmark, why) for benchmarks with no result;
    ``reused`` names the benchmarks whose results come from earlier runs than this one."""
    plot_files = plot_files or {}
    missing = list(missing)
    out = [f"# {title}", "", f"- Date: {date}", f"- Command: `{command}`", *_machine_lines(machine), ""]
    out.append(
        "Each section below is one benchmark script's JSON result, rendered by `benchmarks/render.py`; "
        "the command under each heading reruns that benchmark alone."
    )
    reused = set(reused)
    earlier = [r["bench"] for r in results if r["bench"] in reused]
    if earlier:  # a report put together from several runs (--only / --render)
        out.append(
            f"Not rerun by the command above, kept from earlier runs: {', '.join(earlier)}. Each heading gives when "
            "its benchmark started."
        )
    out.append("")
    all_targets = [(r["bench"], t) for r in results for t in r.get("targets") or []]
    out.append("## Targets")
    out.append("")
    if all_targets:
        passed = sum(1 for _, t in all_targets if t.get("pass") is True)
        missed = sum(1 for _, t in all_targets if t.get("pass") is False)
        out.append(f"{passed} PASS, {missed} MISS, {len(all_targets) - passed - missed} not measured.")
        out.append("")
        out.append("| benchmark | target | value | limit | result |")
        out.append("|---|---|---:|---:|---|")
        for bench, t in all_targets:
            unit = f" {t['unit']}" if t.get("unit") else ""
            value = "-" if t.get("value") is None else format_cell(t["value"]) + unit
            limit = "-" if t.get("limit") is None else format_cell(t["limit"]) + unit
            verdict = {True: "PASS", False: "**MISS**", None: "-"}[t.get("pass")]
            out.append(f"| {bench} | {_md_escape(str(t['name']))} | {value} | {limit} | {verdict} |")
    else:
        out.append("No benchmark in this run declared targets.")
    out.append("")
    if missing:
        out.append("## Benchmarks without results")
        out.append("")
        for bench, why in missing:
            out.append(f"- **{bench}**: {_md_escape(why)}")
        out.append("")
    for r in results:
        bench = str(r["bench"])
        out.append(f"## {bench}")
        out.append("")
        out.append(f"`{r['command']}` -- started {r.get('started', '?')}, {format_cell(float(r['seconds']))} s")
        out.append("")
        for table in r.get("tables") or []:
            out.append(f"### {table.get('title', '')}")
            out.append("")
            out.append(markdown_table(table))
            out.append("")
        for i, plot in enumerate(r.get("plots") or []):
            link = plot_files.get((bench, i))
            if link:
                out.append(f"![{_md_escape(str(plot.get('title', '')))}]({link})")
            else:
                out.append(f"(plot '{plot.get('title', plot.get('file'))}' not drawn)")
            out.append("")
    return "\n".join(out).rstrip() + "\n"


def render_results(
    results: Sequence[Mapping[str, Any]],
    out_dir: str | Path,
    *,
    title: str,
    command: str,
    date: str,
    machine: Mapping[str, Any],
    missing: Iterable[tuple[str, str]] = (),
    reused: Iterable[str] = (),
) -> Rendered:
    """Write every plot (``out_dir/plots/<bench>_<file>``) and ``out_dir/RESULTS.md``. A plot that cannot be
    drawn (no matplotlib, bad data) is reported in ``plot_errors`` and noted in RESULTS.md; the rest still are."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rendered = Rendered(results_md=out_dir / "RESULTS.md")
    links: dict[tuple[str, int], str] = {}
    for r in results:
        bench = str(r["bench"])
        for i, plot in enumerate(r.get("plots") or []):
            relative = f"plots/{plot_filename(bench, plot)}"
            try:
                rendered.plots.append(render_plot(plot, out_dir / relative))
            except ImportError:
                rendered.plot_errors.append(f"{bench}: matplotlib is not installed (pip install -e '.[bench]')")
                continue
            except (ContractError, ValueError, TypeError) as exc:
                rendered.plot_errors.append(f"{bench}: plot {plot.get('file')!r}: {exc}")
                continue
            links[(bench, i)] = relative
    text = results_markdown(
        results,
        title=title,
        command=command,
        date=date,
        machine=machine,
        plot_files=links,
        missing=missing,
        reused=reused,
    )
    rendered.results_md.write_text(text)
    return rendered
