"""Tier 0: the pytest-benchmark suites (tests/bench) without a GPU: all four collect with case names the gate
can file by family, each case's record is folded from its repeats as documented, attention's anchor falls
back to flash SDPA only when cuDNN did not run (and a case with no anchor fails), and a run outside git
names its commit from $ASTRAI_GIT_COMMIT or the image's recorded revision. The gemm suite: its grid and gated
subset, the ASTRAI_BENCH_GEMM selection, the record, and (with the torch path standing in for the kernel) that
its operands, scales and anchors agree and that the check before timing refuses a wrong kernel."""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "tests" / "bench"
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(ROOT / "ci"))
import bench_gate  # noqa: E402
import bench_gemm  # noqa: E402
import gpu_timing  # noqa: E402
import test_bench_attention as attention  # noqa: E402
import test_bench_gemm as gemm  # noqa: E402
import test_bench_quantize as quantize  # noqa: E402
import test_bench_rotary as rotary  # noqa: E402


def collect(path: Path, **env) -> subprocess.CompletedProcess:
    """pytest --co of `path` with ASTRAI_BENCH_GEMM as given (unset by default)."""
    environ = {k: v for k, v in os.environ.items() if k != "ASTRAI_BENCH_GEMM"}
    return subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", str(path)],
                          capture_output=True, text=True, cwd=ROOT, env={**environ, **env})


def test_every_suite_collects():
    out = collect(BENCH).stdout
    per_file = {name: out.count(f"{name}::") for name in ("test_bench_rotary.py", "test_bench_quantize.py",
                                                          "test_bench_attention.py", "test_bench_gemm.py")}
    assert per_file == {"test_bench_rotary.py": 16, "test_bench_quantize.py": 2 * len(quantize.bench_quantize.CASES),
                        "test_bench_attention.py": len(attention.DECODE_SHAPES) * len(attention.DECODE_KINDS) +
                        len(attention.PREFILL_SHAPES) * len(attention.PREFILL_KINDS),
                        "test_bench_gemm.py": 60}, out[-2000:]


