#!/usr/bin/env python3
"""Offline-install proof: install a built artifact with no network, then run tier 0 against the installed copy.

    python ci/offline_install.py wheel dist/astrai_kernels-0.1.0+cu13-py3-none-manylinux_2_34_x86_64.whl
    python ci/offline_install.py conda dist/conda          # a local channel: noarch/ and linux-64/

wheel: a fresh venv gets torch==2.13.0 and the test tools first (the environment a cluster image would
    already have), then `pip install --no-index --no-deps` of the wheel. With --in-env (tier 0 in CI) the
    wheel goes into a fresh `--target` directory used beside this interpreter's torch instead.
conda: py-rattler installs libastrai-kernels and astrai-kernels from the local file channel into a fresh
    prefix, without a solve; conda-forge's pytorch is not reachable here, so a stub `python` package of
    this interpreter's version stands in for the environment's python (it tells the installer
    where noarch files go), and tier 0 runs on this interpreter's torch with the prefix's site-packages.
    The verdict is read from conda-meta/ (the installer may crash at exit after it succeeded).

Then tier 0 (`pytest tests`, less the GPU tiers; --tests narrows it) runs from a scratch directory against
the installed package (ASTRAI_TEST_INSTALLED=<where it must come from>), inside a network namespace with no interface
(`unshare -n`, when the kernel allows it), with PATH reduced to the interpreter, coreutils and binutils,
and a trap directory first on PATH whose nvcc, ptxas, cicc, nvlink, fatbinary, gcc, g++, cc, c++ and clang
record the call and fail: the proof fails if anything spawned one of them.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH = "torch==2.13.0"
TEST_DEPS = ["pytest==9.2.0", "numpy==2.4.6", "expecttest==0.3.0"]
COMPILERS = ("nvcc", "ptxas", "cicc", "nvlink", "fatbinary", "gcc", "g++", "cc", "c++", "clang", "clang++")
PACKAGES = ("libastrai-kernels", "astrai-kernels")
# Tier-0 tests that compile or disassemble CUDA by design (the test harness's own checks): they prove the
# build machine, not an installed package, and need the compilers this proof hides. Tests marked
# `@pytest.mark.compiler` are left out as well.
COMPILER_TESTS = ("tests/harness/test_cu_harness.py", "tests/harness/test_sass_digest.py")


def log(msg: str) -> None:
    print(f"offline_install: {msg}", flush=True)


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    log("$ " + " ".join(cmd))
    return subprocess.run(cmd, **kwargs)


def no_network_prefix() -> list[str]:
    """`unshare -n` when this kernel lets us make a network namespace, else [] (said in the log)."""
    unshare = shutil.which("unshare")
    for cmd in ([unshare, "-n"], [unshare, "-rn"]) if unshare else ():
        if subprocess.run([*cmd, "true"], capture_output=True).returncode == 0:
            return cmd
    log("WARNING: cannot create a network namespace (unshare -n); the run is offline by flags only")
    return []


def trap_dir(work: str) -> tuple[str, str]:
    """A directory of fake compilers that log their call and fail; returns (dir, log file)."""
    trap, record = os.path.join(work, "compiler-trap"), os.path.join(work, "compiler-calls.log")
    os.makedirs(trap, exist_ok=True)
    for name in COMPILERS:
        path = os.path.join(trap, name)
        with open(path, "w") as f:
            f.write(f'#!/bin/sh\necho "{name} $*" >> "{record}"\necho "compiler trap: {name} was called" >&2\n'
                    "exit 127\n")
        os.chmod(path, 0o755)
    return trap, record


def clean_path(trap: str, python_bin: str) -> str:
    """trap dir, the interpreter's bin/, then system dirs that hold no CUDA compiler."""
    keep = [trap, python_bin]
    for d in ("/usr/bin", "/bin"):
        if os.path.isdir(d) and not any(os.path.exists(os.path.join(d, t)) for t in ("nvcc", "ptxas")):
            keep.append(d)
    return os.pathsep.join(keep)


def run_tier0(python: str, work: str, env_extra: dict[str, str], installed_at: str,
              tests: list[str] | None = None) -> None:
    trap, record = trap_dir(work)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "CUDA_HOME", "CUDA_PATH", "CUDACXX", "CONDA_PREFIX", "ASTRAI_IMAGE",
                        "ASTRAI_IMAGE_PATH", "ASTRAI_IGNORE_PACKAGE_IMAGES", "VIRTUAL_ENV")}
    env.update({"PATH": clean_path(trap, os.path.dirname(python)), "ASTRAI_EXPECT_IMAGE": "1",
                "ASTRAI_TEST_INSTALLED": installed_at, "PYTHONDONTWRITEBYTECODE": "1",
                "PIP_NO_INDEX": "1", **env_extra})
    scratch = os.path.join(work, "run")
    os.makedirs(scratch, exist_ok=True)
    selected = [os.path.join(ROOT, t) for t in tests] if tests else [os.path.join(ROOT, "tests")]
    cmd = [*no_network_prefix(), python, "-m", "pytest", *selected, "-q", "-p", "no:cacheprovider",
           f"--ignore={os.path.join(ROOT, 'tests', 'gpu')}", f"--ignore={os.path.join(ROOT, 'tests', 'bench')}",
           *(f"--ignore={os.path.join(ROOT, t)}" for t in COMPILER_TESTS), "-m", "not compiler",
           f"--rootdir={ROOT}"]
    result = run(cmd, cwd=scratch, env=env)
    loads = run([*no_network_prefix(), python, os.path.join(ROOT, "ci", "check_installed.py")], cwd=scratch,
                env=env)
    info = run([*no_network_prefix(), python, "-m", "astrai.extension", "info"], cwd=scratch, env=env)
    calls = open(record).read().strip() if os.path.exists(record) else ""
    if calls:
        sys.exit(f"offline_install: FAILED: the installed package spawned a compiler:\n{calls}")
    if result.returncode != 0 or loads.returncode != 0 or info.returncode != 0:
        sys.exit(f"offline_install: FAILED: against the installed package, tier 0 exited {result.returncode}, "
                 f"ci/check_installed.py {loads.returncode}, info {info.returncode}")
    log("tier 0 passed against the installed package, offline, no compiler called")


