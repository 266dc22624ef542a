"""Attention policy: backends (CUDA kernels, flash-attn, torch SDPA) and selection rules (the paged KV cache they
read is in `astrai.extension.backend.paged_kv_cache`).

Backends, in default priority order:

- `CudaBackend` ("cuda"): this package's kernels, decode (split-KV) and prefill (Q-tiled): bf16 CUDA q/K/V,
  head_dim 64/128/256, Hq a multiple of Hkv, contiguous K/V (optional `kv_lens`) or a `PagedKVCache`, keep
  masks `[B, L]` (prefill also `[B, Lq, L]`), causal aligned to the end, no gradient. `blocker()` names what
  it cannot serve (grad, dtype, head_dim, layout, devices, an image without prefill), and automatic
  selection then falls through to the next backend.
- `FlashAttnBackend` ("flash"): `flash_attn.flash_attn_func` when the `flash_attn` package imports;
  contiguous K/V, fp16/bf16 CUDA, no mask, no per-sequence lengths, no cache.
- `TorchNativeBackend` ("torch"): `scaled_dot_product_attention` over K/V gathered from the cache, always
  available; handles everything: prefill and decode, ragged lengths, masks, causal with q_len < kv_len
  aligned to the end, autograd.

Selection, per call: a backend chosen with `attn_backend(...)` (a context manager), then one set with
`set_op("attention", ...)`, then the deprecated `ASTR_OPS` (`attention=<impl>`) or `ASTR_BACKEND` environment
variables (read once, with a DeprecationWarning) are *strict*: a call that backend cannot serve raises ValueError naming the reason.
Otherwise ("auto") the first of cuda > flash > torch that can serve the call runs; a training call (grad
enabled, an input requires grad, no cache) only considers flash and torch. A call that does not reach the
CUDA kernels that way is a fallback: logged once per distinct reason on the "astrai.extension" logger
(WARNING for CUDA tensors, INFO otherwise) and counted for `astrai.extension.info()` (`_fallbacks`).

Conventions: `blhd` layout. q `[B, Lq, Hq, D]` (decode also `[B, Hq, D]`; packed prefill `[Tq, Hq, D]` with
`qo_indptr`), K/V `[B, L, Hkv, D]` (packed `[Tkv, Hkv, D]` with `kv_indptr`); q head h reads kv head
`h // (Hq // Hkv)`. Masks are bool, True = keep: `[B, L]` or `[B, Lq, L]`. A query that keeps
no key gets zeros. With `is_causal`, query i of a sequence with n keys sees keys `j <= n - Lq + i`.
"""

from __future__ import annotations

import abc
import contextlib
import contextvars
import enum
import functools
import math
import os
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from astrai.extension import _fallbacks, loader
# append_reference and gather_paged are re-exported: they lived here before the cache had its own module.
from astrai.extension.backend.paged_kv_cache import PagedKVCache, append_reference, gather_paged  # noqa: F401
from astrai.extension.ops import attention as ops
from astrai.extension.ops import attention_plan


@torch.compiler.assume_constant_result  # traced code asks once (an import is not traceable)
def _flash_attn_importable() -> bool:
    return _flash_attn() is not None


@functools.cache
def _flash_attn():
    """The optional flash_attn package, imported on first need (it is heavy), or None. One guarded import."""
    try:
        import flash_attn
    except Exception:  # ImportError, or a broken build that fails at import
        return None
    return flash_attn


FWD_MODES = ("decode", "prefill", None)


class ATTN_BACKEND(str, enum.Enum):
    """Names of the attention backends; AUTO lets the policy choose per call."""

    AUTO = "auto"
    CUDA = "cuda"
    FLASH = "flash"
    TORCH = "torch"


# ---------------------------------------------------------------------------------------------------------
# One call, normalized
# ---------------------------------------------------------------------------------------------------------

