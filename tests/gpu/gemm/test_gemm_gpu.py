"""Tier 1 (GPU): quant_gemm's portable mainloop against the float64 reference, every pair and recipe, awkward
shapes, split-K, scales and bias, batch broadcast; exact cases (int8 x int8, and w8a16 / w16a16 on small integers,
where every product and sum is exact in the accumulator); poisoned outputs; determinism and CUDA-graph replay
bitwise, with negative controls; batch invariance of the batch_invariant plan; fp8 refused where the image has no
fp8 mma (the PTX-80 image); opcheck. Layouts nn / tn / tt: every pair on awkward shapes and plans (operands as
padded views where a row would not be 16-byte aligned), batch and broadcast, int32 exactness, poisoned outputs,
determinism and batch invariance.

Runs under whatever image the loader picks; ASTRAI_IMAGE=ptx80 / ptx89 runs the sm_80 / sm_89 code paths here.
"""

from __future__ import annotations

import pytest
import torch
from reference.gemm import quant_gemm as reference
from support.bitwise import assert_bitwise_equal, assert_detects_perturbation

import astrai.extension as ae
from astrai.extension import loader
from astrai.extension.ops import gemm as ops
from astrai.extension.ops import gemm_plan

pytestmark = [pytest.mark.gpu, pytest.mark.requires_cuda_kernels("gemm")]

DEVICE = "cuda"
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2
PAIRS = [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16), (torch.bfloat16, torch.int8),
         (torch.float16, torch.int8), (torch.int8, torch.int8), (E4, E4), (E5, E4), (E4, E5)]
PAIR_IDS = ["bf16", "f16", "bf16-s8", "f16-s8", "s8", "e4m3", "e5m2-e4m3", "e4m3-e5m2"]
# The sm_90a fp8 wgmma's in-stage sums (~14 bits, 4 steps a stage of 128 products) relative to the largest output.
FP8_WGMMA_BOUND = 4 * 2.0**-13
SHAPES = [(1, 64, 16), (7, 130, 1008), (129, 257, 512), (1000, 300, 272)]  # (M, N, K): K rows 16-byte aligned


def fp8_blocked() -> str | None:
    """Why fp8 cannot run under this image (None when it can): the PTX-80 image has no fp8 mma."""
    image = (loader.describe().get("chosen") or {}).get("image") or ""
    cap = torch.cuda.get_device_capability()
    if cap < (8, 9):
        return "GPU below sm_89"
    return "image ptx80" if image == "ptx80" else None


def operand(dtype: torch.dtype, shape, *, small: bool = False) -> torch.Tensor:
    """Fresh random values; small: integers in [-8, 8) (exact products and sums in every accumulator)."""
    if small:
        return torch.randint(-8, 8, shape, device=DEVICE).to(dtype)
    if dtype == torch.int8:
        return torch.randint(-128, 128, shape, device=DEVICE, dtype=torch.int8)
    if dtype in (E4, E5):
        return (torch.randn(shape, device=DEVICE) * 2).to(dtype)
    return torch.randn(shape, device=DEVICE, dtype=dtype)


def scales_for(ta, tb, m, n):
    """The scales each pair takes (int8 sides required, fp8 optional: given here), per row / per channel."""
    sa = torch.rand(m, device=DEVICE) + 0.5 if ta in (torch.int8, E4, E5) else None
    sb = torch.rand(n, device=DEVICE) + 0.5 if tb in (torch.int8, E4, E5) else None
    return sa, sb


def skip_if_blocked(ta):
    if ta in (E4, E5) and fp8_blocked():
        pytest.skip(f"fp8: {fp8_blocked()} (test_fp8_refused covers the message)")


def skip_if_no_recipe(recipe, ta, tb):
    """Recipes 4, 5 and 10 (the sm_90a mainloop) run every pair but w8a16 on an sm_90 GPU with sm_90a code in the
    image (recipe 5 not fp8), recipe 6 (the sm_90a weight stream) every pair there, recipes 7-9
    and 11 w8a16 only (test_sm90_recipes_refused and test_sm90_w8a16_refused cover the messages)."""
    if recipe == ops.SM90_STREAM_RECIPE and not ops.sm90_available(torch.device(DEVICE)):
        pytest.skip("recipe 6 needs an sm_90 GPU and sm_90a code in the image")
    if recipe in ops.SM90_W8A16_RECIPES:
        if not ops.sm90_available(torch.device(DEVICE)):
            pytest.skip("recipes 7-9 and 11 need an sm_90 GPU and sm_90a code in the image")
        if not (tb == torch.int8 and ta in (torch.bfloat16, torch.float16)):
            pytest.skip("recipes 7-9 and 11 run w8a16 only")
    if recipe in ops.SM90_RECIPES:
        if not ops.sm90_available(torch.device(DEVICE)):
            pytest.skip("recipes 4 and 5 need an sm_90 GPU and sm_90a code in the image")
        if tb == torch.int8 and ta != torch.int8:
            pytest.skip("recipes 4 and 5 have no w8a16 kernel")
        if recipe == 5 and ta in (E4, E5):
            pytest.skip("recipe 5 has no fp8 kernel")


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / (want.abs().max() + 1e-30)).item()


@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("recipe", sorted(ops.RECIPES))
@pytest.mark.parametrize("split_k", [1, 3])
def test_matches_float64(pair, shape, recipe, split_k):
    ta, tb = pair
    skip_if_blocked(ta)
    skip_if_no_recipe(recipe, ta, tb)
    m, n, k = shape
    a, b = operand(ta, (m, k)), operand(tb, (n, k))
    sa, sb = scales_for(ta, tb, m, n)
    bias = torch.randn(n, device=DEVICE) if split_k == 3 else None
    y = ops.quant_gemm(a, b, a_scale=sa, b_scale=sb, bias=bias, out_dtype=torch.float32, plan=(recipe, split_k))
    want = reference(a, b, a_scale=sa, b_scale=sb, bias=bias)
    # fp32 accumulation over K of exact products: a few ulp of fp32 relative to the largest output; the sm_90a fp8
    # wgmma sums each stage's 128 products at ~14 bits before the fp32 accumulators (test_sm90_fp8_error_vs_scaled_mm)
    bound = FP8_WGMMA_BOUND if ta in (E4, E5) and recipe in ops.SM90_RECIPES else 1e-5
    assert torch.isfinite(y).all() and rel_error(y, want) < bound, rel_error(y, want)


@pytest.mark.parametrize("pair", PAIRS[:5], ids=PAIR_IDS[:5])
@pytest.mark.parametrize("split_k", [1, 4])
def test_exact_on_small_integers(pair, split_k):
    ta, tb = pair
    m, n, k = 37, 72, 784
    a, b = operand(ta, (m, k), small=True), operand(tb, (n, k), small=True)
    ones_a = torch.ones(m, device=DEVICE) if ta == torch.int8 else None
    ones_b = torch.ones(n, device=DEVICE) if tb == torch.int8 else None
    y = ops.quant_gemm(a, b, a_scale=ones_a, b_scale=ones_b, out_dtype=torch.float32, plan=(2, split_k))
    assert torch.equal(y.double(), reference(a, b))


# w8a16 recipe 2 in "nt" is the weight-stream kernel: split_k slices are the warps of one CTA up to 24 (summed in
# order inside it), more add CTAs along K and a reduction; the launcher packs groups of 16 weight rows a CTA.
STREAM_CASES = [(1, 117, 400, 5), (9, 200, 5136, 19), (16, 77, 3888, 24), (16, 77, 3888, 30), (17, 333, 7696, 53),
                (5, 4099, 256, 1), (1, 64, 2048, 64)]


