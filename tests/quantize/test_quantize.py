"""Tier 0 (CPU): the quantize torch path bit-for-bit against the plain-torch reference, the reference against
known bytes, the UE8M0 layout against a bit-level model (including DeepGEMM's mn=6, packed_sf_k=3 example),
and the real image's ops without a GPU: schemas, validation messages, fake (meta) implementations.

Tests marked `requires_cuda_kernels("quantize")` need the image (`nox -s build`); without it they skip.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from reference import quantize as ref

import astrai.extension as ae
from astrai.extension.backend import quantize as backend
from astrai.extension.ops import quantize as ops
from support.schemas import assert_schema_matches

kernels = pytest.mark.requires_cuda_kernels("quantize")

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_IDS = ["e4m3", "e5m2"]
IN_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
IN_IDS = ["bf16", "fp16", "fp32"]
ROWS = (1, 19, 989)

CONTRACT_SCHEMAS = {
    "quantize": "quantize(Tensor x, Tensor scale, ScalarType out_dtype, int layout, int amax) -> (Tensor, Tensor, Tensor)",
    "quantize_dynamic": "quantize_dynamic(Tensor x, ScalarType out_dtype, int granularity, bool pow2_scale, int layout)"
                        " -> (Tensor, Tensor, Tensor)",
    "quantize_block": "quantize_block(Tensor x, ScalarType out_dtype, int block_rows, bool pow2_scale,"
                      " bool scale_mn_major) -> (Tensor, Tensor)",
    "scale_layout": "scale_layout(Tensor sf, bool pack_ue8m0) -> Tensor",
    "quantize_delayed": "quantize_delayed(Tensor x, Tensor(a!) scale, Tensor(b!) ring, Tensor(c!) pos,"
                        " Tensor(d!)? scale_inv, Tensor(e!) workspace, ScalarType out_dtype, int layout, int margin)"
                        " -> (Tensor, Tensor, Tensor, Tensor)",
}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32) if t.element_size() == 4 else t


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.dtype}{list(got.shape)} vs " \
                                                                f"{want.dtype}{list(want.shape)}"
    differ = bits(got) != bits(want)
    if bool(differ.any()):
        first = tuple(differ.nonzero()[0].tolist())
        raise AssertionError(f"{what}: {int(differ.sum())} of {got.numel()} differ; first at {first}: "
                             f"{bits(got)[first].item():#x} vs {bits(want)[first].item():#x}")


def assert_same_floats(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """Bitwise, except that any NaN equals any NaN."""
    assert got.shape == want.shape, f"{what}: {list(got.shape)} vs {list(want.shape)}"
    both_nan = torch.isnan(got) & torch.isnan(want)
    differ = (got.view(torch.int32) != want.view(torch.int32)) & ~both_nan
    assert not bool(differ.any()), f"{what}: {int(differ.sum())} differ, first at {differ.nonzero()[0].tolist()}"


def test_bitwise_check_detects_one_flip():
    t = ref.cast(torch.randn(7, 9) * 100, torch.float8_e4m3fn)
    flipped = t.view(torch.uint8).clone()
    flipped[3, 4] ^= 1
    with pytest.raises(AssertionError, match="1 of 63 differ"):
        assert_same_bits(flipped.view(t.dtype), t, "negative control")


# --- the reference against known bytes -------------------------------------------------------------------------

ANCHORS = [
    (torch.float8_e4m3fn, 448.0, 0x7E), (torch.float8_e4m3fn, 1e9, 0x7E), (torch.float8_e4m3fn, -float("inf"), 0xFE),
    (torch.float8_e4m3fn, float("nan"), 0x7F), (torch.float8_e4m3fn, -float("nan"), 0x7F),
    (torch.float8_e4m3fn, 2.0**-9, 0x01), (torch.float8_e4m3fn, 2.0**-10, 0x00), (torch.float8_e4m3fn, 3 * 2.0**-10, 0x02),
    (torch.float8_e4m3fn, -0.0, 0x80), (torch.float8_e4m3fn, 1.0625, 0x38), (torch.float8_e4m3fn, 1.1875, 0x3A),
    (torch.float8_e5m2, 57344.0, 0x7B), (torch.float8_e5m2, float("inf"), 0x7B), (torch.float8_e5m2, 61440.0, 0x7B),
    (torch.float8_e5m2, -float("nan"), 0x7F), (torch.float8_e5m2, 1.0, 0x3C), (torch.float8_e5m2, 2.0**-16, 0x01),
    (torch.int8, 2.5, 2), (torch.int8, 3.5, 4), (torch.int8, -2.5, 0xFE), (torch.int8, -200.0, 0x81),
    (torch.int8, float("nan"), 0), (torch.int8, float("inf"), 127),
]


@pytest.mark.parametrize("dtype,value,byte", ANCHORS, ids=[f"{d}-{v}" for d, v, _ in ANCHORS])
def test_reference_cast_known_bytes(dtype, value, byte):
    got = ref.cast(torch.tensor([value]), dtype)
    assert int(got.view(torch.uint8)[0]) == byte
    assert int(backend.cast_torch(torch.tensor([value]), dtype).view(torch.uint8)[0]) == byte


def test_reference_scale_rule():
    amax = torch.tensor([0.0, float("inf"), float("nan"), 3.0, 1e-45, 448.0, 1e38])
    mul, inv = ref.scale_from_amax(amax, 448.0, pow2=False)
    assert mul[:3].tolist() == [1.0, 1.0, 1.0]
    assert mul[3].item() == (torch.tensor(448.0) / torch.tensor(3.0)).item()
    assert mul[4].item() == torch.finfo(torch.float32).max  # 448 / 1e-45 overflows
    assert mul[5].item() == 1.0
    assert torch.equal(inv, 1.0 / mul)
    mul2, _ = ref.scale_from_amax(amax, 448.0, pow2=True)
    assert mul2[3].item() == 128.0 and mul2[4].item() == 2.0**127 and mul2[6].item() == 2.0**-118
    assert torch.equal(mul2, backend.scale_from_amax_torch(amax, 448.0, True)[0])


# --- the torch path against the reference ---------------------------------------------------------------------------

def make_scale(kind: str, rows: int, cols: int) -> torch.Tensor:
    if kind == "tensor":
        return torch.tensor([3.7])
    if kind == "row":
        return torch.rand(rows, 1) * 8 + 0.1
    return torch.rand(1, cols) * 8 + 0.1


@pytest.mark.parametrize("layout", ["rowwise", "transposed", "dual"])
@pytest.mark.parametrize("kind", ["tensor", "row", "column"])
@pytest.mark.parametrize("dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("in_dtype", IN_DTYPES, ids=IN_IDS)
@pytest.mark.parametrize("rows", ROWS)
def test_torch_path_static_matches_reference(rows, in_dtype, dtype, kind, layout):
    x = ref.random_input(rows, 136, in_dtype)
    scale = make_scale(kind, rows, 136)
    out, out_t, amax = backend.quantize_fp8(x, scale, out_dtype=dtype, layout=layout, amax="row")
    want = ref.quantize(x, scale, dtype)
    if layout != "transposed":
        assert_same_bits(out, want, "out")
    else:
        assert out is None
    if layout != "rowwise":
        assert_same_bits(out_t, want.t().contiguous(), "out_t")
    assert_same_floats(amax, ref.amax(x, dim=1), "amax per row")


@pytest.mark.parametrize("dtype", FP8, ids=FP8_IDS)
def test_special_values_every_one(dtype):
    vals = torch.tensor(ref.special_values(dtype) + [-v for v in ref.special_values(dtype)], dtype=torch.float32)
    x = vals.reshape(1, -1)
    out, _, _ = backend.quantize_fp8(x, torch.tensor([1.0]), out_dtype=dtype, check_scale=False)
    assert_same_bits(out, ref.quantize(x, torch.tensor([1.0]), dtype))
    nan = torch.isnan(vals)
    assert bool((out.view(torch.uint8)[0][nan] == 0x7F).all())
    assert bool((out.float()[0][~nan].abs() <= ref.FP8_MAX[dtype]).all())


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("granularity", ["tensor", "row"])
@pytest.mark.parametrize("dtype", (*FP8, torch.int8), ids=[*FP8_IDS, "int8"])
@pytest.mark.parametrize("rows", ROWS)
def test_torch_path_dynamic_matches_reference(rows, dtype, granularity, pow2):
    x = ref.random_input(rows, 200, torch.bfloat16)
    out, out_t, inv = backend.quantize_fp8_dynamic(x, out_dtype=dtype, granularity=granularity, pow2_scale=pow2)
    want, want_inv = ref.quantize_dynamic(x, dtype, granularity, pow2)
    assert out_t is None
    assert_same_bits(out, want)
    assert_same_floats(inv, want_inv, "scale_inv")
    assert inv.shape == ((rows, 1) if granularity == "row" else (1,))


def test_dynamic_zero_and_nan_rows_get_unit_scale():
    x = torch.randn(4, 64).bfloat16()
    x[1] = 0
    x[2, 5] = float("nan")
    x[3, 7] = float("inf")
    _, _, inv = backend.quantize_fp8_dynamic(x, granularity="row")
    assert inv[1:, 0].tolist() == [1.0, 1.0, 1.0]
    assert inv[0, 0].item() != 1.0


@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("block_rows", [1, 128])
@pytest.mark.parametrize("dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("rows", ROWS)
def test_torch_path_block_matches_reference(rows, dtype, block_rows, pow2):
    x = ref.random_input(rows, 384, torch.bfloat16)
    out, sf = backend.quantize_fp8_block(x, out_dtype=dtype, block_rows=block_rows, pow2_scale=pow2)
    want, want_sf = ref.quantize_block(x, dtype, block_rows, pow2)
    assert_same_bits(out, want)
    assert_same_floats(sf, want_sf, "scale_inv")
    if pow2:
        finite = torch.isfinite(sf)
        assert bool((sf[finite].view(torch.int32) & 0x7FFFFF == 0).all()), "pow2 scales have a mantissa"
    _, sf_mn = backend.quantize_fp8_block(x, out_dtype=dtype, block_rows=block_rows, pow2_scale=pow2,
                                        scale_mn_major=True)
    aligned = (sf.shape[0] + 3) // 4 * 4
    assert sf_mn.stride() == (1, aligned) and torch.equal(sf_mn, sf)


@pytest.mark.parametrize("rows", ROWS)
def test_int8_per_row_and_per_channel(rows):
    x = ref.random_input(rows, 200, torch.float32, specials=False)
    q, inv = ae.quantize_int8_per_row(x)
    want, want_inv = ref.quantize_dynamic(x, torch.int8, "row")
    assert q.dtype == torch.int8 and torch.equal(q, want) and torch.equal(inv, want_inv)
    assert int(q.min()) >= -127 and int(q.max()) <= 127
    qw, w_inv = ae.quantize_int8_per_channel(x)
    assert torch.equal(qw, q) and torch.equal(w_inv, inv)
    # dequantized error within half a step of the row's scale
    err = (q.float() * inv - x).abs()
    assert bool((err <= inv * 0.5 * (1 + 1e-5) + 1e-30).all())


# --- UE8M0 / MN-major layout ---------------------------------------------------------------------------------------

def test_scale_layout_document_example_mn6_packed_sf_k3():
    """mn = 6, sf_k = 10 -> packed_sf_k = 3: three slices of align(6, 4) = 8 int32 each; rows 6, 7 are padding."""
    exps = torch.randint(100, 150, (6, 10))
    sf = (exps - 127).double().exp2().float()
    packed = ae.fp8_scale_layout(sf, pack_ue8m0=True)
    assert packed.dtype == torch.int32 and packed.shape == (6, 3) and packed.stride() == (1, 8)
    storage = torch.as_strided(packed, (3, 8), (8, 1))  # the three slices, padding included
    model = ref.ue8m0_pack_bitwise(sf)
    for i in range(6):
        for k in range(3):
            assert int(packed[i, k]) & 0xFFFFFFFF == model[i][k]
            assert int(storage[k, i]) & 0xFFFFFFFF == model[i][k]
            for j in range(4):
                byte = (int(packed[i, k]) >> (8 * j)) & 0xFF
                assert byte == (int(exps[i, 4 * k + j]) if 4 * k + j < 10 else 0)
    assert storage[:, 6:].eq(0).all()  # padding written as zero


@pytest.mark.parametrize("mn,sf_k", [(1, 1), (4, 4), (13, 5), (128, 56), (6, 12)])
def test_scale_layout_plain_and_packed(mn, sf_k):
    sf = (torch.randint(-126, 127, (mn, sf_k))).double().exp2().float()
    plain = ae.fp8_scale_layout(sf)
    aligned = (mn + 3) // 4 * 4
    assert plain.stride() == (1, aligned) and torch.equal(plain, sf)
    packed = ae.fp8_scale_layout(sf.t().contiguous().t(), pack_ue8m0=True)  # an MN-major input works too
    model = ref.ue8m0_pack_bitwise(sf)
    got = [[int(v) & 0xFFFFFFFF for v in row] for row in packed.tolist()]
    assert got == model


# --- the public API's policy on CPU ---------------------------------------------------------------------------------

def test_public_api_falls_back_to_torch_on_cpu():
    x = torch.randn(19, 128).bfloat16()
    assert backend.select_path(x) == "torch"
    with pytest.raises(ValueError, match=r"path='cuda'.*not a CUDA device"):
        ae.quantize_fp8(x, torch.tensor([1.0]), path="cuda")
    with pytest.raises(ValueError, match="path must be one of"):
        ae.quantize_fp8(x, torch.tensor([1.0]), path="triton")


BAD_PUBLIC = [
    (lambda x: ae.quantize_fp8(x, torch.tensor([0.0])), "quantize_fp8: scale holds 0.0"),
    (lambda x: ae.quantize_fp8(x, torch.tensor([float("inf")])), "quantize_fp8: scale holds inf"),
    (lambda x: ae.quantize_fp8(x, torch.tensor([float("nan")])), "quantize_fp8: scale holds nan"),
    (lambda x: ae.quantize_fp8(x, torch.ones(3, 1)), r"quantize_fp8: scale must be"),
    (lambda x: ae.quantize_fp8(x, torch.ones(1), out_dtype=torch.float16), "quantize_fp8: out_dtype must be"),
    (lambda x: ae.quantize_fp8(x, torch.ones(1), out_dtype=torch.int8, layout="dual"), "int8 output is row-major only"),
    (lambda x: ae.quantize_fp8(x, torch.ones(1), layout="sideways"), "layout must be one of"),
    (lambda x: ae.quantize_fp8_dynamic(x, granularity="row", layout="transposed"), "row-major only"),
    (lambda x: ae.quantize_fp8_dynamic(x, granularity="block"), "granularity must be one of"),
    (lambda x: ae.quantize_fp8_block(x[:, :100]), "block size 128 does not divide N = 100"),
    (lambda x: ae.quantize_fp8_block(x, block_rows=64), "block_rows must be 1 or 128"),
    (lambda x: ae.quantize_fp8_block(x, out_dtype=torch.int8), "quantize_fp8_block: out_dtype must be torch.float8"),
]


@pytest.mark.parametrize("index", range(len(BAD_PUBLIC)))
def test_public_api_rejects_bad_input(index):
    call, message = BAD_PUBLIC[index]
    with pytest.raises(ValueError, match=message):
        call(torch.randn(19, 128).bfloat16())


def test_empty_inputs_on_torch_path():
    x = torch.randn(0, 128).bfloat16()
    out, out_t, amax = backend.quantize_fp8(x, torch.tensor([1.0]), layout="dual", amax="tensor")
    assert out.shape == (0, 128) and out_t.shape == (128, 0) and amax.tolist() == [0.0]
    q, _, inv = backend.quantize_fp8_dynamic(x, granularity="row")
    assert q.shape == (0, 128) and inv.shape == (0, 1)
    q, sf = backend.quantize_fp8_block(x, block_rows=128)
    assert q.shape == (0, 128) and sf.shape == (0, 1)


def test_3d_input_keeps_its_shape():
    x = torch.randn(2, 19, 128).bfloat16()
    out, _, _ = backend.quantize_fp8(x, torch.tensor([2.0]))
    assert out.shape == x.shape
    assert_same_bits(out.view(38, 128), ref.quantize(x.view(38, 128), torch.tensor([2.0]), torch.float8_e4m3fn))


def test_import_loads_no_kernel():
    code = ("import torch, astrai.extension, astrai.extension.ops, astrai.extension.backend\n"
            "import astrai.extension.quantize\n"
            "from astrai.extension import loader\n"
            "assert not loader.loaded_families(), loader.loaded_families()\n"
            "assert not torch._C._jit_get_schemas_for_operator('astrai::quantize')\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


# --- the real image on a CPU machine --------------------------------------------------------------------------------

@kernels
@pytest.mark.parametrize("name", list(CONTRACT_SCHEMAS))
def test_schema_matches_contract(name):
    assert_schema_matches(ops.load, name, CONTRACT_SCHEMAS)


def _strided_last(t: torch.Tensor) -> torch.Tensor:
    wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


E4M3 = torch.float8_e4m3fn
# (op, argument the message must name, what, call on valid CPU x [19, 256] bf16)
BAD_OPS = [
    ("quantize", "x", "dtype", lambda x: torch.ops.astrai.quantize(x.double(), torch.ones(1), E4M3, 0, 0)),
    ("quantize", "x", "rank", lambda x: torch.ops.astrai.quantize(x[0], torch.ones(1), E4M3, 0, 0)),
    ("quantize", "x", "last stride", lambda x: torch.ops.astrai.quantize(_strided_last(x), torch.ones(1), E4M3, 0, 0)),
    ("quantize", "scale", "dtype", lambda x: torch.ops.astrai.quantize(x, torch.ones(1).double(), E4M3, 0, 0)),
    ("quantize", "scale", "shape", lambda x: torch.ops.astrai.quantize(x, torch.ones(3), E4M3, 0, 0)),
    ("quantize", "scale", "row shape", lambda x: torch.ops.astrai.quantize(x, torch.ones(18, 1), E4M3, 0, 0)),
    ("quantize", "scale", "column shape", lambda x: torch.ops.astrai.quantize(x, torch.ones(1, 255), E4M3, 0, 0)),
    ("quantize", "scale", "row stride", lambda x: torch.ops.astrai.quantize(x, torch.ones(19, 2)[:, :1], E4M3, 0, 0)),
    ("quantize", "out_dtype", "float16", lambda x: torch.ops.astrai.quantize(x, torch.ones(1), torch.float16, 0, 0)),
    ("quantize", "out_dtype", "int8 transposed", lambda x: torch.ops.astrai.quantize(x, torch.ones(1), torch.int8, 1, 0)),
    ("quantize", "layout", "3", lambda x: torch.ops.astrai.quantize(x, torch.ones(1), E4M3, 3, 0)),
    ("quantize", "amax", "5", lambda x: torch.ops.astrai.quantize(x, torch.ones(1), E4M3, 0, 5)),
    ("quantize_dynamic", "x", "dtype", lambda x: torch.ops.astrai.quantize_dynamic(x.int(), E4M3, 0, False, 0)),
    ("quantize_dynamic", "granularity", "2", lambda x: torch.ops.astrai.quantize_dynamic(x, E4M3, 2, False, 0)),
    ("quantize_dynamic", "layout", "row transposed", lambda x: torch.ops.astrai.quantize_dynamic(x, E4M3, 1, False, 1)),
    ("quantize_dynamic", "out_dtype", "bf16", lambda x: torch.ops.astrai.quantize_dynamic(x, torch.bfloat16, 0, False, 0)),
    ("quantize_block", "block_rows", "64", lambda x: torch.ops.astrai.quantize_block(x, E4M3, 64, False, False)),
    ("quantize_block", "N", "does not divide", lambda x: torch.ops.astrai.quantize_block(x[:, :200], E4M3, 1, False, False)),
    ("quantize_block", "out_dtype", "int8", lambda x: torch.ops.astrai.quantize_block(x, torch.int8, 1, False, False)),
    ("quantize_block", "x", "rank", lambda x: torch.ops.astrai.quantize_block(x[None], E4M3, 1, False, False)),
    ("scale_layout", "sf", "dtype", lambda x: torch.ops.astrai.scale_layout(x, True)),
    ("scale_layout", "sf", "rank", lambda x: torch.ops.astrai.scale_layout(x[0].float(), True)),
]


@kernels
@pytest.mark.parametrize("name,argument,what,call", BAD_OPS, ids=[f"{n}-{a}-{w}" for n, a, w, _ in BAD_OPS])
def test_op_validation_names_op_and_argument(name, argument, what, call):
    ops.load()
    with pytest.raises(RuntimeError) as info:
        call(torch.randn(19, 256).bfloat16())
    message = str(info.value)
    assert re.search(rf"astrai\.{name}:", message), f"op name {name} not in: {message}"
    assert re.search(rf"\b{argument}\b", message), f"argument {argument} not in: {message}"
    assert "must be a CUDA tensor" not in message, f"validation ran after the device check: {message}"


VALID_CALLS = {
    "quantize": lambda x: torch.ops.astrai.quantize(x, torch.ones(1), E4M3, 2, 1),
    "quantize_dynamic": lambda x: torch.ops.astrai.quantize_dynamic(x, E4M3, 1, True, 0),
    "quantize_block": lambda x: torch.ops.astrai.quantize_block(x, E4M3, 128, True, True),
    "scale_layout": lambda x: torch.ops.astrai.scale_layout(x.float(), True),
}


@kernels
@pytest.mark.parametrize("name", list(VALID_CALLS))
def test_op_on_cpu_raises_must_be_cuda(name):
    ops.load()
    with pytest.raises(RuntimeError, match=rf"astrai\.{name}: .*must be a CUDA tensor"):
        VALID_CALLS[name](torch.randn(19, 256).bfloat16())


@kernels
@pytest.mark.parametrize("bad", [0.0, float("inf"), float("nan")])
def test_ops_scale_value_check_before_launch(bad):
    ops.load()
    x = torch.randn(19, 256).bfloat16()
    with pytest.raises(ValueError, match=rf"^astrai\.quantize: scale holds {bad}"):
        ops.quantize(x, torch.tensor([bad]))
    with pytest.raises(RuntimeError, match="must be a CUDA tensor"):  # unchecked: reaches the op
        ops.quantize(x, torch.tensor([bad]), check_scale=False)


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@kernels
@pytest.mark.parametrize("rows", [0, 1, 19, 989])
def test_fake_outputs_on_meta(rows):
    ops.load()
    x = _meta(rows, 384)
    out, out_t, amax = ops.quantize(x, _meta(rows, 1, dtype=torch.float32), E4M3, layout="dual", amax="row")
    assert out.shape == (rows, 384) and out.dtype == E4M3 and out_t.shape == (384, rows) and amax.shape == (rows,)
    out, out_t, inv = ops.quantize_dynamic(x, torch.int8, granularity="row")
    assert out.dtype == torch.int8 and out_t is None and inv.shape == (rows, 1)
    out, out_t, inv = ops.quantize_dynamic(x, E4M3, granularity="tensor", layout="transposed")
    assert out is None and out_t.shape == (384, rows) and inv.shape == (1,)
    for block_rows in (1, 128):
        q, sf = ops.quantize_block(x, E4M3, block_rows=block_rows, scale_mn_major=True)
        sf_rows = -(-rows // block_rows)
        assert q.shape == (rows, 384) and sf.shape == (sf_rows, 3)
        if sf_rows > 1:
            assert sf.stride() == (1, (sf_rows + 3) // 4 * 4)
    packed = ops.scale_layout(_meta(rows, 10, dtype=torch.float32), pack_ue8m0=True)
    assert packed.dtype == torch.int32 and packed.shape == (rows, 3)
    if rows > 1:
        assert packed.stride() == (1, (rows + 3) // 4 * 4)


@kernels
def test_fake_outputs_under_fake_cuda_tensors():
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops.load()
    with FakeTensorMode():
        x = torch.empty(989, 4096, dtype=torch.bfloat16, device="cuda")
        out, out_t, inv = torch.ops.astrai.quantize_dynamic(x, E4M3, 0, False, 2)
        assert out.device.type == "cuda" and out.shape == (989, 4096) and out_t.shape == (4096, 989)
        q, sf = torch.ops.astrai.quantize_block(x, E4M3, 1, True, True)
        assert sf.shape == (989, 32) and sf.stride() == (1, 992)


@kernels
@pytest.mark.parametrize("name", list(CONTRACT_SCHEMAS))
def test_opcheck_on_meta(name):
    """On meta inputs opcheck only proves the op and its fake accept the arguments; tests/gpu runs it for real."""
    ops.load()
    x = _meta(19, 256)
    args = {"quantize": (x, _meta(1, dtype=torch.float32), E4M3, 2, 1),
            "quantize_dynamic": (x, E4M3, 1, False, 0),
            "quantize_block": (x, E4M3, 128, True, True),
            "scale_layout": (_meta(19, 9, dtype=torch.float32), True),
            "quantize_delayed": (x, _meta(1, dtype=torch.float32), _meta(16, dtype=torch.float32),
                                 _meta(1, dtype=torch.int64), None, _meta(1, dtype=torch.int32), E4M3, 2, 0)}[name]
    # The in-place op (its fake mutates nothing on meta) is checked for its schema and fake only here.
    utils = ("test_schema", "test_faketensor") if name == "quantize_delayed" else None
    if utils:
        torch.library.opcheck(getattr(torch.ops.astrai, name).default, args, test_utils=utils)
    else:
        torch.library.opcheck(getattr(torch.ops.astrai, name).default, args)

