"""Tier 1 (GPU): delayed scaling in one launch (`astrai.quantize_delayed`: quantize with the per-tensor multiplier,
fused amax, and the ring fold done by the launch's last block) bit-for-bit against the two-launch sequence
(`quantize(..., amax="tensor")` then `amax_history_fold`) step after step: outputs of every layout and both fp8
formats, this step's amax and 1 / multiplier, ring, slot, next multiplier and its reciprocal; grids of one block
and of thousands (the transposed kernel's both tile sizes, the row kernel's looping grid); x holding NaN / inf;
empty x; the block counter back at 0 after every launch; CUDA-graph replay; `AmaxHistory.quantize` on both paths;
no host sync; bad input; a negative control.
"""

from __future__ import annotations

import pytest
import torch

from astrai.extension import quantize as aq
from astrai.extension.ops import quantize as ops

pytestmark = [pytest.mark.gpu, pytest.mark.requires_cuda_kernels("quantize")]

DEVICE = "cuda"
FP8 = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def i32(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def u8(t: torch.Tensor | None):
    return None if t is None else t.view(torch.uint8)


class State:
    """One ring state on the device (ring with history, slot, multiplier, reciprocal, counter)."""

    def __init__(self, length: int, gen: torch.Generator, start: int):
        self.ring = (torch.rand(length, generator=gen) * 8).to(DEVICE)
        self.pos = torch.tensor([start], device=DEVICE)
        self.scale = torch.tensor([float(torch.rand(1, generator=gen)) * 4 + 0.25], device=DEVICE)
        self.scale_inv = torch.full((1,), float("nan"), device=DEVICE)
        self.workspace = torch.zeros(1, dtype=torch.int32, device=DEVICE)

    def clone(self) -> "State":
        other = object.__new__(State)
        for k, v in vars(self).items():
            setattr(other, k, v.clone())
        return other

    def assert_equal(self, other: "State", what: str) -> None:
        for k in ("ring", "pos", "scale", "scale_inv"):
            assert torch.equal(i32(getattr(self, k)), i32(getattr(other, k))), f"{k} {what}"


def two_launches(x, st: State, dtype, layout, margin):
    inv = torch.div(1.0, st.scale)  # 1 / this step's multiplier, rounded once (IEEE division)
    q, q_t, amax = ops.quantize(x, st.scale, dtype, layout=layout, amax="tensor", check_scale=False)
    ops.amax_history_fold(st.ring, st.pos, st.scale, amax, qmax=FP8[dtype], margin=margin, scale_inv=st.scale_inv)
    return q, q_t, amax, inv


def fused(x, st: State, dtype, layout, margin):
    return ops.quantize_delayed(x, st.scale, st.ring, st.pos, st.workspace, dtype, layout=layout, margin=margin,
                                scale_inv=st.scale_inv)


SHAPES = [(1, 16), (19, 100), (257, 384), (4096, 512), (65536, 256), (3, 8192)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("layout", ["rowwise", "transposed", "dual"])
@pytest.mark.parametrize("dtype", list(FP8), ids=["e4m3", "e5m2"])
def test_fused_equals_two_launches(shape, layout, dtype):
    gen = torch.Generator().manual_seed(shape[0] * 31 + shape[1])
    length, margin = (1 if shape[0] == 19 else 16), (0 if dtype == torch.float8_e4m3fn else 2)
    a = State(length, gen, start=int(torch.randint(-3, 40, (1,), generator=gen)))
    b = a.clone()
    for step in range(4):
        x = (torch.randn(shape, generator=gen) * 10.0 ** (step - 1)).to(torch.bfloat16).to(DEVICE)
        if step == 2:
            x.view(-1)[x.numel() // 2] = float("inf")  # the amax and the ring take inf, the next scale is 1
        want = two_launches(x, a, dtype, layout, margin)
        got = fused(x, b, dtype, layout, margin)
        for name, w, g in zip(("out", "out_t"), want[:2], got[:2]):
            assert (w is None) == (g is None), name
            if w is not None:
                assert torch.equal(u8(g), u8(w)), f"{name} at step {step}"
        assert torch.equal(i32(got[2]), i32(want[2])), f"amax at step {step}"
        assert torch.equal(i32(got[3]), i32(want[3])), f"step scale_inv at step {step}"
        b.assert_equal(a, f"at step {step}")
        assert int(b.workspace) == 0, "the last block resets the counter"


def test_fused_large_transposed_grid():
    """8192 x 8192 dual: the transposed kernel's 16-row tiles (the by-size choice of large grids), 4096 blocks."""
    gen = torch.Generator(device=DEVICE).manual_seed(8)
    a = State(16, torch.Generator().manual_seed(8), start=3)
    b = a.clone()
    for step in range(2):
        x = torch.randn(8192, 8192, generator=gen, device=DEVICE).bfloat16()
        want = two_launches(x, a, torch.float8_e4m3fn, "dual", 0)
        got = fused(x, b, torch.float8_e4m3fn, "dual", 0)
        assert torch.equal(u8(got[0]), u8(want[0])) and torch.equal(u8(got[1]), u8(want[1])), f"q at step {step}"
        assert torch.equal(i32(got[2]), i32(want[2])), f"amax at step {step}"
        b.assert_equal(a, f"at step {step}")
        assert int(b.workspace) == 0


@pytest.mark.parametrize("in_dtype", [torch.float16, torch.float32])
def test_fused_other_input_types_and_nan(in_dtype):
    gen = torch.Generator().manual_seed(5)
    a = State(8, gen, start=0)
    b = a.clone()
    for step in range(3):
        x = torch.randn(300, 136, generator=gen).to(in_dtype).to(DEVICE)
        if step == 1:
            x[7, 3] = float("nan")  # amax NaN: the ring holds NaN, the next multiplier is 1
        want = two_launches(x, a, torch.float8_e4m3fn, "dual", 1)
        got = fused(x, b, torch.float8_e4m3fn, "dual", 1)
        assert torch.equal(u8(got[0]), u8(want[0])) and torch.equal(u8(got[1]), u8(want[1])), f"q at step {step}"
        assert torch.equal(i32(got[2]), i32(want[2])), f"amax at step {step}"
        b.assert_equal(a, f"at step {step}")
    assert b.ring.isnan().any()


def test_empty_x_folds_an_amax_of_zero():
    gen = torch.Generator().manual_seed(2)
    a = State(4, gen, start=1)
    b = a.clone()
    x = torch.empty(0, 64, dtype=torch.bfloat16, device=DEVICE)
    want = two_launches(x, a, torch.float8_e4m3fn, "dual", 0)
    got = fused(x, b, torch.float8_e4m3fn, "dual", 0)
    assert got[0].shape == (0, 64) and got[1].shape == (64, 0)
    assert torch.equal(i32(got[2]), i32(want[2])) and torch.equal(i32(got[3]), i32(want[3]))
    b.assert_equal(a, "after an empty step")


@pytest.mark.parametrize("layout", ["rowwise", "dual"])
def test_fused_smoke_many_blocks(layout):
    """Small enough for the sanitizer tier (its -k picks 'smoke'): a few hundred blocks meet at the counter."""
    gen = torch.Generator().manual_seed(6)
    a = State(8, gen, start=5)
    b = a.clone()
    x = torch.randn(1024, 512, generator=gen).bfloat16().to(DEVICE)
    want = two_launches(x, a, torch.float8_e4m3fn, layout, 0)
    got = fused(x, b, torch.float8_e4m3fn, layout, 0)
    assert torch.equal(u8(got[0]), u8(want[0])) and torch.equal(i32(got[2]), i32(want[2]))
    b.assert_equal(a, "after one step")
    assert int(b.workspace) == 0


def test_negative_control_wrong_margin_is_seen():
    gen = torch.Generator().manual_seed(9)
    a = State(4, gen, start=0)
    b = a.clone()
    x = torch.randn(64, 64, generator=gen).bfloat16().to(DEVICE)
    two_launches(x, a, torch.float8_e4m3fn, "rowwise", 0)
    fused(x, b, torch.float8_e4m3fn, "rowwise", 1)
    assert not torch.equal(i32(a.scale), i32(b.scale))


def test_history_quantize_cuda_equals_torch_path():
    gen = torch.Generator().manual_seed(11)
    cuda = aq.AmaxHistory(6, qmax=57344.0, margin=1, device=DEVICE)
    torch_path = aq.AmaxHistory(6, qmax=57344.0, margin=1, device=DEVICE, path="torch")
    for step in range(8):
        x = (torch.randn(96, 160, generator=gen) * 3.0 ** step).bfloat16().to(DEVICE)
        want = torch_path.quantize(x, out_dtype=torch.float8_e5m2, layout="dual")
        got = cuda.quantize(x, out_dtype=torch.float8_e5m2, layout="dual")
        assert torch.equal(u8(got[0]), u8(want[0])) and torch.equal(u8(got[1]), u8(want[1])), f"q at step {step}"
        assert torch.equal(i32(got[2]), i32(want[2])), f"scale_inv at step {step}"
        for k in ("ring", "pos", "scale", "scale_inv"):
            assert torch.equal(i32(getattr(cuda, k)), i32(getattr(torch_path, k))), f"{k} at step {step}"
    assert cuda.steps == torch_path.steps == 8
    with pytest.raises(ValueError, match=r"AmaxHistory.quantize: out_dtype torch.float8_e4m3fn has max 448.0"):
        cuda.quantize(x, out_dtype=torch.float8_e4m3fn)


def test_fused_does_not_sync_and_replays_in_a_graph():
    rows, cols = 512, 256
    x = torch.randn(rows, cols, device=DEVICE).bfloat16()
    gen = torch.Generator().manual_seed(4)
    graph_state = State(4, gen, start=0)
    eager_state = graph_state.clone()
    warm = graph_state.clone()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fused(x, warm, torch.float8_e4m3fn, "dual", 0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fused(x, warm, torch.float8_e4m3fn, "dual", 0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static = fused(x, graph_state, torch.float8_e4m3fn, "dual", 0)
    for trial in range(6):
        x.copy_(torch.randn(rows, cols, device=DEVICE) * (trial + 1))
        want = fused(x, eager_state, torch.float8_e4m3fn, "dual", 0)
        static[0].view(torch.uint8).fill_(0xFF)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(u8(static[0]), u8(want[0])) and torch.equal(u8(static[1]), u8(want[1])), f"q {trial}"
        assert torch.equal(i32(static[3]), i32(want[3])), f"step scale_inv {trial}"
        graph_state.assert_equal(eager_state, f"at replay {trial}")


def test_fused_rejects_bad_input():
    st = State(4, torch.Generator().manual_seed(1), start=0)
    x = torch.randn(8, 16, device=DEVICE).bfloat16()
    with pytest.raises(RuntimeError, match=r"astrai\.quantize_delayed: out_dtype must be float8_e4m3fn or float8_e5m2"):
        ops.quantize_delayed(x, st.scale, st.ring, st.pos, st.workspace, torch.int8)
    with pytest.raises(RuntimeError, match=r"astrai\.quantize_delayed: workspace must be int32"):
        ops.quantize_delayed(x, st.scale, st.ring, st.pos, torch.zeros(1, dtype=torch.int64, device=DEVICE))
    with pytest.raises(RuntimeError, match=r"astrai\.quantize_delayed: scale must hold one element"):
        ops.quantize_delayed(x, torch.ones(2, device=DEVICE), st.ring, st.pos, st.workspace)
    with pytest.raises(RuntimeError, match=r"astrai\.quantize_delayed: ring must be on the same device as x"):
        ops.quantize_delayed(x, st.scale, st.ring.cpu(), st.pos, st.workspace)
    with pytest.raises(RuntimeError, match=r"astrai\.quantize_delayed: margin must be in \[0, 2\^30\]"):
        ops.quantize_delayed(x, st.scale, st.ring, st.pos, st.workspace, margin=-1)
    assert int(st.pos) == 0 and int(st.workspace) == 0  # nothing launched


def test_opcheck_quantize_delayed():
    st = State(4, torch.Generator().manual_seed(1), start=0)
    x = torch.randn(32, 48, device=DEVICE).bfloat16()
    args = (x, st.scale, st.ring, st.pos, st.scale_inv, st.workspace, torch.float8_e4m3fn, 2, 0)
    torch.library.opcheck(torch.ops.astrai.quantize_delayed.default, args)
