"""Tier 0: every op an image registers has its batch-invariance promise recorded in support.op_properties."""

from __future__ import annotations

import pytest
import torch
from support.op_properties import BATCH_INVARIANT

from astrai.extension import loader


def _registered_ops() -> set[str]:
    for family in ("rotary", "quantize"):
        try:
            loader.load_family(family)
        except Exception:
            pass
    # the dispatcher's own list: torch.ops.astrai is lazy and lists nothing until an op is looked up
    names = {n.split("::", 1)[1] for n in torch._C._dispatch_get_all_op_names() if n.startswith("astrai::")}
    return names


@pytest.mark.requires_cuda_kernels("rotary")
def test_every_registered_op_records_batch_invariance():
    ops = _registered_ops()
    assert ops, "no torch.ops.astrai op is registered: the image did not load"
    missing = sorted(ops - set(BATCH_INVARIANT))
    assert not missing, f"record batch invariance for {missing} in tests/support/op_properties.py"


def test_every_entry_gives_a_reason():
    for op, (promise, why) in BATCH_INVARIANT.items():
        assert isinstance(promise, bool) and len(why) > 10, op
