"""Tier 0 (CPU): `quantize_linear_(..., fuse=...)`, sibling layers stacked into one GEMM (`SiblingGroup`), on the
torch paths. Covers: outputs equal to the unfused layers' (the torch path computes a column the same way whatever
N), the GEMM count (one a group), views of one stacked buffer with each layer's own `state_dict` keys, checkpoints
crossing between fused and unfused models bitwise, re-stacking after `.to()` / deepcopy / `load_state_dict(assign=True)`
/ `to_empty`, every case where a member must run alone (modified input, another input, the leader not called first,
traced code), a group not called on one input breaking up for good (a cross-attention), the groups that must not
form and why, and argument checks.
"""

from __future__ import annotations

import copy
import io
import logging

import pytest
import torch
from support.bitwise import assert_bitwise_equal

import astrai.extension as ae
from astrai.extension.backend import linear as backend

MODES = ["w8a16", "w8a8", "fp8"]
D = 64


class Attention(torch.nn.Module):
    def __init__(self, bias=False):
        super().__init__()
        self.q_proj = torch.nn.Linear(D, 64, bias=bias)
        self.k_proj = torch.nn.Linear(D, 32, bias=bias)
        self.v_proj = torch.nn.Linear(D, 32, bias=bias)
        self.o_proj = torch.nn.Linear(64, D, bias=False)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return self.o_proj(torch.cat([q[..., :32] * torch.sigmoid(k), v], -1))


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = torch.nn.Linear(D, 128, bias=False)
        self.up_proj = torch.nn.Linear(D, 128, bias=False)
        self.down_proj = torch.nn.Linear(128, D, bias=False)

    def forward(self, x):
        return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(torch.nn.Module):
    def __init__(self, bias=False):
        super().__init__()
        self.self_attn, self.mlp = Attention(bias), Mlp()

    def forward(self, x):
        h = x + self.self_attn(x)
        return h + self.mlp(h)


class Model(torch.nn.Module):
    def __init__(self, layers=2, bias=False):
        super().__init__()
        self.layers = torch.nn.ModuleList(Layer(bias) for _ in range(layers))
        self.lm_head = torch.nn.Linear(D, 96, bias=False)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(x)


def _model(seed=0, **kw) -> Model:
    torch.manual_seed(seed)
    return Model(**kw).to(torch.bfloat16)


def _count_gemms(monkeypatch) -> list:
    calls = []
    real = backend.quant_gemm

    def counting(a, b, **kw):
        calls.append(tuple(b.shape))
        return real(a, b, **kw)

    monkeypatch.setattr(backend, "quant_gemm", counting)
    return calls


NO_GRAD = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


@pytest.mark.parametrize("grad", NO_GRAD)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_fused_layers_equal_the_separate_ones_with_one_gemm_a_group(mode, bias, grad, monkeypatch):
    base = _model(bias=bias)
    apart = ae.quantize_linear_(copy.deepcopy(base), mode)
    fused = ae.quantize_linear_(copy.deepcopy(base), mode, fuse=True)
    x = torch.randn(3, 5, D, dtype=torch.bfloat16)
    calls = _count_gemms(monkeypatch)
    with NO_GRAD[grad]():
        want = apart(x)
        n_apart = len(calls)
        got = fused(x)
    assert n_apart == 2 * 7 + 1
    assert calls[n_apart:] == [(128, D), (D, 64), (256, D), (D, 128)] * 2 + [(96, D)]
    assert_bitwise_equal(got, want, "fused vs separate layers")
    attn = fused.layers[0].self_attn
    assert "fused=q_proj+k_proj+v_proj" in repr(attn.k_proj) and "fused" not in repr(attn.o_proj)
    assert attn.q_proj._siblings._held is None  # the last member released the stacked output


