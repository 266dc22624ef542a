"""Tier 1 (GPU): the delayed-scaling ring fold kernel (`astrai.amax_history_fold`) bit-for-bit against the torch
fold on the CPU (itself equal to the Python ring `DelayedScaling` kept before the op,
tests/quantize/test_amax_history.py) and against that Python ring directly: ring, slot, next multiplier and its
reciprocal after every step, on amax sequences with 0, subnormals, inf and NaN, rings longer than the block; no
host sync; a captured CUDA graph of quantize (fused amax) + fold replayed step after step equals the eager
sequence; poisoned outputs; a negative control.
"""

from __future__ import annotations

import pytest
import torch

from astrai.extension import quantize as aq
from astrai.extension.ops import quantize as ops
from support.fp8_training import PythonRing

pytestmark = [pytest.mark.gpu, pytest.mark.requires_cuda_kernels("quantize")]

DEVICE = "cuda"
SPECIALS = [0.0, 1.4e-45, 1e-40, 1.17549435e-38, 3.4028235e38, float("inf"), float("nan"), 448.0, 1.0]


def amax_sequence(steps: int, gen: torch.Generator) -> list[float]:
    out = []
    for _ in range(steps):
        v = float(torch.rand(1, generator=gen)) * 2.0 ** int(torch.randint(-30, 30, (1,), generator=gen))
        if int(torch.randint(0, 4, (1,), generator=gen)) == 0:
            v = SPECIALS[int(torch.randint(0, len(SPECIALS), (1,), generator=gen))]
        out.append(v)
    return out


def bits(t: torch.Tensor) -> list[int]:
    return t.detach().float().reshape(-1).cpu().view(torch.int32).tolist()


@pytest.mark.parametrize("length", [1, 3, 16, 1000])
@pytest.mark.parametrize("margin", [0, 3, 130])
@pytest.mark.parametrize("fmax", [448.0, 57344.0])
def test_kernel_matches_torch_fold(length, margin, fmax):
    gen = torch.Generator().manual_seed(7 * length + margin)
    start = int(torch.randint(-5, 3 * length, (1,), generator=gen))  # any slot, negative too
    ring = torch.rand(length, generator=gen) * 10  # a ring that already holds history
    ring_d = ring.to(DEVICE)
    pos, pos_d = torch.tensor([start]), torch.tensor([start], device=DEVICE)
    scale, scale_inv = torch.zeros(1), torch.zeros(1)
    scale_d = torch.full((1,), float("nan"), device=DEVICE)
    scale_inv_d = torch.full((1,), float("nan"), device=DEVICE)
    for step, a in enumerate(amax_sequence(2 * min(length, 40) + 5, gen)):
        amax = torch.tensor([a], dtype=torch.float32)
        aq.fold_amax_history_torch(ring, pos, scale, amax, qmax=fmax, margin=margin, scale_inv=scale_inv)
        ops.amax_history_fold(ring_d, pos_d, scale_d, amax.to(DEVICE), qmax=fmax, margin=margin, scale_inv=scale_inv_d)
        assert bits(ring_d) == bits(ring), f"ring at step {step}"
        assert int(pos_d) == int(pos), f"pos at step {step}"
        assert bits(scale_d) == bits(scale), f"scale at step {step}: {scale_d.item()} vs {scale.item()}"
        assert bits(scale_inv_d) == bits(scale_inv), f"scale_inv at step {step}"


def test_kernel_matches_python_history_directly():
    model = PythonRing(5, "cpu")
    hist = aq.AmaxHistory(5, qmax=57344.0, margin=2, device=DEVICE)
    gen = torch.Generator().manual_seed(3)
    for a in amax_sequence(17, gen):
        model.fold(torch.tensor([a], dtype=torch.float32))
        hist.fold(torch.tensor([a], dtype=torch.float32, device=DEVICE))
        assert bits(hist.ring) == bits(model.ring) and int(hist.pos) == model.pos
        assert bits(hist.scale) == bits(model.scale(57344.0, 2))
    assert hist.steps == 17


