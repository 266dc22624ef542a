"""Tier 1 (GPU): fp8_autocast on CUDA through the aten::linear kernel it registers at AutogradCUDA / CUDA. A
training step against bf16 for every recipe; the registration only inside the context, inference_mode routed
too; delayed scaling with the fold kernel bit-for-bit (outputs, gradients, scales, rings, slots) against the
Python ring it replaced, over a training loop, with a negative control; no host sync in a delayed-scaling step.
"""

from __future__ import annotations

import pytest
import torch

import astrai.extension as ae
from astrai.extension.backend import quantize as backend

pytestmark = [pytest.mark.gpu, pytest.mark.requires_cuda_kernels("quantize")]

DEVICE = "cuda"


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def snapshot(t: torch.Tensor) -> torch.Tensor:
    """A host copy, floats as bits."""
    return (_bits(t) if t.is_floating_point() else t.detach()).to("cpu", copy=True)


def registered() -> list[bool]:
    return [torch._C._dispatch_has_kernel_for_dispatch_key("aten::linear", k) for k in ("AutogradCUDA", "CUDA")]


@pytest.mark.parametrize("recipe", [ae.DelayedScaling(), ae.DynamicScaling(), ae.DynamicScaling("row")],
                         ids=["delayed", "dynamic-tensor", "dynamic-row"])
def test_fp8_autocast_training_step_matches_bf16(recipe):
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to(
        DEVICE, torch.bfloat16)
    x = torch.randn(4, 64, 256, device=DEVICE, dtype=torch.bfloat16)
    model(x).float().pow(2).mean().backward()
    want = [p.grad.clone() for p in model.parameters()]
    want_out = model(x)
    ctx = ae.fp8_autocast(recipe=recipe)
    for _ in range(3):
        model.zero_grad()
        with ctx:
            out = model(x)
        out.float().pow(2).mean().backward()
    rel = ((out.float() - want_out.float()).norm() / want_out.float().norm()).item()
    assert rel < 0.08, f"forward: relative error {rel}"
    for i, (p, w) in enumerate(zip(model.parameters(), want)):
        assert p.grad is not None and p.grad.dtype == torch.bfloat16
        rel = ((p.grad.float() - w.float()).norm() / w.float().norm()).item()
        assert rel < 0.2, f"parameter {i}: gradient relative error {rel}"
    # the fp8 path really ran: outside the context the result is the bf16 one
    assert not torch.equal(out, want_out) and torch.equal(model(x), want_out)


def test_registered_only_inside_inference_mode_routed_and_other_calls_plain():
    lin = torch.nn.Linear(256, 128).to(DEVICE, torch.bfloat16)
    odd = torch.nn.Linear(256, 40).to(DEVICE, torch.bfloat16)  # N % 16 != 0: the plain linear, bitwise
    x = torch.randn(64, 256, device=DEVICE, dtype=torch.bfloat16)
    plain, plain_odd = lin(x), odd(x)
    assert registered() == [False, False]
    with ae.fp8_autocast(recipe=ae.DynamicScaling()):
        assert registered() == [True, True]
        inside_odd = odd(x)
        assert type(inside_odd.grad_fn) is type(plain_odd.grad_fn)
        assert torch.equal(_bits(inside_odd), _bits(plain_odd))
        with torch.no_grad():
            routed = lin(x)
        with torch.inference_mode():  # autograd keys skipped: served by the CUDA-key registration
            routed_inference = lin(x)
    assert registered() == [False, False]
    assert not torch.equal(routed, plain) and torch.equal(_bits(routed_inference), _bits(routed))
    assert torch.equal(_bits(lin(x)), _bits(plain))


# --- delayed scaling: the fold kernel against the Python ring it replaced -------------------------------------------

class PythonRing:
    """The model: `DelayedScaling`'s history before the fold op, verbatim (the slot a Python int, a tensor write
    per step, the multiplier recomputed from the ring); it takes `_History`'s arguments."""

    def __init__(self, length: int, device, *, qmax: float = 0.0, margin: int = 0):
        self.ring = torch.zeros(length, dtype=torch.float32, device=device)
        self.pos = 0
        self.steps = 0

    def scale(self, fp8_max: float, margin: int) -> torch.Tensor | None:
        if self.steps == 0:
            return None
        mul, _ = backend.scale_from_amax_torch(self.ring.amax().reshape(1), fp8_max, False)
        return mul / (2.0 ** margin)

    def fold(self, amax: torch.Tensor) -> None:
        self.ring[self.pos] = amax.reshape(())
        self.pos = (self.pos + 1) % self.ring.numel()
        self.steps += 1


def python_quantize_both(t, dtype, recipe, history):
    """The model of `_quantize_both` before the fold op, verbatim: `1.0 / mul` in Python for scale_inv."""
    mul = history.scale(backend.FP8_MAX[dtype], recipe.margin) if history is not None else None
    if mul is None:
        q, q_t, inv = backend.quantize_fp8_dynamic(t, dtype, granularity="tensor", layout="dual")
        if history is not None:
            history.fold(t.detach().abs().amax().float())
        return q, q_t, inv.reshape(())
    q, q_t, amax = backend.quantize_fp8(t, mul, dtype, layout="dual", amax="tensor", check_scale=False)
    history.fold(amax)
    return q, q_t, (1.0 / mul).reshape(())


