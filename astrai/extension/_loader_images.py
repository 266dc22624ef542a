"""Image manifests: search roots, image.json records and their defects, arch matching, checksums.

Part of the image loader (`astrai.extension.loader` is the public face and re-exports these names). Nothing
here queries the machine or holds state: the loader passes the environment, the package's `lib/` and the
devices in.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ._cuda_driver import Device

SCHEMA_VERSION = 1

ENV_IMAGE = "ASTRAI_IMAGE"
ENV_IMAGE_PATH = "ASTRAI_IMAGE_PATH"
ENV_IGNORE_PACKAGE_IMAGES = "ASTRAI_IGNORE_PACKAGE_IMAGES"
ENV_CONDA_PREFIX = "CONDA_PREFIX"
OVERRIDE_VARS = (ENV_IMAGE, ENV_IMAGE_PATH, ENV_IGNORE_PACKAGE_IMAGES, ENV_CONDA_PREFIX)

CONDA_SUBDIR = Path("lib") / "astrai-kernels"

SOURCE_ENV = "ASTRAI_IMAGE_PATH"
SOURCE_PACKAGE = "package"
SOURCE_CONDA = "CONDA_PREFIX"

FAMILY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_ARCH_RE = re.compile(r"^(sm|compute)_(\d{2,3})([af]?)$")
_SHA256_RE = re.compile(r"^[0-9a-fA-F]{64}$")




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


# --- scanning -------------------------------------------------------------------------------------------


def _env_flag(env: dict[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # e.g. a directory we may not enter
        return False


def _root_list(env: dict[str, str], package_lib_dir: Path) -> list[Root]:
    roots = []
    for entry in env.get(ENV_IMAGE_PATH, "").split(os.pathsep):
        if entry.strip():
            roots.append(Root(SOURCE_ENV, Path(entry.strip()).expanduser()))
    if _env_flag(env, ENV_IGNORE_PACKAGE_IMAGES):
        roots.append(Root(SOURCE_PACKAGE, package_lib_dir, "ignored",
                          f"ignored ({ENV_IGNORE_PACKAGE_IMAGES}={env[ENV_IGNORE_PACKAGE_IMAGES]})"))
    else:
        roots.append(Root(SOURCE_PACKAGE, package_lib_dir))
    prefix = env.get(ENV_CONDA_PREFIX, "").strip()
    if prefix:
        roots.append(Root(SOURCE_CONDA, Path(prefix).expanduser() / CONDA_SUBDIR))
    else:
        roots.append(Root(SOURCE_CONDA, None, "unset", f"{ENV_CONDA_PREFIX} is not set"))
    return roots


def scan(env: dict[str, str], package_lib_dir: Path) -> tuple[list[Root], list[ImageRecord]]:
    """Every search root in order (`env` gives the overrides, `package_lib_dir` the package's images) and every
    image directory found, each read from its image.json with its defects listed."""
    roots = _root_list(env, package_lib_dir)
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
    if not FAMILY_RE.match(family):
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


def checksum_problem(record: ImageRecord) -> str:
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



# --- arch matching --------------------------------------------------------------------------------------


def driver_pair(version: int) -> tuple[int, int]:
    return version // 1000, (version % 1000) // 10


def library_on_device(library: Library, device: Device, record: ImageRecord,
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

