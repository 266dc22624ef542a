"""Several installed images at once: a wheel's, a conda prefix's and ASTRAI_IMAGE_PATH's, of different toolkits.

Fabricated images stand for what each artifact installs (two 13.x images, as the cu13 wheel and conda
package ship them, and 12.x ones, which no toolkit here can build); the last tests use the real images of
the tree in the same layout, loaded for registration in a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import astrai
from astrai.extension import loader

H200 = (9, 0)
B200 = (10, 0)
A100 = (8, 0)
PACKAGE_PARENT = Path(astrai.__file__).resolve().parents[1]
TREE_LIB = Path(__file__).resolve().parents[2] / "astrai" / "extension" / "lib"


@pytest.fixture
def installed(fake, tmp_path, monkeypatch):
    """A wheel's lib/ with cu130 and cu132, a conda prefix with cu129, ASTRAI_IMAGE_PATH with cu128 (PTX only)."""
    wheel_lib = tmp_path / "site-packages" / "astrai" / "extension" / "lib"
    prefix = tmp_path / "conda-env"
    env_root = fake.add_root("opt-images")
    fake.set_path(env_root)
    fake.image("cu130", root=wheel_lib, cuda="13.0.88")
    fake.image("cu132", root=wheel_lib, cuda="13.2.86")
    fake.image("cu129", root=prefix / "lib" / "astrai-kernels", cuda="12.9.86")
    fake.image("cu128", root=env_root, cuda="12.8.93", sass=(), ptx=("compute_80",))
    monkeypatch.setattr(loader, "PACKAGE_LIB_DIR", wheel_lib)
    monkeypatch.delenv(loader.ENV_IGNORE_PACKAGE_IMAGES)
    monkeypatch.setenv("CONDA_PREFIX", str(prefix))
    return fake


def _sources(sel: loader.Selection) -> dict[str, str]:
    return {r.name: r.source for r in sel.images}


def test_every_root_is_scanned_and_newest_13x_wins(installed):
    installed.gpu(H200, driver=13000)
    sel = installed.select()
    assert _sources(sel) == {"cu128": "ASTRAI_IMAGE_PATH", "cu130": "package", "cu132": "package",
                             "cu129": "CONDA_PREFIX"}
    assert [r.status for r in sel.roots] == ["scanned", "scanned", "scanned"]
    assert sel.chosen.name == "cu132"  # SASS, torch's major, newest toolkit; a 13.0 driver runs 13.2 SASS
    assert "has the newer toolkit (13.2.86 over 13.0.88)" in installed.record("cu130").reason
    assert "toolkit major 13 matches torch's CUDA 13.0" in installed.record("cu129").reason
    assert "needs the PTX JIT" in installed.record("cu128").reason


def test_info_lists_every_image_of_every_root_with_arches(installed):
    installed.gpu(H200)
    installed.select()
    desc = loader.describe()
    assert {i["name"]: i["source"] for i in desc["images"]} == {
        "cu128": "ASTRAI_IMAGE_PATH", "cu130": "package", "cu132": "package", "cu129": "CONDA_PREFIX"}
    assert [r["images"] for r in desc["roots"]] == [["cu128"], ["cu130", "cu132"], ["cu129"]]
    text = loader.format_info(desc)
    for name in ("cu128", "cu129", "cu130", "cu132"):
        assert f"    {name}  toolkit" in text
    assert "sass sm_80 sm_89 sm_90a sm_120a  ptx compute_80" in text
    assert "sass -  ptx compute_80" in text  # the PTX-only image
    assert "chosen     cu132 (sass)" in text


def test_driver_of_cuda_12_takes_the_cu12_image(installed):
    installed.gpu(H200, driver=12090)
    sel = installed.select()
    assert sel.chosen.name == "cu129"
    for name in ("cu130", "cu132"):
        assert installed.record(name).status == "rejected"
        assert "driver too old for the image: it supports CUDA 12.9" in installed.record(name).reason


def test_driver_too_old_for_every_image(installed):
    installed.gpu(H200, driver=11080)
    sel = installed.select()
    assert sel.chosen is None
    assert sel.why == "no image found can run here (every one was rejected)"
    with pytest.raises(loader.FamilyUnavailableError) as err:
        loader.load_family("rotary")
    message = str(err.value)
    for name in ("cu128", "cu129", "cu130", "cu132"):
        assert f"    {name} (" in message
    assert message.count("driver too old for the image") == 4


def test_torch_on_cuda_12_prefers_the_cu12_image(installed):
    installed.gpu(H200, driver=13000)
    installed.torch_cuda = "12.9"
    assert installed.select().chosen.name == "cu129"


def test_newer_gpu_falls_back_to_the_older_toolkits_ptx(installed):
    # sm_100 has no SASS anywhere: cu132's PTX is too new for a 13.0 driver to JIT, cu130's is not.
    installed.gpu(B200, driver=13000)
    sel = installed.select()
    assert sel.chosen.name == "cu130"
    assert sel.chosen.serves == "ptx"
    assert "PTX compute_80 is too new for the driver" in installed.record("cu132").reason
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loader.load_family("rotary")
    assert any(issubclass(w.category, loader.PTXJITWarning) for w in caught)


def test_newer_driver_jits_the_newest_ptx(installed):
    installed.gpu(B200, driver=13020)
    assert installed.select().chosen.name == "cu132"


