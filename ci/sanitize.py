"""Tier 3: compute-sanitizer memcheck, racecheck, synccheck and initcheck over the standalone tests (--small),
a small pytest subset, and the negative controls (csrc/tests/selftest) that each tool must catch.

    python ci/sanitize.py --out OUT [--tests BIN ...] [--selftest BIN] [--pytest-subset EXPR] [--dry-run]

Every run's log goes to OUT/sanitize/<tool>__<name>.log; OUT/sanitize.json holds the table. Exit status 0
only when every expected-clean run reports nothing and every negative control is caught by its tool.
`--dry-run` prints the plan without running anything (no GPU needed).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import glob
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")
# Negative controls: (selftest mode, the tool that must report it).
CONTROLS = (("race", "racecheck"), ("oob", "memcheck"), ("uninit", "initcheck"), ("sync", "synccheck"))
# A few fast GPU tests of every family (smoke tests, empty inputs, one real launch per rotary entry point):
# the sanitizer slows torch down by 10-100x, so the subset stays small.
DEFAULT_PYTEST_SUBSET = "tests/gpu -k 'smoke or empty or int32_and_int64'"

_ERROR_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+error")
_RACECHECK_SUMMARY = re.compile(r"RACECHECK SUMMARY:\s*(\d+)\s+hazard")


@dataclasses.dataclass
class Run:
    tool: str
    name: str          # what ran: a test binary, "pytest", or "control:<mode>"
    command: list[str]
    expect: str        # "clean" or "caught"
    errors: int | None = None   # reports parsed from the output; None: no summary line found
    exit_code: int | None = None
    seconds: float = 0.0
    log: str = ""
    verdict: str = "not run"

    def row(self) -> dict:
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "command"} | {
            "command": shlex.join(self.command)}


def count_reports(output: str) -> int | None:
    """Reports in one compute-sanitizer output: the ERROR SUMMARY count, or the racecheck hazard count when
    larger (`--racecheck-report all` also lists analysis records). None when no summary line is present."""
    counts = [int(m) for m in _ERROR_SUMMARY.findall(output)] + [int(m) for m in _RACECHECK_SUMMARY.findall(output)]
    return max(counts) if counts else None


def judge(run: Run) -> str:
    """pass / FAIL for one run, from its expectation, its parsed reports and its exit status."""
    if run.errors is None:  # compute-sanitizer always prints one: it did not run, or the target crashed it
        return "FAIL(no summary)"
    reported = run.errors > 0
    if run.expect == "clean":
        if reported:
            return f"FAIL({run.errors} reports)"
        return "pass" if run.exit_code == 0 else f"FAIL(exit {run.exit_code})"
    return "caught" if reported else "FAIL(not caught)"


def sanitizer_command(sanitizer: str, tool: str, target: list[str]) -> list[str]:
    cmd = [sanitizer, "--tool", tool, "--error-exitcode", "9", "--print-limit", "20"]
    if tool == "racecheck":
        cmd += ["--racecheck-report", "all"]
    return cmd + target


def plan(args) -> list[Run]:
    runs: list[Run] = []
    for tool in args.tools:
        for binary in args.tests:
            runs.append(Run(tool, Path(binary).name, sanitizer_command(args.sanitizer, tool, [binary, "--small"]),
                            "clean"))
        if args.pytest_subset:
            target = [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *shlex.split(args.pytest_subset)]
            runs.append(Run(tool, "pytest", sanitizer_command(args.sanitizer, tool, target), "clean"))
        if args.selftest:
            runs.append(Run(tool, "control:clean",
                            sanitizer_command(args.sanitizer, tool, [args.selftest, "clean"]), "clean"))
    if args.selftest:
        for mode, tool in CONTROLS:
            if tool in args.tools:
                runs.append(Run(tool, f"control:{mode}",
                                sanitizer_command(args.sanitizer, tool, [args.selftest, mode]), "caught"))
    return runs


def execute(run: Run, log_dir: Path, timeout: float, env: dict) -> None:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", run.name)
    log_path = log_dir / f"{run.tool}__{safe}.log"
    run.log = str(log_path)
    t0 = time.monotonic()
    try:
        proc = subprocess.run(run.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, env=env, cwd=ROOT)
        output, run.exit_code = proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or "") if isinstance(exc.stdout, str) else (exc.stdout or b"").decode(errors="replace")
        output += f"\n[sanitize.py] timed out after {timeout:.0f} s\n"
        run.exit_code = 124
    run.seconds = time.monotonic() - t0
    log_path.write_text(f"$ {shlex.join(run.command)}\n{output}")
    run.errors = count_reports(output)
    run.verdict = judge(run)
    if run.exit_code == 124:
        run.verdict = "FAIL(timeout)"


def format_table(runs: list[Run]) -> str:
    lines = [f"{'tool':<10} {'target':<28} {'expect':<7} {'reports':>7} {'exit':>5} {'s':>6}  verdict"]
    for r in runs:
        lines.append(f"{r.tool:<10} {r.name:<28} {r.expect:<7} {'-' if r.errors is None else r.errors:>7} "
                     f"{'-' if r.exit_code is None else r.exit_code:>5} {r.seconds:>6.1f}  {r.verdict}")
    return "\n".join(lines)


def ok(run: Run) -> bool:
    return run.verdict in ("pass", "caught")


def default_tests() -> list[str]:
    return sorted(p for p in glob.glob(str(ROOT / "build" / "*" / "tests" / "*_test")) if os.access(p, os.X_OK))


def default_selftest() -> str | None:
    path = ROOT / "build" / "selftest" / "sanitizer_selftest"
    return str(path) if path.exists() else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "gpu-out")
    parser.add_argument("--tests", nargs="*", default=None, help="standalone test binaries (default build/*/tests/*_test)")
    parser.add_argument("--selftest", default=None, help="the negative-control binary (default build/selftest/)")
    parser.add_argument("--pytest-subset", default=DEFAULT_PYTEST_SUBSET, help="pytest arguments; '' for none")
    parser.add_argument("--tools", nargs="+", default=list(TOOLS), choices=TOOLS)
    parser.add_argument("--sanitizer", default=os.environ.get("COMPUTE_SANITIZER", "compute-sanitizer"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--timeout", type=float, default=240.0, help="seconds per sanitizer run")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1), help="sanitizer runs at once")
    parser.add_argument("--dry-run", action="store_true", help="print the plan, run nothing")
    args = parser.parse_args(argv)
    if args.tests is None:
        args.tests = default_tests()
    if args.selftest is None:
        args.selftest = default_selftest()

    runs = plan(args)
    if args.dry_run:
        for r in runs:
            print(f"[{r.expect}] {shlex.join(r.command)}")
        return 0
    problems = []
    if not args.tests:
        problems.append("no standalone test binaries (build/*/tests/*_test): build the image first")
    if not args.selftest:
        problems.append("no negative-control binary: cmake -S csrc/tests/selftest -B build/selftest && cmake --build build/selftest")
    log_dir = args.out / "sanitize"
    log_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    # Every torch allocation is its own cudaMalloc, so memcheck and initcheck see the real bounds.
    env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:False"
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    # Runs are independent processes, mostly CPU-bound under instrumentation: run several at once.
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(execute, r, log_dir, args.timeout, env): r for r in runs}
        for future in concurrent.futures.as_completed(futures):
            future.result()
            r = futures[future]
            print(f"== {r.tool} {r.name} (expect {r.expect}): {r.verdict}: {r.errors} reports, exit {r.exit_code}, "
                  f"{r.seconds:.1f} s, log {r.log}", flush=True)
    table = format_table(runs)
    passed = all(ok(r) for r in runs) and not problems
    (args.out / "sanitize.json").write_text(json.dumps(
        {"passed": passed, "problems": problems, "runs": [r.row() for r in runs]}, indent=2) + "\n")
    print()
    print(table)
    for p in problems:
        print(f"sanitize: {p}")
    caught = sum(r.verdict == "caught" for r in runs)
    controls = sum(r.expect == "caught" for r in runs)
    clean = sum(r.verdict == "pass" for r in runs)
    print(f"sanitize: {clean}/{len(runs) - controls} clean runs clean, {caught}/{controls} negative controls caught"
          f" -> {'PASS' if passed else 'FAIL'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