@dataclass
class AttnCall:
    """An attention call in canonical form (what backends see)."""

    q: torch.Tensor                   # [B, Lq, Hq, D]; packed [Tq, Hq, D] with qo_indptr
    k: torch.Tensor | None            # [B, L, Hkv, D] contiguous source ([Tkv, Hkv, D] with kv_indptr), None with a cache
    v: torch.Tensor | None
    kv_cache: PagedKVCache | None
    layer_id: int | None
    fwd: str                          # "decode" or "prefill"
    is_causal: bool
    attn_mask: torch.Tensor | None    # bool [B, L] or [B, Lq, L]
    scale: float
    kv_lens: torch.Tensor | None      # [B] int32, contiguous source only
    q_was_3d: bool
    qo_indptr: torch.Tensor | None = None  # [B + 1] int32: packed q rows per sequence (prefill)
    kv_indptr: torch.Tensor | None = None  # [B + 1] int32: packed contiguous keys per sequence

    @property
    def packed(self) -> bool:
        """q (and contiguous K/V) hold packed variable-length sequences."""
        return self.qo_indptr is not None

    @property
    def num_kv_heads(self) -> int:
        # k: [B, L, Hkv, D], or [Tkv, Hkv, D] for packed sequences
        return self.kv_cache.num_kv_heads if self.kv_cache is not None else self.k.shape[-2]

    @property
    def kv_dtype(self) -> torch.dtype:
        return self.kv_cache.k.dtype if self.kv_cache is not None else self.k.dtype

    @property
    def kv_device(self) -> torch.device:
        return self.kv_cache.device if self.kv_cache is not None else self.k.device

    def needs_grad(self) -> bool:
        return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (self.q, self.k, self.v))


class AttentionBackend(abc.ABC):
    """One way to compute attention. `blocker(call)` says why it cannot serve a call (None: it can);
    `forward(call)` computes `[B, Lq, Hq, D]`."""

    name: str = "?"

    def blocker(self, call: AttnCall) -> str | None:
        return None

    @abc.abstractmethod
    def forward(self, call: AttnCall) -> torch.Tensor:
        """Attention for a canonical call; returns `[B, Lq, Hq, D]` in q's dtype."""


def _is_vec_layout(t: torch.Tensor) -> bool:
    """The kernels' 16-byte rule: aligned base, unit last stride, other strides multiples of 8 elements."""
    if t.numel() == 0:
        return True
    shape, strides = t.shape, t.stride()  # once: this runs for q, K and V on every call
    if strides[-1] != 1 and shape[-1] > 1:
        return False
    # Traced (fake) tensors have no data pointer: under torch.compile the op checks it at run time.
    if not torch.compiler.is_compiling() and t.data_ptr() % 16:
        return False
    for d in range(len(strides) - 1):
        if strides[d] % 8 and shape[d] != 1:
            return False
    return True


@torch.compiler.assume_constant_result
def _kernels_available() -> bool:
    return loader.family_available(ops.FAMILY)


@torch.compiler.assume_constant_result
def _prefill_available() -> bool:
    return loader.family_available(ops.FAMILY) and ops.has_prefill()


def _kernel_mask(mask: torch.Tensor | None, packed: bool = False) -> torch.Tensor | None:
    """The kernels read masks row by row: a unit last stride, and over packed rows a real row stride (an
    expanded mask is copied; masks are small)."""
    if mask is None:
        return None
    if mask.shape[-1] > 1 and mask.stride(-1) != 1:
        return mask.contiguous()
    if packed and mask.dim() == 3 and mask.shape[1] > 1 and mask.stride(1) == 0:
        return mask.contiguous()
    return mask


