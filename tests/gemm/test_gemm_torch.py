"""Tier 0 (CPU): the quant_gemm torch path against a float64 reference, its validation, and the policy on CPU.

Every pair, layout, batch broadcast, scale shape, bias dtype and output dtype; K = 0 and empty M / N; each
validation class raises ValueError naming the argument. Nothing here needs the gemm family's image.
"""

from __future__ import annotations

import logging

import pytest
import torch
from reference.gemm import quant_gemm as reference

import astrai.extension
from astrai.extension import _fallbacks, quant_gemm
from astrai.extension.backend import gemm as backend
from astrai.extension.ops import gemm as ops

M, N, K = 5, 12, 48
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
ALL_PAIRS = [(name, dtypes) for name, pairs in ops.PAIRS.items() for dtypes in pairs]
# One ulp of each output dtype, relative: the torch path rounds once from float32.
ULP = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-22}


def operand(dtype: torch.dtype, *shape: int) -> torch.Tensor:
    if dtype == torch.int8:
        return torch.randint(-127, 128, shape, dtype=torch.int8)
    return torch.randn(*shape).to(dtype)  # fp8: rounding randn gives exact fp8 values to upcast


def stored(layout: str, which: str, rows: int, k: int, dtype: torch.dtype, batch: int | None = None):
    """a ([M, K] or [K, M]) or b ([K, N] or [N, K]) as `layout` stores it; `rows` is M or N."""
    transposed = layout[0] == "t" if which == "a" else layout[1] == "t"
    as_k_first = transposed if which == "a" else not transposed
    shape = (k, rows) if as_k_first else (rows, k)
    return operand(dtype, *(((batch,) if batch else ()) + shape))


def scales_for(pair: str, m: int = M, n: int = N) -> dict:
    if pair == "w16a16":
        return {}
    b_scale = torch.rand(n) + 0.5
    return {"b_scale": b_scale} if pair == "w8a16" else {"a_scale": torch.rand(m) + 0.5, "b_scale": b_scale}


def check_close(out: torch.Tensor, ref: torch.Tensor, magnitude: torch.Tensor) -> None:
    """|out - ref| within one output ulp plus float32 accumulation over K of the magnitudes."""
    assert out.shape == ref.shape
    if not out.numel():
        return
    bound = ULP[out.dtype] * ref.abs() + 2.0**-20 * magnitude + 1e-6
    err = (out.double() - ref).abs()
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g}"


def run_case(a, b, layout="nt", out_dtype=torch.float32, **kw):
    out = quant_gemm(a, b, layout=layout, out_dtype=out_dtype, path="torch", **kw)
    ref = reference(a, b, layout=layout, **kw)
    mag = reference(a.double().abs(), b.double().abs(), layout=layout,
                    **{k: v.abs() for k, v in kw.items() if v is not None})
    assert out.dtype == out_dtype
    check_close(out, ref, mag)
    return out


@pytest.mark.parametrize("layout", list(ops.LAYOUTS))
@pytest.mark.parametrize("pair,dtypes", ALL_PAIRS, ids=[f"{p}-{a}-{b}" for p, (a, b) in ALL_PAIRS])
def test_every_pair_and_layout(pair, dtypes, layout):
    a = stored(layout, "a", M, K, dtypes[0])
    b = stored(layout, "b", N, K, dtypes[1])
    out = run_case(a, b, layout, **scales_for(pair))
    assert out.shape == (M, N)


def test_fp8_upcast_matmul_on_cpu():
    """The path this file leans on: fp8 -> float upcasts are exact and the CPU matmul of them works."""
    a = operand(E4M3, 4, 8)
    assert torch.equal(a.float().double(), a.double())
    assert (a.float() @ a.float().T).shape == (4, 4)


