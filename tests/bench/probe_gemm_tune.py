"""Probe (GPU): the plan chain's host cost and the autotuner's timing, for docs/benchmarks.md.

    python tests/bench/probe_gemm_tune.py [OUT_DIR]

Prints the host time of a memoized decision (`gemm_plan.decide`) and of the plan step of a `plan=None` call
(`plan_call`, autotuning off and on with the shape already tuned), and the wall time of tuning a few shapes
through `enable()` (first call of each). The sweeps (regret of the chain and of tuning) are `python -m
astrai.extension.gemm_tune sweep --grid holdout|train`.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time

import torch

from astrai.extension.ops import gemm as ops
from astrai.extension.ops import gemm_plan as gp


def per_call_us(fn, calls: int = 20000) -> float:
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(samples)


def main() -> None:
    ops.load()
    device = gp.facts()
    print(f"device: {device.name}, {device.num_sms} SMs, cc {device.cc}, driver {device.driver}, sm90 code "
          f"{device.sm90_code}, image {device.image_sha256[:12]}")
    a = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    call = gp.Call("w16a16", "nt", None, 16, 4096, 4096)
    gp.decide(call, device)
    print(f"decide (memoized): {per_call_us(lambda: gp.decide(call, device)):.2f} us")
    print(f"plan_call, autotune off: {per_call_us(lambda: gp.plan_call(a, b, None, None, None, torch.bfloat16, 0, None, False)):.2f} us")
    print(f"ops.plan_for: {per_call_us(lambda: ops.plan_for(a, b, 0, False)):.2f} us")
    with tempfile.TemporaryDirectory() as root:
        gp.enable(root)
        for m, n, k in ((16, 4096, 4096), (300, 4096, 4096), (4096, 4096, 4096), (8192, 14336, 4096),
                        (16384, 4096, 1024), (1, 129024, 512)):
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            ops.quant_gemm(x, w)
            torch.cuda.synchronize()
            print(f"tune w16a16 M={m} N={n} K={k}: {time.perf_counter() - t0:.3f} s -> {gp.probe(m, n, k)}")
        print(f"plan_call, autotune on, shape tuned: "
              f"{per_call_us(lambda: gp.plan_call(a, b, None, None, None, torch.bfloat16, 0, None, False)):.2f} us")
        y = torch.empty(16, 4096, device="cuda", dtype=torch.bfloat16)
        print(f"whole ops.quant_gemm(out=...) host time, tuned shape: "
              f"{per_call_us(lambda: ops.quant_gemm(a, b, out=y), 2000):.2f} us (launch included)")
        gp.disable()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