class CudaBackend(AttentionBackend):
    """This package's kernels: split-KV decode and Q-tiled prefill over contiguous K/V or a PagedKVCache."""

    name = "cuda"

    def blocker(self, call: AttnCall, *, check_available: bool = True) -> str | None:
        if not call.q.is_cuda or call.kv_device.type != "cuda":
            return "q and K/V must be CUDA tensors"
        available = _kernels_available()
        if available:  # the library's own dtype and shape rules (attention_policy.h, the binding), not a copy
            why = attention_plan.shapes_reason(call.q.shape[-1], call.q.shape[-2], call.num_kv_heads,
                                               call.kv_cache.page_size if call.kv_cache is not None else 0,
                                               call.q.dtype, call.kv_dtype)
            if why:
                return why
        if call.fwd == "decode" and not call.packed and call.q.shape[1] != 1:
            return f"decode takes one query token per sequence, got q_len {call.q.shape[1]}"
        if call.needs_grad():
            return "a gradient is needed; the kernels have no backward"
        if call.fwd == "decode" and call.attn_mask is not None and not (
                call.attn_mask.dim() == 2 or (call.attn_mask.dim() == 3 and call.attn_mask.shape[1] == 1)):
            return "the decode kernels take a [B, L] (or [B, 1, L]) mask"
        for name, t in (("attn_mask", call.attn_mask), ("kv_lens", call.kv_lens), ("qo_indptr", call.qo_indptr),
                        ("kv_indptr", call.kv_indptr)):
            if t is not None and t.device != call.q.device:
                return f"{name} is on {t.device}, q on {call.q.device}"
        tensors = [call.q] + ([call.k, call.v] if call.kv_cache is None else list(call.kv_cache.layer(call.layer_id)))
        if not (_is_vec_layout(tensors[0]) and _is_vec_layout(tensors[1]) and _is_vec_layout(tensors[2])):
            return "q/K/V are not 16-byte aligned with strides that are multiples of 8 elements"
        if check_available:
            if not available:
                return "no image serves the attention family here (python -m astrai.extension info says why)"
            if call.fwd == "prefill" and not _prefill_available():
                return "the attention image in use predates the prefill kernels (python -m astrai.extension info)"
        return None

    def forward(self, call: AttnCall) -> torch.Tensor:
        mask = _kernel_mask(call.attn_mask, call.packed)
        cache = call.kv_cache
        if call.fwd == "prefill":
            if cache is None and call.packed:
                return ops.attn_prefill_ragged(call.q, call.k, call.v, call.qo_indptr, call.kv_indptr, mask=mask,
                                               is_causal=call.is_causal, scale=call.scale)
            if cache is None:
                return ops.attn_prefill(call.q, call.k, call.v, call.kv_lens, mask=mask, is_causal=call.is_causal,
                                        scale=call.scale)
            k_cache, v_cache = cache.layer(call.layer_id)
            batch = cache.batch_size
            return ops.attn_paged_prefill(call.q, k_cache, v_cache, cache.page_table[:batch], cache.kv_lens[:batch],
                                          qo_indptr=call.qo_indptr, mask=mask, is_causal=call.is_causal,
                                          scale=call.scale)
        q = call.q[:, 0]  # [B, Hq, D]
        if mask is not None and mask.dim() == 3:
            mask = mask[:, 0]
        if cache is None:
            out = ops.attn_decode(q, call.k, call.v, call.kv_lens, mask=mask, scale=call.scale)
        else:
            k_cache, v_cache = cache.layer(call.layer_id)
            out = ops.attn_paged_decode(q, k_cache, v_cache, cache.page_table[:cache.batch_size],
                                        cache.kv_lens[:cache.batch_size], mask=mask, scale=call.scale)
        return out.unsqueeze(1)


class FlashAttnBackend(AttentionBackend):
    """`flash_attn.flash_attn_func` over contiguous K/V (no mask, no lengths, no cache)."""

    name = "flash"

    def blocker(self, call: AttnCall) -> str | None:
        if not call.q.is_cuda:
            return "flash_attn takes CUDA tensors"
        if call.kv_cache is not None:
            return "flash_attn_func takes contiguous K/V, not a paged cache"
        if call.packed:
            return "packed sequences (qo_indptr) are not routed to flash_attn"
        if call.attn_mask is not None or call.kv_lens is not None:
            return "flash_attn_func takes no mask and no per-sequence lengths"
        if call.q.dtype not in (torch.float16, torch.bfloat16) or call.k.dtype != call.q.dtype:
            return "flash_attn takes fp16/bf16 CUDA tensors of one dtype"
        if call.q.shape[-1] > 256 or call.q.shape[-1] % 8:
            return f"flash_attn takes head_dim <= 256, a multiple of 8, got {call.q.shape[-1]}"
        if not _flash_attn_importable():
            return "the flash_attn package is not importable"
        return None

    def forward(self, call: AttnCall) -> torch.Tensor:
        # Causal with q_len < kv_len aligns to the end (flash-attn >= 2.1), as this module defines.
        return _flash_attn().flash_attn_func(call.q, call.k, call.v, softmax_scale=call.scale, causal=call.is_causal)