@pytest.mark.parametrize("case", STREAM_CASES, ids=lambda c: "M{}-N{}-K{}-s{}".format(*c))
@pytest.mark.parametrize("ta", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
def test_stream_kernel_splits(case, ta):
    m, n, k, split = case
    a, b = operand(ta, (m, k), small=True), operand(torch.int8, (n, k), small=True)
    ones = torch.ones(n, device=DEVICE)
    out = torch.full((m, n), float("nan"), device=DEVICE)
    ops.quant_gemm(a, b, b_scale=ones, out_dtype=torch.float32, plan=(2, split), out=out)
    assert torch.equal(out.double(), reference(a, b))  # exact: small integers, every poisoned element written
    a, b = operand(ta, (m, k)), operand(torch.int8, (n, k))
    sb, bias = torch.rand(n, device=DEVICE) + 0.5, torch.randn(n, device=DEVICE)
    y = ops.quant_gemm(a, b, b_scale=sb, bias=bias, out_dtype=torch.float32, plan=(2, split))
    assert rel_error(y, reference(a, b, b_scale=sb, bias=bias)) < 1e-5
    again = ops.quant_gemm(a, b, b_scale=sb, bias=bias, out_dtype=torch.float32, plan=(2, split))
    assert_bitwise_equal(again, y)
    # the split (not M, not the launcher's packing of rows) sets a row's bits: row 0 alone gives the same
    alone = ops.quant_gemm(a[:1], b, b_scale=sb, bias=bias, out_dtype=torch.float32, plan=(2, split))
    assert_bitwise_equal(alone, y[:1])


@pytest.mark.parametrize("split_k", [1, 5])
def test_int8_raw_int32_exact(split_k):
    a, b = operand(torch.int8, (33, 784)), operand(torch.int8, (45, 784))
    y = ops.quant_gemm(a, b, out_dtype=torch.int32, plan=(1, split_k))
    assert y.dtype == torch.int32
    assert torch.equal(y.cpu().long(), a.cpu().long() @ b.cpu().long().T)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("bias_dtype", [None, torch.bfloat16, torch.float16, torch.float32])
def test_out_and_bias_dtypes(out_dtype, bias_dtype):
    m, n, k = 50, 96, 256
    a, b = operand(torch.bfloat16, (m, k)), operand(torch.int8, (n, k))
    sb = torch.rand(n, device=DEVICE) + 0.5
    bias = None if bias_dtype is None else torch.randn(n, device=DEVICE).to(bias_dtype)
    y = ops.quant_gemm(a, b, b_scale=sb, bias=bias, out_dtype=out_dtype)
    want = reference(a, b, b_scale=sb, bias=bias)
    assert y.dtype == out_dtype
    # One rounding to the output type (half its ulp), plus the fp32 accumulation's own error over K.
    assert rel_error(y, want) <= torch.finfo(out_dtype).eps / 2 + 1e-6


@pytest.mark.parametrize("broadcast", ["a2d", "b2d", "both3d"])
def test_batch_and_broadcast(broadcast):
    B, m, n, k = 3, 40, 96, 128
    a = operand(torch.bfloat16, (m, k) if broadcast == "a2d" else (B, m, k))
    b = operand(torch.bfloat16, (n, k) if broadcast == "b2d" else (B, n, k))
    y = ops.quant_gemm(a, b, out_dtype=torch.float32, plan=(1, 2))
    want = reference(a.expand(B, m, k), b.expand(B, n, k))
    assert y.shape == (B, m, n) and rel_error(y, want) < 1e-5


def test_out_overwrites_every_element():
    m, n, k = 129, 200, 272
    a, b = operand(torch.bfloat16, (m, k)), operand(torch.bfloat16, (n, k))
    out = torch.full((m, n), float("nan"), device=DEVICE)
    ops.quant_gemm(a, b, out=out, plan=(0, 3))
    assert torch.isfinite(out).all() and rel_error(out, reference(a, b)) < 1e-5


def test_k_zero_and_empty():
    a, b = operand(torch.bfloat16, (5, 0)), operand(torch.bfloat16, (7, 0))
    bias = torch.randn(7, device=DEVICE)
    assert torch.equal(ops.quant_gemm(a, b, bias=bias, out_dtype=torch.float32), bias.expand(5, 7))
    assert torch.equal(ops.quant_gemm(a, b, out_dtype=torch.float32), torch.zeros(5, 7, device=DEVICE))
    empty = ops.quant_gemm(operand(torch.bfloat16, (0, 64)), operand(torch.bfloat16, (7, 64)))
    assert empty.shape == (0, 7)


def test_repeatable_and_graph_replay_bitwise():
    m, n, k = 16, 4096, 4096
    a, b = operand(torch.bfloat16, (m, k)), operand(torch.int8, (n, k))
    sb = torch.rand(n, device=DEVICE) + 0.5
    first = ops.quant_gemm(a, b, b_scale=sb, plan=(2, 8))
    assert_detects_perturbation(first)
    assert_bitwise_equal(ops.quant_gemm(a, b, b_scale=sb, plan=(2, 8)), first, "repeat")
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(stream):
        ops.quant_gemm(a, b, b_scale=sb, plan=(2, 8))
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured = ops.quant_gemm(a, b, b_scale=sb, plan=(2, 8))
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(captured, first, "graph replay")


@pytest.mark.parametrize("pair", PAIRS[:5], ids=PAIR_IDS[:5])
def test_batch_invariant_plan(pair):
    """Row i of an M-row call equals the call on row i alone, bitwise, with batch_invariant=True: the split
    depends on (N, K) only, and every recipe walks K in the same order."""
    ta, tb = pair
    n, k = 512, 4096
    a, b = operand(ta, (1000, k)), operand(tb, (n, k))
    sa, sb = scales_for(ta, tb, 1000, n)
    full = ops.quant_gemm(a, b, a_scale=sa, b_scale=sb, batch_invariant=True)
    for i in (0, 17, 999):
        row = ops.quant_gemm(a[i:i + 1], b, a_scale=None if sa is None else sa[i:i + 1], b_scale=sb,
                             batch_invariant=True)
        assert_bitwise_equal(row, full[i:i + 1], f"row {i}")


@pytest.mark.parametrize("where", ["b_scale", "bias", "out"])
def test_operands_on_two_devices_refused(where):
    """An argument off a's GPU is refused before launch, naming it: by the public function (ValueError) and by the op
    itself (RuntimeError), with a CPU tensor and, where the machine has two GPUs, a tensor on the other one."""
    m, n, k = 8, 64, 128
    a, b = operand(torch.bfloat16, (m, k)), operand(torch.int8, (n, k))
    others = ["cpu"] + (["cuda:1"] if torch.cuda.device_count() > 1 else [])
    for other in others:
        kw = {"b_scale": torch.ones(n, device=DEVICE), "bias": None, "out": None}
        kw[where] = (torch.ones(n, device=other) if where != "out"
                     else torch.empty(m, n, device=other, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match=rf"^quant_gemm: {where} must be on a's device cuda:0, got {other}"):
            ae.quant_gemm(a, b, **kw)
        sb, bias, out = kw["b_scale"], kw["bias"], kw["out"]
        with pytest.raises(RuntimeError, match=rf"astrai\.quant_gemm(_out)?: {where} must be on the same device as a "
                                               rf"\(cuda:0\), got {other}"):
            if out is None:
                torch.ops.astrai.quant_gemm(a, b, None, sb, bias, torch.bfloat16, 0, 0, 1)
            else:
                torch.ops.astrai.quant_gemm_out(a, b, None, sb, bias, 0, 0, 1, out)


def test_fp8_refused():
    if not fp8_blocked():
        pytest.skip("fp8 runs under this image (test_matches_float64 covers it)")
    a, b = operand(E4, (16, 64)), operand(E4, (16, 64))
    with pytest.raises(RuntimeError, match="astrai.quant_gemm: .*fp8"):
        ops.quant_gemm(a, b)


def test_fp8_auto_path_falls_back_where_the_image_has_no_fp8_code():
    """The policy knows what the op would refuse: under an image without fp8 mma code, path="auto" takes the
    torch path (with the reason) instead of raising, and path="cuda" raises the reason."""
    if not fp8_blocked():
        pytest.skip("fp8 runs under this image (test_matches_float64 covers it)")
    from astrai.extension.backend import gemm as backend
    a, b = operand(E4, (32, 64)), operand(E4, (48, 64))
    assert "no fp8 mma code" in backend.cuda_blocker(a, b)
    got = ae.quant_gemm(a, b)
    want = ae.quant_gemm(a, b, path="torch")
    assert_bitwise_equal(got, want, "auto = torch path")
    with pytest.raises((ValueError, RuntimeError), match="fp8"):
        ae.quant_gemm(a, b, path="cuda")


# --- the Hopper mainloop (recipes 4, 5 and 10) ----------------------------------------------------------------

SM90_PAIRS = [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16), (torch.int8, torch.int8), (E4, E4),
              (E5, E4), (E4, E5)]
SM90_PAIR_IDS = ["bf16", "f16", "s8", "e4m3", "e5m2-e4m3", "e4m3-e5m2"]


def skip_without_sm90():
    if not ops.sm90_available(torch.device(DEVICE)):
        pytest.skip("recipes 4 and 5 need an sm_90 GPU and sm_90a code in the image (test_sm90_recipes_refused)")


@pytest.mark.parametrize("pair", SM90_PAIRS, ids=SM90_PAIR_IDS)
@pytest.mark.parametrize("plan", [(4, 1), (4, 3), (5, 1), (5, 2), (10, 1), (10, 3)], ids=lambda p: f"r{p[0]}s{p[1]}")
def test_sm90_persistent_units_batch_broadcast(pair, plan):
    """More work units than SMs (each CTA walks several, its TMA ring running across them), batch 3 with b
    broadcast, split-K, per-row and per-channel scales, bias, a poisoned output."""
    ta, tb = pair
    skip_if_no_recipe(plan[0], ta, tb)
    B, m, n, k = 3, 700, 1100, 1040 if ta in (torch.bfloat16, torch.float16) else 1056
    a, b = operand(ta, (B, m, k)), operand(tb, (n, k))
    sa, sb = scales_for(ta, tb, m, n)
    bias = torch.randn(n, device=DEVICE)
    out = torch.full((B, m, n), float("nan"), device=DEVICE)
    ops.quant_gemm(a, b, a_scale=sa, b_scale=sb, bias=bias, out=out, plan=plan)
    want = reference(a, b, a_scale=sa, b_scale=sb, bias=bias)
    bound = FP8_WGMMA_BOUND if ta in (E4, E5) else 1e-5
    assert torch.isfinite(out).all() and rel_error(out, want) < bound, rel_error(out, want)


@pytest.mark.parametrize("plan", [(4, 1), (5, 1)], ids=lambda p: f"r{p[0]}s{p[1]}")
@pytest.mark.parametrize("pair, out_dtype", [((torch.bfloat16, torch.bfloat16), torch.bfloat16),
                                             ((torch.bfloat16, torch.bfloat16), torch.float32),
                                             ((torch.int8, torch.int8), torch.int32)], ids=["bf16", "bf16-f32", "s32"])
def test_sm90_out_keeps_the_bytes_past_a_row(plan, pair, out_dtype):
    """TMA stores whole 16-byte chunks: an output row that ends off a 16-byte boundary must not have the bytes after
    it written, neither past the tensor (M = 1, the output the first N elements of a poisoned buffer) nor into the
    padding columns of a view whose rows are 16-byte aligned (out = buf[:, :N], N off 8). Found by quant_gemm_test's
    guard on an H100 (thirty-third session); the launcher keeps such outputs off the TMA store."""
    skip_without_sm90()
    ta, tb = pair
    n, pad, k = 133, 3, 272
    for m in (1, 129):
        a, b = operand(ta, (m, k)), operand(tb, (n, k))
        buf = torch.empty((m, n + pad) if m > 1 else (n + 64,), device=DEVICE, dtype=out_dtype)
        buf.view(torch.uint8).fill_(0xFF if out_dtype != torch.int32 else 0x80)
        poison = buf.clone()
        out = buf[:, :n] if m > 1 else buf[:n].view(1, n)
        ops.quant_gemm(a, b, out=out, plan=plan)
        rest = buf[:, n:] if m > 1 else buf[n:]
        kept = poison[:, n:] if m > 1 else poison[n:]
        assert torch.equal(rest.view(torch.uint8), kept.view(torch.uint8)), f"M = {m}: bytes past a row written"
        if out_dtype == torch.int32:
            assert torch.equal(out.cpu().long(), reference(a.cpu(), b.cpu()).long()), f"M = {m}"
        else:
            assert rel_error(out, reference(a, b)) < (1e-5 if out_dtype == torch.float32 else 1e-2), f"M = {m}"


@pytest.mark.parametrize("plan", [(4, 1), (5, 4), (4, 16)], ids=lambda p: f"r{p[0]}s{p[1]}")
def test_sm90_int8_exact_and_repeatable(plan):
    """int8 x int8 -> int32 exact against the integer reference (split 16 of 8 K tiles: empty slices add zeros);
    repeated calls and a CUDA-graph replay bitwise equal; the poison control detects a one-element change."""
    skip_without_sm90()
    m, n, k = 257, 520, 912
    a, b = operand(torch.int8, (m, k)), operand(torch.int8, (n, k))
    y = ops.quant_gemm(a, b, out_dtype=torch.int32, plan=plan)
    assert torch.equal(y.cpu().long(), reference(a.cpu(), b.cpu()).long())
    assert_detects_perturbation(y)
    assert_bitwise_equal(ops.quant_gemm(a, b, out_dtype=torch.int32, plan=plan), y, "repeat")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        ops.quant_gemm(a, b, out_dtype=torch.int32, plan=plan)
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured = ops.quant_gemm(a, b, out_dtype=torch.int32, plan=plan)
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(captured, y, "graph replay")


@pytest.mark.parametrize("recipe", [4, 10])
@pytest.mark.parametrize("pair", [(E4, E4), (E5, E4)], ids=["e4m3", "e5m2-e4m3"])
def test_sm90_fp8_error_vs_scaled_mm(pair, recipe):
    """fp8 at K = 16384 on recipes 4 and 10 (each stage's wgmma sum promoted to fp32 registers): error against
    float64 no worse than 2x torch._scaled_mm's on the same operands (unit scales, fp32 out)."""
    skip_without_sm90()
    ta, tb = pair
    m, n, k = 256, 576, 16384
    a, b = operand(ta, (m, k)), operand(tb, (n, k))
    want = reference(a, b)
    ours = rel_error(ops.quant_gemm(a, b, out_dtype=torch.float32, plan=(recipe, 1)), want)
    one = torch.ones((), device=DEVICE)
    theirs = rel_error(torch._scaled_mm(a, b.t(), one, one, out_dtype=torch.float32), want)
    assert ours <= 2 * theirs + 1e-7, (ours, theirs)


# (B, M, N, K) for the last wave split (split_k 0): every tile split (fewer tiles than SMs, b broadcast); whole waves
# then a split tail (B = 68 x 2 tiles = 136 on 132 SMs, both tile widths), N off the tile; M = 1000 x N = 2112 (the
# grid's tail shape: 136 tiles of recipe 4; recipe 5's 72 tiles leave nothing to split: every tile whole).
TAIL_CASES = [(2, 129, 389, 2608), (68, 65, 257, 2064), (1, 1000, 2112, 2048)]


@pytest.mark.parametrize("pair", SM90_PAIRS, ids=SM90_PAIR_IDS)
@pytest.mark.parametrize("recipe", ops.SM90_RECIPES)
@pytest.mark.parametrize("case", TAIL_CASES, ids=lambda c: "B{}-M{}-N{}-K{}".format(*c))
def test_sm90_tail_split_matches_float64(pair, recipe, case):
    """split_k 0 against float64 with per-row and per-channel scales, bias and a poisoned output; K slices of the
    tail tiles summed in order: repeatable bitwise, and for int8 the same int32 as the unsplit plan (exact sums)."""
    ta, tb = pair
    skip_if_no_recipe(recipe, ta, tb)
    B, m, n, k = case
    a, b = operand(ta, (B, m, k) if B > 1 else (m, k)), operand(tb, (n, k))
    sa, sb = scales_for(ta, tb, m, n)
    bias = torch.randn(n, device=DEVICE)
    out = torch.full((B, m, n) if B > 1 else (m, n), float("nan"), device=DEVICE)
    ops.quant_gemm(a, b, a_scale=sa, b_scale=sb, bias=bias, out=out, plan=(recipe, ops.TAIL_SPLIT))
    want = reference(a, b, a_scale=sa, b_scale=sb, bias=bias)
    bound = FP8_WGMMA_BOUND if ta in (E4, E5) else 1e-5
    assert torch.isfinite(out).all() and rel_error(out, want) < bound, rel_error(out, want)
    again = torch.full_like(out, float("nan"))
    ops.quant_gemm(a, b, a_scale=sa, b_scale=sb, bias=bias, out=again, plan=(recipe, ops.TAIL_SPLIT))
    assert_bitwise_equal(again, out, "repeat")
    if ta == torch.int8:
        raw = ops.quant_gemm(a, b, out_dtype=torch.int32, plan=(recipe, ops.TAIL_SPLIT))
        assert_bitwise_equal(raw, ops.quant_gemm(a, b, out_dtype=torch.int32, plan=(recipe, 1)), "int32 vs unsplit")


# (B, M, N, K) for w8a16's last wave split: every tile split over a batch (a batched, b broadcast; b batched, a
# broadcast), then whole waves and a split tail (recipe 8: 140 tiles of 256 x 128 on 132 SMs; recipe 11's 210 leave
# too few SMs to split its tail: every tile whole).
W8A16_TAIL_CASES = [(2, 129, 389, 2608), (3, 300, 1100, 2064), (1, 1000, 4400, 2064)]


@pytest.mark.parametrize("recipe", ops.SM90_W8A16_RECIPES)
@pytest.mark.parametrize("ta", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("case", W8A16_TAIL_CASES, ids=lambda c: "B{}-M{}-N{}-K{}".format(*c))
def test_sm90_w8a16_tail_split(recipe, ta, case):
    """w8a16's split_k 0 (the tail tiles' K slices summed in order by the mainloop's tail reduction) into a poisoned
    fp32 output against float64 with per-channel scales and bias, repeatable bitwise; with small
    integers the same bits as the unsplit plan (exact fp32 sums in any order)."""
    skip_if_no_recipe(recipe, ta, torch.int8)
    B, m, n, k = case
    a = operand(ta, (B, m, k) if B == 2 else (m, k))  # B = 3: a broadcast
    b = operand(torch.int8, (B, n, k) if B == 3 else (n, k))  # B = 2: b broadcast
    sb, bias = torch.rand(n, device=DEVICE) + 0.5, torch.randn(n, device=DEVICE)
    out = torch.full((B, m, n) if B > 1 else (m, n), float("nan"), device=DEVICE)
    ops.quant_gemm(a, b, b_scale=sb, bias=bias, out=out, plan=(recipe, ops.TAIL_SPLIT))
    want = reference(a, b, b_scale=sb, bias=bias)
    assert torch.isfinite(out).all() and rel_error(out, want) < 1e-5, rel_error(out, want)
    again = torch.full_like(out, float("nan"))
    ops.quant_gemm(a, b, b_scale=sb, bias=bias, out=again, plan=(recipe, ops.TAIL_SPLIT))
    assert_bitwise_equal(again, out, "repeat")
    a, b = operand(ta, a.shape, small=True), operand(torch.int8, b.shape, small=True)
    ones = torch.ones(n, device=DEVICE)
    tail = ops.quant_gemm(a, b, b_scale=ones, out_dtype=torch.float32, plan=(recipe, ops.TAIL_SPLIT))
    assert_bitwise_equal(tail, ops.quant_gemm(a, b, b_scale=ones, out_dtype=torch.float32, plan=(recipe, 1)),
                         "small integers vs unsplit")
    assert torch.equal(tail.double(), reference(a, b, b_scale=ones))


def test_sm90_tail_split_graph_and_refusals():
    """The last wave split under CUDA-graph capture (its workspace from the caching allocator) replays bitwise;
    split_k 0 off recipes 4, 5 and 7-11 is refused before launch, naming the op and the reason."""
    skip_without_sm90()
    a, b = operand(torch.bfloat16, (1000, 2048)), operand(torch.bfloat16, (2112, 2048))
    y = ops.quant_gemm(a, b, plan=(4, ops.TAIL_SPLIT))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        ops.quant_gemm(a, b, plan=(4, ops.TAIL_SPLIT))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = ops.quant_gemm(a, b, plan=(4, ops.TAIL_SPLIT))
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(captured, y, "graph replay")
    with pytest.raises(RuntimeError, match=r"astrai.quant_gemm: split_k must be in \[1, 64\], got 0 \(0, the last "
                                           r"wave split along K, is for recipes 4, 5 and 7-11\)"):
        torch.ops.astrai.quant_gemm(a, b, None, None, None, torch.bfloat16, 0, 0, 0)
    with pytest.raises(RuntimeError, match=r"astrai.quant_gemm: split_k must be 0 \(the last wave split along K\) "
                                           r"or in \[1, 64\], got -1"):
        torch.ops.astrai.quant_gemm(a, b, None, None, None, torch.bfloat16, 0, 4, -1)


def test_sm90_builtin_plan_used():
    """On an H100 / H200 with sm_90a code the built-in plan of a large nt call is a Hopper recipe, and
    ASTRAI_GEMM_PORTABLE is the documented way back (read once per process: checked through plan_problem)."""
    skip_without_sm90()
    a, b = operand(torch.bfloat16, (1024, 4096)), operand(torch.bfloat16, (4096, 4096))
    recipe, _ = ops.plan_for(a, b, 0, False)
    assert recipe in ops.SM90_RECIPES
    portable = ops.plan_problem(0, ops.problem(0, a.shape, b.shape), "w16a16", ops.num_sms(a.device), False)
    assert portable[0] not in ops.SM90_RECIPES


@pytest.mark.parametrize("pair", [(torch.bfloat16, torch.bfloat16), (torch.int8, torch.int8)], ids=["bf16", "s8"])
def test_torch_compile_fullgraph_matches_eager(pair):
    """The op under torch.compile(fullgraph=True), built-in plan included (M = 300: a Hopper recipe on an H100 /
    H200 with sm_90a code, the portable mainloop elsewhere): the same bits as eager."""
    ta, tb = pair
    a, b = operand(ta, (300, 512)), operand(tb, (260, 512))
    out = torch.int32 if ta == torch.int8 else torch.bfloat16

    def f(x, w):
        return ops.quant_gemm(x, w, out_dtype=out)

    assert_bitwise_equal(torch.compile(f, fullgraph=True)(a, b), f(a, b), "compiled vs eager")


def test_torch_compile_dynamic_sizes_plan_per_call():
    """dynamic=True: M, N and K are symbolic, so the plan is chosen when the compiled code runs (per call, by the
    chain): M = 1, 300 and 2049 take different recipes and each equals eager bitwise; `out=` too."""
    b = operand(torch.bfloat16, (520, 1024))
    compiled = torch.compile(lambda x, w: ops.quant_gemm(x, w), dynamic=True, fullgraph=True)
    compiled_out = torch.compile(lambda x, w, y: ops.quant_gemm(x, w, out=y), dynamic=True, fullgraph=True)
    for m in (1, 300, 2049):
        a = operand(torch.bfloat16, (m, 1024))
        want = ops.quant_gemm(a, b)
        assert_bitwise_equal(compiled(a, b), want, f"compiled (dynamic) vs eager, M = {m}")
        y = torch.full_like(want, float("nan"))
        compiled_out(a, b, y)
        assert_bitwise_equal(y, want, f"compiled out= (dynamic) vs eager, M = {m}")
    a = operand(torch.bfloat16, (33, 1024))
    torch.library.opcheck(torch.ops.astrai.quant_gemm_planned.default, (a, b, None, None, None, torch.bfloat16, 0, False))
    torch.library.opcheck(torch.ops.astrai.quant_gemm_planned_out.default,
                          (a, b, None, None, None, 0, False, torch.empty(33, 520, device=DEVICE, dtype=torch.bfloat16)))


def test_sm90_recipes_refused():
    """Recipes 4 and 5 raise before launch, naming the op and the reason: off an sm_90 GPU or without sm_90a code
    (the PTX images), for w8a16, in a layout other than nt."""
    a16, b16 = operand(torch.bfloat16, (16, 64)), operand(torch.bfloat16, (32, 64))
    if not ops.sm90_available(torch.device(DEVICE)):
        with pytest.raises(RuntimeError, match="astrai.quant_gemm: .*recipes 4 and 5"):
            ops.quant_gemm(a16, b16, plan=(4, 1))
        return
    b8, sb = operand(torch.int8, (32, 64)), torch.rand(32, device=DEVICE) + 0.5
    with pytest.raises(RuntimeError, match="astrai.quant_gemm: .*no w8a16 kernel"):
        ops.quant_gemm(a16, b8, b_scale=sb, plan=(5, 1))
    with pytest.raises(RuntimeError, match="astrai.quant_gemm: .*layout nt only"):
        ops.quant_gemm(a16, b16.t().contiguous(), layout="nn", plan=(4, 1))
    with pytest.raises(RuntimeError, match="astrai.quant_gemm: .*recipe 5 .*no fp8 kernel"):
        ops.quant_gemm(a16.to(E4), b16.to(E4), plan=(5, 1))
    with pytest.raises(RuntimeError, match="astrai.quant_gemm: recipe 10 .*no w8a16 kernel"):
        ops.quant_gemm(a16, b8, b_scale=sb, plan=(10, 1))


# (M, N, K): recipe 10's 192-column tiles with a 16-bit output end on half a staged chunk (64 columns): N a multiple of
# 192, N ending inside the last tile's first or second 128 columns, N odd (the threads' copy-out: no TMA store), M off
# the 128-row tile, K off the 128-byte K tile.
WIDE_FP8_CASES = [(256, 384, 512), (130, 1000, 1040), (129, 900, 272), (77, 1001, 656), (300, 200, 4096)]


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32], ids=["bf16", "f16", "f32"])
@pytest.mark.parametrize("case", WIDE_FP8_CASES, ids=lambda c: "M{}-N{}-K{}".format(*c))
def test_sm90_fp8_wide_tile_epilogue(case, out_dtype):
    """Recipe 10 (128 x 192, fp8) in every output type with per-row and per-channel scales and bias into a poisoned
    output: against float64, and bitwise equal to recipe 4 (each stage's 128 products of K summed alone, then added
    in stage order, whatever the tile's width)."""
    skip_without_sm90()
    m, n, k = case
    a, b = operand(E4, (m, k)), operand(E4, (n, k))
    sa, sb = scales_for(E4, E4, m, n)
    bias = torch.randn(n, device=DEVICE)
    out = torch.full((m, n), float("nan"), device=DEVICE, dtype=out_dtype)
    ops.quant_gemm(a, b, a_scale=sa, b_scale=sb, bias=bias, out=out, plan=(10, 1))
    want = reference(a, b, a_scale=sa, b_scale=sb, bias=bias)
    bound = FP8_WGMMA_BOUND if out_dtype == torch.float32 else 1e-2
    assert torch.isfinite(out).all() and rel_error(out, want) < bound, rel_error(out, want)
    narrow = ops.quant_gemm(a, b, a_scale=sa, b_scale=sb, bias=bias, out_dtype=out_dtype, plan=(4, 1))
    assert_bitwise_equal(out, narrow, "recipe 10 vs recipe 4")


