"""Shared test setup: capability skips decided in one place, per-test seeding, markers.

Markers:
- `gpu`: needs a visible CUDA device; every test under tests/gpu gets it automatically.
- `requires_cuda_kernels(family)`: needs the family's library from a kernel image to load. On a CPU machine
  that is enough for schemas, validation and fake tensors; combine with `gpu` to launch kernels.

Skips become failures with ASTRAI_EXPECT_IMAGE=1 (set by `nox -s test` after building the image), so a
missing image cannot pass silently. Seeds: each test is seeded from ASTRAI_TEST_SEED (random per run when
unset) and its node id; a failing test prints the value to repeat it with.
"""

from __future__ import annotations

import functools
import os
import random
import sys
import zlib
from pathlib import Path

import pytest
import torch

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:  # tests import references as `reference.<family>`
    sys.path.insert(0, str(TESTS_DIR))

BASE_SEED = int(os.environ.get("ASTRAI_TEST_SEED") or random.SystemRandom().randrange(2**31))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a visible CUDA device (every test under tests/gpu)")
    config.addinivalue_line("markers", "requires_cuda_kernels(family): needs the family's library from a "
                                       "kernel image (loads on CPU too: schemas, validation, fake tensors)")


def pytest_report_header(config):
    image = os.environ.get("ASTRAI_IMAGE")
    return [f"astrai: ASTRAI_TEST_SEED={BASE_SEED}" + (f", ASTRAI_IMAGE={image}" if image else "")
            + f", CUDA visible: {torch.cuda.is_available()}"]


def pytest_collection_modifyitems(config, items):
    gpu_dir = TESTS_DIR / "gpu"
    for item in items:
        if gpu_dir in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.gpu)


@functools.cache
def _family_problem(family: str) -> str | None:
    try:
        from astrai.extension import loader
    except Exception as exc:  # the package itself is broken: say so rather than skip quietly
        return f"astrai.extension.loader cannot be imported: {type(exc).__name__}: {exc}"
    try:
        loader.load_family(family)
    except Exception as exc:
        return f"the '{family}' kernels are unavailable: {str(exc).splitlines()[0]}"
    return None


def capability_skip_reason(*, gpu: bool = False, families: tuple[str, ...] = ()) -> str | None:
    """The one helper that decides skips by capability: None when the test can run, else why not."""
    if gpu and not torch.cuda.is_available():
        return "no CUDA device visible"
    for family in families:
        problem = _family_problem(family)
        if problem:
            return problem
    return None


def requires_cuda_kernels(family: str) -> pytest.MarkDecorator:
    """Marker for tests that need `family`'s library; same as `@pytest.mark.requires_cuda_kernels(family)`."""
    return pytest.mark.requires_cuda_kernels(family)


def pytest_runtest_setup(item):
    families = tuple(mark.args[0] for mark in item.iter_markers("requires_cuda_kernels"))
    reason = capability_skip_reason(gpu=item.get_closest_marker("gpu") is not None, families=families)
    if reason is None:
        return
    if families and os.environ.get("ASTRAI_EXPECT_IMAGE") == "1" and "CUDA device" not in reason:
        pytest.fail(f"ASTRAI_EXPECT_IMAGE=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def seed(request) -> int:
    """Seed torch (CPU and CUDA) and random from ASTRAI_TEST_SEED and the test's node id; returns the seed."""
    value = (BASE_SEED ^ zlib.crc32(request.node.nodeid.encode())) & 0x7FFFFFFF
    torch.manual_seed(value)
    random.seed(value)
    request.node.add_report_section("setup", "seed", f"ASTRAI_TEST_SEED={BASE_SEED} (this test: {value})")
    return value
