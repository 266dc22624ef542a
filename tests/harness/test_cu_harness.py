"""Tier 0: the standalone .cu harness compiles and is registered, without a GPU.

- every csrc/tests/*.cu is a TESTS entry of a family in csrc/CMakeLists.txt, and the image build registered
  each with ctest twice (full table and `.small`, label cu-test);
- the sanitizer's negative controls (csrc/tests/selftest) compile for one arch;
- test_utils.cuh's bf16 / fp8 conversions agree bit for bit with torch's casts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
EXPECT = os.environ.get("ASTRAI_EXPECT_IMAGE") == "1"


def _skip_or_fail(reason: str):
    if EXPECT:
        pytest.fail(f"ASTRAI_EXPECT_IMAGE=1 but {reason}")
    pytest.skip(reason)


def registered_tests() -> dict[str, str]:
    """{test name: family} from the TESTS clauses of csrc/CMakeLists.txt."""
    text = (ROOT / "csrc" / "CMakeLists.txt").read_text()
    out = {}
    for family, body in re.findall(r"astrai_add_family\((\w+)(.*?)\)", text, re.S):
        tests = re.search(r"TESTS\s+(.*?)(?:\s+[A-Z]+\s|$)", body, re.S)
        for path in (tests.group(1).split() if tests else []):
            out[Path(path).stem] = family
    return out


def test_every_standalone_test_file_is_registered():
    files = {p.stem for p in (ROOT / "csrc" / "tests").glob("*.cu")}
    assert files, "no csrc/tests/*.cu"
    assert files == set(registered_tests()), "a csrc/tests/*.cu file is not in a family's TESTS (or vice versa)"


def test_ctest_registration_of_the_image_build():
    # the newest image build (a developer's tree may hold older ones)
    ctest_files = sorted(ROOT.glob("build/*/csrc/CTestTestfile.cmake"), key=lambda p: p.stat().st_mtime, reverse=True)
    if not ctest_files:
        _skip_or_fail("no build/*/csrc/CTestTestfile.cmake (build the image first: nox -s build)")
    ctest = shutil.which("ctest")
    if ctest is None:
        _skip_or_fail("ctest is not on PATH")
    build = ctest_files[0].parent
    listing = subprocess.run([ctest, "--test-dir", str(build), "-N", "-L", "cu-test"], capture_output=True,
                             text=True, check=True).stdout
    names = set(re.findall(r"Test\s+#\d+:\s+(\S+)", listing))
    for test in registered_tests():
        assert {test, f"{test}.small"} <= names, f"{test} not registered with ctest: {listing}"
        binary = build.parent / "tests" / test
        assert binary.exists() and os.access(binary, os.X_OK), f"{binary} was not built"


@pytest.fixture(scope="module")
def selftest_build(tmp_path_factory) -> Path:
    if shutil.which("nvcc") is None or shutil.which("cmake") is None:
        _skip_or_fail("nvcc or cmake not on PATH")
    build = tmp_path_factory.mktemp("selftest")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(ROOT / "csrc" / "tests" / "selftest"), "-B", str(build), *generator,
                    "-DCMAKE_CUDA_ARCHITECTURES=90", "--log-level=WARNING"], check=True, capture_output=True)
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True)
    return build


def test_negative_controls_compile_for_one_arch(selftest_build):
    binary = selftest_build / "sanitizer_selftest"
    assert binary.exists() and os.access(binary, os.X_OK)



def test_conversions_match_torch(selftest_build):
    out = subprocess.run([str(selftest_build / "test_utils_check")], capture_output=True, text=True,
                         check=True).stdout.split("\n")
    rows: dict[str, list[tuple[int, int]]] = {}
    for line in out:
        if line:
            kind, a, b = line.split()
            rows.setdefault(kind, []).append((int(a, 16), int(b, 16)))
    formats = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    for name, dtype in formats.items():
        codes = torch.tensor([c for c, _ in rows[f"dec_{name}"]], dtype=torch.uint8)
        want = codes.view(dtype).float()
        got = torch.tensor([b for _, b in rows[f"dec_{name}"]], dtype=torch.int64).to(torch.int32).view(torch.float32)
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan), name
        assert torch.equal(got[~nan], want[~nan]), f"{name} decode differs from torch"
        floats = torch.tensor([a for a, _ in rows[f"enc_{name}"]], dtype=torch.int64).to(torch.int32).view(torch.float32)
        codes = torch.tensor([b for _, b in rows[f"enc_{name}"]], dtype=torch.int64).to(torch.uint8)
        limit = torch.finfo(dtype).max
        in_range = floats.abs() <= limit  # torch's cast does not saturate; the helper does
        want_codes = floats[in_range].to(dtype).view(torch.uint8)
        assert torch.equal(codes[in_range], want_codes), f"{name} encode differs from torch"
        sat = codes[~in_range] & 0x7F
        assert torch.equal(sat, torch.full_like(sat, torch.tensor(limit, dtype=torch.float32).to(dtype).view(torch.uint8).item())), name
    floats = torch.tensor([a for a, _ in rows["enc_bf16"]], dtype=torch.int64).to(torch.int32).view(torch.float32)
    codes = torch.tensor([b for _, b in rows["enc_bf16"]], dtype=torch.int64).to(torch.int16)
    assert torch.equal(codes, floats.to(torch.bfloat16).view(torch.int16)), "bf16 encode differs from torch"
