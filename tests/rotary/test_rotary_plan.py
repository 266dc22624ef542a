"""The rotary launch plan (ops.rotary.probe) on the CPU: the library's own rule, asked about an H200-sized device."""

import re

import pytest
import torch

from astrai.extension.backend import rotary as backend
from astrai.extension.ops import rotary as ops

pytestmark = pytest.mark.requires_cuda_kernels("rotary")
H200 = dict(sm_count=132, threads_per_sm=2048)


def test_long_calls_unroll_heads_and_cap_the_grid():
    plan = ops.probe(4096, 32, 128, num_k_heads=8, **H200)
    # 8 chunks of 8 pairs a head; 40 heads two a thread; one token a block; 4096 blocks (< 16 waves of 12 a SM).
    assert plan == ops.RotaryPlan(8, True, (8, 20, 1), 4096)
    huge = ops.probe(1 << 22, 32, 128, num_k_heads=8, **H200)
    assert huge.blocks == 132 * (2048 // 160) * 16  # 16 full-occupancy waves, then tokens loop


def test_short_calls_take_one_head_a_thread():
    plan = ops.probe(16, 32, 128, num_k_heads=8, **H200)
    assert plan.block[:2] == (8, 40) and plan.blocks == 16 // plan.block[2]


@pytest.mark.parametrize("head_dim,interleaved,vec_x,vec_cs,pairs,cs", [
    (128, False, True, True, 8, True),
    (128, False, False, True, 1, False),   # misaligned q/k: the scalar variant (and cos/sin with it)
    (128, False, True, False, 8, False),   # misaligned cos/sin only
    (24, True, True, True, 4, True),       # interleaved, D % 16 != 0 but % 8 == 0
    (24, False, True, True, 1, False),     # NeoX: half = 12 is no multiple of 8
    (34, True, True, True, 1, False),
])
def test_variant_follows_the_pointers_and_head_dim(head_dim, interleaved, vec_x, vec_cs, pairs, cs):
    plan = ops.probe(100, 8, head_dim, interleaved=interleaved, vec_x=vec_x, vec_cs=vec_cs, **H200)
    assert (plan.pairs, plan.vec_cs) == (pairs, cs)
    assert plan.block[0] * plan.block[1] * plan.block[2] <= 512


def test_bad_sizes_name_the_op():
    ops.load()
    with pytest.raises(RuntimeError, match=r"astrai\.rotary_plan: head_dim must be even and >= 2, got 7"):
        torch.ops.astrai.rotary_plan(10, 8, 0, 7, False, True, True, 132, 2048)


@pytest.mark.parametrize("q_dtype,k_dtype,head_dim,want", [
    (torch.bfloat16, torch.bfloat16, 128, ""),
    (torch.float16, torch.bfloat16, 128, "q must be bfloat16, got float16"),
    (torch.bfloat16, torch.float32, 64, "k must be bfloat16, got float32"),
    (torch.bfloat16, torch.bfloat16, 7, "head_dim must be even, got 7"),
])
def test_the_policy_asks_the_library(q_dtype, k_dtype, head_dim, want):
    """The backend's blocker words a call the kernel cannot take as the library does (rotary_can_implement)."""
    assert backend._library_reason(q_dtype, k_dtype, head_dim) == want
    ops.load()
    assert torch.ops.astrai.rotary_can_implement(q_dtype, k_dtype, head_dim) == want


def test_the_op_refuses_with_the_policys_words():
    """Negative control for the blocker's words: the op itself refuses an fp16 q with the same sentence."""
    why = backend._library_reason(torch.float16, torch.float16, 8)
    assert why
    x, cos = torch.zeros(4, 2, 8, dtype=torch.float16), torch.zeros(4, 4)
    with pytest.raises(RuntimeError, match=r"astrai\.rotary_embedding: " + re.escape(why)):
        torch.ops.astrai.rotary_embedding(x, cos, cos, None, False)
