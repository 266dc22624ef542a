"""Tier 1 (GPU): prefill attention (dense, packed ragged and paged KV) against float64 references; bitwise
suites (repeats, CUDA-graph replay with poisoned outputs, batch invariance, paged vs contiguous, packed vs
dense Q); every bad input of the binding on CUDA tensors; the public policy over a PagedKVCache.

Accuracy: the kernel's max error against the float64 truth is no worse than 2x torch's own bf16 error
(SDPA on the same bf16 inputs with the same explicit keep mask, against the same truth), with a floor of
half a bf16 ulp of the largest output for tiny problems. The truth is computed sequence by sequence, so
ragged rows, ragged keys and causal alignment to each sequence's end are written out independently of the
kernel's conventions.

Bitwise promises, each tested with a negative control:
- determinism: repeated calls and CUDA-graph replays give identical bits (the tile plan is a function of
  the shapes only; no atomics, no KV split);
- batch invariance: a sequence's rows do not depend on the rest of the batch (prefill has no KV split and
  each Q tile reads one sequence), for dense, packed and paged Q;
- paged == contiguous when the same keys are used, and packed Q == dense Q for sequences of equal length: both
  come from the kernel walking the same key tiles in the same order whatever the addressing. The exception:
  at head_dim 128 with pages smaller than 8 keys, the paged kernel copies rows through per-row offsets and
  takes 32-key softmax steps where the contiguous one takes 64 (each the faster on the H200,
  csrc/kernels/attention/prefill_schedule.h), and on an sm_90 GPU the sm_90a wgmma kernel takes the contiguous
  call but not those pages, so there the two agree only within the accuracy bound (each is checked against the
  float64 truth).

Kernel choice: at head_dim 128 on a compute capability 9.0 GPU served by SASS, the sm_90a wgmma kernel runs unless
attention_plan.set_staging(sm90=False); test_prefill_kernel_switch checks both kernels against the truth and that
the switch switches kernels exactly where it should (different bits there, equal bits elsewhere).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from reference import attention as ref
from support.bitwise import (GraphReplay, assert_batch_invariant, assert_bitwise_equal, assert_deterministic,
                             assert_detects_perturbation, assert_replay_matches_eager)

from astrai.extension import ATTN_BACKEND, PagedKVCache, attention, attention_plan, attn_backend
from astrai.extension.backend import attention as backend
from astrai.extension.ops import attention as ops

pytestmark = [pytest.mark.gpu, pytest.mark.requires_cuda_kernels("attention")]

DEVICE = "cuda"
BF16 = torch.bfloat16
EPS = torch.finfo(BF16).eps
HEADS = [(8, 8), (8, 4), (8, 2), (32, 8), (16, 2), (8, 1), (32, 1)]  # GQA 1, 2, 4, 4, 8, MQA 8, MQA 32
FEW_HEADS = [(32, 8), (16, 2), (8, 1), (4, 4)]
HEAD_DIMS = (64, 128, 256)


def _cpu_tier():
    """The CPU tier's table of bad prefill inputs, run here on CUDA tensors (one table, two devices)."""
    path = Path(__file__).resolve().parents[2] / "attention" / "test_attention.py"
    spec = importlib.util.spec_from_file_location("astrai_attention_cpu_tier", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CPU_TIER = _cpu_tier()


def rand_bf16(*shape):
    return torch.randn(*shape, device=DEVICE).to(BF16)


def i32(values):
    return torch.tensor(values, dtype=torch.int32, device=DEVICE)


def indptr(lengths):
    return i32([0] + torch.tensor(lengths).cumsum(0).tolist())


def poison_next_allocations(*nbytes: int) -> None:
    """Free blocks of these sizes filled with 0xFF, which the caching allocator hands to the next requests of
    those sizes: an output element the kernel fails to write then reads 0xFFFF (a bf16 NaN)."""
    blocks = [torch.empty(max(n, 1), dtype=torch.uint8, device=DEVICE).fill_(0xFF) for n in nbytes]
    del blocks


# --- the per-sequence truth -----------------------------------------------------------------------------------

def sdpa_bf16(q, k, v, keep, scale):
    """torch's own bf16 attention for one sequence: q [m, Hq, D], k/v [n, Hkv, D], keep [m, n]."""
    if q.shape[0] == 0 or k.shape[0] == 0:
        return torch.zeros_like(q)
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
                                         attn_mask=keep[None, None], scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])[0].transpose(0, 1)
    return out.masked_fill(~keep.any(-1)[:, None, None], 0.0)


def seq_keep(m, n, *, mask=None, is_causal=False):
    """keep [m, n] for one sequence: mask [m, n] (already cut and padded) and causal aligned to the end."""
    keep = torch.ones(m, n, dtype=torch.bool, device=DEVICE)
    if mask is not None:
        keep &= mask
    if is_causal:
        i = torch.arange(m, device=DEVICE)[:, None]
        j = torch.arange(n, device=DEVICE)[None, :]
        keep &= j <= n - m + i
    return keep


def cut_mask(mask, b, m, n):
    """Sequence b's keep mask [m, n] from a [B, M] or [B, Mq, M] mask indexed by row and key within the
    sequence: keys at or past M and rows at or past Mq keep nothing."""
    if mask is None:
        return None
    out = torch.zeros(m, n, dtype=torch.bool, device=DEVICE)
    mk = min(n, mask.shape[-1])
    if mask.dim() == 2:
        out[:, :mk] = mask[b, None, :mk]
    else:
        mq = min(m, mask.shape[1])
        out[:mq, :mk] = mask[b, :mq, :mk]
    return out


class Tally:
    """Max errors over many sequences: the kernel's and torch's bf16 SDPA's, both against the float64 truth."""

    def __init__(self, scale=None):
        self.scale, self.err, self.base, self.top = scale, 0.0, 0.0, 0.0

    def add(self, got, q, k, v, keep):
        """got [m, Hq, D] bf16 for q [m, Hq, D] over k/v [n, Hkv, D] with keep [m, n]."""
        assert got.dtype == BF16 and got.shape == q.shape
        assert not bool(got.isnan().any()), "NaN in the output (an element not written?)"
        if q.shape[0] == 0:
            return
        if k.shape[0] == 0:
            truth = torch.zeros(q.shape, dtype=torch.float64, device=DEVICE)
        else:
            truth = ref.attention(q[None], k[None], v[None], attn_mask=keep[None], scale=self.scale)[0]
        base = sdpa_bf16(q, k, v, keep, self.scale)
        self.err = max(self.err, (got.double() - truth).abs().max().item())
        self.base = max(self.base, (base.double() - truth).abs().max().item())
        self.top = max(self.top, truth.abs().max().item())
        empty_rows = ~keep.any(-1)
        if bool(empty_rows.any()):
            assert torch.equal(got[empty_rows], torch.zeros_like(got[empty_rows])), "a row keeping no key is not 0"

    def check(self, what=""):
        floor = self.top * EPS / 2 + 1e-6
        assert self.err <= max(2 * self.base, floor), f"{what}: max error {self.err:.3g} vs torch bf16 {self.base:.3g}"


