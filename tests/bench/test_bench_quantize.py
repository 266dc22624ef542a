"""pytest-benchmark suite for the quantize kernels (tier 4): one case per (quantize case, shape).

The figures are measured by bench_quantize.measure (CUDA events around CUDA-graph replays, inputs rotated past
the L2; torch's own expression for the same result and a device copy of the same bytes measured in the same
run), repeated REPEATS times for the run-to-run spread, and stored in each case's extra_info as
gpu_timing.summarize writes them: kernel_us, anchor ("torch"), anchor_us, ratio = anchor_us / kernel_us,
ratios, spread, ceiling ("copy"), ceiling_us, tbps (the fewest bytes the case must move / kernel time),
fraction_of_ceiling (kernel TB/s over the copy's). Every quantize case of bench_quantize.CASES runs; a case
added there shows up here (and as "new" in the gate until the baseline is updated).

SHAPES: a 16384 x 4096 activation (x 128 MiB, past the L2 twice over; the standalone script's 65536 x 4096
costs ~4x the time for the same ratios) and a 4096 x 4096 one (launch and tail effects show).

    python -m pytest tests/bench/test_bench_quantize.py --benchmark-only --benchmark-json=OUT.json
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_quantize  # noqa: E402
import gpu_timing  # noqa: E402

SHAPES = ((16384, 4096), (4096, 4096))
REPEATS = 3


def case_id(case: str, m: int, n: int) -> str:
    """The case name shared with the baselines (benchmarks/baselines/<gpu>/quantize.json)."""
    return f"quantize.{case}[M={m},N={n}]"


@functools.cache
def measured(m: int, n: int) -> dict[str, list[dict]]:
    """REPEATS independent runs of bench_quantize.measure for one shape: rows keyed by case."""
    runs: dict[str, list[dict]] = {}
    for _ in range(REPEATS):
        for row in bench_quantize.measure(m, n, cases=bench_quantize.CASES):
            runs.setdefault(row["case"], []).append(row)
    return runs


def summarize(rows: list[dict]) -> dict:
    """bench_quantize rows of one case (one per repeat) -> the case's record."""
    runs = [{"kernel_us": r["kernel_us"], "anchor_us": r["torch_us"], "ceiling_us": r["copy_us"],
             "tbps": r["kernel_gbps"] / 1e3, "fraction": r["fraction_of_copy"]} for r in rows]
    return {**gpu_timing.summarize(runs, anchor="torch", ceiling="copy"),
            **{k: rows[0][k] for k in ("kernel_bytes", "input_sets", "calls_per_graph", "replays")}}


@pytest.mark.requires_cuda_kernels("quantize")
@pytest.mark.parametrize("case", bench_quantize.CASES)
@pytest.mark.parametrize("m,n", SHAPES, ids=[f"{m}x{n}" for m, n in SHAPES])
def test_quantize(benchmark, m, n, case):
    benchmark.group = f"quantize {m}x{n}"
    rows = measured(m, n)[case]
    benchmark.extra_info.update({"case": case_id(case, m, n), "family": "quantize", "op_case": case, "m": m, "n": n,
                                 **summarize(rows)})
    s = bench_quantize._make_set(m, n, 1)
    step = bench_quantize._kernel_step(case)

    def eager_call():
        step(s)
        torch.cuda.synchronize()

    benchmark.pedantic(eager_call, rounds=20, iterations=1, warmup_rounds=3)
