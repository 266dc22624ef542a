#!/usr/bin/env python3
"""CUDA toolkits the images are built with: the system one, or one assembled from NVIDIA's PyPI wheels.

A toolkit is named by the `build` session's `--toolkit` argument (or ASTRAI_TOOLKITS):

- `system`: the nvcc that CUDACXX, PATH or /usr/local/cuda provides (here CUDA 13.0);
- `13.2` (a key of PYPI_TOOLKITS): the pinned wheels below, installed with
  `pip install --target .toolkits/cuda-<version>` (git-ignored, reused while the pins match). The wheels
  lay out a complete toolkit root under `nvidia/cu<MAJOR>/`: nvcc, ptxas, fatbinary, nvlink and the
  `crt/` link stubs (bin/), cicc and libdevice (nvvm/), headers including `crt/` (nvidia-cuda-crt) and
  CCCL (nvidia-cuda-cccl), `libcudart_static.a` (nvidia-cuda-runtime) and `libculibos.a`.

A CUDA 12 image needs a CUDA >= 12.8 toolkit: PyPI's `nvidia-cuda-nvcc-cu12` ships only ptxas, so cu12 is
built with `--toolkit system` on a host whose nvcc is 12.8 or newer (README, "Building a cu12 image").

Usage (nox calls the functions; the CLI is for people):

    python ci/toolkits.py install 13.2     # prints the toolkit root
    python ci/toolkits.py nvcc system      # prints the nvcc a toolkit name resolves to
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLKITS_DIR = os.path.join(ROOT, ".toolkits")

# One pinned CUDA 13.x release, every package of one version (13.2.86 is the newest release in which
# all six share a version number; later cccl wheels carry CCCL's own numbering).
PYPI_TOOLKITS: dict[str, dict[str, str]] = {
    "13.2": {
        "nvidia-cuda-nvcc": "13.2.86",     # nvcc, ptxas, fatbinary, nvlink, bin/crt link stubs
        "nvidia-nvvm": "13.2.86",          # cicc, libdevice
        "nvidia-cuda-crt": "13.2.86",      # include/crt (host_defines.h, ...): nvcc cannot run without it
        "nvidia-cuda-runtime": "13.2.86",  # cuda_runtime.h, libcudart_static.a
        "nvidia-cuda-cccl": "13.2.86",     # include/cccl (cub, thrust, libcu++)
        "nvidia-cuda-culibos": "13.2.86",  # libculibos.a, which the static runtime links against
    },
}
DEFAULT_TOOLKITS = ("system", "13.2")


class ToolkitError(RuntimeError):
    """A toolkit cannot be found or installed; the message says what to do."""


def known() -> list[str]:
    return ["system", *PYPI_TOOLKITS]


def nvcc_version(nvcc: str) -> str:
    """"13.0.88" from `nvcc --version` (release and V-number)."""
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ToolkitError(f"{nvcc} --version failed: {exc}") from exc
    match = re.search(r"\bV(\d+\.\d+\.\d+)", out) or re.search(r"release (\d+\.\d+)", out)
    if not match:
        raise ToolkitError(f"cannot read the CUDA version from `{nvcc} --version`:\n{out}")
    return match.group(1)


def system_nvcc() -> str:
    """The system toolkit's nvcc: $CUDACXX, then PATH, then /usr/local/cuda/bin."""
    for candidate in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.realpath(candidate) if os.path.basename(candidate) == "nvcc" else candidate
    raise ToolkitError("no system CUDA toolkit: set CUDACXX, put nvcc on PATH, or build with "
                       f"--toolkit {'/'.join(PYPI_TOOLKITS)} (installed from PyPI)")


def install_dir(name: str) -> str:
    return os.path.join(TOOLKITS_DIR, f"cuda-{PYPI_TOOLKITS[name]['nvidia-cuda-nvcc']}")


