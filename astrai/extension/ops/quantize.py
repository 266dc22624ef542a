"""Stateless wrappers over the torch.ops.astrai quantize kernels: run the kernel or raise, never fall back.

The ops (schemas in docs/contracts.md, "Quantize ops") take x `[M, N]` (bf16, fp16 or fp32, last-dim
stride 1, other strides free) on a CUDA device. These wrappers add, and only add:

- loading the family on first use (`loader.load_family("quantize")`) and registering the fake (meta)
  implementations that `torch.compile` and `torch.library.opcheck` need;
- inputs of rank > 2: `[..., N]` is reshaped to `[M, N]` (a view when the leading axes merge, else a copy)
  and the row-major output takes x's shape back;
- named arguments (`layout="transposed"`, `amax="row"`, `granularity="row"`) and `None` for outputs that
  were not asked for;
- the scale value check of `quantize`: one host sync before launch, `ValueError` naming the op when the
  multiplier holds 0, inf or NaN. It is skipped under CUDA-graph capture, `torch.compile` tracing and with
  `check_scale=False`; the kernel then applies the contract's formula to whatever the scale holds.

Everything else (device, dtype, rank, shapes, strides, block divisibility) is checked by the op itself,
which raises `RuntimeError` naming the op and the argument. Code that wants "the best available
implementation" (with torch fallbacks) calls `astrai.extension.quantize` instead.

Example::

    from astrai.extension.ops import quantize as ops
    out, out_t, amax = ops.quantize(x, scale, torch.float8_e4m3fn, layout="dual", amax="tensor")
    q, scale_inv = ops.quantize_dynamic(x, torch.float8_e4m3fn, granularity="row")
    q, sf = ops.quantize_block(x, torch.float8_e4m3fn, block_rows=1, pow2_scale=True, scale_mn_major=True)
    packed = ops.scale_layout(sf_rowmajor, pack_ue8m0=True)       # int32 [mn, ceil(sf_k/4)], MN-major
    ops.amax_history_fold(ring, pos, scale, amax, qmax=448.0, margin=0)   # in place: ring, pos, scale
    q, q_t, amax, inv = ops.quantize_delayed(x, scale, ring, pos, workspace, layout="dual")  # both, one launch
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from astrai.extension import loader
from astrai.extension.ops._fakes import load_family_once

FAMILY = "quantize"
OP = "astrai.quantize"
OP_DYNAMIC = "astrai.quantize_dynamic"
OP_BLOCK = "astrai.quantize_block"
OP_LAYOUT = "astrai.scale_layout"
OP_FOLD = "astrai.amax_history_fold"
OP_DELAYED = "astrai.quantize_delayed"

LAYOUTS = {"rowwise": 0, "transposed": 1, "dual": 2}
AMAX = {None: 0, "none": 0, "tensor": 1, "row": 2}
GRANULARITY = {"tensor": 0, "row": 1}
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)



def _aligned4(n: int) -> int:
    return (n + 3) // 4 * 4


def _mn_major(like: torch.Tensor, mn: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    """[mn, k] with strides (1, align(mn, 4)): the strides the kernel's output has (the transpose of a
    contiguous [k, align(mn, 4)] buffer, narrowed to mn rows; torch gives an empty axis stride 1)."""
    return torch.empty_strided((mn, k), (1, max(_aligned4(mn), 1)), dtype=dtype, device=like.device)


def _fake_quantize(x, scale, out_dtype, layout, amax):
    M, N = x.shape
    out = x.new_empty((M, N) if layout != 1 else (0,), dtype=out_dtype)
    out_t = x.new_empty((N, M) if layout != 0 else (0,), dtype=out_dtype)
    amax_t = x.new_empty((1,) if amax == 1 else (M,) if amax == 2 else (0,), dtype=torch.float32)
    return out, out_t, amax_t


def _fake_quantize_dynamic(x, out_dtype, granularity, pow2_scale, layout):
    M, N = x.shape
    out = x.new_empty((M, N) if layout != 1 else (0,), dtype=out_dtype)
    out_t = x.new_empty((N, M) if layout != 0 else (0,), dtype=out_dtype)
    scale_inv = x.new_empty((M, 1) if granularity == 1 else (1,), dtype=torch.float32)
    return out, out_t, scale_inv


def _fake_quantize_block(x, out_dtype, block_rows, pow2_scale, scale_mn_major):
    M, N = x.shape
    sf_rows, sf_cols = -(-M // block_rows), N // 128
    out = x.new_empty((M, N), dtype=out_dtype)
    if scale_mn_major:
        return out, _mn_major(x, sf_rows, sf_cols, torch.float32)
    return out, x.new_empty((sf_rows, sf_cols), dtype=torch.float32)


def _fake_scale_layout(sf, pack_ue8m0):
    mn, sf_k = sf.shape
    if pack_ue8m0:
        return _mn_major(sf, mn, (sf_k + 3) // 4, torch.int32)
    return _mn_major(sf, mn, sf_k, torch.float32)


def _fake_amax_history_fold(ring, pos, scale, scale_inv, amax, qmax, margin):
    return None  # in place: no outputs


def _fake_quantize_delayed(x, scale, ring, pos, scale_inv, workspace, out_dtype, layout, margin):
    out, out_t, amax = _fake_quantize(x, scale, out_dtype, layout, 1)
    return out, out_t, amax, x.new_empty((1,), dtype=torch.float32)


_FAKES = {"astrai::quantize": _fake_quantize,
          "astrai::quantize_dynamic": _fake_quantize_dynamic,
          "astrai::quantize_block": _fake_quantize_block,
          "astrai::scale_layout": _fake_scale_layout,
          "astrai::amax_history_fold": _fake_amax_history_fold,
          "astrai::quantize_delayed": _fake_quantize_delayed}


@torch.compiler.assume_constant_result  # traced code calls it at trace time, once, and keeps the result
def load() -> bool:
    """Load the family once, with its fakes; loader.FamilyUnavailableError (saying why) when no image serves it."""
    return load_family_once(FAMILY, OP, _FAKES)


class QuantizePlan(NamedTuple):
    """The explicit plan a quantize launch takes (csrc/kernels/quantize/quantize.h, quantize_plan)."""

    kernel: str           # "rows", "transpose-smem", "transpose-regs8" or "transpose-regs16"
    vec: bool             # 16-byte runs of x (and of the row-major output)
    threads_per_row: int  # the rows kernel's block: (threads_per_row, 256 / threads_per_row); 0 for a transpose
    blocks: int           # the grid; blocks loop past it


PLAN_KERNELS = ("rows", "transpose-smem", "transpose-regs8", "transpose-regs16")
_PLAN_IN = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}
_PLAN_OUT = {torch.float8_e4m3fn: 0, torch.float8_e5m2: 1, torch.int8: 2}
# The scale kinds of the library's QuantScale, by what the ops call them.
PLAN_SCALES = {"tensor": 0, "row": 1, "column": 2, "from-amax": 3, "dynamic-row": 4, "dynamic-group": 5}


def probe(rows: int, cols: int, *, in_dtype: torch.dtype = torch.bfloat16,
          out_dtype: torch.dtype = torch.float8_e4m3fn, scale: str = "tensor", transposed: bool = False,
          aligned: bool = True, fold: bool = False) -> QuantizePlan:
    """The plan a quantize launch takes on the current CUDA device for an x of rows x cols: the library's own rule,
    asked without tensors. `scale`: one of PLAN_SCALES (what multiplies each element: `quantize`'s tensor / row /
    column scale, `quantize_dynamic`'s second pass "from-amax" or its one pass "dynamic-row", `quantize_block`'s
    1 x 128 groups "dynamic-group"); `transposed`: the out_t of layouts "transposed" / "dual"; `aligned`: x and
    the output 16-byte aligned with rows starting 16-byte aligned (contiguous tensors of whole 16-byte rows are);
    `fold`: `quantize_delayed`'s fused amax fold."""
    load()
    for name, table, value in (("in_dtype", _PLAN_IN, in_dtype), ("out_dtype", _PLAN_OUT, out_dtype),
                               ("scale", PLAN_SCALES, scale)):
        if value not in table:
            raise ValueError(f"probe: {name} must be one of {list(table)}, got {value!r}")
    kernel, vec, tpr, blocks = torch.ops.astrai.quantize_plan(rows, cols, _PLAN_IN[in_dtype], _PLAN_OUT[out_dtype],
                                                              PLAN_SCALES[scale], transposed, aligned, fold)
    return QuantizePlan(PLAN_KERNELS[kernel], bool(vec), tpr, blocks)


