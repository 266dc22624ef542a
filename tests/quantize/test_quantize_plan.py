"""ops.quantize.probe on a machine without a GPU: argument errors name the function; the library's planner needs the
device (it sizes grids by its occupancy) and says so, naming the op."""

import re

import pytest
import torch

from astrai.extension.backend import quantize as backend
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


@pytest.mark.parametrize("dtype,size,stride,want", [
    (torch.bfloat16, 4096, 1, ""),
    (torch.float32, 1, 7, ""),  # a single column: its stride is never used
    (torch.float64, 4096, 1, "x must be bfloat16, float16 or float32, got float64"),
    (torch.float16, 4096, 2, "x must have stride 1 in its last dimension, got 2"),
])
def test_the_policy_asks_the_library(dtype, size, stride, want):
    """The backend's blocker words an x the kernels cannot read as the library does (quantize_can_implement)."""
    assert backend._library_reason(dtype, size, stride) == want


def test_the_op_refuses_with_the_policys_words():
    """Negative control for the blocker's words: the op itself refuses a float64 x with the same sentence."""
    why = backend._library_reason(torch.float64, 64, 1)
    assert why
    with pytest.raises(RuntimeError, match=r"astrai\.quantize_dynamic: " + re.escape(why)):
        torch.ops.astrai.quantize_dynamic(torch.zeros(8, 64, dtype=torch.float64), torch.float8_e4m3fn, 1, False, 0)