@pytest.mark.parametrize("pair", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                                  (torch.int8, torch.int8)], ids=["bf16", "f16", "s8"])
@pytest.mark.parametrize("case", WIDE_FP8_CASES, ids=lambda c: "M{}-N{}-K{}".format(*c))
def test_sm90_wide_tile_16bit_and_s8(pair, case):
    """Recipe 10 (128 x 192) for the 16-bit and int8 pairs: scales (int8) and bias into a poisoned output of each
    16-bit / fp32 type against float64; int8 small integers to int32 exactly, equal to recipe 4's."""
    ta, tb = pair
    skip_if_no_recipe(10, ta, tb)
    m, n, k = case
    a, b = operand(ta, (m, k)), operand(tb, (n, k))
    sa, sb = scales_for(ta, tb, m, n)
    if sa is not None:
        sa = sa / 1024  # int8 sums reach ~1e6 at K = 4096: keep the fp16 output in range
    bias = torch.randn(n, device=DEVICE)
    want = reference(a, b, a_scale=sa, b_scale=sb, bias=bias)
    for out_dtype, bound in ((torch.float32, 1e-5), (torch.bfloat16, 1e-2), (torch.float16, 1e-2)):
        out = torch.full((m, n), float("nan"), device=DEVICE, dtype=out_dtype)
        ops.quant_gemm(a, b, a_scale=sa, b_scale=sb, bias=bias, out=out, plan=(10, 1))
        assert torch.isfinite(out).all() and rel_error(out, want) < bound, (out_dtype, rel_error(out, want))
    if ta == torch.int8:
        ai, bi = operand(ta, (m, k), small=True), operand(tb, (n, k), small=True)
        y = ops.quant_gemm(ai, bi, out_dtype=torch.int32, plan=(10, 1))
        assert torch.equal(y.double(), reference(ai, bi))
        assert_bitwise_equal(y, ops.quant_gemm(ai, bi, out_dtype=torch.int32, plan=(4, 1)), "recipe 10 vs recipe 4")


