"""Hugging Face transformers on astrai's attention: `register()` adds `attn_implementation="astrai"`.

    import astrai.integrations.transformers as astrai_hf
    astrai_hf.register()
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="astrai", dtype=torch.bfloat16)

transformers stays optional: importing this module does not import it; `register()` does (and raises ImportError
naming the pin the tests use when it is missing).

What runs: the model's own code, cache and masks; each attention call goes to `astrai.extension.attention`, whose
policy takes this package's CUDA kernels where they serve the call (bf16, head_dim 64 / 128 / 256, GQA) and its
torch path otherwise (both logged as fallbacks, `python -m astrai.extension info`). q, K and V are read in place
(transformers' `[B, H, L, D]` transposed to our `[B, L, H, D]`: no copy), and the mask transformers makes for sdpa
(registered for "astrai" too) becomes our keep mask: None with causal attention, else `[B, Lq, L]` (prefill) or
`[B, L]` (decode), which carries padding, sliding windows and any other pattern the model builds.

Rotary: `patch_rotary()` (opt-in, process-wide) sends the rotary embedding of Llama-family models to our rotary kernel
(see ROTARY_MODELS); `unpatch_rotary()` undoes it.

What does not: a call that asks for something our attention does not compute — dropout, attention weights
(`output_attentions`), logit soft-capping, attention sinks, a position bias, an additive (float) or per-head
mask — runs transformers' sdpa instead, with the reason logged once (`fallback_reasons()` lists them).
"""

from __future__ import annotations

import threading

import torch

from astrai.extension import _fallbacks

NAME = "astrai"
TESTED_VERSION = "5.17.0"  # the transformers the test environment pins (noxfile.py)
OP = "transformers_attention"
# kwargs transformers' models pass whose non-default value changes the result beyond what we compute.
_UNSUPPORTED_KWARGS = {"softcap": "logit soft-capping (softcap)", "s_aux": "attention sinks (s_aux)",
                       "sinks": "attention sinks", "position_bias": "a position bias",
                       "output_attentions": "attention weights (output_attentions)"}

_lock = threading.Lock()
_reasons: dict[str, int] = {}


def _transformers():
    try:
        import transformers
        from transformers import masking_utils
    except ImportError as exc:
        raise ImportError(f"astrai.integrations.transformers: transformers is not installed ({exc}); it is an "
                          f"optional dependency (tested with transformers=={TESTED_VERSION})") from exc
    return transformers, masking_utils


def _count_fallback(reason: str, backend: str, on_gpu: bool) -> None:
    with _lock:
        _reasons[reason] = _reasons.get(reason, 0) + 1
    _fallbacks.record(OP, reason, backend, on_gpu=on_gpu)


def _fallback(reason: str, module, query, key, value, attention_mask, **kwargs):
    _count_fallback(reason, "transformers sdpa", query.is_cuda)
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)


