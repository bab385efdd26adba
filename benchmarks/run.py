#!/usr/bin/env python
"""The benchmark suite in one command: run every benchmark, then render tables, plots and RESULTS.md.

    python benchmarks/run.py --quick                  # CI smoke: every benchmark's --quick mode, ~7 min on 2 cores
    python benchmarks/run.py --full                   # everything at full size -> benchmarks/results/
    python benchmarks/run.py --full --with-retrieval  # ... plus bench_retrieval.py (~26 min with a cold cache)
    python benchmarks/run.py --quick --only core,throughput
    python benchmarks/run.py --full --render          # only re-render benchmarks/results/ from existing JSON

Each benchmark runs as its own process (``python benchmarks/bench_<name>.py [--quick] --out <json>``) with its
output kept in a log beside the JSON; a benchmark that fails (non-zero exit, or no valid JSON) is reported and
the others still run; the suite then exits non-zero. A benchmark script that does not exist yet is reported as
missing. Quick mode writes JSON, logs, plots and RESULTS.md to ``benchmarks/out/quick/`` (git-ignored); full
mode writes JSON and logs to ``benchmarks/out/`` and renders into ``benchmarks/results/`` (committed, with a
copy of the JSON under ``results/data/``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import render
import shared_data

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass(frozen=True)
class Benchmark:
    """One benchmark script and the arguments of each mode (``--out`` is added by the runner)."""

    name: str
    script: str
    quick: tuple[str, ...] = ("--quick",)
    full: tuple[str, ...] = ()
    #: Full mode runs it only when asked (too slow for a default full run).
    full_opt_in: str | None = None
    #: Whether it reads the public data sets: "" (no), "optional" (runs less without them) or "required"
    #: (skipped without them). Those that read them get the runner's ``--data``.
    data: str = ""
    about: str = ""


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("core", "bench_core.py", about="in-memory engine: build, add_episode, search, snapshot (10k, 100k)"),
    Benchmark(
        "extraction",
        "bench_extraction.py",
        data="optional",
        about="LLM calls, prompt characters and engine ms per episode",
    ),
    Benchmark(
        "throughput",
        "bench_throughput.py",
        data="optional",
        about="bulk ingestion under a 300 ms LLM: episodes/s vs ideal",
    ),
    Benchmark("hot_entity", "bench_hot_entity.py", about="one user entity accumulating facts: engine ms per episode"),
    Benchmark(
        "stalls", "bench_stalls.py", about="slowest add_episode calls at 100k facts: maintenance inline vs background"
    ),
    Benchmark("communities", "bench_communities.py", about="community detection, refresh, extension, drift"),
    Benchmark("scale", "bench_scale.py", about="in-memory scale curves to 1M facts"),
    Benchmark("text", "bench_text.py", about="in-memory BM25, Zipf vocabulary: pruning by the rarest term on / off"),
    Benchmark("postgres", "bench_postgres.py", about="PostgreSQL backend beside the in-memory one"),
    Benchmark("graphiti", "bench_graphiti.py", data="required", about="tkg and graphiti-core side by side on LoCoMo"),
    Benchmark("durability", "bench_durability.py", about="HTTP writes with the journal vs in memory; journal replay"),
    Benchmark(
        "retrieval",
        "bench_retrieval.py",
        full=("--latency", "--variants", "all"),
        full_opt_in="--with-retrieval",
        data="required",
        about="retrieval quality on LongMemEval_S and LoCoMo (MiniLM embeddings, cached)",
    ),
    Benchmark(
        "qa",
        "bench_qa.py",
        data="required",
        about="question answering with an LLM endpoint; without one (the suite), the cost estimate",
    ),
)
BY_NAME = {b.name: b for b in BENCHMARKS}


@dataclass
class Outcome:
    name: str
    status: str  # ok | FAILED | missing | skipped
    seconds: float | None = None
    detail: str = ""
    result: dict[str, Any] | None = None


# ----------------------------------------------------------------------------------------------------------
# running


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(text[-lines:])


def run_one(bench: Benchmark, args: argparse.Namespace, json_dir: Path) -> Outcome:
    """Run one benchmark script in its own process; its JSON must follow the contract for it to count."""
    script = HERE / bench.script
    if not script.exists():
        return Outcome(bench.name, "missing", detail=f"benchmarks/{bench.script} does not exist yet")
    if args.full and bench.full_opt_in and not getattr(args, bench.full_opt_in.lstrip("-").replace("-", "_")):
        return Outcome(bench.name, "skipped", detail=f"opt-in in full mode: add {bench.full_opt_in}")
    data = shared_data.data_dir(args.data) if bench.data else None
    if bench.data == "required" and data is None:
        return Outcome(bench.name, "skipped", detail=shared_data.missing_message("the data sets"))
    out = json_dir / f"{bench.name}.json"
    log = json_dir / f"{bench.name}.log"
    out.unlink(missing_ok=True)  # a stale file must never pass for this run's result
    extra = list(bench.quick if args.quick else bench.full)
    if data is not None:
        extra += ["--data", os.path.relpath(data, ROOT)]  # relative: the command is printed in RESULTS.md
    relative_out = os.path.relpath(out, ROOT)
    command = [sys.executable, str(script.relative_to(ROOT)), *extra, "--out", relative_out]
    shown = " ".join(["python", *command[1:]])
    print(f"\n>> {bench.name}: {shown}", flush=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg"}
    started = time.perf_counter()
    timed_out = threading.Event()
    with log.open("w") as log_file:
        # Its own process group, so that stopping it also stops what it started (worker processes, a server).
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
            start_new_session=True,
        )

        def on_timeout() -> None:  # a watchdog, so that a benchmark that hangs silently is stopped too
            timed_out.set()
            _stop(process)

        watchdog = threading.Timer(args.timeout, on_timeout) if args.timeout else None
        if watchdog is not None:
            watchdog.start()
        try:
            assert process.stdout is not None
            for line in process.stdout:
                log_file.write(line)
                if args.verbose:
                    print("   " + line, end="", flush=True)
                elif line.startswith("..."):  # the benchmarks' progress lines
                    print("   " + line.rstrip(), flush=True)
            code = process.wait()
        except KeyboardInterrupt:  # Ctrl-C reaches only the suite (the benchmark has its own session)
            _stop(process)
            raise
        finally:
            if watchdog is not None:
                watchdog.cancel()
    seconds = time.perf_counter() - started
    if timed_out.is_set():
        return _failed(bench, seconds, f"timed out after {args.timeout:.0f} s (--timeout)", log, args)
    if code != 0:
        return _failed(bench, seconds, f"exit status {code}", log, args)
    try:
        result = render.load_result(out)
    except render.ContractError as exc:
        return _failed(bench, seconds, str(exc), log, args)
    print(f"   ok in {seconds:.1f} s ({_target_summary(result)})", flush=True)
    return Outcome(bench.name, "ok", seconds, result=result)


def _stop(process: subprocess.Popen[str], grace_s: float = 10.0) -> None:
    """Stop a benchmark and everything in its process group: SIGTERM (a server shuts down cleanly), then SIGKILL."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError, AttributeError):
        process.kill()
        return
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def _failed(bench: Benchmark, seconds: float, why: str, log: Path, args: argparse.Namespace) -> Outcome:
    print(f"   FAILED after {seconds:.1f} s: {why}", flush=True)
    if not args.verbose:
        tail = _log_tail(log)
        if tail:
            print("   last lines of " + os.path.relpath(log, ROOT) + ":")
            print("\n".join("   | " + line for line in tail.splitlines()), flush=True)
    return Outcome(bench.name, "FAILED", seconds, detail=f"{why} (log: {os.path.relpath(log, ROOT)})")


