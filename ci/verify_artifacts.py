#!/usr/bin/env python3
"""Check kernel images as they ship: in the tree, in a wheel, or in a .conda package.

    python ci/verify_artifacts.py [--archs 80,89,90a,120a] [--ptx 80] [--json OUT] PATH...

PATH is an image directory (holds image.json), a directory of image directories, a wheel or a .conda file.
For every library of every image:
- SASS for every required arch and PTX for every required PTX arch, read from the binary (cuobjdump when
  it is found, else the fatbin headers), never taken from image.json;
- every fatbin entry compressed (`-Xfatbin=-compress-all`);
- sha256 and size equal to image.json;
- NEEDED limited to libtorch.so and the C/C++ runtime, no RPATH/RUNPATH, no CPython symbols;
- the glibc, libstdc++ and libgcc symbol versions it needs, and the oldest manylinux policy (auditwheel's
  table, when auditwheel is installed) that allows them.
A wheel's platform tag must be a policy its libraries satisfy; a .conda file must hold images under
lib/astrai-kernels/ and constrain cuda-version and __cuda to its image's CUDA major.

Required arches default to each image's own request (`archs`, `ptx_archs` in image.json); `nox -s wheel`
and `nox -s conda` pass the release list. Prints a table of sizes and a list of everything missing;
exits 1 if anything is.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "csrc", "tools"))
import write_image_manifest  # noqa: E402  (cuobjdump lookup and arch listing, shared with the build)

RELEASE_ARCHS = ("80", "89", "90a", "120a")
RELEASE_PTX = ("80",)
# What a library may depend on: libtorch (resolved from the process that imported torch) and the C/C++
# runtime; the static CUDA runtime adds only libc's dl/pthread/rt (folded into libc.so.6 since glibc 2.34).
ALLOWED_NEEDED = {"libtorch.so", "libstdc++.so.6", "libm.so.6", "libgcc_s.so.1", "libc.so.6",
                  "ld-linux-x86-64.so.2", "libdl.so.2", "libpthread.so.0", "librt.so.1"}
PYTHON_SYMBOL = re.compile(r"\b(Py[A-Z_]\w*|_Py\w+)")

FATBIN_MAGIC = 0xBA55ED50
FATBIN_KIND = {1: "ptx", 2: "elf"}
# Entry header flags: the 0x2000 / 0x8000 bits mark a compressed payload (0x8000 in CUDA 13 fatbinary);
# 0x100000 marks an arch-specific ("a") cubin.
FATBIN_COMPRESSED = 0x2000 | 0x8000
FATBIN_ARCH_SPECIFIC = 0x100000


@dataclass
class LibraryReport:
    image: str
    family: str
    file: str
    size: int = 0
    sass: list[str] = field(default_factory=list)
    ptx: list[str] = field(default_factory=list)
    fatbin_entries: int = 0
    uncompressed_entries: int = 0
    needed: list[str] = field(default_factory=list)
    symbol_versions: list[str] = field(default_factory=list)
    policy: str | None = None


@dataclass
class Report:
    artifact: str
    kind: str  # image | wheel | conda
    size: int = 0
    libraries: list[LibraryReport] = field(default_factory=list)
    images: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


# --- ELF ------------------------------------------------------------------------------------------------


def elf_section(data: bytes, wanted: str) -> bytes | None:
    """Contents of section `wanted` of a 64-bit little-endian ELF file, None if it has none."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i: int) -> tuple:
        return struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)

    strtab = header(shstrndx)[4]
    for i in range(shnum):
        name, _, _, _, offset, size, *_ = header(i)
        end = data.index(b"\0", strtab + name)
        if data[strtab + name:end].decode() == wanted:
            return data[offset:offset + size]
    return None


def fatbin_entries(data: bytes) -> list[dict]:
    """Every entry of the .nv_fatbin section: kind, arch, compressed."""
    section = elf_section(data, ".nv_fatbin")
    entries = []
    pos = 0
    while section is not None and pos + 16 <= len(section):
        magic, _, header_size, fat_size = struct.unpack_from("<IHHQ", section, pos)
        if magic != FATBIN_MAGIC:
            break
        entry, end = pos + header_size, pos + header_size + fat_size
        while entry + 64 <= end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", section, entry)
            (arch,) = struct.unpack_from("<I", section, entry + 28)
            (flags,) = struct.unpack_from("<Q", section, entry + 40)
            (uncompressed,) = struct.unpack_from("<Q", section, entry + 56)
            suffix = "a" if flags & FATBIN_ARCH_SPECIFIC else ""
            prefix = "sm_" if kind == 2 else "compute_"
            entries.append({"kind": FATBIN_KIND.get(kind, str(kind)), "arch": f"{prefix}{arch}{suffix}",
                            "compressed": bool(flags & FATBIN_COMPRESSED) or uncompressed > 0})
            entry += entry_header + payload
        pos = end
    return entries


