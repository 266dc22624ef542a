"""Rotary-embedding policy: per call, the fused CUDA kernel where it serves, else the autograd-capable torch path.

The CUDA kernel (`astrai.extension.ops.rotary`) runs when all of these hold, checked in this order:

1. x (and k) are CUDA tensors, and where an image serves the rotary family the library takes their dtypes
   (`torch.ops.astrai.rotary_can_implement`: bfloat16; the op refuses the same with the same words);
2. no gradient is needed: grad mode is off, or none of x, k, cos, sin requires grad. The kernel has no
   backward, so this is the exact condition under which skipping autograd is correct: an output that
   does not require grad records no graph on either path;
3. an in-place call on `[B, S, H, D]` can be viewed as `[B*S, H, D]`;
4. an image serves the rotary family here (`loader.family_available("rotary")`).

cos/sin of another floating dtype (bf16, fp16, fp64) are cast to float32 for the kernel (a copy per call:
keep the cache in float32, as `rotary_cos_sin_cache` builds it). The torch path computes the complex
multiply in float32 (float64 for float64 inputs) and returns x's dtype; it is the reference-grade
fallback on CPU, for fp16/fp32, and for training.

`path="cuda"` forces the kernel and raises with the reason when it cannot run; `path="torch"` forces the
torch path; `select_path(...)` says which one `path="auto"` takes.
"""

from __future__ import annotations

import functools
import math

import torch

from astrai.extension import _fallbacks, loader
from astrai.extension.backend import _path
from astrai.extension.ops import rotary as ops

PATHS = _path.PATHS


@torch.compiler.assume_constant_result  # evaluated once at trace time under torch.compile
def _kernels_available() -> bool:
    return loader.family_available(ops.FAMILY)


def _merges(t: torch.Tensor) -> bool:
    return t.dim() != 4 or t.shape[0] <= 1 or t.shape[1] <= 1 or t.stride(0) == t.shape[1] * t.stride(1)


@torch.compiler.assume_constant_result  # a constant per dtype pair and head_dim (read once when tracing)
def _library_reason(q_dtype: torch.dtype, k_dtype: torch.dtype, head_dim: int) -> str:
    return _rotary_reason(q_dtype, k_dtype, int(head_dim))


@functools.lru_cache(maxsize=256)  # asked at every call: one lookup once a (dtypes, head_dim) was seen
def _rotary_reason(q_dtype: torch.dtype, k_dtype: torch.dtype, head_dim: int) -> str:
    ops.load()
    return torch.ops.astrai.rotary_can_implement(q_dtype, k_dtype, head_dim)


def _cuda_blocker(x: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                  inplace: bool, *, check_available: bool = True) -> str | None:
    """Why the CUDA kernel cannot run this call, or None when it can."""
    for name, t in (("x" if k is None else "q", x), ("k", k)):
        if t is not None and not t.is_cuda:
            return f"{name} is on {t.device}, not a CUDA device"
    available = _kernels_available()
    if available:  # the library's own dtype and head_dim rules (rotary_can_implement), not a copy of them
        why = _library_reason(x.dtype, (x if k is None else k).dtype, x.shape[-1])
        if why:
            return why
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (x, k, cos, sin)):
        return "a gradient is needed (grad mode is on and an input requires grad); the kernel has no backward"
    if inplace and not (_merges(x) and (k is None or _merges(k))):
        return "in place on [B, S, H, D] whose batch and sequence axes do not merge into one token axis"
    if check_available and not available:
        return "no image serves the rotary family here (python -m astrai.extension info says why)"
    return None