# --- recipe 6: the sm_90a weight stream ---------------------------------------------------------------------------

# (M, N, K, split): both token-tile kernels (M <= 8, blocks of 16) and several blocks of 16; N off the 64 weight
# rows of a CTA; K off the 128-byte K tile (TMA zeros past K; rows stay 16-byte aligned); splits 1..8 (one cluster), including more
# slices than K tiles (empty slices add zeros).
STREAM90_CASES = [(1, 64, 16, 1), (1, 117, 400, 5), (8, 200, 4112, 8), (9, 77, 3888, 3), (16, 333, 1008, 2),
                  (17, 130, 2064, 4), (40, 65, 528, 7), (3, 4099, 256, 8)]


@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("case", STREAM90_CASES, ids=lambda c: "M{}-N{}-K{}-s{}".format(*c))
def test_sm90_stream_matches_float64(pair, case):
    """Recipe 6 against float64: exact on small integers (every pair: products and sums exact in its accumulator)
    with every poisoned element written; within a few fp32 ulp on random values with per-row / per-channel scales
    and bias; a batch with a broadcast weight; repeated calls bitwise equal."""
    skip_without_sm90()
    ta, tb = pair
    skip_if_blocked(ta)
    m, n, k, split = case
    a, b = operand(ta, (m, k), small=True), operand(tb, (n, k), small=True)
    ones_a = torch.ones(m, device=DEVICE) if ta == torch.int8 else None
    ones_b = torch.ones(n, device=DEVICE) if tb == torch.int8 else None
    out = torch.full((m, n), float("nan"), device=DEVICE)
    ops.quant_gemm(a, b, a_scale=ones_a, b_scale=ones_b, out_dtype=torch.float32, plan=(6, split), out=out)
    assert torch.equal(out.double(), reference(a, b))
    a, b = operand(ta, (2, m, k)), operand(tb, (n, k))
    sa, sb = scales_for(ta, tb, m, n)
    bias = torch.randn(n, device=DEVICE)
    y = ops.quant_gemm(a, b, a_scale=sa, b_scale=sb, bias=bias, out_dtype=torch.float32, plan=(6, split))
    want = reference(a, b, a_scale=sa, b_scale=sb, bias=bias)
    assert torch.isfinite(y).all() and rel_error(y, want) < 1e-5, rel_error(y, want)
    assert_bitwise_equal(ops.quant_gemm(a, b, a_scale=sa, b_scale=sb, bias=bias, out_dtype=torch.float32,
                                        plan=(6, split)), y, "repeat")