@pytest.mark.parametrize("mode", MODES)
def test_members_are_views_of_one_buffer_and_keep_their_keys(mode):
    base = _model()
    apart = ae.quantize_linear_(copy.deepcopy(base), mode)
    fused = ae.quantize_linear_(copy.deepcopy(base), mode, fuse=True)
    assert list(fused.state_dict()) == list(apart.state_dict())
    for key, value in apart.state_dict().items():
        assert_bitwise_equal(fused.state_dict()[key], value, key)
    mlp = fused.layers[1].mlp
    group = mlp.gate_proj._siblings
    assert group is mlp.up_proj._siblings and group.names == ("gate_proj", "up_proj")
    stacked = group._stacked[0]
    assert stacked.shape == (256, D)
    assert mlp.gate_proj.weight.data_ptr() == stacked.data_ptr()
    assert mlp.up_proj.weight.data_ptr() == stacked.data_ptr() + 128 * D * stacked.element_size()
    assert mlp.up_proj.weight_scale.data_ptr() == group._stacked[1].data_ptr() + 128 * 4


@pytest.mark.parametrize("mode", MODES)
def test_checkpoints_cross_between_fused_and_unfused_models_bitwise(mode):
    model = ae.quantize_linear_(_model(1), mode, fuse=True)
    x = torch.randn(2, 7, D, dtype=torch.bfloat16)
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    with torch.no_grad():
        want = model(x)
        for fuse in (True, False):
            fresh = ae.quantize_linear_(_model(2), mode, fuse=fuse)  # other random weights
            assert not torch.equal(fresh(x), want)  # negative control
            buffer.seek(0)
            fresh.load_state_dict(torch.load(buffer))
            assert_bitwise_equal(fresh(x), want, f"loaded into fuse={fuse}")
        # the load wrote through the views: still one stacked buffer
        group = fresh.layers[0].self_attn.q_proj._siblings
        assert group is None or group._current(x) is not None


def _assert_stacked(model) -> None:
    for layer in model.layers:
        for group in (layer.self_attn.q_proj._siblings, layer.mlp.gate_proj._siblings):
            weight = group._stacked[0]
            lo = 0
            for member in group.members:
                assert member.weight.data_ptr() == weight.data_ptr() + lo * D * weight.element_size()
                lo += member.out_features


@pytest.mark.parametrize("how", ["to", "deepcopy", "assign", "pickle"])
def test_replaced_buffers_are_stacked_again_on_the_next_call(how, monkeypatch):
    model = ae.quantize_linear_(_model(), "w8a16", fuse=True)
    x = torch.randn(4, D, dtype=torch.bfloat16)
    with torch.no_grad():
        want = model(x)
    if how == "to":
        model.to(torch.float16).to(torch.bfloat16)  # moves every buffer: no longer views
        group = model.layers[0].self_attn.q_proj._siblings
        assert group._stacked is None
    elif how == "deepcopy":
        model = copy.deepcopy(model)
    elif how == "assign":
        state = {k: v.clone() for k, v in model.state_dict().items()}
        model.load_state_dict(state, assign=True)
        assert model.layers[0].self_attn.q_proj._siblings._stacked is None  # nothing pinned
    else:
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        model = torch.load(buffer, weights_only=False)
    calls = _count_gemms(monkeypatch)
    with torch.no_grad():
        assert_bitwise_equal(model(x), want, f"after {how}")
    assert len(calls) == 2 * 4 + 1
    _assert_stacked(model)


def test_empty_modules_load_a_checkpoint_and_stack(monkeypatch):
    model = ae.quantize_linear_(_model(), "fp8", fuse=True)
    checkpoint = model.state_dict()
    with torch.device("meta"):
        fresh = Model().to(torch.bfloat16)
    ae.quantize_linear_(fresh, "fp8", empty=True, fuse=True)
    assert fresh.layers[0].mlp.up_proj.weight.is_meta
    fresh.to_empty(device="cpu")
    fresh.load_state_dict(checkpoint)
    x = torch.randn(3, D, dtype=torch.bfloat16)
    calls = _count_gemms(monkeypatch)
    with torch.no_grad():
        assert_bitwise_equal(fresh(x), model(x), "loaded into empty fused modules")
    assert len(calls) == 2 * (2 * 4 + 1)
    _assert_stacked(fresh)


class _Probe(torch.nn.Module):
    """Calls its q / k / v in a given way, to reach every path of a member."""

    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(D, 32, bias=True)
        self.k_proj = torch.nn.Linear(D, 16, bias=True)
        self.v_proj = torch.nn.Linear(D, 48, bias=True)