def _validate(fn: str, x: torch.Tensor, k: torch.Tensor | None, freqs_cis, positions) -> tuple:
    """Shape rules shared by both paths, so that a call valid on one path is valid on the other."""
    name = "x" if k is None else "q"
    if not (isinstance(freqs_cis, (tuple, list)) and len(freqs_cis) == 2):
        raise ValueError(f"{fn}: freqs_cis must be a pair (cos, sin), got {type(freqs_cis).__name__}")
    cos, sin = freqs_cis
    if x.dim() not in (3, 4):
        raise ValueError(f"{fn}: {name} must be [T, H, D] or [B, S, H, D], got shape {list(x.shape)}")
    head_dim = x.shape[-1]
    if head_dim % 2:
        raise ValueError(f"{fn}: {name} head_dim must be even, got {head_dim}")
    tokens = tuple(x.shape[:-2])  # (T,) or (B, S)
    if k is not None:
        if tuple(k.shape[:-2]) != tokens or k.dim() != x.dim() or k.shape[-1] != head_dim:
            raise ValueError(f"{fn}: k must be [{', '.join(map(str, tokens))}, Hk, {head_dim}] like q, "
                             f"got shape {list(k.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(f"{fn}: cos and sin must have one shape, got {list(cos.shape)} and {list(sin.shape)}")
    if not (cos.is_floating_point() and sin.is_floating_point()):
        raise ValueError(f"{fn}: cos and sin must be floating point, got {cos.dtype} and {sin.dtype}")
    if cos.dim() == 0 or cos.shape[-1] != head_dim // 2:
        raise ValueError(f"{fn}: cos must have head_dim/2 = {head_dim // 2} columns, got shape {list(cos.shape)}")
    if positions is None:
        per_token = tuple(cos.shape[:-1]) == tokens
        shared = x.dim() == 4 and cos.dim() == 2 and cos.shape[0] == x.shape[1]
        if not (per_token or shared):
            want = f"[{', '.join(map(str, tokens))}, {head_dim // 2}]"
            if x.dim() == 4:
                want += f" or [{x.shape[1]}, {head_dim // 2}] (shared by the batch)"
            raise ValueError(f"{fn}: without positions, cos must be per token {want}, got {list(cos.shape)}")
    else:
        if positions.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{fn}: positions must be int32 or int64, got {positions.dtype}")
        if tuple(positions.shape) != tokens:
            raise ValueError(f"{fn}: positions must be [{', '.join(map(str, tokens))}], got {list(positions.shape)}")
        if cos.dim() != 2:
            raise ValueError(f"{fn}: with positions, cos must be a cache [max_pos, {head_dim // 2}], "
                             f"got {list(cos.shape)}")
    return cos, sin


def select_path(x: torch.Tensor, freqs_cis, *, k: torch.Tensor | None = None, inplace: bool = False) -> str:
    """"cuda" or "torch": the path `apply_rotary_emb(..., path="auto")` takes for these arguments now."""
    cos, sin = freqs_cis
    return "torch" if _cuda_blocker(x, k, cos, sin, inplace) else "cuda"


def _choose(fn: str, path: str, x, k, cos, sin, inplace: bool) -> str:
    return _path.choose(fn, path, lambda available: _cuda_blocker(x, k, cos, sin, inplace, check_available=available),
                        on_gpu=x.is_cuda)


def _kernel_freqs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None):
    """cos/sin in float32; cos [S, D/2] shared by a 4-D batch becomes a cache indexed by generated positions."""
    cos = cos if cos.dtype == torch.float32 else cos.float()
    sin = sin if sin.dtype == torch.float32 else sin.float()
    if positions is None and x.dim() == 4 and cos.dim() == 2:
        batch, seq = x.shape[:2]
        positions = torch.arange(seq, device=x.device, dtype=torch.int32).repeat(batch).view(batch, seq)
    return cos, sin, positions


def _rotate_torch(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None,
                  interleaved: bool) -> torch.Tensor:
    """The torch path: complex multiply in float32 (float64 for float64 x), returned in x's dtype."""
    compute = torch.promote_types(x.dtype, torch.float32)
    if positions is not None:
        cos, sin = cos[positions], sin[positions]  # [T, D/2] or [B, S, D/2]
    freqs = torch.complex(cos.to(compute), sin.to(compute)).unsqueeze(-2)  # [..., 1, D/2]
    xf = x.to(compute)
    half = x.shape[-1] // 2
    if interleaved:  # GPT-J: pairs (2i, 2i+1) are adjacent (real, imag)
        xc = torch.view_as_complex(xf.unflatten(-1, (half, 2)).contiguous())
        out = torch.view_as_real(xc * freqs).flatten(-2)
    else:  # NeoX: pairs (i, i + D/2)
        y = torch.complex(xf[..., :half], xf[..., half:]) * freqs
        out = torch.cat((y.real, y.imag), dim=-1)
    return out.to(x.dtype)


