"""pytest-benchmark suite for the attention kernels (tier 4): decode, one case per (B, L, KV layout), and prefill,
one case per (B, L, causal, kernel and KV layout).

Decode figures are measured by bench_attention.measure (CUDA events around CUDA-graph replays, inputs rotated
past the L2; cuDNN and flash SDPA on the same K/V measured in the same run), plus a device copy of the same
number of bytes (gpu_timing.time_copy) as the memory-bound ceiling, repeated REPEATS times for the run-to-run
spread. Each case's extra_info, as gpu_timing.summarize writes it: kernel_us, anchor ("cuDNN SDPA"), anchor_us,
ratio = anchor_us / kernel_us, ratios, spread, ceiling ("copy"), ceiling_us, tbps (K+V bytes read / kernel
time), fraction_of_ceiling (kernel TB/s over the copy's), and flash_us / ratio_vs_flash beside it. Where cuDNN
refuses a shape in any repeat, flash SDPA is the anchor and the record says so (the gate then reports the case
as inconclusive against a cuDNN baseline instead of comparing unlike ratios).

Prefill figures come from bench_attention.measure_prefill (one input set: compute-bound), with the ceiling a
cuBLAS bf16 GEMM of the same FLOPs in the same run (gpu_timing.time_gemm); extra_info has tflops in place of
tbps, and fraction_of_ceiling is the GEMM's time over the kernel's.

    python -m pytest tests/bench/test_bench_attention.py --benchmark-only --benchmark-json=OUT.json
"""

from __future__ import annotations

import functools
import statistics
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_attention  # noqa: E402
import gpu_timing  # noqa: E402

from astrai.extension.ops import attention as ops  # noqa: E402

REPEATS = 3
HEADS_Q, HEADS_KV, HEAD_DIM = 32, 8, 128  # GQA 4, D 128: the shapes of docs/benchmarks.md
# (B, L): latency-bound single sequences up to bandwidth-bound batches; pinned here (not the script's
# defaults, which other work extends) so the gate's case list changes only on purpose.
DECODE_SHAPES = ((1, 512), (1, 4096), (1, 32768), (16, 4096), (16, 16384), (64, 4096), (64, 16384))
DECODE_KINDS = ("contiguous", "paged16")


def _anchor(rows: list[dict]) -> tuple[str, str]:
    """cuDNN SDPA as the anchor when it ran in every repeat, else flash SDPA; a case with neither fails."""
    anchor, key = ("cuDNN SDPA", "cudnn_us") if all(r.get("cudnn_us") for r in rows) else ("flash SDPA", "flash_us")
    if not all(r.get(key) for r in rows):
        pytest.fail(f"no SDPA anchor ran in every repeat (cuDNN: {[r.get('cudnn_us') for r in rows]}, "
                    f"flash: {[r.get('flash_us') for r in rows]})")
    return anchor, key


def _vs_flash(rows: list[dict]) -> dict:
    flash = [(r["flash_us"], r["kernel_us"]) for r in rows if r.get("flash_us")]
    return {"flash_us": statistics.median(f for f, _ in flash) if flash else None,
            "ratio_vs_flash": statistics.median(f / k for f, k in flash) if flash else None}


def record(rows: list[dict]) -> dict:
    """Decode rows of one case (one per repeat, each with the kernel, anchors and copy_us of that run) -> its
    record (the anchor as _anchor picks it, the copy as the ceiling)."""
    anchor, key = _anchor(rows)
    runs = [{"kernel_us": r["kernel_us"], "anchor_us": r[key], "ceiling_us": r["copy_us"], "tbps": r["kernel_tbps"],
             "fraction": r["copy_us"] / r["kernel_us"]} for r in rows]  # same bytes: the ratio of the times
    return {**gpu_timing.summarize(runs, anchor=anchor, ceiling="copy"), **_vs_flash(rows),
            **{k: rows[0][k] for k in ("kv_bytes", "input_sets", "calls_per_graph", "replays")}}


def record_prefill(rows: list[dict]) -> dict:
    """Prefill rows of one case (one per repeat, each with the kernel, anchors and gemm_us of that run) -> its
    record: the anchor as _anchor picks it, the same-FLOPs cuBLAS GEMM as the ceiling, TFLOP/s."""
    anchor, key = _anchor(rows)
    runs = [{"kernel_us": r["kernel_us"], "anchor_us": r[key], "ceiling_us": r["gemm_us"],
             "tflops": r["kernel_tflops"], "fraction": r["gemm_us"] / r["kernel_us"]} for r in rows]
    return {**gpu_timing.summarize(runs, anchor=anchor, ceiling="cuBLAS bf16"), **_vs_flash(rows),
            **{k: rows[0][k] for k in ("flops", "calls_per_graph", "replays")}}


# ---- decode: attn_decode (contiguous K/V) and attn_paged_decode (page 16) -------------------------------

def decode_case_id(batch: int, length: int, kind: str) -> str:
    """The case name shared with the baselines (benchmarks/baselines/<gpu>/attention.json)."""
    return f"attention.decode[B={batch},L={length},{kind}]"


