"""Tier 0: ci/gpu_run.sh's control flow on the CPU (a stand-in nvidia-smi, fixture benchmark JSON): a tier
that fails makes the whole call fail, the summary table comes last, and an unknown tier is refused."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_bench_gate import pytest_benchmark_json  # noqa: E402

BASELINE = json.loads((ROOT / "benchmarks" / "baselines" / "h200" / "rotary.json").read_text())["cases"]


def run_gpu_run(tmp_path: Path, scale_one_case: float, *tiers: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    smi = fake / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$*" in *compute_cap*) echo 9.0 ;; *) echo "NVIDIA H200" ;; esac\n')
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    cases = {c: (r["ratio"], 0.01) for c, r in BASELINE.items()}
    worst = "rotary.qk[T=4096,neox,in_place]"
    cases[worst] = (cases[worst][0] * scale_one_case, 0.01)
    (out / "bench.json").write_text(json.dumps(pytest_benchmark_json(cases)))
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}", OUT=str(out), PYTHON=sys.executable)
    return subprocess.run(["bash", str(ROOT / "ci" / "gpu_run.sh"), *tiers], capture_output=True, text=True,
                          env=env, timeout=120)


def summary(proc: subprocess.CompletedProcess) -> dict[str, str]:
    lines = proc.stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("=== summary"))
    assert lines[start + 1].split()[:3] == ["tier", "status", "seconds"]
    return {line[:15].strip(): line[16:34].strip() for line in lines[start + 2:]}  # printf "%-15s %-18s"


def test_gate_tier_passes_on_the_baseline_and_the_table_comes_last(tmp_path):
    proc = run_gpu_run(tmp_path, 1.0, "bench-gate")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary(proc) == {"bench-gate": "pass"}
    assert "NVIDIA H200" in proc.stdout


def test_a_regressed_case_fails_the_call(tmp_path):
    proc = run_gpu_run(tmp_path, 0.85, "bench-gate")
    assert proc.returncode == 1
    assert summary(proc) == {"bench-gate": "FAIL(1)"}
    assert "1 FAIL" in proc.stdout.splitlines()[-1]


def test_unknown_tier_is_refused(tmp_path):
    proc = run_gpu_run(tmp_path, 1.0, "no-such-tier")
    assert proc.returncode == 2 and "unknown tier" in proc.stdout


def test_budget_skips_the_rest(tmp_path, monkeypatch):
    monkeypatch.setenv("BUDGET_S", "0")
    proc = run_gpu_run(tmp_path, 1.0, "bench-gate", "dashboard")
    assert proc.returncode == 0
    assert summary(proc) == {"bench-gate": "skip(budget)", "dashboard": "skip(budget)"}


@pytest.mark.parametrize("tier", ["test-gpu"])
def test_a_pytest_tier_where_everything_skipped_fails(tmp_path, tier):
    """On this CPU machine every GPU test skips: the tier must not count that as a pass."""
    proc = run_gpu_run(tmp_path, 1.0, tier)
    assert summary(proc)[tier] == "FAIL(0 passed)", proc.stdout[-2000:]
