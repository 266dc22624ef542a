"""Golden cases for the quantize family: every op, output format, scale kind and layout, block scales and the
UE8M0 packing, on fixed seeded inputs (CPU generator) with outliers and special values.

Each case calls `torch.ops.astrai.<op>` with the schema's arguments (docs/contracts.md, "Quantize ops");
tests/gpu/test_golden.py compares the outputs' sha256 with tests/golden/quantize.json. Adding a case is one
line of TABLE (inputs are seeded by the case name, so existing digests do not move).
"""

from __future__ import annotations

import torch

from support import golden
from support.golden import OpCase, op_cases

E4M3, E5M2, INT8 = torch.float8_e4m3fn, torch.float8_e5m2, torch.int8
BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
ROWWISE, TRANSPOSED, DUAL = 0, 1, 2          # the ops' `layout`
NO_AMAX, AMAX_TENSOR, AMAX_ROW = 0, 1, 2     # quantize's `amax`
PER_TENSOR, PER_ROW = 0, 1                   # quantize_dynamic's `granularity`
# ±0, ±inf, NaN, past every format's max, fp8 subnormals: the saturation and NaN rules of the contract
SPECIALS = (0.0, -0.0, float("inf"), float("-inf"), float("nan"), 1e6, -1e6, 2.0**-9, -(2.0**-16), 448.0, 57344.0)


def wide(gen: torch.Generator, rows: int, cols: int, dtype: torch.dtype, specials: bool = True) -> torch.Tensor:
    """x [rows, cols]: normal values scaled by 2^-12..2^12, 1% outliers (x1000), ~2% special values (CPU draw)."""
    x = torch.randn(rows, cols, generator=gen)
    x *= torch.where(torch.rand(rows, cols, generator=gen) < 0.01, 1000.0, 1.0)
    x *= torch.randint(-12, 13, (rows, cols), generator=gen).float().exp2()
    if specials:
        pool = torch.tensor(SPECIALS)
        pick = torch.randint(0, len(SPECIALS), (rows, cols), generator=gen)
        x = torch.where(torch.rand(rows, cols, generator=gen) < 0.02, pool[pick], x)
    return x.to(dtype).to(golden.DEVICE)


