"""Tier 0 (CPU): the built-in plan as data, batch-invariant plans, the ops wrapper's data, and the fake (meta)
implementations' shapes.

The fakes are checked twice: through a private torch.library namespace carrying the contract's schemas (needs no
image), and on the real ops; tests marked `requires_cuda_kernels("gemm")` need the image and skip without it.
"""

from __future__ import annotations

import pytest
import torch

from astrai.extension import quant_gemm
from astrai.extension.ops import gemm as ops
from support.schemas import assert_schema_matches

kernels = pytest.mark.requires_cuda_kernels("gemm")

CONTRACT_SCHEMAS = {
    "quant_gemm":
        "quant_gemm(Tensor a, Tensor b, Tensor? a_scale, Tensor? b_scale, Tensor? bias, ScalarType out_dtype,"
        " int layout, int recipe, int split_k) -> Tensor",
    "quant_gemm_out":
        "quant_gemm_out(Tensor a, Tensor b, Tensor? a_scale, Tensor? b_scale, Tensor? bias, int layout, int recipe,"
        " int split_k, Tensor(a!) out) -> ()",
    "quant_gemm_can_implement":
        "quant_gemm_can_implement(ScalarType a_dtype, ScalarType b_dtype, int layout, int recipe, int split_k, int m,"
        " int n, int batch, int cc, bool sm90_code, int fp8_code_arch) -> str",
    "quant_gemm_set_pdl": "quant_gemm_set_pdl(bool allowed) -> bool",
    "l2_prefetch": "l2_prefetch(Tensor t, int run, int period) -> ()",
}

# (M, N, K, num_sms) -> (recipe, split_k): the rules of ops.gemm.builtin_plan worked by hand.
PLAN_TABLE = {
    (1, 4096, 4096, 132): (2, 4),      # 64 tiles: x8 would fill four waves, capped by 1024 of K per split
    (1, 4096, 16384, 132): (2, 16),    # 64 tiles x 16 >= 4 waves (528 CTAs)
    (1, 7168, 16384, 132): (2, 8),     # 112 tiles x 8 >= 528
    (1, 4096, 1024, 132): (2, 1),      # K too short to split
    (1, 128, 2048, 132): (2, 2),       # capped by 1024 of K per split
    (16, 64, 65536, 132): (2, 16),     # capped at 16 splits
    (8, 16384, 4096, 132): (2, 4),     # 256 tiles: x4 for four waves (K allows 4)
    (8, 65536, 4096, 132): (2, 1),     # 1024 tiles: four waves already
    (1, 64, 65536, 1): (2, 4),         # one SM: four waves of one tile
    (1, 4096, 0, 132): (2, 1),         # K = 0
    (17, 4096, 8192, 132): (1, 8),     # 32 tiles under a wave, K >= 4096
    (64, 4096, 2048, 132): (1, 1),     # under a wave but K < 4096
    (64, 32768, 8192, 132): (1, 1),    # 256 tiles
    (65, 4096, 4096, 132): (0, 4),     # model: 32 tiles x 4 still one CTA a SM, a quarter of K each
    (4096, 4096, 4096, 132): (0, 1),   # model: 1024 tiles, no split pays
}


@pytest.mark.parametrize("case", list(PLAN_TABLE), ids=str)
@pytest.mark.parametrize("pair", list(ops.PAIRS))
def test_builtin_plan_table(case, pair):
    """The mainloop rule: every pair's plan in every layout, but w8a16's in "nt" at M <= 16 (the stream rule)."""
    m, n, k, sms = case
    for layout in ("nn", "tn") if pair == "w8a16" else ("nt", "nn"):
        assert ops.builtin_plan(m, n, k, pair, sms, layout=layout) == PLAN_TABLE[case]
    if pair == "w8a16" and m > ops.SMALL_M:
        assert ops.builtin_plan(m, n, k, pair, sms) == PLAN_TABLE[case]


# w8a16, layout nt, M <= 16 -> recipe 2 on the weight-stream kernel: the most K slices (one warp each, <= 24, each
# >= 2 K tiles of 128, counted as ceil(k_tiles / per_slice) so no warp idles) whose CTAs of one slice per warp on 16
# weight rows fit one resident wave: ceil(N / 16) <= (warps // split) * SMs, warps 32 a SM at M <= 8, 24 above.
# Worked by hand.
STREAM_PLAN_TABLE = {
    (1, 4096, 4096, 132): (2, 16),     # 256 groups <= (32 // 16) * 132 = 264
    (8, 4096, 4096, 132): (2, 16),
    (9, 4096, 4096, 132): (2, 11),     # 24 warps: 16 gives 132 < 256; 32 tiles / 3 a slice = 11 gives 264
    (16, 4096, 4096, 132): (2, 11),
    (1, 14336, 4096, 132): (2, 4),     # 896 groups: 5 slices give 6 * 132 = 792, 4 give 1056
    (1, 2112, 7168, 132): (2, 19),     # 56 tiles: 2 a slice would be 28 > 24 warps; 3 a slice make 19 slices
    (1, 4096, 1024, 132): (2, 4),      # 8 tiles: 2 a slice (256 values of K) is the floor
    (1, 4096, 0, 132): (2, 1),         # K = 0
    (16, 64, 65536, 132): (2, 24),     # 4 groups: capped at 24 warps (512 tiles / 22 a slice)
    (1, 64, 65536, 1): (2, 8),         # one SM: 4 groups <= 32 // 8
    (16, 4096, 512, 132): (2, 2),      # 4 tiles: two slices of two
    (1, 24576, 1536, 132): (2, 2),     # 1536 groups: (32 // 2) * 132 = 2112
}


