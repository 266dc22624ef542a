"""Tier 1 (GPU): the README's three user paths (fp8 training, a quantized model, a transformers model) run as
written on the H200 (tests/support/readme.py), each on our kernels: fp8_autocast's GEMMs on quant_gemm, the
quantized MLP on the quantize kernel and quant_gemm, the transformers model's attention on ours; no fallback
(but fp8_autocast's, with its reason, under an image without fp8 code for the GPU)."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

import astrai.extension as ae  # noqa: E402
from astrai.extension import _fallbacks  # noqa: E402
from astrai.extension.backend import gemm as gemm_backend  # noqa: E402
from support import readme  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.requires_cuda_kernels("attention"), pytest.mark.requires_cuda_kernels("gemm"),
              pytest.mark.requires_cuda_kernels("quantize")]


def test_the_readme_paths_run_on_the_kernels(tmp_path, monkeypatch):
    major, minor = torch.cuda.get_device_capability()
    if major * 10 + minor < 89:
        pytest.skip("fp8_autocast's GEMMs need sm_89 or newer for quant_gemm")
    monkeypatch.chdir(tmp_path)
    _fallbacks.reset()
    seen = []
    real = ae.attention
    monkeypatch.setattr(ae, "attention", lambda *a, **k: seen.append(1) or real(*a, **k))
    ns = readme.run_three_ways("cuda", tmp_path)
    fell_back = [(f["op"], f["reason"]) for f in _fallbacks.snapshot()["reasons"]]
    # An image without fp8 code for this GPU (the compute_80 PTX image) sends fp8_autocast to torch._scaled_mm by
    # design, with its reason; nothing else may fall back.
    e4m3 = torch.zeros(16, 16, device="cuda", dtype=torch.float8_e4m3fn)
    unserved = gemm_backend.cuda_blocker(e4m3, e4m3)
    allowed = [("fp8_autocast", unserved)] if unserved else []
    assert [f for f in fell_back if f not in allowed] == [], f"a README path fell back to torch: {fell_back}"
    assert torch.isfinite(ns["loss"]).item() and ns["y"].is_cuda
    assert ns["out"].shape[1] > 9 and seen, "the transformers path never reached our attention"