@pytest.mark.parametrize("batched", ["a", "b", "both", "expanded"])
@pytest.mark.parametrize("layout", list(ops.LAYOUTS))
def test_batch_broadcast(batched, layout):
    batch = 3
    a = stored(layout, "a", M, K, torch.int8, batch if batched in ("a", "both") else None)
    b = stored(layout, "b", N, K, torch.int8, batch if batched in ("b", "both") else None)
    if batched == "expanded":  # batch stride 0 on b
        a = stored(layout, "a", M, K, torch.int8, batch)
        b = b.unsqueeze(0).expand(batch, *b.shape)
    out = run_case(a, b, layout, **scales_for("w8a8"))
    assert out.shape == (batch, M, N)


A_SCALES = [(), (1,), (M,), (M, 1)]
B_SCALES = [(), (1,), (N,), (N, 1), (1, N)]


@pytest.mark.parametrize("a_shape", A_SCALES, ids=str)
@pytest.mark.parametrize("b_shape", B_SCALES, ids=str)
def test_scale_shapes(a_shape, b_shape):
    a, b = operand(E4M3, M, K), operand(E5M2, N, K)
    run_case(a, b, a_scale=torch.rand(a_shape) + 0.5, b_scale=torch.rand(b_shape) + 0.5)


@pytest.mark.parametrize("pair", ["fp8"])
def test_fp8_scales_optional(pair):
    a, b = operand(E4M3, M, K), operand(E4M3, N, K)
    run_case(a, b)
    run_case(a, b, b_scale=torch.rand(N))


@pytest.mark.parametrize("bias_dtype", backend.BIAS_DTYPES, ids=str)
@pytest.mark.parametrize("out_dtype", ops.OUT_DTYPES, ids=str)
def test_bias_and_out_dtypes(bias_dtype, out_dtype):
    a, b = operand(torch.bfloat16, M, K), operand(torch.int8, N, K)
    run_case(a, b, out_dtype=out_dtype, b_scale=torch.rand(N) * 0.1, bias=torch.randn(N).to(bias_dtype))


def test_int32_raw_accumulators_exact():
    a, b = operand(torch.int8, M, K), operand(torch.int8, K, N)
    out = quant_gemm(a, b, layout="nn", out_dtype=torch.int32, path="torch")
    assert out.dtype == torch.int32
    assert torch.equal(out.long(), reference(a, b, layout="nn").long())


def test_int32_accumulator_wraps():
    """K * 127 * 127 past 2^31: the int32 accumulator wraps, as the kernels' does."""
    k = 2**31 // (127 * 127) + 8
    a = torch.full((1, k), 127, dtype=torch.int8)
    b = torch.full((1, k), 127, dtype=torch.int8)
    out = quant_gemm(a, b, out_dtype=torch.int32, path="torch")
    exact = k * 127 * 127
    assert out.item() == (exact + 2**31) % 2**32 - 2**31


@pytest.mark.parametrize("with_bias", [False, True])
def test_k_zero_gives_bias_or_zeros(with_bias):
    a, b = operand(torch.int8, M, 0), operand(torch.int8, N, 0)
    bias = torch.randn(N) if with_bias else None
    scales = {"a_scale": torch.full((M,), float("inf")), "b_scale": torch.ones(N)}  # never read at K = 0
    out = quant_gemm(a, b, bias=bias, out_dtype=torch.float32, path="torch", **scales)
    want = bias.expand(M, N) if with_bias else torch.zeros(M, N)
    assert torch.equal(out, want)


@pytest.mark.parametrize("m,n", [(0, N), (M, 0), (0, 0)])
def test_empty_m_or_n(m, n):
    a, b = operand(torch.float16, m, K), operand(torch.float16, n, K)
    out = quant_gemm(a, b, out_dtype=torch.float16, path="torch")
    assert out.shape == (m, n) and out.dtype == torch.float16


def test_out_argument_written_and_returned():
    a, b = operand(torch.bfloat16, M, K), operand(torch.bfloat16, N, K)
    out = torch.empty(M, N, dtype=torch.float32)
    got = quant_gemm(a, b, out=out, path="torch")
    assert got is out
    check_close(out, reference(a, b), reference(a.abs(), b.abs()))