@pytest.mark.parametrize("pair", [(torch.bfloat16, torch.bfloat16), (torch.bfloat16, torch.int8), (E4, E4)],
                         ids=["bf16", "bf16-s8", "e4m3"])
def test_sm90_stream_batch_invariant_and_graph(pair):
    """A row of recipe 6's output does not depend on M (the same split: 1 row, 8, 16 and 48 rows give the row's
    bits); a CUDA-graph replay gives the eager bits; the poison control detects a one-element change."""
    skip_without_sm90()
    ta, tb = pair
    skip_if_blocked(ta)
    n, k = 520, 3008
    a, b = operand(ta, (48, k)), operand(tb, (n, k))
    sb = torch.rand(n, device=DEVICE) + 0.5 if tb != torch.bfloat16 else None
    full = ops.quant_gemm(a, b, b_scale=sb, plan=(6, 4))
    assert_detects_perturbation(full)
    for m in (1, 8, 16):
        assert_bitwise_equal(ops.quant_gemm(a[:m], b, b_scale=sb, plan=(6, 4)), full[:m], f"M={m}")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        ops.quant_gemm(a[:8], b, b_scale=sb, plan=(6, 4))
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured = ops.quant_gemm(a[:8], b, b_scale=sb, plan=(6, 4))
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(captured, full[:8], "graph replay")


