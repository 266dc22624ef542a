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
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from . import _cuda_driver
from ._cuda_driver import Device, format_version

SCHEMA_VERSION = 1
INFO_COMMAND = "python -m astrai.extension info"

ENV_IMAGE = "ASTRAI_IMAGE"
ENV_IMAGE_PATH = "ASTRAI_IMAGE_PATH"
ENV_IGNORE_PACKAGE_IMAGES = "ASTRAI_IGNORE_PACKAGE_IMAGES"
ENV_CONDA_PREFIX = "CONDA_PREFIX"
OVERRIDE_VARS = (ENV_IMAGE, ENV_IMAGE_PATH, ENV_IGNORE_PACKAGE_IMAGES, ENV_CONDA_PREFIX)

PACKAGE_LIB_DIR = Path(__file__).resolve().parent / "lib"
CONDA_SUBDIR = Path("lib") / "astrai-kernels"

SOURCE_ENV = "ASTRAI_IMAGE_PATH"
SOURCE_PACKAGE = "package"
SOURCE_CONDA = "CONDA_PREFIX"

_FAMILY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ARCH_RE = re.compile(r"^(sm|compute)_(\d{2,3})([af]?)$")
_SHA256_RE = re.compile(r"^[0-9a-fA-F]{64}$")


class FamilyUnavailableError(RuntimeError):
    """An op family cannot be loaded; the message says what was asked, every image seen, and why."""


class PTXJITWarning(UserWarning):
    """The chosen image runs on some visible device only through the driver's PTX JIT (slow first call)."""


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


# --- arches ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Arch:
    """One `sm_XY[a|f]` (SASS) or `compute_XY[a|f]` (PTX) entry of image.json."""

    text: str
    kind: str  # "sm" or "compute"
    major: int
    minor: int
    suffix: str  # "", "a" or "f"

    def runs_on(self, major: int, minor: int) -> bool:
        """Arch rules of docs/contracts.md for a device of compute capability major.minor."""
        if self.suffix == "a":
            return (major, minor) == (self.major, self.minor)
        if self.kind == "compute" and not self.suffix:
            return (major, minor) >= (self.major, self.minor)
        return major == self.major and minor >= self.minor  # sm_XY, sm_XYf, compute_XYf


def parse_arch(text: str) -> Arch | None:
    """"sm_90a" -> Arch(sm, 9, 0, "a"); "compute_80" -> Arch(compute, 8, 0, ""); None if unrecognised."""
    match = _ARCH_RE.match(text) if isinstance(text, str) else None
    if match is None:
        return None
    digits = match.group(2)
    return Arch(text, match.group(1), int(digits[:-1]), int(digits[-1]), match.group(3))


# --- records --------------------------------------------------------------------------------------------


@dataclass
class Library:
    """One family library listed in image.json."""

    family: str
    file: str
    path: Path
    sha256: str
    size: int | None
    sass: tuple[str, ...]
    ptx: tuple[str, ...]


@dataclass
class ImageRecord:
    """One image directory found in a root, with the verdict on it."""

    name: str
    path: Path
    root: Path
    source: str
    order: int
    meta: dict = field(default_factory=dict)
    cuda_version: str | None = None
    cuda_major: int | None = None
    cuda_minor: int | None = None
    libraries: dict[str, Library] = field(default_factory=dict)
    defects: list[str] = field(default_factory=list)  # unusable whatever the machine
    status: str = "found"  # found -> rejected | eligible | chosen
    reason: str = ""
    serves: str | None = None  # "sass" or "ptx" once it is known to run on every visible device
    jit: list[str] = field(default_factory=list)  # device/library pairs that need the PTX JIT
    checksums: str = "not checked"  # "verified" or "mismatch" once the image was a candidate

    @property
    def toolkit(self) -> tuple[int, ...]:
        parts = re.findall(r"\d+", self.cuda_version or "")
        if len(parts) >= 2 and (int(parts[0]), int(parts[1])) == (self.cuda_major, self.cuda_minor):
            return tuple(int(p) for p in (parts + ["0"])[:3])
        return (self.cuda_major or 0, self.cuda_minor or 0, 0)

    @property
    def toolkit_text(self) -> str:
        if self.cuda_version:
            return self.cuda_version
        if self.cuda_major is None:
            return "unknown"
        return f"{self.cuda_major}.{self.cuda_minor}"

    def reject(self, reason: str) -> None:
        self.status = "rejected"
        self.reason = reason
        self.serves = None