def _target_summary(result: dict[str, Any]) -> str:
    targets = result.get("targets") or []
    if not targets:
        return "no targets"
    passed = sum(1 for t in targets if t.get("pass") is True)
    missed = sum(1 for t in targets if t.get("pass") is False)
    return f"targets: {passed} PASS, {missed} MISS" + (
        f", {len(targets) - passed - missed} not measured" if len(targets) > passed + missed else ""
    )


# ----------------------------------------------------------------------------------------------------------
# rendering


def collect(json_dir: Path, names: Sequence[str], quick: bool) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """The valid results of this mode found in ``json_dir``, and (benchmark, why) for the others."""
    results, missing = [], []
    for name in names:
        path = json_dir / f"{name}.json"
        if not path.exists():
            missing.append((name, f"no result file {os.path.relpath(path, ROOT)}"))
            continue
        try:
            result = render.load_result(path)
        except render.ContractError as exc:
            missing.append((name, str(exc).replace(str(path), os.path.relpath(path, ROOT)) + "; rerun it"))
            continue
        if bool((result.get("args") or {}).get("quick")) != quick:
            missing.append((name, f"{os.path.relpath(path, ROOT)} comes from a {'full' if quick else '--quick'} run"))
            continue
        results.append(result)
    return results, missing


def render_all(
    args: argparse.Namespace,
    json_dir: Path,
    out_dir: Path,
    outcomes: Sequence[Outcome],
    machine: dict[str, Any] | None,
) -> render.Rendered:
    why = {o.name: o.detail for o in outcomes if o.status != "ok"}
    # A benchmark that failed in this run is not rendered, even if it wrote partial JSON before failing.
    failed = [(o.name, o.detail) for o in outcomes if o.status == "FAILED"]
    names = [b.name for b in BENCHMARKS if b.name not in dict(failed)]
    results, missing = collect(json_dir, names, args.quick)
    missing = failed + [(name, why.get(name) or reason) for name, reason in missing]
    if args.print_tables:
        for result in results:
            print(f"\n== {result['bench']}: {result['command']}")
            render.print_tables(result)
    mode = "quick (CI smoke: small sizes; not for comparing)" if args.quick else "full"
    rendered = render.render_results(
        results,
        out_dir,
        title=f"tkg benchmarks: {mode}",
        command=render.command_line(),
        date=datetime.now(UTC).isoformat(timespec="seconds"),
        machine=machine or (results[0]["machine"] if results else {}),
        missing=missing,
        reused=[r["bench"] for r in results if r["bench"] not in {o.name for o in outcomes if o.status == "ok"}],
    )
    if not args.quick:
        data = out_dir / "data"
        data.mkdir(parents=True, exist_ok=True)
        for result in results:
            shutil.copyfile(json_dir / f"{result['bench']}.json", data / f"{result['bench']}.json")
    return rendered