def test_case_names_are_unique_and_filed_by_family():
    names = {
        "rotary": [rotary.case_id(t, p, m) for t in rotary.TOKENS for p in rotary.PAIRINGS for m in
                   ("out_of_place", "in_place")],
        "quantize": [quantize.case_id(c, m, n) for m, n in quantize.SHAPES for c in quantize.bench_quantize.CASES],
        "attention": [attention.decode_case_id(b, n, k) for b, n in attention.DECODE_SHAPES
                      for k in attention.DECODE_KINDS] +
                     [attention.prefill_case_id(b, n, c, k) for b, n, c in attention.PREFILL_SHAPES
                      for k in attention.PREFILL_KINDS],
        "gemm": [gemm.case_id(*c) for c in gemm.cases("full")],
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


# ---- gemm: grid, gated subset, selection, record, and the check before timing -----------------------------

def test_gemm_grid_is_the_issues_and_the_default_subset_lies_in_it():
    assert gemm.LLAMA_SHAPES == ((4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336))
    assert gemm.DEEPSEEK_SHAPES == ((2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168), (7168, 2048))
    assert gemm.MS == (1, 16, 64, 128, 256, 1024, 4096, 8192)
    assert gemm.PAIRS == ("w16a16", "w8a16", "w8a8", "fp8_tensor", "fp8_row")
    full, default = gemm.cases("full"), gemm.cases("default")
    assert len(full) == len(set(full)) == 9 * 8 * 5
    assert len(default) == len(set(default)) == 60 and set(default) <= set(full)
    # every pair at the weight stream and the compute-bound regime, on each default shape
    assert set(default) == {(p, m, n, k) for p in gemm.PAIRS for m in (1, 16, 1024, 4096)
                            for n, k in gemm.DEFAULT_SHAPES}
    assert gemm.case_id("w8a16", 1, 4096, 14336) == "gemm.w8a16[M=1,N=4096,K=14336]"
    assert gemm.SELECTION == "default" and gemm.CASES == default  # this process runs without ASTRAI_BENCH_GEMM
    with pytest.raises(ValueError, match="ASTRAI_BENCH_GEMM must be one of"):
        gemm.cases("all")


def test_gemm_selection_by_environment():
    path = BENCH / "test_bench_gemm.py"
    assert collect(path, ASTRAI_BENCH_GEMM="full").stdout.count("test_bench_gemm.py::") == 360
    assert collect(path, ASTRAI_BENCH_GEMM="default").stdout.count("test_bench_gemm.py::") == 60
    proc = collect(path, ASTRAI_BENCH_GEMM="everything")
    assert proc.returncode != 0 and "ASTRAI_BENCH_GEMM must be one of" in proc.stdout + proc.stderr


def test_gemm_anchors_outputs_and_weight_bytes():
    assert bench_gemm.anchor_name("w8a8", 17) == "torch._int_mm" and bench_gemm.out_dtype("w8a8", 17) == torch.int32
    assert "M <= 16" in bench_gemm.anchor_name("w8a8", 16) and bench_gemm.out_dtype("w8a8", 16) == torch.bfloat16
    for pair in ("w16a16", "w8a16", "fp8_tensor", "fp8_row"):
        assert bench_gemm.out_dtype(pair, 4096) == torch.bfloat16
    assert bench_gemm.anchor_name("w16a16", 1).startswith("cuBLAS bf16")
    assert bench_gemm.anchor_name("fp8_row", 1) == "torch._scaled_mm rowwise"
    n, k = 2112, 7168
    assert [bench_gemm.weight_bytes(p, n, k) for p in gemm.PAIRS] == [2 * n * k, n * k + 4 * n, n * k, n * k,
                                                                     n * k + 4 * n]


@pytest.mark.parametrize("touched", [1 << 20, 15 * 10**6, 59 * 10**6, 180 * 10**6, 2 * 10**9])
@pytest.mark.parametrize("est_us", [0.5, 10.0, 700.0, 6000.0])
def test_gemm_sets_rotate_past_the_l2(touched, est_us):
    l2 = 60 * 10**6
    n_sets, calls = bench_gemm.sets_and_calls(touched, est_us, l2)
    if n_sets < bench_gemm.MAX_SETS:
        assert n_sets * touched >= 3 * l2 and (n_sets == 1 or (n_sets - 1) * touched < 3 * l2)
    assert calls % n_sets == 0 and calls >= n_sets
    assert bench_gemm.MIN_CALLS <= calls <= max(n_sets, bench_gemm.MAX_CALLS)
    if touched >= 3 * l2:
        assert n_sets == 1  # a single set already streams: no rotation needed


def _gemm_row(kernel_us, anchor_us, copy_us, dequant_us=None, anchor="cuBLAS bf16 F.linear (bf16 weights)"):
    flops, wbytes = 2 * 16 * 4096 * 4096, 4096 * 4096 + 4 * 4096
    return {"anchor": anchor, "kernel_us": kernel_us, "anchor_us": anchor_us, "copy_us": copy_us,
            "dequant_us": dequant_us, "kernel_tflops": flops / kernel_us / 1e6,
            "anchor_tflops": flops / anchor_us / 1e6,
            "kernel_wtbps": wbytes / kernel_us / 1e6, "copy_tbps": wbytes / copy_us / 1e6, "plan": [2, 4],
            "out_dtype": "torch.bfloat16", "weight_bytes": wbytes, "flops": flops, "input_sets": 8,
            "calls_per_graph": 64, "replays": 20}


def test_gemm_record_folds_repeats_with_the_weight_stream_ceiling():
    rows = [_gemm_row(10.0, 9.0, 5.0, 40.0), _gemm_row(9.0, 9.9, 4.5, 36.0), _gemm_row(10.0, 11.0, 5.0, 50.0)]
    rec = gemm.record(rows)
    assert rec["anchor"] == "cuBLAS bf16 F.linear (bf16 weights)" and rec["ceiling"] == "weight stream (copy)"
    assert rec["ratios"] == pytest.approx([0.9, 1.1, 1.1]) and rec["ratio"] == pytest.approx(1.1)
    assert rec["spread"] == pytest.approx(0.2 / 1.1)
    assert (rec["kernel_us"], rec["anchor_us"], rec["ceiling_us"]) == (10.0, 9.9, 5.0)
    assert rec["fraction_of_ceiling"] == pytest.approx(0.5) and rec["repeats"] == 3
    assert rec["tbps"] == pytest.approx((4096 * 4096 + 4 * 4096) / 10.0 / 1e6)
    assert "tflops" not in rec  # a weight-stream (bandwidth) ceiling: the dashboard reads tflops as compute-bound
    assert rec["kernel_tflops"] == pytest.approx(2 * 16 * 4096 * 4096 / 10.0 / 1e6)
    assert rec["dequant"] == bench_gemm.DEQUANT and rec["dequant_us"] == 40.0 and rec["ratio_vs_dequant"] == 4.0
    assert rec["plan"] == [2, 4] and rec["input_sets"] == 8 and rec["calls_per_graph"] == 64
    plain = gemm.record([_gemm_row(10.0, 9.0, 5.0, anchor="torch._int_mm")])
    assert "dequant_us" not in plain and plain["anchor"] == "torch._int_mm"
    with pytest.raises(ValueError, match="different anchors"):
        gemm.record([_gemm_row(10.0, 9.0, 5.0), _gemm_row(10.0, 9.0, 5.0, anchor="torch._int_mm")])


def _torch_path():
    from astrai.extension.backend import gemm as backend
    return functools.partial(backend.quant_gemm, path="torch")


@pytest.mark.parametrize("pair", bench_gemm.PAIRS)
@pytest.mark.parametrize("m", [4, 16, 17, 40])
def test_gemm_check_accepts_the_contract_math_and_refuses_a_wrong_kernel(pair, m):
    """On the CPU the backend's torch path (the contract's math, after the op's own argument rules) stands in
    for the kernel: the operands, scales and output dtype the suite passes are valid, the anchor computes the
    same product, and a kernel off in one row is refused before any timing."""
    n, k = 48, 64
    s = bench_gemm.make_set(pair, m, n, k, device="cpu")
    kernel = _torch_path()
    err = bench_gemm.check(pair, m, s, gemm=kernel)
    assert err <= bench_gemm.TOLERANCE
    if pair == "w8a8" and m >= bench_gemm.INT_MM_MIN_M:
        assert err == 0.0  # int32 accumulators, exactly torch._int_mm's

    def one_row_wrong(*args, **kw):
        y = kernel(*args, **kw).clone()
        y[0] = -y[0] - 1
        return y

    with pytest.raises(RuntimeError, match=f"bench_gemm: {pair} M={m} N={n} K={k}: kernel disagrees"):
        bench_gemm.check(pair, m, s, gemm=one_row_wrong)

    def wrong_dtype(*args, **kw):
        return kernel(*args, **kw).float()

    with pytest.raises(RuntimeError, match="kernel gives torch.float32"):
        bench_gemm.check(pair, m, s, gemm=wrong_dtype)


def test_gemm_fp8_rowwise_scales_are_one_set_of_scales():
    s = bench_gemm.make_set("fp8_row", 8, 32, 64, device="cpu")
    assert s["a_scale"].shape == (8,) and s["a_scale_2d"].shape == (8, 1)
    assert s["b_scale"].shape == (32,) and s["b_scale_2d"].shape == (1, 32)
    assert s["a_scale"].data_ptr() == s["a_scale_2d"].data_ptr()
    assert s["b_scale"].data_ptr() == s["b_scale_2d"].data_ptr()
    t = bench_gemm.make_set("fp8_tensor", 8, 32, 64, device="cpu")
    assert t["a_scale"].shape == () and t["b_scale"].shape == ()


def test_gemm_dequant_path_is_the_anchors_product():
    """w8a16's extra figures time what the anchor computes, with the dequantize on every call."""
    s = bench_gemm.make_set("w8a16", 16, 48, 64, device="cpu")
    assert torch.equal(bench_gemm.dequant_step(s), bench_gemm.anchor_step("w8a16", 16)(s))


def test_gemm_anchor_refusal_is_unavailable_not_a_failure(monkeypatch):
    s = bench_gemm.make_set("fp8_row", 8, 32, 64, device="cpu")

    def refuse(*args, **kw):
        raise RuntimeError("RowWise scaling is not supported here\nmore")

    monkeypatch.setattr(torch, "_scaled_mm", refuse)
    with pytest.raises(bench_gemm.Unavailable, match="torch._scaled_mm rowwise refused the call here: RowWise"):
        bench_gemm.check("fp8_row", 8, s, gemm=_torch_path())


def test_gemm_fp8_blocker_reports_the_backend_then_the_op(monkeypatch):
    below_sm89 = "fp8 operands need an sm_89 or newer GPU"
    monkeypatch.setattr(bench_gemm.backend, "_cuda_blocker", lambda *a, **kw: below_sm89)
    assert bench_gemm.fp8_blocker("cpu") == below_sm89
    monkeypatch.setattr(bench_gemm.backend, "_cuda_blocker", lambda *a, **kw: None)

    def op(message):
        def run(*args, **kw):
            raise RuntimeError(message)
        return run

    monkeypatch.setattr(bench_gemm.ops, "quant_gemm", op("astrai.quant_gemm: this image runs compute_80 code on "
                                                         "this GPU, which has no fp8 mma (sm_89+ code needed)"))
    assert "no fp8 mma" in bench_gemm.fp8_blocker("cpu")
    monkeypatch.setattr(bench_gemm.ops, "quant_gemm", op("astrai.quant_gemm: something else broke"))
    with pytest.raises(RuntimeError, match="something else broke"):  # not an fp8 refusal: never a skip
        bench_gemm.fp8_blocker("cpu")
    monkeypatch.setattr(bench_gemm.ops, "quant_gemm", lambda *a, **kw: None)
    assert bench_gemm.fp8_blocker("cpu") is None


def test_attention_bench_leaves_out_an_anchor_that_refuses(monkeypatch, capsys):
    """bench_attention times anchors and kernels in one interleaved set (`gpu_timing.time_graphs`), so an SDPA backend
    that refuses the shapes must be found before: one trial call each, a RuntimeError drops that anchor (named on
    stderr), anything else propagates."""
    import bench_attention

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    calls = []

    def refuses(s):
        calls.append("cudnn")
        raise RuntimeError("No available kernel.\nmore detail")

    def runs(s):
        calls.append("flash")
        return s

    usable = bench_attention._usable_anchors({"cudnn": refuses, "flash": runs}, "sample", "B=1 L=64")
    assert list(usable) == ["flash"] and usable["flash"] is runs and calls == ["cudnn", "flash"]
    assert "cudnn SDPA unavailable for B=1 L=64: No available kernel." in capsys.readouterr().err

    def broken(s):
        raise ValueError("a bug, not a refusal")

    with pytest.raises(ValueError):
        bench_attention._usable_anchors({"flash": broken}, "sample", "B=1 L=64")
