"""Find prebuilt kernel images, pick one per process, load op families lazily, and explain every choice.

An image is a directory holding `image.json` and one `astrai_<family>.so` per family (docs/contracts.md).
Search roots, in order: `ASTRAI_IMAGE_PATH` (colon-separated), the package's `lib/`, then
`$CONDA_PREFIX/lib/astrai-kernels`. The scan happens on first use, never at import, and importing this
module never raises. Environment knobs, read at first use (call `reset()` to read them again):

- `ASTRAI_IMAGE=<name>`: force the image with that directory name; strict, an unusable one makes every
  `load_family` raise with the reason.
- `ASTRAI_IMAGE_PATH=<dir>[:<dir>...]`: extra roots searched first; an entry is a directory of image
  directories or an image directory itself.
- `ASTRAI_IGNORE_PACKAGE_IMAGES=1`: test knob; skip the images shipped inside the package so that tests
  see only the roots they fabricate.

Checksums are verified for the image about to be chosen (a mismatch rejects it and the next one is tried)
and, by `verify()`, for every image. With no GPU visible the preferred image is still loaded so that op
schemas register; `family_available` is then True although no kernel can run. First use calls `cuInit(0)`
(no context), as `torch.cuda.is_available()` would.

Example::

    from astrai.extension import loader
    if loader.family_available("rotary"):
        loader.load_family("rotary")       # idempotent; torch.ops.astrai.* are registered
    print(loader.info())                   # what `python -m astrai.extension info` prints

The loader's parts, one module each, re-exported here (use this module; the parts are private):

- `_loader_images`: search roots, image.json records and defects, arch matching, checksums;
- `_loader_selection`: eligibility, preference and the reason for every verdict (pure functions);
- `_loader_report`: the errors, `describe` / `format_info` and `verify` / `format_verify`;
- this module: the queries of the machine, the per-process state, `selection()`, `load_family`.

The queries of the machine (`query_driver_version`, `query_devices`, `query_torch`, `load_library`,
`torch_cuda_available`, `find_smoke_test`), `PACKAGE_LIB_DIR` and `_scan` are read from this module's globals at
call time and passed to the parts, so that `monkeypatch.setattr(loader, name, ...)` takes effect everywhere.
"""

from __future__ import annotations

import importlib
import os
import threading
import warnings
from pathlib import Path
from typing import Any, Callable

from . import _cuda_driver, _fallbacks, _loader_report
from ._cuda_driver import Device
from ._loader_images import (CONDA_SUBDIR, ENV_CONDA_PREFIX, ENV_IGNORE_PACKAGE_IMAGES, ENV_IMAGE, ENV_IMAGE_PATH,
                             FAMILY_RE, OVERRIDE_VARS, SCHEMA_VERSION, SOURCE_CONDA, SOURCE_ENV, SOURCE_PACKAGE,
                             Arch, ImageRecord, Library, Root, parse_arch, sha256_file)
from ._loader_images import scan
from ._loader_report import (INFO_COMMAND, FamilyUnavailableError, PTXJITWarning, format_info, format_verify,
                             unavailable_message)
from ._loader_selection import Selection, choose, failed_selection, family_problem

__all__ = [
    "Arch", "Device", "FamilyUnavailableError", "ImageRecord", "Library", "PTXJITWarning", "Root", "Selection",
    "describe", "family_available", "find_smoke_test", "format_info", "format_verify", "info", "load_family",
    "load_library", "loaded_families", "parse_arch", "query_devices", "query_driver_version", "query_torch",
    "reset", "selection", "sha256_file", "torch_cuda_available", "verify",
    "CONDA_SUBDIR", "ENV_CONDA_PREFIX", "ENV_IGNORE_PACKAGE_IMAGES", "ENV_IMAGE", "ENV_IMAGE_PATH", "INFO_COMMAND",
    "OVERRIDE_VARS", "PACKAGE_LIB_DIR", "SCHEMA_VERSION", "SOURCE_CONDA", "SOURCE_ENV", "SOURCE_PACKAGE",
]

