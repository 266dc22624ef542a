"""Plain-torch reference of the quantized linears (`W8A16Linear`, `W8A8Linear`, `Fp8Linear`), written from the
contract: the activation quantized per row (w8a8: int8, fp8: e4m3, by `reference.quantize`), then the GEMM
reference in float64 from the module's own buffers. Returned unrounded in float64: tests round or bound it.
"""

from __future__ import annotations

import torch
from reference import gemm as gemm_ref
from reference import quantize as quantize_ref

ACTIVATION_DTYPE = {"w8a8": torch.int8, "fp8": torch.float8_e4m3fn}


def quant_linear(module, x: torch.Tensor) -> torch.Tensor:
    """y [..., out_features] in float64 for input x [..., in_features]."""
    x2 = x.reshape(-1, x.shape[-1])
    a, a_scale = x2, None
    if module.mode in ACTIVATION_DTYPE:
        a, a_scale = quantize_ref.quantize_dynamic(x2, ACTIVATION_DTYPE[module.mode], "row")
    y = gemm_ref.quant_gemm(a, module.weight, a_scale=a_scale, b_scale=module.weight_scale, bias=module.bias)
    return y.reshape(*x.shape[:-1], module.out_features)


def quantized_weight(weight: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, scale_inv [N]) of a weight [N, K] per output channel: int8 for w8a16 / w8a8, e4m3 for fp8."""
    q, inv = quantize_ref.quantize_dynamic(weight, torch.float8_e4m3fn if mode == "fp8" else torch.int8, "row")
    return q, inv.reshape(-1)
