"""Tier 0: the pytest-benchmark suites (tests/bench) without a GPU: all three collect with case names the gate
can file by family, each case's record is folded from its repeats as documented, attention's anchor falls
back to flash SDPA only when cuDNN did not run (and a case with no anchor fails), and a run outside git
names its commit from $ASTRAI_GIT_COMMIT or the image's recorded revision."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "tests" / "bench"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "ci"))
import bench_gate  # noqa: E402
import gpu_timing  # noqa: E402
import test_bench_attention as attention  # noqa: E402
import test_bench_quantize as quantize  # noqa: E402
import test_bench_rotary as rotary  # noqa: E402


def test_every_suite_collects():
    out = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", str(BENCH)],
                         capture_output=True, text=True, cwd=ROOT).stdout
    per_file = {name: out.count(f"{name}::") for name in ("test_bench_rotary.py", "test_bench_quantize.py",
                                                          "test_bench_attention.py")}
    assert per_file == {"test_bench_rotary.py": 16, "test_bench_quantize.py": 2 * len(quantize.bench_quantize.CASES),
                        "test_bench_attention.py": len(attention.DECODE_SHAPES) * len(attention.DECODE_KINDS) +
                        len(attention.PREFILL_SHAPES) * len(attention.PREFILL_KINDS)}, out[-2000:]


def test_case_names_are_unique_and_filed_by_family():
    names = {
        "rotary": [rotary.case_id(t, p, m) for t in rotary.TOKENS for p in rotary.PAIRINGS for m in
                   ("out_of_place", "in_place")],
        "quantize": [quantize.case_id(c, m, n) for m, n in quantize.SHAPES for c in quantize.bench_quantize.CASES],
        "attention": [attention.decode_case_id(b, n, k) for b, n in attention.DECODE_SHAPES
                      for k in attention.DECODE_KINDS] +
                     [attention.prefill_case_id(b, n, c, k) for b, n, c in attention.PREFILL_SHAPES
                      for k in attention.PREFILL_KINDS],
    }
    for family, cases in names.items():
        assert len(set(cases)) == len(cases), family
        assert {bench_gate.family(c) for c in cases} == {family}


def test_summarize_folds_repeats():
    rows = [{"kernel_us": k, "anchor_us": a, "ceiling_us": c, "tbps": t, "fraction": f}
            for k, a, c, t, f in ((10.0, 100.0, 9.0, 3.0, 0.9), (11.0, 99.0, 9.5, 2.8, 0.85), (10.0, 110.0, 9.0, 3.1, 0.92))]
    rec = gpu_timing.summarize(rows, anchor="torch", ceiling="copy")
    assert rec["ratios"] == [10.0, 9.0, 11.0] and rec["ratio"] == 10.0
    assert rec["spread"] == pytest.approx(0.2)
    assert (rec["kernel_us"], rec["anchor_us"], rec["ceiling_us"], rec["tbps"], rec["fraction_of_ceiling"]) == (
        10.0, 100.0, 9.0, 3.0, 0.9)
    assert rec["anchor"] == "torch" and rec["ceiling"] == "copy" and rec["repeats"] == 3


def _decode_row(kernel_us, cudnn_us, flash_us):
    return {"kernel_us": kernel_us, "cudnn_us": cudnn_us, "flash_us": flash_us, "copy_us": 8.0, "kernel_tbps": 3.0,
            "kv_bytes": 1 << 20, "input_sets": 4, "calls_per_graph": 32, "replays": 20}


def test_attention_anchor_is_cudnn_then_flash_and_never_absent():
    rec = attention.record([_decode_row(10.0, 7.0, 20.0), _decode_row(10.0, 7.0, 20.0)])
    assert rec["anchor"] == "cuDNN SDPA" and rec["ratio"] == pytest.approx(0.7)
    assert rec["ratio_vs_flash"] == pytest.approx(2.0) and rec["fraction_of_ceiling"] == pytest.approx(0.8)
    rec = attention.record([_decode_row(10.0, 7.0, 20.0), _decode_row(10.0, None, 20.0)])
    assert rec["anchor"] == "flash SDPA" and rec["ratio"] == pytest.approx(2.0)
    with pytest.raises(pytest.fail.Exception, match="no SDPA anchor"):
        attention.record([_decode_row(10.0, None, None)])


def test_summarize_keeps_tflops_for_compute_bound_cases():
    rows = [{"kernel_us": 100.0, "anchor_us": 80.0, "ceiling_us": 60.0, "tflops": t, "fraction": 0.6}
            for t in (500.0, 520.0, 510.0)]
    rec = gpu_timing.summarize(rows, anchor="cuDNN SDPA", ceiling="cuBLAS bf16")
    assert rec["tflops"] == 510.0 and rec["tbps"] is None and rec["ceiling"] == "cuBLAS bf16"
    assert "tflops" not in gpu_timing.summarize([{**rows[0], "tflops": None, "tbps": 3.0}], anchor="a", ceiling="c")


def _prefill_row(kernel_us, cudnn_us, flash_us):
    return {"kernel_us": kernel_us, "cudnn_us": cudnn_us, "flash_us": flash_us, "gemm_us": 60.0,
            "kernel_tflops": 500.0, "flops": 5 * 10**10, "calls_per_graph": 9, "replays": 10}


def test_prefill_record_takes_the_gemm_ceiling_and_the_same_anchor_rule():
    rec = attention.record_prefill([_prefill_row(100.0, 80.0, 150.0), _prefill_row(100.0, 80.0, 150.0)])
    assert rec["anchor"] == "cuDNN SDPA" and rec["ratio"] == pytest.approx(0.8)
    assert rec["ceiling"] == "cuBLAS bf16" and rec["fraction_of_ceiling"] == pytest.approx(0.6)
    assert rec["tflops"] == 500.0 and rec["ratio_vs_flash"] == pytest.approx(1.5) and rec["flops"] == 5 * 10**10
    rec = attention.record_prefill([_prefill_row(100.0, None, 150.0), _prefill_row(100.0, 80.0, 150.0)])
    assert rec["anchor"] == "flash SDPA" and rec["ratio"] == pytest.approx(1.5)
    with pytest.raises(pytest.fail.Exception, match="no SDPA anchor"):
        attention.record_prefill([_prefill_row(100.0, None, None)])


def test_repeated_pairs_each_run_with_its_own_ceiling():
    calls = iter(range(100))
    runs = attention.repeated(lambda: [{"kind": k, "n": next(calls)} for k in ("a", "b")], "copy_us",
                              lambda row: 1000 + row["n"])
    assert runs == {"a": [{"kind": "a", "n": 0, "copy_us": 1000}, {"kind": "a", "n": 2, "copy_us": 1002},
                          {"kind": "a", "n": 4, "copy_us": 1004}],
                    "b": [{"kind": "b", "n": 1, "copy_us": 1000}, {"kind": "b", "n": 3, "copy_us": 1002},
                          {"kind": "b", "n": 5, "copy_us": 1004}]}
    assert attention.REPEATS == 3


def _bench_conftest():
    spec = importlib.util.spec_from_file_location("bench_conftest_under_test", BENCH / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_commit_outside_git_comes_from_the_environment_then_the_image(monkeypatch):
    hook = _bench_conftest().pytest_benchmark_update_commit_info
    info = {"id": "0123abc", "dirty": False}
    hook(None, info)
    assert info["id"] == "0123abc" and info["source"] == "git"  # git's answer stands
    monkeypatch.setenv("ASTRAI_GIT_COMMIT", "feedbeefcafe")
    info = {"id": "unversioned"}
    hook(None, info)
    assert info == {"id": "feedbeefcafe", "source": "ASTRAI_GIT_COMMIT"}
    info = {"id": "0123abc", "dirty": False}  # an explicit commit wins over a (possibly stale) copied .git
    hook(None, info)
    assert info["id"] == "feedbeefcafe" and info["source"] == "ASTRAI_GIT_COMMIT"
    monkeypatch.delenv("ASTRAI_GIT_COMMIT")
    monkeypatch.setattr(gpu_timing.loader, "describe", lambda: {
        "chosen": {"image": "cu130"}, "images": [{"name": "cu130", "git_revision": "cffc293a7ea8"}]})
    info = {"id": "unversioned"}
    hook(None, info)
    assert info == {"id": "cffc293a7ea8", "source": "image cu130 git_revision"}
    monkeypatch.setattr(gpu_timing.loader, "describe", lambda: {"chosen": None, "images": []})
    assert gpu_timing.commit(use_git=False) == ("unknown", "none (no git, no ASTRAI_GIT_COMMIT, no image revision)")