def readelf(*args: str) -> str:
    if shutil.which("readelf") is None:
        raise RuntimeError("readelf (binutils) is not installed")
    return subprocess.run(["readelf", "-W", *args], capture_output=True, text=True, check=True).stdout


def load_policies() -> list[dict] | None:
    """auditwheel's manylinux policies (oldest first), or None when auditwheel is not installed."""
    try:
        import auditwheel
    except ImportError:
        return None
    path = os.path.join(os.path.dirname(auditwheel.__file__), "policy", "manylinux-policy.json")
    with open(path) as f:
        policies = [p for p in json.load(f) if p["name"] != "linux"]
    return sorted(policies, key=lambda p: -p["priority"])


def oldest_policy(policies: list[dict], versions: set[str], needed: set[str]) -> str | None:
    """Oldest manylinux policy whose symbol versions and libraries cover what the library needs."""
    for policy in policies:
        allowed = policy["symbol_versions"]["x86_64"]
        libs = set(policy["lib_whitelist"]) | {"libtorch.so", "ld-linux-x86-64.so.2"}
        ok = needed <= libs
        for item in versions:
            prefix, _, version = item.partition("_")
            if prefix in allowed and version not in allowed[prefix]:
                ok = False
        if ok:
            return policy["name"]
    return None


def policy_rank(name: str) -> tuple[int, int]:
    match = re.match(r"manylinux_(\d+)_(\d+)", name)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


# --- images ---------------------------------------------------------------------------------------------


def check_library(path: str, image: str, family: str, lib: dict, archs, ptx_archs, report: Report,
                  cuobjdump: str | None, policies: list[dict] | None) -> None:
    where = f"{image}/{lib.get('file', family)}"
    entry = LibraryReport(image=image, family=family, file=lib.get("file", "?"))
    report.libraries.append(entry)
    if not os.path.isfile(path):
        report.problems.append(f"{where}: the library file is missing")
        return
    with open(path, "rb") as f:
        data = f.read()
    entry.size = len(data)
    if hashlib.sha256(data).hexdigest() != lib.get("sha256"):
        report.problems.append(f"{where}: sha256 differs from image.json (corrupted, truncated or patched)")
    if lib.get("size") != len(data):
        report.problems.append(f"{where}: {len(data)} bytes, image.json says {lib.get('size')}")
    try:
        entries = fatbin_entries(data)
    except (ValueError, struct.error) as exc:
        report.problems.append(f"{where}: cannot read the fatbin: {exc}")
        return
    entry.fatbin_entries = len(entries)
    entry.uncompressed_entries = sum(not e["compressed"] for e in entries)
    if not entries:
        report.problems.append(f"{where}: no .nv_fatbin section: the library holds no device code")
    elif entry.uncompressed_entries:
        report.problems.append(f"{where}: {entry.uncompressed_entries} of {len(entries)} fatbin entries are not "
                               f"compressed (build with -Xfatbin=-compress-all)")
    if cuobjdump:
        entry.sass = write_image_manifest.list_arches(cuobjdump, path, "elf")
        entry.ptx = write_image_manifest.list_arches(cuobjdump, path, "ptx")
    else:  # the fatbin headers say the same, less the 'f' family suffix
        entry.sass = sorted({e["arch"] for e in entries if e["kind"] == "elf"})
        entry.ptx = sorted({e["arch"] for e in entries if e["kind"] == "ptx"})
    entry.sass.sort(key=write_image_manifest._arch_key)
    entry.ptx.sort(key=write_image_manifest._arch_key)
    for arch in archs:
        if f"sm_{arch}" not in entry.sass:
            report.problems.append(f"{where}: no SASS for sm_{arch} (has {' '.join(entry.sass) or 'none'})")
    for arch in ptx_archs:
        if f"compute_{arch}" not in entry.ptx:
            report.problems.append(f"{where}: no PTX for compute_{arch} (has {' '.join(entry.ptx) or 'none'})")
    if sorted(lib.get("sass", [])) != sorted(entry.sass) or sorted(lib.get("ptx", [])) != sorted(entry.ptx):
        report.problems.append(f"{where}: image.json lists SASS {lib.get('sass')} PTX {lib.get('ptx')}, the binary "
                               f"has SASS {entry.sass} PTX {entry.ptx}")

    dynamic = readelf("-d", path)
    entry.needed = sorted(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic))
    if "libtorch.so" not in entry.needed:
        report.problems.append(f"{where}: no NEEDED libtorch.so (the stable-ABI shims would not resolve)")
    extra = sorted(set(entry.needed) - ALLOWED_NEEDED)
    if extra:
        report.problems.append(f"{where}: NEEDED libraries outside the allowed set: {', '.join(extra)}")
    if "(RPATH)" in dynamic or "(RUNPATH)" in dynamic:
        report.problems.append(f"{where}: carries an RPATH/RUNPATH (libtorch.so must resolve from the process)")
    python_symbols = sorted(set(PYTHON_SYMBOL.findall(readelf("--dyn-syms", path))))
    if python_symbols:
        report.problems.append(f"{where}: CPython symbols {python_symbols[:5]}: one image must serve every Python")
    entry.symbol_versions = sorted(set(re.findall(r"Name: ((?:GLIBC|GLIBCXX|CXXABI|GCC)_[\w.]+)",
                                                  readelf("-V", path))))
    if policies is not None:
        entry.policy = oldest_policy(policies, set(entry.symbol_versions), set(entry.needed))
        if entry.policy is None:
            report.problems.append(f"{where}: no manylinux policy allows its symbol versions "
                                   f"{entry.symbol_versions}")


