"""Tier 0 (CPU): the quantized linears and `quantize_linear_` on the torch paths. Covers: weights quantized as
the contract says (against the reference's own quantization, bitwise); outputs against the float64 reference of
the module's buffers and near the original nn.Linear; state_dict round trip bitwise with a negative control;
`.to()` keeping the quantized dtypes; shapes (leading dims, empty M); inference-only; the converter's skip rules,
its module-by-module report with nothing half-converted, shared layers; torch.compile (aot_eager).
"""

from __future__ import annotations

import copy
import io

import pytest
import torch
from reference import linear as ref
from support.bitwise import assert_bitwise_equal

import astrai.extension as ae
from astrai.extension.backend import linear as backend

MODES = ["w8a16", "w8a8", "fp8"]
# Relative error of each mode's output against the unquantized bf16 linear (random weights and activations):
# int8 per channel ~2^-8, e4m3 ~2^-4 per element, averaged down by K.
FIDELITY = {"w8a16": 0.02, "w8a8": 0.03, "fp8": 0.08}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _linear(k=64, n=48, bias=True, dtype=torch.bfloat16) -> torch.nn.Linear:
    lin = torch.nn.Linear(k, n, bias=bias).to(dtype)
    with torch.no_grad():
        lin.weight.mul_(torch.rand(n, 1, dtype=dtype) * 4)  # channels of different magnitude
    return lin


class Block(torch.nn.Module):
    def __init__(self, d=64, hidden=128, vocab=96):
        super().__init__()
        self.up = torch.nn.Linear(d, hidden)
        self.down = torch.nn.Linear(hidden, d, bias=False)
        self.lm_head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, x):
        return self.lm_head(x + self.down(torch.nn.functional.gelu(self.up(x))))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_from_linear_quantizes_per_channel_and_matches_the_reference(mode, bias):
    lin = _linear(bias=bias)
    q = backend.MODULES[mode].from_linear(lin)
    want_q, want_scale = ref.quantized_weight(lin.weight.detach(), mode)
    assert_bitwise_equal(q.weight, want_q, "quantized weight")
    assert_bitwise_equal(q.weight_scale, want_scale.float(), "weight scale")
    assert q.weight.dtype == (torch.float8_e4m3fn if mode == "fp8" else torch.int8)
    assert (q.bias is None) == (not bias)
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        y = q(x)
    assert y.shape == (3, 5, 48) and y.dtype == torch.bfloat16
    want = ref.quant_linear(q, x)
    assert _rel(y, want) < 2.0**-7  # one bf16 rounding of the output
    assert (y.double() - want).abs().max() <= 2.0**-7 * want.abs().max() + 1e-6
    with torch.no_grad():
        assert _rel(y, lin(x)) < FIDELITY[mode]


@pytest.mark.parametrize("mode", ["w8a8", "fp8"])
def test_float32_models_run_w8a8_and_fp8(mode):
    lin = _linear(dtype=torch.float32)
    q = backend.MODULES[mode].from_linear(lin)
    x = torch.randn(7, 64)
    with torch.no_grad():
        y = q(x)
    assert y.dtype == torch.float32 and _rel(y, ref.quant_linear(q, x)) < 1e-5


def test_w8a16_wants_16_bit_activations():
    q = ae.W8A16Linear.from_linear(_linear())
    with torch.no_grad(), pytest.raises(ValueError, match=r"W8A16Linear: x must be torch.bfloat16 or torch.float16"):
        q(torch.randn(4, 64))
    with pytest.raises(ValueError, match=r"W8A16Linear.from_linear: linear has a torch.float32 weight"):
        ae.W8A16Linear.from_linear(_linear(dtype=torch.float32))


@pytest.mark.parametrize("mode", MODES)
def test_shapes_and_bad_input(mode):
    q = backend.MODULES[mode].from_linear(_linear())
    with torch.no_grad():
        empty = q(torch.randn(0, 64, dtype=torch.bfloat16))
        assert empty.shape == (0, 48)
        assert q(torch.randn(64, dtype=torch.bfloat16)).shape == (48,)
        with pytest.raises(ValueError, match=rf"{type(q).__name__}: x must be \[\.\.\., 64\] \(in_features\), got"):
            q(torch.randn(4, 63, dtype=torch.bfloat16))
    x = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(RuntimeError, match="quantized linears have no backward"):
        q(x)
    with torch.no_grad():
        q(x)  # fine without grad mode
    with pytest.raises(ValueError, match="in_features and out_features must be >= 1"):
        type(q)(0, 8)


