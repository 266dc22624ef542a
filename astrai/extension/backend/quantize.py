"""Quantization policy: per call, the CUDA quantize kernels where they serve, else a torch path that computes
the same bits (so a CPU result equals the GPU one).

The CUDA kernels (`astrai.extension.ops.quantize`) run when all of these hold, checked in this order:

1. x is a CUDA tensor;
2. an image serves the quantize family here (`loader.family_available("quantize")`);
3. the library takes x (`torch.ops.astrai.quantize_can_implement`: bf16, fp16 or fp32 with a unit last stride;
   the ops refuse the same with the same words).

Calls no path implements (int8 only row-major; block scaling needs N % 128 == 0) raise on both paths.

Quantization has no gradient: an x that requires grad is quantized as its detached value on both paths.
`path="cuda"` forces the kernels and raises with the reason when they cannot run; `path="torch"` forces the
torch path; `select_path(...)` says which one `path="auto"` takes.

The contract (docs/contracts.md, "Quantize ops") in brief: fp8 `out = (x.float() * s).clamp(-max, max)
.to(fp8)` with NaN -> 0x7f; int8 `round_half_even(x.float() * s)` clamped to [-127, 127] with NaN -> 0;
dynamic multipliers `s = qmax / amax` in float32 (FLT_MAX past it, or 2^127 when rounded down to a power of
two with `pow2_scale`), `s = 1` for an amax of 0, inf or NaN; the returned `scale_inv = 1 / s`.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import weakref

import torch

from astrai.extension import _fallbacks, loader
from astrai.extension.backend import _path
from astrai.extension.backend import gemm as _gemm
from astrai.extension._deprecation import renamed_kwarg
from astrai.extension.ops import quantize as ops

PATHS = _path.PATHS
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
_FLT_MAX = torch.finfo(torch.float32).max
_IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@torch.compiler.assume_constant_result  # evaluated once at trace time under torch.compile
def _kernels_available() -> bool:
    return loader.family_available(ops.FAMILY)


def _qmax(dtype: torch.dtype, fn: str) -> float:
    if dtype == torch.int8:
        return 127.0
    if dtype not in FP8_MAX:
        raise ValueError(f"{fn}: out_dtype must be torch.float8_e4m3fn, torch.float8_e5m2 or torch.int8, got {dtype}")
    return FP8_MAX[dtype]


@torch.compiler.assume_constant_result  # a constant per argument tuple (read once when tracing)
def _library_reason(dtype: torch.dtype, last_size: int, last_stride: int) -> str:
    return _quantize_reason(dtype, min(int(last_size), 2), int(last_stride) if last_size > 1 else 1)


@functools.lru_cache(maxsize=256)  # asked at every call: one lookup once an argument tuple was seen
def _quantize_reason(dtype: torch.dtype, last_size: int, last_stride: int) -> str:
    ops.load()
    return torch.ops.astrai.quantize_can_implement(dtype, last_size, last_stride)


def _cuda_blocker(x: torch.Tensor, *, check_available: bool = True) -> str | None:
    if not x.is_cuda:
        return f"x is on {x.device}, not a CUDA device"
    available = _kernels_available()
    if available:  # the library's own rules for x (quantize_can_implement), not a copy of them
        why = _library_reason(x.dtype, x.shape[-1] if x.dim() else 1, x.stride(-1) if x.dim() else 1)
        if why:
            return why
    if check_available and not available:
        return "no image serves the quantize family here (python -m astrai.extension info says why)"
    return None


def _choose(fn: str, path: str, x: torch.Tensor) -> str:
    return _path.choose(fn, path, lambda available: _cuda_blocker(x, check_available=available), on_gpu=x.is_cuda)


def select_path(x: torch.Tensor) -> str:
    """"cuda" or "torch": the path the quantize functions take for x with `path="auto"`."""
    return "torch" if _cuda_blocker(x) else "cuda"


# ---- the torch path: the contract's formulas ----------------------------------------------------------------

def cast_torch(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 values (already multiplied) -> fp8 / int8 by the contract's rounding, saturation and NaN rules."""
    y = y.float()
    nan = torch.isnan(y)
    if dtype == torch.int8:
        q = torch.round(y.clamp(-127.0, 127.0))
        return q.masked_fill(nan, 0.0).to(torch.int8)
    m = FP8_MAX[dtype]
    bits = y.clamp(-m, m).to(dtype).view(torch.uint8)
    return bits.masked_fill(nan, 0x7F).view(dtype)


