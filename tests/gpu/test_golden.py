"""Tier 1: golden digests of every family's fixed seeded cases, for the image and arch running now.

A missing entry for this image/arch skips with the command that records it; a stored digest that no longer
matches fails. Negative control: a one-bit change of the outputs must change the digest and fail the check.
"""

from __future__ import annotations

import pytest
import torch

from support import golden
from support.bitwise import perturbed

CASES = [pytest.param(family, name, id=f"{family}-{name}", marks=pytest.mark.requires_cuda_kernels(family))
         for family in golden.families() for name in golden.load_cases(family)]
pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def where() -> str:
    from astrai.extension import loader
    chosen = loader.describe().get("chosen") or {}
    props = torch.cuda.get_device_properties(0)
    return golden.key(chosen.get("image") or "none", f"{props.major}.{props.minor}")


@pytest.mark.parametrize("family,name", CASES)
def test_golden_digest(family, name, where):
    stored = golden.load_digests(family).get(where, {}).get(name)
    outputs = golden.load_cases(family)[name]()
    if stored is None:
        pytest.skip(f"no golden digest for {family}/{name} on {where}: record with `nox -s golden` "
                    "(or ci/gpu_run.sh golden) and commit tests/golden/")
    golden.check(outputs, stored, f"{family}/{name} on {where}")
    first = outputs if isinstance(outputs, torch.Tensor) else outputs[0]
    changed = (perturbed(first),) + (() if isinstance(outputs, torch.Tensor) else tuple(outputs[1:]))
    with pytest.raises(AssertionError, match="golden digest changed"):
        golden.check(changed, stored, "negative control")