def check_dense(out, q, k, v, *, kv_lens=None, mask=None, is_causal=False, scale=None, valid=None, what=""):
    """out [B, Lq, Hq, D] against the truth over contiguous k/v [B, L, Hkv, D] (valid [B, L]: keys kept)."""
    tally = Tally(scale)
    length = k.shape[1]
    lens = [length] * q.shape[0] if kv_lens is None else [min(max(x, 0), length) for x in kv_lens.tolist()]
    for b, n in enumerate(lens):
        m = q.shape[1]
        keep = seq_keep(m, n, mask=cut_mask(mask, b, m, n), is_causal=is_causal)
        if valid is not None:
            keep &= valid[b, None, :n]
        tally.add(out[b], q[b], k[b, :n], v[b, :n], keep)
    tally.check(what)


def check_ragged(out, q, ks, vs, q_lens, *, mask=None, is_causal=False, scale=None, what=""):
    """out [Tq, Hq, D] against the truth; ks/vs: each sequence's keys [n_b, Hkv, D]."""
    tally = Tally(scale)
    start = 0
    for b, m in enumerate(q_lens):
        n = ks[b].shape[0]
        keep = seq_keep(m, n, mask=cut_mask(mask, b, m, n), is_causal=is_causal)
        tally.add(out[start:start + m], q[start:start + m], ks[b], vs[b], keep)
        start += m
    tally.check(what)


