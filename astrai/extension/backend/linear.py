"""Quantized linear layers on `quant_gemm`: the modules and `quantize_linear_`, which swaps a model's `nn.Linear`s.

Three modes, each an `nn.Module` whose quantized weight and scales are buffers (saved in `state_dict`, moved by
`.to()`, never cast by a dtype conversion):

  w8a16   `W8A16Linear`: int8 weights, one float32 scale per output channel; bf16 / fp16 activations as they come.
          y = quant_gemm(x, W_q, b_scale=s_w, bias)                         (pair w8a16)
  w8a8    `W8A8Linear`: the same weights; activations quantized per token (row) to int8 on every call.
          x_q, s_x = quantize_int8_per_row(x); y = quant_gemm(x_q, W_q, a_scale=s_x, b_scale=s_w, bias)
  fp8     `Fp8Linear`: e4m3 weights with one float32 scale per output channel; activations quantized per token
          to e4m3 on every call.
          x_q, _, s_x = quantize_fp8_dynamic(x, granularity="row"); y = quant_gemm(x_q, W_q, a_scale=s_x, ...)

Each call is the quantize kernel and the GEMM back to back on the current stream with no host sync, so the
modules run under CUDA-graph capture and torch.compile (both ops have fake implementations). Where the kernels
cannot serve a call (a CPU tensor, no image), `quant_gemm` and the quantize functions take their torch paths,
which compute the same contract (docs/contracts.md, "Quantized linears").

The modules are for inference: they have no backward (an input that requires grad under grad mode raises).
`quantize_linear_` checks every candidate layer before it converts any, and reports each one it cannot take; with
`fuse=` it stacks sibling layers that read one input (q / k / v, gate / up) into one GEMM (`SiblingGroup`).
"""

from __future__ import annotations

import ast
import fnmatch
import inspect
import logging
import textwrap

import torch
from torch import nn

from astrai.extension import _fallbacks
from astrai.extension.backend import quantize as _quantize_policy
from astrai.extension.backend.gemm import ALIGN, cuda_blocker, quant_gemm
from astrai.extension.backend.quantize import (quantize_fp8_dynamic, quantize_int8_per_channel,
                                                quantize_int8_per_row)
from astrai.extension.ops import gemm_plan as _gemm_plan

MODES = ("w8a16", "w8a8", "fp8")
FN = "quantize_linear_"
# Byte alignment the kernels' rows need: K of an 8-bit weight row and N of a 16-bit output row in 16-byte units.
IN_FEATURES_MULTIPLE = 16
OUT_FEATURES_MULTIPLE = 8
_WEIGHT_DTYPES = {"w8a16": (torch.bfloat16, torch.float16),
                  "w8a8": (torch.bfloat16, torch.float16, torch.float32),
                  "fp8": (torch.bfloat16, torch.float16, torch.float32)}
_QUANT_DTYPE = {"w8a16": torch.int8, "w8a8": torch.int8, "fp8": torch.float8_e4m3fn}
_logger = logging.getLogger(_fallbacks.LOGGER_NAME)


