"""ci/verify_artifacts.py on the tree's real image and on damaged copies of it: every defect is named."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import verify_artifacts as va
import write_image_manifest


def _cuobjdump():
    try:
        return write_image_manifest.find_cuobjdump(None)
    except SystemExit:
        return None


def _library(image) -> tuple[dict, object]:
    meta = json.loads((image / "image.json").read_text())
    family, lib = sorted(meta["libraries"].items())[0]
    return lib, image / lib["file"]


def test_real_image_passes(real_image):
    report = va.verify(str(real_image), cuobjdump=_cuobjdump(), policies=va.load_policies())
    assert report.problems == []
    for lib in report.libraries:
        assert lib.fatbin_entries and lib.uncompressed_entries == 0
        assert "libtorch.so" in lib.needed
        assert any(v.startswith("GLIBC_") for v in lib.symbol_versions)


def test_fatbin_headers_agree_with_cuobjdump(real_image):
    """Without cuobjdump (an offline node), the arches come from the fatbin headers: the same lists."""
    lib, _ = _library(real_image)
    report = va.verify(str(real_image), cuobjdump=None)
    assert report.problems == []
    assert report.libraries[0].sass == lib["sass"]
    assert report.libraries[0].ptx == lib["ptx"]


def test_release_arches_required(real_image):
    report = va.verify(str(real_image), archs=["80", "100a"], ptx_archs=["80", "89"], cuobjdump=_cuobjdump())
    name = f"{real_image.name}/{_library(real_image)[0]['file']}"
    assert f"{name}: no SASS for sm_100a (has " in "\n".join(report.problems)
    assert f"{name}: no PTX for compute_89 (has compute_80)" in report.problems


def test_truncated_library(real_image, tmp_path):
    image = shutil.copytree(real_image, tmp_path / real_image.name)
    lib, path = _library(image)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    report = va.verify(str(image), cuobjdump=None)
    text = "\n".join(report.problems)
    assert "sha256 differs from image.json" in text
    assert f"{len(data) // 2} bytes, image.json says {len(data)}" in text


def test_uncompressed_fatbin_entry_is_named(real_image, tmp_path):
    image = shutil.copytree(real_image, tmp_path / real_image.name)
    _, path = _library(image)
    data = bytearray(path.read_bytes())
    section = va.elf_section(bytes(data), ".nv_fatbin")
    start = bytes(data).index(section)
    _, _, header_size, _ = struct.unpack_from("<IHHQ", data, start)
    entry = start + header_size  # first entry: clear its compressed bits and its uncompressed-size field
    (flags,) = struct.unpack_from("<Q", data, entry + 40)
    struct.pack_into("<Q", data, entry + 40, flags & ~va.FATBIN_COMPRESSED)
    struct.pack_into("<Q", data, entry + 56, 0)
    path.write_bytes(bytes(data))
    report = va.verify(str(image), cuobjdump=None)
    assert any("1 of " in p and "fatbin entries are not compressed" in p for p in report.problems), report.problems


def test_missing_library_and_manifest(real_image, tmp_path):
    image = shutil.copytree(real_image, tmp_path / real_image.name)
    _, path = _library(image)
    path.unlink()
    report = va.verify(str(image), cuobjdump=None)
    assert any("the library file is missing" in p for p in report.problems)
    (image / "image.json").write_text("{broken")
    report = va.verify(str(tmp_path), cuobjdump=None)
    assert any("image.json cannot be read" in p for p in report.problems)
    report = va.verify(str(tmp_path / "nothing-here"), cuobjdump=None)
    assert report.problems == [f"{tmp_path / 'nothing-here'}: does not exist"]


def test_not_an_elf_file(real_image, tmp_path):
    image = shutil.copytree(real_image, tmp_path / real_image.name)
    _, path = _library(image)
    path.write_bytes(b"garbage" * 100)
    report = va.verify(str(image), cuobjdump=None)
    assert any("cannot read the fatbin: not a 64-bit little-endian ELF file" in p for p in report.problems)


def test_report_lists_everything_missing(real_image, tmp_path):
    good = va.verify(str(real_image), cuobjdump=None)
    bad = va.Report(artifact="x.whl", kind="wheel", problems=["a", "b"])
    text = va.format_report([good, bad])
    assert "MISSING OR WRONG (2):\n  - a\n  - b" in text
    assert va.main([str(real_image)]) == 0


@pytest.mark.parametrize("versions, needed, expected", [
    ({"GLIBC_2.17", "GLIBCXX_3.4.19"}, {"libc.so.6", "libtorch.so"}, "manylinux_2_17"),
    ({"GLIBC_2.34", "GLIBCXX_3.4.26"}, {"libc.so.6", "libtorch.so"}, "manylinux_2_34"),
    ({"GLIBC_2.17"}, {"libcuda.so.1"}, None),  # a library outside every policy's list
])
def test_oldest_policy(versions, needed, expected):
    policies = va.load_policies()
    if policies is None:
        pytest.skip("auditwheel is not installed")
    assert va.oldest_policy(policies, versions, needed) == expected


DIST = Path(__file__).resolve().parents[2] / "dist"
RELEASED = sorted(DIST.glob("astrai_kernels-*+cu*-py3-none-manylinux_*.whl")) + sorted(DIST.glob("conda/*/*.conda"))


@pytest.mark.parametrize("artifact", RELEASED, ids=[p.name for p in RELEASED])
def test_release_artifacts_in_dist(artifact):
    """What `nox -s wheel` / `nox -s conda` left in dist/, checked again whenever tier 0 runs beside it."""
    report = va.verify(str(artifact), archs=list(va.RELEASE_ARCHS), ptx_archs=list(va.RELEASE_PTX),
                       cuobjdump=_cuobjdump(), policies=va.load_policies())
    assert report.problems == [], va.format_report([report])
