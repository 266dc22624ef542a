"""The table of `ci/gemm_ab.sh`: image B's kernel time over image A's, cell by cell, and each image's geomean ratio to
the anchor by M, for the runs with the portable kernels (twice, in both orders) and with the plan chain's plans.

    python tests/bench/gemm_ab_summary.py OUT/ab IMAGE_A IMAGE_B
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path


def _rows(path: Path) -> dict:
    if not path.exists():
        return {}
    return {(r["m"], r["n"], r["k"]): r for r in json.loads(path.read_text())["rows"]}


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv: list[str]) -> int:
    d, a_name, b_name = Path(argv[1]), argv[2], argv[3]
    for label, a_tag, b_tag in (("portable kernels", "a_portable", "b_portable"),
                                ("portable kernels, order reversed", "a_portable2", "b_portable2"),
                                ("plan chain", "a_chain", "b_chain")):
        a, b = _rows(d / f"{a_tag}.json"), _rows(d / f"{b_tag}.json")
        cells = [c for c in a if c in b]
        print(f"== {label}: {a_name} (A) vs {b_name} (B), {len(cells)} cells")
        if not cells:
            continue
        print(f"{'M':>3} {'N':>6} {'K':>6} {'plan A':>7} {'plan B':>7} {'A us':>7} {'B us':>7} {'B/A':>6} "
              f"{'anchor A':>8} {'anchor B':>8} {'A x':>6} {'B x':>6} {'A/copy':>6} {'B/copy':>6}")
        for c in cells:
            ra, rb = a[c], b[c]
            print(f"{c[0]:>3} {c[1]:>6} {c[2]:>6} {'/'.join(map(str, ra['plan'])):>7} {'/'.join(map(str, rb['plan'])):>7} "
                  f"{ra['kernel_us']:7.2f} {rb['kernel_us']:7.2f} {rb['kernel_us'] / ra['kernel_us']:6.3f} "
                  f"{ra['anchor_us']:8.2f} {rb['anchor_us']:8.2f} {ra['speedup_vs_anchor']:6.2f} "
                  f"{rb['speedup_vs_anchor']:6.2f} {ra['fraction_of_copy']:6.2f} {rb['fraction_of_copy']:6.2f}")
        for m in sorted({c[0] for c in cells}):
            sel = [c for c in cells if c[0] == m]
            print(f"M = {m}: geomean vs anchor A {_geomean(a[c]['speedup_vs_anchor'] for c in sel):.3f}, "
                  f"B {_geomean(b[c]['speedup_vs_anchor'] for c in sel):.3f}; time B / A "
                  f"{_geomean(b[c]['kernel_us'] / a[c]['kernel_us'] for c in sel):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