# --- validation: one class per rule, each naming its argument ------------------------------------------------

def _valid(**over):
    kw = dict(a=operand(torch.int8, M, K), b=operand(torch.int8, N, K), a_scale=torch.ones(M),
              b_scale=torch.ones(N), bias=None, out_dtype=torch.bfloat16)
    kw.update(over)
    return kw


INVALID = {
    "unsupported pair": (dict(b=operand(torch.float16, N, K)), r"\(a\.dtype, b\.dtype\) must be"),
    "K mismatch": (dict(b=operand(torch.int8, N, K + 1)), r"b must be \[N, K\] with K = 48"),
    "wrong rank a": (dict(a=operand(torch.int8, K)), r"a must be 2-D"),
    "wrong rank b": (dict(b=operand(torch.int8, 1, 2, N, K)), r"b must be 2-D"),
    "batch mismatch": (dict(a=operand(torch.int8, 2, M, K), b=operand(torch.int8, 3, N, K)), r"b's batch must"),
    "missing a_scale": (dict(a_scale=None), r"a_scale must be given"),
    "missing b_scale w8a16": (dict(a=operand(torch.bfloat16, M, K), a_scale=None, b_scale=None),
                              r"b_scale must be given"),
    "forbidden a_scale w8a16": (dict(a=operand(torch.bfloat16, M, K)), r"a_scale must be None"),
    "forbidden scale w16a16": (dict(a=operand(torch.bfloat16, M, K), b=operand(torch.bfloat16, N, K),
                                    a_scale=None), r"b_scale must be None"),
    "scale wrong shape": (dict(a_scale=torch.ones(M + 1)), r"a_scale must be one of .*got \[6\]"),
    "scale [1, M] for a": (dict(a_scale=torch.ones(1, M)), r"a_scale must be one of"),
    "scale wrong dtype": (dict(b_scale=torch.ones(N, dtype=torch.float16)), r"b_scale must be float32"),
    "scale not contiguous": (dict(b_scale=torch.ones(2 * N)[::2]), r"b_scale must be contiguous"),
    "bias wrong length": (dict(bias=torch.ones(N + 1)), r"bias must be \[N\] = \[12\]"),
    "bias wrong dtype": (dict(bias=torch.ones(N, dtype=torch.int32)), r"bias must be one of"),
    "int32 out with scales": (dict(out_dtype=torch.int32), r"a_scale must be None for pair 'w8a8' with out_dtype"),
    "int32 out with bias": (dict(out_dtype=torch.int32, a_scale=None, b_scale=None, bias=torch.ones(N)),
                            r"bias must be None with int32"),
    "int32 out for fp8": (dict(a=operand(E4M3, M, K), b=operand(E4M3, N, K), out_dtype=torch.int32),
                          r"out_dtype must be one of"),
    "out_dtype int8": (dict(out_dtype=torch.int8), r"out_dtype must be one of"),
    # Another device than a's (the meta device stands in for a second GPU here; tests/gpu covers CUDA vs CPU).
    "b on another device": (dict(b=operand(torch.int8, N, K).to("meta")), r"b must be on a's device cpu, got meta"),
    "a_scale on another device": (dict(a_scale=torch.ones(M, device="meta")),
                                  r"a_scale must be on a's device cpu, got meta"),
    "b_scale on another device": (dict(b_scale=torch.ones(N, device="meta")),
                                  r"b_scale must be on a's device cpu, got meta"),
    "bias on another device": (dict(bias=torch.ones(N, device="meta")), r"bias must be on a's device cpu, got meta"),
}


@pytest.mark.parametrize("case", list(INVALID))
def test_validation_names_the_argument(case):
    over, message = INVALID[case]
    kw = _valid(**over)
    with pytest.raises(ValueError, match="^quant_gemm: " + message):
        quant_gemm(kw.pop("a"), kw.pop("b"), path="torch", **kw)