def multiplier(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """Positive float32 multipliers over 2^-4..2^6 (scale kinds: [1] tensor, [M, 1] row, [1, N] column)."""
    return (torch.rand(*shape, generator=gen) * 10.0 - 4.0).exp2().to(golden.DEVICE)


def static(rows, cols, in_dtype, out_dtype, scale_shape, layout, amax=NO_AMAX) -> OpCase:
    """quantize(x, scale, out_dtype, layout, amax); scale_shape "tensor" / "row" / "column"."""
    def build(gen):
        x = wide(gen, rows, cols, in_dtype)
        shape = {"tensor": (1,), "row": (rows, 1), "column": (1, cols)}[scale_shape]
        return x, multiplier(gen, *shape), out_dtype, layout, amax
    return OpCase("quantize", build)


def dynamic(rows, cols, in_dtype, out_dtype, granularity, pow2, layout=ROWWISE) -> OpCase:
    return OpCase("quantize_dynamic", lambda gen: (wide(gen, rows, cols, in_dtype), out_dtype, granularity, pow2,
                                                   layout))


def block(rows, cols, in_dtype, out_dtype, block_rows, pow2, mn_major) -> OpCase:
    """quantize_block; an MN-major scale_inv is digested by value (the contract leaves its padding unwritten)."""
    return OpCase("quantize_block", lambda gen: (wide(gen, rows, cols, in_dtype), out_dtype, block_rows, pow2,
                                                 mn_major))


def full_storage(outputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """scale_layout's MN-major output (strides (1, align(MN, 4))) as its whole buffer [K, align(MN, 4)]: the
    contract writes the padding rows as zero, so the digest covers them (and the strides) too."""
    (t,) = outputs
    assert t.dim() == 2 and t.stride(0) == 1, f"scale_layout returned strides {t.stride()}, not MN-major"
    return (t.as_strided((t.shape[1], t.stride(1)), (t.stride(1), 1)),)


def layout(mn, sf_k, pack_ue8m0) -> OpCase:
    """scale_layout(sf, pack_ue8m0): sf float32 [MN, SF_K]; powers of two 2^-20..2^20 for the UE8M0 packing."""
    def build(gen):
        exponents = torch.randint(-20, 21, (mn, sf_k), generator=gen).float()
        sf = exponents.exp2() if pack_ue8m0 else exponents.exp2() * (1 + torch.rand(mn, sf_k, generator=gen))
        return sf.to(golden.DEVICE), pack_ue8m0
    return OpCase("scale_layout", build, post=full_storage)


TABLE = {
    # quantize: a given multiplier; every format x scale kind x layout appears at least once; N=100: element path
    "static_e4m3_tensor_rowwise_bf16_M989_N1024": static(989, 1024, BF16, E4M3, "tensor", ROWWISE),
    "static_e5m2_tensor_rowwise_bf16_M989_N1024": static(989, 1024, BF16, E5M2, "tensor", ROWWISE, AMAX_TENSOR),
    "static_int8_tensor_rowwise_bf16_M989_N1024": static(989, 1024, BF16, INT8, "tensor", ROWWISE),
    "static_int8_row_rowwise_fp16_M67_N4104": static(67, 4104, FP16, INT8, "row", ROWWISE, AMAX_ROW),
    "static_e4m3_row_rowwise_fp16_M989_N1024": static(989, 1024, FP16, E4M3, "row", ROWWISE, AMAX_ROW),
    "static_e4m3_column_rowwise_fp32_M989_N1024": static(989, 1024, FP32, E4M3, "column", ROWWISE),
    "static_e4m3_tensor_transposed_bf16_M989_N1024": static(989, 1024, BF16, E4M3, "tensor", TRANSPOSED),
    "static_e5m2_row_transposed_fp32_M333_N520": static(333, 520, FP32, E5M2, "row", TRANSPOSED),
    "static_e4m3_column_dual_bf16_M989_N1024": static(989, 1024, BF16, E4M3, "column", DUAL, AMAX_TENSOR),
    "static_e5m2_row_dual_fp16_M19_N4104": static(19, 4104, FP16, E5M2, "row", DUAL, AMAX_ROW),
    "static_e4m3_tensor_rowwise_bf16_M67_N100": static(67, 100, BF16, E4M3, "tensor", ROWWISE, AMAX_ROW),
    "static_e4m3_tensor_dual_bf16_M19_N13": static(19, 13, BF16, E4M3, "tensor", DUAL),
    # quantize_dynamic: per tensor (any layout), per row (row-major); pow2 multipliers; N=20000 past the
    # per-row kernel's register cache
    "dynamic_tensor_e4m3_rowwise_bf16_M989_N1024": dynamic(989, 1024, BF16, E4M3, PER_TENSOR, False),
    "dynamic_tensor_e5m2_dual_bf16_pow2_M989_N1024": dynamic(989, 1024, BF16, E5M2, PER_TENSOR, True, DUAL),
    "dynamic_tensor_e4m3_transposed_fp32_M333_N520": dynamic(333, 520, FP32, E4M3, PER_TENSOR, False, TRANSPOSED),
    "dynamic_tensor_int8_rowwise_fp16_M989_N1024": dynamic(989, 1024, FP16, INT8, PER_TENSOR, False),
    "dynamic_row_e4m3_bf16_M989_N1024": dynamic(989, 1024, BF16, E4M3, PER_ROW, False),
    "dynamic_row_e5m2_fp16_pow2_M989_N1024": dynamic(989, 1024, FP16, E5M2, PER_ROW, True),
    "dynamic_row_int8_bf16_M989_N1024": dynamic(989, 1024, BF16, INT8, PER_ROW, False),
    "dynamic_row_e4m3_bf16_pow2_M19_N20000": dynamic(19, 20000, BF16, E4M3, PER_ROW, True),
    "dynamic_row_e4m3_fp32_M67_N13": dynamic(67, 13, FP32, E4M3, PER_ROW, False),
    # quantize_block: 1 x 128 groups and 128 x 128 blocks (M=989: a partial last block), row-major or MN-major
    # (TMA-aligned, padding included in the digest) scales, pow2 (UE8M0-ready) or exact multipliers
    "block_1x128_e4m3_bf16_M989_N1024": block(989, 1024, BF16, E4M3, 1, False, False),
    "block_1x128_e4m3_bf16_pow2_mnmajor_M989_N1024": block(989, 1024, BF16, E4M3, 1, True, True),
    "block_1x128_e5m2_fp16_M19_N4096": block(19, 4096, FP16, E5M2, 1, False, True),
    "block_128x128_e4m3_bf16_M989_N1024": block(989, 1024, BF16, E4M3, 128, False, False),
    "block_128x128_e4m3_fp32_pow2_mnmajor_M989_N1024": block(989, 1024, FP32, E4M3, 128, True, True),
    "block_128x128_e5m2_bf16_M128_N256": block(128, 256, BF16, E5M2, 128, False, False),
    # scale_layout: MN-major float32, and the UE8M0 packing (four exponents per int32; SF_K not a multiple of 4)
    "layout_f32_MN989_K56": layout(989, 56, False),
    "layout_f32_MN13_K5": layout(13, 5, False),
    "layout_ue8m0_MN989_K56": layout(989, 56, True),
    "layout_ue8m0_MN13_K5": layout(13, 5, True),
    "layout_ue8m0_MN1_K1": layout(1, 1, True),
}

CASES = op_cases("quantize", TABLE)