class TorchNativeBackend(AttentionBackend):
    """SDPA over gathered K/V with every rule of the module applied as an explicit keep mask."""

    name = "torch"

    def forward(self, call: AttnCall) -> torch.Tensor:
        if call.packed:
            return self._forward_packed(call)
        q = call.q
        batch, q_len = q.shape[:2]
        if call.kv_cache is None:
            k, v = call.k, call.v
            length = k.shape[1]
            pos = torch.arange(length, device=k.device)
            lens = (call.kv_lens.long() if call.kv_lens is not None
                    else torch.full((batch,), length, device=k.device, dtype=torch.long))
            valid = pos[None, :] < lens[:, None]
        else:
            k, v, valid = call.kv_cache.gather(call.layer_id)
            length = k.shape[1]
            lens = call.kv_cache.kv_lens[:batch].long().clamp(0, length)
            pos = torch.arange(length, device=k.device)
        keep = valid[:, None, :].expand(batch, q_len, length)  # [B, Lq, L]
        if call.attn_mask is not None:
            mask = call.attn_mask.to(keep.device)
            if mask.dim() == 2:
                mask = mask[:, None, :]
            if mask.shape[-1] < length:  # a paged cache: keys past the mask are dropped
                mask = F.pad(mask, (0, length - mask.shape[-1]), value=False)
            keep = keep & mask
        if call.is_causal:
            q_pos = lens[:, None] - q_len + torch.arange(q_len, device=keep.device)[None, :]  # [B, Lq]
            keep = keep & (pos[None, None, :] <= q_pos[:, :, None])
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2).to(q.dtype), v.transpose(1, 2).to(q.dtype),
            attn_mask=keep[:, None], scale=call.scale, enable_gqa=q.shape[2] != k.shape[2])  # [B, Hq, Lq, D]
        out = out.transpose(1, 2)
        return out.masked_fill(~keep.any(-1)[:, :, None, None], 0.0)


    def _forward_packed(self, call: AttnCall) -> torch.Tensor:
        """Packed sequences one at a time (reads the indptrs: one host sync). Ranges are clamped as the kernels
        clamp them; rows outside every sequence are zeros here (the kernels leave them unwritten)."""
        q = call.q                                              # [Tq, Hq, D]
        qo = call.qo_indptr.tolist()
        batch = len(qo) - 1
        if call.kv_cache is not None:
            k_all, v_all, valid = call.kv_cache.gather(call.layer_id)  # [B, capacity, Hkv, D], [B, capacity]
            lens = call.kv_cache.kv_lens[:batch].clamp(0, k_all.shape[1]).tolist()
        else:
            kv = call.kv_indptr.tolist()
        out = torch.zeros_like(q)
        for b in range(batch):
            q_lo, q_hi = _clamped_range(qo, b, q.shape[0])
            if q_hi == q_lo:
                continue
            if call.kv_cache is not None:
                n = lens[b]
                k, v, keep_keys = k_all[b, :n], v_all[b, :n], valid[b, :n]
            else:
                k_lo, k_hi = _clamped_range(kv, b, call.k.shape[0])
                n = k_hi - k_lo
                k, v = call.k[k_lo:k_hi], call.v[k_lo:k_hi]
                keep_keys = torch.ones(n, dtype=torch.bool, device=q.device)
            m = q_hi - q_lo
            keep = keep_keys[None, :].expand(m, n)              # [m, n]
            if call.attn_mask is not None:
                keep = keep & _sequence_mask(call.attn_mask, b, m, n, q.device)
            if call.is_causal:
                keep = keep & (torch.arange(n, device=q.device)[None, :] <=
                               n - m + torch.arange(m, device=q.device)[:, None])
            if n == 0:
                continue
            rows = F.scaled_dot_product_attention(
                q[q_lo:q_hi].transpose(0, 1)[None], k.transpose(0, 1)[None].to(q.dtype),
                v.transpose(0, 1)[None].to(q.dtype), attn_mask=keep[None, None], scale=call.scale,
                enable_gqa=q.shape[1] != k.shape[1])[0].transpose(0, 1)  # [m, Hq, D]
            out[q_lo:q_hi] = rows.masked_fill(~keep.any(-1)[:, None, None], 0.0)
        return out


def _clamped_range(indptr: list[int], b: int, total: int) -> tuple[int, int]:
    """Sequence b's [lo, hi) as the kernels read it: both bounds clamped into [0, total], decreasing = empty."""
    lo = min(max(indptr[b], 0), total)
    hi = min(max(indptr[b + 1], 0), total)
    return lo, max(lo, hi)


def _sequence_mask(mask: torch.Tensor, b: int, m: int, n: int, device) -> torch.Tensor:
    """Sequence b's keep mask [m, n] from [B, M] or [B, Mq, M] (by row and key within the sequence): keys at or
    past M and rows at or past Mq keep nothing."""
    keep = torch.zeros(m, n, dtype=torch.bool, device=device)
    keys = min(n, mask.shape[-1])
    if mask.dim() == 2:
        keep[:, :keys] = mask[b, None, :keys].to(device)
    else:
        rows = min(m, mask.shape[1])
        keep[:rows, :keys] = mask[b, :rows, :keys].to(device)
    return keep


