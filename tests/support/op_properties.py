"""What each astrai op promises, recorded once for the bitwise suites (adding an op means adding a line here;
tests/harness/test_op_properties.py fails on an op registered by an image but missing from this table).

batch_invariant: row (token) i of a batched call is bit-identical to the call on row i alone, whatever else
shares the launch. Ops that reduce across rows (e.g. a per-tensor scale) cannot promise it.
"""

from __future__ import annotations

BATCH_INVARIANT: dict[str, tuple[bool, str]] = {
    # op name (torch.ops.astrai.<name>): (promise, why)
    "rotary_embedding": (True, "each token is rotated on its own: no reduction across tokens"),
    "rotary_embedding_qk": (True, "each token is rotated on its own: no reduction across tokens"),
    "rotary_embedding_": (True, "each token is rotated on its own: no reduction across tokens"),
    "quantize": (True, "a given multiplier: each row is cast on its own (amax='tensor', an extra output, "
                       "is a whole-tensor reduction and is not covered)"),
    "quantize_dynamic": (False, "granularity='tensor' derives the multiplier from the whole tensor's amax "
                                "(granularity='row' alone would be row-invariant)"),
    "quantize_block": (False, "block_rows=128 shares one multiplier across 128 rows (block_rows=1 alone would "
                              "be row-invariant)"),
    "amax_history_fold": (False, "folds one amax into one ring: there is no batch dimension to be invariant over"),
    "quantize_delayed": (False, "the next multiplier comes from the whole tensor's amax (folded into the ring), so "
                                "every row's neighbours decide it"),
    "scale_layout": (True, "a relayout of scale factors: each row's values are moved, never combined"),
    "attn_decode": (False, "kv_split_size=0 (the default) picks the KV split from the batch's shapes and the SM "
                           "count; only a fixed kv_split_size makes a sequence independent of the batch"),
    "attn_paged_decode": (False, "as attn_decode: the default KV split depends on the whole batch"),
    "attn_prefill": (True, "no KV split: each Q tile reads its own sequence's keys in a fixed order "
                     "(tests/gpu/attention/test_prefill_gpu.py checks it bitwise)"),
    "attn_prefill_ragged": (True, "as attn_prefill: the tile map only locates a tile, the arithmetic is per row"),
    "attn_paged_prefill": (True, "as attn_prefill, over pages: the key order does not depend on the batch"),
    "quant_gemm": (False, "the built-in plan's K split follows M (the wave it fills); batch_invariant=True takes "
                          "a split from (N, K) only, and every recipe sums K in one order (tests/gpu/gemm checks it)"),
    "quant_gemm_out": (False, "as quant_gemm"),
    "quant_gemm_planned": (False, "quant_gemm with the chain's plan chosen at run time (torch.compile with dynamic "
                                  "sizes): as quant_gemm, batch_invariant=True included"),
    "quant_gemm_planned_out": (False, "as quant_gemm_planned"),
    "quant_gemm_can_implement": (True, "takes no tensors: a reason string from its arguments alone"),
    "quant_gemm_set_pdl": (True, "takes no tensors: sets a launch switch that changes no bits"),
    "l2_prefetch": (True, "computes nothing: asks the L2 for a tensor's bytes and changes no tensor"),
    "attn_can_implement": (True, "takes no tensors: a reason string from its arguments alone"),
    "attn_plan": (True, "takes no tensors: a plan from its arguments and the policy's switches"),
    "attn_device_facts": (True, "takes no tensors: the device's facts"),
    "attn_set_policy": (True, "takes no tensors: sets launch switches (pdl and tma change no bits; sm90 picks the "
                              "kernel for every batch alike)"),
    "rotary_plan": (True, "takes no tensors: a plan from its arguments alone"),
    "rotary_can_implement": (True, "takes no tensors: a reason string from its arguments alone"),
    "quantize_plan": (True, "takes no tensors: a plan from its arguments and the device's facts"),
    "quantize_can_implement": (True, "takes no tensors: a reason string from its arguments alone"),
    "paged_kv_append": (True, "each token's k/v is copied into its own page slot: nothing is combined"),
}


def batch_invariant(op: str) -> bool:
    return BATCH_INVARIANT[op][0]
