"""Tier 1 (GPU): the quantize kernels bit-for-bit against the plain-torch reference (torch's own cast on the
GPU) for every input type, format, scale kind and layout; dynamic scales, block scales and the UE8M0 layout
exactly; amax exactly; awkward shapes and strides (element path); determinism, CUDA-graph replay, side
streams, opcheck, torch.compile. Outputs are poisoned before each call; every bitwise check has a negative
control. Runs under whatever image the loader picks; set ASTRAI_IMAGE to force one (e.g. ptx80).
"""

from __future__ import annotations

import pytest
import torch
from reference import quantize as ref

import astrai.extension as ae
from astrai.extension.backend import quantize as backend
from astrai.extension.ops import quantize as ops

pytestmark = [pytest.mark.gpu, pytest.mark.requires_cuda_kernels("quantize")]

DEVICE = "cuda"
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_IDS = ["e4m3", "e5m2"]
IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
IN_IDS = ["bf16", "fp16", "fp32"]
LAYOUTS = ("rowwise", "transposed", "dual")


# --- helpers ---------------------------------------------------------------------------------------------------

def rand_x(rows: int, cols: int, dtype=torch.bfloat16, specials: bool = True) -> torch.Tensor:
    """Fresh random x on the GPU (seeded per test) with outliers and (by default) about 2% special values:
    ±0, ±inf, NaN, huge, subnormal."""
    return ref.random_input(rows, cols, dtype, device=DEVICE, specials=specials)


