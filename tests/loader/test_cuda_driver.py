"""ctypes access to libcuda.so.1 against a fake driver library: versions, devices and every failure."""

from __future__ import annotations

import ctypes

import pytest

from astrai.extension import _cuda_driver
from astrai.extension._cuda_driver import Device


class FakeLibcuda:
    """Stands in for ctypes.CDLL("libcuda.so.1"): same entry points, results written through byref."""

    def __init__(self, devices=((9, 0, b"NVIDIA H200"),), version=13000, init_rc=0):
        self.devices, self.version, self.init_rc = devices, version, init_rc
        self.calls = []

    def cuGetErrorName(self, code, out):
        out._obj.value = {100: b"CUDA_ERROR_NO_DEVICE", 34: b"CUDA_ERROR_STUB_LIBRARY"}.get(code.value, b"X")
        return 0

    def cuDriverGetVersion(self, out):
        self.calls.append("cuDriverGetVersion")
        out._obj.value = self.version
        return 0

    def cuInit(self, flags):
        self.calls.append("cuInit")
        return self.init_rc

    def cuDeviceGetCount(self, out):
        out._obj.value = len(self.devices)
        return 0

    def cuDeviceGet(self, out, ordinal):
        out._obj.value = ordinal.value
        return 0

    def cuDeviceGetAttribute(self, out, attribute, device):
        major, minor, _ = self.devices[device.value]
        out._obj.value = {75: major, 76: minor}[attribute.value]
        return 0

    def cuDeviceGetName(self, buffer, length, device):
        buffer.value = self.devices[device.value][2]
        return 0


@pytest.fixture
def libcuda(monkeypatch):
    def install(lib=None, error=None):
        monkeypatch.setattr(_cuda_driver, "_lib", lib)
        monkeypatch.setattr(_cuda_driver, "_lib_error", error)
        return lib
    return install


def test_version_needs_no_init(libcuda):
    lib = libcuda(FakeLibcuda(version=12080))
    assert _cuda_driver.driver_version() == (12080, "")
    assert lib.calls == ["cuDriverGetVersion"]
    assert _cuda_driver.format_version(12080) == "12.8"
    assert _cuda_driver.format_version(None) == "none"


def test_devices(libcuda):
    libcuda(FakeLibcuda(devices=((9, 0, b"NVIDIA H200"), (12, 0, b"NVIDIA RTX PRO 6000"))))
    found, reason = _cuda_driver.devices()
    assert reason == ""
    assert found == (Device(0, "NVIDIA H200", 9, 0), Device(1, "NVIDIA RTX PRO 6000", 12, 0))
    assert found[1].sm == "sm_120" and found[1].capability == "12.0"


def test_no_device(libcuda):
    libcuda(FakeLibcuda(init_rc=100))
    assert _cuda_driver.devices() == ((), "cuInit failed: CUDA_ERROR_NO_DEVICE (100)")


def test_stub_library(libcuda):
    libcuda(FakeLibcuda(init_rc=34))
    assert "CUDA_ERROR_STUB_LIBRARY" in _cuda_driver.devices()[1]


def test_libcuda_missing(libcuda):
    reason = "libcuda.so.1 cannot be loaded (no NVIDIA driver installed?): not found"
    libcuda(None, reason)
    assert _cuda_driver.driver_version() == (None, reason)
    assert _cuda_driver.devices()[0] == ()


def test_missing_entry_point_and_exceptions_are_reasons(libcuda):
    class Broken(FakeLibcuda):
        cuDeviceGetName = None  # calling it raises TypeError

    libcuda(Broken())
    found, reason = _cuda_driver.devices()
    assert found == () and "TypeError" in reason
    libcuda(object())
    version, reason = _cuda_driver.driver_version()
    assert version is None and "cuDriverGetVersion is unavailable" in reason


def test_real_driver_never_raises():
    version, reason = _cuda_driver.driver_version()
    assert (version is None) == bool(reason)
    found, reason = _cuda_driver.devices()
    assert isinstance(found, tuple)
    assert all(isinstance(d, Device) for d in found)


def test_byref_writes_reach_the_caller():
    # the fake relies on ctypes' byref exposing the wrapped object as _obj
    value = ctypes.c_int(0)
    ctypes.byref(value)._obj.value = 5
    assert value.value == 5
