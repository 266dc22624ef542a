"""Tier 0: `l2_prefetch`'s refusals (the op's CPU kernel validates like the CUDA one, then refuses the device), the
wrapper's argument rule and the fake. tests/gpu/gemm/test_l2_prefetch_gpu.py runs it."""

from __future__ import annotations

import pytest
import torch

from astrai.extension.ops import gemm as ops

kernels = pytest.mark.requires_cuda_kernels("gemm")


@kernels
@pytest.mark.parametrize("t, run, period, message", [
    (torch.zeros(64, 64, dtype=torch.int8), 4096, 4096, r"astrai.l2_prefetch: t must be a CUDA tensor, got cpu"),
    (torch.zeros(64, 64, dtype=torch.int8).t(), 4096, 4096,
     r"astrai.l2_prefetch: t must be contiguous \(its bytes one span\), got strides \[1, 64\] for shape \[64, 64\]"),
    (torch.zeros(64, dtype=torch.int8), 16, 0, r"period must be a positive multiple of 16 bytes, got 0"),
    (torch.zeros(64, dtype=torch.int8), 16, 40, r"period must be a positive multiple of 16 bytes, got 40"),
    (torch.zeros(64, dtype=torch.int8), 24, 64, r"run must be a multiple of 16 bytes in \[0, period = 64\], got 24"),
    (torch.zeros(64, dtype=torch.int8), 128, 64, r"run must be a multiple of 16 bytes in \[0, period = 64\], got 128"),
    (torch.zeros(64, dtype=torch.int8), -16, 64, r"run must be a multiple of 16 bytes in \[0, period = 64\], got -16"),
])
def test_refusals_name_the_op_and_argument(t, run, period, message):
    ops.load()
    with pytest.raises(RuntimeError, match=message):
        torch.ops.astrai.l2_prefetch(t, run, period)


@kernels
def test_the_wrapper_takes_run_and_period_together():
    t = torch.zeros(64, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"l2_prefetch: pass run and period together \(bytes\), or neither"):
        ops.l2_prefetch(t, run=1024)
    with pytest.raises(ValueError, match=r"got run=None, period=4096"):
        ops.l2_prefetch(t, period=4096)
    with pytest.raises(RuntimeError, match=r"t must be a CUDA tensor, got cpu"):  # neither: all of t, run=period
        ops.l2_prefetch(t)


@kernels
def test_the_fake_returns_nothing():
    ops.load()
    assert torch.ops.astrai.l2_prefetch(torch.empty(4096, dtype=torch.int8, device="meta"), 1024, 4096) is None