BACKENDS: dict[str, AttentionBackend] = {"cuda": CudaBackend(), "flash": FlashAttnBackend(),
                                         "torch": TorchNativeBackend()}
_PRIORITY = ("cuda", "flash", "torch")
_TRAINING_PRIORITY = ("flash", "torch")

# ---------------------------------------------------------------------------------------------------------
# Selection
# ---------------------------------------------------------------------------------------------------------

_context: contextvars.ContextVar = contextvars.ContextVar("astrai_attn_backend", default=None)
_process_choice: AttentionBackend | None = None
_env_seed_read = False


def _as_backend(impl, where: str) -> AttentionBackend | None:
    """None for "auto"; a backend for a name, an ATTN_BACKEND member or an AttentionBackend instance."""
    if isinstance(impl, AttentionBackend):
        return impl
    name = impl.value if isinstance(impl, ATTN_BACKEND) else impl
    if name == "auto":
        return None
    if isinstance(name, str) and name in BACKENDS:
        return BACKENDS[name]
    raise ValueError(f"{where}: unknown attention backend {impl!r}; expected one of "
                     f"{[m.value for m in ATTN_BACKEND]} or an AttentionBackend instance")


def _ops_seed(value: str) -> dict[str, str]:
    """ASTR_OPS's `op=impl[,op=impl...]` entries; ValueError naming the variable for a malformed one or an op that
    has no selectable implementations."""
    seeds = {}
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        op, sep, impl = entry.partition("=")
        if not sep or not op.strip() or not impl.strip():
            raise ValueError(f"ASTR_OPS: each entry must be op=impl (e.g. attention=torch), got {entry!r}")
        if op.strip() != "attention":
            raise ValueError(f"ASTR_OPS: unknown op {op.strip()!r}; ops with selectable implementations: "
                             "['attention']")
        seeds[op.strip()] = impl.strip().lower()
    return seeds


def _read_env_seed() -> None:
    """ASTR_BACKEND and ASTR_OPS ("attention=<impl>"), read once: deprecated seeds for set_op("attention", ...);
    ASTR_OPS wins where both are set."""
    global _env_seed_read, _process_choice
    if _env_seed_read:
        return
    _env_seed_read = True
    value = os.environ.get("ASTR_BACKEND")
    ops_value = os.environ.get("ASTR_OPS")
    if value and _process_choice is None:
        warnings.warn("ASTR_BACKEND is deprecated: call astrai.extension.set_op('attention', "
                      f"{value!r}) or use the attn_backend(...) context manager", DeprecationWarning, stacklevel=3)
        _process_choice = _as_backend(value.strip().lower(), "ASTR_BACKEND")
    if ops_value:
        warnings.warn(f"ASTR_OPS is deprecated: call astrai.extension.set_op(op, impl) for each of {ops_value!r}",
                      DeprecationWarning, stacklevel=3)
        seeds = _ops_seed(ops_value)
        if "attention" in seeds:
            _process_choice = _as_backend(seeds["attention"], "ASTR_OPS")


def set_op(op: str, impl) -> None:
    """Choose the implementation of a public op for this process: `set_op("attention", "torch")`.

    `impl`: an ATTN_BACKEND name ("auto" restores the automatic choice) or an AttentionBackend instance.
    The choice is strict: a call it cannot serve raises ValueError instead of switching.
    """
    global _process_choice, _env_seed_read
    if op != "attention":
        raise ValueError(f"set_op: unknown op {op!r}; ops with selectable implementations: ['attention']")
    _env_seed_read = True  # an explicit choice supersedes the environment seed
    _process_choice = _as_backend(impl, "set_op")


@contextlib.contextmanager
def attn_backend(impl):
    """Use one attention backend inside the block (strict: a call it cannot serve raises ValueError).

    Example
    -------
    >>> with attn_backend(ATTN_BACKEND.TORCH):
    ...     out = attention(q, k, v, is_causal=True)
    """
    token = _context.set(("set", _as_backend(impl, "attn_backend")))
    try:
        yield
    finally:
        _context.reset(token)


