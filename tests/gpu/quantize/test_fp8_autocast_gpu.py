"""Tier 1 (GPU): fp8_autocast on CUDA through the aten::linear kernel it registers at AutogradCUDA / CUDA. A
training step against bf16 for every recipe; the registration only inside the context, inference_mode routed
too; delayed scaling with the fold kernel bit-for-bit (outputs, gradients, scales, rings, slots) against the
Python ring it replaced, over a training loop, with a negative control; no host sync in a delayed-scaling step.
"""

from __future__ import annotations

import pytest
import torch

import astrai.extension as ae
from support.fp8_training import DELAYED, DELAYED_IDS, assert_same_training, train

pytestmark = [pytest.mark.gpu, pytest.mark.requires_cuda_kernels("quantize")]

DEVICE = "cuda"
WIDTHS, BATCH = (256, 512, 128), (4, 32)  # the training loop of the bitwise ring comparison


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def registered() -> list[bool]:
    return [torch._C._dispatch_has_kernel_for_dispatch_key("aten::linear", k) for k in ("AutogradCUDA", "CUDA")]


def _fp8_unserved() -> str | None:
    """Why quant_gemm's kernels cannot run fp8_autocast's GEMMs under this image (None: they can), e.g. the compute_80
    PTX image: no fp8 mma code."""
    from astrai.extension.backend import quantize as backend
    e4m3 = torch.zeros(16, 16, device=DEVICE, dtype=torch.float8_e4m3fn)
    unit = torch.ones((), device=DEVICE)
    return backend.fp8_gemm_blocker(e4m3, e4m3, unit, unit, None)


def _mlp_and_input():
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).to(
        DEVICE, torch.bfloat16)
    return model, torch.randn(4, 64, 256, device=DEVICE, dtype=torch.bfloat16)


def _fp8_steps(model, x, recipe, steps: int) -> torch.Tensor:
    """`steps` training steps under one fp8_autocast context (its delayed-scaling history carries over); the last
    step's output, the gradients left in the parameters."""
    ctx = ae.fp8_autocast(recipe=recipe)
    for _ in range(steps):
        model.zero_grad()
        with ctx:
            out = model(x)
        out.float().pow(2).mean().backward()
    return out


@pytest.mark.parametrize("recipe", [ae.DelayedScaling(), ae.DynamicScaling(), ae.DynamicScaling("row")],
                         ids=["delayed", "dynamic-tensor", "dynamic-row"])
def test_fp8_autocast_training_step_matches_bf16(recipe):
    model, x = _mlp_and_input()
    model(x).float().pow(2).mean().backward()
    want = [p.grad.clone() for p in model.parameters()]
    want_out = model(x)
    out = _fp8_steps(model, x, recipe, 3)
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

@pytest.mark.parametrize("recipe", DELAYED, ids=DELAYED_IDS)
def test_delayed_training_loop_matches_the_python_ring_bitwise(recipe):
    steps = 3 * recipe.amax_history_len + 4
    want = train(recipe, DEVICE, steps, "python", widths=WIDTHS, batch=BATCH)
    got = train(recipe, DEVICE, steps, widths=WIDTHS, batch=BATCH)
    assert_same_training(got, want)


def test_negative_control_stale_scale_inv_is_detected():
    want = train(DELAYED[0], DEVICE, 8, "python", widths=WIDTHS, batch=BATCH)
    bad = train(DELAYED[0], DEVICE, 8, "stale", widths=WIDTHS, batch=BATCH)
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


@pytest.mark.requires_cuda_kernels("gemm")
@pytest.mark.parametrize("recipe", [ae.DelayedScaling(), ae.DynamicScaling(), ae.DynamicScaling("row")],
                         ids=["delayed", "dynamic-tensor", "dynamic-row"])
