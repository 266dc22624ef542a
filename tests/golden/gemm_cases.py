"""Golden cases for the gemm family: every pair and layout, each recipe, split-K, scales, bias and out dtypes, on
fixed seeded inputs (CPU generator) at awkward sizes.

Each case calls `torch.ops.astrai.quant_gemm(a, b, a_scale, b_scale, bias, out_dtype, layout, recipe, split_k)`
(docs/contracts.md, "GEMM ops"); tests/gpu/test_golden.py compares the outputs' sha256 with
tests/golden/gemm.json. Adding a case is one line of TABLE (inputs are seeded by the case name).
"""

from __future__ import annotations

import pytest
import torch

from support import golden
from support.golden import OpCase, op_cases

E4M3, E5M2, INT8 = torch.float8_e4m3fn, torch.float8_e5m2, torch.int8
BF16, FP16, FP32, INT32 = torch.bfloat16, torch.float16, torch.float32, torch.int32
NT, NN, TN, TT = 0, 1, 2, 3


def _operand(gen: torch.Generator, dtype: torch.dtype, rows: int, cols: int) -> torch.Tensor:
    if dtype == INT8:
        return torch.randint(-128, 128, (rows, cols), generator=gen, dtype=INT8).to(golden.DEVICE)
    x = torch.randn(rows, cols, generator=gen) * (2.0 if dtype in (E4M3, E5M2) else 1.0)
    return x.to(dtype).to(golden.DEVICE)


def gemm(m, n, k, a_dtype, b_dtype, layout=NT, recipe=0, split_k=1, out_dtype=BF16, a_scale=None, b_scale=None,
         bias=None) -> OpCase:
    """a_scale / b_scale: None, "tensor" or "vector" (a's rows, b's columns); bias: None or its dtype."""
    def build(gen):
        a_t, b_t = layout in (TN, TT), layout in (NT, TT)  # a stored [K, M]; b stored [N, K]
        a = _operand(gen, a_dtype, k, m) if a_t else _operand(gen, a_dtype, m, k)
        b = _operand(gen, b_dtype, n, k) if b_t else _operand(gen, b_dtype, k, n)

        def scale(kind, count):
            if kind is None:
                return None
            values = torch.rand(1 if kind == "tensor" else count, generator=gen) + 0.5
            return values.to(golden.DEVICE)

        sa, sb = scale(a_scale, m), scale(b_scale, n)
        bias_t = None if bias is None else torch.randn(n, generator=gen).to(bias).to(golden.DEVICE)
        return a, b, sa, sb, bias_t, out_dtype, layout, recipe, split_k
    return OpCase("quant_gemm", build)


TABLE = {
    # w16a16
    "bf16_nt_M129_N257_K1008_r0": gemm(129, 257, 1008, BF16, BF16),
    "bf16_nt_M7_N130_K512_r2_s3_bias": gemm(7, 130, 512, BF16, BF16, recipe=2, split_k=3, bias=FP32),
    "f16_nn_M64_N96_K264_r1_f32": gemm(64, 96, 264, FP16, FP16, NN, recipe=1, out_dtype=FP32),
    "bf16_tn_M40_N72_K200_r0": gemm(40, 72, 200, BF16, BF16, TN),
    "bf16_tt_M40_N48_K136_r1_s2": gemm(40, 48, 136, BF16, BF16, TT, recipe=1, split_k=2),
    # w8a16
    "bf16xs8_nt_M1_N4096_K4096_r2_s4": gemm(1, 4096, 4096, BF16, INT8, recipe=2, split_k=4, b_scale="vector"),
    "bf16xs8_nt_M1000_N300_K272_r0_bias": gemm(1000, 300, 272, BF16, INT8, b_scale="vector", bias=BF16),
    "f16xs8_nn_M16_N80_K528_r2": gemm(16, 80, 528, FP16, INT8, NN, recipe=2, b_scale="vector", out_dtype=FP16),
    "bf16xs8_tt_M24_N64_K160_r1": gemm(24, 64, 160, BF16, INT8, TT, recipe=1, b_scale="vector"),
    # w8a8
    "s8_nt_M33_N45_K784_r2_s4_int32": gemm(33, 45, 784, INT8, INT8, recipe=2, split_k=4, out_dtype=INT32),
    "s8_nt_M200_N136_K1024_r0_rowcol": gemm(200, 136, 1024, INT8, INT8, a_scale="vector", b_scale="vector"),
    "s8_tn_M48_N64_K256_r1_int32": gemm(48, 64, 256, INT8, INT8, TN, recipe=1, out_dtype=INT32),
    # fp8 (skips where the image has no fp8 mma: the ptx80 image)
    "e4m3_nt_M129_N257_K1008_r0_tensor": gemm(129, 257, 1008, E4M3, E4M3, a_scale="tensor", b_scale="tensor"),
    "e4m3_nt_M5_N512_K2048_r2_s2_row": gemm(5, 512, 2048, E4M3, E4M3, recipe=2, split_k=2, a_scale="vector",
                                            b_scale="vector"),
    "e5m2xe4m3_nn_M64_N96_K256_r1": gemm(64, 96, 256, E5M2, E4M3, NN, recipe=1, a_scale="tensor", b_scale="tensor"),
    "e4m3xe5m2_tn_M32_N64_K128_r0_f32": gemm(32, 64, 128, E4M3, E5M2, TN, out_dtype=FP32, a_scale="tensor",
                                             b_scale="tensor"),
}



def _fp8_or_skip(run):
    """An fp8 case skips where the image cannot run fp8 (the ptx80 image, a pre-sm_89 GPU): the op says so."""
    def guarded():
        try:
            return run()
        except RuntimeError as exc:
            if "fp8" in str(exc) and "CUDA tensor" not in str(exc):
                pytest.skip(f"no fp8 GEMM here: {exc}")
            raise
    guarded.op = run.op
    return guarded


CASES = {name: _fp8_or_skip(run) if name.startswith(("e4m3", "e5m2")) else run
         for name, run in op_cases("gemm", TABLE).items()}
