"""Tier 0: ci/gpu_run.sh's control flow on the CPU (a stand-in nvidia-smi, fixture benchmark JSON): a tier
that fails makes the whole call fail, the summary table comes last, and an unknown tier is refused; the
commit is named without git; cu-tests runs the ctest registration relocated from another machine's paths
(a newly registered test included, with no list to edit), falls back to direct runs only saying why; the
summary says where the dashboard gets rendered when it is not rendered here.

Like a GPU machine given a copy of the tree, the runs here see no git (a stand-in `git` that fails)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_bench_gate import pytest_benchmark_json  # noqa: E402
from test_cu_harness import registered_tests  # noqa: E402

# Every family's stored H200 baseline: a fake run with all of them passes the gate.
BASELINE = {case: rec for f in sorted((ROOT / "benchmarks" / "baselines" / "h200").glob("*.json"))
            for case, rec in json.loads(f.read_text())["cases"].items()}


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def fake_bin(tmp_path: Path) -> Path:
    fake = tmp_path / "bin"
    _executable(fake / "nvidia-smi", '#!/bin/sh\ncase "$*" in *compute_cap*) echo 9.0 ;; *) echo "NVIDIA H200" ;; esac\n')
    _executable(fake / "git", "#!/bin/sh\necho 'fatal: not a git repository' >&2\nexit 128\n")
    return fake


def run_gpu_run(tmp_path: Path, scale_one_case: float, *tiers: str, script: Path = ROOT / "ci" / "gpu_run.sh",
                env_extra: dict | None = None, extra_cases: dict | None = None) -> subprocess.CompletedProcess:
    fake = fake_bin(tmp_path)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    cases = {c: (r["ratio"], 0.01) for c, r in BASELINE.items()}
    worst = "rotary.qk[T=4096,neox,in_place]"
    cases[worst] = (cases[worst][0] * scale_one_case, 0.01)
    cases = {**(extra_cases or {}), **cases}  # a stored baseline's ratio wins over an extra case's
    (out / "bench.json").write_text(json.dumps(pytest_benchmark_json(cases)))
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}", OUT=str(out), PYTHON=sys.executable)
    env.pop("ASTRAI_GIT_COMMIT", None)
    env.update(env_extra or {})
    return subprocess.run(["bash", str(script), *tiers], capture_output=True, text=True, env=env, timeout=120)


def summary(proc: subprocess.CompletedProcess) -> dict[str, str]:
    lines = proc.stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("=== summary"))
    assert lines[start + 1].split()[:3] == ["tier", "status", "seconds"]
    return {line[:15].strip(): line[16:36].strip() for line in lines[start + 2:]}  # printf "%-15s %-20s"


def details(proc: subprocess.CompletedProcess) -> dict[str, str]:
    lines = proc.stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("=== summary"))
    return {line[:15].strip(): line[45:].strip() for line in lines[start + 2:]}  # after "%7s  "


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


def test_a_family_without_baseline_shows_as_no_baseline(tmp_path):
    """The gemm suite's cases before benchmarks/baselines/h200/gemm.json is recorded: every other family passes,
    and the tier reads FAIL(no baseline) naming gemm (bench_gate exits 3), not pass; once recorded, they pass."""
    sys.path.insert(0, str(ROOT / "tests" / "bench"))
    import test_bench_gemm as gemm
    extra = {gemm.case_id(*c): (1.0, 0.01) for c in gemm.cases("default")}
    proc = run_gpu_run(tmp_path, 1.0, "bench-gate", extra_cases=extra)
    if any(c.startswith("gemm.") for c in BASELINE):
        assert summary(proc) == {"bench-gate": "pass"}, proc.stdout[-2000:]
        return
    assert proc.returncode == 1 and summary(proc) == {"bench-gate": "FAIL(no baseline)"}, proc.stdout[-2000:]
    assert details(proc)["bench-gate"].endswith("60 no-baseline (no baseline: gemm)")
    assert "--update-baseline --family gemm" in proc.stdout


def test_unknown_tier_is_refused(tmp_path):
    proc = run_gpu_run(tmp_path, 1.0, "no-such-tier")
    assert proc.returncode == 2 and "unknown tier" in proc.stdout


@pytest.mark.parametrize("tier, made", [("models", "models.json"), ("decode-probe", "decode_step.json"),
                                        ("plan-sweeps", "sweep JSON")])
def test_the_model_tiers_are_explicit_and_fail_without_a_gpu(tmp_path, tier, made):
    """`models` (bench_models.py), `decode-probe` (probe_decode_step.py) and `plan-sweeps` (gemm_tune sweep) are not
    default tiers; asked for on this CPU machine each runs and fails (no CUDA), and the summary says its JSON did not
    come out, so the call fails rather than passing empty."""
    proc = run_gpu_run(tmp_path, 1.0, tier)
    assert proc.returncode == 1
    assert summary(proc)[tier].startswith("FAIL("), proc.stdout[-2000:]
    assert details(proc)[tier] == f"no {made}"
    default = (ROOT / "ci" / "gpu_run.sh").read_text().split("|| tiers=(", 1)[1].split(")", 1)[0].split()
    assert tier not in default


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


def test_commit_without_git_comes_from_the_caller_then_the_image(tmp_path):
    proc = run_gpu_run(tmp_path, 1.0, "bench-gate", env_extra={"ASTRAI_GIT_COMMIT": "feedbeefcafe"})
    assert "commit: feedbeefcafe (from ASTRAI_GIT_COMMIT (set by the caller))" in proc.stdout
    proc = run_gpu_run(tmp_path, 1.0, "bench-gate")
    images = sorted(ROOT.glob("astrai/extension/lib/cu*/image.json"))
    want = json.loads(images[-1].read_text())["git_revision"] if images else "unknown"
    assert f"commit: {want} (from git_revision of the image" in proc.stdout


def test_the_summary_says_where_the_dashboard_is_rendered(tmp_path):
    """A GPU machine without matplotlib (a python that cannot import it): the tier skips and the summary says
    where and how the dashboard gets rendered."""
    python = tmp_path / "python-without-matplotlib"
    _executable(python, f'#!/bin/sh\n[ "$1" = -c ] && [ "$2" = "import matplotlib" ] && exit 1\nexec {sys.executable} "$@"\n')
    proc = run_gpu_run(tmp_path, 1.0, "dashboard", env_extra={"PYTHON": str(python)})
    assert summary(proc)["dashboard"] == "skip(no matplotlib)"
    assert "render it on the CPU side from this run's JSON" in proc.stdout
    assert "nox -s dashboard -- --run" in proc.stdout and "bench-gate.json" in proc.stdout


# ---- cu-tests on a copied tree: the ctest registration records another machine's paths ------------------

# The standalone tests by family, read from csrc/CMakeLists.txt's TESTS clauses: every registered one travels.
TEST_FAMILY = registered_tests()
TESTS = tuple(sorted(TEST_FAMILY))


def copied_tree(tmp_path: Path, failing: str = "", register: bool = True) -> Path:
    """A repository copy holding ci/ and an image build whose CTestTestfile.cmake was written on a machine
    with its tree at /elsewhere/repo (as CMake writes it); the 'tests' are scripts that record their run."""
    repo = tmp_path / "repo"
    (repo / "ci").mkdir(parents=True)
    for name in ("gpu_run.sh", "sanitize.py", "tier_detail.py", "bench_gate.py"):
        shutil.copy(ROOT / "ci" / name, repo / "ci" / name)
    build = repo / "build" / "py3-none-linux_x86_64"
    lines = ["# CMake generated Testfile for ", "# Source directory: /elsewhere/repo/csrc",
             "# Build directory: /elsewhere/repo/build/py3-none-linux_x86_64/csrc", "# "]
    for test in TESTS:
        _executable(build / "tests" / test,
                    f"#!/bin/sh\necho \"{test} $*\" >> {tmp_path}/ran.log\nexit {1 if test == failing else 0}\n")
        binary = f"/elsewhere/repo/build/py3-none-linux_x86_64/tests/{test}"
        family = TEST_FAMILY[test]
        for name, extra in ((test, ""), (f"{test}.small", ' "--small"')):
            lines.append(f'add_test([=[{name}]=] "{binary}"{extra})')
            lines.append(f'set_tests_properties([=[{name}]=] PROPERTIES  LABELS "cu-test;{family}" TIMEOUT "300" '
                         f'_BACKTRACE_TRIPLES "/elsewhere/repo/csrc/cmake/astrai_family.cmake;76;add_test;")')
    if register:
        (build / "csrc").mkdir(parents=True)
        (build / "csrc" / "CTestTestfile.cmake").write_text("\n".join(lines) + "\n")
    return repo


needs_ctest = pytest.mark.skipif(shutil.which("ctest") is None, reason="ctest is not on PATH")


@needs_ctest
def test_cu_tests_run_through_the_relocated_registration(tmp_path):
    repo = copied_tree(tmp_path)
    proc = run_gpu_run(tmp_path, 1.0, "cu-tests", script=repo / "ci" / "gpu_run.sh")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert summary(proc) == {"cu-tests": "pass"}
    assert "recorded roots rewritten" in details(proc)["cu-tests"]
    ran = (tmp_path / "ran.log").read_text().split("\n")
    assert sorted(line for line in ran if line) == sorted(f"{t} " for t in TESTS)  # full tables, each once
    cases = {c.get("name") for c in ET.parse(tmp_path / "out" / "cu-tests.xml").getroot().iter("testcase")}
    assert cases == set(TESTS)  # the newly registered attn_prefill_test included, no list edited


@needs_ctest
def test_a_failing_registered_test_fails_the_tier(tmp_path):
    repo = copied_tree(tmp_path, failing="attn_prefill_test")
    proc = run_gpu_run(tmp_path, 1.0, "cu-tests", script=repo / "ci" / "gpu_run.sh")
    assert proc.returncode == 1 and summary(proc)["cu-tests"].startswith("FAIL")


def test_without_a_registration_the_binaries_run_directly_saying_why(tmp_path):
    repo = copied_tree(tmp_path, register=False)
    proc = run_gpu_run(tmp_path, 1.0, "cu-tests", script=repo / "ci" / "gpu_run.sh")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert details(proc)["cu-tests"].startswith(f"ran {len(TESTS)} binaries directly: no usable ctest registration")
    assert "no build/*/csrc/CTestTestfile.cmake" in (tmp_path / "out" / "cu-tests.log").read_text()