def make_paged(k, v, page_size, *, extra_pages=3):
    """Scatter contiguous [B, L, Hkv, D] into a shuffled paged cache (unused slots random, never read);
    returns k_cache, v_cache, page_table [B, ceil(L / page_size)]."""
    batch, length = k.shape[:2]
    max_pages = max(1, -(-length // page_size))
    num_pages = batch * max_pages + extra_pages
    table = torch.randperm(num_pages, device=DEVICE)[:batch * max_pages].view(batch, max_pages).to(torch.int32)
    k_cache = rand_bf16(num_pages, page_size, *k.shape[2:])
    v_cache = rand_bf16(num_pages, page_size, *k.shape[2:])
    pad = max_pages * page_size - length
    k_cache[table.long()] = F.pad(k, (0, 0, 0, 0, 0, pad)).view(batch, max_pages, page_size, *k.shape[2:])
    v_cache[table.long()] = F.pad(v, (0, 0, 0, 0, 0, pad)).view(batch, max_pages, page_size, *k.shape[2:])
    return k_cache, v_cache, table


def ragged_inputs(q_lens, kv_lens, heads, head_dim):
    """Packed q [Tq, Hq, D], packed k/v [Tkv, Hkv, D], their indptrs, and per-sequence key views."""
    hq, hkv = heads
    q = rand_bf16(sum(q_lens), hq, head_dim)
    k, v = rand_bf16(sum(kv_lens), hkv, head_dim), rand_bf16(sum(kv_lens), hkv, head_dim)
    kv_ptr = indptr(kv_lens).tolist()
    ks = [k[kv_ptr[b]:kv_ptr[b + 1]] for b in range(len(kv_lens))]
    vs = [v[kv_ptr[b]:kv_ptr[b + 1]] for b in range(len(kv_lens))]
    return q, k, v, indptr(q_lens), indptr(kv_lens), ks, vs


# --- correctness: dense Q, contiguous K/V ---------------------------------------------------------------------

DENSE_CASES = [(1, 1, 1, None), (2, 128, 128, None), (3, 77, 300, [300, 77, 40]), (2, 19, 989, [0, 989])]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("heads", HEADS, ids=[f"{a}-{b}" for a, b in HEADS])
@pytest.mark.parametrize("case", DENSE_CASES, ids=[f"{b}x{lq}x{lk}" for b, lq, lk, _ in DENSE_CASES])
def test_dense_matches_reference(case, heads, head_dim, causal):
    """q_len < kv_len (prior context), kv_lens < q_len (causal rows before the first key: zeros), length 0."""
    batch, q_len, length, lens = case
    hq, hkv = heads
    q = rand_bf16(batch, q_len, hq, head_dim)
    k, v = rand_bf16(batch, length, hkv, head_dim), rand_bf16(batch, length, hkv, head_dim)
    kv_lens = None if lens is None else i32(lens)
    poison_next_allocations(q.numel() * 2)
    out = ops.attn_prefill(q, k, v, kv_lens, is_causal=causal)
    assert out.shape == q.shape and out.is_contiguous()
    check_dense(out, q, k, v, kv_lens=kv_lens, is_causal=causal, what=f"dense {case}")


def test_dense_large_awkward_and_scale():
    q = rand_bf16(2, 1029, 32, 128)
    k, v = rand_bf16(2, 2051, 8, 128), rand_bf16(2, 2051, 8, 128)
    lens = i32([2051, 1500])
    out = ops.attn_prefill(q, k, v, lens, is_causal=True)
    check_dense(out, q, k, v, kv_lens=lens, is_causal=True, what="1029 x 2051 causal")
    out = ops.attn_prefill(q[:, :300], k, v, lens, scale=0.3)
    check_dense(out, q[:, :300], k, v, kv_lens=lens, scale=0.3, what="scale 0.3")
    out = ops.attn_prefill(q[:, :300], k, v, lens, scale=-0.3)  # negative: the mma.sync kernel serves it at D = 128
    check_dense(out, q[:, :300], k, v, kv_lens=lens, scale=-0.3, what="scale -0.3")


def test_dense_non_contiguous_views():
    qkv = rand_bf16(2, 50, 48, 128)               # q heads 0..31 of a fused projection
    kv = rand_bf16(2, 300, 2, 8, 128)             # K and V interleaved in one buffer
    q, k, v = qkv[:, :, :32], kv[:, :, 0], kv[:, :, 1]
    lens = i32([300, 120])
    out = ops.attn_prefill(q, k, v, lens, is_causal=True)
    check_dense(out, q, k, v, kv_lens=lens, is_causal=True, what="strided views")


# --- correctness: packed ragged Q and K/V ---------------------------------------------------------------------

RAGGED_CASES = {
    "self-70-10-130": ([70, 10, 130], [70, 10, 130]),
    "context-70-10-130": ([70, 10, 130], [100, 10, 500]),
    "zero-lengths": ([0, 5, 0, 33, 1, 7], [7, 0, 0, 40, 1, 3]),   # q rows with no keys, keys with no rows
    "one": ([1], [1]),
}


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("heads", FEW_HEADS, ids=[f"{a}-{b}" for a, b in FEW_HEADS])
@pytest.mark.parametrize("case", list(RAGGED_CASES))
def test_ragged_matches_reference(case, heads, head_dim, causal):
    q_lens, kv_lens = RAGGED_CASES[case]
    q, k, v, qo, kv, ks, vs = ragged_inputs(q_lens, kv_lens, heads, head_dim)
    poison_next_allocations(q.numel() * 2)
    out = ops.attn_prefill_ragged(q, k, v, qo, kv, is_causal=causal)
    assert out.shape == q.shape and out.is_contiguous()
    check_ragged(out, q, ks, vs, q_lens, is_causal=causal, what=f"ragged {case}")


@pytest.mark.parametrize("heads", HEADS, ids=[f"{a}-{b}" for a, b in HEADS])
def test_ragged_every_gqa_ratio(heads):
    q_lens, kv_lens = [70, 10, 130], [100, 10, 500]
    q, k, v, qo, kv, ks, vs = ragged_inputs(q_lens, kv_lens, heads, 128)
    out = ops.attn_prefill_ragged(q, k, v, qo, kv, is_causal=True)
    check_ragged(out, q, ks, vs, q_lens, is_causal=True, what=f"ragged heads {heads}")


# --- correctness: paged K/V (dense and packed Q); paged == contiguous bitwise ---------------------------------

# Where paged and contiguous kernels take different softmax steps (prefill_schedule.h): head_dim 128 with pages
# smaller than a thread's row group of 8 keys (copied through per-row offsets).
SPLIT_STEP_HEAD_DIM = 128
ROW_GROUP_KEYS = 8


def same_steps(head_dim, page_size):
    return head_dim != SPLIT_STEP_HEAD_DIM or page_size >= ROW_GROUP_KEYS


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("heads", [(32, 8), (8, 1)], ids=["32-8", "8-1"])
@pytest.mark.parametrize("page_size", [1, 16, 128])
def test_paged_dense_q_matches_reference_and_contiguous(page_size, heads, head_dim, causal):
    hq, hkv = heads
    q = rand_bf16(3, 40, hq, head_dim)
    k, v = rand_bf16(3, 300, hkv, head_dim), rand_bf16(3, 300, hkv, head_dim)
    lens = i32([300, 40, 17])  # ragged, not multiples of the page size; 17 < 40 rows
    k_cache, v_cache, table = make_paged(k, v, page_size)
    out = ops.attn_paged_prefill(q, k_cache, v_cache, table, lens, is_causal=causal)
    check_dense(out, q, k, v, kv_lens=lens, is_causal=causal, what=f"paged ps={page_size}")
    contiguous = ops.attn_prefill(q, k, v, lens, is_causal=causal)
    if same_steps(head_dim, page_size):
        assert_bitwise_equal(out, contiguous, "paged vs contiguous (same keys)")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("page_size", [1, 16, 128])
def test_paged_ragged_q_matches_reference_and_contiguous(page_size, head_dim, causal):
    q_lens, kv_lens = [70, 10, 130, 0], [100, 10, 500, 3]
    batch, length = len(q_lens), max(kv_lens)
    q, _, _, qo, kv, _, _ = ragged_inputs(q_lens, kv_lens, (32, 8), head_dim)
    k, v = rand_bf16(batch, length, 8, head_dim), rand_bf16(batch, length, 8, head_dim)
    lens = i32(kv_lens)
    k_cache, v_cache, table = make_paged(k, v, page_size)
    out = ops.attn_paged_prefill(q, k_cache, v_cache, table, lens, qo_indptr=qo, is_causal=causal)
    ks = [k[b, :n] for b, n in enumerate(kv_lens)]
    vs = [v[b, :n] for b, n in enumerate(kv_lens)]
    check_ragged(out, q, ks, vs, q_lens, is_causal=causal, what=f"paged ragged ps={page_size}")
    contiguous = ops.attn_prefill_ragged(q, torch.cat(ks), torch.cat(vs), qo, kv, is_causal=causal)
    if same_steps(head_dim, page_size):
        assert_bitwise_equal(out, contiguous, "paged vs contiguous ragged (same keys)")


# --- masks ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("mask_rank", [2, 3])
@pytest.mark.parametrize("kind", ["dense", "ragged", "paged", "paged_ragged"])
def test_masks(kind, mask_rank):
    """Keep masks by row and key within the sequence; a fully masked sequence and masked rows give zeros;
    ragged / paged masks shorter than the keys (keys past M dropped) and than the rows (rows past dropped)."""
    causal = True
    if kind in ("dense", "paged"):
        q = rand_bf16(3, 33, 16, 128)
        k, v = rand_bf16(3, 200, 2, 128), rand_bf16(3, 200, 2, 128)
        lens = i32([200, 70, 5])
        keys = 200 if kind == "dense" else 150
        mask = torch.rand(3, keys, device=DEVICE) > 0.3 if mask_rank == 2 else \
            torch.rand(3, 33, keys, device=DEVICE) > 0.3
        mask[1] = False
        if mask_rank == 3:
            mask[0, 5] = False  # one row with nothing kept
        if kind == "dense":
            out = ops.attn_prefill(q, k, v, lens, mask=mask, is_causal=causal)
        else:
            k_cache, v_cache, table = make_paged(k, v, 16)
            out = ops.attn_paged_prefill(q, k_cache, v_cache, table, lens, mask=mask, is_causal=causal)
        check_dense(out, q, k, v, kv_lens=lens, mask=mask, is_causal=causal, what=f"{kind} mask {mask_rank}-D")
        assert torch.equal(out[1], torch.zeros_like(out[1]))
        return
    q_lens, kv_lens = [70, 10, 130], [100, 10, 500]
    q, k, v, qo, kv, ks, vs = ragged_inputs(q_lens, kv_lens, (16, 2), 128)
    mask = torch.rand(3, 400, device=DEVICE) > 0.3 if mask_rank == 2 else \
        torch.rand(3, 100, 400, device=DEVICE) > 0.3  # 400 < 500 keys; 100 < 130 rows
    mask[1] = False
    if kind == "ragged":
        out = ops.attn_prefill_ragged(q, k, v, qo, kv, mask=mask, is_causal=causal)
    else:
        kd = torch.stack([F.pad(x, (0, 0, 0, 0, 0, 500 - len(x))) for x in ks])
        vd = torch.stack([F.pad(x, (0, 0, 0, 0, 0, 500 - len(x))) for x in vs])
        k_cache, v_cache, table = make_paged(kd, vd, 16)
        out = ops.attn_paged_prefill(q, k_cache, v_cache, table, i32(kv_lens), qo_indptr=qo, mask=mask,
                                     is_causal=causal)
    check_ragged(out, q, ks, vs, q_lens, mask=mask, is_causal=causal, what=f"{kind} mask {mask_rank}-D")
    assert torch.equal(out[70:80], torch.zeros_like(out[70:80]))


@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged"])
def test_one_row_3d_mask_and_expanded_masks(paged):
    """A [B, 1, M] mask over packed rows: row 0 masked, every later row keeps nothing. An expanded [B, Lq, L]
    view (row stride 0) over dense rows is the key mask of every row."""
    q_lens, kv_lens = [5, 1, 40], [30, 3, 40]
    q, k, v, qo, kv, ks, vs = ragged_inputs(q_lens, kv_lens, (8, 2), 64)
    mask = torch.rand(3, 1, 35, device=DEVICE) > 0.3
    if paged:
        kd = torch.stack([F.pad(x, (0, 0, 0, 0, 0, 40 - len(x))) for x in ks])
        vd = torch.stack([F.pad(x, (0, 0, 0, 0, 0, 40 - len(x))) for x in vs])
        k_cache, v_cache, table = make_paged(kd, vd, 16)
        out = ops.attn_paged_prefill(q, k_cache, v_cache, table, i32(kv_lens), qo_indptr=qo, mask=mask)
    else:
        out = ops.attn_prefill_ragged(q, k, v, qo, kv, mask=mask)
    check_ragged(out, q, ks, vs, q_lens, mask=mask, what="[B, 1, M] mask")
    assert torch.equal(out[1:5], torch.zeros_like(out[1:5]))
    qd = rand_bf16(3, 12, 8, 64)
    kd, vd = rand_bf16(3, 50, 2, 64), rand_bf16(3, 50, 2, 64)
    key_mask = torch.rand(3, 50, device=DEVICE) > 0.3
    expanded = key_mask[:, None].expand(3, 12, 50)
    out = ops.attn_prefill(qd, kd, vd, mask=expanded, is_causal=True)
    assert_bitwise_equal(out, ops.attn_prefill(qd, kd, vd, mask=key_mask, is_causal=True), "expanded vs key mask")
    check_dense(out, qd, kd, vd, mask=key_mask, is_causal=True, what="expanded mask")


def test_mask_strided_views():
    """A mask view with non-unit strides except the last (a slice of a bigger mask) is read in place."""
    q = rand_bf16(2, 20, 8, 64)
    k, v = rand_bf16(2, 90, 2, 64), rand_bf16(2, 90, 2, 64)
    big = torch.rand(2, 40, 90 + 7, device=DEVICE) > 0.4
    mask = big[:, ::2, 3:93]
    out = ops.attn_prefill(q, k, v, mask=mask, is_causal=True)
    check_dense(out, q, k, v, mask=mask, is_causal=True, what="strided mask")


# --- empty inputs, clamps, out-of-range ids: defined results, no illegal access -------------------------------

def test_empty_and_zero_length_inputs():
    q, k = rand_bf16(0, 5, 8, 128), rand_bf16(0, 10, 2, 128)
    assert ops.attn_prefill(q, k, k).shape == (0, 5, 8, 128)
    q, k = rand_bf16(2, 0, 8, 128), rand_bf16(2, 10, 2, 128)
    assert ops.attn_prefill(q, k, k).shape == (2, 0, 8, 128)
    q = rand_bf16(2, 5, 8, 128)
    for out in (ops.attn_prefill(q, rand_bf16(2, 0, 2, 128), rand_bf16(2, 0, 2, 128)),       # no keys at all
                ops.attn_prefill(q, rand_bf16(2, 10, 2, 128), rand_bf16(2, 10, 2, 128), i32([0, 0])),
                ops.attn_paged_prefill(q, rand_bf16(0, 16, 2, 128), rand_bf16(0, 16, 2, 128),
                                       i32([[0, 1], [2, 3]]), i32([20, 3])),                      # no pages
                ops.attn_paged_prefill(q, rand_bf16(6, 16, 2, 128), rand_bf16(6, 16, 2, 128),
                                       i32([[0, 1], [2, 3]]), i32([20, 3]),
                                       mask=torch.ones(2, 0, dtype=torch.bool, device=DEVICE))):  # empty mask
        assert out.shape == q.shape
        assert torch.equal(out, torch.zeros_like(out))
    packed = rand_bf16(0, 8, 128)
    assert ops.attn_prefill_ragged(packed, rand_bf16(0, 2, 128), rand_bf16(0, 2, 128), i32([0]), i32([0])).shape == \
        (0, 8, 128)
    assert ops.attn_prefill_ragged(packed, rand_bf16(4, 2, 128), rand_bf16(4, 2, 128), i32([0, 0]),
                                   i32([0, 4])).shape == (0, 8, 128)
    out = ops.attn_prefill_ragged(rand_bf16(6, 8, 128), rand_bf16(4, 2, 128), rand_bf16(4, 2, 128), i32([0, 6]),
                                  i32([0, 0]))
    assert torch.equal(out, torch.zeros_like(out))


def test_lengths_clamp_and_bad_page_ids_are_dropped():
    batch, length, ps = 3, 256, 16
    q = rand_bf16(batch, 40, 8, 128)
    k, v = rand_bf16(batch, length, 2, 128), rand_bf16(batch, length, 2, 128)
    lens = i32([10_000, -5, 200])  # clamped to [0, 256]
    k_cache, v_cache, table = make_paged(k, v, ps)
    table[0, 3] = -1
    table[2, 1] = k_cache.shape[0] + 7
    table[2, 5] = 2**31 - 1
    out = ops.attn_paged_prefill(q, k_cache, v_cache, table, lens, is_causal=True)
    torch.cuda.synchronize()
    valid = torch.ones(batch, length, dtype=torch.bool, device=DEVICE)
    valid[0, 48:64] = False
    valid[2, 16:32] = False
    valid[2, 80:96] = False
    check_dense(out, q, k, v, kv_lens=lens.clamp(0, length), valid=valid, is_causal=True, what="clamp + bad pages")
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    dense = ops.attn_prefill(q, k, v, lens, is_causal=False)  # contiguous kv_lens clamp to [0, L] too
    check_dense(dense, q, k, v, kv_lens=lens.clamp(0, length), what="contiguous clamp")


@pytest.mark.parametrize("qo,kv", [([0, 30, 10, 60], [0, 50, 100, 150]),     # qo decreasing
                                   ([0, 30, 50, 70], [0, 50, 100, 10_000]),  # kv past the keys
                                   ([-20, 30, 50, 9_999], [5, -3, 100, 150]),
                                   ([0, 2**31 - 1, 0, 2**31 - 1], [0, 0, 2**31 - 1, 2**31 - 1])])
def test_unchecked_bad_indptr_never_faults(qo, kv):
    """check_indptr=False hands garbage to the device, which clamps: no fault, and the context stays usable."""
    q, k = rand_bf16(60, 8, 128), rand_bf16(150, 2, 128)
    with pytest.raises(ValueError, match="must start at >= 0, never decrease"):
        ops.attn_prefill_ragged(q, k, k, i32(qo), i32(kv))
    ops.attn_prefill_ragged(q, k, k, i32(qo), i32(kv), check_indptr=False, is_causal=True)
    k_cache, v_cache, table = make_paged(rand_bf16(3, 64, 2, 128), rand_bf16(3, 64, 2, 128), 16)
    ops.attn_paged_prefill(q, k_cache, v_cache, table, i32([64, 9, 70]), qo_indptr=i32(qo), check_indptr=False)
    torch.cuda.synchronize()
    q_lens, kv_lens = [30, 20, 10], [50, 50, 50]
    good = ragged_inputs(q_lens, kv_lens, (8, 2), 128)
    out = ops.attn_prefill_ragged(*good[:5], is_causal=True)
    check_ragged(out, good[0], good[5], good[6], q_lens, is_causal=True, what="after garbage indptr")


def sm90_prefill_kernel_applies() -> bool:
    """Whether this session's image serves the sm_90a prefill kernel here (an sm_90 GPU served by SASS)."""
    from astrai.extension import loader
    desc = loader.describe()
    chosen, devices = desc.get("chosen") or {}, desc.get("devices") or [{}]
    return str(devices[0].get("capability")) == "9.0" and chosen.get("serves") == "sass"


@pytest.fixture
def policy():
    """The attention policy, restored to its defaults after the test."""
    attention_plan.reset()
    yield attention_plan
    attention_plan.reset()


@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_prefill_kernel_switch(policy, paged, causal):
    """set_staging(sm90=False) keeps the mma.sync kernel at head_dim 128: both kernels match the truth, and their
    bits differ exactly where the sm_90a kernel applies (the switch's negative control); head_dim 64 ignores it.
    The probe names the kernel the op ran."""
    q = rand_bf16(3, 150, 32, 128)
    k, v = rand_bf16(3, 400, 8, 128), rand_bf16(3, 400, 8, 128)
    lens = i32([400, 150, 37])
    k_cache, v_cache, table = make_paged(k, v, 16)

    def run():
        if paged:
            return ops.attn_paged_prefill(q, k_cache, v_cache, table, lens, is_causal=causal)
        return ops.attn_prefill(q, k, v, lens, is_causal=causal)

    def probed():
        return policy.probe("prefill", batch=3, q_len=150, num_q_heads=32, num_kv_heads=8, head_dim=128,
                            kv_len=table.shape[1] * 16 if paged else 400, page_size=16 if paged else 0).plan

    default, default_plan = run(), probed()
    policy.set_staging(sm90=False)
    mma, mma_plan = run(), probed()
    policy.set_staging(sm90=True)
    assert_bitwise_equal(run(), default, "sm90 switch back on vs default")
    for out, what in ((default, "default kernel"), (mma, "mma.sync kernel")):
        check_dense(out, q, k, v, kv_lens=lens, is_causal=causal, what=what)
    assert mma_plan["kernel"] == "mma"
    if sm90_prefill_kernel_applies():
        assert default_plan["kernel"] == "sm90"
        assert not torch.equal(default, mma), "set_staging(sm90=False) did not change the kernel on an sm_90 GPU"
    else:
        assert default_plan["kernel"] == "mma"
        assert_bitwise_equal(default, mma, "the switch changed a GPU without the sm_90a kernel")
    q64, k64, v64 = rand_bf16(2, 70, 8, 64), rand_bf16(2, 90, 2, 64), rand_bf16(2, 90, 2, 64)
    policy.set_staging(sm90=False)
    off = ops.attn_prefill(q64, k64, v64, is_causal=causal)
    policy.reset()
    assert_bitwise_equal(ops.attn_prefill(q64, k64, v64, is_causal=causal), off, "head_dim 64 ignores the switch")


def test_probe_names_the_kernels_the_op_launches(policy):
    """The plan probe() reports is the one the op launches: the profiler sees the kernel it names (and, for
    decode, a combine exactly when the plan has splits)."""
    from torch.profiler import ProfilerActivity, profile

    def kernels(fn):
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return " ".join(e.name for e in prof.events() if e.device_type.name == "CUDA")

    q, k, v = rand_bf16(2, 300, 32, 128), rand_bf16(2, 500, 8, 128), rand_bf16(2, 500, 8, 128)
    for sm90 in (True, False):
        policy.set_staging(sm90=sm90)
        plan = policy.probe("prefill", batch=2, q_len=300, num_q_heads=32, num_kv_heads=8, head_dim=128,
                            kv_len=500).plan
        names = kernels(lambda: ops.attn_prefill(q, k, v, is_causal=True))
        assert ("prefill_bf16_sm90_kernel" in names) == (plan["kernel"] == "sm90"), (plan, names)
        assert ("prefill_bf16_kernel" in names) == (plan["kernel"] == "mma"), (plan, names)
    qd = rand_bf16(4, 32, 128)
    for length, split in ((4096, 0), (300, 0), (4096, 8192)):
        kd, vd = rand_bf16(4, length, 8, 128), rand_bf16(4, length, 8, 128)
        plan = policy.probe("decode", batch=4, num_q_heads=32, num_kv_heads=8, head_dim=128, kv_len=length,
                            kv_split_size=split).plan
        names = kernels(lambda: ops.attn_decode(qd, kd, vd, kv_split_size=split))
        assert ("decode_combine_kernel" in names) == (plan["splits"] > 1), (plan, names)


def same_bits_without_tma(policy, run, what):
    """run() by default, and again with set_staging(tma=False) (every K/V tile by cp.async): the same bits, and
    finite. Returns the default output."""
    default = run()
    policy.set_staging(tma=False)
    copied = run()
    policy.set_staging(tma=True)
    assert_bitwise_equal(copied, default, f"{what}: set_staging(tma=False) vs default")
    assert_detects_perturbation(default)
    assert torch.isfinite(default).all(), f"{what}: non-finite output"
    return default


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("layout", ["dense-lens", "dense-whole-tiles", "views", "ragged"])
def test_prefill_tma_switch_same_bits(policy, layout, causal):
    """The sm_90a kernel copies whole tiles of contiguous K/V by TMA and the rest by cp.async;
    set_staging(tma=False) copies every tile by cp.async. The same bytes land either way: the same bits, both
    at the truth. Keys past each sequence's length hold NaN in the dense case: a tile that reaches past them must
    not be copied by TMA (cp.async zero-fills them). Elsewhere the switch changes nothing."""
    if layout == "ragged":
        q_lens = [70, 10, 300]
        q, k, v, qo, kv, ks, vs = ragged_inputs(q_lens, [100, 10, 500], (32, 8), 128)

        def run():
            return ops.attn_prefill_ragged(q, k, v, qo, kv, is_causal=causal)

        def check(out, what):
            check_ragged(out, q, ks, vs, q_lens, is_causal=causal, what=what)
    else:
        lens = None
        if layout == "dense-lens":
            q, k, v = rand_bf16(3, 150, 32, 128), rand_bf16(3, 400, 8, 128), rand_bf16(3, 400, 8, 128)
            lens = i32([400, 150, 37])
            for b, n in enumerate(lens.tolist()):
                k[b, n:], v[b, n:] = float("nan"), float("nan")
        elif layout == "dense-whole-tiles":
            q, k, v = rand_bf16(2, 384, 32, 128), rand_bf16(2, 384, 8, 128), rand_bf16(2, 384, 8, 128)
        else:  # K and V interleaved in one buffer, q heads of a fused projection
            qkv, kvs = rand_bf16(2, 50, 48, 128), rand_bf16(2, 300, 2, 8, 128)
            q, k, v = qkv[:, :, :32], kvs[:, :, 0], kvs[:, :, 1]
            lens = i32([300, 120])

        def run():
            return ops.attn_prefill(q, k, v, lens, is_causal=causal)

        def check(out, what):
            check_dense(out, q, k, v, kv_lens=lens, is_causal=causal, what=what)

    check(same_bits_without_tma(policy, run, layout), f"{layout}, default copies")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("page_size", [8, 16, 32, 128])
def test_paged_prefill_tma_switch_same_bits(policy, page_size, causal):
    """Paged K/V: the sm_90a kernel copies whole tiles by TMA, one box per page's part of a tile (a page id out of
    range is a box outside the cache: zeros, its keys dropped), the tile past the last whole one by cp.async.
    set_staging(tma=False) copies every tile by cp.async: the same bits, both at the truth. Keys past each
    length hold NaN in their pages, and so does every page the table does not name."""
    q = rand_bf16(3, 150, 32, 128)
    k, v = rand_bf16(3, 400, 8, 128), rand_bf16(3, 400, 8, 128)
    lens = i32([400, 150, 37])
    for b, n in enumerate(lens.tolist()):
        k[b, n:], v[b, n:] = float("nan"), float("nan")
    k_cache, v_cache, table = make_paged(k, v, page_size)
    named = torch.zeros(k_cache.shape[0], dtype=torch.bool, device=DEVICE)
    named[table.long().flatten()] = True
    k_cache[~named], v_cache[~named] = float("nan"), float("nan")
    valid = torch.ones(3, 400, dtype=torch.bool, device=DEVICE)
    for b, slot, bad in [(0, 1, -1), (0, 300 // page_size, k_cache.shape[0] + 5), (1, 1, 2**31 - 1)]:
        table[b, slot] = bad
        valid[b, slot * page_size:(slot + 1) * page_size] = False

    def run():
        return ops.attn_paged_prefill(q, k_cache, v_cache, table, lens, is_causal=causal)

    default = same_bits_without_tma(policy, run, f"paged ps={page_size}")
    check_dense(default, q, k, v, kv_lens=lens, is_causal=causal, valid=valid, what=f"paged ps={page_size}")


# --- bitwise suites -------------------------------------------------------------------------------------------

def _runner(kind):
    """A big-enough call of each kind (GQA 32/8, D = 128) and its inputs."""
    if kind == "dense":
        q = rand_bf16(2, 1000, 32, 128)
        k, v = rand_bf16(2, 2048, 8, 128), rand_bf16(2, 2048, 8, 128)
        lens = i32([2048, 1337])
        mask = torch.rand(2, 1000, 2048, device=DEVICE) > 0.1
        inputs = dict(q=q, k=k, v=v, lens=lens, mask=mask)
        return inputs, lambda: ops.attn_prefill(q, k, v, lens, mask=mask, is_causal=True)
    q_lens, kv_lens = [700, 10, 1300, 0, 33], [1000, 10, 1300, 5, 2000]
    q, k, v, qo, kv, ks, vs = ragged_inputs(q_lens, kv_lens, (32, 8), 128)
    if kind == "ragged":
        inputs = dict(q=q, k=k, v=v, qo=qo, kv=kv)
        return inputs, lambda: ops.attn_prefill_ragged(q, k, v, qo, kv, is_causal=True, check_indptr=False)
    kd = torch.stack([F.pad(x, (0, 0, 0, 0, 0, 2000 - len(x))) for x in ks])
    vd = torch.stack([F.pad(x, (0, 0, 0, 0, 0, 2000 - len(x))) for x in vs])
    k_cache, v_cache, table = make_paged(kd, vd, 16)
    lens = i32(kv_lens)
    inputs = dict(q=q, k_cache=k_cache, v_cache=v_cache, table=table, lens=lens, qo=qo)
    return inputs, lambda: ops.attn_paged_prefill(q, k_cache, v_cache, table, lens, qo_indptr=qo, is_causal=True,
                                                  check_indptr=False)


@pytest.mark.parametrize("kind", ["dense", "ragged", "paged"])
def test_more_tiles_than_sms_match_reference(kind):
    """The bitwise suites' calls have 250-540 Q tiles x head blocks, more than a GPU has SMs: the persistent sm_90a
    kernel's blocks take several each, in the order its counter hands them out (idle tiles and an empty sequence
    among them); every row against the truth."""
    inputs, run = _runner(kind)
    out = run()
    if kind == "dense":
        check_dense(out, inputs["q"], inputs["k"], inputs["v"], kv_lens=inputs["lens"], mask=inputs["mask"],
                    is_causal=True, what="dense, 2 x 1000 rows")
        return
    q_lens, kv_lens = [700, 10, 1300, 0, 33], [1000, 10, 1300, 5, 2000]  # _runner's
    if kind == "ragged":
        kv_ptr = indptr(kv_lens).tolist()
        ks = [inputs["k"][kv_ptr[b]:kv_ptr[b + 1]] for b in range(len(kv_lens))]
        vs = [inputs["v"][kv_ptr[b]:kv_ptr[b + 1]] for b in range(len(kv_lens))]
    else:  # each sequence's pages in table order
        table = inputs["table"].long()
        ks = [inputs["k_cache"][table[b]].flatten(0, 1)[:n] for b, n in enumerate(kv_lens)]
        vs = [inputs["v_cache"][table[b]].flatten(0, 1)[:n] for b, n in enumerate(kv_lens)]
    check_ragged(out, inputs["q"], ks, vs, q_lens, is_causal=True, what=kind)


@pytest.mark.parametrize("kind", ["dense", "ragged", "paged"])
def test_repeated_runs_are_bitwise_identical(kind):
    _, run = _runner(kind)
    first = assert_deterministic(run, runs=10, what=kind)
    assert_detects_perturbation(first[0])


def _random_split(total, parts):
    """`parts` non-negative lengths summing to `total` (so every packed row belongs to a sequence)."""
    cuts = sorted(torch.randint(0, total + 1, (parts - 1,)).tolist())
    return [b - a for a, b in zip([0] + cuts, cuts + [total])]


@pytest.mark.parametrize("kind", ["dense", "ragged", "paged"])
def test_cuda_graph_replay_is_bitwise_identical_to_eager(kind):
    """New values (lengths, indptrs, page tables included) in the captured inputs: the replay recomputes the
    tile map on the device and rewrites every element of the NaN-poisoned static output."""
    inputs, run = _runner(kind)
    replay = GraphReplay(run)

    def refresh(trial):
        for name, t in inputs.items():
            if t.dtype == BF16:
                t.copy_(rand_bf16(*t.shape))
            elif t.dtype == torch.bool:
                t.copy_(torch.rand(t.shape, device=DEVICE) > 0.1)
        if kind == "dense":
            inputs["lens"].copy_(i32(torch.randint(0, 2049, (2,)).tolist()))
        else:
            batch = inputs["qo"].numel() - 1
            inputs["qo"].copy_(indptr(_random_split(inputs["q"].shape[0], batch)))
            if kind == "ragged":
                inputs["kv"].copy_(indptr(_random_split(inputs["k"].shape[0], batch)))
            else:
                inputs["lens"].copy_(i32(torch.randint(0, 2001, (batch,)).tolist()))
                table = inputs["table"]
                table.copy_(table.view(-1)[torch.randperm(table.numel(), device=DEVICE)].view(table.shape))

    assert_replay_matches_eager(replay, run, refresh, trials=3, what=f"{kind} graph replay")
    assert_detects_perturbation(replay.static_outputs()[0])


def test_batch_invariance_dense():
    """A sequence's rows do not depend on the rest of the batch (prefill has no KV split)."""
    q = rand_bf16(6, 129, 32, 128)
    k, v = rand_bf16(6, 700, 8, 128), rand_bf16(6, 700, 8, 128)
    lens = i32([700, 1, 77, 129, 650, 0])
    mask = torch.rand(6, 129, 700, device=DEVICE) > 0.2

    def run(q_, k_, v_, lens_, mask_):
        return ops.attn_prefill(q_, k_, v_, lens_, mask=mask_, is_causal=True)

    full = assert_batch_invariant(run, [q, k, v, lens, mask],
                                  [slice(0, 1), slice(1, 2), slice(2, 5), slice(5, 6), slice(3, 6)], "dense")
    assert_detects_perturbation(full[0])


@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged"])
def test_batch_invariance_ragged(paged):
    """Sequence b packed alone (qo_indptr [0, m_b]) gives the same bits as inside the full packed batch."""
    q_lens, kv_lens = [70, 10, 130, 0, 257], [100, 10, 500, 3, 257]
    q, k, v, qo, kv, ks, vs = ragged_inputs(q_lens, kv_lens, (32, 8), 128)
    kd = torch.stack([F.pad(x, (0, 0, 0, 0, 0, 500 - len(x))) for x in ks])
    vd = torch.stack([F.pad(x, (0, 0, 0, 0, 0, 500 - len(x))) for x in vs])
    k_cache, v_cache, table = make_paged(kd, vd, 16)
    lens = i32(kv_lens)

    def run(q_, qo_, rows):
        if paged:
            return ops.attn_paged_prefill(q_, k_cache, v_cache, table[rows], lens[rows], qo_indptr=qo_,
                                          is_causal=True)
        kv_ = indptr([kv_lens[b] for b in range(rows.start, rows.stop)])
        return ops.attn_prefill_ragged(q_, torch.cat(ks[rows]), torch.cat(vs[rows]), qo_, kv_, is_causal=True)

    full = run(q, qo, slice(0, 5))
    starts = qo.tolist()
    for first, last in ((0, 1), (1, 2), (2, 3), (4, 5), (1, 4)):
        rows = slice(starts[first], starts[last])
        part = run(q[rows], indptr(q_lens[first:last]), slice(first, last))
        assert_bitwise_equal(part, full[rows], f"sequences {first}:{last}")
    assert_detects_perturbation(full)


@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged"])
def test_packed_q_equals_dense_q(paged):
    """Sequences of equal length: the packed schedule gives the dense schedule's bits."""
    q = rand_bf16(3, 150, 32, 128)
    k, v = rand_bf16(3, 400, 8, 128), rand_bf16(3, 400, 8, 128)
    lens = i32([400, 150, 20])
    qo = indptr([150] * 3)
    if paged:
        k_cache, v_cache, table = make_paged(k, v, 16)
        dense = ops.attn_paged_prefill(q, k_cache, v_cache, table, lens, is_causal=True)
        packed = ops.attn_paged_prefill(q.flatten(0, 1), k_cache, v_cache, table, lens, qo_indptr=qo, is_causal=True)
    else:
        dense = ops.attn_prefill(q, k, v, lens, is_causal=True)
        ks = torch.cat([k[b, :n] for b, n in enumerate(lens.tolist())])
        vs = torch.cat([v[b, :n] for b, n in enumerate(lens.tolist())])
        packed = ops.attn_prefill_ragged(q.flatten(0, 1), ks, vs, qo, indptr(lens.tolist()), is_causal=True)
    assert_bitwise_equal(packed, dense.flatten(0, 1), "packed vs dense Q")


# --- bad input on CUDA tensors --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,argument,what,change,message", CPU_TIER.PREFILL_BAD, ids=CPU_TIER.PREFILL_BAD_IDS)
def test_bad_input_raises_before_launch(kind, argument, what, change, message):
    CPU_TIER.check_prefill_rejects(kind, argument, change, message, device=DEVICE)
    torch.cuda.synchronize()


DEVICE_BAD = [
    ("dense", "k", lambda a: a.update(k=a["k"].cpu())),
    ("dense", "kv_lens", lambda a: a.update(kv_lens=a["kv_lens"].cpu())),
    ("dense", "mask", lambda a: a.update(mask=torch.ones(3, 40, dtype=torch.bool))),
    ("ragged", "qo_indptr", lambda a: a.update(qo_indptr=a["qo_indptr"].cpu())),
    ("ragged", "kv_indptr", lambda a: a.update(kv_indptr=a["kv_indptr"].cpu())),
    ("paged", "page_table", lambda a: a.update(page_table=a["page_table"].cpu())),
    ("paged", "v_cache", lambda a: a.update(v=a["v"].cpu())),
    ("paged_ragged", "qo_indptr", lambda a: a.update(qo_indptr=a["qo_indptr"].cpu())),
]


@pytest.mark.parametrize("kind,argument,change", DEVICE_BAD, ids=[f"{k}-{a}" for k, a, _ in DEVICE_BAD])
def test_tensor_on_another_device_is_rejected(kind, argument, change):
    args = CPU_TIER.valid_prefill(kind, DEVICE)
    change(args)
    with pytest.raises(RuntimeError, match=rf"astrai\.{CPU_TIER.PREFILL_OPS[kind]}: {argument} must be on the same "
                                           r"device as q \(cuda:\d\), got cpu"):
        CPU_TIER.call_prefill(kind, args)


def test_q_on_cpu_is_rejected():
    args = CPU_TIER.valid_prefill("dense", DEVICE)
    args["q"] = args["q"].cpu()
    with pytest.raises(RuntimeError, match=r"astrai\.attn_prefill: q must be a CUDA tensor, got cpu"):
        CPU_TIER.call_prefill("dense", args)


# --- the public policy over a PagedKVCache --------------------------------------------------------------------

def test_cache_prefill_chunks_and_decode_match_torch_backend():
    layers, hkv, d, hq = 2, 8, 128, 32
    cache = PagedKVCache(layers, hkv, d, num_pages=256, page_size=16, max_batch_size=4, max_pages_per_seq=32,
                         device=DEVICE)
    cache.reset(2)
    ks = [[rand_bf16(0, hkv, d)] * 2 for _ in range(layers)]  # per layer, per sequence: every key so far
    vs = [[rand_bf16(0, hkv, d)] * 2 for _ in range(layers)]

    def step(counts, q_len, fwd):
        cache.extend(counts)
        for layer in range(layers):
            k_new = [rand_bf16(n, hkv, d) for n in counts]
            v_new = [rand_bf16(n, hkv, d) for n in counts]
            cache.append(layer, torch.cat(k_new), torch.cat(v_new))
            ks[layer] = [torch.cat([a, b]) for a, b in zip(ks[layer], k_new)]
            vs[layer] = [torch.cat([a, b]) for a, b in zip(vs[layer], v_new)]
        q = rand_bf16(2, q_len, hq, d)
        for layer in range(layers):
            call = backend._canonical(q, None, None, cache, layer, fwd, True, None, None, None)
            assert backend.select_backend(call).name == "cuda"
            out = attention(q, kv_cache=cache, layer_id=layer, fwd=fwd, is_causal=True)
            with attn_backend(ATTN_BACKEND.TORCH):
                torch_out = attention(q, kv_cache=cache, layer_id=layer, fwd=fwd, is_causal=True)
            length = max(len(x) for x in ks[layer])
            k_full = torch.stack([F.pad(x, (0, 0, 0, 0, 0, length - len(x))) for x in ks[layer]])
            v_full = torch.stack([F.pad(x, (0, 0, 0, 0, 0, length - len(x))) for x in vs[layer]])
            lens = i32([len(x) for x in ks[layer]])
            check_dense(out, q, k_full, v_full, kv_lens=lens, is_causal=True, what=f"cache {fwd} layer {layer}")
            check_dense(torch_out, q, k_full, v_full, kv_lens=lens, is_causal=True, what="torch backend")
            assert (out.double() - torch_out.double()).abs().max() < 0.05

    step([70, 10], 70, "prefill")   # prompts: sequence 1's rows 0..59 precede its 10 keys (zeros)
    step([5, 5], 5, "prefill")      # a chunk of 5 rows over prior context
    step([1, 1], 1, "decode")       # a decode step
    step([1, 1], 1, "prefill")      # one row through the prefill kernel


@pytest.mark.parametrize("source", ["cache", "contiguous"])
def test_public_packed_prefill_matches_torch_backend(source):
    """attention(q [Tq, Hq, D], ..., qo_indptr=...): the kernels against the torch backend and the truth."""
    hkv, d, hq = 8, 128, 32
    q_lens = [70, 10, 130]
    if source == "cache":
        cache = PagedKVCache(1, hkv, d, num_pages=128, page_size=16, max_batch_size=3, max_pages_per_seq=32,
                             device=DEVICE)
        cache.reset(3)
        kv_lens = [100, 10, 400]
        ks, vs = [rand_bf16(n, hkv, d) for n in kv_lens], [rand_bf16(n, hkv, d) for n in kv_lens]
        cache.extend(kv_lens)
        cache.append(0, torch.cat(ks), torch.cat(vs))
        kw = dict(kv_cache=cache, layer_id=0)
        k = v = None
    else:
        _, k, v, _, kv, ks, vs = ragged_inputs(q_lens, [100, 10, 400], (hq, hkv), d)
        kw = dict(kv_indptr=kv)
    q = rand_bf16(sum(q_lens), hq, d)
    qo = indptr(q_lens)
    mask = torch.rand(3, 120, 350, device=DEVICE) > 0.2
    call = backend._canonical(q, k, v, kw.get("kv_cache"), kw.get("layer_id"), None, True, mask, None, None, qo,
                              kw.get("kv_indptr"))
    assert call.fwd == "prefill" and backend.select_backend(call).name == "cuda"
    out = attention(q, k, v, qo_indptr=qo, attn_mask=mask, is_causal=True, **kw)
    with attn_backend(ATTN_BACKEND.TORCH):
        torch_out = attention(q, k, v, qo_indptr=qo, attn_mask=mask, is_causal=True, **kw)
    check_ragged(out, q, ks, vs, q_lens, mask=mask, is_causal=True, what=f"public packed {source}")
    check_ragged(torch_out, q, ks, vs, q_lens, mask=mask, is_causal=True, what="torch backend packed")
    assert (out.double() - torch_out.double()).abs().max() < 0.05


def test_public_prefill_uses_the_kernels_with_masks_and_lengths():
    q, k, v = rand_bf16(2, 37, 32, 128), rand_bf16(2, 500, 8, 128), rand_bf16(2, 500, 8, 128)
    lens = i32([500, 123])
    mask = torch.rand(2, 37, 500, device=DEVICE) > 0.2
    call = backend._canonical(q, k, v, None, None, None, True, mask, None, lens)
    assert call.fwd == "prefill" and backend.select_backend(call).name == "cuda"
    out = attention(q, k, v, is_causal=True, attn_mask=mask, kv_lens=lens)
    assert_bitwise_equal(out, ops.attn_prefill(q, k, v, lens, mask=mask, is_causal=True), "public vs op")
    check_dense(out, q, k, v, kv_lens=lens, mask=mask, is_causal=True, what="public prefill")
    key_mask = (torch.rand(2, 1, device=DEVICE) > 2).expand(2, 500)  # stride 0, all False: copied, then zeros
    out = attention(q, k, v, attn_mask=key_mask)
    assert torch.equal(out, torch.zeros_like(out))


@pytest.mark.parametrize("what,make,reason", [
    ("fp16", lambda q, k: (q.half(), k.half()), "q must be bfloat16, got float16"),
    ("head_dim", lambda q, k: (q[..., :96].contiguous(), k[..., :96].contiguous()),
     "head_dim must be 64, 128 or 256, got 96"),
    ("layout", lambda q, k: (rand_bf16(2, 7, 8, 129)[..., 1:], k), "16-byte aligned"),
])
def test_cuda_blocker_reasons_fall_back(what, make, reason):
    q, k = make(rand_bf16(2, 7, 8, 128), rand_bf16(2, 50, 2, 128))
    call = backend._canonical(q, k, k, None, None, "prefill", True, None, None, None)
    assert reason in backend.BACKENDS["cuda"].blocker(call)
    assert backend.select_backend(call).name in ("flash", "torch")
    with attn_backend("cuda"), pytest.raises(ValueError, match=f"selected backend 'cuda' cannot run this call: .*"
                                                              f"{reason}"):
        attention(q, k, k, is_causal=True)
    out = attention(q, k, k, is_causal=True)  # automatic: falls back
    assert out.shape == q.shape


def test_training_prefill_never_uses_the_kernels():
    q = rand_bf16(2, 9, 8, 128).requires_grad_()
    k, v = rand_bf16(2, 50, 2, 128), rand_bf16(2, 50, 2, 128)
    call = backend._canonical(q, k, v, None, None, None, True, None, None, None)
    assert "gradient" in backend.BACKENDS["cuda"].blocker(call)
    assert backend.select_backend(call).name in ("flash", "torch")
    attention(q, k, v, is_causal=True).float().sum().backward()
    assert q.grad is not None
    mask_cpu = torch.ones(2, 50, dtype=torch.bool)
    call = backend._canonical(q.detach(), k, v, None, None, None, True, mask_cpu, None, None)
    assert "attn_mask is on cpu" in backend.BACKENDS["cuda"].blocker(call)


# --- streams, opcheck -----------------------------------------------------------------------------------------

def test_side_stream():
    q_lens, kv_lens = [300, 7, 1000], [300, 700, 1000]
    q, k, v, qo, kv, _, _ = ragged_inputs(q_lens, kv_lens, (32, 8), 128)
    want = ops.attn_prefill_ragged(q, k, v, qo, kv, is_causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = ops.attn_prefill_ragged(q, k, v, qo, kv, is_causal=True, check_indptr=False)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    assert_bitwise_equal(got, want, "side stream")


@pytest.mark.parametrize("name", ["attn_prefill", "attn_prefill_ragged", "attn_paged_prefill"])
def test_opcheck(name):
    q, k = rand_bf16(2, 9, 8, 128), rand_bf16(2, 64, 2, 128)
    lens = i32([64, 9])
    k_cache, v_cache, table = make_paged(k, k, 16)
    mask = torch.rand(2, 9, 64, device=DEVICE) > 0.3
    args = {
        "attn_prefill": (q, k, k.clone(), lens, mask, True, 0.1),
        "attn_prefill_ragged": (q.flatten(0, 1), k.flatten(0, 1), k.flatten(0, 1).clone(), i32([0, 9, 18]),
                                i32([0, 64, 128]), None, True, 0.1),
        "attn_paged_prefill": (q.flatten(0, 1), k_cache, v_cache, i32([0, 9, 18]), table, lens, mask, False, 0.1),
    }[name]
    torch.library.opcheck(getattr(torch.ops.astrai, name).default, args)
