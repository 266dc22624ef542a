"""FP8 / INT8 quantization: the public functions (`astrai.extension.quantize`).

CUDA kernels where they serve, else a torch path with the same bits; the policy and the fp8 strategy layer are
in `astrai.extension.backend.quantize`, the contract in docs/contracts.md ("Quantize ops").

Example::

    from astrai.extension import quantize as aq
    q, _, scale_inv = aq.quantize_fp8_dynamic(x, granularity="row")
    q, sf = aq.quantize_fp8_block(x, block_rows=1, pow2_scale=True)
    packed = aq.fp8_scale_layout(sf, pack_ue8m0=True)
    with aq.fp8_autocast(recipe=aq.DelayedScaling(amax_history_len=16)):
        y = model(x)                                  # aten::linear through fp8 + quant_gemm
    hist = aq.AmaxHistory(16, qmax=448.0, device="cuda")
    hist.fold(amax)                                   # ring fold on the device; hist.scale: next multiplier
"""

from __future__ import annotations

from astrai.extension.backend.quantize import (PATHS, AmaxHistory, DelayedScaling, DynamicScaling,
                                                fold_amax_history, fold_amax_history_torch, fp8_autocast,
                                                fp8_scale_layout, quantize_fp8, quantize_fp8_block,
                                                quantize_fp8_dynamic, quantize_int8_per_channel,
                                                quantize_int8_per_row, select_path)

__all__ = ["PATHS", "AmaxHistory", "DelayedScaling", "DynamicScaling", "fold_amax_history",
           "fold_amax_history_torch", "fp8_autocast", "fp8_scale_layout", "quantize_fp8", "quantize_fp8_block",
           "quantize_fp8_dynamic", "quantize_int8_per_channel", "quantize_int8_per_row", "select_path"]
