"""Tier 1 (GPU): the fused rotary kernels against a float64 reference; bitwise suites (repeats, CUDA-graph
replay, fused q+k vs single calls, batch invariance), layouts, positions, streams, opcheck, torch.compile.

Accuracy: every output is within half a bf16 ulp of the float64 truth plus float32 slack (the contract:
computed in float32, rounded once), and its max error is no worse than 2x torch's own bf16 error (the
torch path on the same bf16 inputs against the same truth). Every bitwise check has a negative control.
Runs under whatever image the loader picks; set ASTRAI_IMAGE to force one (e.g. a PTX-only image).
"""

from __future__ import annotations

import re

import pytest
import torch
from reference.rotary import random_freqs, rotary
from support.bitwise import assert_bitwise_equal, assert_detects_perturbation
from support.op_properties import batch_invariant

from astrai.extension import apply_rotary_emb, apply_rotary_emb_qk
from astrai.extension.backend import rotary as backend
from astrai.extension.ops import rotary as ops

pytestmark = [pytest.mark.gpu, pytest.mark.requires_cuda_kernels("rotary")]

DEVICE = "cuda"
BF16 = torch.bfloat16
EPS = torch.finfo(BF16).eps  # one ulp at 1.0
TOKENS = (1, 19, 989)
HEADS = (1, 3, 8, 32, 40)
HEAD_DIMS = (34, 64, 128, 256)  # 34: rows of 68 bytes, off the 16-byte vector path
HEAD_PAIRS = ((1, 1), (3, 1), (8, 8), (32, 8), (40, 8))  # (Hq, Hk)
PAIRING = pytest.mark.parametrize("interleaved", [False, True], ids=["neox", "gptj"])
MAX_POS = 4096


# --- helpers ---------------------------------------------------------------------------------------------------

def rand_bf16(*shape) -> torch.Tensor:
    """Fresh standard-normal bf16: never zeros."""
    return torch.randn(*shape, device=DEVICE).to(BF16)


def make_freqs(mode: str, tokens: int, head_dim: int, max_pos: int = MAX_POS):
    """(cos, sin, positions): mode "token" gives per-token [T, D/2] and no positions; "int32"/"int64" a random
    cache [max_pos, D/2] and random positions of that dtype."""
    half = head_dim // 2
    if mode == "token":
        cos, sin = random_freqs(tokens, half, device=DEVICE)
        return cos, sin, None
    cos, sin = random_freqs(max_pos, half, device=DEVICE)
    return cos, sin, torch.randint(0, max_pos, (tokens,), device=DEVICE, dtype=getattr(torch, mode))


def poison_next_allocations(*nbytes: int) -> None:
    """Hand NaN-filled blocks (0xFF bytes) of these sizes back to the caching allocator, which gives a freed
    block to the next request of its size: an output element the kernel fails to write then most likely reads
    as NaN. Every correctness test also runs the kernel on fresh random inputs, so stale memory cannot pass
    for a result."""
    blocks = [torch.empty(max(n, 1), dtype=torch.uint8, device=DEVICE).fill_(0xFF) for n in nbytes]
    del blocks


def assert_matches_truth(out: torch.Tensor, x: torch.Tensor, cos, sin, positions, interleaved: bool,
                         what: str = "") -> None:
    """out (bf16) vs the float64 truth: every element rounded once (half an ulp plus float32 slack) and the
    max error no worse than 2x the torch path's on the same bf16 inputs."""
    assert out.dtype == BF16 and out.shape == x.shape, f"{what}: {out.dtype}{list(out.shape)}"
    assert not bool(out.isnan().any()), f"{what}: NaN in the output (an element not written?)"
    truth = rotary(x, cos, sin, positions, interleaved=interleaved)  # float64
    err = (out.double() - truth).abs()
    bound = truth.abs() * (EPS / 2) + 1e-5
    if not bool((err <= bound).all()):
        first = tuple((err > bound).nonzero()[0].tolist())
        raise AssertionError(f"{what}: not rounded once from float32: at {first} got {out[first].item()}, "
                             f"truth {truth[first].item()}")
    torch_out = apply_rotary_emb(x, (cos, sin), positions, interleaved=interleaved, path="torch")
    base = (torch_out.double() - truth).abs().max().item()
    floor = truth.abs().max().item() * (EPS / 2)  # tiny tensors: torch may happen to round closer everywhere
    assert err.max().item() <= max(2 * base, floor), f"{what}: max error {err.max().item()} vs torch {base}"