def unsupported_reason(query: torch.Tensor, key: torch.Tensor, attention_mask, dropout: float,
                       kwargs: dict) -> str | None:
    """Why a transformers attention call must run sdpa instead of `astrai.extension.attention`, or None."""
    if dropout:
        return f"dropout {dropout} (the kernels have none; model.eval() turns it off)"
    for name, what in _UNSUPPORTED_KWARGS.items():
        value = kwargs.get(name)
        if isinstance(value, torch.Tensor) or value not in (None, False, 0):
            return f"{what} is not supported"
    if query.dim() != 4 or key.dim() != 4:
        return f"q / K must be [B, H, L, D], got {list(query.shape)} / {list(key.shape)}"
    if key.shape[-1] != query.shape[-1]:
        return f"K's head_dim {key.shape[-1]} differs from q's {query.shape[-1]}"
    if attention_mask is not None:
        if not isinstance(attention_mask, torch.Tensor) or attention_mask.dim() != 4:
            return f"a mask of type {type(attention_mask).__name__} (expected a 4-D bool tensor or None)"
        if attention_mask.dtype != torch.bool:
            return f"an additive {attention_mask.dtype} mask (only bool keep masks are taken)"
        if attention_mask.shape[1] != 1:
            return f"a per-head mask {list(attention_mask.shape)}"
    return None


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: q `[B, Hq, Lq, D]`, K / V `[B, Hkv, L, D]` (the cache's,
    after its update), mask None or bool `[B, 1, Lq, L]` (True = attend); returns (`[B, Lq, Hq, D]`, None)."""
    from astrai.extension import attention

    reason = unsupported_reason(query, key, attention_mask, dropout, kwargs)
    if reason:
        return _fallback(reason, module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                         is_causal=is_causal, **kwargs)
    q = query.transpose(1, 2)  # [B, Lq, Hq, D], a view
    k, v = key.transpose(1, 2), value.transpose(1, 2)
    q_len, kv_len = q.shape[1], k.shape[1]
    causal = False
    mask = None
    if attention_mask is None:
        # sdpa's rule: a model left without a mask is causal for a prefill (its queries and keys start together:
        # an empty static cache holds keys past the queries, which sdpa crops too), and unmasked for one token.
        causal = q_len > 1 and (is_causal if is_causal is not None else getattr(module, "is_causal", True))
        if causal and kv_len > q_len:
            k, v = k[:, :q_len], v[:, :q_len]
    else:
        mask = attention_mask[:, 0, :, : kv_len]  # [B, Lq, L]: padding, causality, windows all in it
        if q_len == 1:
            mask = mask[:, 0]  # [B, L], the decode kernels' form
    out = attention(q, k, v, is_causal=causal, attn_mask=mask, scale=scaling)
    return out, None


def paged_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask, dropout: float = 0.0, scaling: float | None = None,
                            **kwargs) -> tuple[torch.Tensor, None]:
    """`attn_implementation="paged|astrai"` (transformers' continuous batching, `generate_batch`): the step's new K / V
    written to and every sequence's K / V read from transformers' `PagedAttentionCache` (`cache.update`), then our
    packed causal prefill over q `[Tq, Hq, D]` with `qo_indptr = cu_seq_lens_q`, `kv_indptr = cu_seq_lens_k`
    (queries aligned to the end of their sequence's keys, as flash-attn's varlen call does). Sliding-window layers
    and what `attention_forward` sends to sdpa run transformers' paged sdpa instead. Returns (`[Tq, Hq, D]`, None)."""
    from transformers.integrations.sdpa_paged import sdpa_attention_paged_forward

    from astrai.extension import attention

    cu_k = kwargs.get("cu_seq_lens_k")
    reason = unsupported_reason(query, key, None, dropout, kwargs)
    if reason is None and isinstance(cu_k, dict):
        if set(cu_k) != {"full_attention"} or getattr(module, "sliding_window", None):
            reason = "sliding-window layers (continuous batching)"
        cu_k = cu_k.get("full_attention")
    if reason is None and (kwargs.get("cache") is None or cu_k is None or kwargs.get("cu_seq_lens_q") is None):
        reason = "a call without continuous batching's cache and sequence offsets"
    if reason is None and query.shape[0] != 1:
        reason = f"q must be packed [1, H, T, D], got {list(query.shape)}"
    if reason:
        _count_fallback(reason, "transformers paged sdpa", query.is_cuda)
        return sdpa_attention_paged_forward(module, query, key, value, attention_mask, dropout=dropout,
                                            scaling=scaling, **kwargs)
    k, v = kwargs["cache"].update(key_states=key, value_states=value, layer_idx=module.layer_idx,
                                  read_index=kwargs["read_index"], write_index=kwargs["write_index"])
    q = query.transpose(1, 2).squeeze(0)  # [Tq, Hq, D], a view
    out = attention(q, k, v, qo_indptr=kwargs["cu_seq_lens_q"].to(torch.int32), kv_indptr=cu_k.to(torch.int32),
                    is_causal=True, scale=scaling)
    return out, None


def register(name: str = NAME) -> str:
    """Register `attention_forward` (and transformers' sdpa mask maker) under `name` in transformers'
    `AttentionInterface` / `AttentionMaskInterface`, so `attn_implementation=name` runs every attention of a
    model on `astrai.extension.attention`, and `paged_attention_forward` under `"paged|" + name` (continuous
    batching). Idempotent; returns `name`."""
    transformers, masking_utils = _transformers()
    transformers.AttentionInterface.register(name, attention_forward)
    transformers.AttentionInterface.register(f"paged|{name}", paged_attention_forward)
    masking_utils.AttentionMaskInterface.register(name, masking_utils.sdpa_mask)
    return name


# ---- rotary ------------------------------------------------------------------------------------------------------
#
# These models apply rotary embeddings with one module-level function, `apply_rotary_pos_emb(q, k, cos, sin,
# unsqueeze_dim=1)` over q / k `[B, H, L, D]` and per-token cos / sin `[B, L, D]` (two equal halves: the NeoX pairing
# (i, i + D/2) that `rotate_half` implements), looked up by name at each call. `patch_rotary()` replaces that name
# in each module whose function is still this one (its source is compared with Llama's), as other kernel libraries
# patch transformers: process-wide, for every model of those types, until `unpatch_rotary()`.
ROTARY_MODELS = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
                 "gemma3", "granite")