def _explicit_choice_eager() -> tuple[bool, AttentionBackend | None]:
    ctx = _context.get()
    if ctx is not None:
        return ctx[1] is not None, ctx[1]
    _read_env_seed()
    return _process_choice is not None, _process_choice


# Backends chosen explicitly when torch.compile traced a call, by the key `_explicit_key` returned.
_traced_choices: dict[str, AttentionBackend] = {}


@torch.compiler.assume_constant_result  # Dynamo cannot read a ContextVar: the selection is read once, when tracing
def _explicit_key() -> str:
    explicit, chosen = _explicit_choice_eager()
    if not explicit:
        return ""
    key = f"{chosen.name}#{id(chosen)}"
    _traced_choices[key] = chosen
    return key


def _explicit_choice() -> tuple[bool, AttentionBackend | None]:
    if torch.compiler.is_compiling():
        key = _explicit_key()
        return (True, _traced_choices[key]) if key else (False, None)
    return _explicit_choice_eager()


def select_backend(call: AttnCall) -> AttentionBackend:
    """The backend that serves `call` under the current selection rules (raises when a strict choice cannot); an
    automatic choice other than the CUDA kernels is recorded as a fallback."""
    explicit, chosen = _explicit_choice()
    if explicit:
        reason = chosen.blocker(call) if not isinstance(chosen, CudaBackend) else chosen.blocker(
            call, check_available=False)
        if reason:
            raise ValueError(f"attention: the selected backend {chosen.name!r} cannot run this call: {reason}")
        return chosen
    training = call.kv_cache is None and call.needs_grad()
    cuda_reason = None
    for name in _TRAINING_PRIORITY if training else _PRIORITY:
        reason = BACKENDS[name].blocker(call)
        if name == "cuda":
            cuda_reason = reason
        if reason is None:
            break
    else:
        name = "torch"
    if name != "cuda":
        if training:  # the kernels were not considered: name the first thing they cannot take
            cuda_reason = BACKENDS["cuda"].blocker(call, check_available=False)
        _fallbacks.record("attention", cuda_reason, name, on_gpu=call.q.is_cuda)
    return BACKENDS[name]


# ---------------------------------------------------------------------------------------------------------
# The public op
# ---------------------------------------------------------------------------------------------------------

def _canonical(q, k, v, kv_cache, layer_id, fwd, is_causal, attn_mask, scale, kv_lens, qo_indptr=None,
               kv_indptr=None) -> AttnCall:
    fn = "attention"
    if fwd not in FWD_MODES:
        raise ValueError(f"{fn}: fwd must be one of {FWD_MODES}, got {fwd!r}")
    if qo_indptr is not None or kv_indptr is not None:
        return _canonical_packed(q, k, v, kv_cache, layer_id, fwd, is_causal, attn_mask, scale, kv_lens, qo_indptr,
                                 kv_indptr)
    if q.dim() == 3:
        q4, was3 = q.unsqueeze(1), True
    elif q.dim() == 4:
        q4, was3 = q, False
    else:
        raise ValueError(f"{fn}: q must be [B, Lq, Hq, D] (or [B, Hq, D] for decode), got shape {list(q.shape)}")
    batch, q_len, heads_q, head_dim = q4.shape
    if kv_cache is not None:
        if k is not None or v is not None:
            raise ValueError(f"{fn}: pass either k and v or kv_cache, not both")
        if layer_id is None:
            raise ValueError(f"{fn}: kv_cache needs layer_id")
        kv_cache.layer(layer_id)  # validates the id
        if kv_lens is not None:
            raise ValueError(f"{fn}: kv_lens comes from the cache; do not pass it with kv_cache")
        if batch != kv_cache.batch_size:
            raise ValueError(f"{fn}: q has batch {batch}, the cache holds {kv_cache.batch_size} sequences")
        heads_kv, kv_head_dim, length = kv_cache.num_kv_heads, kv_cache.head_dim, kv_cache.capacity
    else:
        if k is None or v is None:
            raise ValueError(f"{fn}: k and v are required without kv_cache")
        if k.dim() != 4 or v.shape != k.shape:
            raise ValueError(f"{fn}: k and v must be [B, L, Hkv, D] of one shape, got {list(k.shape)} and "
                             f"{list(v.shape)}")
        if k.shape[0] != batch:
            raise ValueError(f"{fn}: k has batch {k.shape[0]}, q has {batch}")
        heads_kv, kv_head_dim, length = k.shape[2], k.shape[3], k.shape[1]
        if kv_lens is not None and (kv_lens.shape != (batch,) or kv_lens.dtype != torch.int32):
            raise ValueError(f"{fn}: kv_lens must be int32 [{batch}], got {kv_lens.dtype} {list(kv_lens.shape)}")
    if kv_head_dim != head_dim:
        raise ValueError(f"{fn}: q head_dim {head_dim} differs from K/V head_dim {kv_head_dim}")
    if heads_q % heads_kv:
        raise ValueError(f"{fn}: q heads ({heads_q}) must be a multiple of kv heads ({heads_kv})")
    resolved = fwd or ("decode" if q_len == 1 else "prefill")
    if resolved == "decode" and q_len != 1:
        raise ValueError(f"{fn}: fwd='decode' takes one query token per sequence, got q_len {q_len}")
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool:
            raise ValueError(f"{fn}: attn_mask must be bool (True = keep), got {attn_mask.dtype}")
        ok_2d = attn_mask.dim() == 2 and attn_mask.shape[0] == batch
        ok_3d = attn_mask.dim() == 3 and attn_mask.shape[:2] == (batch, q_len)
        ok_len = attn_mask.shape[-1] == length if kv_cache is None else attn_mask.shape[-1] <= length
        if not ((ok_2d or ok_3d) and ok_len):
            raise ValueError(f"{fn}: attn_mask must be [B, L] or [B, Lq, L] = [{batch}, {q_len}, {length}] "
                             f"bool, got {list(attn_mask.shape)}")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    return AttnCall(q4, k, v, kv_cache, layer_id, resolved, bool(is_causal), attn_mask, scale, kv_lens, was3)