def apply_rotary_emb(x: torch.Tensor, freqs_cis: tuple[torch.Tensor, torch.Tensor],
                     positions: torch.Tensor | None = None, *, interleaved: bool = False,
                     inplace: bool = False, check_positions: bool = True, path: str = "auto") -> torch.Tensor:
    """Apply rotary position embedding to x; the fused CUDA kernel where it serves, else torch.

    Parameters
    ----------
    x : Tensor
        `[T, H, D]` or `[B, S, H, D]`, D even. bf16 on CUDA runs the kernel; any floating dtype and device
        runs the torch path.
    freqs_cis : (Tensor, Tensor)
        `(cos, sin)`, floating point. Without `positions`: per token, `[T, D/2]` or `[B, S, D/2]`, or
        `[S, D/2]` shared by every sequence of a 4-D x. With `positions`: a cache `[max_pos, D/2]`
        (see `rotary_cos_sin_cache`). Cast to float32 for the kernel.
    positions : Tensor, optional
        int32 or int64 `[T]` or `[B, S]`: each token's cache row.
    interleaved : bool
        False: NeoX pairs `(i, i + D/2)`; True: GPT-J pairs `(2i, 2i + 1)`.
    inplace : bool
        Write the result into x and return x.
    check_positions : bool
        Raise ValueError for positions outside `[0, max_pos)` (one host sync; skipped under CUDA-graph
        capture and torch.compile). Without the check the kernel writes NaN for such tokens; the torch
        path follows torch's indexing (a negative position counts from the end, one >= max_pos raises,
        on CUDA through a device-side assert).
    path : {"auto", "cuda", "torch"}
        "auto" follows the module's rule; "cuda" forces the kernel (ValueError if it cannot run);
        "torch" forces the torch path.

    Returns
    -------
    Tensor
        x's shape and dtype (contiguous unless inplace): `y0 = x0*cos - x1*sin`, `y1 = x1*cos + x0*sin`.

    Example
    -------
    >>> cos, sin = rotary_cos_sin_cache(4096, 128, device="cuda")
    >>> q = torch.randn(2, 19, 32, 128, device="cuda", dtype=torch.bfloat16)
    >>> positions = torch.arange(19, device="cuda").expand(2, 19)
    >>> q_rot = apply_rotary_emb(q, (cos, sin), positions)
    """
    fn = "apply_rotary_emb"
    cos, sin = _validate(fn, x, None, freqs_cis, positions)
    chosen = _choose(fn, path, x, None, cos, sin, inplace)
    if positions is not None and check_positions:
        ops.check_positions_range(fn, positions, cos.shape[0])
    if chosen == "cuda":
        cos, sin, positions = _kernel_freqs(x, cos, sin, positions)
        if inplace:
            ops.rotary_embedding_(x, None, cos, sin, positions, interleaved=interleaved, check_positions=False)
            return x
        return ops.rotary_embedding(x, cos, sin, positions, interleaved=interleaved, check_positions=False)
    out = _rotate_torch(x, cos, sin, positions, interleaved)
    return x.copy_(out) if inplace else out


def apply_rotary_emb_qk(q: torch.Tensor, k: torch.Tensor, freqs_cis: tuple[torch.Tensor, torch.Tensor],
                        positions: torch.Tensor | None = None, *, interleaved: bool = False,
                        inplace: bool = False, check_positions: bool = True,
                        path: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Apply rotary embedding to q `[..., Hq, D]` and k `[..., Hk, D]`; on CUDA, one fused launch.

    Arguments as in `apply_rotary_emb`; q and k share the token axes, D, freqs_cis and positions and may
    have different head counts (GQA). With `inplace`, writes q and k and returns them: views into a fused
    qkv buffer work and leave v untouched.

    Example
    -------
    >>> qkv = torch.randn(19, 48, 128, device="cuda", dtype=torch.bfloat16)        # Hq=32, Hk=Hv=8
    >>> positions = torch.arange(19, device="cuda")
    >>> apply_rotary_emb_qk(qkv[:, :32], qkv[:, 32:40], (cos, sin), positions, inplace=True)
    """
    fn = "apply_rotary_emb_qk"
    cos, sin = _validate(fn, q, k, freqs_cis, positions)
    chosen = _choose(fn, path, q, k, cos, sin, inplace)
    if positions is not None and check_positions:
        ops.check_positions_range(fn, positions, cos.shape[0])
    if chosen == "cuda":
        cos, sin, positions = _kernel_freqs(q, cos, sin, positions)
        if inplace:
            ops.rotary_embedding_(q, k, cos, sin, positions, interleaved=interleaved, check_positions=False)
            return q, k
        return ops.rotary_embedding_qk(q, k, cos, sin, positions, interleaved=interleaved, check_positions=False)
    q_out = _rotate_torch(q, cos, sin, positions, interleaved)
    k_out = _rotate_torch(k, cos, sin, positions, interleaved)
    if inplace:
        return q.copy_(q_out), k.copy_(k_out)
    return q_out, k_out


def rotary_cos_sin_cache(max_pos: int, head_dim: int, base: float = 10000.0, *,
                         device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 cos/sin cache `[max_pos, head_dim/2]` of standard RoPE with base theta.

    Row p, column j holds `cos(p * base**(-2j/head_dim))` and `sin(...)`; the angles are computed in
    float64 and rounded once, so late positions keep their accuracy. The same cache serves both pairings.

    Example
    -------
    >>> cos, sin = rotary_cos_sin_cache(8192, 128, base=500000.0, device="cuda")
    >>> cos.shape, cos.dtype
    (torch.Size([8192, 64]), torch.float32)
    """
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"rotary_cos_sin_cache: head_dim must be positive and even, got {head_dim}")
    if max_pos < 0:
        raise ValueError(f"rotary_cos_sin_cache: max_pos must be >= 0, got {max_pos}")
    if not (base > 0 and math.isfinite(base)):
        raise ValueError(f"rotary_cos_sin_cache: base must be positive and finite, got {base}")
    inv_freq = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)
    angles = torch.arange(max_pos, dtype=torch.float64, device=device)[:, None] * inv_freq  # [max_pos, D/2]
    return angles.cos().float(), angles.sin().float()
