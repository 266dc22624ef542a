"""Quantized-GEMM policy: per call, this package's CUDA kernels where they serve, else the torch path.

The kernels (`astrai.extension.ops.gemm`) run when all of these hold, checked in this order:

1. a and b are CUDA tensors;
2. no gradient is needed: grad mode is off, or none of a, b, the scales and bias requires grad (the kernels
   have no backward);
3. the memory layout suits the kernels: a, b (and out) have last-dim stride 1 (K, or M / N for an operand
   stored transposed: every layout has kernels), their other strides are multiples of 16 bytes and their base
   pointers are 16-byte aligned;
4. an image serves the gemm family here (`loader.family_available("gemm")`).

Both paths run the same validation first (`validate`, in Python, mirroring the op's rules), so a call valid on
one path is valid on the other; its messages read "quant_gemm: <arg> must be ..., got ...".

The torch path is the contract's math: the operands are upcast (exactly) and multiplied with a float32
accumulator, int8 x int8 exactly in integers (float64 or int64 on the CPU, int32 through `torch._int_mm` on
CUDA where its shape rules allow, else float64) and wrapped to int32 as the kernels' accumulator wraps; then
`acc * sa[m] * sb[n] + bias[n]` in float32, cast once to the output dtype. It is the reference-grade fallback
on the CPU and for memory layouts the kernels do not take.

`path="cuda"` forces the kernels and raises with the reason when they cannot run; `path="torch"` forces the
torch path; `select_path(...)` says which one `path="auto"` takes.
"""

from __future__ import annotations

import functools

import torch

from astrai.extension import loader
from astrai.extension.backend import _path
from astrai.extension.ops import gemm as ops

PATHS = _path.PATHS
FN = "quant_gemm"
BIAS_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ALIGN = 16  # bytes: the kernels' vector loads and stores


@torch.compiler.assume_constant_result  # evaluated once at trace time under torch.compile
def _kernels_available() -> bool:
    return loader.family_available(ops.FAMILY)


def _shape(t: torch.Tensor) -> list[int]:
    return list(t.shape)


def _operand_shapes(layout: int) -> tuple[str, str]:
    return ops.LAYOUT_DIMS[ops.LAYOUT_NAMES[layout]]


