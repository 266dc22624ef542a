"""`python -m astrai.extension info|verify` run as subprocesses on fabricated roots, with no GPU visible."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import astrai

REPO = Path(__file__).resolve().parents[2]
# Where the `astrai` under test lives: the source tree, or site-packages when the tier-0 suite runs
# against an installed wheel or conda package (ci/offline_install.py); subprocesses import the same one.
PACKAGE_PARENT = Path(astrai.__file__).resolve().parents[1]


def run_cli(*args: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("ASTRAI_IMAGE", "ASTRAI_IMAGE_PATH", "CONDA_PREFIX")}
    env.update({
        "ASTRAI_IGNORE_PACKAGE_IMAGES": "1",
        "CUDA_VISIBLE_DEVICES": "",  # no GPU visible, even on a GPU machine
        "PYTHONPATH": os.pathsep.join([str(PACKAGE_PARENT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    })
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "astrai.extension", *args], env=env, cwd=PACKAGE_PARENT,
                          capture_output=True, text=True, timeout=120)


@pytest.fixture
def root(tmp_path, make_image) -> Path:
    images = tmp_path / "images"
    make_image(images, "cu130")
    make_image(images, "cu128", cuda="12.8.93")
    make_image(images, "cu131", cuda="13.1.80", bad_sha=("rotary",))  # preferred, checked, rejected
    return images


def test_info_human(tmp_path, root):
    result = run_cli("info", env_extra={"ASTRAI_IMAGE_PATH": f"{tmp_path / 'missing'}:{root}"})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "no GPU visible" in out
    assert "cu130" in out and "cu128" in out and "cu131" in out
    assert "checksums verified" in out and "checksums not checked" in out
    assert "CHOSEN" in out and "sha256 mismatch" in out
    assert "registration only" in out
    assert "does not exist" in out
    assert "ASTRAI_IGNORE_PACKAGE_IMAGES=1" in out


def test_info_json(tmp_path, root):
    result = run_cli("info", "--json", env_extra={"ASTRAI_IMAGE_PATH": str(root)})
    assert result.returncode == 0, result.stderr
    desc = json.loads(result.stdout)
    assert desc["gpu_visible"] is False
    assert desc["devices"] == []
    assert desc["torch"]["version"]
    assert {i["name"]: i["status"] for i in desc["images"]} == {"cu128": "eligible", "cu130": "chosen",
                                                                    "cu131": "rejected"}
    assert desc["chosen"] == {"image": "cu130", "path": str(root / "cu130"), "registration_only": True,
                              "serves": None}
    assert desc["loaded_families"] == {}
    assert desc["overrides"]["ASTRAI_IMAGE_PATH"] == str(root)
    assert desc["roots"][1] == {"source": "package", "path": desc["roots"][1]["path"], "status": "ignored",
                                "note": "ignored (ASTRAI_IGNORE_PACKAGE_IMAGES=1)", "images": []}


def test_info_with_forced_missing_image_still_runs(tmp_path, root):
    result = run_cli("info", env_extra={"ASTRAI_IMAGE_PATH": str(root), "ASTRAI_IMAGE": "cu999"})
    assert result.returncode == 0, result.stderr
    assert "chosen     none: ASTRAI_IMAGE=cu999: no image named 'cu999'" in result.stdout
    assert "ASTRAI_IMAGE=cu999" in result.stdout.splitlines()[-1]


def test_verify_fails_on_mismatch_and_unloadable_library(tmp_path, root):
    result = run_cli("verify", "--json", env_extra={"ASTRAI_IMAGE_PATH": str(root)})
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["ok"] is False
    assert any(c["image"] == "cu131" and not c["ok"] for c in report["checksums"])
    # the dummy bytes are no ELF file: torch.ops.load_library refuses them
    assert report["loads"][0]["family"] == "rotary" and report["loads"][0]["ok"] is False
    human = run_cli("verify", env_extra={"ASTRAI_IMAGE_PATH": str(root)})
    assert human.returncode == 1
    assert "result: FAILED" in human.stdout


def test_import_never_raises_or_scans(tmp_path):
    code = ("import astrai.extension.loader as l; "
            "assert l._state.selection is None; print('ok')")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"PYTHONPATH": str(PACKAGE_PARENT), "ASTRAI_IMAGE": "cu999",
                "ASTRAI_IMAGE_PATH": f"{tmp_path / 'missing'}::/dev/null"})
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
