"""Golden cases for the rotary family: fixed seeded inputs (CPU generator) through each kernel entry point.

Each case returns its outputs; tests/gpu/test_golden.py compares their sha256 with tests/golden/rotary.json.
"""

from __future__ import annotations

import math

import torch

from astrai.extension.ops import rotary as ops
from support import golden
from support.golden import randn_bf16, seeded


def _freqs(gen: torch.Generator, rows: int, head_dim: int):
    angles = torch.rand(rows, head_dim // 2, generator=gen, dtype=torch.float64) * (2 * math.pi)
    return angles.cos().float().to(golden.DEVICE), angles.sin().float().to(golden.DEVICE)


def _positions(gen: torch.Generator, tokens: int, max_pos: int, dtype=torch.int64):
    return torch.randint(0, max_pos, (tokens,), generator=gen, dtype=dtype).to(golden.DEVICE)


def qk(tokens: int, heads_q: int, heads_k: int, head_dim: int, interleaved: bool, seed: int):
    def run():
        gen = seeded(seed)
        q, k = randn_bf16(gen, tokens, heads_q, head_dim), randn_bf16(gen, tokens, heads_k, head_dim)
        cos, sin = _freqs(gen, 4096, head_dim)
        positions = _positions(gen, tokens, 4096)
        return ops.rotary_embedding_qk(q, k, cos, sin, positions, interleaved=interleaved)
    return run


def single_token_freqs(tokens: int, heads: int, head_dim: int, interleaved: bool, seed: int):
    def run():
        gen = seeded(seed)
        q = randn_bf16(gen, tokens, heads, head_dim)
        cos, sin = _freqs(gen, tokens, head_dim)
        return ops.rotary_embedding(q, cos, sin, None, interleaved=interleaved)
    return run


def in_place(tokens: int, heads_q: int, heads_k: int, head_dim: int, interleaved: bool, seed: int):
    def run():
        gen = seeded(seed)
        q, k = randn_bf16(gen, tokens, heads_q, head_dim), randn_bf16(gen, tokens, heads_k, head_dim)
        cos, sin = _freqs(gen, 4096, head_dim)
        positions = _positions(gen, tokens, 4096, torch.int32)
        ops.rotary_embedding_(q, k, cos, sin, positions, interleaved=interleaved)
        return q, k
    return run


CASES = {
    "qk_neox_T989_H32x8_D128": qk(989, 32, 8, 128, False, 1),
    "qk_gptj_T989_H32x8_D128": qk(989, 32, 8, 128, True, 2),
    "qk_neox_T19_H3x1_D34": qk(19, 3, 1, 34, False, 3),       # rows of 68 bytes: the scalar path
    "qk_gptj_T1_H40x8_D256": qk(1, 40, 8, 256, True, 4),
    "single_token_freqs_neox_T989_H8_D64": single_token_freqs(989, 8, 64, False, 5),
    "inplace_gptj_T989_H32x8_D128": in_place(989, 32, 8, 128, True, 6),
}