def test_validation_out_and_layout():
    kw = _valid()
    a, b = kw.pop("a"), kw.pop("b")
    with pytest.raises(ValueError, match=r"^quant_gemm: out must be \[5, 12\], got \[12, 5\]"):
        quant_gemm(a, b, out=torch.empty(N, M), path="torch", **kw)
    with pytest.raises(ValueError, match=r"^quant_gemm: out\.dtype must be one of"):
        quant_gemm(a, b, out=torch.empty(M, N, dtype=torch.int8), path="torch", **kw)
    with pytest.raises(ValueError, match=r"^quant_gemm: out must be on a's device cpu, got meta"):
        quant_gemm(a, b, out=torch.empty(M, N, device="meta"), path="torch", **kw)
    with pytest.raises(ValueError, match=r"^quant_gemm: layout must be one of .*got 'xt'"):
        quant_gemm(a, b, layout="xt", path="torch", **kw)
    with pytest.raises(ValueError, match=r"^quant_gemm: path must be one of"):
        quant_gemm(a, b, path="cublas", **kw)
    with pytest.raises(ValueError, match=r"^quant_gemm: plan's recipe must be one of .*got 12"):
        quant_gemm(a, b, plan=(12, 1), path="torch", **kw)
    with pytest.raises(ValueError, match=r"^quant_gemm: plan's split_k must be an int >= 1, got 0 \(0, the last "
                                         r"wave split along K, is for recipes 4, 5 and 7-11\)"):
        quant_gemm(a, b, plan=(0, 0), path="torch", **kw)
    with pytest.raises(ValueError, match=r"^quant_gemm: plan's split_k must be an int >= 1, got -1$"):
        quant_gemm(a, b, plan=(4, -1), path="torch", **kw)
    quant_gemm(a, b, plan=(4, 0), path="torch", **kw)  # the last wave split: a plan of recipes 4 and 5
    with pytest.raises(ValueError, match=r"^quant_gemm: plan's split_k must be <= 8 for recipe 6 .*got 9"):
        quant_gemm(a, b, plan=(6, 9), path="torch", **kw)


# Per layout: K from the right dim of each operand, and the rank message naming the layout's dims.
LAYOUT_INVALID = {
    "nn": ((M, K), (K + 1, N), r"b must be \[K, N\] with K = 48 \(a's K, layout 'nn'\), got shape \[49, 12\]"),
    "tn": ((K, M), (K + 1, N), r"b must be \[K, N\] with K = 48 \(a's K, layout 'tn'\)"),
    "tt": ((K, M), (N, K + 1), r"b must be \[N, K\] with K = 48 \(a's K, layout 'tt'\)"),
    "nt": ((M, K), (N, K + 1), r"b must be \[N, K\] with K = 48 \(a's K, layout 'nt'\)"),
}


@pytest.mark.parametrize("layout", list(LAYOUT_INVALID))
def test_validation_per_layout(layout):
    a_shape, b_shape, message = LAYOUT_INVALID[layout]
    a, b = operand(torch.bfloat16, *a_shape), operand(torch.bfloat16, *b_shape)
    with pytest.raises(ValueError, match="^quant_gemm: " + message):
        quant_gemm(a, b, layout=layout, path="torch")
    want_a = ops.LAYOUT_DIMS[layout][0]
    with pytest.raises(ValueError, match=rf"^quant_gemm: a must be 2-D \{want_a[:-1]}\] .*layout '{layout}'"):
        quant_gemm(operand(torch.bfloat16, K), b, layout=layout, path="torch")


def test_validation_runs_on_every_path():
    """A call invalid on the torch path is invalid on the automatic one too, before any choice."""
    kw = _valid(a_scale=None)
    with pytest.raises(ValueError, match="a_scale must be given"):
        quant_gemm(kw.pop("a"), kw.pop("b"), **kw)


# --- the policy on the CPU --------------------------------------------------------------------------------------

