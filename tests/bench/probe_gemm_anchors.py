"""The anchors of csrc/tools/gemm_mainloop_probe.cu's shapes, in the same call: cuBLAS bf16 `F.linear` and
`torch._int_mm`, TFLOP/s (TOP/s) from CUDA-graph replays (tests/bench/gpu_timing.py). Developer probe, not gated.

    python tests/bench/probe_gemm_anchors.py
"""
import statistics

import torch
import torch.nn.functional as F

from gpu_timing import time_graph

SHAPES = [(4096, 4096, 4096), (4096, 14336, 4096), (4096, 4096, 14336), (1024, 4096, 4096), (1024, 14336, 4096),
          (4096, 2112, 7168)]

print(f"{'M x N x K':>20} {'cuBLAS bf16':>12} {'_int_mm':>10}")
for m, n, k in SHAPES:
    x = torch.rand(m, k, device="cuda", dtype=torch.bfloat16) * 2 - 1
    w = torch.rand(n, k, device="cuda", dtype=torch.bfloat16) * 2 - 1
    xi = torch.randint(-127, 128, (m, k), device="cuda", dtype=torch.int8)
    wi = torch.randint(-127, 128, (k, n), device="cuda", dtype=torch.int8).t().contiguous().t()
    bf = statistics.median(time_graph(lambda s: F.linear(s[0], s[1]), [(x, w)], 10, 7))
    i8 = statistics.median(time_graph(lambda s: torch._int_mm(s[0], s[1]), [(xi, wi)], 10, 7))
    fl = 2.0 * m * n * k / 1e6
    print(f"{m:>6}x{n:>6}x{k:>6} {fl / bf:12.1f} {fl / i8:10.1f}")
