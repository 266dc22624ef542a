"""Benchmark gate (tier 4): compare each case's ratio to its anchor with the stored per-GPU baseline.

    python ci/bench_gate.py RUN.json [--baseline-dir benchmarks/baselines/<gpu>] [--threshold 0.05]
                            [--report OUT.json] [--strict] [--family NAME ...] [--update-baseline]

RUN.json is pytest-benchmark's JSON (nox -s bench: each case's extra_info holds case, ratio, spread, ...) or
a legacy `bench_rotary.py --json` file. The ratio is anchor time / kernel time (higher is better), measured
in one run, so it travels between machines and clocks better than absolute times.

Verdict per case, with t the threshold (default 5%, or the case's own `threshold` in the baseline) and
noise = max(run spread, baseline spread), spread being (max - min) / median of the ratios of repeated runs:
    FAIL          the ratio fell by more than t and by more than the noise
    inconclusive  the noise exceeds t, so a regression of t could not be seen (or the fall is within noise)
    pass          otherwise (an improvement beyond t is `pass (improved)`: update the baseline on purpose)
    new / missing a case without a baseline / a baseline case this run did not measure
    no-baseline   the case's family (the case name up to the first '.') has no baseline file at all: nothing
                  was gated, which must not read as green
A case whose anchor differs from its baseline's (e.g. flash SDPA where cuDNN refused the shape) is
inconclusive: the two ratios do not measure the same thing. A row that is not a plain pass notes which side moved
when both records carry absolute times (kernel_us, anchor_us): a FAIL with our time unchanged is a faster anchor.
Exit status 1 on any FAIL, on a missing case (unless --allow-missing), on a run with no case at all, and on
inconclusive cases with --strict; else 3 when some family has no baseline (unless --allow-no-baseline);
else 0. --update-baseline writes this run's cases into the baseline directory (one file per family, or only
the --family ones), keeping per-case thresholds; it is never implicit. Without it, --family gates only those
families' baseline cases (a run of one family).
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_THRESHOLD = 0.05
# Commit ids that name no commit: pytest-benchmark's outside a git tree, and an image built without git.
UNVERSIONED = ("", "unknown", "unversioned")
EXIT_NO_BASELINE = 3


def portable_source(source: str | None) -> str | None:
    """A run's file as a committed baseline names it: relative to the repository, else the bare file name (never a
    path of the machine that recorded it)."""
    if not source:
        return source
    path = Path(source)
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return path.name


def gpu_slug(name: str) -> str:
    """'NVIDIA H200' -> 'h200', 'NVIDIA GeForce RTX 4090' -> 'geforce-rtx-4090'."""
    name = re.sub(r"^nvidia\s+", "", name.strip(), flags=re.I)
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def legacy_case_id(row: dict) -> str:
    return f"rotary.qk[T={row['tokens']},{row['pairing']},{row['mode']}]"


def _legacy_cases(data: dict) -> dict[str, dict]:
    cases = {}
    for row in data["rows"]:
        ratio = row["torch_us"] / row["kernel_us"]
        cases[legacy_case_id(row)] = {
            "family": "rotary", "kernel_us": row["kernel_us"], "anchor": "torch path", "anchor_us": row["torch_us"],
            "ratio": ratio, "ratios": [ratio], "spread": None, "ceiling": "copy", "ceiling_us": row["copy_us"],
            "tbps": row["kernel_gbps"] / 1e3, "fraction_of_ceiling": row["fraction_of_copy"], "repeats": 1}
    return cases


def run_commit(commit_info: dict, env: dict) -> tuple[str | None, str]:
    """(commit, source) of a pytest-benchmark run: its commit_info (git, or what tests/bench/conftest.py put there
    outside git), else the bench record's commit, else the image's recorded git revision."""
    cid = str(commit_info.get("id") or "")
    if cid not in UNVERSIONED:
        return cid[:12], commit_info.get("source") or "git"
    recorded = env.get("commit") or {}
    if str(recorded.get("id") or "") not in UNVERSIONED:
        return recorded["id"][:12], recorded.get("source") or "bench record"
    revision = str((env.get("image") or {}).get("git_revision") or "")
    if revision not in UNVERSIONED:
        return revision[:12], "image git_revision"
    return None, "unknown"


def load_run(path: Path) -> dict:
    """{"gpu", "date", "commit", "environment", "cases": {case: record}} from either JSON format."""
    data = json.loads(Path(path).read_text())
    if "benchmarks" in data:  # pytest-benchmark
        machine = data.get("machine_info", {})
        env = machine.get("astrai") or {}
        cases = {}
        for bench in data["benchmarks"]:
            info = dict(bench.get("extra_info") or {})
            if "case" not in info or "ratio" not in info:
                continue
            info["host_eager_median_s"] = (bench.get("stats") or {}).get("median")
            cases[info.pop("case")] = info
        commit, commit_source = run_commit(data.get("commit_info") or {}, env)
        return {"gpu": (env.get("gpu") or {}).get("name") or "unknown", "date": data.get("datetime") or env.get("date"),
                "commit": commit, "commit_source": commit_source, "environment": env, "cases": cases,
                "source": str(path)}
    if "rows" in data:  # legacy bench_rotary.py --json
        env = data.get("environment", {})
        return {"gpu": (env.get("gpu") or {}).get("name") or "unknown", "date": env.get("date"),
                "commit": (env.get("image") or {}).get("git_revision"), "environment": env,
                "cases": _legacy_cases(data), "source": str(path)}
    if "cases" in data:  # already normalized (benchmark history)
        return data
    raise ValueError(f"{path}: neither pytest-benchmark JSON nor bench_rotary JSON")


def merge_runs(runs: list[dict]) -> dict:
    """Several runs of the same cases: ratios pooled, spread over all of them."""
    if len(runs) == 1:
        return runs[0]
    merged = dict(runs[0], cases={})
    for case in {c for r in runs for c in r["cases"]}:
        records = [r["cases"][case] for r in runs if case in r["cases"]]
        ratios = [x for rec in records for x in (rec.get("ratios") or [rec["ratio"]])]
        median = statistics.median(ratios)
        merged["cases"][case] = dict(records[-1], ratio=median, ratios=ratios,
                                     spread=(max(ratios) - min(ratios)) / median if len(ratios) > 1 else None)
    return merged


def load_baseline(directory: Path) -> dict[str, dict]:
    cases: dict[str, dict] = {}
    for path in sorted(Path(directory).glob("*.json")):
        data = json.loads(path.read_text())
        for case, rec in data.get("cases", {}).items():
            cases[case] = dict(rec, _file=path.name)
    return cases


def family(case: str) -> str:
    """'quantize.dual[M=4096,N=4096]' -> 'quantize': the baseline file (<family>.json) the case belongs to."""
    return case.split(".")[0]


def judge(case: str, run: dict | None, base: dict | None, threshold: float, family_has_baseline: bool = True
          ) -> dict:
    row = {"case": case, "verdict": "", "change": None, "noise": None, "threshold": threshold,
           "ratio": None if run is None else run["ratio"], "baseline": None if base is None else base["ratio"]}
    if base is None:
        row["verdict"] = "new" if family_has_baseline else "no-baseline"
        return row
    if run is None:
        row["verdict"] = "missing"
        return row
    t = float(base.get("threshold") or threshold)
    change = run["ratio"] / base["ratio"] - 1.0
    noise = max(run.get("spread") or 0.0, base.get("spread") or 0.0)
    row.update(change=change, noise=noise, threshold=t)
    if base.get("anchor") and run.get("anchor") and base["anchor"] != run["anchor"]:
        row["verdict"] = "inconclusive"
        row["note"] = f"anchor {run['anchor']} vs baseline {base['anchor']}"
    elif change < -t and -change > noise:
        row["verdict"] = "FAIL"
    elif noise > t or change < -t:
        row["verdict"] = "inconclusive"
    elif change > t:
        row["verdict"] = "pass (improved)"
    else:
        row["verdict"] = "pass"
    if row["verdict"] != "pass" and not row.get("note"):
        moved = sides_moved(run, base)
        if moved:
            row["note"] = moved
    return row


def sides_moved(run: dict, base: dict) -> str | None:
    """Which side of a changed ratio moved, from the absolute times both records carry: "ours 7.77 us (-0.5%),
    anchor 13.48 us (-8.0%)" (a faster anchor lowers the ratio with our kernel unchanged). None without the times."""
    parts = []
    for key, name in (("kernel_us", "ours"), ("anchor_us", "anchor")):
        now, then = run.get(key), base.get(key)
        if not now or not then:
            return None
        parts.append(f"{name} {now:.2f} us ({100 * (now / then - 1):+.1f}%)")
    return ", ".join(parts)


