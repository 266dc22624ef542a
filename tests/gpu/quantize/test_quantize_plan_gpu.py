"""The quantize launch plan on the GPU: probe() reports the kernel the op launches (the profiler sees it), the plan
follows the call's alignment and layout, and the library refuses what the ops refuse."""

from __future__ import annotations

import pytest
import torch

from astrai.extension.ops import quantize as ops

pytestmark = [pytest.mark.gpu, pytest.mark.requires_cuda_kernels("quantize")]
DEVICE = "cuda"
E4M3 = torch.float8_e4m3fn


def cuda_kernels(fn) -> str:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return " ".join(e.name for e in prof.events() if e.device_type.name == "CUDA")


def test_probe_names_the_kernel_the_op_launches():
    x = torch.randn(4096, 4096, device=DEVICE, dtype=torch.bfloat16)
    scale = torch.tensor([2.0], device=DEVICE)
    rows = ops.probe(4096, 4096)
    assert rows.kernel == "rows" and rows.vec and rows.threads_per_row in (8, 16, 32, 64, 128, 256)
    assert "quantize_rows_kernel" in cuda_kernels(lambda: ops.quantize(x, scale, E4M3, layout="rowwise"))
    t = ops.probe(4096, 4096, transposed=True)
    assert t.kernel.startswith("transpose-regs") and t.threads_per_row == 0
    names = cuda_kernels(lambda: ops.quantize(x, scale, E4M3, layout="transposed"))
    assert "quantize_transpose_regs_kernel" in names and "quantize_rows_kernel" not in names
    dyn = ops.probe(4096, 4096, scale="dynamic-row")
    assert dyn.kernel == "rows" and dyn.blocks <= 4096


def test_plan_follows_alignment_and_size():
    assert ops.probe(64, 4096, aligned=False).vec is False
    assert ops.probe(64, 4100).vec is False  # cols not a multiple of 16 elements
    small, wide = ops.probe(64, 128), ops.probe(64, 65536)
    assert small.threads_per_row < wide.threads_per_row == 256
    assert ops.probe(64, 4096, in_dtype=torch.float32, transposed=True).kernel == "transpose-regs8"  # 16: bf16 only
    assert ops.probe(0, 4096).blocks == 0  # nothing to launch
    assert ops.probe(64, 4096, transposed=True, fold=True).kernel.startswith("transpose-regs")


def test_plan_refuses_what_the_ops_refuse():
    with pytest.raises(RuntimeError, match=r"astrai\.quantize_plan: the quantize ops do not take this combination"):
        ops.probe(64, 4096, out_dtype=torch.int8, transposed=True)  # int8 has no transposed layout
    with pytest.raises(ValueError, match="probe: scale must be one of"):
        ops.probe(64, 4096, scale="block")