def _probe_pair(mode):
    torch.manual_seed(3)
    base = _Probe().to(torch.bfloat16)
    return ae.quantize_linear_(copy.deepcopy(base), mode), ae.quantize_linear_(copy.deepcopy(base), mode, fuse=True)


@pytest.mark.parametrize("mode", MODES)
def test_a_member_runs_alone_where_the_held_output_does_not_apply(mode, monkeypatch):
    calls = _count_gemms(monkeypatch)
    with torch.no_grad():
        # the input modified in place between the leader and a member: the member runs alone on the new values
        apart, fused = _probe_pair(mode)
        x = torch.randn(5, D, dtype=torch.bfloat16)
        q = fused.q_proj(x)
        x.mul_(-2)
        assert_bitwise_equal(fused.k_proj(x), apart.k_proj(x), "k after x changed in place")
        assert_bitwise_equal(fused.v_proj(x), apart.v_proj(x), "v after x changed in place")
        assert_bitwise_equal(q, apart.q_proj(x / -2), "q")
        # a member before its leader: alone; then the leader's call serves the rest
        apart, fused = _probe_pair(mode)
        y = torch.randn(2, 3, D, dtype=torch.bfloat16)
        n = len(calls)
        assert_bitwise_equal(fused.v_proj(y), apart.v_proj(y), "v first")
        assert_bitwise_equal(fused.q_proj(y), apart.q_proj(y), "q")
        assert_bitwise_equal(fused.k_proj(y), apart.k_proj(y), "k")
        assert_bitwise_equal(fused.v_proj(y), apart.v_proj(y), "v")
        # N of each GEMM, fused and apart interleaved: v alone, (apart v), the stack, (apart q, k, v); k and v served
        assert [c[0] for c in calls[n:]] == [48, 48, 96, 32, 16, 48]
        assert fused.q_proj._siblings._held is None and not fused.q_proj._siblings.apart
        # a member called twice takes its block twice; the group releases the output after as many calls as members
        fused.q_proj(y)
        assert_bitwise_equal(fused.k_proj(y), apart.k_proj(y), "k")
        assert_bitwise_equal(fused.k_proj(y), apart.k_proj(y), "k again")
        assert fused.q_proj._siblings._held is None


@pytest.mark.parametrize("mode", MODES)
def test_under_inference_mode_a_change_in_place_is_not_seen(mode):
    """Inference tensors keep no version counter: the member returns its block of x as the leader read it (the
    contract says so); a tensor made outside inference mode keeps its counter there and is still checked."""
    apart, fused = _probe_pair(mode)
    with torch.inference_mode():
        x = torch.randn(5, D, dtype=torch.bfloat16)
        before = x.clone()
        fused.q_proj(x)
        x.mul_(-2)
        assert_bitwise_equal(fused.k_proj(x), apart.k_proj(before), "k: the block of x before the change")
        assert_bitwise_equal(fused.v_proj(x), apart.v_proj(before), "v")
    x = torch.randn(5, D, dtype=torch.bfloat16)  # a normal tensor, used under inference mode
    with torch.inference_mode():
        fused.q_proj(x)
        x.mul_(-2)
        assert_bitwise_equal(fused.k_proj(x), apart.k_proj(x), "k after a counted change")