def test_sm90_stream_builtin_plan_and_refusals():
    """At M <= 16 in layout nt the built-in plan is recipe 6 on an H100 / H200 with sm_90a code; split_k past 8
    and layouts other than nt are refused before launch, naming the op and the reason."""
    a16, b16 = operand(torch.bfloat16, (4, 256)), operand(torch.bfloat16, (96, 256))
    if not ops.sm90_available(torch.device(DEVICE)):
        with pytest.raises(RuntimeError, match="astrai.quant_gemm: .*recipe 6"):
            ops.quant_gemm(a16, b16, plan=(6, 1))
        return
    assert ops.plan_for(a16, b16, 0, False)[0] == ops.SM90_STREAM_RECIPE
    with pytest.raises(RuntimeError, match=r"astrai.quant_gemm: split_k must be in \[1, 8\] for recipe 6"):
        ops.quant_gemm(a16, b16, plan=(6, 9))
    with pytest.raises(RuntimeError, match="astrai.quant_gemm: .*recipe 6 .*layout nt only"):
        ops.quant_gemm(a16, b16.t().contiguous(), layout="nn", plan=(6, 1))


# --- recipes 7, 8 and 9: Hopper w8a16 ------------------------------------------------------------------------------

# (B, M, N, K, split): tiles past M and N (N off 4 columns: the scalar tail of the copy-out), K off the 64 / 128 of a
# stage, several waves of CTAs, a split with empty slices, batches with either operand broadcast.
SM90_W8A16_CASES = [(1, 1, 200, 272, 1), (1, 300, 1030, 1040, 1), (1, 513, 4100, 2064, 3), (3, 130, 260, 784, 2),
                    (2, 257, 129, 400, 8), (1, 63, 333, 1424, 4), (2, 65, 1000, 656, 1)]


