"""Developer probe of programmatic dependent launch for the GEMM kernels (`gemm_plan.set_staging(pdl=...)`); not gated.

Per cell (the gated suite's pairs and (N, K) at M = 1, 16, 1024; `quick`: M = 1, 16), microseconds per call by
CUDA-graph replay over bench_gemm's rotated input sets:
- on / off: our calls back to back, `gemm_plan.set_staging(pdl=True / False)` (read by the launcher at each launch,
  so at capture);
- +pad on / off: each call followed by a one-element torch add, so the kernel after ours is not ours; pad: the add
  alone;
- anchor, anc+pad: bench_gemm's anchor the same two ways; ratio on = anchor / on, ratio+pad = (anc+pad - pad) /
  (+pad on - pad).
The default launch is timed first in every cell: alternate images or runs before reading small differences.

`tail`: the Hopper recipes at split 1 (PDL on and off) against the last wave split (split 0, launched plainly), the
same two ways (back to back, +pad), at M = 1024 / 4096 on the shapes where the thirty-third session's H100 probe
timed split 0 up to 12% ahead in a back-to-back graph while the H200 sweeps (each call alone) had it ~1% behind:
whether PDL, the regime or the split itself makes the difference (docs/benchmarks.md). Columns interleaved over
`ROUNDS` rounds, with their spread (the thirty-fourth session's single-block timings drifted 10-15% within a cell).

    PYTHONPATH=.:tests/bench python tests/bench/probe_gemm_pdl.py [quick|tail]      # from the repository root, on a GPU
"""

from __future__ import annotations

import functools
import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]
import torch  # noqa: E402

import bench_gemm as bg  # noqa: E402
import gpu_timing  # noqa: E402
from astrai.extension.ops import gemm as ops  # noqa: E402
from astrai.extension.ops import gemm_plan  # noqa: E402

SHAPES = [(4096, 4096), (14336, 4096), (2112, 7168)]
MS = [1, 16, 1024]


def med(step, sets, calls):
    return statistics.median(gpu_timing.time_graph(step, sets, calls, 20))


def padded_sets(pair: str, m: int, n: int, k: int) -> tuple[list, int]:
    """bench_gemm's rotated input sets for a cell, each with a one-element "pad" tensor, and the calls a replay."""
    n_sets, calls = bg.sets_and_calls(bg.kernel_bytes(pair, m, n, k), bg.estimate_us(pair, m, n, k),
                                      gpu_timing.l2_bytes())
    sets = [bg.make_set(pair, m, n, k) for _ in range(n_sets)]
    for s in sets:
        s["pad"] = torch.zeros(1, device="cuda")
    return sets, calls


def behind_pad(step):
    """`step` followed by the one-element torch add, so that the kernel after ours is not ours."""
    return lambda s: (step(s), s["pad"].add_(1))


def pad_only(s):
    return s["pad"].add_(1)


# tail mode: (pair, recipe, M, N, K)
TAIL_CELLS = [("w16a16", 5, 4096, 6144, 4096), ("w16a16", 5, 4096, 4096, 14336), ("w16a16", 5, 4096, 14336, 4096),
              ("w16a16", 5, 4096, 4096, 4096), ("fp8_row", 4, 4096, 4096, 7168), ("fp8_row", 4, 4096, 14336, 4096),
              ("fp8_tensor", 4, 4096, 14336, 4096), ("w8a8", 5, 4096, 14336, 4096), ("w16a16", 4, 1024, 14336, 4096)]


# tail mode: the columns are timed in ROUNDS interleaved rounds (each a graph of `calls` calls replayed 5 times, its
# median), so that drift over the seconds a cell takes (the thirty-fourth session's H100 moved 10-15% within a cell
# when each column was timed in one block) hits every column alike; "spread" is the largest (max - min) / median of a
# main column's rounds: differences below it are not an order.
ROUNDS = 5


