"""Read the CUDA driver version and the visible devices from libcuda.so.1 through ctypes, with no CUDA context."""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass

LIBCUDA = "libcuda.so.1"
CUDA_SUCCESS = 0
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76

# Names for the results seen on machines without a usable GPU, for when cuGetErrorName itself fails.
_KNOWN_ERRORS = {
    3: "CUDA_ERROR_NOT_INITIALIZED",
    34: "CUDA_ERROR_STUB_LIBRARY",
    35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    304: "CUDA_ERROR_OPERATING_SYSTEM",
    999: "CUDA_ERROR_UNKNOWN",
}

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_lib_error: str | None = None


@dataclass(frozen=True)
class Device:
    """One visible CUDA device: its ordinal (after CUDA_VISIBLE_DEVICES), name and compute capability."""

    index: int
    name: str
    major: int
    minor: int

    @property
    def capability(self) -> str:
        return f"{self.major}.{self.minor}"

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}"

    def describe(self) -> str:
        return f"device {self.index} ({self.name}, {self.sm})"


def _libcuda() -> tuple[ctypes.CDLL | None, str | None]:
    """The driver library, opened once per process, or None and why it could not be opened."""
    global _lib, _lib_error
    with _lock:
        if _lib is None and _lib_error is None:
            try:
                _lib = ctypes.CDLL(LIBCUDA)
            except OSError as exc:
                _lib_error = f"{LIBCUDA} cannot be loaded (no NVIDIA driver installed?): {exc}"
        return _lib, _lib_error


def _error_name(lib: ctypes.CDLL, code: int) -> str:
    name = ctypes.c_char_p()
    try:
        if lib.cuGetErrorName(ctypes.c_int(code), ctypes.byref(name)) == CUDA_SUCCESS and name.value:
            return f"{name.value.decode(errors='replace')} ({code})"
    except (AttributeError, OSError):
        pass
    return f"{_KNOWN_ERRORS.get(code, 'CUresult')} ({code})"


def _call(lib: ctypes.CDLL, func: str, *args) -> str | None:
    """Call a driver entry point; None on success, else a readable error."""
    try:
        code = int(getattr(lib, func)(*args))
    except (AttributeError, OSError) as exc:
        return f"{func} is unavailable in {LIBCUDA}: {exc}"
    if code == CUDA_SUCCESS:
        return None
    return f"{func} failed: {_error_name(lib, code)}"


def driver_version() -> tuple[int | None, str]:
    """The CUDA version the driver supports (1000*major + 10*minor, e.g. 13000) and "", or None and why.

    `cuDriverGetVersion` needs no `cuInit` and creates no context.
    """
    try:
        lib, error = _libcuda()
        if lib is None:
            return None, error or f"{LIBCUDA} cannot be loaded"
        version = ctypes.c_int(0)
        error = _call(lib, "cuDriverGetVersion", ctypes.byref(version))
        if error is not None:
            return None, error
        if version.value <= 0:
            return None, f"cuDriverGetVersion returned {version.value}"
        return version.value, ""
    except Exception as exc:  # never let a driver quirk escape: the loader reports it instead
        return None, f"reading the driver version failed: {type(exc).__name__}: {exc}"


def devices() -> tuple[tuple[Device, ...], str]:
    """The devices the driver shows this process and "", or () and why none are visible.

    Calls `cuInit(0)`, which honours CUDA_VISIBLE_DEVICES and creates no context; torch's CUDA state is
    not touched.
    """
    try:
        lib, error = _libcuda()
        if lib is None:
            return (), error or f"{LIBCUDA} cannot be loaded"
        error = _call(lib, "cuInit", ctypes.c_uint(0))
        if error is not None:
            return (), error
        count = ctypes.c_int(0)
        error = _call(lib, "cuDeviceGetCount", ctypes.byref(count))
        if error is not None:
            return (), error
        if count.value <= 0:
            return (), "the driver reports no CUDA device"
        found = []
        for ordinal in range(count.value):
            handle = ctypes.c_int(0)
            major = ctypes.c_int(0)
            minor = ctypes.c_int(0)
            raw_name = ctypes.create_string_buffer(256)
            error = (
                _call(lib, "cuDeviceGet", ctypes.byref(handle), ctypes.c_int(ordinal))
                or _call(lib, "cuDeviceGetAttribute", ctypes.byref(major),
                         ctypes.c_int(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), handle)
                or _call(lib, "cuDeviceGetAttribute", ctypes.byref(minor),
                         ctypes.c_int(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR), handle)
                or _call(lib, "cuDeviceGetName", raw_name, ctypes.c_int(len(raw_name)), handle)
            )
            if error is not None:
                return (), f"querying device {ordinal}: {error}"
            name = raw_name.value.decode(errors="replace") or f"CUDA device {ordinal}"
            found.append(Device(index=ordinal, name=name, major=major.value, minor=minor.value))
        return tuple(found), ""
    except Exception as exc:  # never let a driver quirk escape: the loader reports it instead
        return (), f"querying devices failed: {type(exc).__name__}: {exc}"


def format_version(version: int | None) -> str:
    """13000 -> "13.0"; None -> "none"."""
    if version is None:
        return "none"
    return f"{version // 1000}.{(version % 1000) // 10}"
