"""Tier 0 (CPU): the fp8 strategy layer. `fp8_autocast(devices=("cpu",))` registers its aten::linear kernel at
AutogradCPU / CPU, so the dispatch is exercised here with torch's CPU `_scaled_mm` and the torch quantize path
(a stand-in fp8 Function where only the routing is under test). Covers: a training step against high precision;
the registration's life (nothing at import, only inside the outermost context, gone after it, after an
exception, per device, nested and disabled contexts, other threads); the calls that stay plain (bitwise, forward
and backward); and delayed scaling's device ring bit-for-bit against the Python ring it replaced, over a
training loop.
"""

from __future__ import annotations

import copy
import gc
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

import astrai.extension as ae
from astrai.extension.backend import quantize as backend
from support.fp8_training import DELAYED, DELAYED_IDS, assert_same_training, train

KEYS = {"cpu": ("AutogradCPU", "CPU"), "cuda": ("AutogradCUDA", "CUDA")}


def registered(device: str) -> list[bool]:
    """Whether aten::linear carries a kernel registered directly at each of the device's two dispatch keys."""
    return [torch._C._dispatch_has_kernel_for_dispatch_key("aten::linear", k) for k in KEYS[device]]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


class StandIn(torch.autograd.Function):
    """Records that the fp8 path ran (forward and backward) and computes the plain float math."""
    calls: list[str] = []

    @staticmethod
    def forward(ctx, x2, weight, bias, recipe, state, gemm):
        StandIn.calls.append("forward")
        ctx.save_for_backward(x2, weight)
        ctx.has_bias = bias is not None
        out = x2 @ weight.t()
        return out + bias if bias is not None else out

    @staticmethod
    def backward(ctx, grad):
        StandIn.calls.append("backward")
        x2, weight = ctx.saved_tensors
        return grad @ weight, grad.t() @ x2, grad.sum(0) if ctx.has_bias else None, None, None, None


@pytest.fixture
def stand_in(monkeypatch):
    StandIn.calls = []
    monkeypatch.setattr(backend, "_Fp8Linear", StandIn)
    return StandIn.calls


@pytest.fixture
def plain_calls(monkeypatch):
    """The threads in which the registered kernel took the plain path (aten::linear's own kernel)."""
    calls = []

    class Counting:
        @staticmethod
        def decompose(*args):
            calls.append(threading.current_thread().name)
            return torch.ops.aten.linear.default.decompose(*args)

    monkeypatch.setattr(backend, "_LINEAR", Counting)
    return calls


@pytest.fixture(autouse=True)
def nothing_left_registered():
    yield
    assert backend.routed_devices() == () and not any(registered("cpu") + registered("cuda"))
    assert not getattr(backend._local, "stack", [])


# --- numerics ----------------------------------------------------------------------------------------------------

RECIPES = [ae.DelayedScaling(), ae.DelayedScaling(amax_history_len=3, margin=1, fp8_format="e4m3"),
           ae.DynamicScaling(), ae.DynamicScaling("row")]