_device_quantize_both = backend._quantize_both


def stale_inverse_quantize_both(t, dtype, recipe, history):
    """A wrong variant for the negative control: scale_inv read after the fold (the next step's)."""
    mul = history.scale() if history is not None else None
    if mul is None:
        return _device_quantize_both(t, dtype, recipe, history)
    q, q_t, amax = backend.quantize_fp8(t, mul, dtype, layout="dual", amax="tensor", check_scale=False)
    history.fold(amax)
    return q, q_t, history.scale_inv().reshape(())


def train(recipe, steps: int, variant: str = "device"):
    """A small MLP trained with SGD inside one fp8_autocast object; inputs change scale and carry an outlier every
    third step, so the rings' maxima rise and roll out. Returns per step the output and gradients as bits (on the
    host) and the (scale, scale_inv, ring, pos) of every role of every layer."""
    with pytest.MonkeyPatch.context() as patch:
        if variant == "python":
            patch.setattr(backend, "_History", PythonRing)
            patch.setattr(backend, "_quantize_both", python_quantize_both)
        elif variant == "stale":
            patch.setattr(backend, "_quantize_both", stale_inverse_quantize_both)
        gen = torch.Generator().manual_seed(5)
        torch.manual_seed(11)
        model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 128)).to(
            DEVICE, torch.bfloat16)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        ctx = ae.fp8_autocast(recipe=recipe)
        fwd, bwd = (backend.FP8_MAX[d] for d in backend._FORMATS[recipe.fp8_format])
        record = []
        for step in range(steps):
            x = torch.randn(4, 32, 256, generator=gen) * (1.0 + 3.0 * (step % 4))
            if step % 3 == 0:
                x[0, 0, step % 256] = 40.0 * (step + 1)
            x = x.to(DEVICE, torch.bfloat16)
            opt.zero_grad()
            with ctx:
                out = model(x)
            out.float().pow(2).mean().backward()
            states = []
            for layer in (model[0], model[2]):
                for role, qmax in (("x", fwd), ("w", fwd), ("g", bwd)):
                    h = ctx.states[id(layer.weight)][1][role]
                    if variant == "python":
                        mul = h.scale(qmax, recipe.margin)
                        states.append((mul, 1.0 / mul, h.ring, torch.tensor(h.pos)))
                    else:
                        states.append((h.scale(), h.scale_inv(), h.amax_history.ring, h.amax_history.pos))
            # copies: the device state is updated in place by the next step
            record.append(([snapshot(out)] + [snapshot(p.grad) for p in model.parameters()],
                           [[snapshot(t) for t in s] for s in states]))
            opt.step()
        return record


def assert_same_training(got, want):
    for step, ((g_tensors, g_states), (w_tensors, w_states)) in enumerate(zip(got, want)):
        for i, (g, w) in enumerate(zip(g_tensors, w_tensors)):
            assert torch.equal(g, w), f"step {step}: {'output' if i == 0 else f'grad {i - 1}'} differs"
        for j, (gs, ws) in enumerate(zip(g_states, w_states)):
            for name, g, w in zip(("scale", "scale_inv", "ring", "pos"), gs, ws):
                assert torch.equal(g.reshape(-1), w.reshape(-1)), f"step {step}, history {j}: {name} differs"


DELAYED = [ae.DelayedScaling(amax_history_len=4), ae.DelayedScaling(amax_history_len=3, margin=2, fp8_format="e4m3"),
           ae.DelayedScaling(amax_history_len=1)]


@pytest.mark.parametrize("recipe", DELAYED, ids=["len4", "len3-margin2-e4m3", "len1"])
def test_delayed_training_loop_matches_the_python_ring_bitwise(recipe):
    steps = 3 * recipe.amax_history_len + 4
    want = train(recipe, steps, "python")
    got = train(recipe, steps)
    assert_same_training(got, want)


def test_negative_control_stale_scale_inv_is_detected():
    want = train(DELAYED[0], 8, "python")
    bad = train(DELAYED[0], 8, "stale")
    with pytest.raises(AssertionError, match="differs"):
        assert_same_training(bad, want)


def test_delayed_step_does_not_sync_with_the_host():
    """After the first (dynamic) step, a delayed-scaling step (quantize with the device multiplier, fused amax, the
    fold kernel, _scaled_mm, forward and backward) never waits for the GPU."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 128)).to(
        DEVICE, torch.bfloat16)
    x = torch.randn(4, 32, 256, device=DEVICE, dtype=torch.bfloat16)
    ctx = ae.fp8_autocast(recipe=ae.DelayedScaling(amax_history_len=4))
    for _ in range(2):  # step 1 dynamic; step 2 warms the delayed path (cuBLAS handles, workspaces)
        with ctx:
            out = model(x)
        out.float().pow(2).mean().backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            with ctx:
                out = model(x)
            out.float().pow(2).mean().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    hist = ctx.states[id(model[0].weight)][1]["x"]
    assert hist.steps == 5 and int(hist.amax_history.pos) == 5 % 4