def toolkit_root(name: str) -> str:
    major = name.split(".")[0]
    return os.path.join(install_dir(name), "nvidia", f"cu{major}")


def install(name: str, python: str = sys.executable, log=print) -> str:
    """Install the pinned PyPI toolkit `name` into .toolkits/ (once) and return its root."""
    if name not in PYPI_TOOLKITS:
        raise ToolkitError(f"unknown PyPI toolkit {name!r}; known: {', '.join(PYPI_TOOLKITS)}")
    pins = PYPI_TOOLKITS[name]
    target, root = install_dir(name), toolkit_root(name)
    stamp = os.path.join(target, ".astrai-toolkit.json")
    try:
        with open(stamp) as f:
            if json.load(f) == pins and os.path.isfile(os.path.join(root, "bin", "nvcc")):
                _complete_layout(root)
                return root
    except (OSError, ValueError):
        pass
    shutil.rmtree(target, ignore_errors=True)
    log(f"installing CUDA {name} from PyPI into {target}")
    cmd = [python, "-m", "pip", "install", "--quiet", "--no-deps", "--only-binary=:all:", "--target", target,
           *(f"{pkg}=={version}" for pkg, version in pins.items())]
    if subprocess.run(cmd).returncode != 0:
        raise ToolkitError(f"pip could not install the CUDA {name} wheels: {' '.join(cmd)}")
    for tool in ("nvcc", "ptxas", "fatbinary", "nvlink"):
        if not os.path.isfile(os.path.join(root, "bin", tool)):
            raise ToolkitError(f"the CUDA {name} wheels installed no bin/{tool} under {root}")
    _complete_layout(root)
    with open(stamp, "w") as f:
        json.dump(pins, f, indent=2)
    return root


def _complete_layout(root: str) -> None:
    """Add what a system install has and the wheels lack: CMake's FindCUDAToolkit wants lib64/,
    targets/<arch>/ and the unversioned libcudart.so (the images link the static runtime all the same)."""
    _symlink("lib", os.path.join(root, "lib64"))
    os.makedirs(os.path.join(root, "targets", "x86_64-linux"), exist_ok=True)
    _symlink(os.path.join("..", "..", "include"), os.path.join(root, "targets", "x86_64-linux", "include"))
    _symlink(os.path.join("..", "..", "lib"), os.path.join(root, "targets", "x86_64-linux", "lib"))
    for versioned in os.listdir(os.path.join(root, "lib")):
        base, dot, _ = versioned.partition(".so.")
        if dot:
            _symlink(versioned, os.path.join(root, "lib", base + ".so"))


def _symlink(target: str, link: str) -> None:
    if not os.path.lexists(link):
        os.symlink(target, link)


def resolve_nvcc(name: str, python: str = sys.executable, log=print) -> str:
    """nvcc of toolkit `name`, installing a PyPI toolkit first when needed."""
    if name == "system":
        return system_nvcc()
    return os.path.join(install(name, python, log), "bin", "nvcc")


def image_name(version: str) -> str:
    """"13.2.86" -> "cu132" (the image directory CMake names by default)."""
    major, minor = version.split(".")[:2]
    return f"cu{major}{minor}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("install", help="install a PyPI toolkit, print its root").add_argument("name")
    sub.add_parser("nvcc", help="print the nvcc and version of a toolkit").add_argument("name")
    sub.add_parser("list", help="known toolkit names")
    args = parser.parse_args()
    try:
        if args.command == "install":
            print(install(args.name, log=lambda msg: print(msg, file=sys.stderr)))
        elif args.command == "nvcc":
            nvcc = resolve_nvcc(args.name, log=lambda msg: print(msg, file=sys.stderr))
            print(f"{nvcc} {nvcc_version(nvcc)}")
        else:
            print("\n".join(known()))
    except ToolkitError as exc:
        sys.exit(f"toolkits: {exc}")


if __name__ == "__main__":
    main()
