"""Tier 0 (CPU): the delayed-scaling ring fold. The torch fold (`fold_amax_history_torch`, the CPU path and the
model the kernel is tested against on the GPU) bit-for-bit against `PythonRing`, the Python ring `DelayedScaling`
kept before the fold op (slot a Python int, a tensor write per step), on amax sequences with 0, subnormals, inf
and NaN; the op's schema, validation messages and fake implementation with the image's library.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from astrai.extension import quantize as aq
from astrai.extension.backend import quantize as backend
from astrai.extension.ops import quantize as ops
from support.fp8_training import PythonRing

kernels = pytest.mark.requires_cuda_kernels("quantize")

SCHEMA = ("amax_history_fold(Tensor(a!) ring, Tensor(b!) pos, Tensor(c!) scale, Tensor(d!)? scale_inv, "
          "Tensor amax, float qmax, int margin) -> ()")
SPECIALS = [0.0, 1.4e-45, 1e-40, 1.17549435e-38, 3.4028235e38, float("inf"), float("nan"), 448.0, 1.0, 2.5e-3]


def amax_sequence(steps: int, gen: torch.Generator, specials: bool = True) -> list[float]:
    """Positive amaxes over many binades, with the special values mixed in."""
    out = []
    for i in range(steps):
        e = int(torch.randint(-30, 30, (1,), generator=gen))
        v = float(torch.rand(1, generator=gen)) * 2.0**e
        if specials and int(torch.randint(0, 4, (1,), generator=gen)) == 0:
            v = SPECIALS[int(torch.randint(0, len(SPECIALS), (1,), generator=gen))]
        out.append(float(torch.tensor(v, dtype=torch.float32)))
    return out


def f32_bits(t: torch.Tensor) -> list[int]:
    return t.float().reshape(-1).view(torch.int32).tolist()


@pytest.mark.parametrize("length", [1, 3, 16])
@pytest.mark.parametrize("margin", [0, 1, 5, 130])
@pytest.mark.parametrize("fmax", [448.0, 57344.0])
def test_torch_fold_matches_python_history(length, margin, fmax):
    gen = torch.Generator().manual_seed(1000 * length + margin)
    model = PythonRing(length, "cpu")
    ring = torch.zeros(length)
    pos = torch.zeros(1, dtype=torch.int64)
    scale = torch.full((1,), float("nan"))      # poisoned: every fold writes it
    scale_inv = torch.full((1,), float("nan"))
    for step, a in enumerate(amax_sequence(3 * length + 5, gen)):
        amax = torch.tensor([a], dtype=torch.float32)
        model.fold(amax)
        aq.fold_amax_history_torch(ring, pos, scale, amax, qmax=fmax, margin=margin, scale_inv=scale_inv)
        want = model.scale(fmax, margin)
        assert f32_bits(ring) == f32_bits(model.ring), f"ring at step {step}"
        assert int(pos) == model.pos, f"pos at step {step}"
        assert f32_bits(scale) == f32_bits(want), f"scale at step {step}: {scale.item()} vs {want.item()}"
        assert f32_bits(scale_inv) == f32_bits(1.0 / want), f"scale_inv at step {step}"


def test_torch_fold_rules_by_hand():
    ring, pos, scale = torch.zeros(3), torch.tensor([4], dtype=torch.int64), torch.zeros(1)
    aq.fold_amax_history_torch(ring, pos, scale, torch.tensor([2.0]), qmax=448.0, margin=1)
    assert ring.tolist() == [0.0, 2.0, 0.0] and int(pos) == 2  # slot 4 % 3 = 1, then 2
    assert scale.item() == 448.0 / 2.0 / 2.0
    aq.fold_amax_history_torch(ring, pos, scale, torch.tensor([8.0]), qmax=448.0, margin=0)
    assert ring.tolist() == [0.0, 2.0, 8.0] and int(pos) == 0 and scale.item() == 56.0
    aq.fold_amax_history_torch(ring, pos, scale, torch.tensor([float("nan")]), qmax=448.0, margin=2)
    assert math.isnan(ring[0].item()) and int(pos) == 1 and scale.item() == 0.25  # NaN max: multiplier 1
    negative = torch.tensor([-1], dtype=torch.int64)  # a negative slot wraps as a Python index would
    aq.fold_amax_history_torch(ring, negative, scale, torch.tensor([1.0]), qmax=448.0)
    assert ring[2].item() == 1.0 and int(negative) == 0


def test_amax_history_cpu_path_and_steps():
    hist = aq.AmaxHistory(4, qmax=448.0, margin=0, device="cpu")
    model = PythonRing(4, "cpu")
    assert hist.steps == 0 and hist.scale.item() == 1.0
    for a in (3.0, 0.5, 7.0, 1.0, 2.0):
        hist.fold(torch.tensor(a))  # a 0-dim amax is accepted
        model.fold(torch.tensor(a))
        assert f32_bits(hist.scale) == f32_bits(model.scale(448.0, 0))
    assert hist.steps == 5 and int(hist.pos) == 1


def test_delayed_history_holds_device_state_and_is_dynamic_before_first_fold():
    hist = backend._History(3, "cpu", qmax=57344.0, margin=2)
    model = PythonRing(3)
    assert hist.scale() is None and hist.steps == 0  # no history yet: the caller quantizes dynamically
    for a in (5.0, 0.25, float("inf"), 3.0, 1e-40):
        hist.fold(torch.tensor([a]))
        model.fold(torch.tensor([a]))
        assert hist.scale() is hist.amax_history.scale  # the state tensor itself, updated in place
        assert f32_bits(hist.scale()) == f32_bits(model.scale(57344.0, 2))
        assert f32_bits(hist.scale_inv()) == f32_bits(1.0 / model.scale(57344.0, 2))
        assert f32_bits(hist.amax_history.ring) == f32_bits(model.ring)
    assert hist.steps == 5 and int(hist.amax_history.pos) == model.pos


def test_fold_names_stay_importable_from_the_public_module():
    for name in ("AmaxHistory", "fold_amax_history", "fold_amax_history_torch"):
        assert getattr(aq, name) is getattr(backend, name) and name in aq.__all__

def test_fold_rejects_bad_arguments_on_python_side():
    ring, pos, scale = torch.zeros(3), torch.zeros(1, dtype=torch.int64), torch.zeros(1)
    with pytest.raises(ValueError, match="fold_amax_history: margin must be >= 0"):
        aq.fold_amax_history(ring, pos, scale, torch.ones(1), qmax=448.0, margin=-1)
    with pytest.raises(ValueError, match="fold_amax_history: path must be one of"):
        aq.fold_amax_history(ring, pos, scale, torch.ones(1), qmax=448.0, path="gpu")
    with pytest.raises(ValueError, match="AmaxHistory: length must be >= 1"):
        aq.AmaxHistory(0, qmax=448.0)


def test_fold_on_cpu_takes_the_torch_path():
    ring, pos, scale = torch.zeros(2), torch.zeros(1, dtype=torch.int64), torch.zeros(1)
    aq.fold_amax_history(ring, pos, scale, torch.tensor([4.0]), qmax=448.0)
    assert scale.item() == 112.0 and int(pos) == 1


# --- the op with the image's library, no GPU --------------------------------------------------------------------

@kernels
def test_fold_schema_matches_contract():
    ops.load()
    schema = torch.ops.astrai.amax_history_fold.default._schema
    assert str(schema) == str(torch._C.parse_schema("astrai::" + SCHEMA))


def _args(**change):
    a = dict(ring=torch.zeros(8), pos=torch.zeros(1, dtype=torch.int64), scale=torch.ones(1), scale_inv=None,
             amax=torch.ones(1), qmax=448.0, margin=0)
    a.update(change)
    return a


BAD_FOLD = [
    ("ring", "dtype", dict(ring=torch.zeros(8, dtype=torch.float64)), "must be float32"),
    ("ring", "rank", dict(ring=torch.zeros(2, 4)), "must be 1-D"),
    ("ring", "empty", dict(ring=torch.zeros(0)), "at least one slot"),
    ("ring", "strided", dict(ring=torch.zeros(16)[::2]), "must be contiguous"),
    ("pos", "dtype", dict(pos=torch.zeros(1, dtype=torch.int32)), "must be int64"),
    ("pos", "numel", dict(pos=torch.zeros(2, dtype=torch.int64)), "must hold one element"),
    ("scale", "dtype", dict(scale=torch.ones(1, dtype=torch.bfloat16)), "must be float32"),
    ("scale_inv", "numel", dict(scale_inv=torch.ones(3)), "must hold one element"),
    ("amax", "numel", dict(amax=torch.ones(0)), "must hold one element"),
    ("qmax", "value", dict(qmax=0.0), "must be finite and > 0"),
    ("qmax", "inf", dict(qmax=float("inf")), "must be finite and > 0"),
    ("margin", "negative", dict(margin=-1), r"must be in \[0, 2\^30\]"),
]


def assert_rejected(op: str, call, argument: str, message: str) -> None:
    """call() raises before the device check, naming the op and the argument with the expected message."""
    ops.load()
    with pytest.raises(RuntimeError) as info:
        call()
    text = str(info.value)
    assert text.startswith(op + ": "), text
    assert re.search(rf"\b{argument}\b", text) and re.search(message, text), text
    assert "must be a CUDA tensor" not in text, f"validation ran after the device check: {text}"


@kernels
def test_fold_on_cpu_tensors_raises_must_be_cuda():
    ops.load()
    ring = torch.zeros(8)
    with pytest.raises(RuntimeError, match=r"astrai\.amax_history_fold: ring must be a CUDA tensor"):
        ops.amax_history_fold(ring, torch.zeros(1, dtype=torch.int64), torch.ones(1), torch.ones(1), qmax=448.0)
    assert torch.equal(ring, torch.zeros(8))  # nothing written


@kernels
def test_fold_fake_on_meta():
    ops.load()
    meta = dict(device="meta")
    args = (torch.empty(16, **meta), torch.empty(1, dtype=torch.int64, **meta), torch.empty(1, **meta),
            torch.empty(1, **meta), torch.empty(1, **meta), 448.0, 0)
    assert torch.ops.astrai.amax_history_fold(*args) is None
    torch.library.opcheck(torch.ops.astrai.amax_history_fold.default, args,
                          test_utils=("test_schema", "test_faketensor"))


def test_negative_control_margin_off_by_one_is_detected():
    model = PythonRing(3, "cpu")
    ring, pos, scale = torch.zeros(3), torch.zeros(1, dtype=torch.int64), torch.zeros(1)
    model.fold(torch.tensor([3.0]))
    aq.fold_amax_history_torch(ring, pos, scale, torch.tensor([3.0]), qmax=448.0, margin=1)
    assert f32_bits(ring) == f32_bits(model.ring)
    assert f32_bits(scale) != f32_bits(model.scale(448.0, 0))


# --- quantize_delayed (quantize + fold in one launch) with the image's library, no GPU ---------------------------

DELAYED_SCHEMA = ("quantize_delayed(Tensor x, Tensor(a!) scale, Tensor(b!) ring, Tensor(c!) pos, Tensor(d!)? scale_inv, "
                  "Tensor(e!) workspace, ScalarType out_dtype, int layout, int margin) -> (Tensor, Tensor, Tensor, Tensor)")


@kernels
def test_delayed_schema_matches_contract():
    ops.load()
    schema = torch.ops.astrai.quantize_delayed.default._schema
    assert str(schema) == str(torch._C.parse_schema("astrai::" + DELAYED_SCHEMA))


def _delayed_args(**change):
    a = dict(x=torch.zeros(8, 16, dtype=torch.bfloat16), scale=torch.ones(1), ring=torch.zeros(8),
             pos=torch.zeros(1, dtype=torch.int64), scale_inv=None, workspace=torch.zeros(1, dtype=torch.int32),
             out_dtype=torch.float8_e4m3fn, layout=2, margin=0)
    a.update(change)
    return a


BAD_DELAYED = [
    ("x", "dtype", dict(x=torch.zeros(8, 16, dtype=torch.float64)), "must be bfloat16, float16 or float32"),
    ("x", "rank", dict(x=torch.zeros(8, dtype=torch.bfloat16)), "must be 2-D"),
    ("layout", "value", dict(layout=3), "must be 0"),
    ("out_dtype", "int8", dict(out_dtype=torch.int8), "must be float8_e4m3fn or float8_e5m2"),
    ("scale", "numel", dict(scale=torch.ones(2)), "must hold one element"),
    ("scale", "dtype", dict(scale=torch.ones(1, dtype=torch.float16)), "must be float32"),
    ("ring", "empty", dict(ring=torch.zeros(0)), "at least one slot"),
    ("pos", "dtype", dict(pos=torch.zeros(1, dtype=torch.int32)), "must be int64"),
    ("scale_inv", "numel", dict(scale_inv=torch.ones(2)), "must hold one element"),
    ("workspace", "dtype", dict(workspace=torch.zeros(1, dtype=torch.int64)), "must be int32"),
    ("workspace", "numel", dict(workspace=torch.zeros(2, dtype=torch.int32)), "must hold one element"),
    ("margin", "negative", dict(margin=-2), r"must be in \[0, 2\^30\]"),
]


BAD_CALLS = [("amax_history_fold", _args, *bad) for bad in BAD_FOLD] + \
            [("quantize_delayed", _delayed_args, *bad) for bad in BAD_DELAYED]


@kernels
@pytest.mark.parametrize("op,make,argument,what,change,message", BAD_CALLS,
                         ids=[f"{op}-{a}-{w}" for op, _, a, w, _, _ in BAD_CALLS])
def test_validation_names_op_and_argument(op, make, argument, what, change, message):
    a = make(**change)
    assert_rejected(f"astrai.{op}", lambda: getattr(torch.ops.astrai, op)(*a.values()), argument, message)


@kernels
def test_delayed_on_cpu_tensors_raises_must_be_cuda():
    ops.load()
    a = _delayed_args()
    with pytest.raises(RuntimeError, match=r"astrai\.quantize_delayed: x must be a CUDA tensor"):
        ops.quantize_delayed(a["x"], a["scale"], a["ring"], a["pos"], a["workspace"])
    assert int(a["pos"]) == 0 and torch.equal(a["ring"], torch.zeros(8))


@kernels
def test_delayed_fake_on_meta():
    ops.load()
    meta = dict(device="meta")
    args = (torch.empty(24, 40, dtype=torch.bfloat16, **meta), torch.empty(1, **meta), torch.empty(16, **meta),
            torch.empty(1, dtype=torch.int64, **meta), torch.empty(1, **meta),
            torch.empty(1, dtype=torch.int32, **meta), torch.float8_e5m2, 2, 1)
    out, out_t, amax, inv = torch.ops.astrai.quantize_delayed(*args)
    assert out.shape == (24, 40) and out_t.shape == (40, 24) and out.dtype == torch.float8_e5m2
    assert amax.shape == (1,) and inv.shape == (1,)
    torch.library.opcheck(torch.ops.astrai.quantize_delayed.default, args,
                          test_utils=("test_schema", "test_faketensor"))


def test_history_quantize_torch_path_is_quantize_then_fold():
    """AmaxHistory.quantize on CPU (the torch path) equals quantize_fp8 with the multiplier, then the fold."""
    gen = torch.Generator().manual_seed(21)
    hist = aq.AmaxHistory(4, qmax=448.0, margin=1, device="cpu")
    ring, pos = torch.zeros(4), torch.zeros(1, dtype=torch.int64)
    scale, scale_inv = torch.ones(1), torch.ones(1)
    for step in range(6):
        x = (torch.randn(24, 40, generator=gen) * 4.0 ** step).bfloat16()
        want_q, want_q_t, amax = aq.quantize_fp8(x, scale, layout="dual", amax="tensor", check_scale=False)
        want_inv = scale_inv.clone()
        aq.fold_amax_history_torch(ring, pos, scale, amax, qmax=448.0, margin=1, scale_inv=scale_inv)
        q, q_t, inv = hist.quantize(x, out_dtype=torch.float8_e4m3fn, layout="dual")
        assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8)), f"q at step {step}"
        assert torch.equal(q_t.view(torch.uint8), want_q_t.view(torch.uint8)), f"q_t at step {step}"
        assert f32_bits(inv) == f32_bits(want_inv) and f32_bits(hist.scale) == f32_bits(scale)
        assert f32_bits(hist.ring) == f32_bits(ring) and int(hist.pos) == int(pos)
    assert hist.steps == 6
    q, q_t, _ = hist.quantize(x, out_dtype=torch.float8_e4m3fn, layout="rowwise")
    assert q_t is None and q.shape == x.shape
    with pytest.raises(ValueError,
                       match=r"AmaxHistory.quantize: out_dtype must be torch.float8_e4m3fn or torch.float8_e5m2"):
        hist.quantize(x, out_dtype=torch.int8)
