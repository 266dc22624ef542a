"""Tier 0 (CPU): the rotary torch path against a float64 reference, the public API's policy on CPU, and the
real image's ops without a GPU: schemas, validation messages, fake (meta) implementations, torch.compile.

Tests marked `requires_cuda_kernels("rotary")` need the image (`nox -s build`); without it they skip.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from reference.rotary import random_freqs, rotary

from astrai.extension import apply_rotary_emb, apply_rotary_emb_qk, rotary_cos_sin_cache
from astrai.extension.backend import rotary as backend
from astrai.extension.ops import rotary as ops
from support.schemas import assert_schema_matches

kernels = pytest.mark.requires_cuda_kernels("rotary")

CONTRACT_SCHEMAS = {
    "rotary_embedding":
        "rotary_embedding(Tensor q, Tensor cos, Tensor sin, Tensor? positions, bool interleaved) -> Tensor",
    "rotary_embedding_qk":
        "rotary_embedding_qk(Tensor q, Tensor k, Tensor cos, Tensor sin, Tensor? positions, bool interleaved)"
        " -> (Tensor, Tensor)",
    "rotary_embedding_":
        "rotary_embedding_(Tensor(a!) q, Tensor(b!)? k, Tensor cos, Tensor sin, Tensor? positions,"
        " bool interleaved) -> ()",
}


def make_case(layout: str, tokens: int, heads: int, head_dim: int, freqs: str, *, dtype=torch.float32,
              device="cpu", max_pos: int = 1024):
    """x, (cos, sin), positions for one layout ("3d": [T, H, D]; "4d": [2, T, H, D]) and freqs mode:
    "token" per-token cos/sin, "shared" [S, D/2] for a 4-D batch, "int32"/"int64" a cache plus positions."""
    lead = (tokens,) if layout == "3d" else (2, tokens)
    x = torch.randn(*lead, heads, head_dim, device=device).to(dtype)
    half = head_dim // 2
    if freqs == "token":
        cos, sin = random_freqs(lead[0] * (lead[1] if len(lead) == 2 else 1), half, device=device)
        return x, (cos.view(*lead, half), sin.view(*lead, half)), None
    if freqs == "shared":
        cos, sin = random_freqs(tokens, half, device=device)
        return x, (cos, sin), None
    cos, sin = random_freqs(max_pos, half, device=device)
    positions = torch.randint(0, max_pos, lead, device=device, dtype=getattr(torch, freqs))
    return x, (cos, sin), positions


def max_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return (out.double() - ref.double()).abs().max().item() if out.numel() else 0.0


# --- the torch path against the float64 reference ----------------------------------------------------------

CASES = [(layout, freqs) for layout in ("3d", "4d") for freqs in ("token", "int32", "int64")] + [("4d", "shared")]


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
@pytest.mark.parametrize("layout,freqs", CASES)
@pytest.mark.parametrize("tokens", [1, 19, 989])
def test_torch_path_float32_matches_float64(tokens, layout, freqs, interleaved):
    x, (cos, sin), positions = make_case(layout, tokens, 3, 64, freqs)
    out = apply_rotary_emb(x, (cos, sin), positions, interleaved=interleaved)
    ref = rotary(x, cos, sin, positions, interleaved=interleaved)
    assert out.dtype == torch.float32 and out.shape == x.shape
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
@pytest.mark.parametrize("head_dim", [34, 128])
@pytest.mark.parametrize("tokens", [1, 19, 989])
def test_torch_path_low_precision_within_2x_baseline(tokens, head_dim, interleaved, dtype):
    x, (cos, sin), positions = make_case("3d", tokens, 8, head_dim, "int64", dtype=dtype)
    out = apply_rotary_emb(x, (cos, sin), positions, interleaved=interleaved)
    truth = rotary(x, cos, sin, positions, interleaved=interleaved)
    baseline = rotary(x, cos, sin, positions, interleaved=interleaved, upcast=False)
    assert out.dtype == dtype
    assert max_err(out, truth) <= 2 * max_err(baseline, truth)
    # computed in float32 and rounded once: within half an ulp of the truth, plus float32 slack
    eps = torch.finfo(dtype).eps
    assert bool(((out.double() - truth).abs() <= truth.abs() * eps / 2 + 1e-5).all())


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
@pytest.mark.parametrize("freqs", ["token", "int64", "shared"])
def test_torch_path_gradcheck(freqs, interleaved):
    layout = "4d" if freqs == "shared" else "3d"
    x, (cos, sin), positions = make_case(layout, 3, 2, 6, freqs, dtype=torch.float64, max_pos=5)
    x.requires_grad_()
    cos, sin = cos.double().requires_grad_(), sin.double().requires_grad_()
    assert backend.select_path(x, (cos, sin)) == "torch"
    torch.autograd.gradcheck(lambda x, c, s: apply_rotary_emb(x, (c, s), positions, interleaved=interleaved),
                             (x, cos, sin))


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_torch_path_grads_match_reference(interleaved):
    x, (cos, sin), positions = make_case("4d", 19, 3, 64, "int32")
    x.requires_grad_()
    grad_out = torch.randn_like(x)
    (apply_rotary_emb(x, (cos, sin), positions, interleaved=interleaved) * grad_out).sum().backward()
    x64 = x.detach().double().requires_grad_()
    (rotary(x64, cos, sin, positions, interleaved=interleaved) * grad_out.double()).sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.float32
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-6, atol=1e-6)


# --- the public API's policy on CPU --------------------------------------------------------------------------

def test_public_api_falls_back_to_torch_on_cpu():
    x, (cos, sin), positions = make_case("3d", 19, 4, 64, "int64", dtype=torch.bfloat16)
    assert backend.select_path(x, (cos, sin)) == "torch"
    auto = apply_rotary_emb(x, (cos, sin), positions)
    forced = apply_rotary_emb(x, (cos, sin), positions, path="torch")
    assert torch.equal(auto, forced)
    with pytest.raises(ValueError, match=r"path='cuda'.*not a CUDA device"):
        apply_rotary_emb(x, (cos, sin), positions, path="cuda")
    with pytest.raises(ValueError, match="path must be one of"):
        apply_rotary_emb(x, (cos, sin), positions, path="triton")


def test_select_path_names_every_blocker():
    x, (cos, sin), _ = make_case("3d", 4, 2, 8, "token", dtype=torch.bfloat16)
    assert "not a CUDA device" in backend._cuda_blocker(x, None, cos, sin, False)
    x.requires_grad_()
    assert backend.select_path(x, (cos, sin)) == "torch"


@pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
def test_qk_and_inplace_on_torch_path(interleaved):
    q, (cos, sin), positions = make_case("3d", 19, 8, 64, "int64", dtype=torch.bfloat16)
    k = torch.randn(19, 2, 64).to(torch.bfloat16)
    q_out, k_out = apply_rotary_emb_qk(q, k, (cos, sin), positions, interleaved=interleaved)
    assert torch.equal(q_out, apply_rotary_emb(q, (cos, sin), positions, interleaved=interleaved))
    assert torch.equal(k_out, apply_rotary_emb(k, (cos, sin), positions, interleaved=interleaved))
    qkv = torch.cat([q, k, torch.randn(19, 2, 64).to(torch.bfloat16)], dim=1)  # [T, 12, D]
    v_before = qkv[:, 10:].clone()
    q_view, k_view = qkv[:, :8], qkv[:, 8:10]
    got_q, got_k = apply_rotary_emb_qk(q_view, k_view, (cos, sin), positions, interleaved=interleaved,
                                       inplace=True)
    assert got_q is q_view and got_k is k_view
    assert torch.equal(qkv[:, :8], q_out) and torch.equal(qkv[:, 8:10], k_out)
    assert torch.equal(qkv[:, 10:], v_before)


def test_empty_tokens_on_torch_path():
    x, (cos, sin), positions = make_case("3d", 0, 4, 64, "int64")
    assert apply_rotary_emb(x, (cos, sin), positions).shape == (0, 4, 64)


def test_bf16_freqs_are_accepted_on_torch_path():
    x, (cos, sin), positions = make_case("3d", 19, 4, 64, "int64")
    out = apply_rotary_emb(x, (cos.bfloat16(), sin.bfloat16()), positions)
    ref = rotary(x, cos.bfloat16(), sin.bfloat16(), positions)
    torch.testing.assert_close(out.double(), ref, rtol=1e-6, atol=1e-6)


BAD_PUBLIC = {
    "rank": (lambda x, c, s, p: (x[0], (c, s), p), r"x must be \[T, H, D\] or \[B, S, H, D\]"),
    "odd head_dim": (lambda x, c, s, p: (x[..., :7], (c[:, :3], s[:, :3]), p), "head_dim must be even"),
    "cos columns": (lambda x, c, s, p: (x, (torch.rand(16, 5), torch.rand(16, 5)), p), "head_dim/2 = 4 columns"),
    "cos vs sin": (lambda x, c, s, p: (x, (c, s[:-1]), p), "cos and sin must have one shape"),
    "positions dtype": (lambda x, c, s, p: (x, (c, s), p.float()), "positions must be int32 or int64"),
    "positions shape": (lambda x, c, s, p: (x, (c, s), p[:-1]), r"positions must be \[5\]"),
    "cache rank": (lambda x, c, s, p: (x, (c[None], s[None]), p), "cos must be a cache"),
    "per-token rows": (lambda x, c, s, p: (x, (c[:6], s[:6]), None), "cos must be per token"),
    "freqs_cis": (lambda x, c, s, p: (x, c, p), r"freqs_cis must be a pair \(cos, sin\)"),
}


@pytest.mark.parametrize("case", list(BAD_PUBLIC))
def test_public_api_rejects_bad_shapes(case):
    x, (cos, sin), positions = make_case("3d", 5, 2, 8, "int64", max_pos=16)
    make_args, message = BAD_PUBLIC[case]
    with pytest.raises(ValueError, match=rf"apply_rotary_emb: .*{message}"):
        apply_rotary_emb(*make_args(x, cos, sin, positions))


def test_public_api_qk_rejects_mismatched_k():
    q, (cos, sin), positions = make_case("3d", 5, 2, 8, "int64", max_pos=16)
    with pytest.raises(ValueError, match=r"apply_rotary_emb_qk: k must be \[5, Hk, 8\]"):
        apply_rotary_emb_qk(q, torch.randn(6, 2, 8), (cos, sin), positions)


@pytest.mark.parametrize("bad", [-1, 16, 1 << 40])
def test_public_api_positions_range_check(bad):
    x, (cos, sin), positions = make_case("3d", 5, 2, 8, "int64", max_pos=16)
    positions[3] = bad
    with pytest.raises(ValueError, match=rf"apply_rotary_emb: positions holds {bad}, outside .*\[0, 16\)"):
        apply_rotary_emb(x, (cos, sin), positions)
    if bad >= 16:  # unchecked: torch's own indexing rules (a negative position counts from the end)
        with pytest.raises((IndexError, RuntimeError)):
            apply_rotary_emb(x, (cos, sin), positions, check_positions=False)


def test_public_api_compiles_fullgraph_on_torch_path():
    x, (cos, sin), positions = make_case("4d", 19, 4, 64, "int32")

    def f(x, cos, sin, positions):
        return apply_rotary_emb(x, (cos, sin), positions, interleaved=True)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, cos, sin, positions), f(x, cos, sin, positions), rtol=0, atol=0)


# --- rotary_cos_sin_cache ------------------------------------------------------------------------------------

def test_cos_sin_cache_values():
    cos, sin = rotary_cos_sin_cache(4096, 128, base=500000.0)
    assert cos.shape == sin.shape == (4096, 64) and cos.dtype == sin.dtype == torch.float32
    inv_freq = 500000.0 ** (-torch.arange(0, 128, 2, dtype=torch.float64) / 128)
    angles = torch.arange(4096, dtype=torch.float64)[:, None] * inv_freq
    assert torch.equal(cos, angles.cos().float()) and torch.equal(sin, angles.sin().float())
    assert torch.equal(cos[0], torch.ones(64)) and torch.equal(sin[0], torch.zeros(64))
    with pytest.raises(ValueError, match="head_dim must be positive and even"):
        rotary_cos_sin_cache(16, 7)


# --- import safety (no image needed) ------------------------------------------------------------------------

def test_import_loads_no_kernel():
    code = ("import torch, astrai.extension, astrai.extension.ops, astrai.extension.backend\n"
            "from astrai.extension import loader\n"
            "assert not loader.loaded_families(), loader.loaded_families()\n"
            "assert not torch._C._jit_get_schemas_for_operator('astrai::rotary_embedding')\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


# --- the real image on a CPU machine --------------------------------------------------------------------------

@kernels
@pytest.mark.parametrize("name", list(CONTRACT_SCHEMAS))
def test_schema_matches_contract(name):
    assert_schema_matches(ops.load, name, CONTRACT_SCHEMAS)


def _valid(tokens=5, heads_q=4, heads_k=2, head_dim=8, max_pos=16):
    q = torch.randn(tokens, heads_q, head_dim).bfloat16()
    k = torch.randn(tokens, heads_k, head_dim).bfloat16()
    cos, sin = random_freqs(max_pos, head_dim // 2)
    positions = torch.randint(0, max_pos, (tokens,))
    return dict(q=q, k=k, cos=cos, sin=sin, positions=positions)


def _strided_last(t: torch.Tensor) -> torch.Tensor:
    """Same shape as t, last-dim stride 2."""
    wide = torch.empty(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


# (op, argument the message must name, change to the valid arguments)
BAD_OPS = [
    ("rotary_embedding", "q", "dtype", lambda a: a.update(q=a["q"].float())),
    ("rotary_embedding", "q", "rank", lambda a: a.update(q=a["q"][0])),
    ("rotary_embedding", "q", "odd head_dim",
     lambda a: a.update(q=torch.randn(5, 4, 7).bfloat16(), cos=a["cos"][:, :3], sin=a["sin"][:, :3])),
    ("rotary_embedding", "q", "last stride", lambda a: a.update(q=_strided_last(a["q"]))),
    ("rotary_embedding", "cos", "columns", lambda a: a.update(cos=torch.rand(16, 5))),
    ("rotary_embedding", "sin", "columns", lambda a: a.update(sin=torch.rand(16, 5))),
    ("rotary_embedding", "cos", "dtype", lambda a: a.update(cos=a["cos"].double())),
    ("rotary_embedding", "sin", "dtype", lambda a: a.update(sin=a["sin"].bfloat16())),
    ("rotary_embedding", "cos", "rank", lambda a: a.update(cos=a["cos"][None])),
    ("rotary_embedding", "cos", "last stride", lambda a: a.update(cos=_strided_last(a["cos"]))),
    ("rotary_embedding", "cos", "per-token rows", lambda a: a.update(cos=a["cos"][:6], sin=a["sin"][:6],
                                                                      positions=None)),
    ("rotary_embedding", "positions", "dtype", lambda a: a.update(positions=a["positions"].float())),
    ("rotary_embedding", "positions", "rank", lambda a: a.update(positions=a["positions"][:, None])),
    ("rotary_embedding", "positions", "T", lambda a: a.update(positions=torch.zeros(6, dtype=torch.int64))),
    ("rotary_embedding_qk", "k", "T", lambda a: a.update(k=torch.randn(6, 2, 8).bfloat16())),
    ("rotary_embedding_qk", "k", "head_dim", lambda a: a.update(k=torch.randn(5, 2, 10).bfloat16())),
    ("rotary_embedding_qk", "k", "dtype", lambda a: a.update(k=a["k"].half())),
    ("rotary_embedding_qk", "k", "last stride", lambda a: a.update(k=_strided_last(a["k"]))),
    ("rotary_embedding_qk", "positions", "T", lambda a: a.update(positions=torch.zeros(4, dtype=torch.int64))),
    ("rotary_embedding_", "q", "dtype", lambda a: a.update(q=a["q"].float())),
    ("rotary_embedding_", "k", "T", lambda a: a.update(k=torch.randn(6, 2, 8).bfloat16())),
    ("rotary_embedding_", "k", "last stride", lambda a: a.update(k=_strided_last(a["k"]))),
    ("rotary_embedding_", "positions", "T", lambda a: a.update(positions=torch.zeros(4, dtype=torch.int32))),
]


def _call_op(name: str, a: dict, interleaved: bool = False):
    op = getattr(torch.ops.astrai, name)
    if name == "rotary_embedding":
        return op(a["q"], a["cos"], a["sin"], a["positions"], interleaved)
    return op(a["q"], a["k"], a["cos"], a["sin"], a["positions"], interleaved)


@kernels
@pytest.mark.parametrize("name,argument,what,change", BAD_OPS,
                         ids=[f"{n}-{arg}-{what}" for n, arg, what, _ in BAD_OPS])
def test_op_validation_names_op_and_argument(name, argument, what, change):
    ops.load()
    args = _valid()
    change(args)
    with pytest.raises(RuntimeError) as info:
        _call_op(name, args)
    message = str(info.value)
    assert re.search(rf"\b{re.escape(name)}\b", message), f"op name {name} not in: {message}"
    assert re.search(rf"\b{argument}\b", message), f"argument {argument} not in: {message}"
    assert "must be a CUDA tensor" not in message, f"validation ran after the device check: {message}"


@kernels
@pytest.mark.parametrize("name", list(CONTRACT_SCHEMAS))
def test_op_on_cpu_raises_must_be_cuda(name):
    ops.load()
    with pytest.raises(RuntimeError, match="must be a CUDA tensor") as info:
        _call_op(name, _valid())
    assert re.search(rf"\b{re.escape(name)}\b", str(info.value))


@kernels
@pytest.mark.parametrize("bad", [-3, 16])
@pytest.mark.parametrize("call", ["single", "qk", "inplace"])
def test_ops_positions_range_check_before_launch(call, bad):
    ops.load()
    a = _valid()
    a["positions"][2] = bad
    q_before = a["q"].clone()
    fn = {"single": lambda **kw: ops.rotary_embedding(a["q"], a["cos"], a["sin"], a["positions"], **kw),
          "qk": lambda **kw: ops.rotary_embedding_qk(a["q"], a["k"], a["cos"], a["sin"], a["positions"], **kw),
          "inplace": lambda **kw: ops.rotary_embedding_(a["q"], a["k"], a["cos"], a["sin"], a["positions"], **kw)}
    op = {"single": ops.OP, "qk": ops.OP_QK, "inplace": ops.OP_INPLACE}[call]
    with pytest.raises(ValueError, match=rf"^{re.escape(op)}: positions holds {bad}, outside .*\[0, 16\)"):
        fn[call]()
    assert torch.equal(a["q"], q_before)
    with pytest.raises(RuntimeError, match="must be a CUDA tensor"):  # unchecked: reaches the op
        fn[call](check_positions=False)


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@kernels
@pytest.mark.parametrize("layout", ["3d", "4d"])
def test_fake_outputs_on_meta(layout):
    ops.load()
    lead = (19,) if layout == "3d" else (2, 19)
    qkv = _meta(*lead, 48, 136)
    q, k = qkv[..., :32, :128], qkv[..., 32:40, :128]  # strided views
    cos, sin = _meta(4096, 64, dtype=torch.float32), _meta(4096, 64, dtype=torch.float32)
    positions = _meta(*lead, dtype=torch.int64)
    out = ops.rotary_embedding(q, cos, sin, positions)
    q_out, k_out = ops.rotary_embedding_qk(q, k, cos, sin, positions, interleaved=True)
    for got, want in ((out, q), (q_out, q), (k_out, k)):
        assert got.shape == want.shape and got.dtype == torch.bfloat16 and got.is_meta
        assert got.is_contiguous()
    assert ops.rotary_embedding_(q, k, cos, sin, positions) is None
    assert ops.rotary_embedding_(q, None, cos, sin, positions) is None


@kernels
def test_fake_outputs_under_fake_cuda_tensors():
    """FakeTensorMode builds CUDA-device fakes without a GPU: what torch.compile sees when tracing."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    ops.load()
    with FakeTensorMode():
        # q, k laid out like views into a qkv buffer [989, 48, 128] (slicing a fake CUDA tensor needs CUDA torch)
        q = torch.empty_strided((989, 32, 128), (48 * 128, 128, 1), dtype=torch.bfloat16, device="cuda")
        k = torch.empty_strided((989, 8, 128), (48 * 128, 128, 1), dtype=torch.bfloat16, device="cuda")
        cos = torch.empty(4096, 64, device="cuda")
        positions = torch.empty(989, dtype=torch.int32, device="cuda")
        q_out, k_out = torch.ops.astrai.rotary_embedding_qk(q, k, cos, cos, positions, False)
        assert q_out.device.type == "cuda" and q_out.shape == (989, 32, 128) and q_out.stride() == (4096, 128, 1)
        assert k_out.shape == (989, 8, 128) and k_out.is_contiguous()
        assert torch.ops.astrai.rotary_embedding_(q, None, cos, cos, positions, True) is None


