"""Check an installed astrai-kernels (wheel or conda) from outside the source tree.

Run from a directory that does not hold the `astrai` sources: the import must come from site-packages,
the image from the installed package, and the rotary ops must register on this torch.
"""

from __future__ import annotations

import os
import sys

import torch

import astrai.extension
from astrai.extension import loader

here = os.path.dirname(os.path.abspath(astrai.extension.__file__))
if "site-packages" not in here:
    sys.exit(f"check_installed: astrai.extension imported from {here}, not from an installed package")
loader.load_family("rotary")
schema = str(torch.ops.astrai.rotary_embedding_qk.default._schema)
desc = loader.describe()
print(f"check_installed: {here}")
print(f"check_installed: image {desc.get('chosen')!r} registers {schema}")