def test_scale_inv_optional_and_negative_control():
    ring, pos = torch.zeros(4, device=DEVICE), torch.zeros(1, dtype=torch.int64, device=DEVICE)
    scale = torch.zeros(1, device=DEVICE)
    ops.amax_history_fold(ring, pos, scale, torch.tensor([7.0], device=DEVICE), qmax=448.0)
    assert scale.item() == 64.0 and ring.tolist() == [7.0, 0.0, 0.0, 0.0] and int(pos) == 1
    ops.amax_history_fold(ring, pos, scale, torch.tensor([14.0], device=DEVICE), qmax=448.0, margin=1)
    assert scale.item() == 16.0  # 448 / 14 / 2
    model_ring, model_pos, model_scale = torch.zeros(4), torch.zeros(1, dtype=torch.int64), torch.zeros(1)
    aq.fold_amax_history_torch(model_ring, model_pos, model_scale, torch.tensor([7.0]), qmax=448.0, margin=0)
    assert bits(model_scale) != bits(scale)  # the comparison sees a wrong margin


def test_fold_does_not_sync_with_the_host():
    ring, pos = torch.zeros(16, device=DEVICE), torch.zeros(1, dtype=torch.int64, device=DEVICE)
    scale, scale_inv, amax = (torch.ones(1, device=DEVICE) for _ in range(3))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            ops.amax_history_fold(ring, pos, scale, amax, qmax=448.0, margin=0, scale_inv=scale_inv)
            aq.fold_amax_history(ring, pos, scale, amax, qmax=448.0, scale_inv=scale_inv)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert int(pos) == 6


def test_cuda_graph_of_quantize_and_fold_replays_the_eager_sequence():
    """One delayed-scaling step (quantize with the current multiplier and a fused amax, then the fold) captured
    once and replayed: each replay must equal the eager step on the same input, state carried on the device."""
    rows, cols, length = 256, 512, 4
    x = torch.randn(rows, cols, device=DEVICE).bfloat16()
    graph_state = aq.AmaxHistory(length, qmax=448.0, margin=1, device=DEVICE)
    eager_state = aq.AmaxHistory(length, qmax=448.0, margin=1, device=DEVICE)
    for state in (graph_state, eager_state):
        state.scale.fill_(3.0)

    def step(state, inp):
        q, q_t, amax = ops.quantize(inp, state.scale, layout="dual", amax="tensor", check_scale=False)
        ops.amax_history_fold(state.ring, state.pos, state.scale, amax, qmax=448.0, margin=1,
                              scale_inv=state.scale_inv)
        return q, q_t

    warm = aq.AmaxHistory(length, qmax=448.0, margin=1, device=DEVICE)  # warm-up on scratch state
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(warm, x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_q, static_q_t = step(graph_state, x)
    # Capture launched nothing: the state is untouched.
    assert int(graph_state.pos) == 0 and graph_state.scale.item() == 3.0
    for trial in range(2 * length + 1):
        x.copy_(torch.randn(rows, cols, device=DEVICE) * (trial + 1))
        want_q, want_q_t = step(eager_state, x)
        static_q.view(torch.uint8).fill_(0xFF)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(static_q.view(torch.uint8), want_q.view(torch.uint8)), f"q at replay {trial}"
        assert torch.equal(static_q_t.view(torch.uint8), want_q_t.view(torch.uint8)), f"q_t at replay {trial}"
        for name in ("ring", "pos", "scale", "scale_inv"):
            g, e = getattr(graph_state, name), getattr(eager_state, name)
            assert torch.equal(g.view(torch.int32) if g.dtype == torch.float32 else g,
                               e.view(torch.int32) if e.dtype == torch.float32 else e), f"{name} at replay {trial}"


def test_fold_rejects_tensors_on_another_device_kind():
    ring = torch.zeros(4, device=DEVICE)
    with pytest.raises(RuntimeError, match=r"astrai\.amax_history_fold: pos must be on the same device as ring"):
        ops.amax_history_fold(ring, torch.zeros(1, dtype=torch.int64), torch.ones(1, device=DEVICE),
                              torch.ones(1, device=DEVICE), qmax=448.0)
    with pytest.raises(RuntimeError, match=r"astrai\.amax_history_fold: amax must be on the same device as ring"):
        ops.amax_history_fold(ring, torch.zeros(1, dtype=torch.int64, device=DEVICE), torch.ones(1, device=DEVICE),
                              torch.ones(1), qmax=448.0)
    assert torch.equal(ring, torch.zeros(4, device=DEVICE))


def test_opcheck_fold():
    args = (torch.zeros(16, device=DEVICE), torch.zeros(1, dtype=torch.int64, device=DEVICE),
            torch.ones(1, device=DEVICE), torch.ones(1, device=DEVICE), torch.tensor([3.0], device=DEVICE), 448.0, 0)
    torch.library.opcheck(torch.ops.astrai.amax_history_fold.default, args)