def print_summary(outcomes: Sequence[Outcome], total_s: float) -> None:
    print("\nsuite summary")
    width = max(len(o.name) for o in outcomes)
    for o in outcomes:
        seconds = f"{o.seconds:7.1f} s" if o.seconds is not None else "      - "
        detail = _target_summary(o.result) if o.result else o.detail
        print(f"  {o.name:<{width}}  {o.status:<7} {seconds}  {detail}")
    print(f"  total {total_s:.1f} s")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="every benchmark's --quick mode (CI)")
    mode.add_argument("--full", action="store_true", help="every benchmark at full size")
    parser.add_argument("--only", default="", help="comma-separated benchmarks to run (default: all)")
    parser.add_argument("--skip", default="", help="comma-separated benchmarks not to run")
    parser.add_argument("--render", action="store_true", help="do not run anything; re-render from existing JSON")
    parser.add_argument("--with-retrieval", action="store_true", help="full mode: also bench_retrieval.py")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per benchmark (default: quick 900)")
    parser.add_argument("--data", help=shared_data.HELP)
    parser.add_argument("--out-dir", type=Path, default=None, help="where RESULTS.md and plots go")
    parser.add_argument("--json-dir", type=Path, default=None, help="where the benchmarks' JSON and logs go")
    parser.add_argument("-v", "--verbose", action="store_true", help="stream every benchmark's own output")
    parser.add_argument("--no-tables", dest="print_tables", action="store_false", help="do not print the tables")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    if not (args.quick or args.full or args.list):
        parser.error("choose --quick (CI smoke) or --full (everything at full size)")
    selected = [n.strip() for n in args.only.split(",") if n.strip()] or [b.name for b in BENCHMARKS]
    skipped = {n.strip() for n in args.skip.split(",") if n.strip()}
    unknown = sorted((set(selected) | skipped) - set(BY_NAME))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    args.selected = [n for n in selected if n not in skipped]
    args.explicit = bool(args.only)
    if args.timeout is None and args.quick:
        args.timeout = 900.0
    args.json_dir = args.json_dir or (HERE / "out" / "quick" if args.quick else HERE / "out")
    args.out_dir = args.out_dir or (HERE / "out" / "quick" if args.quick else HERE / "results")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.list:
        for b in BENCHMARKS:
            state = "" if (HERE / b.script).exists() else "  (script missing)"
            opt = f"  (full mode: opt-in {b.full_opt_in})" if b.full_opt_in else ""
            print(f"{b.name:<12} benchmarks/{b.script:<22} {b.about}{opt}{state}")
        return 0
    started = time.perf_counter()
    args.json_dir.mkdir(parents=True, exist_ok=True)
    outcomes: list[Outcome] = []
    machine: dict[str, Any] | None = None
    if not args.render:
        import bench_core  # the machine description every benchmark records (imports tkg and numpy)

        machine = bench_core.machine()
        print(
            f"tkg benchmark suite, {'quick' if args.quick else 'full'} mode: {', '.join(args.selected)}\n"
            f"machine: {machine['cpu_count']} CPUs, {machine['processor']}, Python {machine['python']}, "
            f"{machine['platform']}; CPU busy with other processes: {machine['others_cpu_busy_at_start']}"
        )
        for name in args.selected:
            outcome = run_one(BY_NAME[name], args, args.json_dir)
            if outcome.status in ("missing", "skipped"):
                print(f"\n>> {name}: {outcome.status}: {outcome.detail}", flush=True)
                if outcome.status == "missing" and args.explicit:
                    outcome.status = "FAILED"  # asked for by name: its absence is an error
            outcomes.append(outcome)
    rendered = render_all(args, args.json_dir, args.out_dir, outcomes, machine)
    print(f"\nwrote {os.path.relpath(rendered.results_md, ROOT)} and {len(rendered.plots)} plot(s)")
    for problem in dict.fromkeys(rendered.plot_errors):
        print(f"  plot not drawn: {problem}")
    if outcomes:
        print_summary(outcomes, time.perf_counter() - started)
    failed = [o.name for o in outcomes if o.status == "FAILED"]
    if failed:
        print(f"\nFAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
