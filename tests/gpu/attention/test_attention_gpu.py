"""Tier 1 (GPU): split-KV decode (contiguous and paged) and the paged KV append against float64 references;
bitwise suites (repeats, CUDA-graph replay, batch invariance, append), the public policy on CUDA, opcheck.

Accuracy: the kernel's max error against the float64 truth is no worse than 2x torch's own bf16 error
(SDPA on the same bf16 inputs against the same truth), with a floor of half a bf16 ulp of the largest
output for tiny problems. Every bitwise check has a negative control.

Batch invariance of decode: with a fixed `kv_split_size` a sequence's output is bitwise independent of the
rest of the batch (each split covers fixed key positions and empty splits merge as exact zeros). With the
automatic split (kv_split_size=0) the split length depends on B, Hkv and the SM count, so invariance holds
only between batches that get the same plan; the test below checks the fixed mode and the auto mode where
the plan is provably equal (every batch size whose plan saturates the minimum split length).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from reference import attention as ref

from astrai.extension import ATTN_BACKEND, PagedKVCache, attention, attention_plan, attn_backend
from astrai.extension.backend import attention as backend
from astrai.extension.ops import attention as ops

pytestmark = [pytest.mark.gpu, pytest.mark.requires_cuda_kernels("attention")]

DEVICE = "cuda"
BF16 = torch.bfloat16
EPS = torch.finfo(BF16).eps
HEADS = [(8, 8), (8, 4), (8, 2), (32, 8), (16, 2), (8, 1), (32, 1)]  # GQA 1, 2, 4, 4, 8, MQA 8, MQA 32
HEAD_DIMS = (64, 128, 256)
_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def rand_bf16(*shape):
    return torch.randn(*shape, device=DEVICE).to(BF16)


def lens_tensor(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def assert_bitwise_equal(got, want, what=""):
    assert got.shape == want.shape and got.dtype == want.dtype, f"{what}: {got.shape} vs {want.shape}"
    differ = got.view(_INT_OF_SIZE[got.element_size()]) != want.view(_INT_OF_SIZE[want.element_size()])
    if bool(differ.any()):
        first = tuple(differ.nonzero()[0].tolist())
        raise AssertionError(f"{what}: {int(differ.sum())} of {got.numel()} elements differ; first at {first}: "
                             f"{got[first].item()!r} vs {want[first].item()!r}")


def assert_detects_perturbation(t):
    changed = t.clone()
    flat = changed.view(_INT_OF_SIZE[t.element_size()]).view(-1)
    flat[int(torch.randint(0, flat.numel(), ()))] ^= 1
    with pytest.raises(AssertionError, match="1 of .* elements differ"):
        assert_bitwise_equal(changed, t, "negative control")


def sdpa_bf16(q, k, v, keep, scale=None):
    """torch's own bf16 attention on the same inputs: SDPA with an explicit keep mask, zeros for empty rows."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=keep[:, None], scale=scale,
                                         enable_gqa=q.shape[2] != k.shape[2]).transpose(1, 2)
    return out.masked_fill(~keep.any(-1)[:, :, None, None], 0.0)


def assert_matches_truth(out, q, k, v, *, kv_lens=None, attn_mask=None, valid=None, scale=None, what=""):
    """out [B, Hq, D] bf16 (one query per sequence) vs the float64 truth, within 2x torch's bf16 error."""
    assert out.dtype == BF16 and not bool(out.isnan().any()), f"{what}: NaN (an element not written?)"
    q4 = q[:, None]
    truth = ref.attention(q4, k, v, kv_lens=kv_lens, attn_mask=attn_mask, valid=valid, scale=scale)[:, 0]
    keep = ref.keep_mask(q.shape[0], 1, k.shape[1], kv_lens=kv_lens, attn_mask=attn_mask, valid=valid, device=DEVICE)
    base = (sdpa_bf16(q4, k, v, keep, scale)[:, 0].double() - truth).abs().max().item()
    err = (out.double() - truth).abs().max().item()
    floor = truth.abs().max().item() * EPS / 2 + 1e-6
    assert err <= max(2 * base, floor), f"{what}: max error {err:.3g} vs torch bf16 {base:.3g}"


