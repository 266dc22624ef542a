"""Shared helpers for the distribution tests: the ci/ scripts as modules, the tree's real images."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TREE_LIB = REPO / "astrai" / "extension" / "lib"
if str(REPO / "ci") not in sys.path:
    sys.path.insert(0, str(REPO / "ci"))


def real_images(major: int | None = None) -> list[Path]:
    """The tree's release images (cu*), optionally of one CUDA major."""
    found = []
    for manifest in sorted(TREE_LIB.glob("cu*/image.json")):
        meta = json.loads(manifest.read_text())
        if major is None or meta.get("cuda_major") == major:
            found.append(manifest.parent)
    return found


@pytest.fixture
def real_image() -> Path:
    images = real_images()
    if not images:
        if os.environ.get("ASTRAI_EXPECT_IMAGE") == "1":
            pytest.fail(f"ASTRAI_EXPECT_IMAGE=1 but no cu* image under {TREE_LIB}")
        pytest.skip("no image in the tree (nox -s build)")
    return images[0]
