"""Developer probe of explicit GEMM plans at M >= 1024 where recipe 0's grid fills the SMs poorly (wave
quantization): each (recipe, split_k) timed by CUDA-graph replay beside the anchor (cuBLAS bf16 `F.linear` for
w16a16, `torch._int_mm` for w8a8 with int32 out), same run. Input for the planning issue; not gated.

    PYTHONPATH=.:tests/bench python tests/bench/probe_gemm_plans.py
"""
import statistics

import torch
import torch.nn.functional as F

from astrai.extension.ops import gemm as ops
from gpu_timing import time_graph

ops.load()
op = torch.ops.astrai.quant_gemm
PLANS = [(0, 1), (0, 2), (0, 3), (0, 4), (1, 1), (1, 2), (1, 4)]
SHAPES = [(1024, 2112, 7168), (4096, 2112, 7168), (1024, 4096, 4096), (1024, 7168, 2048), (4096, 7168, 2048)]


def us(fn, s):
    return statistics.median(time_graph(fn, [s], 10, 7))


for m, n, k in SHAPES:
    s16 = (torch.randn(m, k, device="cuda").bfloat16(), torch.randn(n, k, device="cuda").bfloat16())
    s8 = (torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8),
          torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8))
    a16 = us(lambda s: F.linear(s[0], s[1]), s16)
    a8 = us(lambda s: torch._int_mm(s[0], s[1].t()), s8)
    row16, row8 = [], []
    for recipe, split in PLANS:
        t16 = us(lambda s: op(s[0], s[1], None, None, None, torch.bfloat16, 0, recipe, split), s16)
        t8 = us(lambda s: op(s[0], s[1], None, None, None, torch.int32, 0, recipe, split), s8)
        row16.append(f"{recipe}/{split} {a16 / t16:.3f}")
        row8.append(f"{recipe}/{split} {a8 / t8:.3f}")
    print(f"M={m} N={n} K={k} w16a16 (cuBLAS {a16:.1f} us): " + "  ".join(row16))
    print(f"M={m} N={n} K={k} w8a8 (_int_mm {a8:.1f} us): " + "  ".join(row8))
