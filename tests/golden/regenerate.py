"""Regenerate golden digests for the image the loader picks on this GPU (explicit only: `nox -s golden`, or
`ci/gpu_run.sh golden`). Writes tests/golden/<family>.json, or --out DIR (copy the files back and commit).

    PYTHONPATH=. python tests/golden/regenerate.py [--out DIR] [--family rotary]
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS), str(TESTS.parent)]

import pytest  # noqa: E402  (a case whose op the image lacks raises pytest's skip)
import torch  # noqa: E402

from support import golden  # noqa: E402
from support.bitwise import digest  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=golden.GOLDEN_DIR)
    parser.add_argument("--family", nargs="*", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("regenerate: no CUDA device is visible", file=sys.stderr)
        return 2
    from astrai.extension import loader
    chosen = loader.describe().get("chosen") or {}
    if not chosen.get("image"):
        print("regenerate: the loader chose no image", file=sys.stderr)
        return 2
    props = torch.cuda.get_device_properties(0)
    where = golden.key(chosen["image"], f"{props.major}.{props.minor}")
    for family in args.family or golden.families():
        target = args.out / f"{family}.json"
        if args.out != golden.GOLDEN_DIR and not target.exists() and (golden.GOLDEN_DIR / f"{family}.json").exists():
            args.out.mkdir(parents=True, exist_ok=True)
            shutil.copy(golden.GOLDEN_DIR / f"{family}.json", target)  # keep the other images' keys
        digests, skipped = {}, []
        for name, case in golden.load_cases(family).items():
            try:
                first, second = digest(case()), digest(case())
            except pytest.skip.Exception as exc:
                skipped.append(name)
                print(f"regenerate: {family}/{name} skipped: {exc}")
                continue
            if first != second:
                print(f"regenerate: {family}/{name} is not deterministic; refusing to store it", file=sys.stderr)
                return 1
            digests[name] = first
        path = golden.store_digests(family, where, digests, args.out)
        print(f"{path}: {where}: {len(digests)} digests" + (f", {len(skipped)} skipped (op not registered)"
                                                             if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
