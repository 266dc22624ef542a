"""Tier 0: ci/sass_digest.py parses cuobjdump's SASS and register counts and its --compare fails on any added,
removed or changed function: on synthetic cuobjdump text, and on a fixture binary compiled here by nvcc."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci"))
import sass_digest  # noqa: E402

SASS = """
Fatbin ptx code:
================
arch = sm_80
identifier = x.cu

Fatbin elf code:
================
arch = sm_90a
code version = [1,8]

\tcode for sm_90a
\t\tFunction : _Z4kernAPf
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                    /* 0x00000a00ff017b82 */
                                                                             /* 0x000fe40000000800 */
        /*0010*/                   EXIT ;                                    /* 0x000000000000794d */
                                                                             /* 0x000fea0003800000 */
\t\t..........

\t\tFunction : _Z4kernBPf
        /*0000*/                   {KERNB} ;                                 /* 0x000000000000794d */
                                                                             /* 0x000fea0003800000 */
"""
RES = """
Fatbin elf code:
================
arch = sm_90a
Resource usage:
 Common:
  GLOBAL:0
 Function _Z4kernAPf:
  REG:{REGA} STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:536 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z4kernBPf:
  REG:8 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:536 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def digest(kernb="EXIT", rega=24, drop_b=False):
    sass = SASS.replace("{KERNB}", kernb)
    if drop_b:
        sass = sass.split("\t\tFunction : _Z4kernBPf")[0]
    return {"libraries": {"lib.so": sass_digest.digest_texts(sass, RES.replace("{REGA}", str(rega)))}}


def test_parse_functions_registers_and_instructions():
    d = digest()["libraries"]["lib.so"]
    assert set(d) == {"sm_90a"}  # the PTX section carries no SASS
    assert d["sm_90a"]["_Z4kernAPf"]["registers"] == 24 and d["sm_90a"]["_Z4kernAPf"]["instructions"] == 2
    assert d["sm_90a"]["_Z4kernBPf"]["registers"] == 8 and d["sm_90a"]["_Z4kernBPf"]["instructions"] == 1


def test_identical_digests_compare_clean_and_addresses_do_not_matter():
    shifted = SASS.replace("/*0010*/", "/*0020*/")
    a = {"libraries": {"lib.so": sass_digest.digest_texts(shifted.replace("{KERNB}", "EXIT"),
                                                          RES.replace("{REGA}", "24"))}}
    assert sass_digest.compare(digest(), digest()) == []
    assert sass_digest.compare(digest(), a) == []


def test_changed_sass_registers_added_and_removed_are_each_reported():
    assert [p.split()[0] for p in sass_digest.compare(digest(), digest(kernb="NOP"))] == ["changed"]
    regs = sass_digest.compare(digest(), digest(rega=32))
    assert regs == ["changed  lib.so sm_90a _Z4kernAPf: registers 24 -> 32"]
    assert [p.split()[0] for p in sass_digest.compare(digest(), digest(drop_b=True))] == ["removed"]
    assert [p.split()[0] for p in sass_digest.compare(digest(drop_b=True), digest())] == ["added"]
    whole_lib = sass_digest.compare(digest(), {"libraries": {}})
    assert len(whole_lib) == 2 and all(p.startswith("removed") for p in whole_lib)


def _tools() -> tuple[str, str] | None:
    nvcc = shutil.which("nvcc")
    try:
        cuobjdump = sass_digest.find_cuobjdump()
    except SystemExit:
        return None
    if not nvcc or not (Path(cuobjdump).parent / "nvdisasm").exists() and not shutil.which("nvdisasm"):
        return None
    return nvcc, cuobjdump


KERNELS = """
__global__ void scale(float* x, float a) {{ x[threadIdx.x] *= a{extra}; }}
{more}
"""


def compile_fixture(nvcc: str, tmp: Path, name: str, extra: str = "", more: str = "") -> Path:
    src = tmp / f"{name}.cu"
    src.write_text(KERNELS.format(extra=extra, more=more))
    obj = tmp / f"{name}.o"
    subprocess.run([nvcc, "-c", "-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_80,code=sm_80",
                    str(src), "-o", str(obj)], check=True, capture_output=True)
    return obj