def image_dirs(path: str) -> list[str]:
    if os.path.isfile(os.path.join(path, "image.json")):
        return [path]
    return sorted(os.path.dirname(p) for p in glob.glob(os.path.join(path, "*", "image.json")))


def check_images(root: str, report: Report, archs, ptx_archs, cuobjdump, policies) -> None:
    dirs = image_dirs(root)
    if not dirs:
        report.problems.append(f"{report.artifact}: no image (no */image.json under {root})")
    for image_dir in dirs:
        name = os.path.basename(image_dir)
        try:
            with open(os.path.join(image_dir, "image.json")) as f:
                manifest = json.load(f)
        except (OSError, ValueError) as exc:
            report.problems.append(f"{name}: image.json cannot be read: {exc}")
            continue
        report.images.append(f"{name} (CUDA {manifest.get('cuda_version')})")
        if manifest.get("image") != name:
            report.problems.append(f"{name}: image.json names the image {manifest.get('image')!r}")
        want_sass = manifest.get("archs", []) if archs is None else archs
        want_ptx = manifest.get("ptx_archs", []) if ptx_archs is None else ptx_archs
        libraries = manifest.get("libraries") or {}
        if not libraries:
            report.problems.append(f"{name}: image.json lists no libraries")
        for family, lib in sorted(libraries.items()):
            check_library(os.path.join(image_dir, lib.get("file", "")), name, family, lib, want_sass, want_ptx,
                          report, cuobjdump, policies)


# --- wheels and conda packages --------------------------------------------------------------------------


def check_wheel(path: str, report: Report, archs, ptx_archs, cuobjdump, policies) -> None:
    match = re.match(r"^astrai_kernels-([^-]+)-py3-none-([\w.]+)\.whl$", os.path.basename(path))
    if not match:
        report.problems.append(f"{os.path.basename(path)}: not a py3-none wheel name of astrai_kernels")
        return
    version, platforms = match.group(1), match.group(2).split(".")
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(path) as zf:
            zf.extractall(tmp)
        check_images(os.path.join(tmp, "astrai", "extension", "lib"), report, archs, ptx_archs, cuobjdump, policies)
        wheel_meta = glob.glob(os.path.join(tmp, "*.dist-info", "WHEEL"))
        tags = re.findall(r"^Tag: (.+)$", open(wheel_meta[0]).read(), flags=re.M) if wheel_meta else []
        if sorted(tags) != sorted(f"py3-none-{p}" for p in platforms):
            report.problems.append(f"{os.path.basename(path)}: WHEEL tags {tags} differ from the file name")
    majors = {re.sub(r"\D", "", m)[:-1] for m in re.findall(r"\+cu(\d+)", version)}
    for image in report.images:
        if majors and not any(image.startswith(f"cu{m}") for m in majors):
            report.problems.append(f"{os.path.basename(path)}: image {image} does not match the local version "
                                   f"+cu{'/'.join(sorted(majors))}")
    for platform in platforms:
        if not platform.startswith("manylinux_"):
            report.problems.append(f"{os.path.basename(path)}: platform tag {platform} is not a manylinux tag")
            continue
        if policies is None:
            continue
        for lib in report.libraries:
            if lib.policy and policy_rank(lib.policy) > policy_rank(platform):
                report.problems.append(f"{os.path.basename(path)}: tagged {platform} but {lib.image}/{lib.file} "
                                       f"needs {lib.policy} (symbol versions {lib.symbol_versions})")