def make_paged(k, v, kv_lens, page_size, *, extra_pages=3):
    """Scatter contiguous [B, L, Hkv, D] into a shuffled paged cache; returns k_cache, v_cache, page_table."""
    batch, length = k.shape[:2]
    max_pages = -(-length // page_size)
    num_pages = batch * max_pages + extra_pages
    perm = torch.randperm(num_pages, device=DEVICE)[:batch * max_pages].view(batch, max_pages).to(torch.int32)
    k_cache = rand_bf16(num_pages, page_size, *k.shape[2:])  # unused slots hold random data, never read
    v_cache = rand_bf16(num_pages, page_size, *k.shape[2:])
    pad = max_pages * page_size - length
    kp = F.pad(k, (0, 0, 0, 0, 0, pad)).view(batch, max_pages, page_size, *k.shape[2:])
    vp = F.pad(v, (0, 0, 0, 0, 0, pad)).view(batch, max_pages, page_size, *k.shape[2:])
    k_cache[perm.long()] = kp
    v_cache[perm.long()] = vp
    return k_cache, v_cache, perm


# --- correctness ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("heads", HEADS, ids=[f"{a}-{b}" for a, b in HEADS])
@pytest.mark.parametrize("batch,length", [(1, 1), (1, 4099), (3, 989)])
def test_decode_contiguous_matches_reference(batch, length, heads, head_dim):
    hq, hkv = heads
    q = rand_bf16(batch, hq, head_dim)
    k, v = rand_bf16(batch, length, hkv, head_dim), rand_bf16(batch, length, hkv, head_dim)
    lens = lens_tensor([length, 1, max(1, length // 3)][:batch])
    out = ops.attn_decode(q, k, v, lens)
    assert out.shape == q.shape and out.is_contiguous()
    assert_matches_truth(out, q, k, v, kv_lens=lens, what="contiguous")
    full = ops.attn_decode(q, k, v)  # kv_lens None: every key
    assert_matches_truth(full, q, k, v, what="contiguous, no lengths")


@pytest.mark.parametrize("page_size", [1, 16, 128])
@pytest.mark.parametrize("heads", [(32, 8), (8, 1), (4, 4)], ids=["32-8", "8-1", "4-4"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_paged_decode_matches_reference(page_size, heads, head_dim):
    hq, hkv = heads
    batch, length = 4, 1000
    q = rand_bf16(batch, hq, head_dim)
    k, v = rand_bf16(batch, length, hkv, head_dim), rand_bf16(batch, length, hkv, head_dim)
    lens = lens_tensor([1000, 1, 17, 129])  # ragged, not multiples of the page size
    k_cache, v_cache, table = make_paged(k, v, lens, page_size)
    out = ops.attn_paged_decode(q, k_cache, v_cache, table, lens)
    assert_matches_truth(out, q, k, v, kv_lens=lens, what=f"paged ps={page_size}")
    # The automatic plans of the two sources may differ (attention_launch.cu); a fixed split is one plan.
    contiguous = ops.attn_decode(q, k, v, lens, kv_split_size=256)
    fixed = ops.attn_paged_decode(q, k_cache, v_cache, table, lens, kv_split_size=256)
    assert_bitwise_equal(fixed, contiguous, "paged vs contiguous (same plan, same keys)")


@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged"])
def test_decode_mask(paged):
    batch, length = 3, 700
    q, k, v = rand_bf16(batch, 32, 128), rand_bf16(batch, length, 8, 128), rand_bf16(batch, length, 8, 128)
    lens = lens_tensor([700, 300, 5])
    mask = torch.rand(batch, length, device=DEVICE) > 0.3
    mask[2] = False  # nothing kept: zeros
    if paged:
        k_cache, v_cache, table = make_paged(k, v, lens, 16)
        out = ops.attn_paged_decode(q, k_cache, v_cache, table, lens, mask=mask)
    else:
        out = ops.attn_decode(q, k, v, lens, mask=mask)
    assert_matches_truth(out, q, k, v, kv_lens=lens, attn_mask=mask, what="mask")
    assert torch.equal(out[2], torch.zeros_like(out[2]))


def test_decode_scale_and_4d_q():
    q, k, v = rand_bf16(2, 1, 8, 64), rand_bf16(2, 50, 2, 64), rand_bf16(2, 50, 2, 64)
    out = ops.attn_decode(q, k, v, scale=0.3)
    assert out.shape == (2, 1, 8, 64)
    assert_matches_truth(out[:, 0], q[:, 0], k, v, scale=0.3, what="scale 0.3")


def test_lengths_clamp_and_bad_page_ids_are_dropped():
    """kv_lens past the table and page ids out of range: defined results, no illegal access."""
    batch, length, ps = 3, 256, 16
    q, k, v = rand_bf16(batch, 8, 128), rand_bf16(batch, length, 2, 128), rand_bf16(batch, length, 2, 128)
    lens = lens_tensor([10_000, -5, 200])  # clamped to [0, 256]
    k_cache, v_cache, table = make_paged(k, v, lens, ps)
    table[0, 3] = -1
    table[2, 1] = k_cache.shape[0] + 7
    table[2, 5] = 2**31 - 1
    out = ops.attn_paged_decode(q, k_cache, v_cache, table, lens)
    torch.cuda.synchronize()
    valid = torch.ones(batch, length, dtype=torch.bool, device=DEVICE)
    valid[0, 48:64] = False
    valid[2, 16:32] = False
    valid[2, 80:96] = False
    assert_matches_truth(out, q, k, v, kv_lens=lens.clamp(0, length), valid=valid, what="clamp + bad pages")
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_check_pages_stops_bad_ids_on_cuda_and_keeps_the_bits():
    """check_pages=True on CUDA tensors: a bad page id, length or append position raises before the launch;
    in range, the output is bitwise the unchecked one."""
    batch, length, ps = 3, 256, 16
    q, k, v = rand_bf16(batch, 8, 128), rand_bf16(batch, length, 2, 128), rand_bf16(batch, length, 2, 128)
    lens = lens_tensor([256, 1, 200])
    k_cache, v_cache, table = make_paged(k, v, lens, ps)
    checked = ops.attn_paged_decode(q, k_cache, v_cache, table, lens, check_pages=True)
    assert_bitwise_equal(checked, ops.attn_paged_decode(q, k_cache, v_cache, table, lens), "checked decode")
    q_rows = rand_bf16(batch, 5, 8, 128)
    checked = ops.attn_paged_prefill(q_rows, k_cache, v_cache, table, lens, is_causal=True, check_pages=True)
    assert_bitwise_equal(checked, ops.attn_paged_prefill(q_rows, k_cache, v_cache, table, lens, is_causal=True),
                         "checked prefill")
    bad = table.clone()
    bad[2, 12] = k_cache.shape[0]  # read by sequence 2 (200 keys: entries 0..12)
    with pytest.raises(ValueError, match=rf"astrai\.attn_paged_decode: page_table\[2, 12\] = {k_cache.shape[0]}"):
        ops.attn_paged_decode(q, k_cache, v_cache, bad, lens, check_pages=True)
    with pytest.raises(ValueError, match=r"astrai\.attn_paged_prefill: kv_lens\[0\] = 257 is outside"):
        ops.attn_paged_prefill(q_rows, k_cache, v_cache, table, lens + 1, check_pages=True)
    k_new, v_new = rand_bf16(2, 2, 128), rand_bf16(2, 2, 128)
    with pytest.raises(ValueError, match=r"astrai\.paged_kv_append: positions\[1\] = 256 is outside"):
        ops.paged_kv_append(k_cache, v_cache, k_new, v_new, table, lens_tensor([0, 1]), lens_tensor([3, 256]),
                            check_pages=True)


def test_check_pages_is_skipped_under_graph_capture():
    """The check needs a host sync, which capture forbids: captured with check_pages=True, the graph holds the
    plain launch, and replays with a bad page id drop its keys as the unchecked call does."""
    batch, length, ps = 2, 512, 16
    q, k, v = rand_bf16(batch, 8, 128), rand_bf16(batch, length, 2, 128), rand_bf16(batch, length, 2, 128)
    lens = lens_tensor([512, 300])
    k_cache, v_cache, table = make_paged(k, v, lens, ps)
    k_new, v_new = rand_bf16(batch, 2, 128), rand_bf16(batch, 2, 128)
    seq_ids, positions = lens_tensor([0, 1]), lens_tensor([7, 9])

    def run():
        ops.paged_kv_append(k_cache, v_cache, k_new, v_new, table, seq_ids, positions, check_pages=True)
        return ops.attn_paged_decode(q, k_cache, v_cache, table, lens, check_pages=True)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = run()
    table[1, 3] = -1  # out of range now: the replay drops those keys
    want = ops.attn_paged_decode(q, k_cache, v_cache, table, lens)
    static_out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(static_out, want, "replay with a dropped page")
    with pytest.raises(ValueError, match=r"page_table\[1, 3\] = -1"):  # eager, the same call is checked
        ops.attn_paged_decode(q, k_cache, v_cache, table, lens, check_pages=True)


@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("split", [0, 64, 256], ids=["auto", "split64", "split256"])
@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged"])
def test_keys_past_the_length_or_masked_never_reach_the_output(paged, split, head_dim):
    """The first tiles of every split are copied before the sequence's length (and mask) are read: keys past the
    length, masked keys and keys of splits that keep nothing land in shared memory. NaN and Inf in every one of
    them (and in every page slot the table names past the length) must not reach the output: finite, at the
    truth computed from the clean K/V."""
    lens_list = [4000, 1, 65, 700, 0, 2049]
    batch, length = len(lens_list), 4096
    q = rand_bf16(batch, 8, head_dim)
    k, v = rand_bf16(batch, length, 2, head_dim), rand_bf16(batch, length, 2, head_dim)
    lens = lens_tensor(lens_list)
    mask = torch.rand(batch, length, device=DEVICE) > 0.2
    past = torch.arange(length, device=DEVICE)[None, :] >= lens[:, None]
    bad = past | ~mask
    poison = torch.where(torch.rand(batch, length, 1, 1, device=DEVICE) > 0.5, float("nan"), float("inf"))
    k_bad = torch.where(bad[:, :, None, None], poison.to(BF16), k)
    v_bad = torch.where(bad[:, :, None, None], -poison.to(BF16), v)
    if paged:
        k_cache, v_cache, table = make_paged(k_bad, v_bad, lens, 16)
        unnamed = torch.ones(k_cache.shape[0], dtype=torch.bool, device=DEVICE)
        unnamed[table.long().flatten()] = False
        k_cache[unnamed] = float("nan")  # pages the table does not name
        v_cache[unnamed] = float("nan")
        out = ops.attn_paged_decode(q, k_cache, v_cache, table, lens, mask=mask, kv_split_size=split)
    else:
        out = ops.attn_decode(q, k_bad, v_bad, lens, mask=mask, kv_split_size=split)
    assert torch.isfinite(out.float()).all(), "a dropped key's NaN or Inf reached the output"
    assert_matches_truth(out, q, k, v, kv_lens=lens, attn_mask=mask, what=f"poisoned, split {split}")
    assert torch.equal(out[4], torch.zeros_like(out[4]))  # length 0


def test_empty_batch_and_zero_lengths():
    q, k = rand_bf16(0, 8, 128), rand_bf16(0, 10, 2, 128)
    assert ops.attn_decode(q, k, k).shape == (0, 8, 128)
    q, k = rand_bf16(2, 8, 128), rand_bf16(2, 10, 2, 128)
    out = ops.attn_decode(q, k, k, lens_tensor([0, 0]))
    assert torch.equal(out, torch.zeros_like(out))


def test_paged_decode_with_an_empty_mask_keeps_nothing():
    """A [B, 0] mask drops every key (keys at or past the mask's width are dropped): zeros, even though an empty
    tensor's data pointer may be null (which must not read as "no mask")."""
    q, k, v = rand_bf16(2, 8, 128), rand_bf16(2, 40, 2, 128), rand_bf16(2, 40, 2, 128)
    lens = lens_tensor([40, 17])
    k_cache, v_cache, table = make_paged(k, v, lens, 16)
    out = ops.attn_paged_decode(q, k_cache, v_cache, table, lens, mask=torch.ones(2, 0, dtype=torch.bool,
                                                                                   device=DEVICE))
    assert torch.equal(out, torch.zeros_like(out))
    kept = ops.attn_paged_decode(q, k_cache, v_cache, table, lens)  # control: without the mask, not zeros
    assert bool(kept.abs().sum() > 0)


def test_non_contiguous_views():
    qkv = rand_bf16(3, 48, 128)                      # q heads 0..31 of a fused projection
    kv = rand_bf16(3, 300, 2, 8, 128)                # K and V interleaved in one buffer
    q, k, v = qkv[:, :32], kv[:, :, 0], kv[:, :, 1]
    lens = lens_tensor([300, 150, 1])
    assert_matches_truth(ops.attn_decode(q, k, v, lens), q, k, v, kv_lens=lens, what="strided views")


def test_smoke_test_passes():
    ops.smoke_test()


# --- bitwise suites -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged"])
def test_repeated_runs_are_bitwise_identical(paged):
    batch, length = 2, 8191
    q, k, v = rand_bf16(batch, 32, 128), rand_bf16(batch, length, 8, 128), rand_bf16(batch, length, 8, 128)
    lens = lens_tensor([8191, 4000])
    if paged:
        k_cache, v_cache, table = make_paged(k, v, lens, 16)
        run = lambda: ops.attn_paged_decode(q, k_cache, v_cache, table, lens)  # noqa: E731
    else:
        run = lambda: ops.attn_decode(q, k, v, lens)  # noqa: E731
    outs = [run() for _ in range(10)]
    for i, out in enumerate(outs[1:], 1):
        assert_bitwise_equal(out, outs[0], f"run {i} vs run 0")
    assert_detects_perturbation(outs[0])


@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged"])
def test_cuda_graph_replay_is_bitwise_identical_to_eager(paged):
    batch, length = 4, 3000
    q, k, v = rand_bf16(batch, 32, 128), rand_bf16(batch, length, 8, 128), rand_bf16(batch, length, 8, 128)
    lens = lens_tensor([3000, 1, 1500, 2999])
    k_cache, v_cache, table = make_paged(k, v, lens, 16)

    def run():
        if paged:
            return ops.attn_paged_decode(q, k_cache, v_cache, table, lens)
        return ops.attn_decode(q, k, v, lens)

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
        q.copy_(rand_bf16(*q.shape))
        k.copy_(rand_bf16(*k.shape))
        v.copy_(rand_bf16(*v.shape))
        k_cache.copy_(rand_bf16(*k_cache.shape))
        lens.copy_(lens_tensor([int(x) for x in torch.randint(0, length + 1, (batch,))]))
        want = run()
        static_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_bitwise_equal(static_out, want, f"graph replay {trial}")
    assert_detects_perturbation(static_out)


@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged"])
@pytest.mark.parametrize("batch,length", [(1, 4096), (2, 3001), (24, 700)], ids=["B1", "B2", "B24"])
def test_launch_overlap_keeps_every_dependency(paged, batch, length):
    """On sm_90+ the decode kernel of a plan with splits and the combine may start while the stream's previous
    kernel still runs (programmatic dependent launch) and must wait for it before touching memory. A chain
    where every kernel reads what the one before it wrote: each call's q is the previous call's output (through
    the combine: B = 1 and 2 have splits; B = 24 has one split and launches as before, a control), and in the
    paged case the append writes each step's last key and value right before the decode reads them; partial
    buffers freed by one call may be the next call's. The same bits with the overlap off
    (attention_plan.set_staging(pdl=False)),
    eagerly and in a replayed graph."""
    steps = 6
    q0 = rand_bf16(batch, 32, 128)
    k, v = rand_bf16(batch, length, 8, 128), rand_bf16(batch, length, 8, 128)
    lens = lens_tensor([length - (3 * b) % 17 for b in range(batch)])
    k_cache, v_cache, table = make_paged(k, v, lens, 16)
    k_new, v_new = rand_bf16(steps, batch, 8, 128), rand_bf16(steps, batch, 8, 128)
    seq_ids = torch.arange(batch, dtype=torch.int32, device=DEVICE)
    positions = lens - 1

    def chain(q, out):
        for i in range(steps):
            if paged:
                ops.paged_kv_append(k_cache, v_cache, k_new[i], v_new[i], table, seq_ids, positions)
                q = ops.attn_paged_decode(q, k_cache, v_cache, table, lens)
            else:
                q = ops.attn_decode(q, k, v, lens)
            out[i].copy_(q)
        return out

    serial_out = torch.full((steps, batch, 32, 128), float("nan"), dtype=BF16, device=DEVICE)
    attention_plan.set_staging(pdl=False)
    try:
        chain(q0, serial_out)
    finally:
        attention_plan.set_staging(pdl=True)
    eager_out = torch.full_like(serial_out, float("nan"))
    chain(q0, eager_out)
    assert_bitwise_equal(eager_out, serial_out, "eager, overlap on vs off")

    static_q = q0.clone()
    graph_out = torch.full_like(serial_out, float("nan"))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain(static_q, graph_out)  # warm-up (the cache's last keys are rewritten with the same values)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chain(static_q, graph_out)
    graph_out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_bitwise_equal(graph_out, serial_out, "graph replay, overlap on vs eager with it off")
    assert torch.isfinite(serial_out.float()).all()
    assert_detects_perturbation(serial_out)


@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged"])
@pytest.mark.parametrize("split", [64, 256, 1000])
def test_batch_invariance_with_fixed_split(paged, split):
    """kv_split_size fixed: a sequence's output does not depend on the rest of the batch."""
    batch, length = 8, 4096
    q, k, v = rand_bf16(batch, 32, 128), rand_bf16(batch, length, 8, 128), rand_bf16(batch, length, 8, 128)
    lens = lens_tensor([4096, 1, 77, 1000, 4000, 2048, 3, 999])
    k_cache, v_cache, table = make_paged(k, v, lens, 16)

    def run(rows):
        if paged:
            return ops.attn_paged_decode(q[rows], k_cache, v_cache, table[rows], lens[rows], kv_split_size=split)
        return ops.attn_decode(q[rows], k[rows], v[rows], lens[rows], kv_split_size=split)

    full = run(slice(0, batch))
    for rows in (slice(0, 1), slice(1, 2), slice(3, 4), slice(2, 7), slice(7, 8)):
        assert_bitwise_equal(run(rows), full[rows], f"rows {rows}")
    assert_detects_perturbation(full)


def test_batch_invariance_auto_when_the_plan_is_the_same():
    """Automatic split: B = 64 and B = 128 at L = 512 both get one split (the planner fills the GPU with
    sequences), so each sequence's output agrees bitwise; a different plan may differ in the last bits."""
    length = 512
    q, k, v = rand_bf16(128, 32, 128), rand_bf16(128, length, 8, 128), rand_bf16(128, length, 8, 128)
    both = ops.attn_decode(q, k, v)
    half = ops.attn_decode(q[:64], k[:64], v[:64])
    assert_bitwise_equal(half, both[:64], "auto plan, B=64 vs B=128")


# --- append and the cache -------------------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", [1, 16, 128])
def test_append_is_bitwise_equal_to_reference(page_size):
    hkv, d, batch, max_pages = 8, 128, 5, 6
    num_pages = batch * max_pages + 2
    k_cache, v_cache = rand_bf16(num_pages, page_size, hkv, d), rand_bf16(num_pages, page_size, hkv, d)
    table = torch.randperm(num_pages, device=DEVICE)[:batch * max_pages].view(batch, max_pages).to(torch.int32)
    table[1, 2] = -1
    table[3, 0] = num_pages + 4
    pairs = {(int(b), int(t)) for b, t in zip(torch.randint(-1, batch + 1, (300,)).tolist(),
                                              torch.randint(-2, max_pages * page_size + 2, (300,)).tolist())}
    seq_ids = torch.tensor([b for b, _ in pairs], dtype=torch.int32, device=DEVICE)  # distinct (seq, pos):
    positions = torch.tensor([t for _, t in pairs], dtype=torch.int32, device=DEVICE)  # no slot is raced for
    k_new, v_new = rand_bf16(seq_ids.numel(), hkv, d), rand_bf16(seq_ids.numel(), hkv, d)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    ref.paged_append(want_k, want_v, k_new, v_new, table, seq_ids, positions)
    ops.paged_kv_append(k_cache, v_cache, k_new, v_new, table, seq_ids, positions)
    assert_bitwise_equal(k_cache, want_k, "k_cache")
    assert_bitwise_equal(v_cache, want_v, "v_cache")
    assert_detects_perturbation(k_cache)


def test_paged_cache_flow_matches_contiguous():
    layers, hkv, d, ps = 2, 8, 128, 16
    cache = PagedKVCache(layers, hkv, d, num_pages=512, page_size=ps, max_batch_size=4, max_pages_per_seq=64,
                         device=DEVICE)
    cache.reset(3)
    prompt = [70, 10, 130]
    ks = [rand_bf16(n, hkv, d) for n in prompt]
    vs = [rand_bf16(n, hkv, d) for n in prompt]
    cache.extend(prompt)
    for layer in range(layers):
        cache.append(layer, torch.cat(ks), torch.cat(vs))
    for step in range(3):
        cache.extend(1)
        k_tok, v_tok = rand_bf16(3, 1, hkv, d), rand_bf16(3, 1, hkv, d)
        for b in range(3):
            ks[b] = torch.cat([ks[b], k_tok[b]])
            vs[b] = torch.cat([vs[b], v_tok[b]])
        for layer in range(layers):
            cache.append(layer, k_tok, v_tok)
    q = rand_bf16(3, 1, 32, d)
    length = max(len(x) for x in ks)
    k_full = torch.stack([F.pad(x, (0, 0, 0, 0, 0, length - len(x))) for x in ks])
    v_full = torch.stack([F.pad(x, (0, 0, 0, 0, 0, length - len(x))) for x in vs])
    lens = lens_tensor([len(x) for x in ks])
    for layer in range(layers):
        out = attention(q, kv_cache=cache, layer_id=layer, fwd="decode")
        assert_matches_truth(out[:, 0], q[:, 0], k_full, v_full, kv_lens=lens, what=f"cache layer {layer}")
        with attn_backend(ATTN_BACKEND.TORCH):
            torch_out = attention(q, kv_cache=cache, layer_id=layer, fwd="decode")
        assert (out.double() - torch_out.double()).abs().max() < 0.05


# --- the public policy on CUDA --------------------------------------------------------------------------------

def test_public_api_uses_the_kernels_for_decode_and_prefill():
    q, k, v = rand_bf16(2, 1, 32, 128), rand_bf16(2, 500, 8, 128), rand_bf16(2, 500, 8, 128)
    call = backend._canonical(q, k, v, None, None, None, False, None, None, None)
    assert backend.select_backend(call).name == "cuda"
    assert_bitwise_equal(attention(q, k, v), ops.attn_decode(q, k, v), "public decode vs op")
    q_pre = rand_bf16(2, 7, 32, 128)
    call = backend._canonical(q_pre, k, v, None, None, None, True, None, None, None)
    assert backend.select_backend(call).name == "cuda"  # prefill: the kernels too (tests/gpu/.../test_prefill_gpu.py)
    with torch.no_grad():
        out = attention(q_pre, k, v, is_causal=True)
    truth = ref.attention(q_pre, k, v, is_causal=True)
    assert (out.double() - truth).abs().max() < 0.05
    with attn_backend("cuda"):
        assert_bitwise_equal(attention(q_pre, k, v, is_causal=True), out, "explicit cuda vs auto")


def test_training_call_never_uses_the_kernels():
    q = rand_bf16(2, 1, 8, 128).requires_grad_()
    k, v = rand_bf16(2, 50, 2, 128), rand_bf16(2, 50, 2, 128)
    call = backend._canonical(q, k, v, None, None, None, False, None, None, None)
    assert backend.select_backend(call).name in ("flash", "torch")
    attention(q, k, v).float().sum().backward()
    assert q.grad is not None


def test_side_stream():
    q, k, v = rand_bf16(2, 32, 128), rand_bf16(2, 4000, 8, 128), rand_bf16(2, 4000, 8, 128)
    want = ops.attn_decode(q, k, v)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = ops.attn_decode(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert_bitwise_equal(got, want, "side stream")


@pytest.mark.parametrize("name", ["attn_decode", "attn_paged_decode", "paged_kv_append"])
def test_opcheck(name):
    q, k = rand_bf16(2, 8, 128), rand_bf16(2, 64, 2, 128)
    lens = lens_tensor([64, 9])
    k_cache, v_cache, table = make_paged(k, k, lens, 16)
    args = {
        "attn_decode": (q, k, k.clone(), lens, None, 0.1, 0),
        "attn_paged_decode": (q, k_cache, v_cache, table, lens, None, 0.1, 0),
        "paged_kv_append": (k_cache, v_cache, rand_bf16(3, 2, 128), rand_bf16(3, 2, 128), table,
                            lens_tensor([0, 1, 1]), lens_tensor([64, 9, 10])),
    }[name]
    torch.library.opcheck(getattr(torch.ops.astrai, name).default, args)


def test_validation_names_the_op_on_cuda():
    q, k = rand_bf16(2, 8, 96), rand_bf16(2, 10, 2, 96)
    with pytest.raises(RuntimeError, match=r"astrai\.attn_decode: head_dim \(q\.size\(2\)\) must be 64, 128 or 256"):
        ops.attn_decode(q, k, k)
    assert math.isfinite(1.0)
