"""Offline (CPU): re-tune the GEMM plan model's constants for the plans they choose, on recorded plan sweeps.

The built-in plan's Hopper models (`ops.gemm.SM90_SMALL_MODEL`, `SM90_MID_MODEL`, `SM90_W8A16_MODEL`) price each
(recipe, split) and pick the cheapest. Fitted as call-time regressions they can rank two close plans wrongly; this
searches each constant (coordinate steps x0.5 to x2.0, and 0, repeated until no step helps) to minimize, over the
training sweeps' cells the model decides, the geomean regret of the chosen plan against the best plan timed plus half
the mean excess over 10% (a plan a sweep did not time counts 3x). It prints, per model and pair, the regret before and
after on the training and the holdout sweeps and the constants; a re-tune is worth keeping only where the holdouts
improve too, and, for a model that also serves larger M (SM90_W8A16_MODEL), only where those cells do not lose (the
twenty-seventh session kept SM90_MID_MODEL's; docs/benchmarks.md).

With --portable it fits SM90_SMALL_PORTABLE_MODEL instead (recipe 2 in the small bands): a least-squares seed on
recipe 2's timed plans, then the same search (the thirty-seventh session's w8a16 constants came from it). With
--wide PAIR it fits the constants of PAIR's wide tile (`SM90_WIDE_RECIPE`, the second recipe of SM90_SMALL_MODEL,
SM90_MID_MODEL and SM90_MODEL) the same way: a least-squares seed on that recipe's unsplit timed plans, then the
search over every constant of the three models (fp8's recipe 10 came from it). With --w8a16-recipe R it fits R's
(stage, unit, fixed) in SM90_W8A16_MODEL the same way (least squares on R's timed plans, every split, then the search
over every constant of the model at every M it decides; recipe 11 came from it). With --n192 PAIR it fits
`SM90_N192_MODEL[PAIR]` (recipe 10 beside 4 and 5 at M > 256) by least squares on recipe 10's unsplit timed plans, then
the search over it and SM90_MODEL[PAIR]. With --wide-out PAIR (train and holdout: int32 sweeps) it fits
`SM90_WIDE_OUT_MODEL[PAIR]` and `SM90_WIDE_OUT_N192_MODEL[PAIR]` (a 4-byte output at M > 256) by the search alone,
from PAIR's 16-bit rows (w8a8's came from it in the forty-third session).

    PYTHONPATH=. python tests/bench/retune_plan_models.py \\
        --train docs/results/2026-12-04_h200_gemm_sweep_train.json docs/results/2026-12-04_h200_gemm_sweep_train_small.json \\
        --holdout docs/results/2026-12-04_h200_gemm_sweep_holdout*.json
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from astrai.extension import gemm_tune as gt  # noqa: E402
from astrai.extension.ops import gemm, gemm_plan as gp  # noqa: E402

# (constant, pair, M band it decides)
TARGETS = ([("SM90_SMALL_MODEL", p, (17, 64)) for p in ("w16a16", "w8a8", "fp8")]
           + [("SM90_MID_MODEL", p, (65, 256)) for p in ("w16a16", "w8a8", "fp8")]
           + [("SM90_W8A16_MODEL", "w8a16", (17, 256))])
STEPS = (0.5, 0.7, 0.85, 0.93, 1.07, 1.18, 1.4, 2.0)
UNTIMED = 3.0


def load(paths) -> list:
    cells = []
    for path in paths:
        data = gt.load_sweep(Path(path))
        device = gt.facts_from(data["facts"])
        for record in data["records"]:
            times = {**gt._times(record, "first"), **gt._times(record)}  # the second pass where both timed a plan
            cells.append((record, device, times, min(times.values())))
    return cells


def _clear() -> None:
    gp._decisions.clear()
    for fn in (gemm._sm90_small_plan, gemm._sm90_w8a16_plan, gemm._sm90_plan, gemm._large_m_plan):
        fn.cache_clear()


def ratios(cells, pair=None, band=None) -> list[float]:
    _clear()
    out = []
    for record, device, times, best in cells:
        if (pair and record["pair"] != pair) or (band and not band[0] <= record["m"] <= band[1]):
            continue
        out.append(times.get(gt._chain_plan(record, device), UNTIMED * best) / best)
    return out


def objective(xs) -> float:
    return (sum(math.log(x) for x in xs) + 0.5 * sum(max(0.0, math.log(x / 1.1)) for x in xs)) / max(len(xs), 1)


def summary(xs) -> str:
    if not xs:
        return "no cells"
    geo = math.exp(sum(map(math.log, xs)) / len(xs)) - 1
    return f"{len(xs)} cells, regret {geo:.2%}, worst {max(xs):.2f}x, {sum(x > 1.1 for x in xs)} over 10%"


def _get(name, pair) -> list:
    value = getattr(gemm, name)
    return list(value[pair] if isinstance(value, dict) else value)


def _put(name, pair, values) -> None:
    value = getattr(gemm, name)
    if isinstance(value, dict):
        value[pair] = tuple(values)
    else:
        setattr(gemm, name, tuple(values))


def retune(name, pair, band, train, rounds: int = 6) -> list:
    values = _get(name, pair)
    best = objective(ratios(train, pair, band))
    for _ in range(rounds):
        improved = False
        for i, v in enumerate(values):
            if v is None:  # a recipe the pair does not have
                continue
            for candidate in [v * f for f in STEPS] + ([0.5, 1.0, 2.0] if v == 0 else []) + [0.0]:
                trial = values[:]
                trial[i] = round(candidate, 3)
                _put(name, pair, trial)
                score = objective(ratios(train, pair, band))
                if score < best - 1e-4:
                    best, values, improved = score, trial, True
            _put(name, pair, values)
        if not improved:
            break
    return values


def _least_squares(rows: list, width: int, rhs: list | None = None) -> tuple:
    """Constants c (>= 0, 3 decimals) with rows . c ~= rhs (default 1): each row is one timed plan's terms over its
    time."""
    if not rows:
        return (0.0,) * width
    target = numpy.ones(len(rows)) if rhs is None else numpy.array(rhs)
    solution = numpy.linalg.lstsq(numpy.array(rows), target, rcond=None)[0]
    return tuple(round(max(0.0, float(v)), 3) for v in solution)


def seed_portable(cells, pair, band) -> tuple:
    """SM90_SMALL_PORTABLE_MODEL[pair]'s starting constants: least squares (relative error) of recipe 2's timed plans
    in `band` on the model's form, each clipped at 0."""
    rows = []
    for record, device, times, _ in cells:
        m, n, k = record["m"], record["n"], record["k"]
        if record["pair"] != pair or not band[0] <= m <= band[1]:
            continue
        k_tiles, units = gemm._k_tiles(k, pair), gemm._tiles(m, n, 2)
        for (recipe, split), us in times.items():
            if recipe == 2:
                q = math.ceil(units * split / (device.num_sms * gemm.SM90_PORTABLE_FIT_CTAS))
                rows.append([q * math.ceil(k_tiles / split) / us, q / us, 1.0 / us])
    return _least_squares(rows, 3)