def check_conda(path: str, report: Report, archs, ptx_archs, cuobjdump, policies) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        with zipfile.ZipFile(path) as zf:
            zf.extractall(tmp)
        for part in glob.glob(os.path.join(tmp, "*.tar.zst")):
            extract_zst(part, tmp)
        with open(os.path.join(tmp, "info", "index.json")) as f:
            index = json.load(f)
        if index["name"] != "libastrai-kernels":
            report.kind = f"conda ({index['name']})"
            if glob.glob(os.path.join(tmp, "**", "*.so"), recursive=True):
                report.problems.append(f"{os.path.basename(path)}: the Python package ships shared libraries")
            return
        check_images(os.path.join(tmp, "lib", "astrai-kernels"), report, archs, ptx_archs, cuobjdump, policies)
        constrains = " ".join(index.get("constrains", []))
        majors = {n.split(" ")[0][2:-1] for n in report.images}  # "cu130 (...)" -> "13"
        for major in majors:
            for spec in (f"cuda-version >={major},<{int(major) + 1}", f"__cuda >={major}"):
                if spec not in constrains:
                    report.problems.append(f"{os.path.basename(path)}: run_constraints lack '{spec}' "
                                           f"(has: {constrains or 'none'})")


def extract_zst(archive: str, dest: str) -> None:
    """Unpack a .tar.zst member of a .conda file (zstandard from PyPI, else tar --zstd)."""
    try:
        import zstandard
    except ImportError:
        subprocess.run(["tar", "--zstd", "-xf", archive, "-C", dest], check=True)
        return
    with open(archive, "rb") as raw, zstandard.ZstdDecompressor().stream_reader(raw) as stream:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            tar.extractall(dest, filter="data")


# --- report ---------------------------------------------------------------------------------------------


def verify(path: str, archs=None, ptx_archs=None, cuobjdump: str | None = None,
           policies: list[dict] | None = None) -> Report:
    kind = "wheel" if path.endswith(".whl") else "conda" if path.endswith(".conda") else "image"
    report = Report(artifact=path, kind=kind)
    if not os.path.exists(path):
        report.problems.append(f"{path}: does not exist")
        return report
    report.size = os.path.getsize(path) if os.path.isfile(path) else 0
    check = {"wheel": check_wheel, "conda": check_conda}.get(kind)
    try:
        if check:
            check(path, report, archs, ptx_archs, cuobjdump, policies)
        else:
            check_images(path, report, archs, ptx_archs, cuobjdump, policies)
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, subprocess.CalledProcessError, RuntimeError) as exc:
        report.problems.append(f"{path}: cannot be checked: {type(exc).__name__}: {exc}")
    return report


def format_report(reports: list[Report]) -> str:
    lines = []
    for r in reports:
        size = f", {r.size / 1e6:.2f} MB" if r.size else ""
        lines.append(f"{r.kind} {r.artifact}{size}: images {', '.join(r.images) or 'none'}")
        for lib in r.libraries:
            lines.append(f"  {lib.image}/{lib.file}: {lib.size / 1e6:.2f} MB, SASS {' '.join(lib.sass) or '-'}, "
                         f"PTX {' '.join(lib.ptx) or '-'}, fatbin {lib.fatbin_entries - lib.uncompressed_entries}/"
                         f"{lib.fatbin_entries} compressed, {lib.policy or 'policy not checked'}")
    problems = [p for r in reports for p in r.problems]
    if problems:
        lines.append(f"MISSING OR WRONG ({len(problems)}):")
        lines.extend(f"  - {p}" for p in problems)
    else:
        lines.append(f"verify_artifacts: OK ({len(reports)} artifact(s))")
    return "\n".join(lines)


def _arch_list(text: str | None) -> list[str] | None:
    if text is None:
        return None
    return [a for a in re.split(r"[ ,;]+", text) if a]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--archs", help="required SASS arches (default: each image's own request)")
    parser.add_argument("--ptx", help="required PTX arches (default: each image's own request)")
    parser.add_argument("--release", action="store_true",
                        help=f"require the release arches: SASS {','.join(RELEASE_ARCHS)}, PTX {','.join(RELEASE_PTX)}")
    parser.add_argument("--json", help="also write the report as JSON to this file")
    args = parser.parse_args(argv)
    archs = list(RELEASE_ARCHS) if args.release else _arch_list(args.archs)
    ptx_archs = list(RELEASE_PTX) if args.release else _arch_list(args.ptx)
    cuobjdump = None
    try:
        cuobjdump = write_image_manifest.find_cuobjdump(None)
    except SystemExit:
        print("verify_artifacts: cuobjdump not found; arches are read from the fatbin headers")
    reports = [verify(p, archs, ptx_archs, cuobjdump, load_policies()) for p in args.paths]
    print(format_report(reports))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([{**r.__dict__, "libraries": [lib.__dict__ for lib in r.libraries]} for r in reports], f,
                      indent=2)
    return 1 if any(r.problems for r in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