_patched: dict[str, object] = {}  # module name -> its original apply_rotary_pos_emb


def _source(fn) -> str:
    import inspect
    import re
    text = re.sub(r'""".*?"""', "", inspect.getsource(fn), flags=re.S)
    return "\n".join(line for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def _rotary(original):
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
        if (unsqueeze_dim != 1 or q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or cos.shape[-1] != q.shape[-1]
                or q.shape[-1] % 2 or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))):
            return original(q, k, cos, sin, unsqueeze_dim)  # a layout (or a gradient) we do not take
        from astrai.extension import apply_rotary_emb_qk
        half = q.shape[-1] // 2
        cos, sin = cos[..., :half], sin[..., :half]
        if cos.shape[0] == 1 and q.shape[0] > 1:  # positions shared by the batch (a forward without position_ids)
            cos, sin = cos[0], sin[0]
        q_rot, k_rot = apply_rotary_emb_qk(q.transpose(1, 2), k.transpose(1, 2), (cos, sin))
        return q_rot.transpose(1, 2), k_rot.transpose(1, 2)

    apply_rotary_pos_emb.astrai_original = original
    return apply_rotary_pos_emb


def patch_rotary(models=ROTARY_MODELS) -> dict[str, str]:
    """Route the rotary embedding of these transformers model types through `astrai.extension.apply_rotary_emb_qk`
    (our kernel for bf16 CUDA tensors without a gradient, its torch path otherwise; float32 arithmetic rounded once,
    where transformers computes in the activations' dtype). Returns {model: "patched" | why not}; a model whose
    function is not Llama's (another layout) is left alone."""
    import importlib
    _transformers()
    llama = importlib.import_module("transformers.models.llama.modeling_llama").apply_rotary_pos_emb
    reference = _source(getattr(llama, "astrai_original", llama))
    report = {}
    with _lock:
        for name in models:
            module_name = f"transformers.models.{name}.modeling_{name}"
            try:
                module = importlib.import_module(module_name)
            except ImportError as exc:
                report[name] = f"not importable ({exc})"
                continue
            fn = getattr(module, "apply_rotary_pos_emb", None)
            if fn is None:
                report[name] = "has no apply_rotary_pos_emb"
            elif module_name in _patched:
                report[name] = "patched"
            elif _source(fn) != reference:
                report[name] = "its apply_rotary_pos_emb differs from Llama's (another layout): left alone"
            else:
                _patched[module_name] = fn
                module.apply_rotary_pos_emb = _rotary(fn)
                report[name] = "patched"
    return report


def unpatch_rotary() -> None:
    """Restore every function `patch_rotary` replaced."""
    import importlib
    with _lock:
        for module_name, original in _patched.items():
            importlib.import_module(module_name).apply_rotary_pos_emb = original
        _patched.clear()


def fallback_reasons() -> dict[str, int]:
    """{reason: calls} of the attention calls sent to transformers' sdpa since the process started (or `reset`)."""
    with _lock:
        return dict(_reasons)


def reset() -> None:
    """Forget the fallback counts (tests)."""
    with _lock:
        _reasons.clear()
