"""The rotary launch plan on the GPU: probe() (for this device) names the variant the op launches, as the profiler
sees it, for aligned and misaligned inputs."""

from __future__ import annotations

import pytest
import torch

from astrai.extension import rotary_cos_sin_cache
from astrai.extension.ops import rotary as ops

pytestmark = [pytest.mark.gpu, pytest.mark.requires_cuda_kernels("rotary")]
DEVICE = "cuda"


def cuda_kernels(fn) -> str:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return " ".join(e.name for e in prof.events() if e.device_type.name == "CUDA")


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("aligned", [True, False])
def test_probe_names_the_variant_the_op_launches(interleaved, aligned):
    cos, sin = rotary_cos_sin_cache(512, 128, device=DEVICE)
    buf = torch.randn(300 * 32 * 128 + 1, device=DEVICE, dtype=torch.bfloat16)
    q = (buf[:-1] if aligned else buf[1:]).view(300, 32, 128)  # an element off: no 16-byte runs
    positions = torch.arange(300, device=DEVICE)
    plan = ops.probe(300, 32, 128, interleaved=interleaved, vec_x=aligned)
    assert plan.pairs == (8 if aligned else 1) and plan.vec_cs == aligned
    names = cuda_kernels(lambda: ops.rotary_embedding(q, cos, sin, positions, interleaved=interleaved))
    want = f"rotary_bf16_kernel<{str(interleaved).lower()}, {plan.pairs}, {str(plan.vec_cs).lower()}>"
    assert want in names, (plan, names)