RECIPE_IDS = ["delayed", "delayed-e4m3-margin", "dynamic-tensor", "dynamic-row"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_fp8_autocast_training_step_matches_high_precision(recipe, dtype):
    lin = torch.nn.Linear(64, 48).to(dtype)
    x = torch.randn(2, 16, 64, dtype=dtype, requires_grad=True)
    lin(x).float().pow(2).mean().backward()
    want = (x.grad.clone(), lin.weight.grad.clone(), lin.bias.grad.clone())
    ctx = ae.fp8_autocast(recipe=recipe, devices=("cpu",))
    for _ in range(3):  # delayed scaling: step 1 dynamic, then from the history
        x.grad = None
        lin.zero_grad()
        with ctx:
            out = lin(x)
        out.float().pow(2).mean().backward()  # outside the context: the graph was recorded inside
    assert out.dtype == dtype and out.shape == (2, 16, 48)
    assert _rel(out, lin(x)) < 0.08  # e4m3 operands: about 2^-4 relative per element
    for got, ref_grad, name in zip((x.grad, lin.weight.grad, lin.bias.grad), want, ("x", "weight", "bias")):
        assert got is not None and got.dtype == dtype, name
        assert _rel(got, ref_grad) < 0.15, f"grad {name}: {_rel(got, ref_grad)}"


# --- the registration's life -------------------------------------------------------------------------------------

def test_importing_registers_nothing():
    code = ("import torch, astrai.extension, astrai.extension.quantize\n"
            "from torch.overrides import _get_current_function_mode_stack\n"
            "assert not _get_current_function_mode_stack()\n"
            "for key in ('AutogradCUDA', 'CUDA', 'AutogradCPU', 'CPU'):\n"
            "    assert not torch._C._dispatch_has_kernel_for_dispatch_key('aten::linear', key), key\n"
            "assert astrai.extension.quantize.fp8_autocast(devices=('cpu',)).states == {}\n"  # constructing either
            "assert not torch._C._dispatch_has_kernel_for_dispatch_key('aten::linear', 'AutogradCPU')\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_registered_only_inside_and_only_for_listed_devices():
    assert registered("cuda") == [False, False] and registered("cpu") == [False, False]
    with ae.fp8_autocast():  # default ("cuda",): registers at AutogradCUDA and CUDA, even without a GPU
        assert registered("cuda") == [True, True] and registered("cpu") == [False, False]
        assert backend.routed_devices() == ("cuda",)
    assert registered("cuda") == [False, False]
    with ae.fp8_autocast(devices=("cpu", "cuda")):
        assert registered("cuda") == [True, True] and registered("cpu") == [True, True]
    assert backend.routed_devices() == ()


def test_nested_contexts_keep_the_registration_until_the_outermost_leaves(stand_in):
    lin, x = torch.nn.Linear(64, 48), torch.randn(16, 64)
    outer, inner = ae.fp8_autocast(devices=("cpu",)), ae.fp8_autocast(devices=("cpu",))
    with outer:
        with inner:
            lin(x)
            with outer:  # the same object re-entered
                lin(x)
            assert registered("cpu") == [True, True]
        assert registered("cpu") == [True, True]
        lin(x)
    assert registered("cpu") == [False, False] and stand_in == ["forward"] * 3
    lin(x)
    assert stand_in == ["forward"] * 3


def test_disabled_context_runs_the_plain_linear_even_inside_an_enabled_one(stand_in):
    lin, x = torch.nn.Linear(64, 48), torch.randn(16, 64)
    plain = lin(x)
    with ae.fp8_autocast(enabled=False, devices=("cpu",)):
        assert registered("cpu") == [False, False]  # nothing enabled: nothing registered
        assert torch.equal(lin(x), plain)
    with ae.fp8_autocast(devices=("cpu",)):
        lin(x)
        with ae.fp8_autocast(enabled=False, devices=("cpu",)):
            assert torch.equal(lin(x), plain)
        lin(x)
    assert stand_in == ["forward", "forward"]


def test_an_exception_inside_unregisters():
    ctx = ae.fp8_autocast(devices=("cpu",))
    with pytest.raises(RuntimeError, match="inside"):
        with ctx:
            with ae.fp8_autocast(devices=("cpu", "cuda")):
                raise RuntimeError("inside")
    assert registered("cpu") == [False, False] and registered("cuda") == [False, False]
    with ctx:  # and the object can be used again
        assert registered("cpu") == [True, True]


def test_routes_linear_from_every_entry_point_forward_and_backward(stand_in):
    lin = torch.nn.Linear(64, 48)
    x = torch.randn(2, 16, 64, requires_grad=True)
    with ae.fp8_autocast(devices=("cpu",)):
        y = lin(x) + torch.nn.functional.linear(x, lin.weight) + torch.ops.aten.linear(x, lin.weight, lin.bias)
        assert y.shape == (2, 16, 48)
        with torch.no_grad():
            lin(x)
        with torch.inference_mode():  # skips the autograd keys: the backend-key registration serves it
            lin(x.detach())
    assert stand_in == ["forward"] * 5
    y.sum().backward()  # backward outside the context still runs the fp8 backward
    assert stand_in.count("backward") == 3 and x.grad is not None and lin.weight.grad is not None


def test_calls_it_cannot_route_are_bitwise_plain_forward_and_backward(stand_in, plain_calls):
    """Inside the context, a call the GEMM cannot take runs aten::linear's own kernel: the same bits and the
    same autograd graph as outside."""
    cases = [(torch.nn.Linear(64, 40), torch.randn(16, 64)),                        # N % 16 != 0
             (torch.nn.Linear(24, 48), torch.randn(16, 24)),                        # K % 16 != 0
             (torch.nn.Linear(64, 48), torch.randn(5, 64)),                         # M % 16 != 0
             (torch.nn.Linear(64, 48).double(), torch.randn(16, 64).double()),      # float64
             (torch.nn.Linear(64, 48, bias=False), torch.randn(64))]                # 1-D x
    for lin, x in cases:
        x.requires_grad_(True)
        grads = []
        for inside in (False, True):
            x.grad = None
            lin.zero_grad()
            if inside:
                with ae.fp8_autocast(devices=("cpu",)):
                    y = lin(x)
            else:
                y = lin(x)
            y.pow(2).sum().backward()
            grads.append((y, type(y.grad_fn).__name__, x.grad, lin.weight.grad))
        (y0, fn0, *g0), (y1, fn1, *g1) = grads
        assert fn0 == fn1 and torch.equal(_bits(y0), _bits(y1))
        assert all(torch.equal(_bits(a), _bits(b)) for a, b in zip(g0, g1))
    assert stand_in == [] and len(plain_calls) == len(cases)  # the kernel ran, and chose the plain path


def test_tensor_subclasses_and_other_devices_stay_plain(stand_in):
    class Tagged(torch.Tensor):
        pass

    lin, x = torch.nn.Linear(64, 48), torch.randn(16, 64)
    with ae.fp8_autocast(devices=("cpu",)):
        y = lin(x.as_subclass(Tagged))
    with ae.fp8_autocast():  # devices ("cuda",): a CPU call is not routed
        lin(x)
    assert stand_in == [] and torch.equal(y.as_subclass(torch.Tensor), lin(x))


def test_other_threads_run_the_plain_linear(stand_in, plain_calls):
    lin, x = torch.nn.Linear(64, 48), torch.randn(16, 64)
    plain = lin(x)
    seen = {}
    entered, done = threading.Event(), threading.Event()

    def other():
        entered.wait()
        seen["equal"] = torch.equal(lin(x), plain)  # the kernel is registered, this thread has no context
        done.set()

    thread = threading.Thread(target=other, name="other")
    thread.start()
    with ae.fp8_autocast(devices=("cpu",)):
        entered.set()
        done.wait(30)
        lin(x)
    thread.join()
    assert seen == {"equal": True} and stand_in == ["forward"] and plain_calls == ["other"]


def test_delayed_state_is_dropped_with_its_weight():
    ctx = ae.fp8_autocast(devices=("cpu",))
    lin = torch.nn.Linear(32, 16)
    with ctx:
        lin(torch.randn(16, 32))
    assert list(ctx.states) == [id(lin.weight)]
    del lin
    gc.collect()
    assert ctx.states == {}


def test_recipes_and_devices_validate():
    with pytest.raises(ValueError, match="amax_history_len must be >= 1"):
        ae.DelayedScaling(amax_history_len=0)
    with pytest.raises(ValueError, match="fp8_format must be one of"):
        ae.DelayedScaling(fp8_format="e5m2")
    with pytest.raises(ValueError, match="granularity must be 'tensor' or 'row'"):
        ae.DynamicScaling("block")
    with pytest.raises(ValueError, match="recipe must be DelayedScaling or DynamicScaling"):
        ae.fp8_autocast(recipe="hybrid")
    with pytest.raises(ValueError, match=r"devices must be a non-empty tuple of \('cpu', 'cuda'\)"):
        ae.fp8_autocast(devices=("mps",))


# --- delayed scaling: the device ring against the Python ring it replaced --------------------------------------------

@pytest.mark.parametrize("recipe", DELAYED, ids=DELAYED_IDS)
def test_delayed_training_loop_matches_the_python_ring_bitwise(recipe):
    steps = 3 * recipe.amax_history_len + 4
    want = train(recipe, "cpu", steps, "python")
    got = train(recipe, "cpu", steps)
    assert_same_training(got, want)


def test_negative_control_stale_scale_inv_is_detected():
    recipe = DELAYED[0]
    want = train(recipe, "cpu", 8, "python")
    bad = train(recipe, "cpu", 8, "stale")
    with pytest.raises(AssertionError, match="differs"):
        assert_same_training(bad, want)


def test_delayed_first_step_dynamic_then_the_ring():
    ctx = ae.fp8_autocast(recipe=ae.DelayedScaling(amax_history_len=3), devices=("cpu",))
    lin = torch.nn.Linear(32, 16, bias=False)
    amaxes = []
    for step in range(5):
        x = torch.randn(16, 32) * (step + 1)
        amaxes.append(x.abs().amax().item())
        with ctx:
            lin(x)
        if step == 0:
            state = ctx.states[id(lin.weight)][1]
            assert state["g"].scale() is None  # no backward ran: the gradient role has no history yet
    hist = state["x"].amax_history
    # steps 0..4 into a ring of 3: slots hold steps 3, 4, 2
    assert state["x"].steps == 5 and int(hist.pos) == 5 % 3
    assert hist.ring.tolist() == [amaxes[3], amaxes[4], amaxes[2]]
    assert state["x"].scale().item() == (torch.tensor([448.0]) / torch.tensor([max(amaxes[2:])])).item()
    assert state["w"].steps == 5 and torch.all(state["w"].amax_history.ring == lin.weight.abs().amax())


def test_each_weight_has_its_own_state():
    """A deep copy of a module has its own weight, hence its own histories."""
    ctx = ae.fp8_autocast(devices=("cpu",))
    a = torch.nn.Linear(32, 16)
    b = copy.deepcopy(a)
    with ctx:
        a(torch.randn(16, 32))
        b(torch.randn(16, 32) * 100)
    sa, sb = (ctx.states[id(m.weight)][1]["x"].amax_history for m in (a, b))
    assert sa is not sb and not torch.equal(sa.ring, sb.ring)


# --- the GEMM each fp8 product runs on ---------------------------------------------------------------------------

@pytest.fixture
def ours_on_cpu(monkeypatch):
    """fp8_autocast's GEMMs sent to `quant_gemm` (its torch path: the contract's math) as if its kernels served
    them; returns the recorded (a.dtype, b.dtype, a.shape, b.shape, a_scale.shape, b_scale.shape, bias, out_dtype)."""
    calls = []

    def quant_gemm(a, b, *, a_scale, b_scale, bias, out_dtype, path):
        assert path == "cuda"
        calls.append((a.dtype, b.dtype, tuple(a.shape), tuple(b.shape), tuple(a_scale.shape), tuple(b_scale.shape),
                      bias is not None, out_dtype))
        return ae.quant_gemm(a, b, a_scale=a_scale, b_scale=b_scale, bias=bias, out_dtype=out_dtype, path="torch")

    monkeypatch.setattr(backend, "fp8_gemm_blocker", lambda *args: None)
    monkeypatch.setattr(backend._gemm, "quant_gemm", quant_gemm)
    return calls


def _fp8_step(recipe, dtype, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(64, 48).to(dtype)
    x = torch.randn(32, 64, dtype=dtype, requires_grad=True)
    ctx = ae.fp8_autocast(recipe=recipe, devices=("cpu",))
    outs = []
    for _ in range(3):
        x.grad = None
        lin.zero_grad()
        with ctx:
            out = lin(x)
        out.float().pow(2).mean().backward()
        outs.append((out.detach().clone(), x.grad.clone(), lin.weight.grad.clone(), lin.bias.grad.clone()))
    return outs


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("recipe", RECIPES, ids=RECIPE_IDS)
def test_quant_gemm_route_matches_scaled_mm(recipe, dtype, ours_on_cpu):
    """The forward, dgrad and wgrad GEMMs given to quant_gemm (operands, scales, bias, output dtype) compute what
    torch._scaled_mm computes from the same quantized operands: equal up to float32 summation order."""
    ours = _fp8_step(recipe, dtype)
    assert len(ours_on_cpu) == 9  # three steps of forward, dgrad, wgrad
    fwd = ours_on_cpu[0]
    assert fwd[2:4] == ((32, 64), (48, 64)) and fwd[6] and fwd[7] == dtype
    rowwise = isinstance(recipe, ae.DynamicScaling) and recipe.granularity == "row" and dtype == torch.bfloat16
    assert fwd[4:6] == (((32, 1), (1, 48)) if rowwise else ((), ()))
    fwd_dtype, bwd_dtype = backend._FORMATS[recipe.fp8_format]
    assert ours_on_cpu[1][:4] == (bwd_dtype, torch.float8_e4m3fn, (32, 48), (64, 48))  # dgrad: g x (W^T)^T
    assert ours_on_cpu[2][:4] == (bwd_dtype, torch.float8_e4m3fn, (48, 32), (64, 32))  # wgrad: g^T x (x^T)^T
    assert not ours_on_cpu[1][6] and not ours_on_cpu[2][6]
    ours_on_cpu.clear()
    backend.fp8_gemm_blocker, saved = (lambda *args: "forced: the torch._scaled_mm route"), backend.fp8_gemm_blocker
    try:
        theirs = _fp8_step(recipe, dtype)
    finally:
        backend.fp8_gemm_blocker = saved
    assert not ours_on_cpu
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5  # one rounding of the output apart at most
    for step_ours, step_theirs in zip(ours, theirs):
        for a, b in zip(step_ours, step_theirs):
            assert _rel(a, b) < tol


def test_scaled_mm_fallback_is_recorded_with_its_reason():
    from astrai.extension import _fallbacks
    lin = torch.nn.Linear(32, 16)
    with ae.fp8_autocast(recipe=ae.DynamicScaling(), devices=("cpu",)):
        lin(torch.randn(16, 32))
    seen = [f for f in _fallbacks.snapshot()["reasons"] if f["op"] == "fp8_autocast"]
    assert seen and seen[0]["backend"] == "torch._scaled_mm" and "not a CUDA device" in seen[0]["reason"]


# --- a small transformer trained under fp8_autocast ---------------------------------------------------------------

LM_STEPS, LM_WINDOW, LM_TOLERANCE = 120, 20, 0.01  # loss curves within 1% (window means of 20 steps)


@pytest.mark.parametrize("recipe", [ae.DelayedScaling(), ae.DynamicScaling("row")], ids=["delayed", "dynamic-row"])
def test_small_transformer_tracks_its_high_precision_loss_curve(recipe, ours_on_cpu):
    """Every projection of a 2-layer transformer LM (attention in / out, MLP, head) in fp8 for 120 AdamW steps: the
    loss curve stays within 1% of the same run without fp8; a changed learning rate is caught (negative control).
    The GEMMs take quant_gemm's route (its torch path here): torch's CPU `_scaled_mm` takes ~0.3 s a call on some
    x86 hosts (AMX), 3000 calls here."""
    from support.fp8_training import curve_gap, train_lm
    want, _ = train_lm(None, "cpu", LM_STEPS, torch.float32)
    got, routed = train_lm(recipe, "cpu", LM_STEPS, torch.float32)
    assert routed == 9  # 2 x (attention in / out, two MLP linears) + the head: every projection in fp8
    assert want[-1] < want[0] - 1.0  # it learned
    assert curve_gap(got, want, LM_WINDOW) < LM_TOLERANCE
    slower, _ = train_lm(None, "cpu", LM_STEPS, torch.float32, lr=1.5e-3)
    assert curve_gap(slower, want, LM_WINDOW) > LM_TOLERANCE


def test_fp8_gradients_against_float64():
    """One fp8 step's gradients of a small layer against float64 autograd: within e4m3 / e5m2 quantization error."""
    lin = torch.nn.Linear(64, 32)
    x = torch.randn(48, 64, requires_grad=True)
    lin64 = copy.deepcopy(lin).double()
    x64 = x.detach().double().requires_grad_()
    lin64(x64).pow(2).mean().backward()
    with ae.fp8_autocast(recipe=ae.DynamicScaling(), devices=("cpu",)):
        out = lin(x)
    out.pow(2).mean().backward()
    for got, want, name in ((x.grad, x64.grad, "x"), (lin.weight.grad, lin64.weight.grad, "weight"),
                            (lin.bias.grad, lin64.bias.grad, "bias")):
        rel = _rel(got, want)
        assert rel < 0.15, f"grad {name}: relative error {rel} against float64"


def test_gemm_choice(ours_on_cpu):
    """gemm="scaled_mm" never asks quant_gemm; gemm="quant_gemm" raises the reason where ours cannot run; a bad
    value is refused."""
    lin = torch.nn.Linear(32, 16)
    x = torch.randn(16, 32, requires_grad=True)
    with ae.fp8_autocast(recipe=ae.DynamicScaling(), devices=("cpu",), gemm="scaled_mm"):
        out = lin(x)
    out.sum().backward()
    assert ours_on_cpu == []
    with ae.fp8_autocast(recipe=ae.DynamicScaling(), devices=("cpu",), gemm="quant_gemm"):
        lin(x).sum().backward()
    assert len(ours_on_cpu) == 3  # forward, dgrad, wgrad (the fixture lets ours run on the CPU)
    backend.fp8_gemm_blocker, saved = (lambda *args: "a is on cpu, not a CUDA device"), backend.fp8_gemm_blocker
    try:
        with pytest.raises(ValueError, match=r"fp8_autocast\(gemm='quant_gemm'\): quant_gemm's kernels cannot run"):
            with ae.fp8_autocast(recipe=ae.DynamicScaling(), devices=("cpu",), gemm="quant_gemm"):
                lin(x)
    finally:
        backend.fp8_gemm_blocker = saved
    with pytest.raises(ValueError, match=r"gemm must be one of \('auto', 'quant_gemm', 'scaled_mm'\), got 'cublas'"):
        ae.fp8_autocast(gemm="cublas")
