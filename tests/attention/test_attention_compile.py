"""Tier 0 (CPU): the public `attention` under torch.compile(fullgraph=True) (aot_eager): the automatic choice and an
explicit `attn_backend(...)` selection, read once when tracing, give eager's bits."""

from __future__ import annotations

import torch

import astrai.extension as ae


def _inputs():
    q = torch.randn(2, 5, 8, 64)
    k, v = torch.randn(2, 9, 2, 64), torch.randn(2, 9, 2, 64)
    mask = torch.rand(2, 9) > 0.2
    return q, k, v, mask


def test_auto_choice_traces_whole():
    q, k, v, mask = _inputs()
    f = lambda q, k, v, m: ae.attention(q, k, v, attn_mask=m, is_causal=True)  # noqa: E731
    torch._dynamo.reset()
    assert torch.equal(torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, mask), f(q, k, v, mask))


def test_explicit_selection_is_read_when_tracing():
    q, k, v, mask = _inputs()
    f = lambda q, k, v, m: ae.attention(q, k, v, attn_mask=m)  # noqa: E731
    torch._dynamo.reset()
    with ae.attn_backend("torch"):
        got = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, mask)
        want = f(q, k, v, mask)
    assert torch.equal(got, want)