def _check_operands(fn: str, a: torch.Tensor, b: torch.Tensor, layout: int) -> ops.Problem:
    want_a, want_b = _operand_shapes(layout)
    layout_name = ops.LAYOUT_NAMES[layout]
    for name, t, want in (("a", a, want_a), ("b", b, want_b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: {name} must be a Tensor, got {type(t).__name__}")
        if t.dim() not in (2, 3):
            raise ValueError(f"{fn}: {name} must be 2-D {want} or 3-D [B, {want[1:]} (layout {layout_name!r}), "
                             f"got shape {_shape(t)}")
    if ops.pair_of(a.dtype, b.dtype) is None:
        pairs = ", ".join(f"{name}: " + " | ".join(f"({x}, {y})" for x, y in dtypes)
                          for name, dtypes in ops.PAIRS.items())
        raise ValueError(f"{fn}: (a.dtype, b.dtype) must be a supported pair ({pairs}), "
                         f"got ({a.dtype}, {b.dtype})")
    if b.device != a.device:
        raise ValueError(f"{fn}: b must be on a's device {a.device}, got {b.device}")
    shape = ops.problem(layout, a.shape, b.shape)
    if shape.k_b != shape.k_a:
        raise ValueError(f"{fn}: b must be {want_b} with K = {shape.k_a} (a's K, layout {layout_name!r}), "
                         f"got shape {_shape(b)}")
    if a.dim() == 3 and b.dim() == 3 and a.shape[0] != b.shape[0]:
        raise ValueError(f"{fn}: b's batch must be a's ({a.shape[0]}) or b 2-D, got shape {_shape(b)}")
    return shape


def _check_placement(fn: str, name: str, t: torch.Tensor, device: torch.device) -> None:
    if t.device != device:
        raise ValueError(f"{fn}: {name} must be on a's device {device}, got {t.device}")
    if not t.is_contiguous():
        raise ValueError(f"{fn}: {name} must be contiguous, got strides {list(t.stride())}")


def _check_plan(fn: str, plan) -> None:
    """The plan's own rules (the op also checks split_k against the recipe's K tile)."""
    if not (isinstance(plan, (tuple, list)) and len(plan) == 2):
        raise ValueError(f"{fn}: plan must be (recipe, split_k), got {plan!r}")
    recipe, split_k = plan
    if recipe not in ops.RECIPES:
        raise ValueError(f"{fn}: plan's recipe must be one of {tuple(ops.RECIPES)}, got {recipe!r}")
    if not (isinstance(split_k, int) and (split_k >= 1 or (split_k == ops.TAIL_SPLIT and recipe in ops.TAIL_RECIPES))):
        why = " (0, the last wave split along K, is for recipes 4, 5 and 7-11)" if split_k == ops.TAIL_SPLIT else ""
        raise ValueError(f"{fn}: plan's split_k must be an int >= 1, got {split_k!r}{why}")
    if recipe == ops.SM90_STREAM_RECIPE and split_k > ops.SM90_STREAM_MAX_SPLIT:
        raise ValueError(f"{fn}: plan's split_k must be <= {ops.SM90_STREAM_MAX_SPLIT} for recipe {recipe} (its K "
                         f"slices are one cluster of CTAs), got {split_k}")


def _check_scale(fn: str, name: str, scale: torch.Tensor, size: int, device: torch.device) -> None:
    axis = "M" if name == "a_scale" else "N"
    allowed = [(), (1,), (size,), (size, 1)] + ([(1, size)] if name == "b_scale" else [])
    if scale.dtype != torch.float32:
        raise ValueError(f"{fn}: {name} must be float32, got {scale.dtype}")
    if tuple(scale.shape) not in allowed:
        spelled = ", ".join(str(list(s)) for s in allowed)
        raise ValueError(f"{fn}: {name} must be one of {spelled} ({axis} = {size}), got {_shape(scale)}")
    _check_placement(fn, name, scale, device)


def _scale_rule(pair: str, out_dtype: torch.dtype) -> tuple[str, str]:
    """What the pair does with (a_scale, b_scale): "required", "optional" or "forbidden" each."""
    if pair == "w16a16" or (pair == "w8a8" and out_dtype == torch.int32):
        return "forbidden", "forbidden"
    if pair == "w8a16":
        return "forbidden", "required"
    return ("optional", "optional") if pair == "fp8" else ("required", "required")


def _pair_words(pair: str, out_dtype: torch.dtype) -> str:
    """The scale rule's subject in a message (built only when raising: _check_scales runs on every checked call)."""
    return f"pair {pair!r}" + (" with out_dtype torch.int32" if out_dtype == torch.int32 else "")


def _check_scales(fn: str, pair: str, out_dtype: torch.dtype, shape: ops.Problem, a_scale, b_scale,
                  device: torch.device) -> None:
    for (name, scale, size), rule in zip((("a_scale", a_scale, shape.m), ("b_scale", b_scale, shape.n)),
                                         _scale_rule(pair, out_dtype)):
        if rule == "forbidden" and scale is not None:
            raise ValueError(f"{fn}: {name} must be None for {_pair_words(pair, out_dtype)}, got a tensor of shape "
                             f"{_shape(scale)}")
        if rule == "required" and scale is None:
            raise ValueError(f"{fn}: {name} must be given for {_pair_words(pair, out_dtype)}, got None")
        if scale is not None:
            _check_scale(fn, name, scale, size, device)


def _check_bias(fn: str, bias: torch.Tensor, n: int, device: torch.device) -> None:
    if tuple(bias.shape) != (n,):
        raise ValueError(f"{fn}: bias must be [N] = [{n}], got {_shape(bias)}")
    if bias.dtype not in BIAS_DTYPES:
        raise ValueError(f"{fn}: bias must be one of {BIAS_DTYPES}, got {bias.dtype}")
    _check_placement(fn, "bias", bias, device)


def validate(fn: str, a: torch.Tensor, b: torch.Tensor, a_scale, b_scale, bias, out_dtype: torch.dtype,
             layout: int, out: torch.Tensor | None, plan=None) -> ops.Problem:
    """The op's rules, in Python, shared by both paths; returns the problem's sizes. With `out`, out's dtype
    is the output dtype (out_dtype is not read)."""
    if plan is not None:
        _check_plan(fn, plan)
    shape = _check_operands(fn, a, b, layout)
    pair = ops.pair_of(a.dtype, b.dtype)
    arg = "out_dtype" if out is None else "out.dtype"
    out_dtype = out_dtype if out is None else out.dtype
    allowed = ops.OUT_DTYPES + ((torch.int32,) if pair == "w8a8" else ())
    if out_dtype not in allowed:
        raise ValueError(f"{fn}: {arg} must be one of {allowed} for pair {pair!r}, got {out_dtype}")
    _check_scales(fn, pair, out_dtype, shape, a_scale, b_scale, a.device)
    if bias is not None:
        if out_dtype == torch.int32:
            raise ValueError(f"{fn}: bias must be None with int32 output (raw accumulators), got a tensor")
        _check_bias(fn, bias, shape.n, a.device)
    if out is not None:
        if tuple(out.shape) != shape.out_shape:
            raise ValueError(f"{fn}: out must be {list(shape.out_shape)}, got {_shape(out)}")
        if out.device != a.device:
            raise ValueError(f"{fn}: out must be on a's device {a.device}, got {out.device}")
    return shape


def _aligned(t: torch.Tensor) -> bool:
    size = t.element_size()
    # Traced (fake) tensors have no data pointer: under torch.compile the op checks it at run time.
    pointer_ok = torch.compiler.is_compiling() or t.data_ptr() % ALIGN == 0
    return (t.stride(-1) == 1 or t.shape[-1] <= 1) and pointer_ok and all(
        (s * size) % ALIGN == 0 for s in t.stride()[:-1])


FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def _cuda_blocker(a: torch.Tensor, b: torch.Tensor, others, out: torch.Tensor | None, *,
                  check_available: bool = True, layout: str = "nt") -> str | None:
    """Why the CUDA kernels cannot run this call, or None when they can."""
    for name, t in (("a", a), ("b", b)):
        if not t.is_cuda:
            return f"{name} is on {t.device}, not a CUDA device"
    if a.dtype in FP8 and _capability(a.device.index) < 89:
        return "fp8 operands need an sm_89 or newer GPU"
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (a, b, *others)):
        return "a gradient is needed (grad mode is on and an input requires grad); the kernels have no backward"
    for name, t in (("a", a), ("b", b), ("out", out)):
        if t is not None and t.numel() and not _aligned(t):
            return (f"{name} has strides {list(t.stride())} (or a base pointer) the kernels cannot take: last-dim "
                    f"stride 1, other strides multiples of {ALIGN} bytes, {ALIGN}-byte aligned (layout {layout!r}; "
                    f"pass {name}.contiguous() or a padded copy)")
    if check_available and not _kernels_available():
        return "no image serves the gemm family here (python -m astrai.extension info says why)"
    if check_available and a.dtype in FP8:
        why = _fp8_unavailable(a.device.index)
        if why:
            return why
    return None


# Asked on every fp8 call (fp8_autocast makes three a linear): once per device index and process. Traced code calls
# the unwrapped functions at trace time (Dynamo cannot trace an lru_cache wrapper as a cache).
@functools.lru_cache(maxsize=None)
def _capability_cached(index: int) -> int:
    major, minor = torch.cuda.get_device_capability(index)
    return major * 10 + minor


@functools.lru_cache(maxsize=None)
def _fp8_unavailable_cached(index: int) -> str:
    return ops.fp8_unavailable_reason(index) or ""


@torch.compiler.assume_constant_result  # evaluated once at trace time under torch.compile
def _capability(index: int | None) -> int:
    return _capability_cached(torch.cuda.current_device() if index is None else index)


@torch.compiler.assume_constant_result  # evaluated once at trace time under torch.compile
def _fp8_unavailable(index: int | None) -> str:
    return _fp8_unavailable_cached(torch.cuda.current_device() if index is None else index)


def cuda_blocker(a: torch.Tensor, b: torch.Tensor, *, a_scale=None, b_scale=None, bias=None,
                 out: torch.Tensor | None = None, layout: str = "nt") -> str | None:
    """Why `quant_gemm(..., path="auto")` would not give these arguments to the kernels now, or None."""
    return _cuda_blocker(a, b, (a_scale, b_scale, bias), out, layout=layout)


def select_path(a: torch.Tensor, b: torch.Tensor, *, a_scale=None, b_scale=None, bias=None,
                out: torch.Tensor | None = None, layout: str = "nt") -> str:
    """"cuda" or "torch": the path `quant_gemm(..., path="auto")` takes for these arguments now."""
    reason = cuda_blocker(a, b, a_scale=a_scale, b_scale=b_scale, bias=bias, out=out, layout=layout)
    return "torch" if reason else "cuda"


def _as_mk_kn(a: torch.Tensor, b: torch.Tensor, layout: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of a as [..., M, K] and b as [..., K, N]."""
    name = ops.LAYOUT_NAMES[layout]
    return (a if name[0] == "n" else a.mT), (b if name[1] == "n" else b.mT)


def _int_accumulate(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact int8 x int8 dot products, wrapped to int32 like the kernels' accumulator."""
    m, k = a.shape[-2:]
    n = b.shape[-1]
    if a.is_cuda and a.dim() == 2 and b.dim() == 2 and m > 16 and k >= 16 and k % 8 == 0 and n % 8 == 0:
        return torch._int_mm(a.contiguous(), b.contiguous())
    # float64 is exact here: |partial sums| <= K * 2^14 < 2^53 for any K below 5e11.
    return torch.matmul(a.double(), b.double()).to(torch.int64).to(torch.int32)


def _gemm_torch(a, b, a_scale, b_scale, bias, out_dtype: torch.dtype, layout: int,
                shape: ops.Problem) -> torch.Tensor:
    """The contract's math: float32 accumulator (exact integers for int8 x int8), scales, bias, one cast."""
    am, bm = _as_mk_kn(a, b, layout)
    if shape.k_a == 0:  # no products: y = bias or zeros, the scales are not read
        acc = am.new_zeros(shape.out_shape, dtype=torch.float32)
        return (acc + bias.float() if bias is not None else acc).to(out_dtype)
    if a.dtype == torch.int8:
        acc = _int_accumulate(am, bm)
        if out_dtype == torch.int32:
            return acc
        acc = acc.float()
    else:
        acc = torch.matmul(am.float(), bm.float())
    if a_scale is not None:
        acc = acc * a_scale.reshape(-1, 1)  # [M, 1] or [1, 1]
    if b_scale is not None:
        acc = acc * b_scale.reshape(-1)     # [N] or [1]
    if bias is not None:
        acc = acc + bias.float()
    return acc.to(out_dtype)


def quant_gemm(a: torch.Tensor, b: torch.Tensor, *, a_scale: torch.Tensor | None = None,
               b_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               out_dtype: torch.dtype = torch.bfloat16, layout: str = "nt", out: torch.Tensor | None = None,
               plan: tuple[int, int] | None = None, batch_invariant: bool = False,
               path: str = "auto") -> torch.Tensor:
    """Quantized (or 16-bit) GEMM `y = cast_out(acc * sa[m] * sb[n] + bias[n])`; the CUDA kernels where they
    serve, else torch.

    Parameters
    ----------
    a, b : Tensor
        A supported pair (`ops.gemm.PAIRS`): w16a16 (bf16, bf16) | (fp16, fp16); w8a16 (bf16 | fp16, int8);
        w8a8 (int8, int8); fp8 (e4m3, e4m3) | (e5m2, e4m3) | (e4m3, e5m2). Shaped per `layout`, each optionally
        with a leading batch dim `[B, ...]`; a 2-D operand broadcasts over the other's batch.
    a_scale, b_scale : Tensor, optional
        float32, contiguous, on a's device: a's `[]`, `[1]`, `[M]`, `[M, 1]`; b's `[]`, `[1]`, `[N]`, `[N, 1]`,
        `[1, N]`, the same for every batch entry. w16a16: none; w8a16: b_scale only, required; w8a8: both
        required (none with int32 output); fp8: each optional.
    bias : Tensor, optional
        `[N]` bf16, fp16 or fp32, contiguous; added in fp32 after the scales (not with int32 output).
    out_dtype : torch.dtype
        bf16, fp16, fp32, or int32 for w8a8 without scales (raw accumulators). With `out`, out's dtype.
    layout : {"nt", "nn", "tn", "tt"}
        First letter a, second b: "n" = a `[M, K]` / b `[K, N]`, "t" = stored transposed (a `[K, M]`,
        b `[N, K]`). "nt" is `a @ b.T` for a weight stored `[N, K]`.
    out : Tensor, optional
        `[M, N]` / `[B, M, N]` written in place and returned.
    plan : (int, int), optional
        `(recipe, split_k)` for the kernels; default the built-in plan (`ops.gemm.builtin_plan`). `split_k`
        0 on recipes 4, 5 and 7-11 splits only the last wave's tiles along K (`ops.gemm.TAIL_SPLIT`). The torch
        path ignores it.
    batch_invariant : bool
        Kernels: use a plan that does not depend on M, so a row's result is bitwise independent of the batch
        size. The torch path ignores it.
    path : {"auto", "cuda", "torch"}
        Which implementation: "auto" takes the kernels where they serve the call, else the torch path (and
        logs why); "cuda" insists on the kernels and raises ValueError with the reason; "torch" insists on torch.

    Returns
    -------
    Tensor
        `[M, N]`, or `[B, M, N]` when an operand is batched, of out_dtype. K = 0 gives bias (or zeros).

    Example
    -------
    >>> w = torch.randint(-127, 128, (4096, 4096), dtype=torch.int8)          # [N, K]
    >>> x = torch.randn(8, 4096, dtype=torch.bfloat16)
    >>> y = quant_gemm(x, w, b_scale=torch.full((4096,), 0.01))                # torch path on the CPU
    """
    code = ops.layout_code(FN, layout)
    shape = validate(FN, a, b, a_scale, b_scale, bias, out_dtype, code, out, plan)
    def blocker(check_available: bool) -> str | None:
        return _cuda_blocker(a, b, (a_scale, b_scale, bias), out, check_available=check_available, layout=layout)

    if _path.choose(FN, path, blocker, on_gpu=a.is_cuda) == "cuda":
        return ops.quant_gemm(a, b, a_scale=a_scale, b_scale=b_scale, bias=bias, out_dtype=out_dtype,
                              layout=layout, out=out, plan=plan, batch_invariant=batch_invariant)
    y = _gemm_torch(a, b, a_scale, b_scale, bias, out_dtype if out is None else out.dtype, code, shape)
    return y if out is None else out.copy_(y)