def repeated(measure, ceiling_key: str, ceiling_of) -> dict[str, list[dict]]:
    """REPEATS runs of measure() (rows, one per kind), each row given ceiling_of(its run's first row) under
    ceiling_key, the ceiling measured right after that run: rows keyed by kind."""
    runs: dict[str, list[dict]] = {}
    for _ in range(REPEATS):
        rows = measure()
        ceiling = ceiling_of(rows[0])
        for row in rows:
            runs.setdefault(row["kind"], []).append({**row, ceiling_key: ceiling})
    return runs


@functools.cache
def measured_decode(batch: int, length: int) -> dict[str, list[dict]]:
    """bench_attention.measure for one (B, L), repeated, with the copy of the same bytes as the ceiling."""
    return repeated(lambda: bench_attention.measure(batch, length, heads_q=HEADS_Q, heads_kv=HEADS_KV,
                                                    head_dim=HEAD_DIM),
                    "copy_us", lambda row: gpu_timing.time_copy(row["kv_bytes"]))


@pytest.mark.requires_cuda_kernels("attention")
@pytest.mark.parametrize("kind", DECODE_KINDS)
@pytest.mark.parametrize("batch,length", DECODE_SHAPES, ids=[f"B{b}xL{n}" for b, n in DECODE_SHAPES])
def test_decode(benchmark, batch, length, kind):
    benchmark.group = f"attention.decode B={batch} L={length}"
    rows = measured_decode(batch, length)[kind]
    benchmark.extra_info.update({"case": decode_case_id(batch, length, kind), "family": "attention",
                                 "batch": batch, "kv_len": length, "kind": kind, "heads_q": HEADS_Q,
                                 "heads_kv": HEADS_KV, "head_dim": HEAD_DIM, **record(rows)})
    s = bench_attention._make_set(batch, length, HEADS_Q, HEADS_KV, HEAD_DIM)

    def eager_call():
        if kind == "contiguous":
            ops.attn_decode(s["q"], s["k"], s["v"], s["kv_lens"])
        else:
            ops.attn_paged_decode(s["q"], s["k_cache"], s["v_cache"], s["page_table"], s["kv_lens"])
        torch.cuda.synchronize()

    benchmark.pedantic(eager_call, rounds=20, iterations=1, warmup_rounds=3)
    s.clear()  # B=64, L=16384: 8.6 GB of K/V and pages
    torch.cuda.empty_cache()


# ---- prefill: attn_prefill (contiguous K/V; contig-mma: the mma.sync kernel every non-Hopper GPU runs, forced by
# attention_plan.set_staging(sm90=False) where the sm_90a one would take the call) and attn_paged_prefill (page 16) --

# (B, L, causal): pinned, like DECODE_SHAPES; a short and a long shape, causal and not, B 1 and 8 (the goal table
# of docs/benchmarks.md has all eight; four keep the tier's time near its limit).
PREFILL_SHAPES = ((1, 2048, True), (1, 8192, False), (8, 2048, False), (8, 8192, True))
PREFILL_KINDS = ("contiguous", "paged16", "contig-mma")


def prefill_case_id(batch: int, length: int, causal: bool, kind: str) -> str:
    """The case name shared with the baselines (benchmarks/baselines/<gpu>/attention.json)."""
    return f"attention.prefill[B={batch},L={length},{'causal' if causal else 'full'},{kind}]"


@functools.cache
def measured_prefill(batch: int, length: int, causal: bool) -> dict[str, list[dict]]:
    """bench_attention.measure_prefill for one shape, repeated, with the same-FLOPs GEMM as the ceiling."""
    return repeated(lambda: bench_attention.measure_prefill(batch, length, causal, heads_q=HEADS_Q,
                                                            heads_kv=HEADS_KV, head_dim=HEAD_DIM),
                    "gemm_us", lambda row: gpu_timing.time_gemm(row["flops"]))


@pytest.mark.requires_cuda_kernels("attention")
@pytest.mark.parametrize("kind", PREFILL_KINDS)
@pytest.mark.parametrize("batch,length,causal", PREFILL_SHAPES,
                         ids=[f"B{b}xL{n}{'-causal' if c else ''}" for b, n, c in PREFILL_SHAPES])
def test_prefill(benchmark, batch, length, causal, kind):
    benchmark.group = f"attention.prefill B={batch} L={length} {'causal' if causal else 'full'}"
    rows = measured_prefill(batch, length, causal)[kind]
    benchmark.extra_info.update({"case": prefill_case_id(batch, length, causal, kind), "family": "attention",
                                 "batch": batch, "q_len": length, "kv_len": length, "causal": causal, "kind": kind,
                                 "heads_q": HEADS_Q, "heads_kv": HEADS_KV, "head_dim": HEAD_DIM,
                                 **record_prefill(rows)})
    s = bench_attention._make_prefill_set(batch, length, HEADS_Q, HEADS_KV, HEAD_DIM)

    def contiguous(s):
        return ops.attn_prefill(s["q"], s["k"], s["v"], is_causal=causal)

    def paged(s):
        return ops.attn_paged_prefill(s["q"], s["k_cache"], s["v_cache"], s["page_table"], s["kv_lens"],
                                      is_causal=causal)

    step = {"contiguous": contiguous, "paged16": paged,
            "contig-mma": bench_attention._with_staging(contiguous, sm90=False)}[kind]

    def eager_call():
        step(s)
        torch.cuda.synchronize()

    benchmark.pedantic(eager_call, rounds=5, iterations=1, warmup_rounds=1)
    s.clear()
    torch.cuda.empty_cache()
