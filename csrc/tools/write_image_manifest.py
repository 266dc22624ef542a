#!/usr/bin/env python3
"""Write image.json for an installed image: checksums, and the SASS and PTX arches read from each binary.

Run by CMake at install time (csrc/CMakeLists.txt). The arches come from `cuobjdump --list-elf` and
`--list-ptx` on the shipped file, never from the requested list, and the build fails if a requested
arch is missing from a library. Format: docs/contracts.md.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig

SCHEMA_VERSION = 1


def find_cuobjdump(cuda_bin: str | None) -> str:
    """cuobjdump from $ASTRAI_CUOBJDUMP, PATH, the toolkit, or the nvidia-cuda-cuobjdump wheel."""
    candidates = [os.environ.get("ASTRAI_CUOBJDUMP"), shutil.which("cuobjdump")]
    if cuda_bin:
        candidates.append(os.path.join(cuda_bin, "cuobjdump"))
    for site in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "*", "bin", "cuobjdump")))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    sys.exit("write_image_manifest: cuobjdump not found (PATH, the CUDA toolkit, or "
             "`pip install nvidia-cuda-cuobjdump`; or set ASTRAI_CUOBJDUMP)")


def list_arches(cuobjdump: str, path: str, what: str) -> list[str]:
    """Arches of the cubins (what='elf') or PTX (what='ptx') embedded in `path`."""
    proc = subprocess.run([cuobjdump, f"--list-{what}", path], capture_output=True, text=True)
    if proc.returncode != 0:
        # cuobjdump exits non-zero when a binary holds no file of the asked kind.
        if "does not contain" in proc.stderr or not proc.stderr.strip():
            return []
        sys.exit(f"write_image_manifest: cuobjdump --list-{what} {path} failed: {proc.stderr.strip()}")
    found = re.findall(r"\.sm_(\d+[af]?)\.(?:cubin|ptx)\s*$", proc.stdout, flags=re.M)
    prefix = "sm_" if what == "elf" else "compute_"
    return sorted({prefix + a for a in found}, key=_arch_key)


def _arch_key(name: str) -> tuple[int, str]:
    m = re.search(r"(\d+)([af]?)$", name)
    return (int(m.group(1)), m.group(2)) if m else (0, name)


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--image-dir", required=True)
    p.add_argument("--image", required=True)
    p.add_argument("--families", required=True, help="comma-separated")
    p.add_argument("--cuda-version", required=True)
    p.add_argument("--archs", default="", help="semicolon-separated SASS arches requested")
    p.add_argument("--ptx", default="", help="semicolon-separated PTX arches requested")
    p.add_argument("--build-flags", default="")
    p.add_argument("--git-revision", default="unknown")
    p.add_argument("--cuda-bin", default=None)
    args = p.parse_args()

    cuobjdump = find_cuobjdump(args.cuda_bin)
    archs = [a for a in args.archs.split(";") if a]
    ptx = [a for a in args.ptx.split(";") if a]
    major, minor = (int(x) for x in args.cuda_version.split(".")[:2])

    libraries, missing = {}, []
    for family in [f for f in args.families.split(",") if f]:
        fname = f"astrai_{family}.so"
        path = os.path.join(args.image_dir, fname)
        if not os.path.isfile(path):
            sys.exit(f"write_image_manifest: {path} was not installed")
        sass_found = list_arches(cuobjdump, path, "elf")
        ptx_found = list_arches(cuobjdump, path, "ptx")
        missing += [f"{fname}: no SASS for sm_{a}" for a in archs if f"sm_{a}" not in sass_found]
        missing += [f"{fname}: no PTX for compute_{a}" for a in ptx if f"compute_{a}" not in ptx_found]
        libraries[family] = {
            "file": fname,
            "sha256": sha256(path),
            "size": os.path.getsize(path),
            "sass": sass_found,
            "ptx": ptx_found,
        }
    if missing:
        sys.exit("write_image_manifest: the binaries lack requested arches:\n  " + "\n  ".join(missing))

    manifest = {
        "schema_version": SCHEMA_VERSION,
        "image": args.image,
        "cuda_version": args.cuda_version,
        "cuda_major": major,
        "cuda_minor": minor,
        "archs": archs,
        "ptx_archs": ptx,
        "git_revision": args.git_revision,
        "build_flags": args.build_flags,
        "built_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "libraries": libraries,
    }
    out = os.path.join(args.image_dir, "image.json")
    with open(out, "w") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    for family, lib in libraries.items():
        print(f"astrai image {args.image}: {lib['file']} {lib['size']} bytes, "
              f"SASS {' '.join(lib['sass']) or '-'}, PTX {' '.join(lib['ptx']) or '-'}")


if __name__ == "__main__":
    main()
