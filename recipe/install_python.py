#!/usr/bin/env python3
"""Both modes of the recipe: copy the pure-Python package (no images) into the noarch: python package.

    $PYTHON recipe/install_python.py      (python3 in the prebuilt mode)

The target is $SP_DIR (set when python is a host requirement, the farm mode), else $PREFIX/site-packages
(the prebuilt mode, which has no host python; noarch: python files live there either way). Images ship in
libastrai-kernels under $PREFIX/lib/astrai-kernels, never inside the Python package.
"""

from __future__ import annotations

import os
import shutil
import sys

SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "astrai")


def main() -> None:
    if "PREFIX" not in os.environ:
        sys.exit("install_python: PREFIX is not set (run by rattler-build)\n" + __doc__)
    site = os.environ.get("SP_DIR") or os.path.join(os.environ["PREFIX"], "site-packages")
    target = os.path.join(site, "astrai")
    shutil.copytree(SOURCE, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "lib"))
    print(f"install_python: {SOURCE} -> {target}")


if __name__ == "__main__":
    main()