def seed_wide(cells, pair, band, fixed: bool) -> tuple:
    """The wide recipe's (stage, unit[, fixed]) for a model of `band`: least squares (relative error) of its unsplit
    timed plans on q * (stage * k_tiles + unit) (+ fixed), each clipped at 0."""
    recipe = gemm.SM90_WIDE_RECIPE[pair]
    rows = []
    for record, device, times, _ in cells:
        m, n, k = record["m"], record["n"], record["k"]
        us = times.get((recipe, 1))
        if record["pair"] != pair or not band[0] <= m <= band[1] or us is None:
            continue
        q = math.ceil(gemm._tiles(m, n, recipe) / device.num_sms)
        rows.append([q * gemm._k_tiles(k, pair) / us, q / us] + ([1.0 / us] if fixed else []))
    return _least_squares(rows, 3 if fixed else 2)


def _seed_every_split(cells, pair: str, recipe: int, band, split_cost: float) -> tuple:
    """(stage, unit, fixed) for `recipe` in a model of the `_cheapest_plan` form: least squares (relative error) of its
    timed plans, every split, at band[0] <= M <= band[1], with the model's split cost taken off, clipped at 0."""
    rows, rhs = [], []
    for record, device, times, _ in cells:
        m, n, k = record["m"], record["n"], record["k"]
        if record["pair"] != pair or not band[0] <= m <= band[1]:
            continue
        k_tiles, tiles = gemm._k_tiles(k, pair), gemm._tiles(m, n, recipe)
        for (r, split), us in times.items():
            if r == recipe and split >= 1:
                q = math.ceil(tiles * split / device.num_sms)
                rows.append([q * math.ceil(k_tiles / split) / us, q / us, 1.0 / us])
                rhs.append(1.0 - (split_cost * m * n * split / 1e6 if split > 1 else 0.0) / us)
    return _least_squares(rows, 3, rhs)