class QuantLinear(nn.Module):
    """Base of the quantized linears: buffers `weight` ([out_features, in_features], int8 or e4m3),
    `weight_scale` (float32 [out_features], the dequantization scale of each output channel) and `bias`
    ([out_features] in the model's dtype, or None). Build one with `from_linear`, or empty (zeros) and fill it
    with `load_state_dict`."""

    mode = ""
    _KEEP_DTYPE = ("weight", "weight_scale")

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, dtype: torch.dtype = torch.bfloat16,
                 device=None):
        super().__init__()
        name = type(self).__name__
        if in_features < 1 or out_features < 1:
            raise ValueError(f"{name}: in_features and out_features must be >= 1, got {in_features}, {out_features}")
        if dtype not in _WEIGHT_DTYPES[self.mode]:
            raise ValueError(f"{name}: dtype must be one of {_WEIGHT_DTYPES[self.mode]}, got {dtype}")
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=_QUANT_DTYPE[self.mode],
                                                   device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32, device=device))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device) if bias else None)

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, empty: bool = False) -> "QuantLinear":
        """A quantized copy of `linear` on its device (its weight quantized per output channel, its bias kept);
        `empty=True`: the shape, dtype and device only (zeros; the meta device allowed), for `load_state_dict`."""
        reason = unsupported_reason(linear, cls.mode, empty=empty)
        if reason:
            raise ValueError(f"{cls.__name__}.from_linear: linear {reason}")
        w = linear.weight.detach()
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, dtype=w.dtype, device=w.device)
        if empty:
            return module
        if cls.mode == "fp8":
            q, _, scale = quantize_fp8_dynamic(w, out_dtype=torch.float8_e4m3fn, granularity="row")
        else:
            q, scale = quantize_int8_per_channel(w)
        module.weight.copy_(q)
        module.weight_scale.copy_(scale.reshape(-1))
        if linear.bias is not None:
            module.bias.copy_(linear.bias.detach())
        return module

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # Checkpoints store the scale as [N], [N, 1], [1, N] or one per-tensor value, in float32 or 16 bits: taken as
        # float32 [N]. A weight of another dtype would be converted by value (int8 -> e4m3 is not a dequantization):
        # refused instead.
        name, n = type(self).__name__, self.out_features
        scale, weight = state_dict.get(prefix + "weight_scale"), state_dict.get(prefix + "weight")
        if isinstance(scale, torch.Tensor) and scale.is_floating_point() and scale.numel() in (1, n):
            state_dict[prefix + "weight_scale"] = scale.reshape(-1).to(torch.float32).expand(n).contiguous()
        elif isinstance(scale, torch.Tensor):
            error_msgs.append(f"{name}: {prefix}weight_scale must hold {n} (out_features) or 1 floating values, got "
                              f"{scale.dtype} {list(scale.shape)}")
            return
        if isinstance(weight, torch.Tensor) and weight.dtype != _QUANT_DTYPE[self.mode]:
            error_msgs.append(f"{name}: {prefix}weight must be {_QUANT_DTYPE[self.mode]} (mode {self.mode!r}), got "
                              f"{weight.dtype}; quantize_linear_(..., mode) must match the checkpoint's mode")
            return
        if self._siblings is not None and local_metadata.get("assign_to_params_buffers"):
            self._siblings.forget()  # assign=True replaces the buffers: the stacked ones would only pin memory
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _apply(self, fn, recurse=True):
        # Module.to(dtype) / .half() cast every floating tensor, e4m3 weights and float32 scales included: move the
        # quantized buffers to the new device but keep their dtype (the bias follows the conversion, as
        # nn.Linear's does).
        if self._siblings is not None:  # the moved buffers are no longer views of the stacked ones
            self._siblings.forget()
        kept = {name: self._buffers.pop(name) for name in self._KEEP_DTYPE}
        try:
            super()._apply(fn, recurse)
        finally:
            for name, t in kept.items():
                moved = fn(t)
                self._buffers[name] = moved if moved.dtype == t.dtype else t.to(device=moved.device)
        return self

    def _quantize_input(self, x2: torch.Tensor):
        """(a, a_scale) for the GEMM through the quantize policy (kernels or torch path)."""
        return x2, None

    def _quantize_input_kernel(self, x2: torch.Tensor):
        """(a, a_scale) straight from the quantize op (the fast path: the policy already chose the kernels)."""
        return x2, None

    # The fast path. Eager decoding calls every linear of every layer once a token, and the policy's Python checks
    # are most of a call's host time (about 11 of 17 us on a 2-core host, the op stubbed). After a call whose checks
    # sent it to the kernels, a call with an x like it (same device and dtype, contiguous, 16-byte aligned) and the
    # same buffers goes straight to the ops: nothing a skipped check reads can differ (the buffers' shapes and dtypes
    # are fixed; replacing or moving one changes its pointer), and the ops check every argument again in C++. The
    # same ops with the same arguments: the same bits. Traced code always takes the checked path.
    _fast_key = None
    # The sibling group this layer is fused into (`quantize_linear_(..., fuse=...)`) and its place there, or None.
    _siblings = None
    _sibling_index = 0

    def _key(self, x2: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> tuple:
        return (x2.get_device(), x2.dtype, weight.data_ptr(), scale.data_ptr(), 0 if bias is None else bias.data_ptr())

    def _kernels_serve(self, x2: torch.Tensor, a: torch.Tensor, a_scale, weight, scale, bias) -> bool:
        """Whether the checked path just ran this call's quantize (if any) and GEMM on the kernels."""
        if self.mode != "w8a16" and _quantize_policy.select_path(x2) != "cuda":
            return False
        return cuda_blocker(a, weight, a_scale=a_scale, b_scale=scale, bias=bias) is None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError(f"{type(self).__name__}: x requires grad, but quantized linears have no backward; call "
                               "the model under torch.no_grad() or torch.inference_mode(), or leave this layer an "
                               "nn.Linear (quantize_linear_(..., skip=...))")
        k = self.in_features
        if x.dim() < 1 or x.shape[-1] != k:
            raise ValueError(f"{type(self).__name__}: x must be [..., {k}] (in_features), got {list(x.shape)}")
        group = self._siblings
        if group is not None:
            y = group.forward(self, x)
            if y is not None:
                return y
        buffers = self._buffers  # not Module.__getattr__ (this runs once a linear a token), unless one was replaced
        try:
            weight, scale, bias = buffers["weight"], buffers["weight_scale"], buffers["bias"]
        except KeyError:  # e.g. a Parameter assigned in place of a buffer
            weight, scale, bias = self.weight, self.weight_scale, self.bias
        return self._gemm(x, weight, scale, bias)

    def _gemm(self, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        """y = x @ dequantized(weight)^T + bias for this module's buffers or its sibling group's fused ones."""
        k = self.in_features
        x2 = x.reshape(-1, k)
        out_shape = (*x.shape[:-1], weight.shape[0])
        if x2.shape[0] == 0:
            return x.new_empty(out_shape)
        plain = (x2.is_cuda and not torch.compiler.is_compiling() and x2.is_contiguous()
                 and x2.data_ptr() % ALIGN == 0)
        if plain and self._fast_key is not None and self._fast_key == self._key(x2, weight, scale, bias):
            a, a_scale = self._quantize_input_kernel(x2)
            # ops.gemm.quant_gemm's own steps for this call, less those the checked call settled (the family is
            # loaded, layout "nt", not traced): the chain's plan (kept per shape) and the op.
            recipe, split_k = _gemm_plan.plan_call(a, weight, a_scale, scale, bias, x.dtype, 0, None, False)
            y = torch.ops.astrai.quant_gemm.default(a, weight, a_scale, scale, bias, x.dtype, 0, recipe, split_k)
            return y if x.dim() == 2 else y.view(out_shape)
        if weight.dtype != _QUANT_DTYPE[self.mode]:
            raise TypeError(f"{type(self).__name__}: weight is {weight.dtype}, not {_QUANT_DTYPE[self.mode]} (mode "
                            f"{self.mode!r}): it was replaced after quantization (re-tying an embedding with "
                            "transformers' tie_weights() does this; quantize_linear_(..., skip=['lm_head']) keeps a "
                            "tied head as it was)")
        a, a_scale = self._quantize_input(x2)
        y = quant_gemm(a, weight, a_scale=a_scale, b_scale=scale, bias=bias, out_dtype=x.dtype)
        if plain:
            self._fast_key = (self._key(x2, weight, scale, bias)
                              if self._kernels_serve(x2, a, a_scale, weight, scale, bias) else None)
        return y.reshape(out_shape)

    def extra_repr(self) -> str:
        fused = f", fused={'+'.join(self._siblings.names)}" if self._siblings is not None else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"mode={self.mode!r}{fused}")


class W8A16Linear(QuantLinear):
    """int8 weights (per-channel scales), 16-bit activations: pair w8a16 of `quant_gemm`."""

    mode = "w8a16"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"W8A16Linear: x must be torch.bfloat16 or torch.float16 (the w8a16 GEMM's "
                             f"activations), got {x.dtype}")
        return super().forward(x)


