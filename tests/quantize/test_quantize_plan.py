"""ops.quantize.probe on a machine without a GPU: argument errors name the function; the library's planner needs the
device (it sizes grids by its occupancy) and says so, naming the op."""

import pytest
import torch

from astrai.extension.ops import quantize as ops

pytestmark = pytest.mark.requires_cuda_kernels("quantize")


def test_bad_arguments_name_the_function():
    with pytest.raises(ValueError, match=r"probe: scale must be one of \['tensor', 'row'"):
        ops.probe(64, 4096, scale="block")
    with pytest.raises(ValueError, match="probe: out_dtype must be one of"):
        ops.probe(64, 4096, out_dtype=torch.float16)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a machine without a CUDA device")
def test_planning_needs_the_device():
    with pytest.raises(RuntimeError, match=r"astrai\.quantize_plan"):
        ops.probe(64, 4096)


def test_bad_sizes_name_the_op():
    ops.load()
    with pytest.raises(RuntimeError, match=r"astrai\.quantize_plan: rows and cols must be >= 0, got -1 x 8"):
        torch.ops.astrai.quantize_plan(-1, 8, 0, 0, 0, False, True, False)