@kernels
def test_inplace_wrapper_rejects_unmergeable_4d():
    ops.load()
    buf = _meta(2, 24, 8, 64)
    q = buf[:, :19]  # stride(0) = 24 * stride(1): B and S do not merge
    cos = _meta(4096, 32, dtype=torch.float32)
    positions = _meta(2, 19, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"astrai\.rotary_embedding_: q of shape \[2, 19, 8, 64\].*cannot be viewed"):
        ops.rotary_embedding_(q, None, cos, cos, positions)
    assert ops.rotary_embedding(q, cos, cos, positions).shape == (2, 19, 8, 64)  # out of place copies


@kernels
@pytest.mark.parametrize("name", list(CONTRACT_SCHEMAS))
def test_opcheck_on_meta(name):
    """opcheck's utilities return early on meta inputs (they need a real kernel to compare with), so this
    proves only that the op and its fake accept these arguments; tests/gpu runs every opcheck for real."""
    ops.load()
    a = dict(q=_meta(19, 4, 64), k=_meta(19, 2, 64), cos=_meta(64, 32, dtype=torch.float32),
             sin=_meta(64, 32, dtype=torch.float32), positions=_meta(19, dtype=torch.int64))
    op = getattr(torch.ops.astrai, name).default
    args = ((a["q"], a["cos"], a["sin"], a["positions"], False) if name == "rotary_embedding"
            else (a["q"], a["k"], a["cos"], a["sin"], a["positions"], False))
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))


@kernels
@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compile_fullgraph_traces_ops_on_meta(dynamic):
    ops.load()

    def f(q, k, cos, sin, positions):
        q_out, k_out = ops.rotary_embedding_qk(q, k, cos, sin, positions)
        ops.rotary_embedding_(q, k, cos, sin, positions, interleaved=True)
        return q_out + q, k_out * 2, ops.rotary_embedding(q, cos, sin, positions)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager", dynamic=dynamic)
    q, k = _meta(2, 19, 32, 128), _meta(2, 19, 8, 128)
    cos, sin = _meta(4096, 64, dtype=torch.float32), _meta(4096, 64, dtype=torch.float32)
    outs = compiled(q, k, cos, sin, _meta(2, 19, dtype=torch.int32))
    assert [tuple(o.shape) for o in outs] == [(2, 19, 32, 128), (2, 19, 8, 128), (2, 19, 32, 128)]


@kernels
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: tests/gpu runs the smoke test")
def test_smoke_test_without_gpu_raises():
    with pytest.raises(RuntimeError, match="no CUDA device is visible"):
        ops.smoke_test()