@pytest.mark.parametrize("recipe", ops.SM90_W8A16_RECIPES)
@pytest.mark.parametrize("ta", [torch.bfloat16, torch.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("case", SM90_W8A16_CASES, ids=lambda c: "B{}-M{}-N{}-K{}-s{}".format(*c))
def test_sm90_w8a16_matches_float64(recipe, ta, case):
    """Per-channel scales and bias into a poisoned output of each dtype: every element written, against float64
    (bf16 / fp16 outputs within their rounding), batch 3 with b broadcast and batch 2 with a broadcast."""
    skip_if_no_recipe(recipe, ta, torch.int8)
    B, m, n, k, split = case
    a = operand(ta, (B, m, k) if B == 3 else (m, k))  # B = 2: a broadcast
    b = operand(torch.int8, (B, n, k) if B == 2 else (n, k))  # B = 3: b broadcast
    sb, bias = torch.rand(n, device=DEVICE) + 0.5, torch.randn(n, device=DEVICE).to(ta)
    want = reference(a, b, b_scale=sb, bias=bias)
    for out_dtype, bound in ((torch.float32, 1e-5), (ta, 1e-2)):
        out = torch.full(want.shape, float("nan"), device=DEVICE, dtype=out_dtype)
        ops.quant_gemm(a, b, b_scale=sb, bias=bias, out=out, plan=(recipe, split))
        assert torch.isfinite(out).all() and rel_error(out, want) < bound, (out_dtype, rel_error(out, want))


@pytest.mark.parametrize("recipe", ops.SM90_W8A16_RECIPES)
def test_sm90_w8a16_exact_repeatable_graph(recipe):
    """Small integers (exact in fp32): equal to the integer reference; repeated calls and a CUDA-graph replay
    bitwise equal; the poison control detects a one-element change."""
    skip_if_no_recipe(recipe, torch.bfloat16, torch.int8)
    m, n, k = 300, 520, 1088
    a, b = operand(torch.bfloat16, (m, k), small=True), operand(torch.int8, (n, k), small=True)
    ones = torch.ones(n, device=DEVICE)
    y = ops.quant_gemm(a, b, b_scale=ones, out_dtype=torch.float32, plan=(recipe, 2))
    assert torch.equal(y.double(), reference(a, b))
    assert_detects_perturbation(y)
    assert_bitwise_equal(ops.quant_gemm(a, b, b_scale=ones, out_dtype=torch.float32, plan=(recipe, 2)), y, "repeat")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        ops.quant_gemm(a, b, b_scale=ones, out_dtype=torch.float32, plan=(recipe, 2))
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        captured = ops.quant_gemm(a, b, b_scale=ones, out_dtype=torch.float32, plan=(recipe, 2))
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(captured, y, "graph replay")


def test_sm90_w8a16_builtin_plan_and_refusals():
    """At M > 16 in layout nt the built-in w8a16 plan is recipe 7, 8, 9 or 11 on an H100 / H200 with sm_90a code, or up
    to M = 256 the weight stream where its model prices it lower (small weights); other pairs and layouts are refused
    before launch, naming the op and the reason."""
    a16, b8 = operand(torch.bfloat16, (64, 4096)), operand(torch.int8, (4096, 4096))
    sb = torch.rand(4096, device=DEVICE) + 0.5
    if not ops.sm90_available(torch.device(DEVICE)):
        with pytest.raises(RuntimeError, match="astrai.quant_gemm: .*recipes 7-9"):
            ops.quant_gemm(a16, b8, b_scale=sb, plan=(7, 1))
        return
    assert ops.plan_for(a16, b8, 0, False)[0] in ops.SM90_W8A16_RECIPES
    assert ops.plan_for(a16[:, :256], b8[:96, :256], 0, False)[0] == 2  # a small weight: the weight stream
    with pytest.raises(RuntimeError, match="astrai.quant_gemm: .*recipes 7-9 and 11 run w8a16 only"):
        ops.quant_gemm(a16, operand(torch.bfloat16, (1152, 4096)), plan=(8, 1))
    with pytest.raises(RuntimeError, match="astrai.quant_gemm: .*recipes 7-9 and 11 .*layout nt only"):
        ops.quant_gemm(a16, b8.t().contiguous(), b_scale=sb, layout="nn", plan=(9, 1))


# --- layouts nn, tn, tt --------------------------------------------------------------------------------------

OTHER_LAYOUTS = ["nn", "tn", "tt"]
# (M, N, K) with plans (recipe, split_k) spread over them: M in 1, 7, 129, 1000; N and K off the tiles; K = 16.
LAYOUT_CASES = [((1, 64, 16), (2, 1)), ((1, 64, 16), (0, 2)), ((7, 130, 1008), (2, 3)), ((7, 130, 1008), (1, 1)),
                ((129, 257, 512), (0, 2)), ((129, 257, 512), (1, 1)), ((1000, 300, 272), (0, 1)),
                ((1000, 300, 272), (1, 2))]


def stored(layout: str, which: str, rows: int, k: int, dtype: torch.dtype, *, batch: int | None = None,
           small: bool = False) -> torch.Tensor:
    """a ([M, K] or [K, M]) or b ([K, N] or [N, K]) as `layout` stores it (`rows` is M or N). A last dim whose rows
    would not start 16 bytes apart is a view of a padded tensor, whose padding holds random values (read by
    mistake, they would change the result)."""
    transposed = layout[0] == "t" if which == "a" else layout[1] == "n"  # MN-major: [K, rows]
    shape = (k, rows) if transposed else (rows, k)
    last = shape[1]
    per_16 = 16 // torch.empty((), dtype=dtype).element_size()
    padded = -(-last // per_16) * per_16 if last % per_16 else last
    lead = (batch,) if batch else ()
    full = operand(dtype, lead + (shape[0], padded), small=small)
    return full[..., :last]


@pytest.mark.parametrize("layout", OTHER_LAYOUTS)
@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
@pytest.mark.parametrize("case", LAYOUT_CASES, ids=lambda c: "x".join(map(str, c[0])) + f"-p{c[1][0]}s{c[1][1]}")
def test_layouts_match_float64(layout, pair, case):
    ta, tb = pair
    skip_if_blocked(ta)
    (m, n, k), plan = case
    a, b = stored(layout, "a", m, k, ta), stored(layout, "b", n, k, tb)
    sa, sb = scales_for(ta, tb, m, n)
    bias = torch.randn(n, device=DEVICE) if plan[1] > 1 else None
    y = ops.quant_gemm(a, b, a_scale=sa, b_scale=sb, bias=bias, out_dtype=torch.float32, layout=layout, plan=plan)
    want = reference(a, b, a_scale=sa, b_scale=sb, bias=bias, layout=layout)
    assert torch.isfinite(y).all() and rel_error(y, want) < 1e-5, rel_error(y, want)


@pytest.mark.parametrize("layout", list(ops.LAYOUTS))
@pytest.mark.parametrize("split_k", [1, 3])
def test_layouts_int8_raw_int32_exact(layout, split_k):
    m, n, k = 33, 45, 784
    a, b = stored(layout, "a", m, k, torch.int8), stored(layout, "b", n, k, torch.int8)
    y = ops.quant_gemm(a, b, out_dtype=torch.int32, layout=layout, plan=(1, split_k))
    assert y.dtype == torch.int32
    assert torch.equal(y.cpu().long(), reference(a.cpu(), b.cpu(), layout=layout).long())


@pytest.mark.parametrize("layout", OTHER_LAYOUTS)
@pytest.mark.parametrize("pair", PAIRS[:4], ids=PAIR_IDS[:4])
def test_layouts_exact_on_small_integers(layout, pair):
    ta, tb = pair
    m, n, k = 37, 72, 784
    a, b = stored(layout, "a", m, k, ta, small=True), stored(layout, "b", n, k, tb, small=True)
    ones_b = torch.ones(n, device=DEVICE) if tb == torch.int8 else None
    y = ops.quant_gemm(a, b, b_scale=ones_b, out_dtype=torch.float32, layout=layout, plan=(2, 4))
    assert torch.equal(y.double(), reference(a, b, layout=layout))


@pytest.mark.parametrize("layout", list(ops.LAYOUTS))
@pytest.mark.parametrize("broadcast", ["a2d", "b2d", "both3d", "b_stride0"])
@pytest.mark.parametrize("pair", [(torch.int8, torch.int8), (E5, E4)], ids=["s8", "e5m2-e4m3"])
def test_layouts_batch_and_broadcast(layout, broadcast, pair):
    ta, tb = pair
    skip_if_blocked(ta)
    B, m, n, k = 3, 40, 96, 160
    a = stored(layout, "a", m, k, ta, batch=None if broadcast == "a2d" else B)
    b = stored(layout, "b", n, k, tb, batch=B if broadcast in ("both3d", "a2d") else None)
    if broadcast == "b_stride0":
        b = b.unsqueeze(0).expand(B, *b.shape)
    if ta == torch.int8:
        y = ops.quant_gemm(a, b, out_dtype=torch.int32, layout=layout, plan=(1, 2))
        want = reference(a.cpu(), b.cpu(), layout=layout).long()
        assert y.shape == (B, m, n) and torch.equal(y.cpu().long(), want.expand(B, m, n))
    else:
        y = ops.quant_gemm(a, b, out_dtype=torch.float32, layout=layout, plan=(0, 1))
        want = reference(a, b, layout=layout)
        assert y.shape == (B, m, n) and rel_error(y, want.expand(B, m, n)) < 1e-5


@pytest.mark.parametrize("layout", OTHER_LAYOUTS)
def test_layouts_out_overwrites_every_element_and_repeats_bitwise(layout):
    m, n, k = 129, 200, 272
    a, b = stored(layout, "a", m, k, torch.bfloat16), stored(layout, "b", n, k, torch.int8)
    sb = torch.rand(n, device=DEVICE) + 0.5
    out = torch.full((m, n), float("nan"), device=DEVICE)
    ops.quant_gemm(a, b, b_scale=sb, out=out, layout=layout, plan=(0, 3))
    assert torch.isfinite(out).all() and rel_error(out, reference(a, b, b_scale=sb, layout=layout)) < 1e-5
    assert_detects_perturbation(out)
    again = torch.full((m, n), float("nan"), device=DEVICE)
    ops.quant_gemm(a, b, b_scale=sb, out=again, layout=layout, plan=(0, 3))
    assert_bitwise_equal(again, out, "repeat")


@pytest.mark.parametrize("layout", OTHER_LAYOUTS)
@pytest.mark.parametrize("pair", [(torch.bfloat16, torch.bfloat16), (E4, E5)], ids=["bf16", "e4m3-e5m2"])
def test_layouts_batch_invariant_plan(layout, pair):
    """Row i of an M-row call equals the call on row i alone, bitwise (batch_invariant=True), in every layout:
    with a stored [K, M] the row is column i of a."""
    ta, tb = pair
    skip_if_blocked(ta)
    m, n, k = 300, 256, 2048
    a, b = stored(layout, "a", m, k, ta), stored(layout, "b", n, k, tb)
    full = ops.quant_gemm(a, b, layout=layout, batch_invariant=True)
    for i in (0, 17, m - 1):
        # A one-row a: [1, K], or [K, 1] as a view of the padded storage (16-byte aligned rows).
        one = a[i:i + 1] if layout[0] == "n" else stored(layout, "a", 1, k, ta)
        if layout[0] == "t":
            one.copy_(a[:, i:i + 1])
        row = ops.quant_gemm(one, b, layout=layout, batch_invariant=True)
        assert_bitwise_equal(row, full[i:i + 1], f"row {i}")


def test_opcheck():
    a, b = operand(torch.bfloat16, (9, 64)), operand(torch.int8, (24, 64))
    sb = torch.rand(24, device=DEVICE) + 0.5
    ops.load()
    torch.library.opcheck(torch.ops.astrai.quant_gemm.default,
                          (a, b, None, sb, None, torch.bfloat16, 0, 2, 2))


# --- programmatic dependent launch ---------------------------------------------------------------------------------

# (pair, M, N, K, plan, layout): each kernel template of the family, the weight stream and every Hopper recipe among
# them. The GEMM kernels launch as programmatic dependents (sm_90+ code; not recipe 6 above one CTA a SM or recipes
# 4 / 5 with the last wave split, which run here as the other side of the chain) and let their own dependents in once
# past their mainloop.
PDL_CHAIN_CASES = [
    ("bf16", 1, 4096, 1024, (6, 2), "nt"), ("bf16", 8, 2112, 2048, (6, 1), "nt"),
    ("bf16", 16, 4096, 1024, (2, 4), "nt"), ("bf16", 130, 1024, 512, (0, 1), "nt"),
    ("bf16", 64, 2048, 1024, (1, 3), "nt"), ("bf16", 200, 1024, 512, (3, 1), "nt"),
    ("bf16", 300, 2112, 1024, (4, 1), "nt"), ("bf16", 300, 4096, 1024, (5, 2), "nt"),
    ("bf16", 1000, 2112, 2048, (4, 0), "nt"), ("bf16", 130, 1024, 512, (0, 2), "nn"),
    ("bf16-s8", 1, 4096, 1024, (2, 8), "nt"), ("bf16-s8", 16, 4096, 1024, (2, 4), "nt"),
    ("bf16-s8", 4, 8192, 1024, (6, 1), "nt"), ("bf16-s8", 200, 1024, 1024, (7, 1), "nt"),
    ("bf16-s8", 300, 1024, 1024, (8, 2), "nt"), ("bf16-s8", 40, 2048, 1024, (9, 2), "nt"),
]


@pytest.mark.parametrize("case", PDL_CHAIN_CASES, ids=lambda c: "{}-M{}-N{}-K{}-r{}s{}-{}".format(*c[:4], *c[4], c[5]))
def test_pdl_chain_reads_what_the_previous_call_wrote(case):
    """Three calls back to back on one stream: the first writes the third's weights (16-bit pairs) into a poisoned
    buffer, the second its activations; the third, launched as a programmatic dependent of the second, must read
    them only after those grids have finished (a read before its griddepcontrol.wait would see the poison). Three
    rounds with fresh data; float64 reference from the buffers as written."""
    pair, m, n, k, plan, layout = case
    ta, tb = (torch.bfloat16, torch.bfloat16) if pair == "bf16" else (torch.bfloat16, torch.int8)
    skip_if_no_recipe(plan[0], ta, tb)
    if plan[1] == ops.TAIL_SPLIT:
        skip_without_sm90()
    nan = float("nan")
    b_shape = (k, n) if layout == "nn" else (n, k)
    for _ in range(3):
        a_buf = torch.full((m, k), nan, device=DEVICE, dtype=ta)
        x0, w0 = operand(ta, (m, 2048)), operand(ta, (k, 2048))
        if tb == torch.int8:
            b, sb = operand(tb, b_shape), torch.rand(n, device=DEVICE) + 0.5
        else:
            b, sb = torch.full(b_shape, nan, device=DEVICE, dtype=tb), None
            x1, w1 = operand(ta, (b_shape[0], 2048)), operand(ta, (b_shape[1], 2048))
            ops.quant_gemm(x1, w1, out=b)  # the weights: a GEMM of ~2 * 4096 * 1024 * 2048 flops
        ops.quant_gemm(x0, w0, out=a_buf)  # the activations
        y = torch.full((m, n), nan, device=DEVICE, dtype=torch.float32)
        ops.quant_gemm(a_buf, b, b_scale=sb, out=y, plan=plan, layout=layout)
        torch.cuda.synchronize()
        assert torch.isfinite(a_buf).all() and torch.isfinite(b.float()).all()
        want = reference(a_buf, b, b_scale=sb, layout=layout)
        assert torch.isfinite(y).all() and rel_error(y, want) < 1e-5, rel_error(y, want)


@pytest.mark.parametrize("plan", [(2, 4), (6, 2), (4, 0), (5, 1), (8, 1)], ids=lambda p: f"r{p[0]}s{p[1]}")
def test_pdl_off_same_bits(plan):
    """gemm_plan.set_staging(pdl=False) (seeded by ASTRAI_GEMM_PDL=0) launches the kernels plainly: the same bits as
    with the overlap."""
    pair = (torch.bfloat16, torch.int8) if plan[0] in ops.SM90_W8A16_RECIPES else (torch.bfloat16, torch.bfloat16)
    skip_if_no_recipe(plan[0], *pair)
    if plan[1] == ops.TAIL_SPLIT:
        skip_without_sm90()
    m = 16 if plan[0] in (2, 6) else 1000
    a, b = operand(pair[0], (m, 2048)), operand(pair[1], (2112, 2048))
    sb = torch.rand(2112, device=DEVICE) + 0.5 if pair[1] == torch.int8 else None
    y = ops.quant_gemm(a, b, b_scale=sb, plan=plan)
    gemm_plan.set_staging(pdl=False)
    try:
        assert torch.ops.astrai.quant_gemm_set_pdl(False) is False  # the library holds the policy's switch
        assert_bitwise_equal(ops.quant_gemm(a, b, b_scale=sb, plan=plan), y, "set_staging(pdl=False)")
    finally:
        gemm_plan.set_staging(pdl=True)


# --- 64-bit indexing -----------------------------------------------------------------------------------------------

# (M, N, K, plan): the output past 2^31 elements (M x N = 2^31 + 129 x 8192); split 2 on an output past 2^30, so its
# fp32 partials pass 2^31; a [M, 272] past 2^31 elements itself (K = 272: int8 rows must be 16-byte multiples), with M inside the op's limit of 65535 tile rows for
# the 128- and 256-row tiles (recipes 1 and 9 tile 64 rows: M up to 4194240). They reach offsets past 2^31.
BIG_OUT = (2**31 // 8192 + 129, 8192, 64)
BIG_SPLIT = (2**30 // 8192 + 129, 8192, 2048)
BIG_A = (2**31 // 272 + 129, 64, 272)
assert BIG_OUT[0] * BIG_OUT[1] > 2**31 and 2 * BIG_SPLIT[0] * BIG_SPLIT[1] > 2**31 and BIG_A[0] * BIG_A[2] > 2**31
assert -(-BIG_A[0] // 128) <= 65535
BIG_CASES = ([("w16a16", BIG_OUT, p) for p in [None, (0, 1), (1, 1), (3, 1), (4, 1), (5, 1), (4, 0)]]
             + [("w16a16", BIG_SPLIT, p) for p in [(0, 2), (5, 2)]]
             + [("w16a16", BIG_A, p) for p in [(0, 1), (3, 1), (4, 1), (5, 1)]]
             + [("w8a16", BIG_OUT, p) for p in [None, (0, 1), (1, 1), (7, 1), (8, 1), (9, 1)]]
             + [("w8a16", BIG_SPLIT, p) for p in [(8, 2)]]
             + [("w8a16", BIG_A, p) for p in [(0, 1), (7, 1), (8, 1)]])


@pytest.mark.parametrize("pair, shape, plan", BIG_CASES,
                         ids=[f"{c[0]}-M{c[1][0]}-N{c[1][1]}-K{c[1][2]}-" + (f"p{c[2][0]}s{c[2][1]}" if c[2] else "chain")
                              for c in BIG_CASES])
def test_64bit_indexing_past_2_31_elements(pair, shape, plan):
    """An output, a split's partials or an operand past 2^31 elements: offsets must not wrap. The output poisoned
    (NaN), then rows sampled from the start, the middle and the last 64 against float64 (the rows past 2^31 elements
    among them), and no NaN left in them."""
    m, n, k = shape
    ta, tb = torch.bfloat16, (torch.bfloat16 if pair == "w16a16" else torch.int8)
    if plan is not None:
        skip_if_no_recipe(plan[0], ta, tb)
    split = plan[1] if plan and plan[1] > 1 else 1
    need = m * n * 2 + m * k * 2 + (m * n * 4 * split if split > 1 else 0)
    free, _ = torch.cuda.mem_get_info()
    if free < need * 1.25 + 2**30:
        pytest.skip(f"needs ~{need / 2**30:.1f} GiB of free GPU memory, {free / 2**30:.1f} GiB free")
    a = operand(ta, (m, k))
    b = operand(tb, (n, k))
    sb = torch.rand(n, device=DEVICE) / 64 + 1e-3 if tb == torch.int8 else None
    out = torch.full((m, n), float("nan"), device=DEVICE, dtype=torch.bfloat16)
    ops.quant_gemm(a, b, b_scale=sb, out=out, plan=plan)
    torch.cuda.synchronize()
    rows = torch.cat([torch.arange(64), torch.randint(64, m - 64, (64,)), torch.arange(m - 64, m)]).to(DEVICE)
    got = out[rows]
    want = reference(a[rows], b, b_scale=sb)
    assert not torch.isnan(got).any(), f"rows {rows[torch.isnan(got).any(1)].tolist()[:8]} not (fully) written"
    assert rel_error(got, want) < 1e-2, rel_error(got, want)