class W8A8Linear(QuantLinear):
    """int8 weights (per-channel scales), activations quantized to int8 per token on every call: pair w8a8."""

    mode = "w8a8"

    def _quantize_input(self, x2: torch.Tensor):
        return quantize_int8_per_row(x2)

    def _quantize_input_kernel(self, x2: torch.Tensor):
        q, _, scale = torch.ops.astrai.quantize_dynamic.default(x2, torch.int8, 1, False, 0)  # per row, row-major
        return q, scale


class Fp8Linear(QuantLinear):
    """e4m3 weights (per-channel scales), activations quantized to e4m3 per token on every call: pair fp8."""

    mode = "fp8"

    def _quantize_input(self, x2: torch.Tensor):
        q, _, scale = quantize_fp8_dynamic(x2, out_dtype=torch.float8_e4m3fn, granularity="row")
        return q, scale

    def _quantize_input_kernel(self, x2: torch.Tensor):
        # per row, row-major
        q, _, scale = torch.ops.astrai.quantize_dynamic.default(x2, torch.float8_e4m3fn, 1, False, 0)
        return q, scale


MODULES = {"w8a16": W8A16Linear, "w8a8": W8A8Linear, "fp8": Fp8Linear}

# Sibling layers `quantize_linear_(..., fuse=True)` stacks into one GEMM where a parent holds all of a tuple: the
# projections that read one input in Llama-, Mistral-, Qwen- and Gemma-style transformers blocks (vLLM packs the same
# pairs). At batch 1 each GEMM is a weight read with a fixed cost of a few microseconds (launch, first bytes, tail), so
# one call over the stacked q / k / v or gate / up weights replaces three or two.
FUSE_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