@pytest.mark.parametrize("mode", MODES)
def test_a_group_not_called_on_one_input_runs_apart_for_good(mode, monkeypatch, caplog):
    """A cross-attention's pattern: q reads the decoder's states, k / v the encoder's (and later steps reuse cached
    k / v, calling q alone). Each miss wastes the stacked GEMM's other blocks; after two in a row the group runs
    apart (logged once), with the same outputs throughout. One miss (an interrupted forward) does not break it up."""
    apart, fused = _probe_pair(mode)
    group = fused.q_proj._siblings
    dec, enc = torch.randn(4, D, dtype=torch.bfloat16), torch.randn(6, D, dtype=torch.bfloat16)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="astrai.extension"):
        assert_bitwise_equal(fused.q_proj(dec), apart.q_proj(dec), "q")
        assert_bitwise_equal(fused.k_proj(enc), apart.k_proj(enc), "k on another input")  # miss 1
        assert_bitwise_equal(fused.v_proj(enc), apart.v_proj(enc), "v")
        assert not group.apart
        fused.q_proj(dec)  # a full round on one input clears the count
        fused.k_proj(dec)
        fused.v_proj(dec)
        assert group._misses == 0 and not group.apart
        fused.q_proj(dec)
        fused.k_proj(enc)                                  # miss 1
        assert_bitwise_equal(fused.q_proj(dec), apart.q_proj(dec), "q")  # the next step: stacked, held
        assert_bitwise_equal(fused.q_proj(dec), apart.q_proj(dec), "q again")  # k / v cached, not called: miss 2
        assert group.apart
        calls = _count_gemms(monkeypatch)
        for m, ref in zip((fused.q_proj, fused.k_proj, fused.v_proj), (apart.q_proj, apart.k_proj, apart.v_proj)):
            assert_bitwise_equal(m(dec), ref(dec), "apart")
    assert [c[0] for c in calls] == [32, 32, 16, 16, 48, 48]  # each member alone (and its unfused twin)
    assert caplog.text.count("q_proj+k_proj+v_proj now run apart") == 1
    assert "q_proj was called again before every member took its block" in caplog.text


class _Mutating(torch.nn.Module):
    """Changes its input in place between two members' calls: traced code cannot see that, so its group must not take
    the stacked GEMM under torch.compile."""

    def __init__(self):
        super().__init__()
        self.gate_proj = torch.nn.Linear(D, 32, bias=False)
        self.up_proj = torch.nn.Linear(D, 32, bias=False)

    def forward(self, x):
        g = self.gate_proj(x)
        x.mul_(2)
        return g * self.up_proj(x)


@pytest.mark.parametrize("mode", MODES)
def test_torch_compile_takes_the_stacked_gemm_where_the_source_allows(mode, monkeypatch):
    """Traced code has no version counter: a group takes the stacked GEMM there only where its parent's forward calls
    the members in order on one argument with nothing between that could change it (read from the source); the
    compiled outputs equal eager's bitwise either way (the torch path computes a column alike whatever N)."""
    model = ae.quantize_linear_(_model(), mode, fuse=True)
    assert model.layers[0].self_attn.q_proj._siblings.traced_ok and model.layers[0].mlp.up_proj._siblings.traced_ok
    x = torch.randn(2, 16, D, dtype=torch.bfloat16)
    compiled = torch.compile(copy.deepcopy(model), backend="aot_eager", fullgraph=True)
    calls = _count_gemms(monkeypatch)
    with torch.no_grad():
        got = compiled(x)  # traced here: the count is the graph's GEMMs
        assert [c[0] for c in calls] == [128, 64, 256, 64] * 2 + [96]
        assert_bitwise_equal(got, model(x), "compiled vs eager")
    torch.manual_seed(4)
    block = ae.quantize_linear_(_Mutating().to(torch.bfloat16), mode, fuse=True)
    assert block.gate_proj._siblings is not None and not block.gate_proj._siblings.traced_ok
    compiled = torch.compile(copy.deepcopy(block), backend="aot_eager", fullgraph=True)
    calls.clear()
    with torch.no_grad():
        got = compiled(x.clone())
        assert [c[0] for c in calls] == [32, 32]  # each member alone
        assert_bitwise_equal(got, block(x.clone()), "compiled vs eager, input changed in place")