def _check_indptr_arg(fn: str, name: str, t, size: int) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or t.shape[0] != size:
        got = f"{t.dtype} {list(t.shape)}" if isinstance(t, torch.Tensor) else repr(t)
        raise ValueError(f"{fn}: {name} must be int32 [B + 1] = [{size}], got {got}")


def _canonical_packed(q, k, v, kv_cache, layer_id, fwd, is_causal, attn_mask, scale, kv_lens, qo_indptr,
                      kv_indptr) -> AttnCall:
    """Packed variable-length sequences: q [Tq, Hq, D] with qo_indptr, over a cache or packed K/V + kv_indptr."""
    fn = "attention"
    if qo_indptr is None:
        raise ValueError(f"{fn}: kv_indptr needs qo_indptr (packed q [Tq, Hq, D])")
    if fwd == "decode":
        raise ValueError(f"{fn}: packed sequences (qo_indptr) are a prefill; fwd='decode' takes [B, 1, Hq, D]")
    if q.dim() != 3:
        raise ValueError(f"{fn}: with qo_indptr, q must be packed [Tq, Hq, D], got shape {list(q.shape)}")
    if not (isinstance(qo_indptr, torch.Tensor) and qo_indptr.dim() == 1 and qo_indptr.shape[0] >= 1):
        got = list(qo_indptr.shape) if isinstance(qo_indptr, torch.Tensor) else repr(qo_indptr)
        raise ValueError(f"{fn}: qo_indptr must be int32 [B + 1], got {got}")
    if kv_lens is not None:
        raise ValueError(f"{fn}: with qo_indptr, key counts come from kv_indptr or the cache; do not pass kv_lens")
    heads_q, head_dim = q.shape[1:]
    if kv_cache is not None:
        if k is not None or v is not None or kv_indptr is not None:
            raise ValueError(f"{fn}: pass either kv_cache or k, v and kv_indptr, not both")
        if layer_id is None:
            raise ValueError(f"{fn}: kv_cache needs layer_id")
        kv_cache.layer(layer_id)  # validates the id
        batch = kv_cache.batch_size
        heads_kv, kv_head_dim = kv_cache.num_kv_heads, kv_cache.head_dim
    else:
        if k is None or v is None or kv_indptr is None:
            raise ValueError(f"{fn}: packed q needs kv_cache, or packed k, v [Tkv, Hkv, D] with kv_indptr")
        if k.dim() != 3 or v.shape != k.shape:
            raise ValueError(f"{fn}: with kv_indptr, k and v must be packed [Tkv, Hkv, D] of one shape, got "
                             f"{list(k.shape)} and {list(v.shape)}")
        batch = qo_indptr.shape[0] - 1
        heads_kv, kv_head_dim = k.shape[1], k.shape[2]
        _check_indptr_arg(fn, "kv_indptr", kv_indptr, batch + 1)
    _check_indptr_arg(fn, "qo_indptr", qo_indptr, batch + 1)
    if kv_head_dim != head_dim:
        raise ValueError(f"{fn}: q head_dim {head_dim} differs from K/V head_dim {kv_head_dim}")
    if heads_q % heads_kv:
        raise ValueError(f"{fn}: q heads ({heads_q}) must be a multiple of kv heads ({heads_kv})")
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool:
            raise ValueError(f"{fn}: attn_mask must be bool (True = keep), got {attn_mask.dtype}")
        if attn_mask.dim() not in (2, 3) or attn_mask.shape[0] != batch:
            raise ValueError(f"{fn}: over packed sequences attn_mask must be [B, M] or [B, max_q, M] with B = "
                             f"{batch}, got {list(attn_mask.shape)}")
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    return AttnCall(q, k, v, kv_cache, layer_id, "prefill", bool(is_causal), attn_mask, scale, None, False,
                    qo_indptr, kv_indptr)