class SiblingGroup:
    """Quantized linears of one parent that read the same input (a layer's q / k / v projections, an MLP's gate and
    up): one GEMM over their weights stacked in one buffer, its output's column blocks handed out in order.

    The members' `weight`, `weight_scale` and `bias` buffers are views of the stacked buffers: nothing is stored
    twice, and `state_dict` keeps each layer's own keys. The first member (the leader) runs the stacked GEMM when
    the model calls it and holds the output; a member called next with the same x (the same tensor, not modified
    since: its version counter; an inference tensor has none, so under torch.inference_mode a change of x in place
    between the calls is not seen) returns its block of it, the last one releasing it; any other call runs the
    member alone on its own view (the same contract; other bits where the stacked N plans differently). Where the
    model does not call them that way (a cross-attention's k / v read the encoder's states, not its q's input; a
    member never called), twice in a row, the group runs apart from then on (`apart`, logged), so the stacked GEMM's
    unused blocks are not computed for nothing. Traced code (torch.compile) takes the stacked GEMM only where the
    parent's forward, read from its source, calls the members in order on one argument with nothing in between that
    could change it (`traced_ok`: transformers' Llama / Gemma attention and MLP); elsewhere members run alone there.
    After `.to()` or anything else that replaces a member's buffer, the leader stacks the buffers again on its next
    eager call (not while a CUDA graph is being captured or traced: members then run alone).
    """

    MAX_MISSES = 2

    def __init__(self, members, names, traced_ok: bool = False):
        self.members, self.names = tuple(members), tuple(names)
        # Whether traced code (torch.compile) may take the stacked GEMM too: the parent's forward calls the members in
        # order on one argument and touches nothing in between (`calls_on_one_input`, read from its source), since a
        # trace has no version counter to see a change of x in place.
        self.traced_ok = traced_ok
        ends, total = [], 0
        for m in self.members:
            total += m.out_features
            ends.append(total)
        self.bounds = tuple(zip([0] + ends[:-1], ends))
        self._stacked = None  # (weight, weight_scale, bias or None) the members' buffers are views of
        self._views = None    # the members' buffer objects when stacked: a replaced one means stack again
        self._held = None     # [x, x's version, the stacked output, members served]
        self._misses = 0      # calls in a row that did not go as one input for all (`_miss`)
        self.apart = False    # set for good after MAX_MISSES such calls
        for i, m in enumerate(self.members):
            m._siblings, m._sibling_index = self, i

    def __getstate__(self):  # copies and pickles drop a held output (and the input it pins)
        state = dict(self.__dict__)
        state["_held"] = None
        return state

    def forget(self) -> None:
        """Drop the stacked buffers and any held output (a member's buffers are about to be replaced)."""
        self._stacked = self._views = self._held = None

    def _buffers_now(self) -> tuple:
        return tuple(m._buffers.get(name) for m in self.members for name in ("weight", "weight_scale", "bias"))

    def stack(self) -> bool:
        """Stack the members' buffers into one weight, scale and bias and make each member's buffers views of them;
        False (nothing changed) where the members' buffers differ in device or dtype or only some have a bias."""
        members = self.members
        first = members[0]._buffers
        for m in members:
            b = m._buffers
            for name in ("weight", "weight_scale", "bias"):
                t, t0 = b.get(name), first.get(name)
                if (t is None) != (t0 is None) or (t is not None and (t.device != t0.device or t.dtype != t0.dtype)):
                    self.forget()
                    return False
        stacked = []
        for name in ("weight", "weight_scale", "bias"):
            if first.get(name) is None:
                stacked.append(None)
                continue
            whole = torch.cat([m._buffers[name] for m in members])
            for m, (lo, hi) in zip(members, self.bounds):
                m._buffers[name] = whole[lo:hi]
            stacked.append(whole)
        self._stacked, self._views, self._held = tuple(stacked), self._buffers_now(), None
        return True

    def _current(self, x: torch.Tensor):
        views = self._buffers_now()
        if self._views is not None and all(a is b for a, b in zip(views, self._views)):
            return self._stacked
        if torch.compiler.is_compiling() or (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            return None
        return self._stacked if self.stack() else None

    def forward(self, member: "QuantLinear", x: torch.Tensor):
        """`member`'s output through the stacked GEMM, or None: run it alone."""
        if self.apart:
            return None
        traced = torch.compiler.is_compiling()
        if traced and not self.traced_ok:
            return None
        if member is self.members[0]:
            if self._held is not None and not traced:
                self._miss(f"{self.names[0]} was called again before every member took its block")
                if self.apart:
                    return None
            stacked = self._current(x)
            if stacked is None:
                return None
            y = member._gemm(x, *stacked)
            # An inference tensor (made under torch.inference_mode) keeps no version counter, and traced code has none
            # to compare: identity only (traced code gets here only where the parent's source rules a change out).
            self._held = [x, -1 if traced or x.is_inference() else x._version, y, 1]
            return y[..., : self.bounds[0][1]]
        held = self._held
        if held is None:
            return None
        i = member._sibling_index
        if held[0] is not x:
            if not traced:
                self._miss(f"{self.names[i]} was called with another input than {self.names[0]}'s")
            return None
        if held[1] >= 0 and held[1] != x._version:  # x changed in place since the leader's call: this member alone
            return None
        lo, hi = self.bounds[i]
        held[3] += 1
        if held[3] == len(self.members):
            self._held, self._misses = None, 0
        return held[2][..., lo:hi]

    def _miss(self, why: str) -> None:
        """The model does not call the members on one input (e.g. a cross-attention's k / v read another tensor than
        its q): the stacked GEMM's other blocks were wasted. Twice in a row, the group runs apart for good (logged)."""
        self._held = None
        self._misses += 1
        if self._misses >= self.MAX_MISSES:
            self.apart = True
            _logger.info("%s: %s now run apart (each layer alone): %s", FN, "+".join(self.names), why)


def unsupported_reason(module: nn.Module, mode: str, *, empty: bool = False) -> str | None:
    """Why `module` cannot become a quantized linear of `mode` (`empty`: one to load a checkpoint into), or None."""
    if type(module) is not nn.Linear:
        return (f"is a {type(module).__name__}, a subclass of nn.Linear (its owner may read .weight itself); "
                "skip it")
    w = module.weight
    if type(w) not in (torch.Tensor, nn.Parameter):
        return f"has a weight of type {type(w).__name__} (already quantized or wrapped)"
    if w.is_meta and not empty:
        return ("has its weight on the meta device (materialize the model first, or pass empty=True to load a "
                "checkpoint)")
    if w.dtype not in _WEIGHT_DTYPES[mode]:
        return f"has a {w.dtype} weight; mode {mode!r} takes {_WEIGHT_DTYPES[mode]}"
    if module.bias is not None and (module.bias.dtype != w.dtype or module.bias.device != w.device):
        return (f"has a bias of {module.bias.dtype} on {module.bias.device}; expected its weight's {w.dtype} on "
                f"{w.device}")
    if module.in_features % IN_FEATURES_MULTIPLE:
        return (f"has in_features = {module.in_features}, not a multiple of {IN_FEATURES_MULTIPLE} (16-byte rows of "
                "8-bit weights)")
    if module.out_features % OUT_FEATURES_MULTIPLE:
        return (f"has out_features = {module.out_features}, not a multiple of {OUT_FEATURES_MULTIPLE} (16-byte rows "
                "of the 16-bit output)")
    return None


def _warn_tied(model: nn.Module, layers: dict, places: dict) -> None:
    """Warn about each layer whose weight another module also holds (a tied embedding and lm_head): the quantized copy
    adds its bytes beside the shared weight, and re-tying (transformers' `tie_weights()`) would put that weight back
    into the quantized module."""
    by_weight = {id(layer.weight): key for key, layer in layers.items()}
    holders: dict[int, list[str]] = {}
    for name, module in model.named_modules():
        if id(module) in layers:
            continue
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in by_weight:
                holders.setdefault(by_weight[id(p)], []).append(f"{name}.{pname}" if name else pname)
    for key, others in holders.items():
        layer = layers[key]
        mib = layer.weight.numel() / 2**20  # int8 / e4m3: a byte a weight
        _logger.warning("%s: %s's weight is also %s (tied): its quantized copy adds %.1f MiB beside the shared %s "
                        "weight, and re-tying (transformers' tie_weights()) would put that weight back into the "
                        "quantized module, which then refuses to run; pass skip=[%r] to leave it tied",
                        FN, places[key][0], ", ".join(others), mib, layer.weight.dtype, places[key][0])


def _skipper(skip):
    if skip is None:
        return lambda name, module: False
    if callable(skip):
        return skip
    if isinstance(skip, str):
        skip = (skip,)
    patterns = tuple(skip)
    if not all(isinstance(p, str) for p in patterns):
        raise TypeError(f"{FN}: skip must be None, a callable (name, module) -> bool, or names / glob patterns, "
                        f"got {skip!r}")
    return lambda name, module: any(fnmatch.fnmatchcase(name, p) for p in patterns)


def quantize_linear_(model: nn.Module, mode: str, *, skip=None, empty: bool = False, fuse=False) -> nn.Module:
    """Swap every `nn.Linear` of `model` (in place) for the quantized linear of `mode` and return `model`.

    Parameters
    ----------
    model : nn.Module
        Converted in place. Every `nn.Linear` not skipped must be convertible: bf16 / fp16 weights (fp32 too for
        "w8a8" and "fp8"), in_features a multiple of 16, out_features a multiple of 8, a plain weight (not on the
        meta device, not a tensor subclass), and exactly `nn.Linear` (a subclass may be read by its owner: skip it).
        If any is not, ValueError lists each such layer by name and reason, and nothing is converted.
    mode : {"w8a16", "w8a8", "fp8"}
        `W8A16Linear`, `W8A8Linear` or `Fp8Linear` (see each).
    skip : callable, str or iterable of str, optional
        Layers to leave as they are: a predicate `skip(name, module)`, or qualified names / glob patterns
        (`fnmatch`), e.g. `skip=["lm_head"]` or `skip="*.gate"`.
    empty : bool
        Build the quantized modules empty (zeros, on each layer's device, the meta device allowed) instead of
        quantizing the layers' weights: for loading a quantized checkpoint (`load_state_dict`) into a fresh model.
        A checkpoint's `weight_scale` may be [N], [N, 1], [1, N] or one per-tensor value, in any float dtype (stored
        as float32 [N]); a `weight` of another dtype than the mode's is refused.
    fuse : bool or iterable of tuples of str
        Stack sibling layers that read the same input into one GEMM (`SiblingGroup`): `True` takes `FUSE_GROUPS`
        (q_proj / k_proj / v_proj and gate_proj / up_proj), or give the child names of each group, e.g.
        `fuse=[("wq", "wk", "wv")]`. A group forms where one parent holds every name as a converted layer reached by
        that one name, with one in_features and all or none with a bias; others stay apart (logged). Each layer
        keeps its own buffers and `state_dict` keys (views of the stacked ones). Default False: on an H100 it made
        a CUDA-graphed decode step 1-5% faster and an eager one slower (the group's bookkeeping a call).

    Example
    -------
    >>> quantize_linear_(model, "w8a16", skip=["lm_head"])
    >>> with torch.inference_mode():
    ...     logits = model(input_ids).logits
    >>> with torch.device("meta"):
    ...     fresh = build_model()
    >>> quantize_linear_(fresh, "fp8", empty=True).to_empty(device="cuda").load_state_dict(checkpoint)
    """
    if mode not in MODULES:
        raise ValueError(f"{FN}: mode must be one of {MODES}, got {mode!r}")
    if not isinstance(model, nn.Module):
        raise TypeError(f"{FN}: model must be an nn.Module, got {type(model).__name__}")
    if isinstance(model, nn.Linear):
        raise ValueError(f"{FN}: model is itself an nn.Linear; use {MODULES[mode].__name__}.from_linear(model)")
    skipped = _skipper(skip)
    fuse_groups = _fuse_groups(fuse)
    places: dict[int, list[str]] = {}  # id(layer) -> every qualified name it is reached by (a layer may be shared)
    layers, problems = {}, []
    for name, module in model.named_modules(remove_duplicate=False):
        if not isinstance(module, nn.Linear) or skipped(name, module):
            continue
        if id(module) not in layers:
            reason = unsupported_reason(module, mode, empty=empty)
            if reason:
                problems.append(f"  {name}: {reason}")
                continue
            layers[id(module)] = module
        places.setdefault(id(module), []).append(name)
    if problems:
        raise ValueError(f"{FN}: {len(problems)} layer(s) cannot become mode {mode!r}; nothing was converted (pass "
                         "skip=... to leave them as they are):\n" + "\n".join(problems))
    _warn_tied(model, layers, places)
    # Every layer quantized before any is swapped: a failure here leaves the model as it was.
    converted = {key: MODULES[mode].from_linear(layer, empty=empty) for key, layer in layers.items()}
    for key, names in places.items():
        for name in names:
            parent_name, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent_name), child, converted[key])
    _logger.info("%s: %d nn.Linear layer(s) -> %s (mode %r)", FN, len(converted), MODULES[mode].__name__, mode)
    if fuse_groups:
        _fuse_siblings(model, fuse_groups, converted, places)
    return model


