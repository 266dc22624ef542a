"""Tier 0: the images in astrai/extension/lib/ are what image.json says and what docs/architecture.md promises.

`nox -s test` builds the image first and sets ASTRAI_EXPECT_IMAGE=1, so a missing image fails there;
a plain pytest run on a tree without an image skips these tests.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import shutil
import subprocess

import pytest

LIB_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "astrai", "extension", "lib")
MANIFESTS = sorted(glob.glob(os.path.join(LIB_DIR, "*", "image.json")))

# What a library may depend on: libtorch (resolved from the process that imported torch) and the C/C++
# runtime; the static cudart adds nothing beyond libc.
ALLOWED_NEEDED = {"libtorch.so", "libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libc.so.6",
                  "ld-linux-x86-64.so.2", "libdl.so.2", "libpthread.so.0", "librt.so.1"}


def test_an_image_was_built():
    if os.environ.get("ASTRAI_EXPECT_IMAGE") == "1":
        assert MANIFESTS, f"no image.json under {os.path.abspath(LIB_DIR)}: the build produced no image"
    elif not MANIFESTS:
        pytest.skip("no image in astrai/extension/lib (run nox -s build)")


def _libraries():
    for manifest_path in MANIFESTS:
        with open(manifest_path) as f:
            manifest = json.load(f)
        for family, lib in manifest["libraries"].items():
            yield manifest, family, lib, os.path.join(os.path.dirname(manifest_path), lib["file"])


LIBS = list(_libraries())
IDS = [f"{m['image']}/{fam}" for m, fam, _, _ in LIBS]


@pytest.mark.parametrize("manifest,family,lib,path", LIBS, ids=IDS)
def test_manifest_matches_binary(manifest, family, lib, path):
    assert manifest["schema_version"] == 1
    with open(path, "rb") as f:
        data = f.read()
    assert hashlib.sha256(data).hexdigest() == lib["sha256"], f"{path}: sha256 differs from image.json"
    assert len(data) == lib["size"]
    # Every requested arch has SASS, every requested PTX arch has PTX (read from the binary at build time).
    for arch in manifest["archs"]:
        assert f"sm_{arch}" in lib["sass"], f"{path}: no SASS for sm_{arch}; has {lib['sass']}"
    for arch in manifest["ptx_archs"]:
        assert f"compute_{arch}" in lib["ptx"], f"{path}: no PTX for compute_{arch}; has {lib['ptx']}"
    assert manifest["image"] == os.path.basename(os.path.dirname(path))


@pytest.mark.parametrize("manifest,family,lib,path", LIBS, ids=IDS)
def test_binary_links_only_what_it_may(manifest, family, lib, path):
    if shutil.which("readelf") is None:
        pytest.skip("readelf (binutils) not installed")
    dyn = subprocess.run(["readelf", "-d", "-W", path], capture_output=True, text=True, check=True).stdout
    needed = set(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dyn))
    assert "libtorch.so" in needed, "without NEEDED libtorch.so the shim symbols do not resolve (stable-abi note)"
    assert needed <= ALLOWED_NEEDED, f"unexpected NEEDED: {sorted(needed - ALLOWED_NEEDED)}"
    assert "RPATH" not in dyn and "RUNPATH" not in dyn
    syms = subprocess.run(["readelf", "--dyn-syms", "-W", path], capture_output=True, text=True, check=True).stdout
    python_syms = sorted(set(re.findall(r"\b(Py[A-Z_]\w*|_Py\w+)", syms)))
    assert not python_syms, f"CPython symbols in a library that must serve every Python: {python_syms[:5]}"
    cuda_exports = [ln for ln in syms.splitlines()
                    if re.search(r"\bcuda[A-Z]\w*", ln) and " UND " not in ln and "GLOBAL" in ln]
    assert not cuda_exports, f"static cudart symbols leak from the library: {cuda_exports[:3]}"
