"""Tier 0: the golden-digest cases of every family (tests/golden/<family>_cases.py), without a GPU.

- every family with cases is found, and every stored digest names a case that still exists;
- every case's arguments pass its op's own validation: on the CPU the op checks them all and then refuses
  the CPU tensor ("must be a CUDA tensor"), so a wrong shape, dtype or argument order fails here, not on
  the GPU; a case whose op the image does not register yet skips (the same skip the GPU test takes);
- the inputs of a table case depend only on its name (seeded by it) and are the same bytes on every draw;
- the table helpers: missing-op skip (negative control: an unknown op), tensor outputs (None and empty
  placeholders dropped, in-place arguments appended).
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from support import bitwise, golden

FAMILIES = golden.families()


def test_every_family_has_cases():
    assert {"rotary", "quantize", "attention"} <= set(FAMILIES)
    for family in FAMILIES:
        assert golden.load_cases(family), family


@pytest.mark.parametrize("family", FAMILIES)
def test_stored_digests_name_existing_cases(family):
    cases = set(golden.load_cases(family))
    for where, digests in golden.load_digests(family).items():
        stale = set(digests) - cases
        assert not stale, f"{family}.json [{where}] holds digests of cases that no longer exist: {sorted(stale)}"
        assert all(len(d) == 64 for d in digests.values())


def _case_params():
    return [pytest.param(family, name, id=f"{family}-{name}", marks=pytest.mark.requires_cuda_kernels(family))
            for family in FAMILIES for name in golden.load_cases(family)]


@pytest.mark.parametrize("family,name", _case_params())
def test_case_arguments_pass_the_ops_validation(family, name, monkeypatch):
    monkeypatch.setattr(golden, "DEVICE", "cpu")
    case = golden.load_cases(family)[name]
    with pytest.raises(RuntimeError, match="must be a CUDA tensor"):  # everything before it was accepted
        case()


def _table(family: str) -> dict:
    path = golden.GOLDEN_DIR / f"{family}_cases.py"
    spec = importlib.util.spec_from_file_location(f"golden_table_{family}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, "TABLE", None) or {**getattr(module, "DECODE", {}), **getattr(module, "PREFILL", {})}


@pytest.mark.parametrize("family", [f for f in FAMILIES if _table(f)])
def test_table_inputs_are_fixed_by_the_case_name(family, monkeypatch):
    monkeypatch.setattr(golden, "DEVICE", "cpu")
    for name, case in _table(family).items():
        draws = [case.build(golden.seeded(golden.case_seed(name))) for _ in range(2)]
        tensors = [tuple(a for a in args if isinstance(a, torch.Tensor)) for args in draws]
        assert tensors[0], f"{family}/{name} builds no tensor argument"
        assert bitwise.digest(tensors[0]) == bitwise.digest(tensors[1]), f"{family}/{name}: inputs differ"
    names = list(_table(family))
    assert len({golden.case_seed(n) for n in names}) == len(names), "two cases share an input seed"


@pytest.mark.requires_cuda_kernels("attention")
def test_an_op_the_image_lacks_skips():
    """Negative control of the skip: an op no image registers skips, a registered one is returned."""
    with pytest.raises(pytest.skip.Exception, match="not registered by this image"):
        golden.require_op("attention", "attn_no_such_op")
    assert golden.require_op("attention", "attn_decode") is torch.ops.astrai.attn_decode


def test_outputs_of_keeps_tensors_and_written_arguments():
    a, b, empty = torch.ones(2), torch.zeros(3), torch.empty(0)
    assert golden.outputs_of((a, None, empty)) == (a,)
    assert golden.outputs_of(a) == (a,)
    assert golden.outputs_of(None, (b, a, 7), written=(0, 1)) == (b, a)
    assert golden.outputs_of((a,), (b,), written=(0,)) == (a, b)


def test_regeneration_leaves_a_missing_digest_to_skip(tmp_path):
    """A family stored with no digest for this image/arch key (an op not built yet) reads as absent: the GPU
    test then skips that case; a stored digest is found under its key only."""
    golden.store_digests("fam", "cu130/sm_90", {}, tmp_path)
    golden.store_digests("fam", "ptx80/sm_90", {"a": "0" * 64}, tmp_path)
    stored = golden.load_digests("fam", tmp_path)
    assert stored["cu130/sm_90"].get("a") is None and stored["ptx80/sm_90"]["a"] == "0" * 64
    assert json.loads((tmp_path / "fam.json").read_text()) == stored
