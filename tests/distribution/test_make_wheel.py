"""ci/make_wheel.py: one +cu<MAJOR> manylinux wheel from the per-toolkit wheels, and what it refuses."""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import zipfile
from pathlib import Path

import make_wheel
import pytest
import verify_artifacts as va

REPO = Path(__file__).resolve().parents[2]

WHEEL_META = {"METADATA": "Metadata-Version: 2.2\nName: astrai-kernels\nVersion: 0.1.0\n",
              "WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: py3-none-linux_x86_64\n"}


@pytest.fixture(autouse=True)
def _policies():
    if va.load_policies() is None:
        pytest.skip("auditwheel (its manylinux policy table) is not installed")


def raw_wheel(out: Path, image: Path, name: str | None = None, extra: dict[str, bytes] | None = None,
              cuda: str | None = None) -> Path:
    """A wheel as `nox -s build` makes it: the Python package and one image (renamed to `name`, its
    image.json relabelled as built by CUDA `cuda`: how the tests fabricate a cu12 image from a real one)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "astrai_kernels-0.1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(path, "w") as zf:
        extra = extra or {}
        for source in sorted((REPO / "astrai").rglob("*.py")):
            if source.relative_to(REPO).as_posix() not in extra:
                zf.write(source, source.relative_to(REPO).as_posix())
        name = name or image.name
        for f in sorted(image.iterdir()):
            data = f.read_bytes()
            if f.name == "image.json":
                meta = json.loads(data)
                meta["image"] = name
                if cuda:
                    meta["cuda_version"] = cuda
                    meta["cuda_major"], meta["cuda_minor"] = (int(x) for x in cuda.split(".")[:2])
                data = json.dumps(meta).encode()
            zf.writestr(f"astrai/extension/lib/{name}/{f.name}", data)
        for member, data in extra.items():
            zf.writestr(member, data)
        for member, text in WHEEL_META.items():
            zf.writestr(f"astrai_kernels-0.1.0.dist-info/{member}", text)
        zf.writestr("astrai_kernels-0.1.0.dist-info/RECORD", "")
    return path


def test_two_toolkits_make_one_cu13_wheel(real_image, tmp_path):
    if not real_image.name.startswith("cu13"):
        pytest.skip(f"the tree's image is {real_image.name}, not a cu13 one")
    first = raw_wheel(tmp_path / "a", real_image)
    second = raw_wheel(tmp_path / "b", real_image, name="cu139")
    out = Path(make_wheel.make_wheel([str(first), str(second)], 13, str(tmp_path / "dist")))
    assert re.fullmatch(r"astrai_kernels-0\.1\.0\+cu13-py3-none-manylinux_2_\d+_x86_64\.whl", out.name)
    with zipfile.ZipFile(out) as zf:
        names = zf.namelist()
        assert {f"astrai/extension/lib/{i}/image.json" for i in (real_image.name, "cu139")} <= set(names)
        info = "astrai_kernels-0.1.0+cu13.dist-info/"
        assert "Version: 0.1.0+cu13" in zf.read(info + "METADATA").decode()
        tag = out.name.split("-py3-none-")[1][:-4]
        assert zf.read(info + "WHEEL").decode().count("Tag: ") == 1
        assert f"Tag: py3-none-{tag}" in zf.read(info + "WHEEL").decode()
        for line in zf.read(info + "RECORD").decode().splitlines():  # every file hashed, as pip checks
            member, digest, size = line.split(",")
            if member == info + "RECORD":
                continue
            data = zf.read(member)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == f"sha256={expected}" and int(size) == len(data), member
        assert len(zf.read(info + "RECORD").decode().splitlines()) == len(names)
    report = va.verify(str(out), archs=None, ptx_archs=None, policies=va.load_policies())
    assert report.problems == [], report.problems


def test_refuses_an_image_of_another_major(real_image, tmp_path):
    wheel = raw_wheel(tmp_path / "a", real_image, name="cu129")
    with pytest.raises(SystemExit, match="the cu13 wheel needs cu13\\* images only"):
        make_wheel.make_wheel([str(wheel)], 13, str(tmp_path / "dist"))


def test_refuses_different_python_files(real_image, tmp_path):
    first = raw_wheel(tmp_path / "a", real_image)
    second = raw_wheel(tmp_path / "b", real_image, name="cu139", extra={"astrai/__init__.py": b"# other tree\n"})
    with pytest.raises(SystemExit, match="astrai/__init__.py differs between the input wheels"):
        make_wheel.make_wheel([str(first), str(second)], 13, str(tmp_path / "dist"))


def test_refuses_a_damaged_image(real_image, tmp_path):
    image = shutil.copytree(real_image, tmp_path / "img" / real_image.name)
    lib = next(image.glob("*.so"))
    lib.write_bytes(lib.read_bytes()[:-100])
    wheel = raw_wheel(tmp_path / "a", image)
    with pytest.raises(SystemExit, match="the images fail their checks"):
        make_wheel.make_wheel([str(wheel)], int(real_image.name[2:4]), str(tmp_path / "dist"))


def test_cu12_wheel_from_a_fabricated_cu12_image(real_image, tmp_path):
    wheel = raw_wheel(tmp_path / "a", real_image, name="cu129", cuda="12.9.86")
    out = Path(make_wheel.make_wheel([str(wheel)], 12, str(tmp_path / "dist")))
    assert out.name.startswith("astrai_kernels-0.1.0+cu12-py3-none-manylinux_2_")
    report = va.verify(str(out), policies=va.load_policies())
    assert report.problems == [] and report.images == ["cu129 (CUDA 12.9.86)"]