def test_every_fp8_gemm_runs_on_quant_gemm_and_matches_scaled_mm(recipe, monkeypatch):
    """Forward, dgrad and wgrad on our kernels (no fallback to torch._scaled_mm recorded), and the step's output and
    gradients equal the _scaled_mm route's up to float32 summation order."""
    from astrai.extension import _fallbacks
    from astrai.extension.backend import quantize as backend
    reason = _fp8_unserved()
    if reason is not None:  # e.g. the compute_80 PTX image: no fp8 mma code
        pytest.skip(f"quant_gemm's kernels do not serve fp8 here: {reason}")

    def step():
        torch.manual_seed(0)
        model, x = _mlp_and_input()
        x.requires_grad_(True)  # else autograd skips the first layer's dgrad
        out = _fp8_steps(model, x, recipe, 2)
        return [out.detach(), x.grad.clone()] + [p.grad.clone() for p in model.parameters()]

    calls = []
    real = backend._gemm.quant_gemm
    monkeypatch.setattr(backend._gemm, "quant_gemm", lambda *a, **kw: calls.append(kw["path"]) or real(*a, **kw))
    _fallbacks.reset()
    ours = step()
    assert calls == ["cuda"] * 12  # two steps x two layers x (forward, dgrad, wgrad)
    assert not [f for f in _fallbacks.snapshot()["reasons"] if f["op"] == "fp8_autocast"]
    monkeypatch.setattr(backend, "fp8_gemm_blocker", lambda *args: "forced: the torch._scaled_mm route")
    theirs = step()
    # x's gradient (1) and the first layer's weight gradient (2) are built from the first layer's output gradient,
    # quantized to e5m2 (2 mantissa bits) after the second layer's dgrad: a last-bit difference there (summation
    # order, which the plan sets) flips a rounding step of up to 25%. Measured: x's 2.1% on the H200, the weight's
    # 2.1% on an H100 (2026-12-05; < 1% on the H200); the rest (the output, the sums over tokens) < 1%.
    for i, (a, b) in enumerate(zip(ours, theirs)):
        rel = ((a.float() - b.float()).norm() / b.float().norm()).item()
        tolerance = 4e-2 if i in (1, 2) else 1e-2
        assert rel < tolerance, f"tensor {i}: relative difference {rel} between quant_gemm and torch._scaled_mm"


@pytest.mark.parametrize("recipe", [ae.DelayedScaling(), ae.DynamicScaling(), ae.DynamicScaling("row")],
                         ids=["delayed", "dynamic-tensor", "dynamic-row"])
def test_small_transformer_tracks_its_bf16_loss_curve(recipe):
    """A 2-layer transformer LM trained 300 AdamW steps in bf16 with every projection in fp8: its loss curve (window
    means of 25 steps) within 3% of the bf16 run's; every projection routed; no fallback to torch._scaled_mm where
    quant_gemm serves fp8 (else, as under the compute_80 PTX image, every fallback names the image's reason)."""
    from support.fp8_training import curve_gap, train_lm

    from astrai.extension import _fallbacks
    unserved = _fp8_unserved()
    want, _ = train_lm(None, DEVICE, 300, torch.bfloat16)
    _fallbacks.reset()
    got, routed = train_lm(recipe, DEVICE, 300, torch.bfloat16)
    assert routed == 9
    assert want[-1] < want[0] - 1.0
    gap = curve_gap(got, want, 25)
    print(f"{type(recipe).__name__}: loss curve gap {gap:.4f}, final {got[-1]:.4f} vs bf16 {want[-1]:.4f}")
    assert gap < 0.03
    reasons = {f["reason"] for f in _fallbacks.snapshot()["reasons"] if f["op"] == "fp8_autocast"}
    assert reasons == ({unserved} if unserved else set()), reasons


def test_info_names_the_fp8_gemm_of_this_image():
    """`info`'s "fp8 gemm" line: quant_gemm where the image has fp8 code for the GPU, else torch._scaled_mm with why
    (ASTRAI_IMAGE=ptx80: compute_80 PTX only)."""
    from astrai.extension import loader
    from astrai.extension.backend import gemm as gemm_backend
    state = loader.describe()["policy"]["fp8_gemm"]
    a = torch.zeros(16, 16, device=DEVICE, dtype=torch.float8_e4m3fn)
    served = gemm_backend.cuda_blocker(a, a) is None
    assert state["runs"] == ("quant_gemm" if served else "torch._scaled_mm"), state
    assert bool(state["why"]) == (not served)