def _model_cost(m, n, k, recipe, split, sms):
    # ops.gemm's large-M estimate, written out again: CTAs of the busiest SM x a CTA's work / the SM's rate at that
    # many resident CTAs, plus the split's cost per output element and split.
    tm, tn = {0: (128, 128), 1: (64, 128), 3: (128, 64)}[recipe]
    rates = {0: (0.94, 1.0), 1: (0.66, 0.83), 3: (0.73, 0.90, 0.84)}[recipe]
    q = -(-(-(-m // tm) * -(-n // tn) * split) // sms)
    return q * tm * tn * -(-k // split) / rates[min(q, len(rates)) - 1] + (7.5 * m * n * split if split > 1 else 0)


# M > 64: (M, N, K) on 132 SMs -> the plan of w16a16 / w8a8 / fp8 in "nt", by the model worked out above.
LARGE_M_TABLE = {
    (1024, 2112, 7168): (3, 1),   # 136 tiles of 128 x 128 put two on 4 SMs; 264 of 128 x 64 spread at 2 a SM
    (4096, 2112, 7168): (3, 1),
    (128, 4096, 4096): (3, 2),    # 32 tiles: half-width tiles and a split of 2 fill 128 SMs
    (256, 14336, 4096): (0, 1),
    (1024, 4096, 4096): (0, 1),
    (4096, 14336, 4096): (0, 1),
}


@pytest.mark.parametrize("case", list(LARGE_M_TABLE), ids=str)
def test_large_m_plan_is_the_models_least_cost(case):
    m, n, k = case
    costs = {(r, s): _model_cost(m, n, k, r, s, 132) for r in (0, 1, 3) for s in (1, 2, 4, 8) if s == 1 or k // s >= 1024}
    assert min(costs, key=costs.get) == LARGE_M_TABLE[case]
    for pair in ("w16a16", "w8a8", "fp8"):
        assert ops.builtin_plan(m, n, k, pair, 132) == LARGE_M_TABLE[case]
    # recipe 3 only in "nt" and never for w8a16: the others take the best of recipes 0 and 1
    no3 = {p: c for p, c in costs.items() if p[0] != 3}
    assert ops.builtin_plan(m, n, k, "w8a16", 132) == min(no3, key=no3.get)
    assert ops.builtin_plan(m, n, k, "w8a8", 132, layout="nn") == min(no3, key=no3.get)


@pytest.mark.parametrize("case", list(STREAM_PLAN_TABLE), ids=str)
def test_stream_plan_table(case):
    m, n, k, sms = case
    assert ops.builtin_plan(m, n, k, "w8a16", sms) == STREAM_PLAN_TABLE[case]
    assert ops.builtin_plan(m, n, k, "w8a16", sms, layout="nt") == STREAM_PLAN_TABLE[case]


def test_w8a16_batch_invariant_plan_is_the_stream_at_every_m():
    """The stream kernel sums K in its own order, so w8a16's invariant plan in "nt" keeps recipe 2 at every M, with
    the split of M = 16; its other layouts keep the mainloop's (recipe follows M, split follows (N, K))."""
    for m in (0, 1, 8, 16, 17, 64, 65, 4096):
        assert ops.builtin_plan(m, 4096, 4096, "w8a16", 132, batch_invariant=True) == (2, 11)
        assert ops.builtin_plan(m, 4096, 4096, "w8a16", 132, batch_invariant=True, layout="nn") == \
            ops.builtin_plan(m, 4096, 4096, "w8a8", 132, batch_invariant=True)


@pytest.mark.parametrize("n,k,split", [(4096, 4096, 4), (32768, 4096, 2), (65536, 4096, 1), (128, 2048, 2),
                                      (4096, 1024, 1)])
def test_batch_invariant_plan_split_independent_of_m(n, k, split):
    """The split (the only part of a plan that changes a row's summation order) follows (N, K) alone; the recipe
    follows M as in the default plan."""
    for m in (0, 1, 16, 17, 64, 65, 4096):
        recipe, got = ops.builtin_plan(m, n, k, "fp8", 132, batch_invariant=True)
        assert got == split
        assert recipe == ops.builtin_plan(m, n, k, "fp8", 132)[0]


def test_plan_fits_the_rules():
    """Every plan of a sweep: a known recipe, split_k a power of two <= 16 keeping >= 1024 of K per split."""
    for m in (1, 8, 16, 33, 64, 200):
        for n in (64, 1000, 4096):
            for k in (0, 512, 3000, 8192, 1 << 16):
                for invariant in (False, True):
                    recipe, split = ops.builtin_plan(m, n, k, "w8a8", 132, batch_invariant=invariant)
                    assert recipe in ops.RECIPES
                    assert split & (split - 1) == 0 and 1 <= split <= ops.MAX_SPLIT_K
                    assert split == 1 or k // split >= ops.MIN_K_PER_SPLIT


# --- the Hopper recipes (sm90=True) ---------------------------------------------------------------------------

# (M, N, K, pair) -> the plan at sm90=True on 132 SMs: the SM90_MODEL's least cost (with SM90_N192_MODEL's recipe 10
# for w16a16 / w8a8), worked from its constants.
SM90_PLAN_TABLE = {
    (128, 4096, 4096, "w16a16"): (4, 4),    # 32 tiles: a split of 4 fills 128 SMs
    (4096, 4096, 4096, "w16a16"): (5, 1),   # 512 units of 128 x 256: 4 a SM
    (4096, 4096, 4096, "fp8"): (4, 1),      # fp8's wide tile is recipe 10 (128 x 192): 704 tiles, priced higher
    (4096, 7168, 16384, "w8a8"): (10, 0),   # 1216 tiles of 128 x 192: 9 whole waves, the last 28 tiles split
    (256, 2112, 7168, "w8a8"): (4, 0),      # 34 tiles of 128 x 128, each in 3 K slices
    (1024, 24576, 1536, "w16a16"): (5, 1),
    (1024, 2112, 7168, "w16a16"): (4, 0),   # 136 tiles: 132 whole, the last 4 in 14 K slices (split 1: 2 waves)
    (4096, 2112, 7168, "fp8"): (10, 1),     # 352 tiles of 128 x 192 (2.7 waves) beat 544 of recipe 4 split or not
    (4096, 2112, 7168, "w8a8"): (10, 1),    # 352 tiles of 128 x 192 (2.7 waves)
    (4096, 2112, 7168, "w16a16"): (10, 1),  # the same 352 tiles; recipe 5's 288 of 128 x 256 run as 3 waves too
    (4096, 14336, 4096, "w16a16"): (5, 1),  # 1792 tiles: 13.6 waves, the last one's split not worth its partials
}


def _sm90_cost(m, n, k, pair, recipe, split, sms=132):
    stage_4, unit_4, stage_w, unit_w, split_cost = ops.SM90_MODEL[pair]
    stage, unit = (stage_4, unit_4) if recipe == 4 else (stage_w, unit_w)
    if recipe == 10 and pair in ops.SM90_N192_MODEL:
        stage, unit = ops.SM90_N192_MODEL[pair]
    k_tiles = -(-k // (64 if pair == "w16a16" else 128))
    tile_n = {4: 128, 5: 256, 10: 192}[recipe]
    tiles = -(-m // 128) * -(-n // tile_n)
    if split == 0:  # the last wave split, restated: whole waves, then one wave of the rest's K slices
        rest = tiles % sms
        slices = min(sms // rest, 16, k_tiles // 8) if rest else 1
        if slices < 2:
            return None
        per = -(-k_tiles // slices)
        slices = -(-k_tiles // per)
        return ((tiles - rest) // sms * (stage * k_tiles + unit) + stage * per + unit
                + split_cost * rest * 128 * tile_n * slices / 1e6)
    q = -(-(tiles * split) // sms)
    return q * (stage * -(-k_tiles // split) + unit) + (split_cost * m * n * split / 1e6 if split > 1 else 0)


@pytest.mark.parametrize("case", list(SM90_PLAN_TABLE), ids=str)
def test_sm90_plan_table(case):
    m, n, k, pair = case
    wide = ops.SM90_WIDE_RECIPE[pair]
    recipes = ((4,) if ops.SM90_MODEL[pair][2] is None else (4, wide)) + ((10,) if pair in ops.SM90_N192_MODEL else ())
    costs = {(r, s): _sm90_cost(m, n, k, pair, r, s) for r in recipes for s in (1, 2, 4, 8)
             if s == 1 or k // s >= 1024}
    best = min(costs, key=costs.get)
    # the last wave split only where it prices TAIL_MARGIN below the best plan without it
    tails = {(r, 0): _sm90_cost(m, n, k, pair, r, 0) for r in recipes}
    tails = {plan: cost for plan, cost in tails.items() if cost is not None}
    if tails and min(tails.values()) * (1 + ops.TAIL_MARGIN) < costs[best]:
        best = min(tails, key=tails.get)
    assert best == SM90_PLAN_TABLE[case]
    assert ops._sm90_plan(m, n, k, pair, 132) == SM90_PLAN_TABLE[case]
    if m > ops.SM90_MID_MAX_M:  # below it the small bands' model decides (test_sm90_small_plan)
        assert ops.builtin_plan(m, n, k, pair, 132, sm90=True) == SM90_PLAN_TABLE[case]


def test_tail_split_geometry():
    """The last wave split's (whole, tail, split) as the launcher plans it: whole waves of 132 run whole, the rest
    split into <= 16 slices of >= 8 K tiles with none empty; nothing to split on a whole last wave or short K."""
    assert ops.tail_split(1024, 2112, 7168, "w16a16", 4, 132) == (132, 4, 14)   # 112 K tiles: 14 slices of 8
    assert ops.tail_split(1024, 2112, 7168, "fp8", 4, 132) == (132, 4, 7)       # 56 K tiles: 7 of 8
    assert ops.tail_split(4096, 2112, 7168, "w16a16", 4, 132) == (528, 16, 8)
    assert ops.tail_split(256, 2112, 7168, "w8a8", 4, 132) == (0, 34, 3)       # under one wave: every tile split
    assert ops.tail_split(1024, 2112, 1000, "w16a16", 4, 132) == (132, 4, 2)    # 16 K tiles: 2 slices of 8
    assert ops.tail_split(1024, 2112, 960, "w16a16", 4, 132) == (136, 0, 1)     # 15 K tiles: too short to split
    assert ops.tail_split(4096, 4096, 4096, "w16a16", 5, 128) == (512, 0, 1)    # 512 tiles: 4 whole waves
    assert ops.tail_split(1024, 2112, 7168, "w16a16", 4, 132, batch=2) == (264, 8, 14)
    assert ops.tail_split(128, 128, 8192, "w16a16", 4, 132) == (0, 1, 16)       # one tile: 16 slices of 8
    assert ops.tail_split(128, 128, 8192 - 64, "w16a16", 4, 132) == (0, 1, 15)  # 127 K tiles: 15 slices of <= 9



def test_sm90_plan_scope():
    """The Hopper recipes serve layout "nt": 4 / 5 (fp8: 4 / 10) at M > SM90_MIN_M for every pair but w8a16, 4 / 5 / 6
    (fp8: 4 / 10 / 6) at SM90_SMALL_M < M <= SM90_MIN_M (SM90_SMALL_MODEL), 6 (the weight stream) at the M of
    SM90_STREAM_BANDS (w8a16: M <= 8 at N >= 7168 or N * K >= 20e6), 7 / 8 / 9 (or the weight stream) for w8a16 at
    M > SMALL_M; elsewhere (other layouts, M = 9-16, w8a16 at M <= 16 with smaller weights) the plan is the portable
    one. Batch-invariant: recipe 4 at every M, split from (N, K); w8a16 recipe 2."""
    for pair in ("w16a16", "w8a8", "fp8", "w8a16"):
        stream_m = {"w16a16": (1, 8), "w8a8": (1, 8), "fp8": (1, 8)}.get(pair, ())  # test_sm90_stream_plan
        for m in (1, 8, 9, 16, 17, 32, 33, 64):
            plan = ops.builtin_plan(m, 4096, 4096, pair, 132, sm90=True)
            if m in stream_m:
                assert plan[0] == ops.SM90_STREAM_RECIPE
            elif pair == "w8a16" and m > ops.SMALL_M:
                assert plan[0] in ops.SM90_W8A16_RECIPES + (2,)  # 2: the weight stream where its model says
            elif m > ops.SM90_SMALL_M:
                assert plan[0] in (4, ops.SM90_WIDE_RECIPE[pair], 6)
            else:
                assert plan == ops.builtin_plan(m, 4096, 4096, pair, 132)
            assert ops.builtin_plan(m, 4096, 4096, pair, 132, sm90=True, layout="nn") == \
                ops.builtin_plan(m, 4096, 4096, pair, 132, layout="nn")
        for layout in ("nn", "tn", "tt"):
            assert ops.builtin_plan(1024, 4096, 4096, pair, 132, sm90=True, layout=layout) == \
                ops.builtin_plan(1024, 4096, 4096, pair, 132, layout=layout)
    assert ops.builtin_plan(1024, 4096, 4096, "w8a16", 132, sm90=True) == (8, 1)
    assert ops.builtin_plan(1024, 4096, 4096, "w8a16", 132)[0] not in ops.SM90_W8A16_RECIPES
    for m in (17, 1024):  # batch-invariant w8a16: the weight stream at every M, as off a Hopper GPU
        assert ops.builtin_plan(m, 4096, 4096, "w8a16", 132, sm90=True, batch_invariant=True) == \
            ops.builtin_plan(m, 4096, 4096, "w8a16", 132, batch_invariant=True)
    assert ops.SM90_STREAM_BANDS == {"w16a16": ((1, 8),), "w8a8": ((1, 8),), "fp8": ((1, 8),)}
    # w8a16: recipe 6 only at M <= 8 with N >= 7168 or N * K >= 20e6 (SM90_STREAM_W8A16_*), split by the stream rule
    # (224 blocks: one slice; 112: two; 64: two; 40: four); at N = K = 4096 above, the portable stream
    for m, n, k, want in ((1, 14336, 4096, (6, 1)), (8, 14336, 16384, (6, 1)), (0, 14336, 2048, (6, 1)),
                          (1, 7168, 16384, (6, 2)), (1, 4096, 14336, (6, 2)), (8, 2560, 10240, (6, 4))):
        assert ops.builtin_plan(m, n, k, "w8a16", 132, sm90=True) == want
    for m, n, k in ((9, 14336, 4096), (16, 24576, 4096), (1, 4864, 4096), (8, 2112, 7168)):  # 19.9e6, 15.1e6
        assert ops.builtin_plan(m, n, k, "w8a16", 132, sm90=True) == ops.builtin_plan(m, n, k, "w8a16", 132)
    # up to M = 256 the weight stream (recipe 2) competes with recipes 7-9 (SM90_SMALL_PORTABLE_MODEL["w8a16"]): it
    # takes the small weights and the low M, recipes 7-9 the rest (the H100 sweeps' best plans where it was fitted)
    for m, n, k, want in ((17, 768, 768, (2, 8)), (96, 1024, 1024, (2, 4)), (28, 33, 4096, (2, 16)),
                          (17, 4096, 4096, (2, 4)), (32, 1536, 1536, (2, 8))):
        assert ops.builtin_plan(m, n, k, "w8a16", 132, sm90=True) == want
    for m, n, k in ((64, 4096, 4096), (128, 4096, 4096), (256, 14336, 4096), (32, 14336, 4096), (257, 1024, 1024)):
        assert ops.builtin_plan(m, n, k, "w8a16", 132, sm90=True)[0] in ops.SM90_W8A16_RECIPES
    assert ops.builtin_plan(32, 1024, 1024, "w8a16", 132)[0] != 2  # off a Hopper GPU the portable mainloop's rule
    assert ops.builtin_plan(1, 14336, 4096, "w8a16", 132, sm90=True, batch_invariant=True)[0] == 2
    assert ops.builtin_plan(1, 14336, 4096, "w8a16", 132, sm90=True, layout="nn")[0] != ops.SM90_STREAM_RECIPE
    for pair in ("w16a16", "w8a8", "fp8"):
        plans = {ops.builtin_plan(m, 4096, 4096, pair, 132, sm90=True, batch_invariant=True) for m in (1, 65, 4096)}
        assert plans == {(4, 4)}
    # tt runs swapped as "nn": never a Hopper recipe
    assert ops.plan_problem(ops.LAYOUTS["tt"], ops.Problem(None, 1024, 4096, 4096, 4096), "w16a16", 132, False,
                            sm90=True)[0] not in ops.SM90_RECIPES


# (M, N, K, pair) -> recipe 6's split on 132 SMs: the largest of 1, 2, 4 whose CTAs (ceil(N / 64) x blocks of 16
# rows x split) number at most 1.75 x 132 = 231 and that keeps >= 8 K tiles (64 16-bit or 128 8-bit values) a slice.
SM90_STREAM_TABLE = {
    (1, 4096, 4096, "w16a16"): 2,     # 64 blocks: 128 CTAs; 4 would be 256
    (1, 5120, 5120, "w16a16"): 2,     # 80 blocks: 160 CTAs (timed 18.5 us against 22.1 for split 1, H200 holdout)
    (6, 2560, 10240, "w8a8"): 4,      # 40 blocks: 160 CTAs (13.1 us against 15.4 for split 2, H200 holdout2)
    (1, 7168, 16384, "fp8"): 2,       # 112 blocks: 224 CTAs
    (8, 4096, 4096, "w8a8"): 2,
    (1, 14336, 4096, "w16a16"): 1,    # 224 blocks
    (1, 2112, 7168, "fp8"): 4,        # 33 blocks: 132 CTAs; 56 K tiles
    (1, 24576, 1536, "w8a8"): 1,      # 384 blocks
    (8, 4096, 512, "w16a16"): 1,      # 8 K tiles
    (8, 2112, 16384, "fp8"): 4,       # 33 blocks, 128 K tiles: 4 is the largest split offered
}


# (M, N, K, pair) -> the small bands' plan (SM90_SMALL_MODEL / SM90_MID_MODEL, 16 < M <= 256) where it is the best plan
# the twenty-second session's H200 training sweeps timed for that cell (docs/results/2026-12-04_h200_gemm_sweep_
# train*.json).
SM90_SMALL_TABLE = {
    (17, 2048, 2048, "w8a8"): (6, 2),
    (32, 1280, 5120, "fp8"): (6, 4),
    (32, 4096, 1024, "fp8"): (6, 1),
    (48, 2560, 2560, "w8a8"): (6, 2),
    (64, 7168, 16384, "w8a8"): (4, 2),  # re-tuned on H100 sweeps (thirty-seventh session): best timed there
    (96, 768, 768, "w16a16"): (6, 1),
    (128, 4096, 7168, "w16a16"): (4, 4),
    (160, 2048, 2048, "w8a8"): (6, 1),
    (192, 2560, 2560, "fp8"): (4, 2),
    (256, 4096, 14336, "w8a8"): (4, 2),
}


@pytest.mark.parametrize("case", sorted(SM90_SMALL_TABLE), ids=lambda c: "-".join(map(str, c)))
def test_sm90_small_plan(case):
    m, n, k, pair = case
    assert ops.builtin_plan(m, n, k, pair, 132, sm90=True) == SM90_SMALL_TABLE[case]
    assert ops.builtin_plan(m, n, k, pair, 132)[0] < 4  # never off an H100 / H200


# (M, N, K) -> Hopper w8a16's plan on 132 SMs: the SM90_W8A16_MODEL's least cost where it is the best plan the
# twenty-second session's H200 training sweeps timed for that cell (docs/results/2026-12-04_h200_gemm_sweep_train*.json);
# the two recipe-2 rows are the weight stream's model choosing the best plan of the thirty-seventh session's H100 sweeps
# (docs/results/2026-12-06_h100_gemm_sweep_train*_s37.json), where the H200's had recipe 9.
SM90_W8A16_TABLE = {
    (17, 3072, 1024): (2, 4),     # the weight stream, split 4 (H100: 9.47 us, recipe 9 at split 4 10.05)
    (32, 4096, 7168): (9, 4),
    (64, 1280, 5120): (9, 8),
    (128, 1024, 1024): (2, 4),    # the weight stream (H100: 9.02 us, recipe 9 at split 4 9.60)
    (128, 3072, 1024): (9, 2),
    (192, 1024, 4096): (9, 4),
    (256, 2048, 2048): (9, 2),
    (256, 4096, 4096): (8, 4),
    (4096, 4096, 14336): (8, 1),
    (4096, 6144, 4096): (8, 1),
    # The last wave split (fortieth session, H100 A/B in docs/benchmarks.md): 272 tiles of 256 x 128 are two whole
    # waves and 8 tiles split 7 ways (196.6 us against 260.4 unsplit); 448 tiles, 52 split 2 ways (184.4 / 197.8); 136
    # tiles of 128 x 128, 4 split 7 ways (67.9 us, recipe 11 unsplit 69.7).
    (4096, 2112, 7168): (8, 0),
    (1024, 14336, 4096): (8, 0),
    (1024, 2112, 7168): (7, 0),
}


@pytest.mark.parametrize("case", sorted(SM90_W8A16_TABLE), ids=lambda c: "-".join(map(str, c)))
def test_sm90_w8a16_plan(case):
    m, n, k = case
    assert ops.builtin_plan(m, n, k, "w8a16", 132, sm90=True) == SM90_W8A16_TABLE[case]
    assert ops.builtin_plan(m, n, k, "w8a16", 132)[0] not in ops.SM90_W8A16_RECIPES  # never off an H100 / H200
    assert ops.builtin_plan(m, n, k, "w8a16", 132, sm90=True, layout="nn")[0] not in ops.SM90_W8A16_RECIPES


@pytest.mark.parametrize("case", sorted(SM90_STREAM_TABLE), ids=lambda c: "-".join(map(str, c)))
def test_sm90_stream_plan(case):
    m, n, k, pair = case
    assert ops.builtin_plan(m, n, k, pair, 132, sm90=True) == (ops.SM90_STREAM_RECIPE, SM90_STREAM_TABLE[case])
    # never with batch_invariant (recipe 6 runs M <= 16 only), never off an H100 / H200
    assert ops.builtin_plan(m, n, k, pair, 132, sm90=True, batch_invariant=True)[0] != ops.SM90_STREAM_RECIPE
    assert ops.builtin_plan(m, n, k, pair, 132)[0] != ops.SM90_STREAM_RECIPE


def test_sm90_available_off_a_gpu():
    """No CUDA device here (tier 0): the built-in plan never picks recipes 4-8 through plan_for."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    a, b = torch.zeros(1024, 64, dtype=torch.bfloat16), torch.zeros(64, 64, dtype=torch.bfloat16)
    assert ops.plan_for(a, b, 0, False) == (0, 1)
    assert ops.plan_for(a, torch.zeros(64, 64, dtype=torch.int8), 0, False)[0] not in ops.SM90_W8A16_RECIPES


def test_builtin_plan_rejects():
    with pytest.raises(ValueError, match=r"^builtin_plan: pair must be one of .*got 'w4a16'"):
        ops.builtin_plan(1, 64, 64, "w4a16", 132)
    with pytest.raises(ValueError, match=r"^builtin_plan: num_sms must be >= 1, got 0"):
        ops.builtin_plan(1, 64, 64, "fp8", 0)
    with pytest.raises(ValueError, match=r"^builtin_plan: layout must be one of \('nt', 'nn', 'tn', 'tt'\), got 'ntt'"):
        ops.builtin_plan(1, 64, 64, "fp8", 132, layout="ntt")


def test_num_sms_cached_per_device(monkeypatch):
    calls = []

    class Props:
        multi_processor_count = 132

    def props(index):
        calls.append(index)
        return Props

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    ops._num_sms_cached.cache_clear()
    try:
        assert ops.num_sms(torch.device("cuda", 1)) == 132
        assert ops.num_sms(torch.device("cuda", 1)) == 132
        assert ops.num_sms(torch.device("cuda", 2)) == 132
    finally:
        ops._num_sms_cached.cache_clear()
    assert calls == [1, 2]


def test_device_queries_trace_under_torch_compile(monkeypatch):
    """num_sms and sm90_available are constants to torch.compile (assume_constant_result): fullgraph tracing does
    not enter their caches or the loader's lock (it failed on the H200 before), and the result is baked in."""
    class Props:
        multi_processor_count = 132

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    ops._num_sms_cached.cache_clear()
    ops._sm90_code_cached.cache_clear()
    try:
        def f(x):
            return x + ops.num_sms(torch.device("cuda", 0)) + int(ops.sm90_available(torch.device("cuda", 0)))

        want = f(torch.ones(2))
        assert torch.equal(torch.compile(f, fullgraph=True, backend="eager")(torch.ones(2)), want)
    finally:
        ops._num_sms_cached.cache_clear()
        ops._sm90_code_cached.cache_clear()


def test_plan_for_cpu_is_the_safe_default():
    a, b = torch.zeros(1, 64, dtype=torch.int8), torch.zeros(64, 64, dtype=torch.int8)
    assert ops.plan_for(a, b, ops.LAYOUTS["nt"], False) == (0, 1)


def test_swapped_layouts():
    """"tt" runs as y^T = b a on the "nn" kernel for every pair but w8a16 (no (int8, 16-bit) pair)."""
    for pair in ops.PAIRS:
        for name, code in ops.LAYOUTS.items():
            assert ops.runs_swapped(pair, code) == (name == "tt" and pair != "w8a16")


# (M, N, K) of a swapped "tt" -> its plan on 132 SMs: planned as the "nn" kernel sees it (rows N, columns M: the
# large-M model where N > 64, recipe 3 never); a grid still under one wave with split 1 splits K to fill it
# (capped by 1024 of K per split and 16 splits).
SWAPPED_PLANS = {
    (16, 4096, 4096): (0, 4),      # 32 tiles of 128 x 128 (16 columns used): x4 fills a wave
    (1, 4096, 16384): (0, 8),      # 32 tiles: x8 reaches a wave (256 CTAs)
    (1, 64, 4096): (1, 4),         # N = 64 rows: recipe 1, one tile, split capped at K / 1024
    (4096, 4096, 4096): (0, 1),    # 1024 tiles: no split
    (300, 2048, 1024): (1, 1),     # model: 48 tiles of recipe 0 or 96 of recipe 1, one a SM; K too short to split
}


@pytest.mark.parametrize("case", list(SWAPPED_PLANS), ids=str)
def test_swapped_layout_planned_as_the_kernel_sees_it(case):
    m, n, k = case
    shape = ops.Problem(None, m, n, k, k)
    assert ops.plan_problem(ops.LAYOUTS["tt"], shape, "fp8", 132, False) == SWAPPED_PLANS[case]
    # w8a16's tt is native: planned as nt would be
    assert ops.plan_problem(ops.LAYOUTS["tt"], shape, "w8a16", 132, False) == \
        ops.builtin_plan(m, n, k, "w8a16", 132, layout="tt")


def test_swapped_layout_batch_invariant_split_follows_n_and_k():
    for n, k in ((4096, 4096), (128, 2048), (65536, 4096)):
        plans = {m: ops.plan_problem(ops.LAYOUTS["tt"], ops.Problem(None, m, n, k, k), "fp8", 132, True)
                 for m in (1, 16, 300, 4096)}
        assert len({split for _, split in plans.values()}) == 1, plans
        assert plans[1][1] == ops.builtin_plan(1, n, k, "fp8", 132, batch_invariant=True)[1]
        assert len({recipe for recipe, _ in plans.values()}) == 1  # the recipe follows N too


def test_data():
    assert ops.LAYOUTS == {"nt": 0, "nn": 1, "tn": 2, "tt": 3}
    assert ops.LAYOUT_DIMS == {"nt": ("[M, K]", "[N, K]"), "nn": ("[M, K]", "[K, N]"), "tn": ("[K, M]", "[K, N]"),
                               "tt": ("[K, M]", "[N, K]")}
    assert {r.name: (r.tile_m, r.tile_n) for r in ops.RECIPES.values()} == {
        "m128n128": (128, 128), "m64n128": (64, 128), "m16n64": (16, 64), "m128n64": (128, 64),
        "sm90_m128n128": (128, 128), "sm90_m128n256": (128, 256), "sm90_stream": (16, 64),
        "sm90_w8a16": (128, 128), "sm90_w8a16_wide": (256, 128), "sm90_w8a16_narrow": (64, 128),
        "sm90_m128n192": (128, 192), "sm90_w8a16_m192": (192, 128)}
    assert ops.SM90_RECIPES == (4, 5, 10)
    assert ops.SM90_WIDE_RECIPE == {"w16a16": 5, "w8a8": 5, "fp8": 10}
    assert ops.SM90_W8A16_RECIPES == (7, 8, 9, 11)
    assert ops.pair_of(torch.bfloat16, torch.int8) == "w8a16"
    assert ops.pair_of(torch.float8_e5m2, torch.float8_e4m3fn) == "fp8"
    assert ops.pair_of(torch.float8_e5m2, torch.float8_e5m2) is None
    assert ops.pair_of(torch.int8, torch.bfloat16) is None


# --- the fakes -----------------------------------------------------------------------------------------------

# (layout, a shape, b shape) -> output shape, M = 3, N = 5, K = 7, B = 2.
FAKE_SHAPES = [
    ("nt", (3, 7), (5, 7), (3, 5)), ("nn", (3, 7), (7, 5), (3, 5)),
    ("tn", (7, 3), (7, 5), (3, 5)), ("tt", (7, 3), (5, 7), (3, 5)),
    ("nt", (2, 3, 7), (5, 7), (2, 3, 5)), ("nn", (3, 7), (2, 7, 5), (2, 3, 5)),
    ("tt", (2, 7, 3), (2, 5, 7), (2, 3, 5)), ("nt", (0, 7), (5, 7), (0, 5)),
    ("tn", (2, 7, 3), (7, 5), (2, 3, 5)), ("tn", (7, 0), (7, 5), (0, 5)),
]

_test_lib = None


def _fake_namespace():
    """torch.ops.astrai_gemm_fake: the contract's schemas with the wrapper's fakes and no kernel."""
    global _test_lib
    if _test_lib is None:
        _test_lib = torch.library.Library("astrai_gemm_fake", "DEF")
        for name, schema in CONTRACT_SCHEMAS.items():
            if f"astrai::{name}" not in ops._FAKES:  # quant_gemm_can_implement: no tensors, no fake
                continue
            _test_lib.define(schema)
            torch.library.register_fake(f"astrai_gemm_fake::{name}", lib=_test_lib)(
                ops._FAKES[f"astrai::{name}"])
    return torch.ops.astrai_gemm_fake


def _meta(shape, dtype=torch.int8):
    return torch.empty(shape, dtype=dtype, device="meta")


def _check_fake(namespace, layout, a_shape, b_shape, want):
    for out_dtype in (torch.bfloat16, torch.float32, torch.int32):
        y = namespace.quant_gemm(_meta(a_shape), _meta(b_shape), None, None, None, out_dtype,
                                 ops.LAYOUTS[layout], 0, 1)
        assert y.device.type == "meta" and tuple(y.shape) == want and y.dtype == out_dtype
    out = _meta(want, torch.bfloat16)
    assert namespace.quant_gemm_out(_meta(a_shape), _meta(b_shape), None, None, None, ops.LAYOUTS[layout], 0, 1,
                                    out) is None


@pytest.mark.parametrize("layout,a_shape,b_shape,want", FAKE_SHAPES)
def test_fake_shapes_through_torch_library(layout, a_shape, b_shape, want):
    _check_fake(_fake_namespace(), layout, a_shape, b_shape, want)


def test_fake_under_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    namespace = _fake_namespace()
    with FakeTensorMode():
        a = torch.empty(2, 7, 3, dtype=torch.float8_e4m3fn)
        b = torch.empty(5, 7, dtype=torch.float8_e4m3fn)
        y = namespace.quant_gemm(a, b, None, None, None, torch.float16, ops.LAYOUTS["tt"], 0, 1)
    assert tuple(y.shape) == (2, 3, 5) and y.dtype == torch.float16


@kernels
@pytest.mark.parametrize("name", list(CONTRACT_SCHEMAS))
def test_schema_matches_contract(name):
    assert_schema_matches(ops.load, name, CONTRACT_SCHEMAS)


@kernels
@pytest.mark.parametrize("layout,a_shape,b_shape,want", FAKE_SHAPES)
def test_fake_shapes_of_the_real_ops(layout, a_shape, b_shape, want):
    ops.load()
    _check_fake(torch.ops.astrai, layout, a_shape, b_shape, want)


@kernels
def test_real_op_on_cpu_validates_then_asks_for_cuda():
    ops.load()
    a, b = torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(64, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="astrai.quant_gemm: a must be a CUDA tensor, got cpu"):
        ops.quant_gemm(a, b)


def _bad_calls():
    """(name, a, b, a_scale, b_scale, bias, out_dtype, layout, recipe, split_k, message pattern): one per class of
    bad input the op refuses before launch (CPU tensors: validation runs first, the device check last)."""
    bf, s8, e4 = torch.bfloat16, torch.int8, torch.float8_e4m3fn

    def t(*shape, dtype=bf):
        return torch.zeros(*shape, dtype=dtype)

    one, rows = torch.ones(1), torch.ones(4)
    return [
        ("pair", t(4, 64, dtype=s8), t(8, 64), None, None, None, bf, 0, 0, 1, r"\(a, b\) dtypes must be one of"),
        ("k_mismatch", t(4, 64), t(8, 32), None, None, None, bf, 0, 0, 1, r"b.size\(-1\) must equal K = a.size"),
        ("rank", t(64), t(8, 64), None, None, None, bf, 0, 0, 1, r"a must be 2-D \[M, K\] or 3-D"),
        ("batch", t(2, 4, 64), t(3, 8, 64), None, None, None, bf, 0, 0, 1, r"batch sizes must match or one"),
        ("stride", t(4, 68)[:, :64], t(8, 64), None, None, None, bf, 0, 0, 1, r"a needs strides that are multiples"),
        ("base", t(4, 72)[:, 1:65], t(8, 64), None, None, None, bf, 0, 0, 1, r"a must start at a 16-byte aligned"),
        ("layout_code", t(4, 64), t(8, 64), None, None, None, bf, 4, 0, 1, r"layout must be 0 \(nt\), 1 \(nn\)"),
        # Per layout: K read from the right dim, the contiguous dim, row strides, base pointers, ranks.
        ("nn_k", t(4, 64), t(32, 8), None, None, None, bf, 1, 0, 1,
         r"b.size\(-2\) must equal K = a.size\(-1\) = 64 \(layout nn: a is \[M, K\], b is \[K, N\]\), got 32"),
        ("tn_k", t(64, 8), t(32, 8), None, None, None, bf, 2, 0, 1,
         r"b.size\(-2\) must equal K = a.size\(-2\) = 64 \(layout tn: a is \[K, M\], b is \[K, N\]\)"),
        ("tt_k", t(64, 8), t(8, 32), None, None, None, bf, 3, 0, 1,
         r"b.size\(-1\) must equal K = a.size\(-2\) = 64 \(layout tt: a is \[K, M\], b is \[N, K\]\)"),
        ("tn_rank", t(64), t(64, 8), None, None, None, bf, 2, 0, 1, r"a must be 2-D \[K, M\] or 3-D \[B, K, M\]"),
        ("tn_transposed_view", t(16, 64).t(), t(64, 8), None, None, None, bf, 2, 0, 1,
         r"a must have stride 1 in its last dimension \(layout 'tn' stores a as \[K, M\]\), got strides \[1, 64\]"
         r".*pass a.contiguous\(\)"),
        ("nn_b_transposed_view", t(4, 64), t(8, 64).t(), None, None, None, bf, 1, 0, 1,
         r"b must have stride 1 in its last dimension \(layout 'nn' stores b as \[K, N\]\)"),
        ("nn_b_rows", t(4, 64), t(64, 12), None, None, None, bf, 1, 0, 1,
         r"b needs strides that are multiples of 16 bytes .*got strides \[12, 1\].*pad the last dimension to a "
         r"multiple of 8 elements"),
        ("tt_a_rows_s8", t(64, 20, dtype=s8), t(8, 64, dtype=s8), torch.ones(20), one, None, bf, 3, 0, 1,
         r"a needs strides that are multiples of 16 bytes .*multiple of 16 elements"),
        ("tn_a_batch", t(2100).as_strided((2, 64, 16), (1028, 16, 1)), t(64, 8), None, None, None, bf, 2, 0, 1,
         r"a needs strides that are multiples of 16 bytes .*got strides \[1028, 16, 1\]"),
        ("tt_base", t(64, 24)[:, 1:9], t(8, 64), None, None, None, bf, 3, 0, 1, r"a must start at a 16-byte aligned"),
        ("tn_scale_m", t(64, 16, dtype=e4), t(64, 16, dtype=e4), torch.ones(64), None, None, bf, 2, 0, 1,
         r"a_scale must hold 1 value or 16"),
        ("tn_cpu", t(64, 8), t(64, 8), None, None, None, bf, 2, 0, 1, r"a must be a CUDA tensor, got cpu"),
        ("tt_cpu_view", t(64, 16)[:, :4], t(8, 64), None, None, None, bf, 3, 0, 1, r"a must be a CUDA tensor, got cpu"),
        ("missing_b_scale", t(4, 64), t(8, 64, dtype=s8), None, None, None, bf, 0, 0, 1, r"b_scale is required"),
        ("forbidden_a_scale", t(4, 64), t(8, 64, dtype=s8), one, one, None, bf, 0, 0, 1, r"a_scale must be None"),
        ("w16_scales", t(4, 64), t(8, 64), None, one, None, bf, 0, 0, 1, r"a_scale and b_scale must be None"),
        ("missing_a_scale", t(4, 64, dtype=s8), t(8, 64, dtype=s8), None, one, None, bf, 0, 0, 1,
         r"a_scale is required"),
        ("scale_shape", t(4, 64, dtype=e4), t(8, 64, dtype=e4), torch.ones(3), None, None, bf, 0, 0, 1,
         r"a_scale must hold 1 value or 4"),
        ("scale_dtype", t(4, 64, dtype=e4), t(8, 64, dtype=e4), rows.double(), None, None, bf, 0, 0, 1,
         r"a_scale must be float32, got float64"),
        ("bias_len", t(4, 64), t(8, 64), None, None, torch.zeros(7), bf, 0, 0, 1, r"bias must be 1-D \[N\] with N = 8"),
        ("bias_dtype", t(4, 64), t(8, 64), None, None, torch.zeros(8, dtype=torch.int32), bf, 0, 0, 1,
         r"bias must be bfloat16, float16 or float32"),
        ("int32_scaled", t(4, 64, dtype=s8), t(8, 64, dtype=s8), rows, one, None, torch.int32, 0, 0, 1,
         r"out_dtype int32 returns the raw int32 accumulators"),
        ("out_dtype", t(4, 64), t(8, 64), None, None, None, torch.int32, 0, 0, 1, r"out_dtype must be bfloat16"),
        ("recipe", t(4, 64), t(8, 64), None, None, None, bf, 0, 12, 1, r"recipe must be in \[0, 12\), got 12"),
        ("split_k", t(4, 64), t(8, 64), None, None, None, bf, 0, 0, 0, r"split_k must be in \[1, 64\], got 0"),
        ("cpu", t(4, 64), t(8, 64), None, None, None, bf, 0, 0, 1, r"a must be a CUDA tensor, got cpu"),
    ]


@kernels
@pytest.mark.parametrize("case", _bad_calls(), ids=lambda c: c[0])
def test_op_refuses_bad_input_naming_the_argument(case):
    _, a, b, sa, sb, bias, out_dtype, layout, recipe, split_k, pattern = case
    ops.load()
    with pytest.raises(RuntimeError, match="^astrai.quant_gemm: " + pattern):
        torch.ops.astrai.quant_gemm(a, b, sa, sb, bias, out_dtype, layout, recipe, split_k)


@kernels
def test_out_op_refuses_a_wrong_out():
    ops.load()
    a, b = torch.zeros(4, 64, dtype=torch.bfloat16), torch.zeros(8, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"^astrai.quant_gemm_out: out must have shape \[4, 8\], got \[4, 9\]"):
        torch.ops.astrai.quant_gemm_out(a, b, None, None, None, 0, 0, 1, torch.zeros(4, 9))
    # A view that starts at an odd element: the epilogue's paired stores would be misaligned.
    with pytest.raises(RuntimeError, match=r"^astrai.quant_gemm_out: out must start at an address aligned to 4 bytes"):
        torch.ops.astrai.quant_gemm_out(a, b, None, None, None, 0, 0, 1,
                                        torch.zeros(4, 10, dtype=torch.bfloat16)[:, 1:9])


@pytest.mark.parametrize("pair", ["w16a16", "w8a8", "fp8"])
def test_sm90_few_tiles_above_the_mid_band_may_take_the_weight_stream(pair):
    """M > SM90_MID_MAX_M with recipe 4's tiles under SM90_FEW_TILES of the SMs: the small-band model decides whether
    the weight stream (recipe 6) runs (M = 300, N = K = 960 timed 1.5-1.9x faster on it, H200 holdout4); a call that
    fills the GPU keeps the large-M model's recipes."""
    assert ops.builtin_plan(300, 960, 960, pair, 132, sm90=True) == (6, 1)
    assert ops.builtin_plan(300, 960, 960, pair, 132, sm90=True, batch_invariant=True)[0] == 4
    assert ops.builtin_plan(4096, 4096, 4096, pair, 132, sm90=True)[0] in (4, 5, 10)
    assert ops.builtin_plan(300, 960, 960, pair, 132)[0] not in (4, 5, 6, 7, 8, 9, 10, 11)  # no sm_90a code: portable


@pytest.mark.parametrize("pair,m,n,k", [("w16a16", 100, 4096, 1536), ("fp8", 100, 1536, 2047)])
def test_sm90_mid_band_halves_short_k(pair, m, n, k):
    """16 < M <= 256: recipes 4 / 5 may halve a K of 1024-2047 (halves of >= SM90_SMALL_SPLIT2_MIN_K), which the
    H200 sweeps timed 1.2-1.5x faster than one pass where a call fills under half the SMs; never a quarter of it, nor
    a half below the floor. w8a8's re-tuned model (H100 sweeps, where one pass was 1.1-1.3x faster at K = 1024 and
    M 128-256) keeps one pass there; so, since the forty-second session's re-tune, do w16a16's and fp8's at M 150-256
    (H100 train_small: w16a16 M = 160, N = 3072, K = 1024 took 13.5 us in one pass, 14.6 us halved)."""
    assert ops.builtin_plan(m, n, k, pair, 132, sm90=True) == (4, 2)
    assert ops.builtin_plan(m, n, 768, pair, 132, sm90=True)[1] == 1
    assert ops.builtin_plan(210, 2688, 1344, "w8a8", 132, sm90=True) == (4, 1)


@pytest.mark.parametrize("pair", ["w16a16", "w8a8", "fp8"])
def test_sm90_rows_17_to_256_take_the_hopper_recipes(pair):
    """Past M = 16 (and the weight stream's own bands) a device with sm_90a code plans only Hopper recipes (4, 5 or
    fp8's 10, 6) for these pairs, wide weights at 28 <= M <= 48 included: the portable recipe 1 once planned there
    (from H200 sweeps of older kernels) was 1.02-1.44x slower than the best plan on 9 of the 11 such cells of holdout6
    on an H100."""
    for m, n, k in ((32, 14336, 4096), (32, 4096, 14336), (48, 8192, 8192), (29, 7936, 5120), (42, 18432, 2048),
                    (64, 14336, 4096), (100, 5120, 1040), (256, 4096, 4096)):
        assert ops.builtin_plan(m, n, k, pair, 132, sm90=True)[0] in (4, ops.SM90_WIDE_RECIPE[pair], 6), (m, n, k)
    assert ops.builtin_plan(32, 14336, 4096, pair, 132, sm90=True, batch_invariant=True)[0] == 4
    assert ops.builtin_plan(32, 14336, 4096, pair, 132)[0] == 1  # no sm_90a code: the portable plan


def test_cheapest_plan_option_with_its_own_split_cost():
    """An option whose eighth element is set (w8a16's weight stream: K slices summed inside the CTA) pays no split
    cost; the others pay split_cost * M * N * s / 1e6 for s > 1."""
    base = (2, 1.0, 0.0, 0.0, 1, 1, (1, 4))  # one unit, one CTA a SM: cost = 1.0 * ceil(64 / s)
    plan, cost = ops._cheapest_plan(1000, 1000, 64, 132, [base], 100.0)
    assert plan == (2, 1) and cost == 64  # split 4: 16 + 100 * 1e6 * 4 / 1e6
    plan, cost = ops._cheapest_plan(1000, 1000, 64, 132, [base + ("in-CTA split",)], 100.0)
    assert plan == (2, 4) and cost == 16
    # w8a16's option appears only where the pair has constants, and only up to M = 256 beside recipes 7-9
    assert ops._portable_option(32, 4096, 4096, "w16a16", 132) == []
    (option,) = ops._portable_option(32, 4096, 4096, "w8a16", 132)
    assert option[0] == 2 and option[-1] == "in-CTA split" and set(option[6]) <= set(ops.SM90_SMALL_SPLITS)


def test_w8a16_tail_split_mirrors_the_launcher():
    """tail_split for a w8a16 recipe counts its own tiles (tokens x 128 weight rows) and 128-K tiles as the launcher's
    gemm_sm90_tail_plan does: whole waves, the rest split with no slice empty, split 1 where the split would be short;
    split_k 0 is a valid plan on the w8a16 recipes and refused on the portable ones."""
    assert ops.TAIL_RECIPES == (4, 5, 10, 7, 8, 9, 11)
    assert ops.tail_split(4096, 2112, 7168, "w8a16", 8, 132) == (264, 8, 7)       # 17 x 16 tiles, 56 K tiles
    assert ops.tail_split(1024, 14336, 4096, "w8a16", 8, 132) == (396, 52, 2)     # 112 x 4 tiles
    assert ops.tail_split(1024, 2112, 7168, "w8a16", 8, 132) == (68, 0, 1)        # 132 / 68 < 2: nothing to split
    assert ops.tail_split(4096, 2112, 1024, "w8a16", 8, 132) == (272, 0, 1)       # 8 K tiles: no split of 8+
    a, b = torch.zeros(8, 256, dtype=torch.bfloat16), torch.zeros(64, 256, dtype=torch.int8)
    with pytest.raises(ValueError, match=r"split_k must be an int >= 1, got 0 \(0, the last wave split along K, is "
                                         r"for recipes 4, 5 and 7-11\)"):
        quant_gemm(a, b, b_scale=torch.ones(64), plan=(2, 0), path="torch")


@pytest.mark.parametrize("pair", ["w16a16", "w8a8", "fp8"])
def test_sm90_split_stream_priced_at_the_cluster_fit(pair, monkeypatch):
    """A split weight stream (recipe 6, its K slices one cluster) is priced at SM90_STREAM_CLUSTER_FIT_CTAS a SM, an
    unsplit one at SM90_STREAM_FIT_CTAS: at M = 56, N = 1536, K = 6144 (H100 train_mid: split 4's 384 CTAs took
    28.6 us, recipe 4 split 4 19.3 us) the chain leaves split 4; priced at the unsplit fit it would take it."""
    def plan(fit):
        monkeypatch.setattr(ops, "SM90_STREAM_CLUSTER_FIT_CTAS", fit)
        ops._sm90_small_plan.cache_clear()
        return ops.builtin_plan(56, 1536, 6144, pair, 132, sm90=True)

    try:
        assert plan(ops.SM90_STREAM_FIT_CTAS) == (6, 4)
        assert plan(2) != (6, 4)
    finally:
        ops._sm90_small_plan.cache_clear()