def test_fixture_binary_negative_control(tmp_path):
    tools = _tools()
    if tools is None:
        if os.environ.get("ASTRAI_EXPECT_IMAGE") == "1":
            pytest.fail("nvcc, cuobjdump or nvdisasm missing under ASTRAI_EXPECT_IMAGE=1")
        pytest.skip("needs nvcc, cuobjdump and nvdisasm (nox -s test installs the last two)")
    nvcc, cuobjdump = tools
    base = compile_fixture(nvcc, tmp_path, "base")
    changed = compile_fixture(nvcc, tmp_path, "changed", extra=" + 1.0f",
                              more="__global__ void extra_kernel(int* y) { y[threadIdx.x] = 7; }")
    saved = tmp_path / "saved.json"
    assert sass_digest.main([str(base), "--update", str(saved), "--cuobjdump", cuobjdump]) == 0
    data = json.loads(saved.read_text())
    assert set(data["libraries"]["base.o"]) == {"sm_80", "sm_90"}
    assert sass_digest.main([str(base), "--compare", str(saved), "--cuobjdump", cuobjdump]) == 0
    # the same library name with different code: rename the digest's key to compare like for like
    renamed = tmp_path / "renamed.json"
    renamed.write_text(json.dumps({"libraries": {"changed.o": data["libraries"]["base.o"]}}))
    current = sass_digest.digest_paths([changed], cuobjdump)
    problems = sass_digest.compare(json.loads(renamed.read_text()), current)
    kinds = sorted({(p.split()[0], p.split()[2]) for p in problems})
    assert kinds == [("added", "sm_80"), ("added", "sm_90"), ("changed", "sm_80"), ("changed", "sm_90")], problems
    assert sass_digest.main([str(changed), "--compare", str(renamed), "--cuobjdump", cuobjdump]) == 1


TOOLCHAIN = {"cuda_version": "13.0.88", "archs": ["80", "90a"], "ptx_archs": ["80"], "cuobjdump": "13.4.92"}


def test_toolchain_mismatch_names_what_differs():
    assert sass_digest.toolchain_mismatch({"toolchain": TOOLCHAIN}, dict(TOOLCHAIN)) is None
    assert "records no toolchain" in sass_digest.toolchain_mismatch({"libraries": {}}, TOOLCHAIN)
    why = sass_digest.toolchain_mismatch({"toolchain": TOOLCHAIN}, dict(TOOLCHAIN, cuda_version="13.2.86"))
    assert why == "cuda_version 13.2.86 here vs 13.0.88 recorded"
    why = sass_digest.toolchain_mismatch({"toolchain": TOOLCHAIN}, dict(TOOLCHAIN, archs=["90a"], cuobjdump="13.0.85"))
    assert "archs" in why and "cuobjdump 13.0.85 here" in why


def _image_dir(tmp_path: Path, cuda_version: str) -> Path:
    image = tmp_path / "cu130"
    image.mkdir()
    (image / "image.json").write_text(json.dumps({"cuda_version": cuda_version, "archs": ["80", "90"],
                                                  "ptx_archs": []}))
    return image


def test_if_same_toolchain_skips_another_compiler_without_disassembling(tmp_path, capsys):
    image = _image_dir(tmp_path, "12.9.41")
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps({"toolchain": dict(TOOLCHAIN, archs=["80", "90"], ptx_archs=[]), "libraries": {}}))
    # a cuobjdump that cannot run: the skip is decided before any disassembly
    rc = sass_digest.main([str(image), "--compare", str(saved), "--if-same-toolchain", "--cuobjdump", "/nonexistent"])
    out = capsys.readouterr().out
    assert rc == 0 and "skipped" in out and "cuda_version 12.9.41 here vs 13.0.88 recorded" in out
    assert sass_digest.main([str(image), "--compare", str(tmp_path / "none.json"), "--if-same-toolchain",
                             "--cuobjdump", "/nonexistent"]) == 0


def test_if_same_toolchain_still_fails_on_changed_sass(tmp_path):
    """The negative control of the tier-0 gate: same toolchain, changed kernel -> exit 1."""
    tools = _tools()
    if tools is None:
        if os.environ.get("ASTRAI_EXPECT_IMAGE") == "1":
            pytest.fail("nvcc, cuobjdump or nvdisasm missing under ASTRAI_EXPECT_IMAGE=1")
        pytest.skip("needs nvcc, cuobjdump and nvdisasm (nox -s test installs the last two)")
    nvcc, cuobjdump = tools
    image = _image_dir(tmp_path, "13.0.88")
    shutil.copy(compile_fixture(nvcc, tmp_path, "base"), image / "astrai_fixture.so")
    saved = tmp_path / "saved.json"
    assert sass_digest.main([str(image), "--update", str(saved), "--cuobjdump", cuobjdump]) == 0
    assert json.loads(saved.read_text())["toolchain"]["cuda_version"] == "13.0.88"
    args = [str(image), "--compare", str(saved), "--if-same-toolchain", "--cuobjdump", cuobjdump]
    assert sass_digest.main(args) == 0
    shutil.copy(compile_fixture(nvcc, tmp_path, "changed", extra=" + 1.0f"), image / "astrai_fixture.so")
    assert sass_digest.main(args) == 1