def test_forced_cu12_image_from_another_root(installed):
    installed.gpu(A100, driver=13000)
    installed.force("cu129")
    sel = installed.select()
    assert sel.chosen.name == "cu129" and sel.chosen.source == "CONDA_PREFIX"
    assert installed.record("cu132").reason == "not considered: ASTRAI_IMAGE=cu129 is in force"


def test_forced_ptx_only_image(installed):
    installed.gpu(H200, driver=13000)
    installed.force("cu128")
    sel = installed.select()
    assert sel.chosen.name == "cu128" and sel.chosen.serves == "ptx"


def test_forced_image_that_is_not_installed(installed):
    installed.gpu(H200)
    installed.force("cu126")
    sel = installed.select()
    assert sel.chosen is None
    assert "no image named 'cu126' in the search roots (images found: cu128, cu129, cu130, cu132)" in sel.why
    with pytest.raises(loader.FamilyUnavailableError, match="ASTRAI_IMAGE=cu126"):
        loader.load_family("rotary")


def test_same_image_in_wheel_and_conda_prefix(installed, tmp_path):
    installed.gpu(H200)
    installed.image("cu132", root=tmp_path / "conda-env" / "lib" / "astrai-kernels", cuda="13.2.86")
    sel = installed.select()
    assert [r.source for r in sel.images if r.name == "cu132"] == ["package", "CONDA_PREFIX"]
    assert sel.chosen.source == "package"  # same rank: the earlier root wins


def test_broken_entries_beside_good_roots(installed, tmp_path):
    """Missing and unreadable ASTRAI_IMAGE_PATH entries, a corrupt and a newer-schema image: the rest serve."""
    installed.gpu(H200)
    broken = tmp_path / "broken"
    installed.image("cu131", root=broken, cuda="13.1.80", bad_sha=("rotary",))
    installed.image("cu133", root=broken, cuda="13.3.0", schema_version=99)
    installed.image("cu134", root=broken, raw="{not json")
    (broken / "cu135").mkdir()  # no image.json at all
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    installed.set_path(tmp_path / "missing", not_a_dir, broken, *installed.path_entries)
    sel = installed.select()
    assert [r.status for r in sel.roots[:3]] == ["missing", "unreadable", "scanned"]
    assert "skipped (no image.json): cu135" in sel.roots[2].note
    assert sel.chosen.name == "cu132"
    assert "newer than this loader reads" in installed.record("cu133").reason
    assert "malformed image.json" in installed.record("cu134").reason
    installed.force("cu131")  # the only 13.1 image has a corrupted library
    sel = installed.select()
    assert sel.chosen is None and "sha256 mismatch" in sel.why


# --- the real images of the tree, laid out as the artifacts install them -------------------------------------


def _real_images() -> list[Path]:
    images = []
    for manifest in sorted(TREE_LIB.glob("cu*/image.json")):
        if json.loads(manifest.read_text()).get("cuda_major") == 13:
            images.append(manifest.parent)
    return images


def _info_json(env_extra: dict[str, str], cwd: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ASTRAI_IMAGE", "ASTRAI_IMAGE_PATH", "CONDA_PREFIX")}
    env.update({"CUDA_VISIBLE_DEVICES": "", "ASTRAI_IGNORE_PACKAGE_IMAGES": "1",
                "PYTHONPATH": os.pathsep.join([str(PACKAGE_PARENT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)})
    env.update(env_extra)
    code = ("import json; from astrai.extension import loader; loader.family_available('rotary'); "
            "print(json.dumps({'describe': loader.describe(), 'verify': loader.verify(smoke=False)}))")
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_real_images_in_a_conda_prefix_and_image_path(tmp_path, make_image):
    """The tree's real cu13x images (cu130 and, after `nox -s build -- --toolkit all`, cu132) in a conda
    prefix and on ASTRAI_IMAGE_PATH beside a fabricated cu129: all listed, checksums verified, one loaded."""
    images = _real_images()
    if not images:
        if os.environ.get("ASTRAI_EXPECT_IMAGE") == "1":
            pytest.fail(f"ASTRAI_EXPECT_IMAGE=1 but no cu13* image under {TREE_LIB}")
        pytest.skip("no real cu13* image in the tree (nox -s build)")
    prefix = tmp_path / "env"
    conda_root = prefix / "lib" / "astrai-kernels"
    path_root = tmp_path / "opt"
    shutil.copytree(images[0], conda_root / images[0].name)
    for image in images[1:]:
        shutil.copytree(image, path_root / image.name)
    make_image(path_root, "cu129", cuda="12.9.86")
    out = _info_json({"CONDA_PREFIX": str(prefix), "ASTRAI_IMAGE_PATH": str(path_root)}, tmp_path)
    desc, report = out["describe"], out["verify"]
    seen = {i["name"]: i["source"] for i in desc["images"]}
    assert seen[images[0].name] == "CONDA_PREFIX"
    assert seen["cu129"] == "ASTRAI_IMAGE_PATH"
    assert all(seen[i.name] in ("CONDA_PREFIX", "ASTRAI_IMAGE_PATH") for i in images)
    newest = max(images, key=lambda p: tuple(int(x) for x in
                                             json.loads((p / "image.json").read_text())["cuda_version"].split(".")))
    # torch here is a CPU build (no CUDA version to match): the newest toolkit wins, loaded for registration.
    assert desc["chosen"]["image"] == newest.name, desc["why"]
    assert desc["chosen"]["registration_only"] is True
    assert "rotary" in desc["loaded_families"]
    checked = {c["image"]: c["ok"] for c in report["checksums"]}
    assert checked == {**{i.name: True for i in images}, "cu129": True}, report["failures"]
