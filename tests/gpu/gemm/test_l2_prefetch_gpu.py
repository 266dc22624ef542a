"""Tier 1 (GPU): `l2_prefetch` (an experiment for the batch-1 decode step): it runs on whole tensors, patterns and
unaligned views, changes no tensor (bitwise, with a negative control of the check), captures in a CUDA graph on a
side stream beside a GEMM (whose bits it does not change), and refuses what tier 0 says. Whether it speeds a GEMM
is the decode probe's question (tests/bench/probe_decode_step.py, `prewarm`), not a test's.

Runs under whatever image the loader picks; ASTRAI_IMAGE=ptx80 runs the prefetch.global.L2 path here.
"""

from __future__ import annotations

import pytest
import torch
from support.bitwise import assert_bitwise_equal, assert_detects_perturbation

import astrai.extension as ae
from astrai.extension.ops import gemm as ops

pytestmark = [pytest.mark.gpu, pytest.mark.requires_cuda_kernels("gemm")]

DEVICE = "cuda"


@pytest.mark.parametrize("shape, dtype", [((4096, 4096), torch.int8), ((1000, 333), torch.bfloat16), ((7,), torch.int8),
                                          ((0, 64), torch.int8), ((3, 5, 4096), torch.float32)])
@pytest.mark.parametrize("pattern", [None, (1024, 4096), (16, 16), (0, 64), (8192, 65536)])
def test_prefetch_changes_nothing(shape, dtype, pattern):
    t = (torch.randn(shape, device=DEVICE) * 50).to(dtype)
    before = t.clone()
    run, period = pattern if pattern else (None, None)
    ops.l2_prefetch(t, run=run, period=period)
    torch.cuda.synchronize()
    assert_bitwise_equal(t, before)
    if t.numel():
        assert_detects_perturbation(t)


@pytest.mark.parametrize("offset", [1, 3, 15, 17])
def test_unaligned_views_stay_inside(offset):
    """A view starting off a 16-byte boundary: only the aligned bytes inside it are asked for (no address outside
    the tensor: compute-sanitizer would not see a prefetch, so the bytes around the view are checked unchanged)."""
    buf = torch.randint(-128, 127, (1 << 20,), device=DEVICE, dtype=torch.int8)
    before = buf.clone()
    view = buf[offset: offset + 70001]
    ops.l2_prefetch(view)
    ops.l2_prefetch(view, run=48, period=96)
    ops.l2_prefetch(buf[offset: offset + 9])  # no whole 16 bytes inside: nothing to ask
    torch.cuda.synchronize()
    assert_bitwise_equal(buf, before)


def test_graph_capture_beside_a_gemm():
    """The pattern the linears would use: after one GEMM, a side stream prefetches the next weight while the main
    stream goes on; joined before the next GEMM. Captured and replayed: the GEMMs' bits equal eager's without it."""
    x = torch.randn(1, 4096, device=DEVICE, dtype=torch.bfloat16)
    w1, w2 = (torch.randint(-127, 128, (4096, 4096), device=DEVICE, dtype=torch.int8) for _ in range(2))
    s1, s2 = (torch.rand(4096, device=DEVICE) / 64 for _ in range(2))
    side = torch.cuda.Stream()

    def step():
        h = ae.quant_gemm(x, w1, b_scale=s1)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            ops.l2_prefetch(w2)
        h = torch.nn.functional.silu(h)
        torch.cuda.current_stream().wait_stream(side)
        return ae.quant_gemm(h, w2, b_scale=s2)

    want = ae.quant_gemm(torch.nn.functional.silu(ae.quant_gemm(x, w1, b_scale=s1)), w2, b_scale=s2)
    eager = step()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up on the capture stream
        with torch.cuda.graph(graph, stream=stream):
            got = step()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(eager, want)
    assert_bitwise_equal(got, want)


def test_refusals_on_the_gpu():
    t = torch.zeros(64, 64, device=DEVICE, dtype=torch.int8)
    with pytest.raises(RuntimeError, match=r"astrai.l2_prefetch: t must be contiguous"):
        ops.l2_prefetch(t.t())
    with pytest.raises(RuntimeError, match=r"run must be a multiple of 16 bytes in \[0, period = 64\], got 24"):
        ops.l2_prefetch(t, run=24, period=64)


def test_opcheck():
    ops.load()
    t = torch.randint(-127, 128, (1024, 512), device=DEVICE, dtype=torch.int8)
    torch.library.opcheck(torch.ops.astrai.l2_prefetch.default, (t, 4096, 4096))
    torch.library.opcheck(torch.ops.astrai.l2_prefetch.default, (t, 1024, 4096))