def scale_from_amax_torch(amax: torch.Tensor, qmax: float, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(multiplier, 1 / multiplier) in float32 from an amax, elementwise (the kernels' rule)."""
    a = amax.float()
    ok = (a > 0) & torch.isfinite(a)
    mul = torch.full_like(a, qmax) / torch.where(ok, a, torch.ones_like(a))
    mul = torch.where(torch.isinf(mul), torch.full_like(mul, 2.0**127 if pow2 else _FLT_MAX), mul)
    if pow2:
        mul = (mul.view(torch.int32) & -8388608).view(torch.float32)
    mul = torch.where(ok, mul, torch.ones_like(mul))
    return mul, torch.ones_like(mul) / mul


def _amax_torch(x2: torch.Tensor, dim: int | None) -> torch.Tensor:
    a = x2.detach().float().abs()
    if dim is None:
        return a.amax().reshape(1) if a.numel() else torch.zeros(1, device=x2.device)
    if a.shape[1] == 0:
        return torch.zeros(a.shape[0], device=x2.device)
    return a.amax(dim=dim)


def _mn_major_zeros(like: torch.Tensor, mn: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """[mn, k] with strides (1, align(mn, 4)), padding rows zero (as the kernels write them)."""
    return like.new_zeros((k, (mn + 3) // 4 * 4), dtype=dtype).transpose(0, 1)[:mn]


def _as_2d(fn: str, x: torch.Tensor) -> torch.Tensor:
    if x.dim() < 2:
        raise ValueError(f"{fn}: x must be [M, N] or [..., N], got shape {list(x.shape)}")
    return x.detach().reshape(-1, x.shape[-1])


def _layout(fn: str, layout) -> int:
    return ops._lookup(ops.LAYOUTS, layout, fn, "layout")


# ---- public functions ----------------------------------------------------------------------------------------

@renamed_kwarg("dtype", "out_dtype")
def quantize_fp8(x: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype = torch.float8_e4m3fn, *,
                 layout: str | int = "rowwise", amax: str | None = None, check_scale: bool = True,
                 path: str = "auto"):
    """Quantize x with a given float32 multiplier (per tensor `[]`/`[1]`, per row `[M, 1]`, per column `[1, N]`).

    Returns `(out, out_t, amax)` as `ops.quantize.quantize` does (None for what was not asked for); the torch
    path computes the same bits. out_dtype may be torch.int8 for the row-major layout.

    Example
    -------
    >>> out, out_t, amax = quantize_fp8(x, torch.tensor([2.0], device="cuda"), layout="dual", amax="tensor")
    """
    fn = "quantize_fp8"
    qmax = _qmax(out_dtype, fn)
    layout_i = _layout(fn, layout)
    amax_i = ops._lookup(ops.AMAX, amax, fn, "amax")
    if out_dtype == torch.int8 and layout_i != 0:
        raise ValueError(f"{fn}: int8 output is row-major only (layout='rowwise'), got layout={layout!r}")
    if _choose(fn, path, x) == "cuda":
        return ops.quantize(x.detach(), scale, out_dtype, layout=layout_i, amax=amax, check_scale=check_scale)
    if check_scale:
        ops.check_scale_values(fn, scale)
    x2 = _as_2d(fn, x)
    M, N = x2.shape
    s = scale.float()
    if s.numel() == 1:
        s = s.reshape(())
    elif tuple(s.shape) not in ((M, 1), (1, N)):
        raise ValueError(f"{fn}: scale must be [] or [1], [M, 1] = [{M}, 1] or [1, N] = [1, {N}], got {list(s.shape)}")
    del qmax
    q = cast_torch(x2.float() * s.to(x2.device), out_dtype)
    out = q.view(x.shape) if layout_i != 1 else None
    out_t = q.t().contiguous() if layout_i != 0 else None
    a = None if amax_i == 0 else _amax_torch(x2, None if amax_i == 1 else 1)
    return out, out_t, a


@renamed_kwarg("dtype", "out_dtype")
def quantize_fp8_dynamic(x: torch.Tensor, out_dtype: torch.dtype = torch.float8_e4m3fn, *,
                         granularity: str = "tensor", pow2_scale: bool = False, layout: str | int = "rowwise",
                         path: str = "auto"):
    """Dynamic quantization (amax -> multiplier -> cast) per tensor or per row (one pass on CUDA).

    Returns `(out, out_t, scale_inv)`: scale_inv float32 `[1]` or `[M, 1]`, the dequantization scale.

    Example
    -------
    >>> q, _, scale_inv = quantize_fp8_dynamic(x, granularity="row")   # q * scale_inv ~ x
    """
    fn = "quantize_fp8_dynamic"
    qmax = _qmax(out_dtype, fn)
    g = ops._lookup(ops.GRANULARITY, granularity, fn, "granularity")
    layout_i = _layout(fn, layout)
    if g == 1 and layout_i != 0:
        raise ValueError(f"{fn}: per-row scales are row-major only (layout='rowwise'), got layout={layout!r}")
    if out_dtype == torch.int8 and layout_i != 0:
        raise ValueError(f"{fn}: int8 output is row-major only (layout='rowwise'), got layout={layout!r}")
    if _choose(fn, path, x) == "cuda":
        return ops.quantize_dynamic(x.detach(), out_dtype, granularity=g, pow2_scale=pow2_scale, layout=layout_i)
    x2 = _as_2d(fn, x)
    a = _amax_torch(x2, None if g == 0 else 1)
    mul, inv = scale_from_amax_torch(a, qmax, pow2_scale)
    if g == 1:
        mul, inv = mul.reshape(-1, 1), inv.reshape(-1, 1)
    q = cast_torch(x2.float() * (mul if g == 1 else mul.reshape(())), out_dtype)
    out = q.view(x.shape) if layout_i != 1 else None
    out_t = q.t().contiguous() if layout_i != 0 else None
    return out, out_t, inv


@renamed_kwarg("dtype", "out_dtype")
def quantize_fp8_block(x: torch.Tensor, out_dtype: torch.dtype = torch.float8_e4m3fn, *, block_rows: int = 1,
                       pow2_scale: bool = False, scale_mn_major: bool = False, path: str = "auto"):
    """Block-scaled fp8: 1 x 128 groups (block_rows=1) or 128 x 128 blocks (block_rows=128); N % 128 == 0.

    Returns `(out, scale_inv)`, scale_inv float32 `[ceil(M / block_rows), N / 128]` (MN-major TMA-aligned with
    `scale_mn_major`).

    Example
    -------
    >>> q, sf = quantize_fp8_block(w, block_rows=128, pow2_scale=True)
    """
    fn = "quantize_fp8_block"
    if out_dtype not in FP8_MAX:
        raise ValueError(f"{fn}: out_dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {out_dtype}")
    if block_rows not in (1, 128):
        raise ValueError(f"{fn}: block_rows must be 1 or 128, got {block_rows}")
    if x.dim() >= 1 and x.shape[-1] % 128:
        raise ValueError(f"{fn}: the block size 128 does not divide N = {x.shape[-1]}; pad the columns")
    if _choose(fn, path, x) == "cuda":
        return ops.quantize_block(x.detach(), out_dtype, block_rows=block_rows, pow2_scale=pow2_scale,
                                  scale_mn_major=scale_mn_major)
    x2 = _as_2d(fn, x)
    M, N = x2.shape
    rows_p = -(-M // block_rows) * block_rows
    xf = torch.zeros(rows_p, N, dtype=torch.float32, device=x2.device)
    xf[:M] = x2.float()
    blocks = xf.view(rows_p // block_rows, block_rows, N // 128, 128)
    a = blocks.abs().amax(dim=(1, 3)) if blocks.numel() else torch.zeros(rows_p // block_rows, N // 128,
                                                                         device=x2.device)
    mul, inv = scale_from_amax_torch(a, FP8_MAX[out_dtype], pow2_scale)
    q = cast_torch((blocks * mul[:, None, :, None]).view(rows_p, N)[:M], out_dtype)
    if scale_mn_major:
        inv = _mn_major_zeros(inv, inv.shape[0], inv.shape[1], torch.float32).copy_(inv)
    return q.view(x.shape), inv


def fp8_scale_layout(sf: torch.Tensor, *, pack_ue8m0: bool = False, path: str = "auto") -> torch.Tensor:
    """Scale factors `[MN, SF_K]` float32 -> DeepGEMM's MN-major TMA-aligned layout, plain or packed UE8M0.

    Example
    -------
    >>> packed = fp8_scale_layout(sf, pack_ue8m0=True)   # int32 [MN, ceil(SF_K/4)], strides (1, align(MN, 4))
    """
    fn = "fp8_scale_layout"
    if sf.dim() != 2 or sf.dtype != torch.float32:
        raise ValueError(f"{fn}: sf must be float32 [MN, SF_K], got {sf.dtype} {list(sf.shape)}")
    chosen = "torch" if path == "torch" or (path == "auto" and (not sf.is_cuda or not _kernels_available())) \
        else "cuda"
    if path not in PATHS:
        raise ValueError(f"{fn}: path must be one of {PATHS}, got {path!r}")
    if chosen == "cuda":
        return ops.scale_layout(sf, pack_ue8m0=pack_ue8m0)
    mn, sf_k = sf.shape
    if not pack_ue8m0:
        return _mn_major_zeros(sf, mn, sf_k, torch.float32).copy_(sf)
    k4 = (sf_k + 3) // 4
    exps = torch.zeros(mn, 4 * k4, dtype=torch.int64, device=sf.device)
    exps[:, :sf_k] = (sf.contiguous().view(torch.int32).to(torch.int64) >> 23) & 0xFF
    e = exps.view(mn, k4, 4)
    words = e[..., 0] | (e[..., 1] << 8) | (e[..., 2] << 16) | (e[..., 3] << 24)
    words = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    return _mn_major_zeros(sf, mn, k4, torch.int32).copy_(words)


def quantize_int8_per_row(x: torch.Tensor, *, path: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric dynamic int8 per row (activations): `(q int8 [..., N], scale_inv float32 [M, 1])`,
    q = round_half_even(x * 127 / amax_row) in [-127, 127].

    Example
    -------
    >>> q, scale_inv = quantize_int8_per_row(x)       # x ~ q.float() * scale_inv
    """
    out, _, inv = quantize_fp8_dynamic(x, out_dtype=torch.int8, granularity="row", path=path)
    return out, inv


def quantize_int8_per_channel(weight: torch.Tensor, *, path: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel of a weight `[out_features, in_features]`: the per-row rule on its
    rows. Returns `(q int8, scale_inv float32 [out_features, 1])`.

    Example
    -------
    >>> qw, w_scale = quantize_int8_per_channel(linear.weight)
    """
    return quantize_int8_per_row(weight, path=path)


# ---- the delayed-scaling ring fold -----------------------------------------------------------------------------

def fold_amax_history_torch(ring: torch.Tensor, pos: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, *,
                            qmax: float, margin: int = 0, scale_inv: torch.Tensor | None = None) -> None:
    """The ring fold in torch, in place, on any device, without a host sync: the CPU path and the model the
    kernel is tested against (`ops.quantize.amax_history_fold` has the rule), with the slot kept in the int64
    tensor `pos`."""
    n = ring.numel()
    slot = pos.reshape(1).remainder(n)
    ring.scatter_(0, slot, amax.reshape(1).to(ring.dtype))
    pos.copy_(((slot + 1) % n).reshape(pos.shape))
    mul, _ = scale_from_amax_torch(ring.amax().reshape(1), qmax, False)
    # 2**margin as float32 is inf from 128 on (a Python float overflows only at 1024).
    div = 2.0 ** margin if margin < 128 else float("inf")
    nxt = mul / div
    scale.copy_(nxt.reshape(scale.shape))
    if scale_inv is not None:
        scale_inv.copy_((1.0 / nxt).reshape(scale_inv.shape))


def fold_amax_history(ring: torch.Tensor, pos: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, *,
                      qmax: float, margin: int = 0, scale_inv: torch.Tensor | None = None,
                      path: str = "auto") -> None:
    """The delayed-scaling ring fold, in place: `ring[pos % len] = amax`, `pos` advanced, `scale` (and
    `scale_inv`) set to the next step's multiplier (`ops.quantize.amax_history_fold` has the rule).

    path "auto": the kernel for a CUDA ring when an image serves the quantize family, else torch; "cuda" /
    "torch" force one. Both give the same bits, and neither syncs with the host.

    Example
    -------
    >>> fold_amax_history(ring, pos, scale, amax, qmax=448.0, margin=0)
    """
    if path not in PATHS:
        raise ValueError(f"fold_amax_history: path must be one of {PATHS}, got {path!r}")
    if margin < 0:
        raise ValueError(f"fold_amax_history: margin must be >= 0, got {margin}")
    use_kernel = path == "cuda" or (path == "auto" and ring.is_cuda and _kernels_available())
    if use_kernel:
        ops.amax_history_fold(ring, pos, scale, amax, qmax=qmax, margin=margin, scale_inv=scale_inv)
    else:
        fold_amax_history_torch(ring, pos, scale, amax, qmax=qmax, margin=margin, scale_inv=scale_inv)


class AmaxHistory:
    """One tensor role's delayed-scaling state, all on `device`: the amax ring (float32 `[length]`), the slot
    (`pos`, int64 `[1]`), the next multiplier (`scale`, float32 `[1]`) and its reciprocal (`scale_inv`).
    `fold(amax)` updates them on the device (no host sync; CUDA-graph capturable); `steps` counts folds on the
    host (0: no history yet, quantize dynamically). `DelayedScaling` keeps one per tensor role and weight.

    `quantize(x, out_dtype)` quantizes with the current multiplier and folds this step's amax in the same launch
    (`ops.quantize.quantize_delayed`; torch path: quantize, then fold). One history serves one stream at a time:
    its `workspace` (the fused kernel's block counter) must not be shared by two launches in flight.

    Example
    -------
    >>> hist = AmaxHistory(16, qmax=448.0, device="cuda")
    >>> q, q_t, amax = quantize_fp8(x, hist.scale, layout="dual", amax="tensor", check_scale=False)
    >>> hist.fold(amax)
    >>> q, q_t, inv = hist.quantize(x, out_dtype=torch.float8_e4m3fn, layout="dual")   # the same, one launch
    """

    def __init__(self, length: int, *, qmax: float, margin: int = 0, device=None, path: str = "auto"):
        if length < 1:
            raise ValueError(f"AmaxHistory: length must be >= 1, got {length}")
        self.ring = torch.zeros(length, dtype=torch.float32, device=device)
        self.pos = torch.zeros(1, dtype=torch.int64, device=device)
        self.scale = torch.ones(1, dtype=torch.float32, device=device)
        self.scale_inv = torch.ones(1, dtype=torch.float32, device=device)
        self.workspace = torch.zeros(1, dtype=torch.int32, device=device)
        self.qmax, self.margin, self.path = float(qmax), int(margin), path
        self.steps = 0

    @renamed_kwarg("dtype", "out_dtype")
    def quantize(self, x: torch.Tensor, out_dtype: torch.dtype = torch.float8_e4m3fn, *,
                 layout: str | int = "dual"):
        """x quantized with `scale` (per tensor, this step's multiplier), then this step's amax folded into the
        ring: `(out, out_t, step_scale_inv)` as `quantize_fp8` gives out / out_t (None when not asked for), and
        step_scale_inv (float32 `[1]`) the dequantization scale of this step (`scale_inv` before the fold). On the
        CUDA path one launch does both; the torch path gives the same bits."""
        fn = "AmaxHistory.quantize"
        if out_dtype not in FP8_MAX:
            raise ValueError(f"{fn}: out_dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {out_dtype}")
        if FP8_MAX[out_dtype] != self.qmax:
            raise ValueError(f"{fn}: out_dtype {out_dtype} has max {FP8_MAX[out_dtype]}, but this history was built "
                             f"for qmax={self.qmax}")
        layout_i = _layout(fn, layout)
        if _choose(fn, self.path, x) == "cuda" and x.device == self.ring.device:
            out, out_t, _, inv = ops.quantize_delayed(x.detach(), self.scale, self.ring, self.pos, self.workspace,
                                                      out_dtype, layout=layout_i, margin=self.margin,
                                                      scale_inv=self.scale_inv)
            self.steps += 1
            return out, out_t, inv
        out, out_t, amax = quantize_fp8(x, self.scale, out_dtype=out_dtype, layout=layout_i, amax="tensor",
                                        check_scale=False,
                                        path="torch" if self.path == "torch" else "auto")
        inv = self.scale_inv.clone()  # the fold below overwrites it with the next step's
        self.fold(amax)
        return out, out_t, inv

    def fold(self, amax: torch.Tensor) -> None:
        """This step's amax (float32, one element, on the ring's device) into the ring; `scale` and
        `scale_inv` become the next step's."""
        fold_amax_history(self.ring, self.pos, self.scale, amax.float(), qmax=self.qmax, margin=self.margin,
                          scale_inv=self.scale_inv, path=self.path)
        self.steps += 1


# ---- the FP8 strategy layer: recipes and fp8_autocast ------------------------------------------------------------
#
# fp8_autocast routes `aten::linear` (nn.Linear, F.linear, and C++ callers of at::linear) through fp8
# quantization and an fp8 GEMM, forward and backward, while the context is active. It does so with a
# Python kernel for aten::linear at the Autograd<Device> and <Device> dispatch keys of the routed device types
# (the backend key serves inference_mode, which skips the autograd keys). Nothing is registered at import: the
# outermost active context of any thread registers the kernel and the last one to leave destroys the
# registration, so outside every context aten::linear dispatches exactly as in plain torch. While registered,
# the kernel reads this thread's innermost context: none, a disabled one, or a call it cannot route runs
# aten::linear's own CompositeImplicitAutograd kernel (`decompose`), the kernel dispatch would have picked.
#
# Forward: x [M, K] and W [N, K] quantized to e4m3 with both layouts (row-major for the forward GEMM,
# transposed kept for the backward), out = mm(xq, Wq^T) * scale_inv_x * scale_inv_w (+ bias).
# Backward: grad [M, N] quantized to the recipe's backward format with both layouts;
#   grad_x = mm(gq, (W^T)q^T), grad_W = mm((g^T)q, (x^T)q^T), grad_bias = grad.sum(0).
# Each mm is `quant_gemm` in layout "nt" (both operands K-major: the Hopper kernels' layout) where its kernels
# serve the call, else `torch._scaled_mm` (`_fp8_mm`; the fallback and its reason are recorded, `info` shows them).
# Calls the GEMM cannot take (M, N or K not a multiple of 16, an input that is not bf16/fp16/fp32, a tensor
# subclass, a device outside `devices`) run the plain linear.

_FORMATS = {"hybrid": (torch.float8_e4m3fn, torch.float8_e5m2), "e4m3": (torch.float8_e4m3fn, torch.float8_e4m3fn)}
_DISPATCH_KEYS = {"cpu": ("AutogradCPU", "CPU"), "cuda": ("AutogradCUDA", "CUDA")}
_LINEAR = torch.ops.aten.linear.default


@dataclasses.dataclass(frozen=True)
class DelayedScaling:
    """Delayed scaling: each tensor role (input, weight, gradient) of each weight keeps an `AmaxHistory` of its
    last `amax_history_len` amax values on the tensor's device; the multiplier of step t is
    `fp8_max / max(ring) / 2**margin` from the steps before it (the first step quantizes dynamically), and step
    t's amax enters the ring in the quantize kernel's own launch (its last block folds it), without a host sync.
    fp8_format "hybrid": e4m3 forward, e5m2 gradients; "e4m3": e4m3 everywhere."""
    amax_history_len: int = 16
    margin: int = 0
    fp8_format: str = "hybrid"

    def __post_init__(self):
        if self.amax_history_len < 1:
            raise ValueError(f"DelayedScaling: amax_history_len must be >= 1, got {self.amax_history_len}")
        if self.margin < 0:
            raise ValueError(f"DelayedScaling: margin must be >= 0, got {self.margin}")
        if self.fp8_format not in _FORMATS:
            raise ValueError(f"DelayedScaling: fp8_format must be one of {sorted(_FORMATS)}, got {self.fp8_format!r}")


@dataclasses.dataclass(frozen=True)
class DynamicScaling:
    """Dynamic scaling, no state: every tensor quantized with the multiplier of its own amax, per tensor
    (granularity "tensor") or, for the forward GEMM's input and weight, per row ("row"; the backward then uses
    per-tensor scales, and both forward operands are e4m3)."""
    granularity: str = "tensor"
    fp8_format: str = "hybrid"

    def __post_init__(self):
        if self.granularity not in ("tensor", "row"):
            raise ValueError(f"DynamicScaling: granularity must be 'tensor' or 'row', got {self.granularity!r}")
        if self.fp8_format not in _FORMATS:
            raise ValueError(f"DynamicScaling: fp8_format must be one of {sorted(_FORMATS)}, got {self.fp8_format!r}")


class _History:
    """DelayedScaling's state for one tensor role of one weight: an `AmaxHistory` (ring, slot, multiplier and
    its reciprocal on the tensor's device) and the fold count on the host."""

    def __init__(self, length: int, device, *, qmax: float, margin: int):
        self.amax_history = AmaxHistory(length, qmax=qmax, margin=margin, device=device)

    @property
    def steps(self) -> int:
        return self.amax_history.steps

    def scale(self) -> torch.Tensor | None:
        """The multiplier (float32 [1], on the device), or None before the first fold (quantize dynamically)."""
        return self.amax_history.scale if self.amax_history.steps else None

    def scale_inv(self) -> torch.Tensor:
        """1 / scale() as the fold rounded it: the dequantization scale of this step."""
        return self.amax_history.scale_inv

    def fold(self, amax: torch.Tensor) -> None:
        """This step's amax into the ring; scale() and scale_inv() become the next step's (no host sync)."""
        self.amax_history.fold(amax)


def _quantize_both(t: torch.Tensor, dtype: torch.dtype, recipe, history: _History | None):
    """(q [M, N], q_t [N, M], scale_inv []) per tensor; the delayed recipe folds this step's amax."""
    if history is None or history.scale() is None:
        q, q_t, inv = quantize_fp8_dynamic(t, out_dtype=dtype, granularity="tensor", layout="dual")
        if history is not None:
            history.fold(t.detach().abs().amax().float())
        return q, q_t, inv.reshape(())
    # quantize and fold: one launch on CUDA
    q, q_t, inv = history.amax_history.quantize(t, out_dtype=dtype, layout="dual")
    return q, q_t, inv.reshape(())


SCALED_MM = "torch._scaled_mm"


def fp8_gemm_blocker(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
                     bias: torch.Tensor | None) -> str | None:
    """Why `quant_gemm`'s kernels cannot run one of fp8_autocast's GEMMs (then `torch._scaled_mm` does), or None."""
    return _gemm.cuda_blocker(a, b, a_scale=a_scale, b_scale=b_scale, bias=bias)


FP8_GEMMS = ("auto", "quant_gemm", "scaled_mm")


def _fp8_mm(a: torch.Tensor, b: torch.Tensor, a_scale: torch.Tensor, b_scale: torch.Tensor,
            bias: torch.Tensor | None, out_dtype: torch.dtype, gemm: str = "auto") -> torch.Tensor:
    """`a [M, K] e4m3 / e5m2 x b [N, K]^T`, dequantized by a_scale ([] or [M, 1]) and b_scale ([] or [1, N]), plus
    bias, as out_dtype. gemm "auto": `quant_gemm` (layout "nt") where its kernels serve the call, else
    `torch._scaled_mm` (the fallback recorded once per reason, shown by `info`); "quant_gemm": ours or ValueError
    with the reason; "scaled_mm": `torch._scaled_mm` always."""
    if gemm != "scaled_mm":
        reason = fp8_gemm_blocker(a, b, a_scale, b_scale, bias)
        if reason is None:
            return _gemm.quant_gemm(a, b, a_scale=a_scale, b_scale=b_scale, bias=bias, out_dtype=out_dtype,
                                    path="cuda")
        if gemm == "quant_gemm":
            raise ValueError(f"fp8_autocast(gemm='quant_gemm'): quant_gemm's kernels cannot run this GEMM: {reason}")
        _fallbacks.record("fp8_autocast", reason, SCALED_MM, on_gpu=a.is_cuda)
    # _scaled_mm: row-wise scales need a bf16 output, and no bias with a float32 output.
    mm_bias = bias if out_dtype != torch.float32 else None
    out = torch._scaled_mm(a, b.t(), scale_a=a_scale, scale_b=b_scale, bias=mm_bias, out_dtype=out_dtype)
    return out + bias if bias is not None and mm_bias is None else out


class _Fp8Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, bias, recipe, state, gemm="auto"):
        fwd, bwd = _FORMATS[recipe.fp8_format]
        if isinstance(recipe, DynamicScaling) and recipe.granularity == "row" and x2.dtype == torch.bfloat16:
            xq, _, sx = quantize_fp8_dynamic(x2, out_dtype=torch.float8_e4m3fn, granularity="row")
            wq, _, sw = quantize_fp8_dynamic(weight, out_dtype=torch.float8_e4m3fn, granularity="row")
            out = _fp8_mm(xq, wq, sx, sw.reshape(1, -1), bias, x2.dtype, gemm)
            ctx.save_for_backward(x2, weight)
            ctx.rowwise = True
        else:
            hist = state if isinstance(recipe, DelayedScaling) else None
            xq, x_t, sx_t = _quantize_both(x2, fwd, recipe, hist["x"] if hist else None)
            wq, w_t, sw_t = _quantize_both(weight, fwd, recipe, hist["w"] if hist else None)
            out = _fp8_mm(xq, wq, sx_t, sw_t, bias, x2.dtype, gemm)
            ctx.save_for_backward(x_t, w_t, sx_t, sw_t)
            ctx.rowwise = False
        ctx.recipe, ctx.state, ctx.bwd, ctx.has_bias, ctx.out_dtype = recipe, state, bwd, bias is not None, x2.dtype
        ctx.x_dtype, ctx.w_dtype, ctx.gemm = x2.dtype, weight.dtype, gemm
        return out

    @staticmethod
    def backward(ctx, grad):
        recipe, bwd = ctx.recipe, ctx.bwd
        grad = grad.contiguous()
        if ctx.rowwise:
            x2, weight = ctx.saved_tensors
            _, x_t, sx_t = _quantize_both(x2, torch.float8_e4m3fn, recipe, None)
            _, w_t, sw_t = _quantize_both(weight, torch.float8_e4m3fn, recipe, None)
        else:
            x_t, w_t, sx_t, sw_t = ctx.saved_tensors
        hist = ctx.state["g"] if isinstance(recipe, DelayedScaling) else None
        gq, g_t, sg = _quantize_both(grad, bwd, recipe, hist)
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:  # [M, N] @ [N, K]: W^T's rows are W's columns
            grad_x = _fp8_mm(gq, w_t, sg, sw_t, None, ctx.x_dtype, ctx.gemm)
        if ctx.needs_input_grad[1]:  # [N, M] @ [M, K]
            grad_w = _fp8_mm(g_t, x_t, sg, sx_t, None, ctx.w_dtype, ctx.gemm)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = grad.sum(0).to(ctx.out_dtype)
        return grad_x, grad_w, grad_b, None, None, None


# ---- the aten::linear kernel and its registration ----------------------------------------------------------------

_local = threading.local()  # .stack: this thread's entered (fp8_autocast, enabled at entry), innermost last
_registry_lock = threading.Lock()
_registry: dict[str, list] = {}  # device type -> [torch.library.Library, number of active contexts routing it]


def _context_stack() -> list:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def _linear_kernel(x, weight, bias=None):
    """aten::linear while some context routes this device: this thread's innermost context decides."""
    stack = getattr(_local, "stack", None)
    if stack:
        ctx, enabled = stack[-1]
        if enabled and ctx._routable(x, weight, bias):
            return ctx._fp8_linear(x, weight, bias)
    return _LINEAR.decompose(x, weight, bias)


def _acquire(devices: tuple[str, ...]) -> None:
    with _registry_lock:
        for device in devices:
            entry = _registry.get(device)
            if entry is None:
                lib = torch.library.Library("aten", "IMPL")
                for key in _DISPATCH_KEYS[device]:
                    lib.impl("linear", _linear_kernel, key)
                entry = _registry[device] = [lib, 0]
            entry[1] += 1


def _release(devices: tuple[str, ...]) -> None:
    with _registry_lock:
        for device in devices:
            entry = _registry[device]
            entry[1] -= 1
            if entry[1] == 0:
                entry[0]._destroy()  # the dispatcher forgets the kernel: aten::linear is plain torch again
                del _registry[device]


def routed_devices() -> tuple[str, ...]:
    """The device types whose aten::linear carries fp8_autocast's kernel now (empty outside every context)."""
    with _registry_lock:
        return tuple(sorted(_registry))


class fp8_autocast:  # noqa: N801 (a context manager named like torch.autocast)
    """Route `aten::linear` (nn.Linear, F.linear) through fp8 quantization and an fp8 GEMM, forward and backward,
    inside the context: `quant_gemm` where its kernels serve the call (a CUDA device of compute capability >= 8.9
    with an image of the gemm family), else `torch._scaled_mm` (each such fallback recorded once per reason and
    shown by `python -m astrai.extension info`).

    Importing registers nothing. Entering the outermost enabled context of the process registers a Python
    kernel for aten::linear at the dispatch keys of `devices` (AutogradCUDA and CUDA by default); leaving the
    last one removes it, also when the body raises. While it is registered every linear on those devices
    makes one Python call; the innermost context of the calling thread decides what it does, and threads
    outside any context get the plain linear.

    Parameters
    ----------
    enabled : bool
        False runs the plain linear inside the context, also when an enclosing context is enabled (as
        torch.autocast).
    recipe : DelayedScaling or DynamicScaling, optional
        Default `DelayedScaling()`. Delayed-scaling histories live on the device in the context object, keyed
        by the weight tensor (dropped when it dies): reuse one `fp8_autocast` object across steps to keep them.
        Under torch.autocast the weight seen is autocast's cast copy, a new tensor each region: a fresh history.
    devices : tuple of str
        Device types routed, "cuda" (default) and/or "cpu" (torch's CPU `_scaled_mm`, for tests). Calls on
        other devices, calls with tensor subclasses, and calls whose M, N or K is not a multiple of 16 run the
        plain linear.
    gemm : {"auto", "quant_gemm", "scaled_mm"}
        The fp8 GEMMs' implementation: "auto" (default) `quant_gemm` where its kernels serve the call, else
        `torch._scaled_mm`; "quant_gemm" ours only (ValueError with the reason where they cannot); "scaled_mm"
        `torch._scaled_mm` always (to compare).

    Example
    -------
    >>> ctx = fp8_autocast(recipe=DelayedScaling(amax_history_len=16))
    >>> for batch in data:
    ...     with ctx:
    ...         loss = model(batch).float().pow(2).mean()
    ...     loss.backward()
    """

    def __init__(self, enabled: bool = True, recipe=None, devices: tuple[str, ...] = ("cuda",), gemm: str = "auto"):
        recipe = DelayedScaling() if recipe is None else recipe
        if not isinstance(recipe, (DelayedScaling, DynamicScaling)):
            raise ValueError(f"fp8_autocast: recipe must be DelayedScaling or DynamicScaling, got "
                             f"{type(recipe).__name__}")
        devices = tuple(dict.fromkeys(devices))
        if not devices or any(d not in _DISPATCH_KEYS for d in devices):
            raise ValueError(f"fp8_autocast: devices must be a non-empty tuple of {tuple(_DISPATCH_KEYS)}, "
                             f"got {devices}")
        if gemm not in FP8_GEMMS:
            raise ValueError(f"fp8_autocast: gemm must be one of {FP8_GEMMS}, got {gemm!r}")
        self.enabled = bool(enabled)
        self.recipe = recipe
        self.gemm = gemm
        self.devices = devices
        # id(weight) -> (weakref to weight, {"x", "w", "g"} histories) for delayed scaling. Keyed by id, not by
        # the tensor: a tensor's == is elementwise. The weakref's callback drops the entry when the weight dies.
        self.states: dict[int, tuple] = {}

    def __enter__(self):
        enabled = self.enabled  # kept with the entry: what __exit__ releases
        if enabled:
            _acquire(self.devices)
        _context_stack().append((self, enabled))
        return self

    def __exit__(self, *exc):
        stack = _context_stack()
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] is self:
                _, enabled = stack.pop(i)
                if enabled:
                    _release(self.devices)
                break
        return False

    def _routable(self, x, weight, bias) -> bool:
        plain = (torch.Tensor, torch.nn.Parameter)
        if type(x) not in plain or type(weight) not in plain or (bias is not None and type(bias) not in plain):
            return False
        if x.device.type not in self.devices or weight.device != x.device or weight.dim() != 2 or x.dim() < 1:
            return False
        if x.dtype not in _IN_DTYPES or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
            return False
        n, k = weight.shape
        m = x.numel() // max(k, 1)
        return x.shape[-1] == k and k % 16 == 0 and n % 16 == 0 and m % 16 == 0 and m > 0

    def _state(self, weight: torch.Tensor, device) -> dict:
        entry = self.states.get(id(weight))
        if entry is None or entry[0]() is not weight:
            fwd, bwd = (FP8_MAX[d] for d in _FORMATS[self.recipe.fp8_format])
            n, margin = self.recipe.amax_history_len, self.recipe.margin
            state = {r: _History(n, device, qmax=q, margin=margin) for r, q in (("x", fwd), ("w", fwd), ("g", bwd))}
            key, states = id(weight), self.states

            def forget(ref):
                if states.get(key, (None,))[0] is ref:
                    del states[key]

            entry = self.states[key] = (weakref.ref(weight, forget), state)
        return entry[1]

    def _fp8_linear(self, x, weight, bias):
        state = self._state(weight, x.device) if isinstance(self.recipe, DelayedScaling) else None
        x2 = x.reshape(-1, x.shape[-1])
        out = _Fp8Linear.apply(x2, weight, bias, self.recipe, state, self.gemm)
        return out.reshape(*x.shape[:-1], weight.shape[0])