def tail() -> None:
    print(f"{'pair':11} {'r':>1} {'M':>5} {'N':>6} {'K':>6} | {'s1 on':>7} {'s1 off':>7} {'s0':>7} {'s0/s1on':>7} "
          f"{'spread':>6} | {'+pad s1 on':>10} {'+pad s1 off':>11} {'+pad s0':>8} {'pad':>6} {'s0/s1on+pad':>11}")
    ops.load()
    for pair, recipe, m, n, k in TAIL_CELLS:
        sets, calls = padded_sets(pair, m, n, k)
        split1 = bg.kernel_step(pair, m, functools.partial(ops.quant_gemm, plan=(recipe, 1)))
        split0 = bg.kernel_step(pair, m, functools.partial(ops.quant_gemm, plan=(recipe, ops.TAIL_SPLIT)))
        columns = {"on": (split1, True), "off": (split1, False), "s0": (split0, True),
                   "on_p": (behind_pad(split1), True), "off_p": (behind_pad(split1), False),
                   "s0_p": (behind_pad(split0), True), "pad": (pad_only, True)}
        rounds = {name: [] for name in columns}
        for _ in range(ROUNDS):
            for name, (step, pdl) in columns.items():
                gemm_plan.set_staging(pdl=pdl)
                rounds[name].append(statistics.median(gpu_timing.time_graph(step, sets, calls, 5)))
        gemm_plan.set_staging(pdl=True)
        t = {name: statistics.median(v) for name, v in rounds.items()}
        spread = max((max(rounds[c]) - min(rounds[c])) / t[c] for c in ("on", "off", "s0"))
        print(f"{pair:11} {recipe:1d} {m:5d} {n:6d} {k:6d} | {t['on']:7.2f} {t['off']:7.2f} {t['s0']:7.2f} "
              f"{t['s0'] / t['on']:7.3f} {spread:6.3f} | {t['on_p']:10.2f} {t['off_p']:11.2f} {t['s0_p']:8.2f} "
              f"{t['pad']:6.2f} {(t['s0_p'] - t['pad']) / (t['on_p'] - t['pad']):11.3f}", flush=True)
        del sets
        torch.cuda.empty_cache()


def main(argv: list[str]) -> None:
    if argv[:1] == ["tail"]:
        tail()
        return
    ms = [1, 16] if argv[:1] == ["quick"] else MS
    print(f"{'pair':11} {'M':>5} {'N':>6} {'K':>6} {'plan':>8} | {'on':>7} {'off':>7} {'off/on':>6} | "
          f"{'+pad on':>8} {'+pad off':>8} {'pad':>6} | {'anchor':>7} {'anc+pad':>8} | "
          f"{'ratio on':>8} {'ratio+pad':>9}")
    ops.load()
    for pair in bg.PAIRS:
        for m in ms:
            for n, k in SHAPES:
                sets, calls = padded_sets(pair, m, n, k)
                kern, anc = bg.kernel_step(pair, m), bg.anchor_step(pair, m)
                kp, ap = behind_pad(kern), behind_pad(anc)
                gemm_plan.set_staging(pdl=True)
                on, on_p = med(kern, sets, calls), med(kp, sets, calls)
                gemm_plan.set_staging(pdl=False)
                off, off_p = med(kern, sets, calls), med(kp, sets, calls)
                gemm_plan.set_staging(pdl=True)
                a, a_p, p = med(anc, sets, calls), med(ap, sets, calls), med(pad_only, sets, calls)
                plan = ops.builtin_plan(m, n, k, bg.OP_PAIR[pair], ops.num_sms(torch.device("cuda")),
                                        sm90=ops.sm90_available(torch.device("cuda")))
                print(f"{pair:11} {m:5d} {n:6d} {k:6d} {str(tuple(plan)):>8} | {on:7.2f} {off:7.2f} "
                      f"{off / on:6.3f} | {on_p:8.2f} {off_p:8.2f} {p:6.2f} | {a:7.2f} {a_p:8.2f} | "
                      f"{a / on:8.3f} {(a_p - p) / (on_p - p):9.3f}", flush=True)
                del sets
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:])