def attention(q: torch.Tensor, k: torch.Tensor | None = None, v: torch.Tensor | None = None, *,
              kv_cache: PagedKVCache | None = None, layer_id: int | None = None, fwd: str | None = None,
              is_causal: bool = False, attn_mask: torch.Tensor | None = None, scale: float | None = None,
              kv_lens: torch.Tensor | None = None, qo_indptr: torch.Tensor | None = None,
              kv_indptr: torch.Tensor | None = None) -> torch.Tensor:
    """Scaled dot-product attention (GQA/MQA) over contiguous K/V or a PagedKVCache, best backend per call.

    Parameters
    ----------
    q : Tensor
        `[B, Lq, Hq, D]`; decode may pass `[B, Hq, D]`.
    k, v : Tensor, optional
        `[B, L, Hkv, D]`, Hq a multiple of Hkv. Omit them with `kv_cache`.
    kv_cache : PagedKVCache, optional
        Keys and values of `layer_id` for the cache's active sequences (lengths from the cache). A cache made
        with `check_pages=True` has its page ids and lengths checked first (one host sync).
    fwd : {"decode", "prefill", None}
        None: decode when Lq == 1, else prefill. Other values raise ValueError.
    is_causal : bool
        Query i of a sequence with n keys sees keys `j <= n - Lq + i` (aligned to the end).
    attn_mask : Tensor, optional
        bool, True = keep: `[B, L]` or `[B, Lq, L]` (with a cache, L may be shorter than its capacity:
        later keys are dropped).
    scale : float, optional
        Softmax scale, default `1/sqrt(D)`.
    kv_lens : Tensor, optional
        `[B]` int32: keys used per sequence of contiguous K/V (a ragged batch); default all L.
    qo_indptr : Tensor, optional
        `[B + 1]` int32: packed variable-length prefill (like flash-attn's `cu_seqlens`). q is then
        `[Tq, Hq, D]`, sequence b owning rows `qo_indptr[b]:qo_indptr[b + 1]`; the keys come from `kv_cache`
        (B = its active sequences) or from packed k, v `[Tkv, Hkv, D]` with `kv_indptr`. Masks are then
        `[B, M]` or `[B, max_q, M]` by row and key within the sequence. Returns `[Tq, Hq, D]`; rows outside
        every sequence are unspecified.
    kv_indptr : Tensor, optional
        `[B + 1]` int32: sequence b's keys are `k[kv_indptr[b]:kv_indptr[b + 1]]` (with `qo_indptr`).

    Returns
    -------
    Tensor
        q's shape and dtype. A query that keeps no key gets zeros.

    Example
    -------
    >>> q = torch.randn(4, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    >>> k = torch.randn(4, 4096, 8, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    >>> out = attention(q, k, v)                          # decode: the CUDA split-KV kernel
    >>> cu = torch.tensor([0, 70, 80], device="cuda", dtype=torch.int32)
    >>> out = attention(q_packed, kv_cache=cache, layer_id=0, qo_indptr=cu, is_causal=True)  # q_packed [80, 32, 128]
    """
    call = _canonical(q, k, v, kv_cache, layer_id, fwd, is_causal, attn_mask, scale, kv_lens, qo_indptr, kv_indptr)
    if kv_cache is not None:
        kv_cache.check_read("attention")
    out = select_backend(call).forward(call)
    return out[:, 0] if call.q_was_3d else out