def poison_next_allocations(*nbytes: int) -> None:
    """Free blocks of these sizes filled with 0xFF, which the caching allocator hands to the next requests of
    those sizes: an output byte the kernel fails to write then reads 0xFF (a NaN the kernels never produce)."""
    blocks = [torch.empty(max(n, 1), dtype=torch.uint8, device=DEVICE).fill_(0xFF) for n in nbytes]
    del blocks


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def assert_bitwise_equal(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, (
        f"{what}: {got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}")
    differ = bits(got) != bits(want)
    if bool(differ.any()):
        first = tuple(differ.nonzero()[0].tolist())
        raise AssertionError(f"{what}: {int(differ.sum())} of {got.numel()} elements differ; first at {first}: "
                             f"{bits(got)[first].item():#x} vs {bits(want)[first].item():#x}")


def assert_same_floats(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """float32 bit equality, where any NaN equals any NaN (amax of a NaN input is some NaN)."""
    assert got.shape == want.shape, f"{what}: {list(got.shape)} vs {list(want.shape)}"
    nan = torch.isnan(got) & torch.isnan(want)
    differ = (got.view(torch.int32) != want.view(torch.int32)) & ~nan
    if bool(differ.any()):
        first = tuple(differ.nonzero()[0].tolist())
        raise AssertionError(f"{what}: {int(differ.sum())} differ; first at {first}: {got[first].item()!r} vs "
                             f"{want[first].item()!r}")


def assert_detects_perturbation(t: torch.Tensor) -> None:
    """Negative control: flip the lowest bit of one element of a copy; assert_bitwise_equal must fail."""
    if t.numel() == 0:
        return
    changed = t.clone()
    flat = bits(changed).view(-1)
    flat[int(torch.randint(0, flat.numel(), ()))] ^= 1
    with pytest.raises(AssertionError, match="1 of .* elements differ"):
        assert_bitwise_equal(changed, t, "negative control")


def make_scale(kind: str, rows: int, cols: int) -> torch.Tensor:
    """Positive multipliers, some large enough that outliers saturate."""
    if kind == "tensor":
        return torch.tensor([3.7], device=DEVICE)
    shape = (rows, 1) if kind == "row" else (1, cols)
    return (2.0 ** torch.randint(-4, 8, shape, device=DEVICE).float()) * (torch.rand(shape, device=DEVICE) + 0.5)


# --- static multipliers ------------------------------------------------------------------------------------------

SHAPES = ((1, 4096), (19, 100), (989, 128), (67, 13), (989, 4096), (19, 4104))  # 100, 13: the element path


def _rotating(combos, per_combo: int = 2, shapes=SHAPES):
    """Every combination, each with `per_combo` shapes taken in turn from `shapes` (all shapes are covered)."""
    out, i = [], 0
    for combo in combos:
        for _ in range(per_combo):
            out.append((shapes[i % len(shapes)], *combo))
            i += 1
    return out


def _ids(v):
    if isinstance(v, tuple):
        return "x".join(map(str, v))
    return str(v).replace("torch.", "")


STATIC_CASES = _rotating([(i, d, k, lay) for i in IN_DTYPES for d in FP8 for k in ("tensor", "row", "column")
                          for lay in LAYOUTS])


@pytest.mark.parametrize("shape,in_dtype,dtype,kind,layout", STATIC_CASES, ids=_ids)
def test_static_matches_reference(shape, in_dtype, dtype, kind, layout):
    rows, cols = shape
    x = rand_x(rows, cols, in_dtype)
    scale = make_scale(kind, rows, cols)
    amax_kind = "row" if (rows + cols) % 2 else "tensor"
    poison_next_allocations(rows * cols, rows * cols)
    out, out_t, amax = ops.quantize(x, scale, dtype, layout=layout, amax=amax_kind)
    want = ref.quantize(x, scale, dtype)
    if layout != "transposed":
        assert_bitwise_equal(out, want, "out")
    if layout != "rowwise":
        assert out_t.is_contiguous()
        assert_bitwise_equal(out_t, want.t().contiguous(), "out_t")
    assert_same_floats(amax, ref.amax(x) if amax_kind == "tensor" else ref.amax(x, dim=1), f"amax ({amax_kind})")
    assert_detects_perturbation(want)


@pytest.mark.parametrize("kind", ["tensor", "row", "column"])
@pytest.mark.parametrize("in_dtype", IN_DTYPES, ids=IN_IDS)
@pytest.mark.parametrize("cols", (4096, 100))
def test_static_int8_matches_reference(cols, in_dtype, kind):
    x = rand_x(989, cols, in_dtype)
    scale = make_scale(kind, 989, cols)
    poison_next_allocations(989 * cols)
    out, _, _ = ops.quantize(x, scale, torch.int8)
    assert_bitwise_equal(out, ref.quantize(x, scale, torch.int8), "int8 out")
    assert int(out.min()) >= -127


@pytest.mark.parametrize("dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("in_dtype", IN_DTYPES, ids=IN_IDS)
def test_every_special_value(in_dtype, dtype):
    vals = ref.special_values(dtype)
    row = torch.tensor(vals + [-v for v in vals], dtype=torch.float32)
    wide = row.repeat(19, 16).to(in_dtype).to(DEVICE)  # [19, 32 * len]: N % 16 == 0, the 16-byte path
    for x in (wide, wide[:, :13]):                       # and 13 columns: the element path
        for scale in (1.0, 0.5, 1e-3, 2.0**20):
            s = torch.tensor([scale], device=DEVICE)
            out, out_t, _ = ops.quantize(x, s, dtype, layout="dual", check_scale=False)
            want = ref.quantize(x, s, dtype)
            assert_bitwise_equal(out, want, f"specials, scale {scale}")
            assert_bitwise_equal(out_t, want.t().contiguous(), f"specials transposed, scale {scale}")
            row_out, _, _ = ops.quantize(x, s, dtype, check_scale=False)
            assert_bitwise_equal(row_out, want, f"specials, row kernel, scale {scale}")
            nan = torch.isnan(x.float() * s)
            assert bool((out.view(torch.uint8)[nan] == 0x7F).all())


# --- dynamic scales -----------------------------------------------------------------------------------------------

ROW_SHAPES = ((1, 4096), (19, 100), (989, 4096), (67, 13), (19, 20000))  # 20000: past the register cache
DYN_ROW_CASES = _rotating([(i, d, p) for i in IN_DTYPES for d in (*FP8, torch.int8) for p in (False, True)],
                          shapes=ROW_SHAPES)


@pytest.mark.parametrize("shape,in_dtype,dtype,pow2", DYN_ROW_CASES, ids=_ids)
def test_dynamic_per_row_matches_reference(shape, in_dtype, dtype, pow2):
    rows, cols = shape
    x = rand_x(rows, cols, in_dtype, specials=rows != 989)  # 989 rows: clean rows (finite amax)
    poison_next_allocations(rows * cols, rows * 4)
    out, _, inv = ops.quantize_dynamic(x, dtype, granularity="row", pow2_scale=pow2)
    want, want_inv = ref.quantize_dynamic(x, dtype, "row", pow2)
    assert_bitwise_equal(out, want, "out")
    assert_same_floats(inv, want_inv, "scale_inv")
    assert_detects_perturbation(want)


DYN_TENSOR_CASES = _rotating([(i, d, p, lay) for i in IN_DTYPES for d in FP8 for p in (False, True) for lay in LAYOUTS],
                             per_combo=1, shapes=((1, 128), (19, 100), (989, 4096), (4096, 13)))


@pytest.mark.parametrize("shape,in_dtype,dtype,pow2,layout", DYN_TENSOR_CASES, ids=_ids)
def test_dynamic_per_tensor_matches_reference(shape, in_dtype, dtype, pow2, layout):
    x = rand_x(*shape, in_dtype, specials=False)
    out, out_t, inv = ops.quantize_dynamic(x, dtype, granularity="tensor", pow2_scale=pow2, layout=layout)
    want, want_inv = ref.quantize_dynamic(x, dtype, "tensor", pow2)
    if layout != "transposed":
        assert_bitwise_equal(out, want, "out")
    if layout != "rowwise":
        assert_bitwise_equal(out_t, want.t().contiguous(), "out_t")
    assert_same_floats(inv, want_inv, "scale_inv")


def test_dynamic_per_tensor_int8_and_nan_input():
    x = rand_x(989, 256, specials=False)
    q, _, inv = ops.quantize_dynamic(x, torch.int8)
    want, want_inv = ref.quantize_dynamic(x, torch.int8, "tensor")
    assert_bitwise_equal(q, want, "int8 per tensor")
    assert_same_floats(inv, want_inv)
    x[5, 7] = float("nan")  # amax NaN: the multiplier is 1
    q, _, inv = ops.quantize_dynamic(x, torch.float8_e4m3fn)
    assert inv.item() == 1.0
    assert_bitwise_equal(q, ref.quantize(x, torch.ones(1, device=DEVICE), torch.float8_e4m3fn), "NaN amax")


def test_dynamic_zero_rows_get_unit_scale():
    x = rand_x(19, 4096, specials=False)
    x[3] = 0
    x[7, 11] = float("inf")
    _, _, inv = ops.quantize_dynamic(x, torch.float8_e4m3fn, granularity="row")
    assert inv[3].item() == 1.0 and inv[7].item() == 1.0
    _, _, inv = ops.quantize_dynamic(torch.zeros(5, 64, device=DEVICE, dtype=torch.bfloat16))
    assert inv.item() == 1.0


# --- block scales and the scale-factor layout -------------------------------------------------------------------------

BLOCK_CASES = _rotating([(i, d, b, p, mn) for i in IN_DTYPES for d in FP8 for b in (1, 128) for p in (False, True)
                         for mn in (False, True)], per_combo=1, shapes=((1, 128), (19, 384), (989, 4096), (130, 256)))


@pytest.mark.parametrize("shape,in_dtype,dtype,block_rows,pow2,mn_major", BLOCK_CASES, ids=_ids)
def test_block_matches_reference(shape, in_dtype, dtype, block_rows, pow2, mn_major):
    x = rand_x(*shape, in_dtype, specials=shape[0] < 100)
    poison_next_allocations(x.numel())
    out, sf = ops.quantize_block(x, dtype, block_rows=block_rows, pow2_scale=pow2, scale_mn_major=mn_major)
    want, want_sf = ref.quantize_block(x, dtype, block_rows, pow2)
    assert_bitwise_equal(out, want, "out")
    assert_same_floats(sf, want_sf, "scale_inv")
    if mn_major:
        assert sf.stride() == (1, (sf.shape[0] + 3) // 4 * 4) or sf.shape[0] == 1
    torch_out, torch_sf = backend.quantize_fp8_block(x, out_dtype=dtype, block_rows=block_rows, pow2_scale=pow2,
                                                     scale_mn_major=mn_major, path="torch")
    assert_bitwise_equal(out, torch_out, "kernel vs torch path")
    assert_detects_perturbation(out)


@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("mn,sf_k", [(6, 9), (6, 12), (1, 1), (13, 5), (989, 56), (4096, 32)])
def test_scale_layout_matches_bit_model(mn, sf_k, pack):
    sf = torch.randint(-126, 127, (mn, sf_k), device=DEVICE).double().exp2().float()
    for source in (sf, sf.t().contiguous().t()):  # row-major and MN-major inputs
        got = ops.scale_layout(source, pack_ue8m0=pack)
        aligned = (mn + 3) // 4 * 4
        assert got.stride() == (1, aligned) or mn == 1
        want = backend.fp8_scale_layout(source.cpu(), pack_ue8m0=pack, path="torch")
        assert_bitwise_equal(got.cpu(), want, "layout vs torch path")
        storage = torch.as_strided(got, (got.shape[1], aligned), (aligned, 1))
        assert bool((storage[:, mn:] == 0).all()), "padding rows are not zero"
        if pack and mn * sf_k <= 4096:
            model = ref.ue8m0_pack_bitwise(sf.cpu())
            assert [[v & 0xFFFFFFFF for v in row] for row in got.cpu().tolist()] == model


def test_block_scales_feed_the_packed_layout():
    x = rand_x(989, 4096, specials=False)
    q, sf = ops.quantize_block(x, block_rows=1, pow2_scale=True)
    packed = ops.scale_layout(sf, pack_ue8m0=True)
    assert packed.shape == (989, 8) and packed.stride() == (1, 992)
    exps = (sf.view(torch.int32) >> 23) & 0xFF
    for j in range(4):
        assert torch.equal((packed >> (8 * j)) & 0xFF, exps[:, j::4])
    # dequantized: q * scale_inv recovers x to fp8 precision
    deq = q.float().view(989, 32, 128) * sf[:, :, None]
    rel = ((deq.view(989, 4096) - x.float()).abs() / x.float().abs().clamp_min(1e-30))
    big = x.float().abs() > x.float().abs().amax(1, keepdim=True) / 16
    assert float(rel[big].max()) <= 2.0**-3


# --- strides, alignment, sizes -------------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("view", ["row-padded", "misaligned", "broadcast-rows", "odd-stride"])
def test_strided_and_misaligned_inputs(view, layout):
    base = rand_x(990, 4104)
    if view == "row-padded":
        x = base[:989, :4096]                       # row stride 4104: 16-byte path
    elif view == "misaligned":
        x = base.view(-1)[1:1 + 989 * 4096].view(989, 4096)  # base 2 bytes off: element path
    elif view == "broadcast-rows":
        x = base[:1, :4096].expand(989, 4096)       # row stride 0
    else:
        x = base.view(-1)[:989 * 4099].view(989, 4099)[:, :4096]  # row stride 4099: element path
    for kind in ("tensor", "column"):
        scale = make_scale(kind, 989, 4096)
        out, out_t, _ = ops.quantize(x, scale, layout=layout)
        want = ref.quantize(x, scale, torch.float8_e4m3fn)
        if layout != "transposed":
            assert_bitwise_equal(out, want, f"{view}, out")
        if layout != "rowwise":
            assert_bitwise_equal(out_t, want.t().contiguous(), f"{view}, out_t")
    q, _, inv = ops.quantize_dynamic(x, granularity="row")
    want, want_inv = ref.quantize_dynamic(x, torch.float8_e4m3fn, "row")
    assert_bitwise_equal(q, want, f"{view}, dynamic row")
    q, sf = ops.quantize_block(x, block_rows=1)
    assert_bitwise_equal(q, ref.quantize_block(x, torch.float8_e4m3fn, 1)[0], f"{view}, 1x128")


def test_empty_inputs():
    x = torch.empty(0, 4096, device=DEVICE, dtype=torch.bfloat16)
    out, out_t, amax = ops.quantize(x, torch.ones(1, device=DEVICE), layout="dual", amax="tensor")
    assert out.shape == (0, 4096) and out_t.shape == (4096, 0) and amax.item() == 0.0
    q, _, inv = ops.quantize_dynamic(x)
    assert q.shape == (0, 4096) and inv.item() == 1.0
    q, _, inv = ops.quantize_dynamic(x, granularity="row")
    assert inv.shape == (0, 1)
    q, sf = ops.quantize_block(x, block_rows=128)
    assert sf.shape == (0, 32)
    assert ops.scale_layout(torch.empty(0, 9, device=DEVICE), pack_ue8m0=True).shape == (0, 3)
    torch.cuda.synchronize()


def test_64bit_indexing():
    """x with more than 2^31 elements: offsets past 2^31 must not wrap."""
    rows, cols = 2**31 // 4096 + 3, 4096
    need = rows * cols * 4 + (2 << 30)
    free, _ = torch.cuda.mem_get_info()
    if free < need:
        pytest.skip(f"needs {need / 2**30:.1f} GiB free on the GPU, has {free / 2**30:.1f}")
    x = torch.randn(rows, cols, device=DEVICE, dtype=torch.bfloat16)
    scale = torch.tensor([8.0], device=DEVICE)
    out, _, amax = ops.quantize(x, scale, amax="row")
    q, _, inv = ops.quantize_dynamic(x, granularity="row")
    for sl in (slice(0, 4), slice(rows // 2, rows // 2 + 4), slice(rows - 4, rows)):
        assert_bitwise_equal(out[sl], ref.quantize(x[sl], scale, torch.float8_e4m3fn), f"rows {sl}")
        assert_bitwise_equal(q[sl], ref.quantize_dynamic(x[sl], torch.float8_e4m3fn, "row")[0], f"dyn rows {sl}")
        assert_same_floats(amax[sl], ref.amax(x[sl], dim=1))
    del x, out, q
    torch.cuda.empty_cache()


# --- bitwise suites ---------------------------------------------------------------------------------------------------

def test_repeated_runs_are_bitwise_identical():
    x = rand_x(989, 4096)
    runs = [ops.quantize_dynamic(x, granularity="tensor", layout="dual") for _ in range(5)]
    rows = [ops.quantize_dynamic(x, granularity="row") for _ in range(5)]
    for i in range(1, 5):
        for a, b in zip(runs[i], runs[0]):
            assert_bitwise_equal(a, b, f"per tensor, run {i}")
        for a, b in zip(rows[i][::2], rows[0][::2]):
            assert_bitwise_equal(a, b, f"per row, run {i}")
    assert_detects_perturbation(runs[0][0])


def test_batch_invariance_per_row():
    x = rand_x(989, 4096)
    q_all, _, inv_all = ops.quantize_dynamic(x, granularity="row")
    g_all, sf_all = ops.quantize_block(x, block_rows=1)
    for rows in (slice(0, 1), slice(500, 501), slice(0, 19), slice(100, 612)):
        q, _, inv = ops.quantize_dynamic(x[rows], granularity="row")
        assert_bitwise_equal(q, q_all[rows], f"rows {rows}")
        assert_bitwise_equal(inv, inv_all[rows], f"scale_inv rows {rows}")
        g, sf = ops.quantize_block(x[rows], block_rows=1)
        assert_bitwise_equal(g, g_all[rows], f"1x128 rows {rows}")
    assert_detects_perturbation(q_all)


@pytest.mark.parametrize("call", ["static-dual", "dynamic-tensor", "dynamic-row", "block"])
def test_cuda_graph_replay_is_bitwise_identical_to_eager(call):
    x = rand_x(989, 4096, specials=False)
    scale = torch.tensor([2.5], device=DEVICE)

    def run():
        if call == "static-dual":
            return ops.quantize(x, scale, layout="dual", amax="tensor", check_scale=False)
        if call == "dynamic-tensor":
            return ops.quantize_dynamic(x, layout="dual")
        if call == "dynamic-row":
            return ops.quantize_dynamic(x, granularity="row")[::2]
        return ops.quantize_block(x, block_rows=1, pow2_scale=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = run()
    for trial in range(3):
        x.copy_(rand_x(989, 4096, specials=False))
        scale.fill_(float(torch.rand(())) * 4 + 0.5)
        want = run()
        for t in static_out:
            if t is not None:
                t.view(torch.uint8).fill_(0xFF)
        graph.replay()
        torch.cuda.synchronize()
        for i, (g, w) in enumerate(zip(static_out, want)):
            if g is not None:
                assert_bitwise_equal(g, w, f"graph replay {trial}, output {i}")
    assert_detects_perturbation(static_out[0])


def test_side_stream_launch():
    """The ops launch on the current stream: on a side stream, a long sleep then the copy of x precede them."""
    x = rand_x(989, 4096, specials=False)
    want = ops.quantize_dynamic(x, layout="dual")
    want_row = ops.quantize_dynamic(x, granularity="row")
    dst = rand_x(989, 4096, specials=False)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)
        dst.copy_(x)
        got = ops.quantize_dynamic(dst, layout="dual")
        got_row = ops.quantize_dynamic(dst, granularity="row")
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for g, w in zip(got, want):
        assert_bitwise_equal(g, w, "per tensor on a side stream")
    assert_bitwise_equal(got_row[0], want_row[0], "per row on a side stream")


# --- opcheck, compile, public API -----------------------------------------------------------------------------------------

def _opcheck_cases():
    def x():
        return rand_x(19, 256, specials=False)
    e4 = torch.float8_e4m3fn
    return {
        "static-dual-amax": lambda: ("quantize", (x(), torch.tensor([2.0], device=DEVICE), e4, 2, 1)),
        "static-row-int8": lambda: ("quantize", (x(), torch.rand(19, 1, device=DEVICE) + 1, torch.int8, 0, 2)),
        "dynamic-tensor": lambda: ("quantize_dynamic", (x(), torch.float8_e5m2, 0, False, 1)),
        "dynamic-row": lambda: ("quantize_dynamic", (x(), e4, 1, True, 0)),
        "block-1x128": lambda: ("quantize_block", (x(), e4, 1, True, True)),
        "block-128": lambda: ("quantize_block", (x(), e4, 128, False, False)),
        "layout": lambda: ("scale_layout", (torch.rand(19, 9, device=DEVICE) + 0.5, True)),
    }


@pytest.mark.parametrize("case", list(_opcheck_cases()))
def test_opcheck(case):
    ops.load()
    name, args = _opcheck_cases()[case]()
    torch.library.opcheck(getattr(torch.ops.astrai, name).default, args)


def test_compile_fullgraph_matches_eager():
    x = rand_x(2 * 19, 4096, specials=False).view(2, 19, 4096)

    def f(x):
        q, _, inv = ae.quantize_fp8_dynamic(x, granularity="row")
        b, sf = ae.quantize_fp8_block(x, block_rows=1, pow2_scale=True)
        return q, inv, b, sf

    compiled = torch.compile(f, fullgraph=True)
    for g, w in zip(compiled(x), f(x)):
        assert_bitwise_equal(g, w, "compiled vs eager")


def test_public_api_dispatch_and_torch_path_agree_on_gpu():
    x = rand_x(989, 4096)
    assert backend.select_path(x) == "cuda"
    assert backend.select_path(x.double()) == "torch"
    for g, w in zip(ae.quantize_fp8(x, torch.tensor([3.0], device=DEVICE), layout="dual", amax="row"),
                    backend.quantize_fp8(x, torch.tensor([3.0], device=DEVICE), layout="dual", amax="row",
                                         path="torch")):
        if g.dtype == torch.float32:
            assert_same_floats(g, w)
        else:
            assert_bitwise_equal(g, w, "static, cuda vs torch path")
    for granularity in ("tensor", "row"):
        got = ae.quantize_fp8_dynamic(x, granularity=granularity)
        want = backend.quantize_fp8_dynamic(x, granularity=granularity, path="torch")
        assert_bitwise_equal(got[0], want[0], f"dynamic {granularity}")
        assert_same_floats(got[2], want[2])
    q, inv = ae.quantize_int8_per_row(x)
    tq, tinv = ae.quantize_int8_per_row(x, path="torch")
    assert_bitwise_equal(q, tq, "int8 per row")
    assert_same_floats(inv, tinv)


def test_scale_on_another_device_is_rejected():
    x = rand_x(19, 256)
    with pytest.raises(RuntimeError, match=r"astrai\.quantize: scale must be on the same device as x"):
        ops.quantize(x, torch.tensor([1.0]), check_scale=False)
    with pytest.raises(ValueError, match=r"astrai\.quantize: scale holds 0\.0"):
        ops.quantize(x, torch.tensor([0.0], device=DEVICE))


def test_smoke_test_passes():
    ops.smoke_test()
