"""pytest-benchmark suite for quant_gemm (tier 4): one case per (pair, M, N, K), named `gemm.<pair>[M=..,N=..,K=..]`.

The figures are measured by bench_gemm.measure (CUDA events around CUDA-graph replays, input sets rotated past
the L2 where one set would sit in it; the anchor and the weight-stream copy measured in the same run), repeated
REPEATS times for the run-to-run spread, and stored in each case's extra_info as gpu_timing.summarize writes
them: kernel_us, anchor (bench_gemm.ANCHORS: cuBLAS bf16 F.linear, torch._int_mm, torch._scaled_mm tensorwise
or rowwise), anchor_us, ratio = anchor_us / kernel_us, ratios, spread, ceiling ("weight stream (copy)"),
ceiling_us (a copy of the weight bytes), tbps (weight bytes / kernel time), fraction_of_ceiling; beside them
kernel_tflops / anchor_tflops, the built-in plan, and for w8a16 the torch dequantize-then-F.linear path
(dequant_us, ratio_vs_dequant).

Grid (issue 19): (N, K) of Llama and DeepSeek-V3 layers x M in MS x the five pairs, 360 cases. Which run:

    ASTRAI_BENCH_GEMM unset or "default"   DEFAULT_PAIRS x DEFAULT_MS x DEFAULT_SHAPES: 60 cases, the gated
                                           subset (benchmarks/baselines/<gpu>/gemm.json holds these)
    ASTRAI_BENCH_GEMM=full                 the whole grid (gated cases plus 300 reported as "new")

    python -m pytest tests/bench/test_bench_gemm.py --benchmark-only --benchmark-json=OUT.json
    ASTRAI_BENCH_GEMM=full python -m pytest tests/bench/test_bench_gemm.py --benchmark-only \
        --benchmark-json=OUT.json [-k w8a16]          # several minutes: -k slices it under a per-call limit

fp8 cases skip, saying why, where the GPU is below sm_89 or the image cannot run fp8 (bench_gemm.fp8_blocker).
"""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gemm  # noqa: E402
import gpu_timing  # noqa: E402

LLAMA_SHAPES = ((4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336))                  # (N, K)
DEEPSEEK_SHAPES = ((2112, 7168), (24576, 1536), (7168, 16384), (4096, 7168), (7168, 2048))  # (N, K)
SHAPES = LLAMA_SHAPES + DEEPSEEK_SHAPES
MS = (1, 16, 64, 128, 256, 1024, 4096, 8192)
PAIRS = bench_gemm.PAIRS

# The gated subset: the weight stream (M = 1, 16) and the compute-bound regime (M = 1024, 4096) of every pair,
# on a square Llama layer, its wide up-projection and DeepSeek's narrow N = 2112 (a partial last N tile, split K
# at small M). Time on an H200, from the other suites' design (3 timed graphs of ~1-2 ms x 23 replays, a copy,
# 3 repeats, an eager round): ~0.35 s a case at M <= 16, ~0.6-1.2 s at M >= 1024 (today's kernels at 0.3-0.7x
# the anchor make their graphs 2-3x longer): ~40 s for the 60 cases, <= 90 s allowing 2x for the estimate.
# The full grid: ~4 min (M = 8192 and 7168 x 16384 dominate).
DEFAULT_PAIRS = PAIRS
DEFAULT_MS = (1, 16, 1024, 4096)
DEFAULT_SHAPES = ((4096, 4096), (14336, 4096), (2112, 7168))
SELECTIONS = ("default", "full")
REPEATS = 3


def cases(selection: str) -> list[tuple[str, int, int, int]]:
    """(pair, M, N, K) of a selection: "default" (the gated subset) or "full" (the grid)."""
    if selection == "full":
        return [(p, m, n, k) for n, k in SHAPES for m in MS for p in PAIRS]
    if selection == "default":
        return [(p, m, n, k) for n, k in DEFAULT_SHAPES for m in DEFAULT_MS for p in DEFAULT_PAIRS]
    raise ValueError(f"ASTRAI_BENCH_GEMM must be one of {SELECTIONS} (or unset), got {selection!r}")


SELECTION = os.environ.get("ASTRAI_BENCH_GEMM", "").strip() or "default"
CASES = cases(SELECTION)


def case_id(pair: str, m: int, n: int, k: int) -> str:
    """The case name shared with the baselines (benchmarks/baselines/<gpu>/gemm.json)."""
    return f"gemm.{pair}[M={m},N={n},K={k}]"


def repeated(pair: str, m: int, n: int, k: int) -> list[dict]:
    """REPEATS independent runs of bench_gemm.measure for one case (each with its own copy floor)."""
    return [bench_gemm.measure(pair, m, n, k) for _ in range(REPEATS)]


def record(rows: list[dict]) -> dict:
    """bench_gemm rows of one case (one per repeat) -> its record: gpu_timing.summarize's keys (the copy of the
    weight bytes as the ceiling, weight TB/s) and the case's extra figures."""
    anchors = {r["anchor"] for r in rows}
    if len(anchors) != 1:
        raise ValueError(f"bench_gemm rows of one case name different anchors: {sorted(anchors)}")
    runs = [{"kernel_us": r["kernel_us"], "anchor_us": r["anchor_us"], "ceiling_us": r["copy_us"],
             "tbps": r["kernel_wtbps"], "fraction": r["copy_us"] / r["kernel_us"]} for r in rows]  # same bytes
    rec = {**gpu_timing.summarize(runs, anchor=anchors.pop(), ceiling=bench_gemm.CEILING),
           "kernel_tflops": statistics.median(r["kernel_tflops"] for r in rows),
           "anchor_tflops": statistics.median(r["anchor_tflops"] for r in rows),
           "copy_tbps": statistics.median(r["copy_tbps"] for r in rows),
           **{key: rows[0][key] for key in ("plan", "out_dtype", "weight_bytes", "flops", "input_sets",
                                            "calls_per_graph", "replays")}}
    if all(r.get("dequant_us") for r in rows):
        rec.update(dequant=bench_gemm.DEQUANT, dequant_us=statistics.median(r["dequant_us"] for r in rows),
                   ratio_vs_dequant=statistics.median(r["dequant_us"] / r["kernel_us"] for r in rows))
    return rec


@pytest.mark.requires_cuda_kernels("gemm")
@pytest.mark.parametrize("pair,m,n,k", CASES, ids=[f"{p}-M{m}-N{n}-K{k}" for p, m, n, k in CASES])
def test_gemm(benchmark, pair, m, n, k):
    benchmark.group = f"gemm N={n} K={k} M={m}"
    try:
        rows = repeated(pair, m, n, k)
    except bench_gemm.Unavailable as exc:
        pytest.skip(str(exc))
    benchmark.extra_info.update({"case": case_id(pair, m, n, k), "family": "gemm", "pair": pair, "m": m, "n": n,
                                 "k": k, **record(rows)})
    s = bench_gemm.make_set(pair, m, n, k)
    step = bench_gemm.kernel_step(pair, m)

    def eager_call():
        step(s)
        torch.cuda.synchronize()

    benchmark.pedantic(eager_call, rounds=20 if m <= 64 else 5, iterations=1, warmup_rounds=3)
    s.clear()
    torch.cuda.empty_cache()
