"""Tier 0 (CPU): the built image's fp8 GEMM kernels use the mma the contract names per arch, read from the SASS.

sm_120a cannot run on the lent H200, so this is the only proof that its fp8 kernels take the block-scale form
(kind::mxf8f6f4 with unit UE8M0 scales: QMMA.SF in SASS) and not the half-rate plain fp8 mma; sm_89 keeps the
plain fp8 mma (QMMA without .SF). Skips where the image or cuobjdump / nvdisasm (the harness's pinned wheels)
are absent.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci"))
import sass_digest  # noqa: E402

LIB = ROOT / "astrai" / "extension" / "lib"
# Mangled names of the fp8 pairs' kernels (PairTraits<..., MmaE4m3 | MmaE5m2E4m3 | MmaE4m3E5m2>).
FP8_KERNEL = re.compile(r"Mma(E4m3|E5m2E4m3|E4m3E5m2)E")
QMMA = re.compile(r"\bQMMA(\.SF)?\.16832\.F32\.(E4M3|E5M2)\.(E4M3|E5M2)")


def _gemm_library() -> Path:
    for image in sorted(LIB.glob("cu*")):
        manifest = json.loads((image / "image.json").read_text())
        for name, lib in manifest["libraries"].items():
            if name == "gemm":
                return image / lib["file"]
    pytest.skip("no cu* image with the gemm family in astrai/extension/lib (nox -s build)")


def _sass(arch: str) -> dict[str, list[str]]:
    path = _gemm_library()
    try:
        cuobjdump = sass_digest.find_cuobjdump()
    except SystemExit as exc:
        pytest.skip(str(exc))
    # One arch's SASS only: the whole library (4 arches, ~14 MB) takes minutes to disassemble on 2 cores.
    proc = subprocess.run([cuobjdump, "-sass", "-arch", arch, str(path)], capture_output=True, text=True,
                          env={"PATH": str(Path(cuobjdump).parent) + ":/usr/bin:/bin"})
    if proc.returncode != 0:
        pytest.skip(f"cuobjdump -sass failed here: {proc.stderr.strip()[:200]}")
    functions = sass_digest.parse_sass(proc.stdout).get(arch)
    if not functions:
        pytest.skip(f"{path.name} has no {arch} SASS")
    # The sm_90a-only kernels (recipe 6's weight stream names the same mma cells) are empty stubs on other arches.
    return {name: lines for name, lines in functions.items() if FP8_KERNEL.search(name) and "_sm90_" not in name}


def _qmma_forms(lines: list[str]) -> set[bool]:
    """For each QMMA of a kernel: True for the block-scale form (.SF), False for the plain one."""
    return {m.group(1) is not None for line in lines for m in [QMMA.search(line)] if m}


def test_sm120a_fp8_gemm_kernels_use_the_block_scale_mma():
    kernels = _sass("sm_120a")
    assert kernels, "no fp8 GEMM kernel in the sm_120a SASS"
    for name, lines in kernels.items():
        assert _qmma_forms(lines) == {True}, f"{name}: expected only QMMA.SF (block-scale) on sm_120a"


def test_sm89_fp8_gemm_kernels_keep_the_plain_fp8_mma():
    kernels = _sass("sm_89")
    assert kernels, "no fp8 GEMM kernel in the sm_89 SASS"
    for name, lines in kernels.items():
        assert _qmma_forms(lines) == {False}, f"{name}: expected only plain QMMA on sm_89"
