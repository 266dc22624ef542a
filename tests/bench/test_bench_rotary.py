"""pytest-benchmark suite for the fused rotary kernel (tier 4): one case per (T, pairing, mode).

The figures that matter are measured by bench_rotary.measure (CUDA events around CUDA-graph replays, inputs
rotated past the L2, the torch path and a device copy measured in the same run), repeated REPEATS times for
the run-to-run spread, and stored in each case's extra_info:

    case, kernel_us, anchor ("torch path"), anchor_us, ratio = anchor_us / kernel_us (higher is better),
    ratios (one per repeat), spread = (max - min) / median of ratios, ceiling ("copy"), ceiling_us,
    tbps (kernel bytes / kernel time), fraction_of_ceiling (kernel TB/s over the copy's, same run)

pytest-benchmark's own statistics time one eager call plus a synchronize on the host (launch latency).

    python -m pytest tests/bench --benchmark-only --benchmark-json=OUT.json   # nox -s bench
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_rotary  # noqa: E402
import gpu_timing  # noqa: E402

TOKENS = (1, 64, 4096, 32768)
PAIRINGS = ("neox", "gptj")
REPEATS = 3


def case_id(tokens: int, pairing: str, mode: str) -> str:
    """The case name shared with the baselines (ci/bench_gate.py builds the same from legacy rows)."""
    return f"rotary.qk[T={tokens},{pairing},{mode}]"


@functools.cache
def measured(tokens: int) -> dict[tuple[str, str], list[dict]]:
    """REPEATS independent runs of bench_rotary.measure for one T: rows keyed by (pairing, mode)."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(REPEATS):
        for row in bench_rotary.measure(tokens):
            runs.setdefault((row["pairing"], row["mode"]), []).append(row)
    return runs


def summarize(rows: list[dict]) -> dict:
    """bench_rotary rows of one case (one per repeat) -> the case's record (gpu_timing.summarize)."""
    runs = [{"kernel_us": r["kernel_us"], "anchor_us": r["torch_us"], "ceiling_us": r["copy_us"],
             "tbps": r["kernel_gbps"] / 1e3, "fraction": r["fraction_of_copy"]} for r in rows]
    return {**gpu_timing.summarize(runs, anchor="torch path", ceiling="copy"),
            **{k: rows[0][k] for k in ("kernel_bytes", "input_sets", "calls_per_graph", "replays")}}


@pytest.mark.requires_cuda_kernels("rotary")
@pytest.mark.parametrize("mode", bench_rotary.MODES)
@pytest.mark.parametrize("pairing", PAIRINGS)
@pytest.mark.parametrize("tokens", TOKENS)
def test_rotary_qk(benchmark, tokens, pairing, mode):
    benchmark.group = f"rotary.qk T={tokens}"
    rows = measured(tokens)[(pairing, mode)]
    benchmark.extra_info.update({"case": case_id(tokens, pairing, mode), "family": "rotary",
                                 "tokens": tokens, "pairing": pairing, "mode": mode, **summarize(rows)})
    s = bench_rotary._make_set(tokens, 32, 8, 128, max(tokens, 8192))
    interleaved = pairing == "gptj"
    op = bench_rotary.ops.rotary_embedding_qk if mode == "out_of_place" else bench_rotary.ops.rotary_embedding_

    def eager_call():
        op(s["q"], s["k"], s["cos"], s["sin"], s["positions"], interleaved=interleaved, check_positions=False)
        torch.cuda.synchronize()

    benchmark.pedantic(eager_call, rounds=20, iterations=1, warmup_rounds=3)