PACKAGE_LIB_DIR = Path(__file__).resolve().parent / "lib"


# --- queries of the machine: module-level so that tests replace them with monkeypatch -------------------


def query_driver_version() -> tuple[int | None, str]:
    """CUDA version the driver supports (1000*major + 10*minor) and "", or None and why."""
    return _cuda_driver.driver_version()


def query_devices() -> tuple[tuple[Device, ...], str]:
    """Visible devices and "", or () and why none are visible."""
    return _cuda_driver.devices()


def query_torch() -> tuple[str | None, str | None, str]:
    """(torch.__version__, torch.version.cuda, "") or (None, None, why torch is missing)."""
    # torch is imported here, not at module scope, so that importing the loader stays cheap and cannot fail.
    try:
        import torch
    except Exception as exc:
        return None, None, f"torch cannot be imported: {type(exc).__name__}: {exc}"
    return str(torch.__version__), getattr(torch.version, "cuda", None), ""


def load_library(path: str) -> None:
    """Load one family library into torch's dispatcher."""
    import torch

    torch.ops.load_library(path)


def torch_cuda_available() -> bool:
    """torch.cuda.is_available(), False if torch is missing; used only by `verify`."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def find_smoke_test(family: str) -> Callable[[], Any] | None:
    """`astrai.extension.ops.<family>.smoke_test` if that module defines it, else None."""
    module_name = f"{__package__}.ops.{family}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name in (module_name, f"{__package__}.ops"):
            return None
        raise
    smoke = getattr(module, "smoke_test", None)
    return smoke if callable(smoke) else None


# --- the per-process selection ---------------------------------------------------------------------------


def _scan(env: dict[str, str]) -> tuple[list[Root], list[ImageRecord]]:
    return scan(env, PACKAGE_LIB_DIR)


def _select() -> Selection:
    env = dict(os.environ)
    torch_info = query_torch()
    driver = query_driver_version()
    devices = query_devices() if driver[0] is not None else ((), "no usable CUDA driver")
    roots, images = _scan(env)
    return choose(env, torch_info, driver, devices, roots, images)


class _State:
    def __init__(self) -> None:
        self.selection: Selection | None = None
        self.loaded: dict[str, Path] = {}
        self.failed: dict[str, str] = {}  # family -> why loading its library raised
        self.jit_warned = False


_lock = threading.RLock()
_state = _State()


def reset() -> None:
    """Forget the selection so that the next use scans again (tests). Libraries already loaded stay in torch."""
    global _state
    with _lock:
        _state = _State()


def selection() -> Selection:
    """The per-process selection, made on first use."""
    with _lock:
        if _state.selection is None:
            try:
                _state.selection = _select()
            except Exception as exc:  # a loader bug must surface as an explained unavailability, not a crash
                why = f"internal loader error while selecting an image: {type(exc).__name__}: {exc}"
                _state.selection = failed_selection(why, dict(os.environ))
        return _state.selection


def loaded_families() -> dict[str, str]:
    """Families loaded in this process and the library file each came from."""
    with _lock:
        return {family: str(path) for family, path in _state.loaded.items()}


# --- loading --------------------------------------------------------------------------------------------


def load_family(name: str, *, op: str | None = None) -> None:
    """Load the library of op family `name` from the chosen image; idempotent and thread-safe.

    Parameters
    ----------
    name : str
        Family, e.g. "rotary": loads `<image>/astrai_rotary.so` through `torch.ops.load_library`.
    op : str, optional
        Op that asked, named in the error message (e.g. "astrai::rotary_embedding").

    Raises
    ------
    FamilyUnavailableError
        No image serves the family here; the message lists every image seen and why, the overrides in
        force, and ends with `run: python -m astrai.extension info`.
    """
    with _lock:
        if name in _state.loaded:
            return
        sel = selection()
        if not isinstance(name, str) or not FAMILY_RE.match(name):
            raise FamilyUnavailableError(unavailable_message(str(name), "not a valid family name", sel, op))
        problem = _state.failed.get(name) or family_problem(name, sel)
        if problem:
            raise FamilyUnavailableError(unavailable_message(name, problem, sel, op))
        library = sel.chosen.libraries[name]
        try:
            load_library(str(library.path))
        except Exception as exc:
            cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
            _state.failed[name] = (f"loading {library.path} from image {sel.chosen.name} failed: "
                                   f"{type(exc).__name__}: {exc}{cause}")
            raise FamilyUnavailableError(unavailable_message(name, _state.failed[name], sel, op)) from exc
        _state.loaded[name] = library.path
        warn = sel.gpu_visible and sel.chosen.serves == "ptx" and not _state.jit_warned
        _state.jit_warned = _state.jit_warned or warn
    _push_policy(name)
    if warn:
        warnings.warn(f"astrai-kernels: image {sel.chosen.name} has no SASS for a visible device and runs "
                      f"through the driver's JIT ({'; '.join(sel.chosen.jit)}): the first call of each kernel "
                      f"is slower", PTXJITWarning, stacklevel=2)


def family_available(name: str) -> bool:
    """True when `load_family(name)` succeeds (it is attempted); never raises."""
    try:
        load_family(name)
        return True
    except Exception:
        return False


# --- describe, info, verify -----------------------------------------------------------------------------


def describe() -> dict[str, Any]:
    """Everything `info --json` prints: machine, roots, images with verdicts, choice, loaded families, and the
    fallbacks of this process (calls the default choice ran without the kernels: `"fallbacks"`)."""
    sel = selection()
    with _lock:
        loaded = {family: str(path) for family, path in _state.loaded.items()}
        failed = dict(_state.failed)
    desc = _loader_report.describe(sel, loaded, failed, _fallbacks.snapshot())
    desc["policy"] = {"gemm_plan": _gemm_plan_state(), "attention_plan": _attention_plan_state(),
                      "fp8_gemm": _fp8_gemm_state()}
    return desc


def _fp8_gemm_state() -> dict[str, Any]:
    """Where fp8_autocast's GEMMs (and fp8 `quant_gemm` calls) run on the current CUDA device: {"device", "runs":
    "quant_gemm" | "torch._scaled_mm", "why"}. Reads the image record; loads nothing."""
    if not torch_cuda_available():
        return {"device": None, "runs": "torch._scaled_mm", "why": "no CUDA device"}
    import torch
    index = torch.cuda.current_device()
    from astrai.extension.ops import gemm  # imports the loader: here, at call time
    why = gemm.fp8_unavailable_reason(index)
    return {"device": index, "runs": "torch._scaled_mm" if why else "quant_gemm", "why": why or ""}


def _push_policy(family: str) -> None:
    """The policy's launch switches into a family's library as it loads (also when it is loaded directly, not
    through its ops module): its launchers read no environment."""
    if family == "attention":
        from astrai.extension.ops import attention_plan  # imports the loader: here, at call time
        attention_plan.sync_native()
    elif family == "gemm":
        from astrai.extension.ops import gemm_plan
        gemm_plan.sync_native()


def _attention_plan_state() -> dict[str, Any]:
    """The attention policy's switches (`attention_plan.state()`)."""
    from astrai.extension.ops import attention_plan  # imports the loader: here, at call time
    return attention_plan.state()


def _gemm_plan_state() -> dict[str, Any]:
    """The GEMM plan chain's settings (`gemm_plan.state()`), or why they could not be read (a bad seed file)."""
    from astrai.extension.ops import gemm_plan  # imports the loader: here, at call time
    try:
        return gemm_plan.state()
    except (ValueError, OSError) as exc:
        return {"error": str(exc)}


def info() -> str:
    """What `python -m astrai.extension info` prints."""
    return format_info(describe())


def verify(smoke: bool = True) -> dict[str, Any]:
    """Recompute every checksum, load every family of the chosen image, smoke-launch each where a GPU is
    present. Returns a report; `report["ok"]` is False on any failure."""
    return _loader_report.verify(selection(), smoke, load_family=load_family,
                                 torch_cuda_available=torch_cuda_available, find_smoke_test=find_smoke_test)
