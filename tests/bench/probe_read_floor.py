"""Probe (GPU): is a same-size copy the right floor for a small-M GEMM? A read-only stream of the weight bytes,
timed beside the copy, our w8a16 GEMM and cuBLAS bf16 on the gated suite's M <= 16 cells, all in one run.

    PYTHONPATH=.:tests/bench python tests/bench/probe_read_floor.py [out.json]

The gated suite's floor (gpu_timing.time_copy) moves the weight's bytes half read, half written; a small-M GEMM only
reads them. If HBM reads alone run faster than a copy's mix, the ceilings derived from the copy (docs/benchmarks.md,
twenty-ninth session: w8a16 vs cuBLAS bf16 at most 1.84-1.98x at M <= 16) are too low by that factor. The read is
torch's own reduction over the bytes (sum and amax of an int32 view: the faster one counts), inputs rotated past the
L2 like every gated case. Not gated; a developer probe for the planners' decision on issue 20's small-M goals.
On an H100 (2026-12-05) those reductions ran slower than the copy up to 30 MB (not bandwidth-bound there), so the
read column is a floor only for the largest weights.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
import sys

import torch
import torch.nn.functional as F

import gpu_timing
from astrai.extension.ops import gemm as gemm_ops

SHAPES = ((4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336), (2112, 7168), (24576, 1536), (7168, 16384),
          (4096, 7168), (7168, 2048))
REPLAYS = 20


def _sets(make, nbytes: int) -> list:
    """Enough input sets that one pass touches 3x the L2 (at least one)."""
    return [make() for _ in range(max(1, math.ceil(3 * gpu_timing.l2_bytes() / max(nbytes, 1))))]


def _time(step, sets) -> float:
    calls = len(sets) * max(1, math.ceil(32 / len(sets)))
    return statistics.median(gpu_timing.time_graph(step, sets, calls, REPLAYS))


def time_read(nbytes: int) -> dict:
    """Microseconds to read nbytes (int32 words) with torch's sum and amax, rotated past the L2."""
    words = max(1, nbytes // 4)
    sets = _sets(lambda: torch.randint(-2**31, 2**31 - 1, (words,), device="cuda", dtype=torch.int32), 4 * words)
    out = {"sum_us": _time(lambda s: s.sum(), sets), "amax_us": _time(lambda s: s.amax(), sets)}
    out["read_us"] = min(out["sum_us"], out["amax_us"])
    del sets
    torch.cuda.empty_cache()
    return out


@functools.lru_cache(maxsize=None)
def floors(n: int, k: int) -> dict:
    """The copy and read times of a weight's int8 and bf16 bytes (they do not depend on M: timed once a shape)."""
    i8 = n * k + 4 * n  # int8 weights and their per-channel scales, as the gated suite counts them
    bf = 2 * n * k
    row = {"int8_bytes": i8, "bf16_bytes": bf, "copy_int8_us": gpu_timing.time_copy(i8)}
    row.update({f"{key}_int8": v for key, v in time_read(i8).items()})
    row["read_bf16_us"] = time_read(bf)["read_us"]
    row["copy_bf16_us"] = gpu_timing.time_copy(bf)
    return row


def cell(n: int, k: int, m: int) -> dict:
    row = {"n": n, "k": k, "m": m, **floors(n, k)}
    i8, bf = row["int8_bytes"], row["bf16_bytes"]

    def make_w8():
        return (torch.randn(m, k, device="cuda", dtype=torch.bfloat16),
                torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8),
                torch.rand(n, device="cuda") * 0.01 + 0.001)

    def make_bf():
        return torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda",
                                                                                 dtype=torch.bfloat16)
    w8 = _sets(make_w8, i8)
    row["ours_w8a16_us"] = _time(lambda s: gemm_ops.quant_gemm(s[0], s[1], b_scale=s[2]), w8)
    del w8
    bfs = _sets(make_bf, bf)
    row["cublas_bf16_us"] = _time(lambda s: F.linear(s[0], s[1]), bfs)
    del bfs
    torch.cuda.empty_cache()
    row["ceiling_copy"] = row["cublas_bf16_us"] / row["copy_int8_us"]
    row["ceiling_read"] = row["cublas_bf16_us"] / row["read_us_int8"]
    row["ours_vs_cublas"] = row["cublas_bf16_us"] / row["ours_w8a16_us"]
    row["ours_of_read"] = row["read_us_int8"] / row["ours_w8a16_us"]
    row["cublas_of_read_bf16"] = row["read_bf16_us"] / row["cublas_bf16_us"]
    return row


def main(argv: list[str]) -> int:
    torch.manual_seed(0)
    gemm_ops.load()
    rows = []
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'M':>3} {'N x K':>12} {'copy i8':>8} {'read i8':>8} {'ours':>7} {'cuBLAS':>7} {'read bf':>8} "
          f"{'ceil copy':>9} {'ceil read':>9} {'ours/cB':>7} {'ours of read':>12} {'cB of read':>10}")
    for m in (1, 16):
        for n, k in SHAPES:  # the floors are timed on the first M, reused on the second
            r = cell(n, k, m)
            rows.append(r)
            print(f"{m:>3} {f'{n}x{k}':>12} {r['copy_int8_us']:8.2f} {r['read_us_int8']:8.2f} {r['ours_w8a16_us']:7.2f} "
                  f"{r['cublas_bf16_us']:7.2f} {r['read_bf16_us']:8.2f} {r['ceiling_copy']:9.2f}x "
                  f"{r['ceiling_read']:8.2f}x {r['ours_vs_cublas']:6.2f}x {r['ours_of_read']:12.2f} "
                  f"{r['cublas_of_read_bf16']:10.2f}", flush=True)
            if len(argv) > 1:
                with open(argv[1], "w") as f:
                    json.dump({"environment": gpu_timing.environment(), "rows": rows}, f, indent=1)
    for m in (1, 16):
        sel = [r for r in rows if r["m"] == m]
        geo = {key: math.exp(statistics.fmean(math.log(r[key]) for r in sel))
               for key in ("ceiling_copy", "ceiling_read", "ours_vs_cublas", "ours_of_read")}
        print(f"M = {m} geomean: " + ", ".join(f"{key} {v:.2f}" for key, v in geo.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