# Tensor methods that return a new tensor or view and change nothing: between two members' calls these may run.
_PURE_METHODS = frozenset(("view", "reshape", "transpose", "permute", "unsqueeze", "squeeze", "flatten", "contiguous",
                           "float", "half", "bfloat16", "to", "type_as", "chunk", "split", "unflatten"))


def calls_on_one_input(parent: nn.Module, names: tuple) -> bool:
    """Whether `parent.forward`'s source (read when the group forms) calls `self.<name>(<arg>)` once for each name, in this order, all on one
    local name, with nothing between the first call and the last that could change that argument: the name not
    used otherwise, no assignment but to a plain local, no augmented assignment, and no call but the members', pure
    tensor methods (`_PURE_METHODS`) and functions of members' outputs (constant keywords only: an MLP's activation).
    transformers' Llama, Mistral, Qwen2 and Gemma attention and MLP qualify. False where the source cannot be read."""
    try:
        fn = parent.forward  # an instance-level forward (a patch, a hook's wrapper) is what runs: read that
        fn = inspect.unwrap(getattr(fn, "__func__", fn))
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError, AttributeError):
        return False
    body = tree.body[0] if tree.body and isinstance(tree.body[0], (ast.FunctionDef, ast.AsyncFunctionDef)) else None
    if body is None:
        return False

    def member_call(node):
        f = getattr(node, "func", None)
        return (isinstance(node, ast.Call) and isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                and f.value.id == "self" and f.attr in names)

    calls = [n for n in ast.walk(body) if member_call(n)]
    if sorted(c.func.attr for c in calls) != sorted(names):
        return False  # a member not called, or called twice
    if any(len(c.args) != 1 or c.keywords or not isinstance(c.args[0], ast.Name) for c in calls):
        return False
    if len({c.args[0].id for c in calls}) != 1:
        return False
    arg = calls[0].args[0].id
    position = {c.func.attr: (c.lineno, c.col_offset) for c in calls}
    if [position[n] for n in names] != sorted(position.values()):
        return False  # not called in the group's order
    first = min(calls, key=lambda c: (c.lineno, c.col_offset))
    first_end, last_start = (first.end_lineno, first.end_col_offset), max(position.values())
    inside_members = {id(n) for c in calls for n in ast.walk(c)}

    def between(node) -> bool:  # runs after the first member call and before the last (calls run after their args)
        return (hasattr(node, "end_lineno") and (node.end_lineno, node.end_col_offset) >= first_end
                and (node.lineno, node.col_offset) < last_start)

    for node in ast.walk(body):
        if not between(node) or id(node) in inside_members:
            continue
        if isinstance(node, ast.Name) and node.id == arg:
            return False  # the argument used otherwise between the calls
        if isinstance(node, (ast.AugAssign, ast.Delete, ast.Global, ast.Nonlocal, ast.NamedExpr)):
            return False
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if not all(isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.Starred, ast.Load, ast.Store))
                       for t in targets for n in ast.walk(t)):
                return False  # a store into an attribute or an item
        if isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in _PURE_METHODS and not (
                    isinstance(f.value, ast.Name) and f.value.id == "self"):
                continue
            if (node.args and all(any(member_call(n) for n in ast.walk(a)) for a in node.args)
                    and all(isinstance(k.value, ast.Constant) for k in node.keywords)):
                continue  # a function of members' outputs (an MLP's activation)
            return False
    return True