def _source_cases():
    class Base(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def case(forward):
        return type("Case", (Base,), {"forward": forward})()

    def plain(self, x):
        return self.a(x).view(2, -1).transpose(0, 1), self.b(x)

    def activation(self, x):
        return torch.relu(self.a(x)) * self.b(x)

    def mutates(self, x):
        y = self.a(x)
        x.add_(1)
        return y, self.b(x)

    def passes_it_on(self, x):
        y = self.a(x)
        z = torch.sigmoid(x)
        return y, self.b(x), z

    def rebinds(self, x):
        y = self.a(x)
        x = x * 2
        return y, self.b(x)

    def two_inputs(self, x, h):
        return self.a(x), self.b(h)

    def reversed_order(self, x):
        y = self.b(x)
        return self.a(x), y

    def twice(self, x):
        return self.a(x), self.a(x), self.b(x)

    def stores(self, x):
        y = self.a(x)
        self.cache = y
        return y, self.b(x)

    def keyword_out(self, x):
        return torch.add(self.a(x), 1, out=self.a.weight), self.b(x)

    def stores_item(self, x):
        self.buf[0] = self.a(x)
        return self.b(x)

    def walrus(self, x):
        y = self.a(x)
        if (z := y.sum()) > 0:
            pass
        return y, self.b(x), z

    expected = {plain: True, activation: True, mutates: False, passes_it_on: False, rebinds: False,
                two_inputs: False, reversed_order: False, twice: False, stores: False, keyword_out: False,
                stores_item: False, walrus: False}
    return [(f.__name__, case(f), want) for f, want in expected.items()]


@pytest.mark.parametrize("name, parent, want", _source_cases(), ids=[c[0] for c in _source_cases()])
def test_the_source_rule_for_traced_code(name, parent, want):
    assert backend.calls_on_one_input(parent, ("a", "b")) is want
    assert backend.calls_on_one_input(torch.nn.Module(), ("a", "b")) is False  # nothing to read


def test_the_source_rule_reads_an_instance_level_forward():
    parent = _source_cases()[0][1]  # a qualifying class
    assert backend.calls_on_one_input(parent, ("a", "b"))

    def patched(x):
        y = parent.a(x)
        x.add_(1)
        return y, parent.b(x)

    parent.forward = patched  # what runs now: not read as qualifying (not even the self.<name> form)
    assert not backend.calls_on_one_input(parent, ("a", "b"))


def test_groups_that_cannot_form_stay_apart_and_say_why(caplog):
    model = _model()
    model.layers[0].self_attn.k_proj = torch.nn.Linear(32, 32, bias=False).to(torch.bfloat16)  # other in_features
    model.layers[1].mlp.up_proj = torch.nn.Linear(D, 128).to(torch.bfloat16)                  # a bias, gate none
    model.layers[1].self_attn.v_proj = model.layers[1].self_attn.k_proj                        # shared
    with caplog.at_level(logging.INFO, logger="astrai.extension"):
        ae.quantize_linear_(model, "w8a8", fuse=True, skip=["layers.0.mlp.up_proj"])
    text = caplog.text
    assert "layers.0.self_attn.{q_proj,k_proj,v_proj} not fused: in_features differ ([64, 32, 64])" in text
    assert "layers.1.mlp.{gate_proj,up_proj} not fused: only some have a bias" in text
    assert "layers.1.self_attn.{q_proj,k_proj,v_proj} not fused: a layer is shared" in text
    assert "quantize_linear_: fused" not in text  # no group formed
    for layer in model.layers:
        for m in (layer.self_attn.q_proj, layer.mlp.gate_proj):
            assert m._siblings is None
    # the skipped layer leaves its group incomplete: silently apart
    assert type(model.layers[0].mlp.up_proj) is torch.nn.Linear
    x = torch.randn(2, D, dtype=torch.bfloat16)
    with torch.no_grad():
        model.layers[1](x)  # runs


def test_custom_groups_and_bad_arguments():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wq, self.wk, self.wv = (torch.nn.Linear(D, 32, bias=False) for _ in range(3))

    block = ae.quantize_linear_(Block().to(torch.bfloat16), "w8a16", fuse=[("wq", "wk", "wv")])
    assert block.wk._siblings.names == ("wq", "wk", "wv")
    assert ae.quantize_linear_(Block().to(torch.bfloat16), "w8a16", fuse=True).wq._siblings is None
    for bad in ("q_proj", [("q_proj",)], [("a", "a")], [("a.b", "c")], [3], 7):
        with pytest.raises(TypeError, match="quantize_linear_: fuse must be a bool or an iterable of tuples"):
            ae.quantize_linear_(Block().to(torch.bfloat16), "w8a16", fuse=bad)