def _as_2d(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 2:
        return x
    if x.dim() < 2:
        return x  # the op reports the rank
    return x.reshape(-1, x.shape[-1])


def _lookup(table: dict, value, op: str, name: str):
    if isinstance(value, int) and not isinstance(value, bool) and value in table.values():
        return value
    if value in table:
        return table[value]
    raise ValueError(f"{op}: {name} must be one of {sorted(k for k in table if k is not None)}, got {value!r}")


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def check_scale_values(op: str, scale: torch.Tensor) -> None:
    """Raise ValueError if the multiplier holds 0, inf or NaN; one host sync.

    Skipped for empty, non-float32 (the op reports the dtype) and meta scales, under `torch.compile` tracing
    and under CUDA-graph capture.
    """
    if scale.numel() == 0 or scale.dtype != torch.float32 or scale.is_meta:
        return
    if torch.compiler.is_compiling() or _capturing(scale):
        return
    bad = ~torch.isfinite(scale) | (scale == 0)
    if bool(bad.any()):  # the one sync
        value = scale.reshape(-1)[bad.reshape(-1).nonzero()[0, 0]].item()
        raise ValueError(
            f"{op}: scale holds {value}; the multiplier must be finite and nonzero (pass check_scale=False to "
            f"skip this check, one host sync, and the kernel then applies x * scale as given)")


def quantize(x: torch.Tensor, scale: torch.Tensor, out_dtype: torch.dtype = torch.float8_e4m3fn, *,
             layout: str | int = "rowwise", amax: str | None = None, check_scale: bool = True):
    """Quantize x with a given multiplier: `torch.ops.astrai.quantize`.

    Parameters
    ----------
    x : Tensor
        `[M, N]` (or `[..., N]`, flattened to `[M, N]`) bf16, fp16 or fp32 CUDA; last-dim stride 1.
    scale : Tensor
        float32 multiplier (the reciprocal of a dequantization scale): `[]` or `[1]` per tensor, `[M, 1]`
        per row, `[1, N]` per column; on x's device.
    out_dtype : torch.dtype
        `torch.float8_e4m3fn`, `torch.float8_e5m2`, or `torch.int8` (row-major layout only).
    layout : {"rowwise", "transposed", "dual"} or {0, 1, 2}
        Row-major out `[M, N]`, transposed out_t `[N, M]` (contiguous), or both.
    amax : {None, "tensor", "row"}
        Also return max |x| (before scaling): `[1]` or `[M]` float32, NaN where x holds a NaN.
    check_scale : bool
        Raise ValueError for a multiplier holding 0, inf or NaN (one host sync; skipped under CUDA-graph
        capture and torch.compile).

    Returns
    -------
    (out, out_t, amax) : each a Tensor or None when not asked for.
        `out = (x.float() * scale).clamp(-max, max).to(out_dtype)` bitwise (NaN -> 0x7f for fp8, 0 for int8;
        int8 rounds half to even and clamps to [-127, 127]). `out` has x's shape.

    Example
    -------
    >>> x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    >>> s = torch.tensor([448.0], device="cuda") / x.abs().amax().float()
    >>> out, out_t, amax = quantize(x, s, layout="dual", amax="tensor")
    """
    load()
    layout_i = _lookup(LAYOUTS, layout, OP, "layout")
    amax_i = _lookup(AMAX, amax, OP, "amax")
    if check_scale:
        check_scale_values(OP, scale)
    x2 = _as_2d(x)
    out, out_t, amax_t = torch.ops.astrai.quantize(x2, scale, out_dtype, layout_i, amax_i)
    out = out.view(x.shape) if layout_i != 1 and x.dim() > 2 else out
    return (out if layout_i != 1 else None, out_t if layout_i != 0 else None, amax_t if amax_i else None)


def quantize_dynamic(x: torch.Tensor, out_dtype: torch.dtype = torch.float8_e4m3fn, *,
                     granularity: str = "tensor", pow2_scale: bool = False, layout: str | int = "rowwise"):
    """Dynamic quantization: amax -> multiplier -> cast. `torch.ops.astrai.quantize_dynamic`.

    granularity "tensor": two passes (amax, then cast), any layout; "row": one pass, row-major only. The
    multiplier is `qmax / amax` in float32 (qmax 448, 57344 or 127), rounded down to a power of two with
    `pow2_scale`, 1 for an amax of 0, inf or NaN.

    Returns
    -------
    (out, out_t, scale_inv) : out / out_t as in `quantize` (None when not asked for); scale_inv float32 `[1]`
        (tensor) or `[M, 1]` (row) = 1 / multiplier, the dequantization scale (`torch._scaled_mm`'s scale_a).

    Example
    -------
    >>> q, _, scale_inv = quantize_dynamic(x, torch.float8_e4m3fn, granularity="row")
    """
    load()
    g = _lookup(GRANULARITY, granularity, OP_DYNAMIC, "granularity")
    layout_i = _lookup(LAYOUTS, layout, OP_DYNAMIC, "layout")
    x2 = _as_2d(x)
    out, out_t, scale_inv = torch.ops.astrai.quantize_dynamic(x2, out_dtype, g, pow2_scale, layout_i)
    out = out.view(x.shape) if layout_i != 1 and x.dim() > 2 else out
    return (out if layout_i != 1 else None, out_t if layout_i != 0 else None, scale_inv)


def quantize_block(x: torch.Tensor, out_dtype: torch.dtype = torch.float8_e4m3fn, *, block_rows: int = 1,
                   pow2_scale: bool = False, scale_mn_major: bool = False):
    """Block-scaled fp8: one multiplier per 1 x 128 group (block_rows=1, activations) or 128 x 128 block
    (block_rows=128, weights): `torch.ops.astrai.quantize_block`. N must be a multiple of 128.

    Returns
    -------
    (out, scale_inv) : out fp8 with x's shape; scale_inv float32 `[ceil(M / block_rows), N / 128]`, row-major,
        or MN-major TMA-aligned (strides `(1, align(rows, 4))`, DeepGEMM's layout) with `scale_mn_major`.

    Example
    -------
    >>> q, sf = quantize_block(x, block_rows=1, pow2_scale=True, scale_mn_major=True)
    """
    load()
    x2 = _as_2d(x)
    out, scale_inv = torch.ops.astrai.quantize_block(x2, out_dtype, block_rows, pow2_scale, scale_mn_major)
    return (out.view(x.shape) if x.dim() > 2 else out), scale_inv


def scale_layout(sf: torch.Tensor, *, pack_ue8m0: bool = False) -> torch.Tensor:
    """Scale factors `[MN, SF_K]` float32 -> MN-major, TMA-aligned: `torch.ops.astrai.scale_layout`.

    pack_ue8m0=False: float32 `[MN, SF_K]` with strides `(1, align(MN, 4))`. True: int32
    `[MN, ceil(SF_K / 4)]`, same strides, four UE8M0 exponents per word, little-endian by K (byte j of word k
    is the biased exponent of `sf[:, 4k + j]`, zero past SF_K); the values should be powers of two (the
    mantissa is dropped). Padding rows `[MN, align(MN, 4))` are zero.

    Example
    -------
    >>> q, sf = quantize_block(x, block_rows=1, pow2_scale=True)
    >>> packed = scale_layout(sf, pack_ue8m0=True)
    """
    load()
    return torch.ops.astrai.scale_layout(sf, pack_ue8m0)


def amax_history_fold(ring: torch.Tensor, pos: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, *,
                      qmax: float, margin: int = 0, scale_inv: torch.Tensor | None = None) -> None:
    """The delayed-scaling ring fold, in place on the device: `torch.ops.astrai.amax_history_fold`.

    One launch, stream-ordered after whatever wrote `amax`, no host sync (CUDA-graph capturable: the slot is in
    `pos`, on the device).

    Parameters
    ----------
    ring : Tensor
        float32 `[history_len]`, contiguous, CUDA: the amax history. `ring[pos % history_len] = amax`.
    pos : Tensor
        int64, one element: the slot of this step's amax; advanced to the next slot (mod history_len).
    scale : Tensor
        float32, one element, written: the multiplier of the next step, `s(max(ring)) / 2**margin` where
        `s(a) = qmax / a` in float32 (FLT_MAX past it) and 1 for a max of 0, inf or NaN (torch.amax: a NaN in
        the ring makes the max NaN); the division by `2**margin` rounds once (0 from margin 128 on).
    amax : Tensor
        float32, one element: this step's amax (e.g. `quantize(..., amax="tensor")[2]`).
    qmax : float
        The format's largest finite magnitude (448 for e4m3, 57344 for e5m2).
    margin : int
        >= 0.
    scale_inv : Tensor, optional
        float32, one element, written: `1 / scale` rounded once.

    Example
    -------
    >>> ring, pos = torch.zeros(16, device="cuda"), torch.zeros(1, dtype=torch.int64, device="cuda")
    >>> scale = torch.ones(1, device="cuda")
    >>> q, q_t, amax = quantize(x, scale, layout="dual", amax="tensor", check_scale=False)
    >>> amax_history_fold(ring, pos, scale, amax, qmax=448.0)      # scale now holds the next step's multiplier
    """
    load()
    torch.ops.astrai.amax_history_fold(ring, pos, scale, scale_inv, amax, float(qmax), int(margin))


def quantize_delayed(x: torch.Tensor, scale: torch.Tensor, ring: torch.Tensor, pos: torch.Tensor,
                     workspace: torch.Tensor, out_dtype: torch.dtype = torch.float8_e4m3fn, *,
                     layout: str | int = "rowwise", margin: int = 0, scale_inv: torch.Tensor | None = None):
    """Delayed scaling in one launch: `quantize(x, scale, amax="tensor")` and `amax_history_fold` of that amax,
    fused (`torch.ops.astrai.quantize_delayed`). The last block of the launch to finish folds the grid's amax into
    the ring, so nothing waits on the host and no second kernel runs; the bytes are those of the two-launch path.

    Parameters
    ----------
    x : Tensor
        `[M, N]` (or `[..., N]`) bf16, fp16 or fp32 CUDA; last-dim stride 1.
    scale : Tensor
        float32, one element: this step's multiplier; overwritten in place with the next step's (the fold rule
        of `amax_history_fold`; qmax from `out_dtype`). Not value-checked: the fold never writes 0, inf or NaN.
    ring, pos, scale_inv, margin
        As in `amax_history_fold` (ring float32 `[history_len]`, pos int64 one element, both updated in place).
    workspace : Tensor
        int32, one element, 0 before the call and 0 again after it (the kernel's block counter): allocate it once
        per ring with `torch.zeros(1, dtype=torch.int32, device=...)`. Two calls in flight at once (on two streams)
        must not share one. A launch that never finished (a device fault) can leave it nonzero: `zero_()` it then.
    out_dtype : torch.dtype
        `torch.float8_e4m3fn` or `torch.float8_e5m2`.
    layout : {"rowwise", "transposed", "dual"} or {0, 1, 2}

    Returns
    -------
    (out, out_t, amax, step_scale_inv)
        out / out_t as `quantize` (None when not asked for); amax: float32 `[1]`, this step's max |x|;
        step_scale_inv: float32 `[1]`, `1 / scale` of this step rounded once (the dequantization scale of out).

    Example
    -------
    >>> ring, pos = torch.zeros(16, device="cuda"), torch.zeros(1, dtype=torch.int64, device="cuda")
    >>> scale, ws = torch.ones(1, device="cuda"), torch.zeros(1, dtype=torch.int32, device="cuda")
    >>> q, q_t, amax, inv = quantize_delayed(x, scale, ring, pos, ws, layout="dual")  # scale: next step's
    """
    load()
    layout_i = _lookup(LAYOUTS, layout, OP_DELAYED, "layout")
    x2 = _as_2d(x)
    out, out_t, amax, inv = torch.ops.astrai.quantize_delayed(x2, scale, ring, pos, scale_inv, workspace, out_dtype,
                                                              layout_i, int(margin))
    out = out.view(x.shape) if layout_i != 1 and x.dim() > 2 else out
    return (out if layout_i != 1 else None, out_t if layout_i != 0 else None, amax, inv)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)