@dataclass
class Root:
    """One search root and what scanning it found."""

    source: str
    path: Path | None
    status: str = "scanned"  # scanned | missing | unreadable | ignored | unset | duplicate
    note: str = ""
    images: list[str] = field(default_factory=list)


@dataclass
class Selection:
    """The per-process choice of image and everything seen while making it (treat as read-only)."""

    torch_version: str | None
    torch_cuda: str | None
    torch_error: str
    driver_version: int | None
    driver_reason: str
    devices: tuple[Device, ...]
    devices_reason: str
    roots: list[Root]
    images: list[ImageRecord]
    chosen: ImageRecord | None
    why: str  # why the chosen image won, or why there is none
    forced: str | None
    overrides: dict[str, str]

    @property
    def gpu_visible(self) -> bool:
        return self.driver_version is not None and bool(self.devices)

    @property
    def registration_only(self) -> bool:
        """The chosen image is loaded only so that op schemas register: no GPU is visible."""
        return self.chosen is not None and not self.gpu_visible


# --- scanning -------------------------------------------------------------------------------------------


def _env_flag(env: dict[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # e.g. a directory we may not enter
        return False


def _root_list(env: dict[str, str]) -> list[Root]:
    roots = []
    for entry in env.get(ENV_IMAGE_PATH, "").split(os.pathsep):
        if entry.strip():
            roots.append(Root(SOURCE_ENV, Path(entry.strip()).expanduser()))
    if _env_flag(env, ENV_IGNORE_PACKAGE_IMAGES):
        roots.append(Root(SOURCE_PACKAGE, PACKAGE_LIB_DIR, "ignored",
                          f"ignored ({ENV_IGNORE_PACKAGE_IMAGES}={env[ENV_IGNORE_PACKAGE_IMAGES]})"))
    else:
        roots.append(Root(SOURCE_PACKAGE, PACKAGE_LIB_DIR))
    prefix = env.get(ENV_CONDA_PREFIX, "").strip()
    if prefix:
        roots.append(Root(SOURCE_CONDA, Path(prefix).expanduser() / CONDA_SUBDIR))
    else:
        roots.append(Root(SOURCE_CONDA, None, "unset", f"{ENV_CONDA_PREFIX} is not set"))
    return roots


def _scan(env: dict[str, str]) -> tuple[list[Root], list[ImageRecord]]:
    roots = _root_list(env)
    images: list[ImageRecord] = []
    seen: dict[str, Root] = {}
    for root in roots:
        if root.status != "scanned":
            continue
        key = os.path.realpath(root.path)
        if key in seen:
            root.status, root.note = "duplicate", f"same directory as the {seen[key].source} root"
            continue
        seen[key] = root
        if _is_file(root.path / "image.json"):  # the entry is itself an image directory
            image_dirs = [root.path]
        else:
            try:
                entries = sorted(os.scandir(root.path), key=lambda e: e.name)
            except FileNotFoundError:
                root.status, root.note = "missing", "does not exist"
                continue
            except NotADirectoryError:
                root.status, root.note = "unreadable", "is not a directory"
                continue
            except OSError as exc:
                root.status, root.note = "unreadable", f"cannot be read: {exc.strerror or exc}"
                continue
            image_dirs = []
            skipped = []
            for entry in entries:
                try:
                    if not entry.is_dir():
                        continue
                except OSError:
                    continue
                if _is_file(Path(entry.path) / "image.json"):
                    image_dirs.append(Path(entry.path))
                elif not entry.name.startswith((".", "__")):
                    skipped.append(entry.name)
            if skipped:
                root.note = "skipped (no image.json): " + ", ".join(skipped)
            elif not image_dirs:
                root.note = "no image directories"
        for image_dir in image_dirs:
            record = _read_image(image_dir, root, len(images))
            images.append(record)
            root.images.append(record.name)
    return roots, images


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _str_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _read_image(path: Path, root: Root, order: int) -> ImageRecord:
    record = ImageRecord(name=path.name, path=path, root=root.path, source=root.source, order=order)
    try:
        meta = json.loads((path / "image.json").read_text(encoding="utf-8"))
    except OSError as exc:
        record.defects.append(f"image.json cannot be read: {exc.strerror or exc}")
        return record
    except ValueError as exc:
        record.defects.append(f"malformed image.json: {exc}")
        return record
    if not isinstance(meta, dict):
        record.defects.append("malformed image.json: the top level is not an object")
        return record
    record.meta = meta
    schema = meta.get("schema_version")
    if not _is_int(schema) or schema < 1:
        record.defects.append(f"malformed image.json: schema_version is {schema!r}, expected a positive integer")
        return record
    if schema > SCHEMA_VERSION:
        record.defects.append(f"image.json schema_version {schema} is newer than this loader reads "
                              f"({SCHEMA_VERSION}); upgrade astrai-kernels")
        return record
    for key in ("cuda_major", "cuda_minor"):
        if not _is_int(meta.get(key)) or meta[key] < 0:
            record.defects.append(f"malformed image.json: {key} is {meta.get(key)!r}, expected an integer")
    cuda_version = meta.get("cuda_version")
    if cuda_version is not None and not isinstance(cuda_version, str):
        record.defects.append(f"malformed image.json: cuda_version is {cuda_version!r}, expected a string")
    if record.defects:
        return record
    record.cuda_major, record.cuda_minor = meta["cuda_major"], meta["cuda_minor"]
    record.cuda_version = cuda_version
    libraries = meta.get("libraries")
    if not isinstance(libraries, dict):
        record.defects.append("malformed image.json: 'libraries' is missing or not an object")
        return record
    if not libraries:
        record.defects.append("image.json lists no libraries")
        return record
    for family in sorted(libraries):
        entry = libraries[family]
        problem = _library_entry_problem(family, entry)
        if problem:
            record.defects.append(f"malformed image.json: library {family!r}: {problem}")
            continue
        library = Library(family=family, file=entry["file"], path=path / entry["file"],
                          sha256=entry["sha256"].lower(), size=entry.get("size"),
                          sass=tuple(entry["sass"]), ptx=tuple(entry["ptx"]))
        record.libraries[family] = library
        try:
            size = library.path.stat().st_size if _is_file(library.path) else None
        except OSError:
            size = None
        if size is None:
            record.defects.append(f"library file {library.file} (family '{family}') is missing")
        elif library.size is not None and size != library.size:
            record.defects.append(f"library file {library.file} is {size} bytes, image.json says {library.size} "
                                  f"(truncated or replaced)")
    return record


def _library_entry_problem(family: str, entry: Any) -> str:
    if not _FAMILY_RE.match(family):
        return "the family name is not an identifier"
    if not isinstance(entry, dict):
        return "the entry is not an object"
    name = entry.get("file")
    if not isinstance(name, str) or not name or os.path.basename(name) != name or name in (".", ".."):
        return f"file is {name!r}, expected a file name inside the image directory"
    if not isinstance(entry.get("sha256"), str) or not _SHA256_RE.match(entry["sha256"]):
        return f"sha256 is {entry.get('sha256')!r}, expected 64 hex digits"
    if entry.get("size") is not None and (not _is_int(entry["size"]) or entry["size"] < 0):
        return f"size is {entry['size']!r}, expected a byte count"
    for key in ("sass", "ptx"):
        if not _str_list(entry.get(key)):
            return f"{key} is {entry.get(key)!r}, expected a list of arch names"
    return ""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _checksum_problem(record: ImageRecord) -> str:
    """"" when every library of the image matches image.json, else the first mismatch."""
    record.checksums = "mismatch"
    for library in record.libraries.values():
        try:
            actual = sha256_file(library.path)
        except OSError as exc:
            return f"library file {library.file} cannot be read: {exc.strerror or exc}"
        if actual != library.sha256:
            return (f"sha256 mismatch for {library.file}: image.json says {library.sha256[:16]}..., "
                    f"the file has {actual[:16]}... (corrupted or replaced)")
    record.checksums = "verified"
    return ""


# --- eligibility and preference -------------------------------------------------------------------------


def _driver_pair(version: int) -> tuple[int, int]:
    return version // 1000, (version % 1000) // 10


def _library_on_device(library: Library, device: Device, record: ImageRecord,
                       driver: tuple[int, int]) -> tuple[str | None, str]:
    """("sass"|"ptx", arch used) when the library runs on the device, else (None, why not)."""
    sass = [a for a in map(parse_arch, library.sass) if a is not None and a.kind == "sm"]
    ptx = [a for a in map(parse_arch, library.ptx) if a is not None and a.kind == "compute"]
    for arch in sass:
        if arch.runs_on(device.major, device.minor):
            return "sass", arch.text
    fitting = sorted((a for a in ptx if a.runs_on(device.major, device.minor)),
                     key=lambda a: (a.major, a.minor), reverse=True)
    if fitting:
        needed = (record.cuda_major, record.cuda_minor)
        if driver >= needed:
            return "ptx", fitting[0].text
        return None, (f"no SASS for {device.sm}, and its PTX {fitting[0].text} is too new for the driver "
                      f"(JIT needs a driver for CUDA >= {needed[0]}.{needed[1]}, this one supports "
                      f"{driver[0]}.{driver[1]})")
    return None, (f"no SASS for {device.sm} (has {' '.join(library.sass) or 'none'}) and no PTX it can JIT "
                  f"(has {' '.join(library.ptx) or 'none'})")


def _evaluate(record: ImageRecord, driver_version: int, devices: tuple[Device, ...]) -> None:
    """Mark the image eligible (serves = "sass" | "ptx") or rejected for this driver and these devices."""
    driver = _driver_pair(driver_version)
    if driver[0] < record.cuda_major:
        record.reject(f"driver too old for the image: it supports CUDA {driver[0]}.{driver[1]}, the image "
                      f"(toolkit {record.toolkit_text}) needs a CUDA {record.cuda_major}.x driver or newer")
        return
    problems, jit = [], []
    for device in devices:
        for family, library in record.libraries.items():
            mode, detail = _library_on_device(library, device, record, driver)
            if mode is None:
                problems.append(f"{device.describe()} not served: '{family}' has {detail}")
            elif mode == "ptx":
                jit.append(f"{device.describe()}: '{family}' through {detail} PTX")
    if problems:
        record.reject("; ".join(problems))
        return
    record.status, record.serves, record.jit = "eligible", ("ptx" if jit else "sass"), jit


def _torch_major(torch_cuda: str | None) -> int | None:
    match = re.match(r"\s*(\d+)", torch_cuda or "")
    return int(match.group(1)) if match else None


def _rank(record: ImageRecord, torch_major: int | None) -> tuple:
    """Smaller is preferred: SASS over PTX, toolkit major equal to torch's, newest toolkit, search order."""
    return (0 if record.serves != "ptx" else 1,
            0 if torch_major is not None and record.cuda_major == torch_major else 1,
            tuple(-part for part in record.toolkit),
            record.order)


def _why_not(loser: ImageRecord, winner: ImageRecord, torch_cuda: str | None) -> str:
    torch_major = _torch_major(torch_cuda)
    a, b = _rank(winner, torch_major), _rank(loser, torch_major)
    if a[0] != b[0]:
        return f"{winner.name} has SASS for every visible device, {loser.name} needs the PTX JIT"
    if a[1] != b[1]:
        return (f"{winner.name}'s toolkit major {winner.cuda_major} matches torch's CUDA {torch_cuda}, "
                f"{loser.name}'s {loser.cuda_major} does not")
    if a[2] != b[2]:
        return f"{winner.name} has the newer toolkit ({winner.toolkit_text} over {loser.toolkit_text})"
    return f"same rank as {winner.name}, which comes earlier in the search order"


def _why_chosen(record: ImageRecord, rivals: int, gpu_visible: bool, torch_cuda: str | None) -> str:
    parts = []
    if gpu_visible:
        parts.append("SASS for every visible device" if record.serves == "sass"
                     else "runs through the driver's PTX JIT: " + "; ".join(record.jit))
    else:
        parts.append("no GPU visible: chosen by toolkit preference alone and loaded for registration only "
                     "(op schemas for CPU validation, fake tensors, torch.compile tracing)")
    torch_major = _torch_major(torch_cuda)
    if torch_major is None:
        parts.append("torch has no CUDA version to match")
    elif record.cuda_major == torch_major:
        parts.append(f"toolkit major {record.cuda_major} matches torch's CUDA {torch_cuda}")
    else:
        parts.append(f"toolkit major {record.cuda_major} differs from torch's CUDA {torch_cuda}")
    if rivals:
        parts.append(f"preferred over {rivals} other usable image(s)")
    parts.append("checksums verified")
    return "; ".join(parts)


# --- selection ------------------------------------------------------------------------------------------


def _select() -> Selection:
    env = dict(os.environ)
    torch_version, torch_cuda, torch_error = query_torch()
    driver_version, driver_reason = query_driver_version()
    if driver_version is None:
        devices, devices_reason = (), "no usable CUDA driver"
    else:
        devices, devices_reason = query_devices()
        devices = tuple(devices)
    gpu_visible = driver_version is not None and bool(devices)
    roots, images = _scan(env)
    for record in images:
        if record.defects:
            record.reject("; ".join(record.defects))
        elif gpu_visible:
            _evaluate(record, driver_version, devices)
        else:
            record.status = "eligible"
    forced = env.get(ENV_IMAGE, "").strip() or None
    overrides = {name: env[name] for name in OVERRIDE_VARS if env.get(name)}
    torch_major = _torch_major(torch_cuda)
    candidates = sorted((r for r in images if r.status == "eligible"), key=lambda r: _rank(r, torch_major))
    chosen, why = None, ""

    if forced is not None:
        named = [r for r in images if r.name == forced]
        for record in named:
            if record.status != "eligible":
                continue
            problem = _checksum_problem(record)
            if problem:
                record.reject(problem)
                continue
            chosen = record
            break
        if chosen is not None:
            why = f"forced by {ENV_IMAGE}={forced}; " + _why_chosen(chosen, 0, gpu_visible, torch_cuda)
        elif not named:
            found = ", ".join(sorted({r.name for r in images})) or "none"
            why = f"{ENV_IMAGE}={forced}: no image named '{forced}' in the search roots (images found: {found})"
        else:
            why = f"{ENV_IMAGE}={forced} cannot be used: " + "; ".join(
                f"{r.path}: {r.reason}" for r in named)
        for record in images:
            if record.status == "eligible" and record is not chosen:
                record.reason = f"not considered: {ENV_IMAGE}={forced} is in force"
    else:
        for record in candidates:
            problem = _checksum_problem(record)
            if problem:
                record.reject(problem)
                continue
            chosen = record
            break
        if chosen is not None:
            rivals = [r for r in candidates if r is not chosen and r.status == "eligible"]
            why = _why_chosen(chosen, len(rivals), gpu_visible, torch_cuda)
            for record in rivals:
                record.reason = "not chosen: " + _why_not(record, chosen, torch_cuda)
        elif not images:
            why = "no image found in the search roots"
        else:
            why = "no image found can run here (every one was rejected)"
    if chosen is not None:
        chosen.status = "chosen"
        chosen.reason = why
    return Selection(torch_version=torch_version, torch_cuda=torch_cuda, torch_error=torch_error,
                     driver_version=driver_version, driver_reason=driver_reason, devices=devices,
                     devices_reason=devices_reason, roots=roots, images=images, chosen=chosen, why=why,
                     forced=forced, overrides=overrides)


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
                _state.selection = Selection(
                    torch_version=None, torch_cuda=None, torch_error="not queried", driver_version=None,
                    driver_reason="not queried", devices=(), devices_reason="not queried", roots=[], images=[],
                    chosen=None, why=why, forced=os.environ.get(ENV_IMAGE) or None,
                    overrides={name: os.environ[name] for name in OVERRIDE_VARS if os.environ.get(name)})
        return _state.selection


def loaded_families() -> dict[str, str]:
    """Families loaded in this process and the library file each came from."""
    with _lock:
        return {family: str(path) for family, path in _state.loaded.items()}


# --- loading --------------------------------------------------------------------------------------------


def _machine_line(sel: Selection) -> str:
    torch_text = (f"torch {sel.torch_version} (CUDA {sel.torch_cuda or 'none'})" if sel.torch_version
                  else sel.torch_error)
    driver_text = (f"driver CUDA {format_version(sel.driver_version)}" if sel.driver_version is not None
                   else f"no driver ({sel.driver_reason})")
    if sel.devices:
        devices_text = ", ".join(d.describe() for d in sel.devices)
    else:
        devices_text = f"no GPU visible ({sel.devices_reason})"
    return f"{torch_text}; {driver_text}; {devices_text}"


def _unavailable_message(family: str, why: str, sel: Selection, op: str | None) -> str:
    asked = f"op {op} (family '{family}')" if op else f"family '{family}'"
    lines = [f"astrai-kernels: {asked} is unavailable: {why}.",
             f"  machine: {_machine_line(sel)}"]
    if sel.images:
        lines.append("  images seen:")
        for record in sel.images:
            lines.append(f"    {record.name} ({record.path}, from {record.source}): {record.status}"
                         + (f": {record.reason}" if record.reason else ""))
    else:
        lines.append("  images seen: none")
    searched = []
    for root in sel.roots:
        where = str(root.path) if root.path is not None else root.source
        searched.append(f"{where} [{root.source}]" + (f" ({root.note})" if root.note else ""))
    lines.append("  searched: " + "; ".join(searched))
    lines.append("  overrides: " + (", ".join(f"{k}={v}" for k, v in sel.overrides.items()) or "none"))
    lines.append(f"run: {INFO_COMMAND}")
    return "\n".join(lines)


def _family_problem(family: str, sel: Selection) -> str:
    chosen = sel.chosen
    if chosen is None:
        return sel.why
    if family not in chosen.libraries:
        have = ", ".join(sorted(chosen.libraries)) or "none"
        others = [r.name for r in sel.images if r is not chosen and family in r.libraries]
        hint = f"; images that have it: {', '.join(others)}" if others else ""
        return f"the chosen image {chosen.name} has no '{family}' library (it has: {have}){hint}"
    return ""


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
        if not isinstance(name, str) or not _FAMILY_RE.match(name):
            raise FamilyUnavailableError(_unavailable_message(str(name), "not a valid family name", sel, op))
        problem = _state.failed.get(name) or _family_problem(name, sel)
        if problem:
            raise FamilyUnavailableError(_unavailable_message(name, problem, sel, op))
        library = sel.chosen.libraries[name]
        try:
            load_library(str(library.path))
        except Exception as exc:
            cause = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
            _state.failed[name] = (f"loading {library.path} from image {sel.chosen.name} failed: "
                                   f"{type(exc).__name__}: {exc}{cause}")
            raise FamilyUnavailableError(_unavailable_message(name, _state.failed[name], sel, op)) from exc
        _state.loaded[name] = library.path
        warn = sel.gpu_visible and sel.chosen.serves == "ptx" and not _state.jit_warned
        _state.jit_warned = _state.jit_warned or warn
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


def _image_dict(record: ImageRecord) -> dict[str, Any]:
    meta = record.meta
    return {
        "name": record.name,
        "path": str(record.path),
        "root": str(record.root),
        "source": record.source,
        "toolkit": record.toolkit_text if record.cuda_major is not None else None,
        "cuda_major": record.cuda_major,
        "cuda_minor": record.cuda_minor,
        "archs": meta.get("archs"),
        "git_revision": meta.get("git_revision"),
        "built_at": meta.get("built_at"),
        "status": record.status,
        "reason": record.reason,
        "serves": record.serves,
        "jit": list(record.jit),
        "checksums": record.checksums,
        "libraries": {family: {"file": lib.file, "sha256": lib.sha256, "size": lib.size,
                               "sass": list(lib.sass), "ptx": list(lib.ptx)}
                      for family, lib in record.libraries.items()},
    }


def describe() -> dict[str, Any]:
    """Everything `info --json` prints: machine, roots, images with verdicts, choice, loaded families."""
    sel = selection()
    with _lock:
        loaded = {family: str(path) for family, path in _state.loaded.items()}
        failed = dict(_state.failed)
    chosen = sel.chosen
    return {
        "torch": {"version": sel.torch_version, "cuda": sel.torch_cuda, "error": sel.torch_error or None},
        "driver": {"cuda": format_version(sel.driver_version) if sel.driver_version is not None else None,
                   "version": sel.driver_version, "reason": sel.driver_reason or None},
        "gpu_visible": sel.gpu_visible,
        "devices": [{"index": d.index, "name": d.name, "capability": d.capability, "sm": d.sm}
                    for d in sel.devices],
        "devices_reason": sel.devices_reason or None,
        "roots": [{"source": r.source, "path": str(r.path) if r.path is not None else None, "status": r.status,
                   "note": r.note or None, "images": list(r.images)} for r in sel.roots],
        "images": [_image_dict(r) for r in sel.images],
        "chosen": None if chosen is None else {"image": chosen.name, "path": str(chosen.path),
                                               "registration_only": sel.registration_only,
                                               "serves": chosen.serves},
        "why": sel.why,
        "forced": sel.forced,
        "loaded_families": loaded,
        "failed_families": failed,
        "overrides": dict(sel.overrides),
    }


def format_info(desc: dict[str, Any]) -> str:
    """Human-readable form of `describe()`."""
    torch_info = desc["torch"]
    lines = ["astrai-kernels image loader"]
    if torch_info["version"]:
        lines.append(f"  torch      {torch_info['version']} (CUDA {torch_info['cuda'] or 'none: CPU build'})")
    else:
        lines.append(f"  torch      {torch_info['error']}")
    driver = desc["driver"]
    lines.append(f"  driver     CUDA {driver['cuda']}" if driver["cuda"]
                 else f"  driver     none: {driver['reason']}")
    if desc["gpu_visible"]:
        for d in desc["devices"]:
            lines.append(f"  device {d['index']}   {d['name']}, compute capability {d['capability']} ({d['sm']})")
    else:
        lines.append(f"  devices    no GPU visible ({desc['devices_reason']})")
    lines.append("  search roots")
    for i, root in enumerate(desc["roots"], 1):
        where = root["path"] or "-"
        what = root["status"] if root["status"] != "scanned" else (
            f"{len(root['images'])} image(s)" + (f": {', '.join(root['images'])}" if root["images"] else ""))
        note = f" {root['note']}" if root["note"] else ""
        lines.append(f"    {i}. {root['source']:<18} {where}  [{what}]{note}")
    lines.append("  images" + ("" if desc["images"] else "     none found"))
    for image in desc["images"]:
        checked = "" if image["status"] == "rejected" else f"  checksums {image['checksums']}"
        lines.append(f"    {image['name']}  toolkit {image['toolkit'] or '?'}  {image['status'].upper()}"
                     f"{checked}  {image['path']}")
        if image["libraries"]:
            width = max(len(f) for f in image["libraries"])
            for family, lib in image["libraries"].items():
                lines.append(f"      {family:<{width}}  sass {' '.join(lib['sass']) or '-'}  "
                             f"ptx {' '.join(lib['ptx']) or '-'}")
        if image["reason"] and image["status"] != "chosen":
            lines.append(f"      why: {image['reason']}")
    chosen = desc["chosen"]
    if chosen is None:
        lines.append(f"  chosen     none: {desc['why']}")
    else:
        mode = "registration only" if chosen["registration_only"] else chosen["serves"]
        lines.append(f"  chosen     {chosen['image']} ({mode}): {desc['why']}")
    loaded = desc["loaded_families"]
    lines.append("  loaded     " + (", ".join(f"{f} ({p})" for f, p in loaded.items()) or "none"))
    for family, why in desc["failed_families"].items():
        lines.append(f"  failed     {family}: {why}")
    lines.append("  overrides  " + (", ".join(f"{k}={v}" for k, v in desc["overrides"].items()) or "none"))
    return "\n".join(lines)


def info() -> str:
    """What `python -m astrai.extension info` prints."""
    return format_info(describe())


def verify(smoke: bool = True) -> dict[str, Any]:
    """Recompute every checksum, load every family of the chosen image, smoke-launch each where a GPU is
    present. Returns a report; `report["ok"]` is False on any failure."""
    sel = selection()
    failures: list[str] = []
    checksums = []
    for record in sel.images:
        if not record.libraries:
            detail = "; ".join(record.defects) or "no libraries"
            checksums.append({"image": record.name, "family": None, "file": "image.json", "ok": False,
                              "detail": detail})
            failures.append(f"{record.name}: {detail}")
            continue
        for family, library in record.libraries.items():
            try:
                actual = sha256_file(library.path)
                ok = actual == library.sha256
                detail = "ok" if ok else f"mismatch: image.json {library.sha256}, file {actual}"
            except OSError as exc:
                ok, detail = False, f"cannot be read: {exc.strerror or exc}"
            checksums.append({"image": record.name, "family": family, "file": library.file, "ok": ok,
                              "detail": detail})
            if not ok:
                failures.append(f"{record.name}/{library.file}: {detail}")
        for defect in record.defects:
            if not any(defect.startswith(f"library file {lib.file}") for lib in record.libraries.values()):
                checksums.append({"image": record.name, "family": None, "file": "image.json", "ok": False,
                                  "detail": defect})
                failures.append(f"{record.name}: {defect}")

    loads = []
    if sel.chosen is None:
        failures.append(f"no usable image: {sel.why}")
    else:
        for family in sel.chosen.libraries:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", PTXJITWarning)
                    load_family(family)
                loads.append({"family": family, "ok": True, "detail": str(sel.chosen.libraries[family].path)})
            except FamilyUnavailableError as exc:
                loads.append({"family": family, "ok": False, "detail": str(exc).splitlines()[0]})
                failures.append(f"load {family}: {str(exc).splitlines()[0]}")

    smokes, smoke_skipped = [], None
    if not smoke:
        smoke_skipped = "smoke launches not requested"
    elif not torch_cuda_available():
        smoke_skipped = "no GPU: torch.cuda.is_available() is False"
    else:
        for entry in loads:
            if not entry["ok"]:
                continue
            family = entry["family"]
            try:
                test = find_smoke_test(family)
                if test is None:
                    smokes.append({"family": family, "status": "skipped",
                                   "detail": f"astrai.extension.ops.{family} defines no smoke_test()"})
                    continue
                test()
                smokes.append({"family": family, "status": "passed", "detail": ""})
            except Exception as exc:
                detail = f"{type(exc).__name__}: {exc}"
                smokes.append({"family": family, "status": "failed", "detail": detail})
                failures.append(f"smoke {family}: {detail}")
    return {"ok": not failures, "failures": failures, "chosen": sel.chosen.name if sel.chosen else None,
            "why": sel.why, "gpu_visible": sel.gpu_visible, "checksums": checksums, "loads": loads,
            "smoke": smokes, "smoke_skipped": smoke_skipped}


def format_verify(report: dict[str, Any]) -> str:
    """Human-readable form of `verify()`."""
    lines = ["astrai-kernels verify", "  checksums"]
    rows = [(c["image"], c["family"] or "-", c["file"], "ok" if c["ok"] else "FAIL " + c["detail"])
            for c in report["checksums"]]
    if rows:
        widths = [max(len(r[i]) for r in rows + [("IMAGE", "FAMILY", "FILE", "")]) for i in range(3)]
        for row in [("IMAGE", "FAMILY", "FILE", "RESULT")] + rows:
            lines.append("    " + "  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3])
    else:
        lines.append("    no images found")
    lines.append(f"  load ({report['chosen'] or 'no usable image'})")
    for entry in report["loads"]:
        lines.append(f"    {entry['family']:<12} {'ok' if entry['ok'] else 'FAIL'}  {entry['detail']}")
    if report["chosen"] is None:
        lines.append(f"    {report['why']}")
    lines.append("  smoke")
    if report["smoke_skipped"]:
        lines.append(f"    skipped: {report['smoke_skipped']}")
    for entry in report["smoke"]:
        lines.append(f"    {entry['family']:<12} {entry['status']}  {entry['detail']}".rstrip())
    lines.append("result: OK" if report["ok"] else f"result: FAILED ({len(report['failures'])} problem(s))")
    lines.extend(f"  - {failure}" for failure in report["failures"])
    return "\n".join(lines)
