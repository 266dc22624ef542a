"""SASS digest gate: sha256 of every kernel function's SASS per arch, with its register count (cuobjdump).

    python ci/sass_digest.py astrai/extension/lib/cu130 [--out digest.json]       # print / write a digest
    python ci/sass_digest.py astrai/extension/lib/cu130 --compare tests/golden/sass/cu130.json
    python ci/sass_digest.py astrai/extension/lib/cu130 --update tests/golden/sass/cu130.json
    python ci/sass_digest.py astrai/extension/lib/cu130 --compare tests/golden/sass/cu130.json --if-same-toolchain

--compare exits 1 on any function added, removed, or changed (SASS or registers) in any arch, listing each.
Runs on the CPU: cuobjdump (PyPI nvidia-cuda-cuobjdump) disassembles with nvdisasm (nvidia-cuda-nvdisasm),
which must sit on PATH or beside cuobjdump. A change of compiler changes the SASS too: regenerate on purpose
(`nox -s sass-digest -- --update`, ~20 s).

The digest records its toolchain: the image's nvcc version and arch lists (from image.json) and the
cuobjdump release that disassembled it. `--if-same-toolchain` (what `nox -s test` uses) compares only when
those match the saved digest's, and otherwise prints why it skipped and exits 0, so a CI machine with another
nvcc does not fail on SASS it could never reproduce.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

_ARCH = re.compile(r"^\s*arch\s*=\s*(sm_\w+)\s*$")
_FUNCTION = re.compile(r"^\s*Function\s*:\s*(\S+)\s*$")
_RES_FUNCTION = re.compile(r"^\s*Function\s+(\S+?):\s*$")
_REG = re.compile(r"\bREG:(\d+)")
_ADDRESS = re.compile(r"/\*[0-9a-f]{4,}\*/")
_SECTION = re.compile(r"^\s*Fatbin (elf|ptx) code:")


def find_cuobjdump() -> str:
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import nvidia
        for base in nvidia.__path__:
            for candidate in sorted(Path(base).glob("cu*/bin/cuobjdump")):
                return str(candidate)
    except ImportError:
        pass
    raise SystemExit("sass_digest: cuobjdump not found (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")


def _run(cuobjdump: str, flag: str, path: Path) -> str:
    env = dict(os.environ)
    env["PATH"] = str(Path(cuobjdump).parent) + os.pathsep + env.get("PATH", "")  # nvdisasm beside it
    proc = subprocess.run([cuobjdump, flag, str(path)], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"sass_digest: {cuobjdump} {flag} {path} failed: {proc.stderr.strip()}")
    return proc.stdout


def _elf_lines(text: str):
    """(arch, line) for each line of cuobjdump's ELF sections once their arch is known (the "Fatbin ptx" sections
    and the headers are skipped); the arch line itself is consumed."""
    arch = None
    elf = False
    for line in text.splitlines():
        section = _SECTION.match(line)
        if section:
            elf, arch = section.group(1) == "elf", None
            yield None, line  # a new section: the callers forget their current function
            continue
        if not elf:
            continue
        m = _ARCH.match(line)
        if m:
            arch = m.group(1)
            continue
        yield arch, line


def parse_sass(text: str) -> dict[str, dict[str, list[str]]]:
    """{arch: {function: [normalized instruction lines]}} from `cuobjdump -sass` output. Addresses and layout
    whitespace are dropped; the instruction text and its encoding are kept."""
    out: dict[str, dict[str, list[str]]] = {}
    function = None
    for arch, line in _elf_lines(text):
        if arch is None:
            function = None
            continue
        m = _FUNCTION.match(line)
        if m:
            function = m.group(1)
            out.setdefault(arch, {})[function] = []
            continue
        if function and "/*" in line and not line.strip().startswith(".headerflags"):
            normalized = " ".join(_ADDRESS.sub("", line).split())
            if normalized:
                out[arch][function].append(normalized)
    return out


def parse_registers(text: str) -> dict[str, dict[str, int]]:
    """{arch: {function: registers}} from `cuobjdump -res-usage` output (ELF sections only)."""
    out: dict[str, dict[str, int]] = {}
    function = None
    for arch, line in _elf_lines(text):
        if arch is None:
            function = None
            continue
        m = _RES_FUNCTION.match(line)
        if m:
            function = m.group(1)
            continue
        m = _REG.search(line)
        if m and function:
            out.setdefault(arch, {})[function] = int(m.group(1))
    return out


def digest_texts(sass_text: str, res_text: str) -> dict[str, dict[str, dict]]:
    sass, regs = parse_sass(sass_text), parse_registers(res_text)
    out: dict[str, dict[str, dict]] = {}
    for arch, functions in sorted(sass.items()):
        for name, lines in sorted(functions.items()):
            out.setdefault(arch, {})[name] = {
                "sha256": hashlib.sha256("\n".join(lines).encode()).hexdigest(),
                "registers": regs.get(arch, {}).get(name),
                "instructions": sum(1 for line in lines if not line.startswith("/*")),
            }
    return out


def cuobjdump_version(cuobjdump: str) -> str | None:
    """'13.4.92'-like release of cuobjdump (its disassembly text is what gets hashed), None when unreadable."""
    try:
        out = subprocess.run([cuobjdump, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.findall(r"V(\d+\.\d+\.\d+)", out) or re.findall(r"release (\d+\.\d+)", out)
    return found[-1] if found else None


def toolchain(paths: list[Path], cuobjdump: str) -> dict:
    """What made and read the SASS: nvcc version and arches from the first image.json among `paths` (None
    for bare binaries), and the cuobjdump release."""
    out: dict = {"cuda_version": None, "archs": None, "ptx_archs": None, "cuobjdump": cuobjdump_version(cuobjdump)}
    for p in paths:
        manifest = p / "image.json" if p.is_dir() else None
        if manifest is not None and manifest.exists():
            meta = json.loads(manifest.read_text())
            out.update(cuda_version=meta.get("cuda_version"), archs=meta.get("archs"), ptx_archs=meta.get("ptx_archs"))
            break
    return out


def toolchain_mismatch(saved: dict, current: dict) -> str | None:
    """Why a saved digest cannot be compared with this build (None when it can)."""
    recorded = saved.get("toolchain")
    if not recorded:
        return "the saved digest records no toolchain (made before it did): regenerate with nox -s sass-digest -- --update"
    diffs = [f"{key} {current.get(key)} here vs {recorded.get(key)} recorded"
             for key in ("cuda_version", "archs", "ptx_archs", "cuobjdump") if recorded.get(key) != current.get(key)]
    return "; ".join(diffs) or None


def digest_paths(paths: list[Path], cuobjdump: str, jobs: int | None = None) -> dict:
    files: list[Path] = []
    for p in paths:
        files += sorted(p.glob("*.so")) if p.is_dir() else [p]
    # cuobjdump is single-threaded and the quantize library alone takes most of the time: run them side by side
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs or min(8, os.cpu_count() or 1)) as pool:
        texts = {(f, flag): pool.submit(_run, cuobjdump, flag, f) for f in files for flag in ("-sass", "-res-usage")}
        libraries = {f.name: digest_texts(texts[(f, "-sass")].result(), texts[(f, "-res-usage")].result())
                     for f in files}
    return {"schema": 1, "toolchain": toolchain(paths, cuobjdump), "libraries": libraries}


def compare(saved: dict, current: dict) -> list[str]:
    """Every added, removed or changed function (per library and arch), as lines; empty when identical."""
    problems = []
    old_libs, new_libs = saved.get("libraries", {}), current.get("libraries", {})
    for lib in sorted(set(old_libs) | set(new_libs)):
        old_archs, new_archs = old_libs.get(lib, {}), new_libs.get(lib, {})
        for arch in sorted(set(old_archs) | set(new_archs)):
            old, new = old_archs.get(arch, {}), new_archs.get(arch, {})
            for fn in sorted(set(old) | set(new)):
                where = f"{lib} {arch} {fn}"
                if fn not in old:
                    problems.append(f"added    {where} ({new[fn]['registers']} registers)")
                elif fn not in new:
                    problems.append(f"removed  {where}")
                else:
                    changes = []
                    if old[fn]["sha256"] != new[fn]["sha256"]:
                        changes.append(f"SASS {old[fn]['instructions']} -> {new[fn]['instructions']} instructions")
                    if old[fn]["registers"] != new[fn]["registers"]:
                        changes.append(f"registers {old[fn]['registers']} -> {new[fn]['registers']}")
                    if changes:
                        problems.append(f"changed  {where}: {', '.join(changes)}")
    return problems


def summary(digest: dict) -> str:
    lines = []
    for lib, archs in sorted(digest["libraries"].items()):
        for arch, functions in sorted(archs.items()):
            regs = [f["registers"] for f in functions.values() if f["registers"] is not None]
            lines.append(f"{lib} {arch}: {len(functions)} functions, registers {min(regs, default=0)}-"
                         f"{max(regs, default=0)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="image directories (every *.so) or binaries")
    parser.add_argument("--compare", type=Path, help="saved digest: exit 1 on any difference")
    parser.add_argument("--update", type=Path, help="write the digest here (on purpose only)")
    parser.add_argument("--out", type=Path, help="also write the current digest here")
    parser.add_argument("--if-same-toolchain", action="store_true",
                        help="with --compare: skip (exit 0, saying why) unless nvcc, arches and cuobjdump match the "
                             "saved digest's")
    parser.add_argument("--cuobjdump", default=None)
    args = parser.parse_args(argv)
    cuobjdump = args.cuobjdump or find_cuobjdump()
    if args.compare and args.if_same_toolchain:
        if not args.compare.exists():
            print(f"sass-digest: skipped: no saved digest {args.compare} (nox -s sass-digest -- --update)")
            return 0
        why = toolchain_mismatch(json.loads(args.compare.read_text()), toolchain(args.paths, cuobjdump))
        if why:
            print(f"sass-digest: skipped {args.compare}: {why}")
            return 0
    current = digest_paths(args.paths, cuobjdump)
    text = json.dumps(current, indent=2, sort_keys=True) + "\n"
    print(summary(current))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    if args.update:
        args.update.parent.mkdir(parents=True, exist_ok=True)
        args.update.write_text(text)
        print(f"sass-digest: wrote {args.update}")
    if args.compare:
        problems = compare(json.loads(args.compare.read_text()), current)
        for p in problems:
            print(p)
        print(f"sass-digest: {len(problems)} differences vs {args.compare}")
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