def _fuse_groups(fuse) -> tuple:
    if fuse is True:
        return FUSE_GROUPS
    if fuse is False or fuse is None:
        return ()
    bad = TypeError(f"{FN}: fuse must be a bool or an iterable of tuples of two or more distinct child names, e.g. "
                    f"[('q_proj', 'k_proj', 'v_proj')], got {fuse!r}")
    if isinstance(fuse, str):
        raise bad
    try:
        groups = tuple(tuple(group) for group in fuse)
    except TypeError:
        raise bad from None
    for group in groups:
        if (isinstance(group, str) or len(group) < 2 or len(set(group)) != len(group)
                or not all(isinstance(n, str) and n and "." not in n for n in group)):
            raise bad
    return groups


def _fuse_siblings(model: nn.Module, groups: tuple, converted: dict, places: dict) -> None:
    """Stack each parent's sibling groups (already converted: `converted` maps id(original layer) to its module)."""
    by_module = {id(q): key for key, q in converted.items()}
    formed: dict[tuple, int] = {}
    for parent_name, parent in model.named_modules():
        for names in groups:
            children = [parent._modules.get(n) for n in names]
            if not all(isinstance(c, QuantLinear) for c in children):
                continue  # not this parent's group (or a layer was skipped)
            where = f"{parent_name}.{{{','.join(names)}}}" if parent_name else "{" + ",".join(names) + "}"
            keys = [by_module.get(id(c)) for c in children]
            if any(k is None for k in keys):
                why = "a layer was not converted by this call"
            elif len(set(map(id, children))) != len(children) or any(len(places[k]) > 1 for k in keys):
                why = "a layer is shared (reached by more than one name)"
            elif any(c._siblings is not None for c in children):
                why = "a layer is already in a group"
            elif len({c.in_features for c in children}) > 1:
                why = f"in_features differ ({[c.in_features for c in children]})"
            elif len({c.bias is None for c in children}) > 1:
                why = "only some have a bias"
            else:
                group = SiblingGroup(children, names, traced_ok=calls_on_one_input(parent, names))
                if group.stack():
                    formed[names] = formed.get(names, 0) + 1
                    continue
                for c in children:
                    c._siblings, c._sibling_index = None, 0
                why = "their buffers differ in device or dtype"
            _logger.info("%s: %s not fused: %s", FN, where, why)
    if formed:
        _logger.info("%s: fused %s", FN, ", ".join(f"{'+'.join(n)} x {c}" for n, c in formed.items()))
