"""Tier 3: compute-sanitizer memcheck, racecheck, synccheck and initcheck over the standalone tests (--small),
a small pytest subset, and the negative controls (csrc/tests/selftest) that each tool must catch.

    python ci/sanitize.py --out OUT [--tests BIN ...] [--selftest BIN] [--pytest-subset EXPR] [--dry-run]
    python ci/sanitize.py --locate-ctest DIR     # print a ctest directory usable from this tree (see below)

The standalone tests are discovered, never listed: the `<test>.small` entries (label cu-test) of the image
build's ctest registration (`astrai_add_family(... TESTS ...)` in csrc/CMakeLists.txt), run exactly as
registered; only where no registration is usable, every build/*/tests/*_test binary with --small (the
reason is printed). `--tests BIN ...` overrides both.

The registration (build/<tag>/csrc/CTestTestfile.cmake) records the absolute source and build roots of the
machine that configured it. `locate_ctest` uses it as is when it was configured for this tree, else writes
a copy with those roots rewritten to this tree's (a GPU machine given a copy of the build), and checks that
every registered binary exists; ci/gpu_run.sh's cu-tests tier runs ctest on it through --locate-ctest.

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
import shutil
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
    """args.tests: [(name, command)] of the standalone tests in --small mode."""
    runs: list[Run] = []
    for tool in args.tools:
        for name, command in args.tests:
            runs.append(Run(tool, name, sanitizer_command(args.sanitizer, tool, list(command)), "clean"))
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


# ---- the ctest registration: locate (relocate) and read ------------------------------------------------

_RECORDED_ROOT = re.compile(r"^# (Source|Build) directory: (.+?)\s*$", re.M)
_ADD_TEST = re.compile(r'^add_test\(\[=\[(.+?)\]=\]\s+"([^"]+)"', re.M)
CTEST_FILE = "CTestTestfile.cmake"


def ctest_candidates(root: Path = ROOT) -> list[Path]:
    """The image builds' test registrations (build/*/csrc/CTestTestfile.cmake): $ASTRAI_CTEST_DIR's alone when
    set, else newest first."""
    if os.environ.get("ASTRAI_CTEST_DIR"):
        return [Path(os.environ["ASTRAI_CTEST_DIR"]) / CTEST_FILE]
    return sorted(root.glob(f"build/*/csrc/{CTEST_FILE}"), key=lambda p: p.stat().st_mtime, reverse=True)


def relocated_text(text: str, here: Path, root: Path) -> str:
    """The registration text with its recorded roots rewritten: the recorded build tree (the parent of the
    recorded `Build directory`) to where this file's build tree is now (here.parent), and the recorded source
    root (the parent of `Source directory`) to `root`. One pass, longest first, so no path is rewritten twice."""
    recorded = dict(_RECORDED_ROOT.findall(text))
    if "Source" not in recorded or "Build" not in recorded:
        raise ValueError("no '# Source directory' / '# Build directory' header")
    mapping = {str(Path(recorded["Build"]).parent): str(here.parent), str(Path(recorded["Source"]).parent): str(root)}
    mapping = {old: new for old, new in mapping.items() if old != new}
    if not mapping:
        return text
    pattern = re.compile("|".join(re.escape(old) + r"(?=[/\"\s]|$)" for old in sorted(mapping, key=len, reverse=True)))
    return pattern.sub(lambda m: mapping[m.group(0)], text)


def locate_ctest(dest: Path, root: Path = ROOT) -> tuple[Path | None, str]:
    """(a ctest directory whose registered binaries all exist from this tree, how it was found), or (None,
    why not). A registration configured for this tree is used in place; another is copied into `dest` with
    its recorded roots rewritten (relocated_text)."""
    reasons = []
    for ctest_file in ctest_candidates(root):
        if not ctest_file.exists():
            reasons.append(f"{ctest_file}: missing")
            continue
        here = ctest_file.parent
        text = ctest_file.read_text()
        try:
            fixed = relocated_text(text, here, root)
        except ValueError as exc:
            reasons.append(f"{ctest_file}: {exc}")
            continue
        registered = _ADD_TEST.findall(fixed)
        missing = [binary for _, binary in registered if not os.access(binary, os.X_OK)]
        if not registered or missing:
            reasons.append(f"{ctest_file}: " + ("no add_test" if not registered else
                                                f"registered binaries missing here: {', '.join(sorted(set(missing)))}"))
            continue
        if fixed == text:
            return here, f"{here} (configured for this tree)"
        dest.mkdir(parents=True, exist_ok=True)
        (dest / CTEST_FILE).write_text(fixed)
        return dest, f"{dest} (a copy of {ctest_file} with its recorded roots rewritten to this tree)"
    return None, "; ".join(reasons) or f"no build/*/csrc/{CTEST_FILE} (build the image: nox -s build)"


def registered_small_tests(ctest_dir: Path, ctest: str = "ctest") -> list[tuple[str, list[str]]]:
    """[(binary name, command)] of the `<test>.small` entries labelled cu-test, as ctest itself reads them."""
    proc = subprocess.run([ctest, "--test-dir", str(ctest_dir), "--show-only=json-v1", "-L", "cu-test"],
                          capture_output=True, text=True, check=True)
    tests = json.loads(proc.stdout).get("tests", [])
    return [(Path(t["command"][0]).name, list(t["command"])) for t in tests
            if t["name"].endswith(".small") and t.get("command")]


def discover_tests(out: Path) -> tuple[list[tuple[str, list[str]]], str]:
    """The standalone tests in --small mode and where they came from: the ctest registration when one is usable
    here (and ctest is on PATH), else the build/*/tests/*_test binaries, saying why."""
    ctest = shutil.which("ctest")
    ctest_dir, how = locate_ctest(out / "ctest")
    if ctest_dir is not None and ctest is not None:
        try:
            tests = registered_small_tests(ctest_dir, ctest)
            if tests:
                return tests, f"ctest registration in {how}"
            how = f"{how} registers no cu-test .small entry"
        except (subprocess.CalledProcessError, json.JSONDecodeError, KeyError) as exc:
            how = f"ctest --show-only failed on {ctest_dir}: {exc}"
    elif ctest is None:
        how = "ctest is not on PATH"
    found = [(Path(b).name, [b, "--small"]) for b in default_tests()]
    return found, f"build/*/tests/*_test binaries run directly (no usable ctest registration: {how})"


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
    parser.add_argument("--locate-ctest", type=Path, metavar="DIR",
                        help="only print a ctest directory usable from this tree (a relocated copy goes into DIR); "
                             "exit 1 with the reason on stderr when there is none")
    args = parser.parse_args(argv)
    if args.locate_ctest is not None:
        ctest_dir, how = locate_ctest(args.locate_ctest)
        print(ctest_dir if ctest_dir else "")
        print(f"sanitize: ctest directory: {how}", file=sys.stderr)
        return 0 if ctest_dir else 1
    if args.tests is None:
        args.tests, how = discover_tests(args.out)
        print(f"sanitize: standalone tests from the {how}: {', '.join(n for n, _ in args.tests) or 'none'}")
    else:
        args.tests = [(Path(b).name, [b, "--small"]) for b in args.tests]
    if args.selftest is None:
        args.selftest = default_selftest()

    runs = plan(args)
    if args.dry_run:
        for r in runs:
            print(f"[{r.expect}] {shlex.join(r.command)}")
        return 0
    problems = []
    if not args.tests:
        problems.append("no standalone tests (ctest registration or build/*/tests/*_test): build the image first")
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
