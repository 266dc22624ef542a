#!/usr/bin/env python3
"""Make the release wheel of one CUDA major from the wheels `nox -s build` produced, one per toolkit.

    python ci/make_wheel.py --major 13 --out dist build/wheels/system/*.whl build/wheels/13.2/*.whl

The Python files come from the first wheel (they must be identical in all); the images from every wheel
(cu130 and cu132 both ship: the loader prefers the newest toolkit the driver runs, and falls back to the
older one's PTX on a driver too old to JIT the newer PTX). The result is
`astrai_kernels-<version>+cu<MAJOR>-py3-none-manylinux_2_<N>_x86_64.whl`, where manylinux_2_<N> is the
oldest auditwheel policy that every library's glibc/libstdc++/libgcc symbol versions satisfy.

Why a local version `+cu13` and not distributions `astrai-kernels-cu12` / `-cu13`: both would install the
same `astrai` package files, and pip cannot arbitrate two distributions that own one file (uninstalling
either breaks the other); a local version keeps one distribution, one import name and one uninstall, as
torch's own `+cu130` wheels do, and `pip install astrai-kernels==0.1.0+cu13` pins the toolkit. The cost:
PyPI refuses local versions, so these wheels are served from a project index or a find-links directory.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import verify_artifacts  # noqa: E402

IMAGE_PREFIX = "astrai/extension/lib/"


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def read_wheel(path: str) -> tuple[str, dict[str, bytes]]:
    match = re.match(r"^astrai_kernels-([^-]+)-py3-none-[\w.]+\.whl$", os.path.basename(path))
    if not match:
        sys.exit(f"make_wheel: {path} is not an astrai_kernels py3-none wheel")
    with zipfile.ZipFile(path) as zf:
        return match.group(1), {name: zf.read(name) for name in zf.namelist() if not name.endswith("/")}


def platform_tag(images_dir: str, policies: list[dict]) -> str:
    """Oldest manylinux policy that every library under images_dir satisfies."""
    report = verify_artifacts.Report(artifact=images_dir, kind="image")
    verify_artifacts.check_images(images_dir, report, None, None, None, policies)
    if report.problems:
        sys.exit("make_wheel: the images fail their checks:\n  " + "\n  ".join(report.problems))
    names = [lib.policy for lib in report.libraries]
    if not names or None in names:
        sys.exit("make_wheel: no manylinux policy fits every library")
    return max(names, key=verify_artifacts.policy_rank) + "_x86_64"


def make_wheel(wheels: list[str], major: int, out_dir: str) -> str:
    policies = verify_artifacts.load_policies()
    if policies is None:
        sys.exit("make_wheel: auditwheel (its manylinux policy table) is not installed: pip install auditwheel")
    base_version, base = read_wheel(wheels[0])
    files: dict[str, bytes] = {}
    images: dict[str, str] = {}
    for path in wheels:
        version, members = read_wheel(path)
        if version != base_version:
            sys.exit(f"make_wheel: {path} has version {version}, {wheels[0]} has {base_version}")
        for name, data in members.items():
            if ".dist-info/" in name:
                continue
            if name.startswith(IMAGE_PREFIX):
                image = name[len(IMAGE_PREFIX):].split("/")[0]
                if images.setdefault(image, path) != path:
                    sys.exit(f"make_wheel: image {image} is in both {images[image]} and {path}")
            elif name in files and files[name] != data:
                sys.exit(f"make_wheel: {name} differs between the input wheels (built from different trees?)")
            files[name] = data
    wrong = sorted(i for i in images if not i.startswith(f"cu{major}"))
    if not images or wrong:
        sys.exit(f"make_wheel: the cu{major} wheel needs cu{major}* images only; has {sorted(images) or 'none'}")

    version = f"{base_version.split('+')[0]}+cu{major}"
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            if name.startswith(IMAGE_PREFIX):
                target = os.path.join(tmp, name[len(IMAGE_PREFIX):])
                os.makedirs(os.path.dirname(target), exist_ok=True)
                with open(target, "wb") as f:
                    f.write(data)
        tag = platform_tag(tmp, policies)

    old_info = f"astrai_kernels-{base_version}.dist-info/"
    new_info = f"astrai_kernels-{version}.dist-info/"
    for name, data in base.items():
        if not name.startswith(old_info) or name.endswith("RECORD"):
            continue
        text = data.decode()
        if name.endswith("/METADATA"):
            text = re.sub(r"^Version: .*$", f"Version: {version}", text, count=1, flags=re.M)
        elif name.endswith("/WHEEL"):
            text = re.sub(r"^Tag: .*\n", "", text, flags=re.M).rstrip("\n") + f"\nTag: py3-none-{tag}\n"
        files[new_info + name[len(old_info):]] = text.encode()

    os.makedirs(out_dir, exist_ok=True)
    out = os.path.join(out_dir, f"astrai_kernels-{version}-py3-none-{tag}.whl")
    record = [f"{name},{_record_hash(data)},{len(data)}" for name, data in sorted(files.items())]
    record.append(f"{new_info}RECORD,,")
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in sorted(files.items()):
            info = zipfile.ZipInfo(name, date_time=(2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, data)
        zf.writestr(zipfile.ZipInfo(f"{new_info}RECORD", date_time=(2026, 1, 1, 0, 0, 0)), "\n".join(record) + "\n")
    print(f"make_wheel: {out} ({os.path.getsize(out) / 1e6:.2f} MB), images {', '.join(sorted(images))}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("wheels", nargs="+")
    parser.add_argument("--major", type=int, required=True, help="CUDA major of the images: 12 or 13")
    parser.add_argument("--out", default="dist")
    args = parser.parse_args()
    make_wheel(args.wheels, args.major, args.out)


if __name__ == "__main__":
    main()