@pytest.mark.parametrize("mode", MODES)
def test_state_dict_round_trip_is_bitwise(mode):
    torch.manual_seed(1)
    model = ae.quantize_linear_(Block().to(torch.bfloat16), mode)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    assert set(model.state_dict()) == {"up.weight", "up.weight_scale", "up.bias", "down.weight", "down.weight_scale",
                                       "lm_head.weight", "lm_head.weight_scale"}
    torch.manual_seed(2)
    fresh = ae.quantize_linear_(Block().to(torch.bfloat16), mode)  # other random weights
    x = torch.randn(2, 9, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        want, before = model(x), fresh(x)
        assert not torch.equal(before, want)  # negative control: the load below is what makes them equal
        buffer.seek(0)
        fresh.load_state_dict(torch.load(buffer))
        assert_bitwise_equal(fresh(x), want, "outputs after load_state_dict")


def test_to_keeps_the_quantized_dtypes():
    q = ae.Fp8Linear.from_linear(_linear())
    weight, scale = q.weight.clone(), q.weight_scale.clone()
    q.to(torch.float16)
    assert q.weight.dtype == torch.float8_e4m3fn and q.weight_scale.dtype == torch.float32
    assert q.bias.dtype == torch.float16  # the bias follows the model, as nn.Linear's does
    assert_bitwise_equal(q.weight, weight)
    assert_bitwise_equal(q.weight_scale, scale)
    q.half().to("cpu").bfloat16()
    assert q.weight.dtype == torch.float8_e4m3fn and q.weight_scale.dtype == torch.float32
    assert q.bias.dtype == torch.bfloat16
    assert "mode='fp8'" in repr(q)


def test_quantize_linear_swaps_every_linear_and_honours_skip():
    model = Block().to(torch.bfloat16)
    lm_head = model.lm_head
    assert ae.quantize_linear_(model, "w8a16", skip=["lm_head"]) is model
    assert isinstance(model.up, ae.W8A16Linear) and isinstance(model.down, ae.W8A16Linear)
    assert model.lm_head is lm_head
    model = ae.quantize_linear_(Block().to(torch.bfloat16), "fp8", skip="d*")
    assert type(model.down) is torch.nn.Linear and isinstance(model.up, ae.Fp8Linear)
    model = ae.quantize_linear_(Block().to(torch.bfloat16), "w8a8", skip=lambda name, m: m.out_features == 96)
    assert type(model.lm_head) is torch.nn.Linear and isinstance(model.up, ae.W8A8Linear)


def test_nothing_is_half_converted_and_each_bad_layer_is_named():
    model = Block().to(torch.bfloat16)
    model.odd = torch.nn.Linear(64, 10).to(torch.bfloat16)        # out_features not a multiple of 8
    model.wide = torch.nn.Linear(40, 64).to(torch.bfloat16)       # in_features not a multiple of 16
    model.mha = torch.nn.MultiheadAttention(64, 4).to(torch.bfloat16)  # out_proj: an nn.Linear subclass
    before = {name: m for name, m in model.named_modules()}
    with pytest.raises(ValueError) as info:
        ae.quantize_linear_(model, "w8a16")
    message = str(info.value)
    assert "3 layer(s) cannot become mode 'w8a16'; nothing was converted" in message
    assert "odd: has out_features = 10" in message and "wide: has in_features = 40" in message
    assert "mha.out_proj: is a NonDynamicallyQuantizableLinear" in message
    assert {name: m for name, m in model.named_modules()} == before
    ae.quantize_linear_(model, "w8a16", skip=["odd", "wide", "mha.*"])
    assert isinstance(model.up, ae.W8A16Linear) and type(model.odd) is torch.nn.Linear


def test_dtypes_and_arguments_are_checked():
    with pytest.raises(ValueError, match=r"up: has a torch.float32 weight; mode 'w8a16' takes"):
        ae.quantize_linear_(Block(), "w8a16")
    with pytest.raises(ValueError, match=r"mode must be one of \('w8a16', 'w8a8', 'fp8'\), got 'int4'"):
        ae.quantize_linear_(Block(), "int4")
    with pytest.raises(ValueError, match="model is itself an nn.Linear; use Fp8Linear.from_linear"):
        ae.quantize_linear_(_linear(), "fp8")
    with pytest.raises(TypeError, match="skip must be None, a callable"):
        ae.quantize_linear_(Block(), "fp8", skip=[3])
    with pytest.raises(ValueError, match="has its weight on the meta device"):
        with torch.device("meta"):
            meta = Block()
        ae.quantize_linear_(meta, "fp8")


def test_a_shared_layer_becomes_one_shared_module():
    model = Block().to(torch.bfloat16)
    model.alias = model.up
    ae.quantize_linear_(model, "w8a8")
    assert isinstance(model.up, ae.W8A8Linear) and model.alias is model.up


@pytest.mark.parametrize("mode", MODES)
def test_torch_compile_matches_eager(mode):
    model = ae.quantize_linear_(Block().to(torch.bfloat16), mode)
    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    compiled = torch.compile(copy.deepcopy(model), backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        assert_bitwise_equal(compiled(x), model(x), "compiled vs eager")


@pytest.mark.parametrize("mode", MODES)
def test_empty_modules_on_meta_load_a_checkpoint(mode):
    """The serving path: a model built on the meta device, emptied into quantized modules, materialized, loaded."""
    model = ae.quantize_linear_(Block().to(torch.bfloat16), mode)
    checkpoint = model.state_dict()
    with torch.device("meta"):
        fresh = Block().to(torch.bfloat16)
    ae.quantize_linear_(fresh, mode, empty=True)
    assert fresh.up.weight.is_meta and fresh.up.weight.dtype == model.up.weight.dtype
    fresh.to_empty(device="cpu")
    fresh.load_state_dict(checkpoint)
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        assert_bitwise_equal(fresh(x), model(x), "loaded into empty modules")


def test_checkpoint_scales_of_other_shapes_and_dtypes_load():
    q = ae.Fp8Linear.from_linear(_linear())
    state = q.state_dict()
    column = dict(state, weight_scale=state["weight_scale"].reshape(-1, 1).bfloat16())
    fresh = ae.Fp8Linear(64, 48)
    fresh.load_state_dict(column)
    assert fresh.weight_scale.dtype == torch.float32 and fresh.weight_scale.shape == (48,)
    assert_bitwise_equal(fresh.weight_scale, state["weight_scale"].bfloat16().float())
    fresh.load_state_dict(dict(state, weight_scale=torch.tensor(0.5)))  # one per-tensor scale
    assert torch.equal(fresh.weight_scale, torch.full((48,), 0.5))
    with pytest.raises(RuntimeError, match=r"weight_scale must hold 48 \(out_features\) or 1 floating values"):
        fresh.load_state_dict(dict(state, weight_scale=torch.ones(47)))


def test_a_checkpoint_of_another_mode_is_refused():
    state = ae.W8A8Linear.from_linear(_linear()).state_dict()  # int8 weights
    with pytest.raises(RuntimeError, match=r"weight must be torch.float8_e4m3fn \(mode 'fp8'\), got torch.int8"):
        ae.Fp8Linear(64, 48).load_state_dict(state)


class _StubOp:
    """A stand-in for an op's packet whose default overload is itself (the fast path calls `.default`)."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self, *args):
        return self.fn(*args)

    @property
    def default(self):
        return self


@pytest.mark.requires_cuda_kernels("gemm")
@pytest.mark.requires_cuda_kernels("quantize")
@pytest.mark.parametrize("mode", ["w8a16", "w8a8"])
def test_the_fast_path_skips_only_checks_that_passed(mode, monkeypatch):
    """The host-time fast path, on the CPU with CUDA faked and the ops stubbed: a call goes straight to the ops only
    after a checked call with a like x ran the kernels and with the same buffers; a misaligned x, a replaced buffer,
    another dtype or a call the policy sent to torch goes through the checks (tests/gpu/linear checks the bits)."""
    from astrai.extension.backend import gemm as gemm_backend
    from astrai.extension.backend import quantize as quantize_backend
    from astrai.extension.ops import gemm as gemm_ops
    from astrai.extension.ops import gemm_plan
    from astrai.extension.ops import quantize as quantize_ops
    gemm_ops.load()
    quantize_ops.load()
    q = backend.MODULES[mode].from_linear(torch.nn.Linear(64, 48).to(torch.bfloat16))
    launched, checked = [], []
    monkeypatch.setattr(torch.ops.astrai, "quant_gemm", _StubOp(
        lambda a, b, *rest: launched.append((a, b, rest)) or torch.zeros(a.shape[0], b.shape[0])))
    monkeypatch.setattr(torch.ops.astrai, "quantize_dynamic", _StubOp(
        lambda x, dtype, *rest: (x.to(dtype), None, torch.ones(x.shape[0], 1))))
    monkeypatch.setattr(gemm_plan, "plan_call", lambda *a, **k: (2, 1))
    monkeypatch.setattr(gemm_backend, "_kernels_available", lambda: True)
    monkeypatch.setattr(quantize_backend, "_kernels_available", lambda: True)
    monkeypatch.setattr(quantize_backend, "_library_reason", lambda *a: "")
    real = gemm_backend.validate
    monkeypatch.setattr(gemm_backend, "validate", lambda *a, **k: checked.append(1) or real(*a, **k))
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        q(x)
        assert (len(checked), len(launched)) == (1, 1) and q._fast_key is not None
        q(torch.randn(9, 64, dtype=torch.bfloat16))  # another M: straight to the ops
        assert (len(checked), len(launched)) == (1, 2)
        assert launched[1][1] is q.weight and launched[1][2][1] is q.weight_scale and launched[1][2][2] is q.bias
        # Misaligned: checked; w8a16's GEMM reads it (torch path), w8a8's reads the fresh quantized copy (kernels).
        q(torch.randn(5 * 64 + 1, dtype=torch.bfloat16)[1:].view(5, 64))
        runs = 2 if mode == "w8a16" else 3
        assert (len(checked), len(launched)) == (2, runs) and q._fast_key is not None
        q.bias = q.bias.clone()
        q(x)
        assert (len(checked), len(launched)) == (3, runs + 1)
        if mode == "w8a8":  # float32 activations are another key
            q(x.float())
            assert (len(checked), len(launched)) == (4, runs + 2)
        monkeypatch.setattr(gemm_backend, "_kernels_available", lambda: False)
        q._fast_key = None
        q(x)  # the policy sends it to torch: no fast path after it
        assert q._fast_key is None
        n = len(checked)
        q(x)
        assert len(checked) == n + 1


class _TiedLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32, dtype=torch.bfloat16)
        self.proj = torch.nn.Linear(32, 32, dtype=torch.bfloat16)
        self.lm_head = torch.nn.Linear(32, 64, bias=False, dtype=torch.bfloat16)
        self.lm_head.weight = self.embed.weight

    def forward(self, ids):
        return self.lm_head(self.proj(self.embed(ids)))


def test_a_tied_head_is_named_and_a_re_tied_one_refused(caplog):
    """A converted lm_head tied to the embedding: warned (its bytes and how to keep it tied); re-tied afterwards (the
    bf16 embedding put back as its weight), its forward says what happened instead of a GEMM dtype error."""
    model = _TiedLM()
    with caplog.at_level("WARNING", logger="astrai.extension"):
        backend.quantize_linear_(model, "w8a16")
    tied = [r.getMessage() for r in caplog.records if "(tied)" in r.getMessage()]
    assert len(tied) == 1 and "lm_head's weight is also embed.weight" in tied[0] and "skip=['lm_head']" in tied[0]
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        assert model(ids).shape == (1, 3, 64)
        model.lm_head.weight = model.embed.weight  # what tie_weights() does
        with pytest.raises(TypeError, match=r"W8A16Linear: weight is torch.bfloat16, not torch.int8 \(mode "
                                            r"'w8a16'\): it was replaced"):
            model(ids)
    caplog.clear()
    untied = _TiedLM()
    with caplog.at_level("WARNING", logger="astrai.extension"):
        backend.quantize_linear_(untied, "w8a16", skip=["lm_head"])
    assert not [r for r in caplog.records if "(tied)" in r.getMessage()]
    assert untied.lm_head.weight is untied.embed.weight
