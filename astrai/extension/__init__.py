"""astrai.extension: the supported public API of astrai-kernels.

Importing it never fails and loads no kernel; the first call that needs one loads its family from the
image the loader picks (`python -m astrai.extension info` explains the choice).

Example::

    import torch
    from astrai.extension import apply_rotary_emb_qk, rotary_cos_sin_cache

    cos, sin = rotary_cos_sin_cache(4096, 128, device="cuda")          # float32 [4096, 64]
    q = torch.randn(19, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(19, 8, 128, device="cuda", dtype=torch.bfloat16)
    q, k = apply_rotary_emb_qk(q, k, (cos, sin), torch.arange(19, device="cuda"))
"""

from astrai.extension import loader
from astrai.extension.backend.attention import ATTN_BACKEND, PagedKVCache, attention, attn_backend, set_op
from astrai.extension.backend.gemm import quant_gemm
from astrai.extension.backend.linear import Fp8Linear, QuantLinear, W8A8Linear, W8A16Linear, quantize_linear_
from astrai.extension.backend.quantize import (DelayedScaling, DynamicScaling, fp8_autocast, fp8_scale_layout,
                                                quantize_fp8, quantize_fp8_block, quantize_fp8_dynamic,
                                                quantize_int8_per_channel, quantize_int8_per_row)
from astrai.extension.backend.rotary import apply_rotary_emb, apply_rotary_emb_qk, rotary_cos_sin_cache
from astrai.extension.ops import attention_plan, gemm_plan

info = loader.info

__all__ = [
    # rotary
    "apply_rotary_emb", "apply_rotary_emb_qk", "rotary_cos_sin_cache",
    # attention
    "attention", "ATTN_BACKEND", "attn_backend", "set_op", "PagedKVCache", "attention_plan",
    # quantization
    "quantize_fp8", "quantize_fp8_dynamic", "quantize_fp8_block", "fp8_scale_layout",
    "quantize_int8_per_row", "quantize_int8_per_channel", "fp8_autocast", "DelayedScaling", "DynamicScaling",
    # GEMM
    "quant_gemm", "gemm_plan",
    # linear layers
    "quantize_linear_", "QuantLinear", "W8A16Linear", "W8A8Linear", "Fp8Linear",
    # the loader
    "loader", "info",
]