def gate(run: dict, baseline: dict[str, dict], threshold: float) -> list[dict]:
    cases = sorted(set(run["cases"]) | set(baseline))
    families = {family(c) for c in baseline}
    rows = [judge(c, run["cases"].get(c), baseline.get(c), threshold, family(c) in families) for c in cases]
    order = {"FAIL": 0, "inconclusive": 1, "missing": 2, "no-baseline": 3, "new": 4}
    return sorted(rows, key=lambda r: (order.get(r["verdict"], 4), r["change"] if r["change"] is not None else 0))


def counts(rows: list[dict]) -> dict[str, int]:
    keys = ("pass", "FAIL", "inconclusive", "new", "missing", "no-baseline")
    return {k: sum(r["verdict"].split(" ")[0] == k for r in rows) for k in keys}


def format_table(rows: list[dict]) -> str:
    def pct(x):
        return "-" if x is None else f"{100 * x:+.1f}%"
    lines = [f"{'case':<44} {'ratio':>8} {'baseline':>8} {'change':>8} {'noise':>7} {'limit':>6}  verdict"]
    for r in rows:
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.3f}"
        base = "-" if r["baseline"] is None else f"{r['baseline']:.3f}"
        noise = "-" if r["noise"] is None else f"{100 * r['noise']:.1f}%"
        lines.append(f"{r['case']:<44} {ratio:>8} {base:>8} {pct(r['change']):>8} {noise:>7} "
                     f"{100 * r['threshold']:>5.1f}%  {r['verdict']}" + (f" ({r['note']})" if r.get("note") else ""))
    return "\n".join(lines)