def seed_w8a16(cells, recipe: int) -> tuple:
    """SM90_W8A16_MODEL's (stage, unit, fixed) for `recipe`, at every M it decides."""
    return _seed_every_split(cells, "w8a16", recipe, (0, 1 << 30), gemm.SM90_W8A16_MODEL[-1])


def seed_n192(cells, pair) -> tuple:
    """SM90_N192_MODEL[pair]'s (stage, unit): least squares (relative error) of recipe 10's unsplit timed plans at
    M > SM90_MID_MAX_M on q * (stage * k_tiles + unit), clipped at 0."""
    rows = []
    for record, device, times, _ in cells:
        m, n, k = record["m"], record["n"], record["k"]
        us = times.get((gemm.SM90_N192_RECIPE, 1))
        if record["pair"] != pair or m <= gemm.SM90_MID_MAX_M or us is None:
            continue
        q = math.ceil(gemm._tiles(m, n, gemm.SM90_N192_RECIPE) / device.num_sms)
        rows.append([q * gemm._k_tiles(k, pair) / us, q / us])
    return _least_squares(rows, 2)


def seed_mid_n192(cells, pair) -> tuple:
    """SM90_MID_N192_MODEL[pair]'s (stage, unit, fixed) at SM90_MIN_M < M <= SM90_MID_MAX_M, SM90_MID_MODEL's form."""
    return _seed_every_split(cells, pair, gemm.SM90_N192_RECIPE, (gemm.SM90_MIN_M + 1, gemm.SM90_MID_MAX_M),
                             gemm.SM90_MID_MODEL[pair][-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", nargs="+", required=True)
    parser.add_argument("--holdout", nargs="+", required=True)
    parser.add_argument("--portable", action="store_true",
                        help="fit SM90_SMALL_PORTABLE_MODEL (recipe 2 in the small bands) from a least-squares seed, "
                             "each pair with the other constants as installed")
    parser.add_argument("--wide", metavar="PAIR",
                        help="fit PAIR's wide-tile constants (SM90_WIDE_RECIPE) in the three Hopper mainloop models "
                             "from a least-squares seed, keeping the result")
    parser.add_argument("--n192", metavar="PAIR",
                        help="fit SM90_N192_MODEL[PAIR] (recipe 10 at M > 256) from a least-squares seed, then search it "
                             "and SM90_MODEL[PAIR]")
    parser.add_argument("--mid-n192", metavar="PAIR",
                        help="fit SM90_MID_N192_MODEL[PAIR] (recipe 10 at 64 < M <= 256) from a least-squares seed, then "
                             "search it")
    parser.add_argument("--wide-out", metavar="PAIR",
                        help="fit SM90_WIDE_OUT_MODEL[PAIR] and SM90_WIDE_OUT_N192_MODEL[PAIR] (a 4-byte output at "
                             "M > 256) on int32 sweeps (`gemm_tune sweep --out-dtype int32`), searching from the "
                             "16-bit rows (SM90_MODEL, SM90_N192_MODEL), twice over both")
    parser.add_argument("--w8a16-recipe", type=int, metavar="R",
                        help="fit recipe R's constants in SM90_W8A16_MODEL (least-squares seed, then the search over "
                             "the whole model at every M it decides)")
    args = parser.parse_args(argv)
    train, holdout = load(args.train), load(args.holdout)
    targets = TARGETS
    if args.wide:
        pair = args.wide
        targets = [("SM90_SMALL_MODEL", pair, (17, 64)), ("SM90_MID_MODEL", pair, (65, 256)),
                   ("SM90_MODEL", pair, (257, 1 << 30))]
        for name, _, band in targets:
            values = _get(name, pair)
            if name == "SM90_MODEL":
                values[2:4] = seed_wide(train, pair, band, fixed=False)
            else:
                values[3:6] = seed_wide(train, pair, band, fixed=True)
            _put(name, pair, values)
            print(f"{name}[{pair!r}] seed {tuple(values)}")
    if args.n192:
        gemm.SM90_N192_MODEL[args.n192] = seed_n192(train, args.n192)
        print(f"SM90_N192_MODEL[{args.n192!r}] seed {gemm.SM90_N192_MODEL[args.n192]}")
        targets = [("SM90_N192_MODEL", args.n192, (gemm.SM90_MID_MAX_M + 1, 1 << 30)),
                   ("SM90_MODEL", args.n192, (gemm.SM90_MID_MAX_M + 1, 1 << 30))]
    if args.mid_n192:
        gemm.SM90_MID_N192_MODEL[args.mid_n192] = seed_mid_n192(train, args.mid_n192)
        print(f"SM90_MID_N192_MODEL[{args.mid_n192!r}] seed {gemm.SM90_MID_N192_MODEL[args.mid_n192]}")
        targets = [("SM90_MID_N192_MODEL", args.mid_n192, (gemm.SM90_MIN_M + 1, gemm.SM90_MID_MAX_M))]
    if args.wide_out:
        pair, band = args.wide_out, (gemm.SM90_MID_MAX_M + 1, 1 << 30)
        gemm.SM90_WIDE_OUT_MODEL[pair] = tuple(gemm.SM90_MODEL[pair])
        gemm.SM90_WIDE_OUT_N192_MODEL[pair] = tuple(gemm.SM90_N192_MODEL[pair])
        targets = [("SM90_WIDE_OUT_MODEL", pair, band), ("SM90_WIDE_OUT_N192_MODEL", pair, band)] * 2
    if args.w8a16_recipe is not None:
        slot = 3 * gemm.SM90_W8A16_RECIPES.index(args.w8a16_recipe)
        values = _get("SM90_W8A16_MODEL", "w8a16")
        values[slot:slot + 3] = seed_w8a16(train, args.w8a16_recipe)
        _put("SM90_W8A16_MODEL", "w8a16", values)
        print(f"SM90_W8A16_MODEL seed {tuple(values)}")
        targets = [("SM90_W8A16_MODEL", "w8a16", (17, 1 << 30))]
    if args.portable:
        targets = [("SM90_SMALL_PORTABLE_MODEL", p, (17, 256)) for p in ("w16a16", "w8a8", "fp8", "w8a16")]
        for _, pair, band in targets:
            gemm.SM90_SMALL_PORTABLE_MODEL[pair] = seed_portable(train, pair, band)
    for name, pair, band in targets:
        original = _get(name, pair)
        before = summary(ratios(train, pair, band)), summary(ratios(holdout, pair, band))
        values = retune(name, pair, band, train)
        after = summary(ratios(train, pair, band)), summary(ratios(holdout, pair, band))
        print(f"{name}[{pair!r}] (M {band[0]}-{band[1]})\n  train   {before[0]}  ->  {after[0]}\n"
              f"  holdout {before[1]}  ->  {after[1]}\n  was {tuple(original)}\n  now {tuple(values)}")
        if args.portable:  # judged without it: the chain as installed
            gemm.SM90_SMALL_PORTABLE_MODEL.pop(pair)
            before = summary(ratios(train, pair, band)), summary(ratios(holdout, pair, band))
            print(f"  without recipe 2: train {before[0]}, holdout {before[1]}")
            continue
        if args.wide or args.w8a16_recipe is not None or args.n192 or args.mid_n192 or args.wide_out:
            # kept: the seed is not the installed model to judge against
            continue
        _put(name, pair, original)  # each target judged alone, against the constants as installed
    return 0


if __name__ == "__main__":
    sys.exit(main())