def smoke_test() -> None:
    """Run each quantize op once on the current CUDA device against a float32 torch computation; raise on
    mismatch. `python -m astrai.extension verify` calls it."""
    load()
    if not torch.cuda.is_available():
        raise RuntimeError("quantize smoke test: no CUDA device is visible")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(19, 256, generator=gen).to(device="cuda", dtype=torch.bfloat16)
    for dtype in FP8_DTYPES:
        fmax = torch.finfo(dtype).max
        scale = torch.tensor([fmax / 8.0], device="cuda")
        out, out_t, amax_t = quantize(x, scale, dtype, layout="dual", amax="tensor")
        want = (x.float() * scale).clamp(-fmax, fmax).to(dtype)
        checks = [("quantize", out, want), ("quantize (transposed)", out_t, want.t().contiguous()),
                  ("amax", amax_t, x.float().abs().amax().reshape(1))]
        q, _, inv = quantize_dynamic(x, dtype, granularity="row")
        amax_rows = x.float().abs().amax(1, keepdim=True)
        mul = torch.full_like(amax_rows, fmax) / amax_rows  # tensor / tensor: one correctly rounded division
        checks.append(("quantize_dynamic", q, (x.float() * mul).clamp(-fmax, fmax).to(dtype)))
        checks.append(("quantize_dynamic scale_inv", inv, torch.ones_like(mul) / mul))
        for what, got, ref in checks:
            if not torch.equal(_bits(got), _bits(ref)):
                raise RuntimeError(f"quantize smoke test failed: {what} ({dtype}) differs from torch")
    q, sf = quantize_block(x, torch.float8_e4m3fn, block_rows=1)
    if sf.shape != (19, 2) or q.shape == () or not bool(torch.isfinite(sf).all()):
        raise RuntimeError("quantize smoke test failed: quantize_block")
    packed = scale_layout(torch.ones(6, 9, device="cuda"), pack_ue8m0=True)
    if packed.shape != (6, 3) or packed.stride() != (1, 8) or int(packed[0, 0]) != 0x7F7F7F7F:
        raise RuntimeError("quantize smoke test failed: scale_layout")
