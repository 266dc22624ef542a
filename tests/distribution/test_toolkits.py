"""ci/toolkits.py: the toolkit names `nox -s build -- --toolkit` takes, and the PyPI toolkit's layout."""

from __future__ import annotations

import os
import shutil

import pytest
import toolkits


def test_pypi_toolkits_are_pinned_to_one_release():
    for name, pins in toolkits.PYPI_TOOLKITS.items():
        assert {"nvidia-cuda-nvcc", "nvidia-nvvm", "nvidia-cuda-crt", "nvidia-cuda-runtime", "nvidia-cuda-cccl",
                "nvidia-cuda-culibos"} <= set(pins)
        assert all(v.startswith(name + ".") for v in pins.values()), pins
    assert toolkits.known()[0] == "system"
    assert set(toolkits.DEFAULT_TOOLKITS) <= set(toolkits.known())


@pytest.mark.parametrize("version, image", [("13.0.88", "cu130"), ("13.2.86", "cu132"), ("12.9", "cu129")])
def test_image_name(version, image):
    assert toolkits.image_name(version) == image


def test_layout_completed_like_a_system_install(tmp_path):
    root = tmp_path / "nvidia" / "cu13"
    (root / "lib").mkdir(parents=True)
    (root / "include").mkdir()
    (root / "lib" / "libcudart.so.13").write_bytes(b"")
    (root / "lib" / "libcudart_static.a").write_bytes(b"")
    toolkits._complete_layout(str(root))
    toolkits._complete_layout(str(root))  # idempotent
    assert os.readlink(root / "lib" / "libcudart.so") == "libcudart.so.13"
    assert (root / "lib64" / "libcudart_static.a").exists()
    assert (root / "targets" / "x86_64-linux" / "include").resolve() == (root / "include").resolve()


def test_no_system_toolkit_says_what_to_do(monkeypatch):
    monkeypatch.delenv("CUDACXX", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(os.path, "isfile", lambda path: False)
    with pytest.raises(toolkits.ToolkitError, match="no system CUDA toolkit: set CUDACXX.*--toolkit 13.2"):
        toolkits.system_nvcc()


def test_unknown_pypi_toolkit():
    with pytest.raises(toolkits.ToolkitError, match="unknown PyPI toolkit '11.8'"):
        toolkits.install("11.8")


@pytest.mark.skipif(bool(os.environ.get("ASTRAI_TEST_INSTALLED")),
                    reason="the offline-install proof traps nvcc: running it there would fail the proof")
def test_system_nvcc_version():
    try:
        nvcc = toolkits.system_nvcc()
    except toolkits.ToolkitError:
        pytest.skip("no system CUDA toolkit")
    assert toolkits.nvcc_version(nvcc).count(".") in (1, 2)