def test_cpu_auto_falls_back_and_records(caplog):
    _fallbacks.reset()
    a, b = operand(torch.bfloat16, M, K), operand(torch.bfloat16, N, K)
    assert backend.select_path(a, b) == "torch"
    with caplog.at_level(logging.INFO, logger=_fallbacks.LOGGER_NAME):
        quant_gemm(a, b)
    snap = _fallbacks.snapshot()
    assert snap["total"] == 1 and snap["last"]["op"] == "quant_gemm"
    assert "a is on cpu" in snap["last"]["reason"]
    assert any("quant_gemm" in r.getMessage() for r in caplog.records)


def test_cuda_path_on_cpu_raises_with_reason():
    a, b = operand(torch.bfloat16, M, K), operand(torch.bfloat16, N, K)
    with pytest.raises(ValueError, match=r"quant_gemm\(path='cuda'\): .*a is on cpu"):
        quant_gemm(a, b, path="cuda")


def test_exported():
    assert "quant_gemm" in astrai.extension.__all__
    assert astrai.extension.quant_gemm is backend.quant_gemm


def test_memory_rule_of_the_kernels():
    """What path="auto" checks before the kernels: last-dim stride 1, 16-byte strides and base pointers."""
    base = torch.zeros(4, 16, dtype=torch.bfloat16)
    assert backend._aligned(base)
    assert not backend._aligned(torch.zeros(4, 12, dtype=torch.bfloat16))   # 24-byte rows
    assert not backend._aligned(base.t())                                  # inner stride 4
    assert not backend._aligned(base[:, 1:9])                              # base pointer off by 2 bytes
    assert backend._aligned(base.unsqueeze(0).expand(3, 4, 16))            # batch stride 0 broadcasts
    # MN-major operands ("t" a, "n" b) follow the same rule on their own last dim (M or N): a view of the
    # columns of a padded tensor qualifies, a transposed view does not.
    assert backend._aligned(torch.zeros(64, 16, dtype=torch.bfloat16)[:, :7])
    assert not backend._aligned(torch.zeros(64, 7, dtype=torch.bfloat16))
    assert not backend._aligned(torch.zeros(16, 64, dtype=torch.int8).t())


def test_no_layout_blocks_the_kernels():
    """Every layout has kernels: the blocker's reasons never name a layout (on the CPU the device comes first)."""
    a, b = operand(torch.bfloat16, K, M), operand(torch.bfloat16, K, N)
    for layout in ops.LAYOUTS:
        reason = backend._cuda_blocker(a, b, (), None, check_available=False, layout=layout)
        assert reason == "a is on cpu, not a CUDA device"


def test_fp8_unavailable_reason_reads_the_device_and_the_image(monkeypatch):
    """Why fp8 operands cannot run on the kernels (the policy's blocker and `info`'s "fp8 gemm" line), from the
    compute capability and the arch of the loaded image's fp8 code; no library is loaded."""
    from astrai.extension.ops import gemm as ops_gemm
    for cc, arch, want in (((8, 0), 90, "the GPU is sm_80; fp8 operands need sm_89 or newer"),
                           ((9, 0), -1, "no gemm library with code for this GPU"),
                           ((9, 0), 80, "no fp8 mma code for this GPU (a PTX-only compute_80 image"),
                           ((9, 0), 90, None), ((8, 9), 89, None)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None, cc=cc: cc)
        monkeypatch.setattr(ops_gemm, "fp8_code_arch_in_image", lambda index, arch=arch: arch)
        got = ops_gemm.fp8_unavailable_reason(0)
        assert (got is None) if want is None else (want in got), (cc, arch, got)


def test_info_says_where_fp8_autocast_runs_its_gemms():
    from astrai.extension import loader
    state = loader.describe()["policy"]["fp8_gemm"]
    if not torch.cuda.is_available():
        assert state == {"device": None, "runs": "torch._scaled_mm", "why": "no CUDA device"}
    assert "fp8 gemm" in loader.info() and state["runs"] in loader.info()