def families_without_baseline(rows: list[dict]) -> list[str]:
    return sorted({family(r["case"]) for r in rows if r["verdict"] == "no-baseline"})


def update_baseline(run: dict, directory: Path, note: str, only: list[str] | None = None) -> list[Path]:
    """Write the run's cases into <directory>/<family>.json (every family, or those in `only`), keeping each
    case's threshold override."""
    directory.mkdir(parents=True, exist_ok=True)
    by_family: dict[str, dict] = {}
    for case, rec in run["cases"].items():
        if only is None or family(case) in only:
            by_family.setdefault(family(case), {})[case] = rec
    written = []
    for name, cases in sorted(by_family.items()):
        path = directory / f"{name}.json"
        old = json.loads(path.read_text()) if path.exists() else {}
        old_cases = old.get("cases", {})
        out_cases = {}
        for case, rec in sorted(cases.items()):
            entry = {k: rec.get(k) for k in ("ratio", "spread", "ratios", "kernel_us", "anchor", "anchor_us",
                                             "fraction_of_ceiling", "tbps") if rec.get(k) is not None}
            if (old_cases.get(case) or {}).get("threshold") is not None:
                entry["threshold"] = old_cases[case]["threshold"]
            out_cases[case] = entry
        data = {"gpu": run["gpu"], "date": run.get("date"), "commit": run.get("commit"),
                "commit_source": run.get("commit_source"), "source": portable_source(run.get("source")), "note": note,
                "updated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "cases": out_cases}
        path.write_text(json.dumps(data, indent=2) + "\n")
        written.append(path)
    return written


ABSOLUTE_PATH = re.compile(r"(?<![\w.:/])/[^\s=,;'\"]+")  # a path in a string: alone, a word, after '='


def portable_paths(value):
    """`value` with every absolute path in its strings (a path, or one inside a command line) made portable
    (portable_source): what is committed never names a directory of the machine that recorded it."""
    if isinstance(value, dict):
        return {k: portable_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [portable_paths(v) for v in value]
    if isinstance(value, str) and "/" in value:
        return ABSOLUTE_PATH.sub(lambda m: portable_source(m.group(0)), value)
    return value


def record_history(run: dict, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    stamp = (run.get("date") or "undated")[:10]
    path = directory / f"{stamp}_{run.get('commit') or 'unknown'}.json"
    path.write_text(json.dumps(portable_paths(run), indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="benchmark JSON files of one GPU (pooled)")
    parser.add_argument("--baseline-dir", type=Path, default=None,
                        help="default benchmarks/baselines/<gpu slug of the run>")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    parser.add_argument("--report", type=Path, help="write the verdicts as JSON here")
    parser.add_argument("--strict", action="store_true", help="inconclusive cases fail too")
    parser.add_argument("--allow-missing", action="store_true",
                        help="baseline cases this run did not measure do not fail (a partial run)")
    parser.add_argument("--allow-no-baseline", action="store_true",
                        help="families without any baseline file do not fail (exit 3) the gate")
    parser.add_argument("--update-baseline", action="store_true", help="write this run as the new baseline")
    parser.add_argument("--family", action="append", default=None,
                        help="only this family (repeatable; default every family): with --update-baseline the file "
                             "written, otherwise the baseline cases gated (a one-family run leaves no other "
                             "family's cases missing)")
    parser.add_argument("--note", default="", help="with --update-baseline: where the run came from")
    parser.add_argument("--record-history", type=Path, metavar="DIR",
                        help="also store the normalized run as DIR/<date>_<commit>.json (the dashboard's input)")
    args = parser.parse_args(argv)

    missing = [str(p) for p in args.runs if not p.exists()]
    if missing:
        print(f"bench-gate: no such benchmark JSON: {', '.join(missing)} (nox -s bench / ci/gpu_run.sh bench "
              "writes gpu-out/bench.json)", file=sys.stderr)
        return 2
    run = merge_runs([load_run(p) for p in args.runs])
    directory = args.baseline_dir or ROOT / "benchmarks" / "baselines" / gpu_slug(run["gpu"])
    if args.record_history:
        print(f"bench-gate: recorded {record_history(run, args.record_history)}")
    if args.update_baseline:
        written = update_baseline(run, directory, args.note or f"from {', '.join(map(str, args.runs))}", args.family)
        for path in written:
            print(f"bench-gate: wrote baseline {path}")
        if not written:
            print(f"bench-gate: the run holds no case of {args.family}: nothing written", file=sys.stderr)
            return 1
        return 0
    baseline = load_baseline(directory)
    if args.family:  # a run of some families only: the others' baseline cases are not this run's to measure
        baseline = {case: rec for case, rec in baseline.items() if family(case) in args.family}
    if not baseline:
        print(f"bench-gate: no baseline in {directory} for {run['gpu']}: record one with --update-baseline",
              file=sys.stderr)
    rows = gate(run, baseline, args.threshold)
    summary = counts(rows)
    unbased = families_without_baseline(rows)
    print(f"bench-gate: {run['gpu']}, run {run.get('date')} (commit {run.get('commit')}, from "
          f"{run.get('commit_source', '?')}) vs {directory}")
    print(format_table(rows))
    print("bench-gate: " + ", ".join(f"{n} {k}" for k, n in summary.items()))
    if not run["cases"]:
        print("bench-gate: the run holds no benchmark case (did every benchmark skip?)", file=sys.stderr)
    for fam in unbased:
        print(f"bench-gate: no baseline for family {fam!r} in {directory}: its cases were not gated (record one: "
              f"ci/bench_gate.py RUN.json --update-baseline --family {fam} --note ...)", file=sys.stderr)
    failed = (summary["FAIL"] > 0 or not baseline or not run["cases"]
              or (summary["missing"] and not args.allow_missing) or (args.strict and summary["inconclusive"]))
    no_baseline = bool(unbased) and not args.allow_no_baseline
    if args.report:
        args.report.write_text(json.dumps({"gpu": run["gpu"], "baseline_dir": str(directory),
                                           "passed": not failed and not no_baseline, "counts": summary,
                                           "no_baseline": unbased, "commit": run.get("commit"),
                                           "commit_source": run.get("commit_source"), "rows": rows}, indent=2) + "\n")
    return 1 if failed else EXIT_NO_BASELINE if no_baseline else 0


if __name__ == "__main__":
    sys.exit(main())
