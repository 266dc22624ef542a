"""Tier 0 (CPU): the README's three user paths (fp8 training, a quantized model, a transformers model) run as
written, on small stand-ins (tests/support/readme.py; torch paths here, tests/gpu/integrations runs them on the
kernels)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import astrai.extension as ae  # noqa: E402
from support import readme  # noqa: E402


def test_the_readme_paths_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    seen = []
    real = ae.attention
    monkeypatch.setattr(ae, "attention", lambda *a, **k: seen.append(1) or real(*a, **k))
    ns = readme.run_three_ways("cpu", tmp_path)
    assert torch.isfinite(ns["loss"]).item()
    saved = torch.load(tmp_path / "q.pt")
    assert saved["0.weight"].dtype == torch.int8 and saved["0.weight_scale"].dtype == torch.float32
    assert ns["y"].shape == (16, 64) and ns["y"].dtype == torch.bfloat16
    assert ns["model"].config._attn_implementation == "astrai"
    out = ns["out"]
    assert out.shape[0] == 2 and out.shape[1] > 9, "generate produced no new token"
    assert seen, "the transformers path never reached our attention"