# --- wheel ----------------------------------------------------------------------------------------------


def prove_wheel(wheel: str, work: str, tests: list[str] | None, in_env: bool) -> None:
    if in_env:
        site = os.path.join(work, "site-packages")
        run([*no_network_prefix(), sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
             "--target", site, wheel], check=True)
        run_tier0(sys.executable, work, {"PYTHONPATH": site}, os.path.join(site, "astrai"), tests)
        return
    venv = os.path.join(work, "venv")
    run([sys.executable, "-m", "venv", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    # The environment (torch, test tools) comes first, online as a cluster image would be built ...
    run([python, "-m", "pip", "install", "--quiet", "--only-binary=:all:", TORCH, *TEST_DEPS], check=True)
    # ... the product installs with no index and no network.
    run([*no_network_prefix(), python, "-m", "pip", "install", "--no-index", "--no-deps", wheel], check=True)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['platlib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    run_tier0(python, work, {}, os.path.join(site, "astrai"), tests)


# --- conda ----------------------------------------------------------------------------------------------


def stub_python(channel: str) -> None:
    """A `python` package of this interpreter's version, empty: it only tells the installer where noarch goes."""
    from rattler_build import assemble_package

    version = "%d.%d.%d" % sys.version_info[:3]
    out = os.path.join(channel, "linux-64")
    if glob.glob(os.path.join(out, f"python-{version}-astrai_offline_stub_0.conda")):
        return
    with tempfile.TemporaryDirectory() as empty:
        assemble_package(name="python", version=version, target_platform="linux-64",
                         build_string="astrai_offline_stub_0", output_dir=out, files_dir=empty,
                         summary="stand-in for the test interpreter in the offline-install proof")


def install_prefix(channel: str, prefix: str, cache: str) -> None:
    """Index the channel and install our two packages (and the stub python) into prefix; no solve."""
    from rattler import Channel, PackageName, SparseRepoData, install
    from rattler.index import index_fs

    asyncio.run(index_fs(channel, force=True))
    records = []
    for subdir in ("linux-64", "noarch"):
        repodata = os.path.join(channel, subdir, "repodata.json")
        if not os.path.exists(repodata):
            continue
        sparse = SparseRepoData(Channel(channel), subdir, repodata)
        for name in (*PACKAGES, "python"):
            records += sparse.load_records(PackageName(name))
    names = sorted(r.name.normalized for r in records)
    if sorted(set(names)) != sorted({*PACKAGES, "python"}) or len(names) != len(set(names)):
        sys.exit(f"offline_install: the channel {channel} must hold exactly one build of each of "
                 f"{', '.join(PACKAGES)}; found {names}")
    asyncio.run(install(records, prefix, cache_dir=cache, show_progress=False))


def prove_conda(channel: str, work: str, tests: list[str] | None) -> None:
    # A copy of the channel: the stub python must never sit beside the release packages.
    channel = shutil.copytree(os.path.abspath(channel), os.path.join(work, "channel"))
    prefix, cache = os.path.join(work, "prefix"), os.path.join(work, "pkgs")
    stub_python(channel)
    # The installer runs in a child process, offline; its verdict is conda-meta/, not its exit code.
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r}); "
            f"import offline_install as o; o.install_prefix({channel!r}, {prefix!r}, {cache!r})")
    result = run([*no_network_prefix(), sys.executable, "-c", code])
    metas = sorted(os.path.basename(p) for p in glob.glob(os.path.join(prefix, "conda-meta", "*.json")))
    log(f"installer exited {result.returncode}; conda-meta: {', '.join(metas) or 'empty'}")
    for name in PACKAGES:
        if not any(m.startswith(f"{name}-") and m[len(name) + 1].isdigit() for m in metas):
            sys.exit(f"offline_install: FAILED: {name} is not in {prefix}/conda-meta")
    for meta in glob.glob(os.path.join(prefix, "conda-meta", "*.json")):
        with open(meta) as f:
            for entry in json.load(f).get("files", []):
                if not os.path.exists(os.path.join(prefix, entry)):
                    sys.exit(f"offline_install: FAILED: {entry} is listed in {meta} but was not installed")
    py = "python%d.%d" % sys.version_info[:2]
    site = os.path.join(prefix, "lib", py, "site-packages")
    run_tier0(sys.executable, work, {"PYTHONPATH": site, "CONDA_PREFIX": prefix}, os.path.join(site, "astrai"),
              tests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=("wheel", "conda"))
    parser.add_argument("artifact", help="the wheel file, or the local conda channel directory")
    parser.add_argument("--work", help="scratch directory (default: a new temporary one, removed after)")
    parser.add_argument("--tests", nargs="+", help="test paths relative to the repository (default: tests)")
    parser.add_argument("--in-env", action="store_true",
                        help="wheel: install into a --target directory beside this interpreter's torch, no new venv")
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix=f"astrai-offline-{args.kind}-")
    try:
        if args.kind == "wheel":
            prove_wheel(os.path.abspath(args.artifact), work, args.tests, args.in_env)
        else:
            prove_conda(args.artifact, work, args.tests)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
