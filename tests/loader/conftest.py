"""Fixtures for loader tests: fabricated image directories and a faked driver, device list and torch."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from astrai.extension import loader
from astrai.extension._cuda_driver import Device

DEFAULT_SASS = ("sm_80", "sm_89", "sm_90a", "sm_120a")
DEFAULT_PTX = ("compute_80",)
NO_DRIVER = "libcuda.so.1 cannot be loaded (faked: no NVIDIA driver)"


def write_image(root: Path, name: str, *, cuda: str = "13.0.88", families=("rotary",),
                sass=DEFAULT_SASS, ptx=DEFAULT_PTX, per_family: dict | None = None, bad_sha=(),
                missing=(), schema_version: int = 1, raw: str | None = None) -> Path:
    """Write `<root>/<name>/image.json` plus dummy library bytes.

    per_family maps a family to {"sass": [...], "ptx": [...]} overriding the defaults; families in
    `bad_sha` get a wrong sha256 in image.json; families in `missing` have no file; `raw` replaces the
    whole image.json text.
    """
    image = root / name
    image.mkdir(parents=True)
    if raw is not None:
        (image / "image.json").write_text(raw)
        return image
    major, minor = (int(part) for part in cuda.split(".")[:2])
    libraries = {}
    for family in families:
        spec = (per_family or {}).get(family, {})
        file = f"astrai_{family}.so"
        data = f"not a real library: image {name}, family {family}\n".encode()
        if family not in missing:
            (image / file).write_bytes(data)
        digest = hashlib.sha256(b"something else" if family in bad_sha else data).hexdigest()
        libraries[family] = {"file": file, "sha256": digest, "size": len(data),
                             "sass": list(spec.get("sass", sass)), "ptx": list(spec.get("ptx", ptx))}
    meta = {
        "schema_version": schema_version,
        "image": name,
        "cuda_version": cuda,
        "cuda_major": major,
        "cuda_minor": minor,
        "archs": ["80", "89", "90a", "120a"],
        "git_revision": "unknown",
        "build_flags": "-O3 (fabricated)",
        "built_at": "2026-11-29T13:00:00Z",
        "libraries": libraries,
    }
    (image / "image.json").write_text(json.dumps(meta, indent=2))
    return image


class FakeMachine:
    """Configure roots, images, driver, devices and torch's CUDA version; then call `select()`."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp = tmp_path
        self.mp = monkeypatch
        self.driver: int | None = None
        self.driver_reason = NO_DRIVER
        self.devices: tuple[Device, ...] = ()
        self.devices_reason = ""
        self.torch_cuda: str | None = "13.0"
        self.loads: list[str] = []
        self.load_error: Exception | None = None
        self.path_entries: list[Path] = []
        self.root = self.add_root("images")

    def add_root(self, name: str) -> Path:
        root = self.tmp / name
        root.mkdir(parents=True, exist_ok=True)
        self.set_path(*self.path_entries, root)
        return root

    def set_path(self, *entries) -> None:
        self.path_entries = [Path(e) for e in entries]
        self.mp.setenv(loader.ENV_IMAGE_PATH, ":".join(str(e) for e in entries))

    def image(self, name: str, root: Path | None = None, **kwargs) -> Path:
        return write_image(root or self.root, name, **kwargs)

    def gpu(self, *capabilities: tuple[int, int], driver: int = 13000) -> None:
        self.driver, self.driver_reason = driver, ""
        self.devices = tuple(Device(index=i, name=f"Fake GPU sm_{major}{minor}", major=major, minor=minor)
                             for i, (major, minor) in enumerate(capabilities))
        self.devices_reason = "" if capabilities else "cuInit failed: CUDA_ERROR_NO_DEVICE (100)"

    def force(self, name: str) -> None:
        self.mp.setenv(loader.ENV_IMAGE, name)

    def select(self) -> loader.Selection:
        loader.reset()
        return loader.selection()

    def record(self, name: str) -> loader.ImageRecord:
        (found,) = [r for r in loader.selection().images if r.name == name]
        return found

    # replacements for the loader's query functions
    def _driver(self):
        return self.driver, self.driver_reason

    def _devices(self):
        return self.devices, self.devices_reason

    def _torch(self):
        return "2.13.0+fake", self.torch_cuda, ""

    def _load(self, path: str) -> None:
        if self.load_error is not None:
            raise self.load_error
        self.loads.append(path)


@pytest.fixture
def make_image():
    """`write_image` for tests that need images without the faked machine (subprocess tests)."""
    return write_image


@pytest.fixture
def fake(tmp_path, monkeypatch) -> FakeMachine:
    for name in (loader.ENV_IMAGE, loader.ENV_IMAGE_PATH, loader.ENV_CONDA_PREFIX):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(loader.ENV_IGNORE_PACKAGE_IMAGES, "1")
    machine = FakeMachine(tmp_path, monkeypatch)
    monkeypatch.setattr(loader, "query_driver_version", machine._driver)
    monkeypatch.setattr(loader, "query_devices", machine._devices)
    monkeypatch.setattr(loader, "query_torch", machine._torch)
    monkeypatch.setattr(loader, "load_library", machine._load)
    monkeypatch.setattr(loader, "torch_cuda_available", lambda: False)
    loader.reset()
    yield machine
    loader.reset()