def out_of_place(q, cos, sin, positions, interleaved, **kw):
    poison_next_allocations(q.numel() * q.element_size())
    return ops.rotary_embedding(q, cos, sin, positions, interleaved=interleaved, **kw)


def fused(q, k, cos, sin, positions, interleaved, **kw):
    poison_next_allocations(q.numel() * q.element_size(), k.numel() * k.element_size())
    return ops.rotary_embedding_qk(q, k, cos, sin, positions, interleaved=interleaved, **kw)


def in_place(q, k, cos, sin, positions, interleaved, **kw):
    q, k = q.clone(), None if k is None else k.clone()
    ops.rotary_embedding_(q, k, cos, sin, positions, interleaved=interleaved, **kw)
    return q if k is None else (q, k)


# --- correctness against the float64 reference -------------------------------------------------------------

@PAIRING
@pytest.mark.parametrize("mode", ["token", "int32", "int64"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("heads", HEADS)
@pytest.mark.parametrize("tokens", TOKENS)
def test_single_matches_reference(tokens, heads, head_dim, mode, interleaved):
    q = rand_bf16(tokens, heads, head_dim)
    cos, sin, positions = make_freqs(mode, tokens, head_dim)
    out = out_of_place(q, cos, sin, positions, interleaved)
    assert out.is_contiguous()
    assert_matches_truth(out, q, cos, sin, positions, interleaved, "out of place")
    assert_bitwise_equal(in_place(q, None, cos, sin, positions, interleaved), out, "in place vs out of place")
    assert_detects_perturbation(out)


@PAIRING
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("heads_q,heads_k", HEAD_PAIRS)
@pytest.mark.parametrize("tokens", TOKENS)
def test_fused_qk_matches_reference_and_single_calls(tokens, heads_q, heads_k, head_dim, interleaved):
    q, k = rand_bf16(tokens, heads_q, head_dim), rand_bf16(tokens, heads_k, head_dim)
    cos, sin, positions = make_freqs("int64", tokens, head_dim)
    q_out, k_out = fused(q, k, cos, sin, positions, interleaved)
    assert q_out.is_contiguous() and k_out.is_contiguous()
    assert_matches_truth(q_out, q, cos, sin, positions, interleaved, "fused q")
    assert_matches_truth(k_out, k, cos, sin, positions, interleaved, "fused k")
    assert_bitwise_equal(q_out, out_of_place(q, cos, sin, positions, interleaved), "fused q vs single call")
    assert_bitwise_equal(k_out, out_of_place(k, cos, sin, positions, interleaved), "fused k vs single call")
    q_in, k_in = in_place(q, k, cos, sin, positions, interleaved)
    assert_bitwise_equal(q_in, q_out, "in-place q vs fused")
    assert_bitwise_equal(k_in, k_out, "in-place k vs fused")
    assert_detects_perturbation(q_out)


def test_smoke_test_passes():
    ops.smoke_test()


@pytest.mark.parametrize("call", ["single", "qk", "inplace"])
def test_empty_tokens(call):
    q, k = rand_bf16(0, 8, 128), rand_bf16(0, 2, 128)
    cos, sin, positions = make_freqs("int32", 0, 128)
    if call == "single":
        assert ops.rotary_embedding(q, cos, sin, positions).shape == (0, 8, 128)
    elif call == "qk":
        q_out, k_out = ops.rotary_embedding_qk(q, k, cos, sin, positions)
        assert q_out.shape == (0, 8, 128) and k_out.shape == (0, 2, 128)
    else:
        ops.rotary_embedding_(q, k, cos, sin, positions)
    torch.cuda.synchronize()


# --- bitwise suites -------------------------------------------------------------------------------------------

@PAIRING
def test_repeated_runs_are_bitwise_identical(interleaved):
    q, k = rand_bf16(989, 32, 128), rand_bf16(989, 8, 128)
    cos, sin, positions = make_freqs("int64", 989, 128)
    runs = [fused(q, k, cos, sin, positions, interleaved) for _ in range(10)]  # all kept: fresh memory each
    for i, (q_out, k_out) in enumerate(runs[1:], 1):
        assert_bitwise_equal(q_out, runs[0][0], f"q, run {i} vs run 0")
        assert_bitwise_equal(k_out, runs[0][1], f"k, run {i} vs run 0")
    for i in range(10):
        q_in, k_in = in_place(q, k, cos, sin, positions, interleaved)
        assert_bitwise_equal(q_in, runs[0][0], f"in-place q, run {i}")
        assert_bitwise_equal(k_in, runs[0][1], f"in-place k, run {i}")
    assert_detects_perturbation(runs[0][0])


@PAIRING
@pytest.mark.parametrize("call", ["qk", "inplace", "token"])
def test_cuda_graph_replay_is_bitwise_identical_to_eager(call, interleaved):
    tokens, head_dim = 989, 128
    q, k = rand_bf16(tokens, 32, head_dim), rand_bf16(tokens, 8, head_dim)
    cos, sin, positions = make_freqs("token" if call == "token" else "int32", tokens, head_dim)

    def run():
        if call == "inplace":
            ops.rotary_embedding_(q, k, cos, sin, positions, interleaved=interleaved)
            return q, k
        return ops.rotary_embedding_qk(q, k, cos, sin, positions, interleaved=interleaved)

    side = torch.cuda.Stream()  # warm up (lazy module load) off the capture, as torch's docs advise
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = run()

    for trial in range(3):
        new_cos, new_sin, new_positions = make_freqs("token" if call == "token" else "int32", tokens, head_dim)
        q.copy_(rand_bf16(*q.shape))
        k.copy_(rand_bf16(*k.shape))
        cos.copy_(new_cos)
        sin.copy_(new_sin)
        if positions is not None:
            positions.copy_(new_positions)
        if call == "inplace":  # eager, same op, on copies of this trial's inputs
            want = in_place(q, k, cos, sin, positions, interleaved)
        else:
            want = ops.rotary_embedding_qk(q, k, cos, sin, positions, interleaved=interleaved)
        if call != "inplace":
            for t in static_out:
                t.fill_(float("nan"))  # every element must be rewritten by the replay
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(static_out[0], want[0], f"graph replay {trial}, q")
        assert_bitwise_equal(static_out[1], want[1], f"graph replay {trial}, k")
    assert_detects_perturbation(static_out[0])


@PAIRING
@pytest.mark.parametrize("mode", ["token", "int64"])
def test_batch_invariance(mode, interleaved):
    """A token's result does not depend on how many other tokens share the launch."""
    assert batch_invariant("rotary_embedding_qk"), "support/op_properties.py says the op does not promise it"
    tokens = 989
    q, k = rand_bf16(tokens, 32, 128), rand_bf16(tokens, 8, 128)
    cos, sin, positions = make_freqs(mode, tokens, 128)
    q_all, k_all = fused(q, k, cos, sin, positions, interleaved)
    for rows in (slice(0, 1), slice(500, 501), slice(988, 989), slice(0, 19), slice(100, 612)):
        part_cos, part_sin = (cos[rows], sin[rows]) if positions is None else (cos, sin)
        part_positions = None if positions is None else positions[rows]
        q_part, k_part = fused(q[rows], k[rows], part_cos, part_sin, part_positions, interleaved)
        assert_bitwise_equal(q_part, q_all[rows], f"q tokens {rows}")
        assert_bitwise_equal(k_part, k_all[rows], f"k tokens {rows}")
    assert_detects_perturbation(q_all)


def test_positions_int32_and_int64_are_bitwise_identical():
    q, k = rand_bf16(989, 32, 128), rand_bf16(989, 8, 128)
    cos, sin, positions = make_freqs("int64", 989, 128)
    want = fused(q, k, cos, sin, positions, False)
    got = fused(q, k, cos, sin, positions.int(), False)
    assert_bitwise_equal(got[0], want[0], "q, int32 vs int64 positions")
    assert_bitwise_equal(got[1], want[1], "k, int32 vs int64 positions")
    assert_detects_perturbation(want[1])


# --- layouts ---------------------------------------------------------------------------------------------------

def fused_qkv_buffer(tokens: int, heads_q: int, heads_k: int, head_dim: int, pad: int, sentinel: float,
                     lead: tuple[int, ...] = ()):
    """A qkv buffer [*lead, T, Hq + 2*Hk, D + pad]: q/k/v random, the pad columns set to `sentinel`.
    Returns (buffer, q view, k view)."""
    buf = torch.full((*lead, tokens, heads_q + 2 * heads_k, head_dim + pad), sentinel, dtype=BF16, device=DEVICE)
    buf[..., :head_dim] = rand_bf16(*lead, tokens, heads_q + 2 * heads_k, head_dim)
    return buf, buf[..., :heads_q, :head_dim], buf[..., heads_q:heads_q + heads_k, :head_dim]


def assert_only_qk_changed(buf: torch.Tensor, before: torch.Tensor, heads_q: int, heads_k: int, head_dim: int):
    untouched = torch.ones(buf.shape, dtype=torch.bool, device=DEVICE)
    untouched[..., :heads_q + heads_k, :head_dim] = False
    assert_bitwise_equal(buf[untouched], before[untouched], "v heads and padding")


@PAIRING
@pytest.mark.parametrize("head_dim,pad", [(34, 6), (128, 8), (256, 64)])
def test_qkv_views(head_dim, pad, interleaved):
    tokens, heads_q, heads_k = 989, 32, 8
    buf, q, k = fused_qkv_buffer(tokens, heads_q, heads_k, head_dim, pad, float("nan"))
    cos, sin, positions = make_freqs("int64", tokens, head_dim)
    q_out, k_out = fused(q, k, cos, sin, positions, interleaved)
    assert_matches_truth(q_out, q, cos, sin, positions, interleaved, "q view")
    assert_matches_truth(k_out, k, cos, sin, positions, interleaved, "k view")
    before = buf.clone()
    ops.rotary_embedding_(q, k, cos, sin, positions, interleaved=interleaved)
    assert_bitwise_equal(q, q_out, "in place on the q view vs out of place")
    assert_bitwise_equal(k, k_out, "in place on the k view vs out of place")
    assert_only_qk_changed(buf, before, heads_q, heads_k, head_dim)
    assert_detects_perturbation(buf)


@PAIRING
def test_qkv_views_4d_through_public_api(interleaved):
    batch, seq, heads_q, heads_k, head_dim = 2, 19, 32, 8, 128
    buf, q, k = fused_qkv_buffer(seq, heads_q, heads_k, head_dim, 8, float("nan"), lead=(batch,))
    cos, sin, _ = make_freqs("int64", seq, head_dim)
    positions = torch.randint(0, MAX_POS, (batch, seq), device=DEVICE)
    assert backend.select_path(q, (cos, sin), k=k, inplace=True) == "cuda"
    q_out, k_out = apply_rotary_emb_qk(q, k, (cos, sin), positions, interleaved=interleaved)
    assert_matches_truth(q_out, q, cos, sin, positions, interleaved, "q [B, S, H, D]")
    assert_matches_truth(k_out, k, cos, sin, positions, interleaved, "k [B, S, H, D]")
    before = buf.clone()
    apply_rotary_emb_qk(q, k, (cos, sin), positions, interleaved=interleaved, inplace=True)
    assert_bitwise_equal(q, q_out, "in-place q")
    assert_bitwise_equal(k, k_out, "in-place k")
    assert_only_qk_changed(buf, before, heads_q, heads_k, head_dim)
    assert_detects_perturbation(q_out)


@PAIRING
@pytest.mark.parametrize("head_dim", [34, 128])
def test_transposed_and_broadcast_token_layouts(head_dim, interleaved):
    tokens, heads = 989, 8
    q = rand_bf16(heads, tokens, head_dim).transpose(0, 1)  # [T, H, D], strides (D, T*D, 1)
    cos, sin, positions = make_freqs("int32", tokens, head_dim)
    out = out_of_place(q, cos, sin, positions, interleaved)
    assert_matches_truth(out, q, cos, sin, positions, interleaved, "transposed tokens")
    assert_bitwise_equal(in_place(q, None, cos, sin, positions, interleaved), out, "transposed, in place")
    one = rand_bf16(1, heads, head_dim).expand(tokens, heads, head_dim)  # token stride 0
    out = out_of_place(one, cos, sin, positions, interleaved)
    assert_matches_truth(out, one, cos, sin, positions, interleaved, "token stride 0")
    assert_detects_perturbation(out)


@PAIRING
@pytest.mark.parametrize("head_dim", [34, 128])
def test_cos_sin_column_views_of_one_buffer(head_dim, interleaved):
    """cos/sin as the two halves of one [max_pos, D] float32 buffer: row stride D, sin offset D/2 floats."""
    tokens = 989
    q, k = rand_bf16(tokens, 32, head_dim), rand_bf16(tokens, 8, head_dim)
    cos, sin, positions = make_freqs("int64", tokens, head_dim)
    both = torch.cat([cos, sin], dim=1)  # [max_pos, D]
    cos_view, sin_view = both[:, :head_dim // 2], both[:, head_dim // 2:]
    q_out, k_out = fused(q, k, cos_view, sin_view, positions, interleaved)
    assert_matches_truth(q_out, q, cos, sin, positions, interleaved, "q, cos/sin views")
    assert_matches_truth(k_out, k, cos, sin, positions, interleaved, "k, cos/sin views")


def test_64bit_indexing():
    """q with more than 2^31 elements: offsets past 2^31 must not wrap."""
    tokens, heads, head_dim = 2**31 // (64 * 128) + 3, 64, 128
    need = 3 * tokens * heads * head_dim * 2
    free, _ = torch.cuda.mem_get_info()
    if free < need + (2 << 30):
        pytest.skip(f"needs {need / 2**30:.1f} GiB free on the GPU, has {free / 2**30:.1f}")
    q = rand_bf16(tokens, heads, head_dim)
    cos, sin, positions = make_freqs("int64", tokens, 128)
    out = out_of_place(q, cos, sin, positions, False)
    for rows in (slice(0, 4), slice(tokens // 2, tokens // 2 + 4), slice(tokens - 4, tokens)):
        assert_matches_truth(out[rows], q[rows], cos, sin, positions[rows], False, f"tokens {rows}")
    ops.rotary_embedding_(q, None, cos, sin, positions)
    assert_bitwise_equal(q[-4:], out[-4:], "in place, last tokens")
    del q, out
    torch.cuda.empty_cache()


# --- positions -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [-1, MAX_POS, MAX_POS + 1000])
@pytest.mark.parametrize("call", ["single", "qk", "inplace", "public"])
def test_out_of_range_positions_raise_before_launch(call, bad):
    q, k = rand_bf16(19, 8, 128), rand_bf16(19, 2, 128)
    cos, sin, positions = make_freqs("int32", 19, 128)
    positions[7] = bad
    q_before, k_before = q.clone(), k.clone()
    op = {"single": ops.OP, "qk": ops.OP_QK, "inplace": ops.OP_INPLACE, "public": "apply_rotary_emb_qk"}[call]
    with pytest.raises(ValueError, match=rf"^{re.escape(op)}: positions holds {bad}, outside .*\[0, {MAX_POS}\)"):
        if call == "single":
            ops.rotary_embedding(q, cos, sin, positions)
        elif call == "qk":
            ops.rotary_embedding_qk(q, k, cos, sin, positions)
        elif call == "inplace":
            ops.rotary_embedding_(q, k, cos, sin, positions)
        else:
            apply_rotary_emb_qk(q, k, (cos, sin), positions, inplace=True)
    torch.cuda.synchronize()
    assert_bitwise_equal(q, q_before, "q after the refused call")
    assert_bitwise_equal(k, k_before, "k after the refused call")
    assert_detects_perturbation(q_before)


@PAIRING
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_unchecked_out_of_range_positions_write_nan_and_nothing_else(dtype, interleaved):
    tokens, heads_q, heads_k, head_dim = 989, 32, 8, 128
    buf, q, k = fused_qkv_buffer(tokens, heads_q, heads_k, head_dim, 8, 3.0)  # finite sentinel: NaN must not leak
    cos, sin, positions = make_freqs("int64", tokens, head_dim)
    positions = positions.to(dtype)
    bad_rows = [0, 500, tokens - 1]
    valid = positions.clone()
    positions[bad_rows[0]], positions[bad_rows[1]], positions[bad_rows[2]] = -5, MAX_POS, MAX_POS + 100
    good = torch.ones(tokens, dtype=torch.bool, device=DEVICE)
    good[bad_rows] = False

    want_q, want_k = fused(q, k, cos, sin, valid, interleaved)
    q_out, k_out = fused(q, k, cos, sin, positions, interleaved, check_positions=False)
    for got, want, name in ((q_out, want_q, "q"), (k_out, want_k, "k")):
        assert bool(got[~good].isnan().all()), f"out of place {name}: a bad token's row is not all NaN"
        assert_bitwise_equal(got[good], want[good], f"out of place {name}, valid tokens")

    before = buf.clone()
    ops.rotary_embedding_(q, k, cos, sin, positions, interleaved=interleaved, check_positions=False)
    for got, want, name in ((q, want_q, "q"), (k, want_k, "k")):
        assert bool(got[~good].isnan().all()), f"in place {name}: a bad token's row is not all NaN"
        assert_bitwise_equal(got[good], want[good], f"in place {name}, valid tokens")
    assert_only_qk_changed(buf, before, heads_q, heads_k, head_dim)
    assert not bool(buf[..., head_dim:].isnan().any())
    assert_detects_perturbation(want_q[good])


# --- streams ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call", ["qk", "inplace"])
def test_side_stream_launch(call):
    """The op must launch on the current stream. On a side stream, a long sleep then the copy of the inputs
    precede the op: a launch on any other stream would read the inputs before the copy lands."""
    tokens = 989
    q, k = rand_bf16(tokens, 32, 128), rand_bf16(tokens, 8, 128)
    cos, sin, positions = make_freqs("int64", tokens, 128)
    want = fused(q, k, cos, sin, positions, False)
    q_dst, k_dst = rand_bf16(*q.shape), rand_bf16(*k.shape)  # different values until the side-stream copy
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time
        q_dst.copy_(q)
        k_dst.copy_(k)
        if call == "qk":
            got = ops.rotary_embedding_qk(q_dst, k_dst, cos, sin, positions, check_positions=False)
        else:
            ops.rotary_embedding_(q_dst, k_dst, cos, sin, positions, check_positions=False)
            got = (q_dst, k_dst)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert_bitwise_equal(got[0], want[0], "q on a side stream")
    assert_bitwise_equal(got[1], want[1], "k on a side stream")
    assert_detects_perturbation(want[0])


# --- opcheck and torch.compile -------------------------------------------------------------------------------

def _opcheck_cases():
    def make(mode, with_k=True):
        q, k = rand_bf16(19, 8, 128), rand_bf16(19, 2, 128)
        cos, sin, positions = make_freqs(mode, 19, 128)
        return q, (k if with_k else None), cos, sin, positions

    return {
        "single-cache": lambda: ("rotary_embedding", (lambda q, k, c, s, p: (q, c, s, p, False))(*make("int64"))),
        "single-token": lambda: ("rotary_embedding", (lambda q, k, c, s, p: (q, c, s, p, True))(*make("token"))),
        "qk-cache": lambda: ("rotary_embedding_qk", (*make("int32"), False)),
        "inplace-qk": lambda: ("rotary_embedding_", (*make("int64"), True)),
        "inplace-q-only": lambda: ("rotary_embedding_", (*make("token", with_k=False), False)),
    }


@pytest.mark.parametrize("case", list(_opcheck_cases()))
def test_opcheck(case):
    ops.load()
    name, args = _opcheck_cases()[case]()
    torch.library.opcheck(getattr(torch.ops.astrai, name).default, args)


def test_opcheck_autograd_registration_with_grad_inputs():
    """No autograd kernel is registered, so no output may claim to require grad."""
    ops.load()
    q = rand_bf16(19, 8, 128).requires_grad_()
    cos, sin, positions = make_freqs("int64", 19, 128)
    torch.library.opcheck(torch.ops.astrai.rotary_embedding.default, (q, cos, sin, positions, False),
                          test_utils="test_autograd_registration")


@pytest.mark.parametrize("call,interleaved", [("single", False), ("qk", False), ("qk", True), ("inplace", False)])
def test_compile_fullgraph_matches_eager(call, interleaved):
    batch, seq = 2, 19
    q, k = rand_bf16(batch, seq, 32, 128), rand_bf16(batch, seq, 8, 128)
    cos, sin, _ = make_freqs("int64", seq, 128)
    positions = torch.randint(0, MAX_POS, (batch, seq), device=DEVICE, dtype=torch.int32)
    assert backend.select_path(q, (cos, sin), k=k) == "cuda"

    def f(q, k, cos, sin, positions):
        if call == "single":
            return apply_rotary_emb(q, (cos, sin), positions, interleaved=interleaved)
        return apply_rotary_emb_qk(q, k, (cos, sin), positions, interleaved=interleaved, inplace=call == "inplace")

    compiled = torch.compile(f, fullgraph=True)
    want = f(q.clone(), k.clone(), cos, sin, positions)
    got = compiled(q.clone(), k.clone(), cos, sin, positions)
    for i, (g, w) in enumerate(zip(got if call != "single" else (got,), want if call != "single" else (want,))):
        assert_bitwise_equal(g, w, f"compiled vs eager, output {i}")
    assert_detects_perturbation(want if call == "single" else want[0])


# --- the public API's policy on a GPU ---------------------------------------------------------------------------

def test_public_api_dispatch_on_gpu():
    q = rand_bf16(19, 8, 128)
    cos, sin, positions = make_freqs("int64", 19, 128)
    assert backend.select_path(q, (cos, sin)) == "cuda"
    assert backend.select_path(q.half(), (cos, sin)) == "torch"
    assert backend.select_path(q.float(), (cos, sin)) == "torch"
    leaf = q.clone().requires_grad_()
    assert backend.select_path(leaf, (cos, sin)) == "torch"
    with torch.no_grad():
        assert backend.select_path(leaf, (cos, sin)) == "cuda"
    with torch.inference_mode():
        assert backend.select_path(leaf, (cos, sin)) == "cuda"
    assert backend.select_path(q, (cos.requires_grad_(), sin)) == "torch"
    cos.requires_grad_(False)
    with pytest.raises(ValueError, match=r"path='cuda'.*no backward"):
        apply_rotary_emb(leaf, (cos, sin), positions, path="cuda")

    out = apply_rotary_emb(q, (cos, sin), positions)
    assert_matches_truth(out, q, cos, sin, positions, False, "public API, cuda path")
    assert_bitwise_equal(out, ops.rotary_embedding(q, cos, sin, positions), "public API vs the op")
    # bf16 cos/sin are cast to float32 for the kernel
    cos16, sin16 = cos.bfloat16(), sin.bfloat16()
    assert_bitwise_equal(apply_rotary_emb(q, (cos16, sin16), positions),
                         ops.rotary_embedding(q, cos16.float(), sin16.float(), positions), "bf16 cos/sin")
    assert_detects_perturbation(out)


def test_grads_flow_on_gpu_through_torch_path():
    q = rand_bf16(19, 8, 128).requires_grad_()
    cos, sin, positions = make_freqs("int32", 19, 128)
    out = apply_rotary_emb(q, (cos, sin), positions, interleaved=True)
    grad_out = rand_bf16(*out.shape)
    out.backward(grad_out)
    # the rotation is orthogonal: the input gradient is the output gradient rotated back (sin -> -sin)
    want = rotary(grad_out, cos, -sin, positions, interleaved=True)
    assert q.grad is not None and q.grad.dtype == BF16
    torch.testing.assert_close(q.grad.double(), want, rtol=EPS, atol=1e-5)


@PAIRING
def test_public_api_shared_freqs_for_a_batch(interleaved):
    """cos/sin [S, D/2] shared by every sequence of a [B, S, H, D] x."""
    batch, seq = 3, 19
    x = rand_bf16(batch, seq, 8, 128)
    cos, sin, _ = make_freqs("token", seq, 128)
    assert backend.select_path(x, (cos, sin)) == "cuda"
    out = apply_rotary_emb(x, (cos, sin), interleaved=interleaved)
    assert_matches_truth(out, x, cos, sin, None, interleaved, "shared cos/sin")
