#!/usr/bin/env python3
"""Prebuilt mode of the recipe: copy the images of one CUDA major from a directory into the package.

    python3 recipe/install_images.py <images dir> <destination> --major 13

Every image directory whose image.json says cuda_major == 13 is copied unchanged (its checksums stay
valid); the build fails when there is none, so a variant never ships an empty package.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("images")
    parser.add_argument("destination")
    parser.add_argument("--major", type=int, required=True)
    args = parser.parse_args()
    copied = []
    for name in sorted(os.listdir(args.images)):
        manifest = os.path.join(args.images, name, "image.json")
        if not os.path.isfile(manifest):
            continue
        with open(manifest) as f:
            meta = json.load(f)
        if meta.get("cuda_major") != args.major:
            continue
        shutil.copytree(os.path.join(args.images, name), os.path.join(args.destination, name))
        copied.append(f"{name} (CUDA {meta.get('cuda_version')})")
    if not copied:
        sys.exit(f"install_images: no image of CUDA major {args.major} in {args.images}")
    print("install_images: " + ", ".join(copied))


if __name__ == "__main__":
    main()
