"""Tier 0 (CPU): the torch attention backend against a float64 reference (ragged, paged, masks, causal
offsets, every GQA ratio, prefill over the cache), the PagedKVCache on CPU, the selection policy (the CUDA
backend's routing of decode and prefill, checked with stand-in ops), and the real image's attention ops
without a GPU: schemas, validation messages (decode, prefill dense / ragged / paged), fake (meta)
implementations, the indptr range check of the prefill wrappers.

Tests marked `requires_cuda_kernels("attention")` need the image (`nox -s build`); without it they skip.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from reference import attention as ref

import astrai.extension as ext
from astrai.extension import ATTN_BACKEND, PagedKVCache, attention, attn_backend, set_op
from astrai.extension.backend import attention as backend
from astrai.extension.backend import paged_kv_cache
from astrai.extension.ops import attention as ops
from support.schemas import assert_schema_matches

kernels = pytest.mark.requires_cuda_kernels("attention")

CONTRACT_SCHEMAS = {
    "attn_decode": "attn_decode(Tensor q, Tensor k, Tensor v, Tensor? kv_lens, Tensor? mask, float scale, "
                   "int kv_split_size) -> Tensor",
    "attn_paged_decode": "attn_paged_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor page_table, "
                         "Tensor kv_lens, Tensor? mask, float scale, int kv_split_size) -> Tensor",
    "paged_kv_append": "paged_kv_append(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k_new, Tensor v_new, "
                       "Tensor page_table, Tensor seq_ids, Tensor positions) -> ()",
    "attn_prefill": "attn_prefill(Tensor q, Tensor k, Tensor v, Tensor? kv_lens, Tensor? mask, bool is_causal, "
                    "float scale) -> Tensor",
    "attn_prefill_ragged": "attn_prefill_ragged(Tensor q, Tensor k, Tensor v, Tensor qo_indptr, Tensor kv_indptr, "
                           "Tensor? mask, bool is_causal, float scale) -> Tensor",
    "attn_paged_prefill": "attn_paged_prefill(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? qo_indptr, "
                          "Tensor page_table, Tensor kv_lens, Tensor? mask, bool is_causal, float scale) -> Tensor",
}
GQA = [(4, 4), (8, 4), (8, 2), (8, 1), (16, 2), (12, 1)]  # ratios 1, 2, 4, 8, 8, MQA 12


@pytest.fixture(autouse=True)
def clean_selection():
    """Every test starts and ends with automatic selection and no environment seed pending."""
    saved = (backend._process_choice, backend._env_seed_read)
    backend._process_choice, backend._env_seed_read = None, True
    yield
    backend._process_choice, backend._env_seed_read = saved


def rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


def close64(out, want, tol=2e-5):
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)


# --- the torch backend against the float64 reference ---------------------------------------------------------

@pytest.mark.parametrize("heads", GQA, ids=[f"{a}-{b}" for a, b in GQA])
@pytest.mark.parametrize("q_len", [1, 5])
@pytest.mark.parametrize("causal", [False, True])
def test_torch_backend_contiguous(heads, q_len, causal):
    hq, hkv = heads
    q, k, v = rand(3, q_len, hq, 32), rand(3, 19, hkv, 32), rand(3, 19, hkv, 32)
    kv_lens = torch.tensor([19, 7, 5], dtype=torch.int32)
    with attn_backend("torch"):
        out = attention(q, k, v, kv_lens=kv_lens, is_causal=causal)
    close64(out, ref.attention(q, k, v, kv_lens=kv_lens, is_causal=causal))


@pytest.mark.parametrize("mask_rank", [2, 3])
def test_torch_backend_masks_and_fully_masked_rows(mask_rank):
    q, k, v = rand(2, 4, 8, 16), rand(2, 11, 2, 16), rand(2, 11, 2, 16)
    mask = torch.rand(2, 4, 11) > 0.4 if mask_rank == 3 else torch.rand(2, 11) > 0.4
    mask[1] = False  # sequence 1 keeps nothing: zeros
    out = backend.BACKENDS["torch"].forward(backend._canonical(q, k, v, None, None, None, False, mask, 0.3, None))
    want = ref.attention(q, k, v, attn_mask=mask, scale=0.3)
    close64(out, want)
    assert torch.equal(out[1], torch.zeros_like(out[1]))


def test_torch_backend_causal_is_aligned_to_the_end():
    """Query i of a sequence with n keys sees keys j <= n - Lq + i (decode with prior context)."""
    q, k, v = rand(1, 3, 2, 8), rand(1, 10, 2, 8), rand(1, 10, 2, 8)
    out = attention(q, k, v, is_causal=True)
    for i in range(3):
        last = 10 - 3 + i
        want = ref.attention(q[:, i:i + 1], k[:, :last + 1], v[:, :last + 1])
        close64(out[:, i:i + 1], want)


def test_decode_3d_q_and_default_scale():
    q, k, v = rand(2, 8, 64), rand(2, 9, 2, 64), rand(2, 9, 2, 64)
    out = attention(q, k, v)
    assert out.shape == (2, 8, 64)
    close64(out, ref.attention(q[:, None], k, v)[:, 0])
    close64(attention(q, k, v, scale=0.5), ref.attention(q[:, None], k, v, scale=0.5)[:, 0])


def test_torch_backend_bf16_within_2x_baseline():
    q, k, v = rand(2, 1, 32, 128, dtype=torch.bfloat16), rand(2, 300, 8, 128, dtype=torch.bfloat16), \
        rand(2, 300, 8, 128, dtype=torch.bfloat16)
    truth = ref.attention(q, k, v)
    out = attention(q, k, v)
    base = ref.attention(q, k, v, upcast=False)
    assert out.dtype == torch.bfloat16
    assert (out.double() - truth).abs().max() <= 2 * (base.double() - truth).abs().max() + 1e-3


def test_torch_backend_gradients_match_reference():
    q, k, v = rand(2, 3, 4, 8), rand(2, 6, 2, 8), rand(2, 6, 2, 8)
    for t in (q, k, v):
        t.requires_grad_()
    call = backend._canonical(q, k, v, None, None, None, True, None, None, None)
    assert backend.select_backend(call).name in ("flash", "torch")  # training call: never the kernels
    out = attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    (out * grad).sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    (ref.attention(q64, k64, v64, is_causal=True) * grad.double()).sum().backward()
    for got, want in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("page_size", [1, 16, 128])
@pytest.mark.parametrize("mask_rank", [0, 2, 3])
def test_torch_backend_prefill_over_cache_is_causal_per_sequence_end(page_size, mask_rank):
    """The semantics the CUDA backend must match: dense q [B, Lq] over a ragged cache, row i of a sequence with
    n keys at position n - Lq + i (rows before the first key get zeros)."""
    hkv, d, hq = 2, 16, 8
    cache = PagedKVCache(1, hkv, d, num_pages=600 // page_size + 8, page_size=page_size, max_batch_size=3,
                         max_pages_per_seq=max(1, 300 // page_size + 2), dtype=torch.float32)
    cache.reset(2)
    prompt = [70, 10]
    ks, vs = [rand(n, hkv, d) for n in prompt], [rand(n, hkv, d) for n in prompt]
    cache.extend(prompt)
    cache.append(0, torch.cat(ks), torch.cat(vs))
    q = rand(2, 70, hq, d)
    length = cache.capacity
    mask = None
    if mask_rank == 2:
        mask = torch.rand(2, 75) > 0.3
    elif mask_rank == 3:
        mask = torch.rand(2, 70, 64) > 0.3
    out = attention(q, kv_cache=cache, layer_id=0, fwd="prefill", is_causal=True, attn_mask=mask)
    k_full, v_full = torch.zeros(2, length, hkv, d), torch.zeros(2, length, hkv, d)
    for b, n in enumerate(prompt):
        k_full[b, :n], v_full[b, :n] = ks[b], vs[b]
    lens = torch.tensor(prompt, dtype=torch.int32)
    close64(out, ref.attention(q, k_full, v_full, kv_lens=lens, attn_mask=mask, is_causal=True))
    assert torch.equal(out[1, :60], torch.zeros_like(out[1, :60]))  # 10 keys: rows 0..59 precede them


def _packed_truth(q, ks, vs, q_lens, *, mask=None, is_causal=False, scale=None):
    """float64 truth of packed q [Tq, Hq, D] over per-sequence keys ks[b] [n_b, Hkv, D], sequence by sequence."""
    out, start = [], 0
    for b, m in enumerate(q_lens):
        n = ks[b].shape[0]
        keep = torch.ones(m, n, dtype=torch.bool)
        if mask is not None:
            cut = torch.zeros(m, n, dtype=torch.bool)
            keys = min(n, mask.shape[-1])
            rows = m if mask.dim() == 2 else min(m, mask.shape[1])
            cut[:rows, :keys] = mask[b, None, :keys] if mask.dim() == 2 else mask[b, :rows, :keys]
            keep &= cut
        if is_causal:
            keep &= torch.arange(n)[None, :] <= n - m + torch.arange(m)[:, None]
        if n == 0:
            out.append(torch.zeros(m, *q.shape[1:], dtype=torch.float64))
        else:
            out.append(ref.attention(q[start:start + m][None], ks[b][None], vs[b][None], attn_mask=keep[None],
                                     scale=scale)[0])
        start += m
    return torch.cat(out)


@pytest.mark.parametrize("heads", GQA, ids=[f"{a}-{b}" for a, b in GQA])
@pytest.mark.parametrize("mask_rank", [0, 2, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_torch_backend_packed_contiguous(heads, mask_rank, causal):
    hq, hkv = heads
    q_lens, kv_lens = [7, 0, 3, 12], [9, 4, 0, 12]
    q = rand(sum(q_lens), hq, 16)
    k, v = rand(sum(kv_lens), hkv, 16), rand(sum(kv_lens), hkv, 16)
    qo = torch.tensor([0, 7, 7, 10, 22], dtype=torch.int32)
    kv = torch.tensor([0, 9, 13, 13, 25], dtype=torch.int32)
    ks, vs = list(k.split(kv_lens)), list(v.split(kv_lens))
    mask = None if mask_rank == 0 else torch.rand(4, 10) > 0.3 if mask_rank == 2 else torch.rand(4, 8, 10) > 0.3
    out = attention(q, k, v, qo_indptr=qo, kv_indptr=kv, attn_mask=mask, is_causal=causal, scale=0.4)
    assert out.shape == q.shape
    close64(out, _packed_truth(q, ks, vs, q_lens, mask=mask, is_causal=causal, scale=0.4))


@pytest.mark.parametrize("page_size", [1, 16])
def test_torch_backend_packed_over_cache(page_size):
    hkv, d = 2, 16
    cache = PagedKVCache(1, hkv, d, num_pages=300 // page_size + 8, page_size=page_size, max_batch_size=3,
                         max_pages_per_seq=max(1, 200 // page_size + 2), dtype=torch.float32)
    cache.reset(3)
    prompt = [70, 10, 130]
    ks, vs = [rand(n, hkv, d) for n in prompt], [rand(n, hkv, d) for n in prompt]
    cache.extend(prompt)
    cache.append(0, torch.cat(ks), torch.cat(vs))
    q_lens = [70, 10, 130]  # the prompts' own rows
    q = rand(sum(q_lens), 8, d)
    qo = torch.tensor([0, 70, 80, 210], dtype=torch.int32)
    mask = torch.rand(3, 100, 120) > 0.2  # rows past 100 and keys past 120 keep nothing
    out = attention(q, kv_cache=cache, layer_id=0, qo_indptr=qo, attn_mask=mask, is_causal=True)
    close64(out, _packed_truth(q, ks, vs, q_lens, mask=mask, is_causal=True))
    chunk = [5, 0, 2]  # a later chunk: rows over prior context
    q2 = rand(7, 8, d)
    out = attention(q2, kv_cache=cache, layer_id=0, qo_indptr=torch.tensor([0, 5, 5, 7], dtype=torch.int32),
                    is_causal=True)
    close64(out, _packed_truth(q2, ks, vs, chunk, is_causal=True))


PACKED_BAD = {
    "q rank": (dict(q=rand(2, 5, 8, 16)), r"q must be packed \[Tq, Hq, D\]"),
    "decode": (dict(fwd="decode"), "are a prefill"),
    "kv_indptr alone": (dict(qo_indptr=None), "kv_indptr needs qo_indptr"),
    "kv_indptr missing": (dict(kv_indptr=None), "packed q needs kv_cache"),
    "qo dtype": (dict(qo_indptr=torch.tensor([0, 5, 10])), r"qo_indptr must be int32 \[B \+ 1\] = \[3\]"),
    "kv size": (dict(kv_indptr=torch.tensor([0, 9], dtype=torch.int32)), r"kv_indptr must be int32 \[B \+ 1\]"),
    "k rank": (dict(k=rand(2, 9, 2, 16), v=rand(2, 9, 2, 16)), r"k and v must be packed \[Tkv, Hkv, D\]"),
    "kv_lens": (dict(kv_lens=torch.tensor([1, 2], dtype=torch.int32)), "do not pass kv_lens"),
    "mask batch": (dict(attn_mask=torch.ones(3, 9, dtype=torch.bool)), r"attn_mask must be \[B, M\]"),
    "heads": (dict(q=rand(10, 6, 16)), r"multiple of kv heads \(4\)"),
}


@pytest.mark.parametrize("case", list(PACKED_BAD))
def test_packed_api_rejects_bad_calls(case):
    args = dict(q=rand(10, 8, 16), k=rand(18, 4, 16), v=rand(18, 4, 16),
                qo_indptr=torch.tensor([0, 5, 10], dtype=torch.int32),
                kv_indptr=torch.tensor([0, 9, 18], dtype=torch.int32))
    change, message = PACKED_BAD[case]
    args.update(change)
    with pytest.raises(ValueError, match=message):
        attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_packed_training_call_gets_gradients_from_torch():
    q = rand(10, 4, 8).requires_grad_()
    k, v = rand(12, 2, 8).requires_grad_(), rand(12, 2, 8).requires_grad_()
    qo, kv = torch.tensor([0, 4, 10], dtype=torch.int32), torch.tensor([0, 6, 12], dtype=torch.int32)
    call = backend._canonical(q, k, v, None, None, None, True, None, None, None, qo, kv)
    assert backend.select_backend(call).name == "torch"
    assert "packed sequences" in backend.BACKENDS["flash"].blocker(call) or \
        "CUDA" in backend.BACKENDS["flash"].blocker(call)
    out = attention(q, k, v, qo_indptr=qo, kv_indptr=kv, is_causal=True)
    grad = torch.randn_like(out)
    (out * grad).sum().backward()
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    want = _packed_truth(q64, list(k64.split([6, 6])), list(v64.split([6, 6])), [4, 6], is_causal=True)
    (want * grad.double()).sum().backward()
    for got, ref_grad in ((q.grad, q64.grad), (k.grad, k64.grad), (v.grad, v64.grad)):
        torch.testing.assert_close(got.double(), ref_grad, rtol=1e-5, atol=1e-5)


# --- PagedKVCache on CPU ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("page_size", [1, 16, 128])
def test_paged_cache_prefill_then_decode_matches_reference(page_size):
    hkv, d = 2, 16
    cache = PagedKVCache(2, hkv, d, num_pages=400 // page_size + 8, page_size=page_size, max_batch_size=4,
                         max_pages_per_seq=max(1, 300 // page_size + 2), dtype=torch.float32)
    cache.reset(3)
    prompt = [70, 10, 130]
    ks = [rand(n, hkv, d) for n in prompt]
    vs = [rand(n, hkv, d) for n in prompt]
    cache.extend(prompt)
    for layer in range(2):
        cache.append(layer, torch.cat(ks) * (layer + 1), torch.cat(vs) * (layer + 1))
    cache.extend(1)
    k_tok, v_tok = rand(3, 1, hkv, d), rand(3, 1, hkv, d)
    for layer in range(2):
        cache.append(layer, k_tok * (layer + 1), v_tok * (layer + 1))
    assert cache.lengths() == [71, 11, 131]
    assert cache.kv_lens[:3].tolist() == [71, 11, 131]

    q = rand(3, 1, 8, d)
    for layer in range(2):
        got_k, valid = ref.gather_paged(cache.k[layer], cache.page_table[:3], cache.kv_lens[:3])
        gk, gv, gvalid = cache.gather(layer)
        assert torch.equal(valid, gvalid)
        assert torch.equal(gk[gvalid], got_k[valid])
        # contiguous truth built from the inputs directly
        length = gk.shape[1]
        k_full = torch.zeros(3, length, hkv, d)
        v_full = torch.zeros(3, length, hkv, d)
        for b, n in enumerate(prompt):
            k_full[b, :n], v_full[b, :n] = ks[b] * (layer + 1), vs[b] * (layer + 1)
            k_full[b, n], v_full[b, n] = k_tok[b, 0] * (layer + 1), v_tok[b, 0] * (layer + 1)
        out = attention(q, kv_cache=cache, layer_id=layer, fwd="decode")
        close64(out, ref.attention(q, k_full, v_full, kv_lens=cache.kv_lens[:3]))
        out_c = attention(q, kv_cache=cache, layer_id=layer, is_causal=True)  # decode: causal is a no-op
        close64(out_c, ref.attention(q, k_full, v_full, kv_lens=cache.kv_lens[:3]))


def test_paged_append_reference_is_bitwise_and_drops_out_of_range():
    k_cache = rand(8, 4, 2, 8, dtype=torch.bfloat16)
    v_cache = rand(8, 4, 2, 8, dtype=torch.bfloat16)
    page_table = torch.tensor([[3, 1, -1], [0, 9, 5]], dtype=torch.int32)
    seq_ids = torch.tensor([0, 0, 1, 1, 1, 2, -1, 0], dtype=torch.int32)
    positions = torch.tensor([0, 5, 2, 6, 11, 0, 0, 9], dtype=torch.int32)  # (1,6): page 9 invalid; (0,9): page -1
    k_new, v_new = rand(8, 2, 8, dtype=torch.bfloat16), rand(8, 2, 8, dtype=torch.bfloat16)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    ref.paged_append(want_k, want_v, k_new, v_new, page_table, seq_ids, positions)
    paged_kv_cache.append_reference(k_cache, v_cache, k_new, v_new, page_table, seq_ids, positions)
    assert torch.equal(k_cache.view(torch.int16), want_k.view(torch.int16))
    assert torch.equal(v_cache.view(torch.int16), want_v.view(torch.int16))
    assert torch.equal(k_cache[3, 0], k_new[0]) and torch.equal(k_cache[5, 3], k_new[4])


def test_paged_cache_errors():
    with pytest.raises(ValueError, match="page_size must be a power of two"):
        PagedKVCache(1, 2, 8, num_pages=4, page_size=24, max_batch_size=1)
    cache = PagedKVCache(1, 2, 8, num_pages=2, page_size=4, max_batch_size=2, max_pages_per_seq=2,
                         dtype=torch.float32)
    cache.reset(2)
    with pytest.raises(RuntimeError, match="call extend"):
        cache.append(0, rand(2, 2, 8), rand(2, 2, 8))
    with pytest.raises(ValueError, match="more than max_pages_per_seq"):
        cache.extend([9, 0])
    with pytest.raises(RuntimeError, match="out of pages"):
        cache.extend([8, 1])
    cache.extend([3, 2])
    with pytest.raises(ValueError, match=r"k_new must be \[5, 2, 8\]"):
        cache.append(0, rand(4, 2, 8), rand(4, 2, 8))
    with pytest.raises(ValueError, match="needs every sequence to have reserved T tokens"):
        cache.append(0, rand(2, 3, 2, 8), rand(2, 3, 2, 8))
    with pytest.raises(ValueError, match="layer_id must be in"):
        cache.layer(1)


# --- the public API's arguments and the selection policy ---------------------------------------------------------

BAD_CALLS = {
    "fwd": (dict(fwd="train"), "fwd must be one of"),
    "q rank": (dict(q=rand(2, 8)), r"q must be \[B, Lq, Hq, D\]"),
    "decode q_len": (dict(q=rand(2, 3, 8, 16), fwd="decode"), "one query token per sequence"),
    "heads": (dict(q=rand(2, 1, 6, 16)), r"multiple of kv heads \(4\)"),
    "head_dim": (dict(q=rand(2, 1, 8, 32)), "head_dim 32 differs"),
    "k missing": (dict(k=None), "k and v are required"),
    "mask dtype": (dict(attn_mask=torch.ones(2, 5)), "attn_mask must be bool"),
    "mask shape": (dict(attn_mask=torch.ones(2, 4, dtype=torch.bool)), r"attn_mask must be \[B, L\]"),
    "kv_lens": (dict(kv_lens=torch.tensor([1, 2])), "kv_lens must be int32"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_public_api_rejects_bad_calls(case):
    args = dict(q=rand(2, 1, 8, 16), k=rand(2, 5, 4, 16), v=rand(2, 5, 4, 16))
    change, message = BAD_CALLS[case]
    args.update(change)
    with pytest.raises(ValueError, match=message):
        attention(args.pop("q"), args.pop("k"), args.pop("v"), **args)


def test_cache_and_kv_are_exclusive():
    cache = PagedKVCache(1, 2, 8, num_pages=2, page_size=4, max_batch_size=1, dtype=torch.float32)
    cache.reset(1)
    with pytest.raises(ValueError, match="either k and v or kv_cache"):
        attention(rand(1, 1, 2, 8), rand(1, 4, 2, 8), rand(1, 4, 2, 8), kv_cache=cache, layer_id=0)
    with pytest.raises(ValueError, match="kv_cache needs layer_id"):
        attention(rand(1, 1, 2, 8), kv_cache=cache)


def _call(q_len=1, *, grad=False, cache=False):
    q = rand(2, q_len, 8, 128, dtype=torch.bfloat16).requires_grad_(grad)
    k, v = rand(2, 16, 2, 128, dtype=torch.bfloat16), rand(2, 16, 2, 128, dtype=torch.bfloat16)
    return backend._canonical(q, k, v, None, None, None, False, None, None, None)


def test_auto_on_cpu_picks_torch_and_names_blockers():
    call = _call()
    assert backend.select_backend(call).name == "torch"
    assert "CUDA tensors" in backend.BACKENDS["cuda"].blocker(call)
    assert backend.select_backend(_call(4)).name == "torch"
    assert "CUDA tensors" in backend.BACKENDS["cuda"].blocker(_call(4))


def test_explicit_selection_is_strict():
    q, k, v = rand(2, 1, 8, 128, dtype=torch.bfloat16), rand(2, 16, 2, 128), rand(2, 16, 2, 128)
    with attn_backend(ATTN_BACKEND.CUDA):
        with pytest.raises(ValueError, match=r"selected backend 'cuda' cannot run this call: q and K/V must be CUDA"):
            attention(q, k, v)
    set_op("attention", "cuda")
    with pytest.raises(ValueError, match="selected backend 'cuda'"):
        attention(q, k, v)
    with attn_backend("auto"):  # the context manager overrides the process choice
        assert attention(q, k.bfloat16(), v.bfloat16()).shape == q.shape
    set_op("attention", ATTN_BACKEND.TORCH)
    assert attention(q, k.bfloat16(), v.bfloat16()).shape == q.shape
    with pytest.raises(ValueError, match="unknown attention backend"):
        set_op("attention", "triton")
    with pytest.raises(ValueError, match="unknown op 'gemm'"):
        set_op("gemm", "torch")
    assert ext.set_op is set_op


@pytest.mark.parametrize("q_len", [1, 4], ids=["decode", "prefill"])
def test_auto_priority_cuda_then_flash_then_torch(monkeypatch, q_len):
    call = _call(q_len)
    monkeypatch.setattr(backend.CudaBackend, "blocker", lambda self, c, check_available=True: None)
    assert backend.select_backend(call).name == "cuda"
    monkeypatch.setattr(backend.FlashAttnBackend, "blocker", lambda self, c: None)
    assert backend.select_backend(call).name == "cuda"
    monkeypatch.setattr(backend.CudaBackend, "blocker", lambda self, c, check_available=True: "no")
    assert backend.select_backend(call).name == "flash"
    # training calls (grad, no cache) never consider the kernels
    monkeypatch.setattr(backend.CudaBackend, "blocker", lambda self, c, check_available=True: None)
    assert backend.select_backend(_call(q_len, grad=True)).name == "flash"
    monkeypatch.setattr(backend.FlashAttnBackend, "blocker", lambda self, c: "no")
    assert backend.select_backend(_call(q_len, grad=True)).name == "torch"


def test_flash_backend_forwards_scale_and_causal_to_flash_attn(monkeypatch):
    """The flash backend's plumbing, with a stand-in `flash_attn` module (the real package is not installed
    where the tests run): q, k, v unchanged (GQA K/V heads go through as they are), the resolved scale and
    the causal flag; a failing import gives None (the blocker then names the missing package)."""
    import sys
    import types

    seen = {}

    def flash_attn_func(q, k, v, *, softmax_scale, causal):
        seen.update(q=q, k=k, v=v, scale=softmax_scale, causal=causal)
        return torch.zeros_like(q)

    fake = types.SimpleNamespace(flash_attn_func=flash_attn_func)
    q, k, v = rand(2, 4, 8, 128, dtype=torch.bfloat16), rand(2, 16, 2, 128, dtype=torch.bfloat16), \
        rand(2, 16, 2, 128, dtype=torch.bfloat16)
    backend._flash_attn.cache_clear()  # the import is cached per process: start and end with it unresolved
    try:
        monkeypatch.setitem(sys.modules, "flash_attn", fake)
        assert backend._flash_attn() is fake
        for causal, scale in ((False, None), (True, 0.25)):
            call = backend._canonical(q, k, v, None, None, None, causal, None, scale, None)
            out = backend.FlashAttnBackend().forward(call)
            assert out.shape == q.shape
            assert seen["q"] is q and seen["k"] is k and seen["v"] is v
            assert seen["causal"] is causal
            assert seen["scale"] == pytest.approx(128 ** -0.5 if scale is None else scale)
        backend._flash_attn.cache_clear()
        monkeypatch.setitem(sys.modules, "flash_attn", None)  # `import flash_attn` now raises ImportError
        assert backend._flash_attn() is None
    finally:
        backend._flash_attn.cache_clear()


class _Recorder:
    """Stands in for the ops module's kernels: records each call and returns q-shaped zeros."""

    def __init__(self, monkeypatch):
        self.calls = []
        for name in ("attn_decode", "attn_paged_decode", "attn_prefill", "attn_prefill_ragged", "attn_paged_prefill"):
            monkeypatch.setattr(backend.ops, name, self._make(name))

    def _make(self, name):
        def op(q, *args, **kwargs):
            self.calls.append((name, q, args, kwargs))
            return torch.zeros_like(q)
        return op


def test_cuda_backend_routes_prefill_to_the_prefill_ops(monkeypatch):
    rec = _Recorder(monkeypatch)
    cuda = backend.BACKENDS["cuda"]
    q, k, v = rand(2, 5, 8, 64), rand(2, 9, 2, 64), rand(2, 9, 2, 64)
    lens = torch.tensor([9, 3], dtype=torch.int32)
    mask = (torch.rand(2, 1, 9) > 0.5).expand(2, 5, 9)  # stride 0 along the rows: passed on as it is
    cuda.forward(backend._canonical(q, k, v, None, None, "prefill", True, mask, 0.25, lens))
    name, got_q, args, kwargs = rec.calls[-1]
    assert name == "attn_prefill" and got_q is q and args == (k, v, lens)
    assert kwargs["is_causal"] is True and kwargs["scale"] == 0.25 and kwargs["mask"] is mask

    key_mask = torch.rand(2, 9) > 0.5
    cuda.forward(backend._canonical(q, k, v, None, None, "prefill", False, key_mask, None, None))
    assert rec.calls[-1][3]["mask"] is key_mask and rec.calls[-1][3]["is_causal"] is False
    broadcast = torch.ones(2, 1, dtype=torch.bool).expand(2, 9)  # last stride 0: copied for the kernel
    cuda.forward(backend._canonical(q, k, v, None, None, "prefill", False, broadcast, None, None))
    assert rec.calls[-1][3]["mask"].stride(-1) == 1 and torch.equal(rec.calls[-1][3]["mask"], broadcast)

    cache = PagedKVCache(2, 2, 64, num_pages=8, page_size=4, max_batch_size=3, max_pages_per_seq=4,
                         dtype=torch.float32)
    cache.reset(2)
    cache.extend([5, 2])
    out = cuda.forward(backend._canonical(q, None, None, cache, 1, None, True, None, None, None))
    name, got_q, args, kwargs = rec.calls[-1]
    assert name == "attn_paged_prefill" and out.shape == q.shape
    k_cache, v_cache, table, kv_lens = args
    assert k_cache.data_ptr() == cache.k[1].data_ptr() and v_cache.data_ptr() == cache.v[1].data_ptr()
    assert torch.equal(table, cache.page_table[:2]) and torch.equal(kv_lens, torch.tensor([5, 2], dtype=torch.int32))
    assert kwargs["is_causal"] is True and kwargs["scale"] == pytest.approx(1 / 8)

    cuda.forward(backend._canonical(q[:, :1], k, v, None, None, None, False, None, None, lens))
    assert rec.calls[-1][0] == "attn_decode" and rec.calls[-1][1].shape == (2, 8, 64)

    packed, qo = rand(7, 8, 64), torch.tensor([0, 5, 7], dtype=torch.int32)
    kv = torch.tensor([0, 9, 18], dtype=torch.int32)
    expanded = (torch.rand(2, 1, 9) > 0.5).expand(2, 4, 9)  # row stride 0 over packed rows: copied
    cuda.forward(backend._canonical(packed, k.flatten(0, 1), v.flatten(0, 1), None, None, None, True, expanded,
                                    None, None, qo, kv))
    name, got_q, args, kwargs = rec.calls[-1]
    assert name == "attn_prefill_ragged" and got_q is packed and args[2] is qo and args[3] is kv
    assert kwargs["mask"].stride(1) != 0 and torch.equal(kwargs["mask"], expanded)
    cuda.forward(backend._canonical(packed, None, None, cache, 0, "prefill", True, None, None, None, qo))
    name, got_q, args, kwargs = rec.calls[-1]
    assert name == "attn_paged_prefill" and kwargs["qo_indptr"] is qo and got_q is packed


def test_astr_backend_env_is_a_deprecated_seed(monkeypatch):
    monkeypatch.setenv("ASTR_BACKEND", "cuda")
    backend._env_seed_read = False
    with pytest.warns(DeprecationWarning, match="ASTR_BACKEND is deprecated"):
        with pytest.raises(ValueError, match="selected backend 'cuda'"):
            attention(rand(1, 1, 2, 8), rand(1, 3, 2, 8), rand(1, 3, 2, 8))
    monkeypatch.setenv("ASTR_BACKEND", "torch")  # read once: a later change is ignored
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="selected backend 'cuda'"):
            attention(rand(1, 1, 2, 8), rand(1, 3, 2, 8), rand(1, 3, 2, 8))


def test_astr_ops_env_is_a_deprecated_seed(monkeypatch):
    monkeypatch.delenv("ASTR_BACKEND", raising=False)
    monkeypatch.setenv("ASTR_OPS", "attention=cuda")
    backend._env_seed_read = False
    backend._process_choice = None
    try:
        with pytest.warns(DeprecationWarning, match="ASTR_OPS is deprecated"):
            with pytest.raises(ValueError, match="selected backend 'cuda'"):
                attention(rand(1, 1, 2, 8), rand(1, 3, 2, 8), rand(1, 3, 2, 8))
        for bad, why in (("quant_gemm=torch", "ASTR_OPS: unknown op 'quant_gemm'"),
                         ("attention", "ASTR_OPS: each entry must be op=impl"),
                         ("attention=fastest", "ASTR_OPS: unknown attention backend 'fastest'")):
            monkeypatch.setenv("ASTR_OPS", bad)
            backend._env_seed_read = False
            backend._process_choice = None
            with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match=why):
                attention(rand(1, 1, 2, 8), rand(1, 3, 2, 8), rand(1, 3, 2, 8))
    finally:
        backend._env_seed_read = False
        backend._process_choice = None
        monkeypatch.delenv("ASTR_OPS")


def test_custom_backend_instance():
    class Zeros(backend.AttentionBackend):
        name = "zeros"

        def forward(self, call):
            return torch.zeros_like(call.q)

    with attn_backend(Zeros()):
        assert torch.equal(attention(rand(1, 2, 2, 8), rand(1, 3, 2, 8), rand(1, 3, 2, 8)), torch.zeros(1, 2, 2, 8))
    with pytest.raises(TypeError):
        backend.AttentionBackend()


# --- the real image on a CPU machine --------------------------------------------------------------------------

@kernels
@pytest.mark.parametrize("name", list(CONTRACT_SCHEMAS))
def test_schema_matches_contract(name):
    assert_schema_matches(ops.load, name, CONTRACT_SCHEMAS)


def _valid_decode(paged=False):
    q = rand(3, 8, 128, dtype=torch.bfloat16)
    if paged:
        k = rand(10, 16, 2, 128, dtype=torch.bfloat16)
        return dict(q=q, k=k, v=k.clone(), page_table=torch.zeros(3, 4, dtype=torch.int32),
                    kv_lens=torch.tensor([5, 64, 1], dtype=torch.int32), mask=None)
    k = rand(3, 40, 2, 128, dtype=torch.bfloat16)
    return dict(q=q, k=k, v=k.clone(), kv_lens=torch.tensor([5, 40, 1], dtype=torch.int32), mask=None)


def _call_decode(a, paged):
    if paged:
        return torch.ops.astrai.attn_paged_decode(a["q"], a["k"], a["v"], a["page_table"], a["kv_lens"], a["mask"],
                                                  a.get("scale", 0.1), a.get("split", 0))
    return torch.ops.astrai.attn_decode(a["q"], a["k"], a["v"], a["kv_lens"], a["mask"], a.get("scale", 0.1),
                                        a.get("split", 0))


# (paged, argument the message must name, what, change, message fragment)
BAD_OPS = [
    (False, "q", "dtype", lambda a: a.update(q=a["q"].float()), "must be bfloat16"),
    (False, "k", "dtype", lambda a: a.update(k=a["k"].half()), "must be bfloat16"),
    (False, "q", "rank", lambda a: a.update(q=a["q"][None]), "must be 3-D"),
    (False, "head_dim", "unsupported", lambda a: a.update(q=a["q"][..., :96], k=a["k"][..., :96], v=a["v"][..., :96]),
     "must be 64, 128 or 256"),
    (False, "heads", "mismatch", lambda a: a.update(q=a["q"][:, :7]), "must be a positive multiple"),
    (False, "k", "head_dim", lambda a: a.update(k=a["k"][..., :64], v=a["v"][..., :64]), "must equal head_dim"),
    (False, "v", "shape", lambda a: a.update(v=a["v"][:, :30]), "must have the shape of k"),
    (False, "k", "batch", lambda a: a.update(k=a["k"][:2], v=a["v"][:2]), "must equal the batch"),
    (False, "kv_lens", "dtype", lambda a: a.update(kv_lens=a["kv_lens"].long()), "must be int32"),
    (False, "kv_lens", "size", lambda a: a.update(kv_lens=a["kv_lens"][:2]), "must have 3 elements"),
    (False, "mask", "dtype", lambda a: a.update(mask=torch.ones(3, 40)), "must be bool"),
    (False, "mask", "shape", lambda a: a.update(mask=torch.ones(3, 39, dtype=torch.bool)), "must equal the keys"),
    (False, "scale", "value", lambda a: a.update(scale=float("nan")), "must be finite"),
    (False, "kv_split_size", "value", lambda a: a.update(split=-1), "must be >= 0"),
    (False, "k", "layout", lambda a: a.update(k=rand(3, 40, 2, 129, dtype=torch.bfloat16)[..., 1:]),
     "must be 16-byte aligned"),
    (True, "page_size", "not a power of two", lambda a: a.update(k=a["k"][:, :12], v=a["v"][:, :12]),
     "must be a power of two"),
    (True, "page_table", "dtype", lambda a: a.update(page_table=a["page_table"].long()), "must be int32"),
    (True, "page_table", "batch", lambda a: a.update(page_table=a["page_table"][:2]), "must equal the batch"),
    (True, "page_table", "rank", lambda a: a.update(page_table=a["page_table"][0]), "must be 2-D"),
    (True, "kv_lens", "size", lambda a: a.update(kv_lens=a["kv_lens"][:1]), "must have 3 elements"),
    (True, "mask", "rank", lambda a: a.update(mask=torch.ones(3, 4, 5, dtype=torch.bool)), "must be 2-D"),
    (True, "v_cache", "shape", lambda a: a.update(v=a["v"][:9]), "must have the shape of k_cache"),
]


@kernels
@pytest.mark.parametrize("paged,argument,what,change,message", BAD_OPS,
                         ids=[f"{'paged' if p else 'contig'}-{arg}-{w}" for p, arg, w, _, _ in BAD_OPS])
def test_op_validation_names_op_and_argument(paged, argument, what, change, message):
    ops.load()
    args = _valid_decode(paged)
    change(args)
    with pytest.raises(RuntimeError) as info:
        _call_decode(args, paged)
    text = str(info.value)
    name = "attn_paged_decode" if paged else "attn_decode"
    assert re.search(rf"astrai\.{name}\b", text), f"op name not in: {text}"
    assert argument in text and message in text, f"expected {argument!r} and {message!r} in: {text}"
    assert "must be a CUDA tensor" not in text, f"validation ran after the device check: {text}"


@kernels
@pytest.mark.parametrize("paged", [False, True], ids=["contig", "paged"])
def test_decode_on_cpu_raises_must_be_cuda(paged):
    ops.load()
    with pytest.raises(RuntimeError, match=r"astrai\.attn_(paged_)?decode: q must be a CUDA tensor"):
        _call_decode(_valid_decode(paged), paged)


APPEND_BAD = [
    ("k_new", lambda a: a.update(k_new=a["k_new"].float()), "must be bfloat16"),
    ("k_new", lambda a: a.update(k_new=a["k_new"][:, :1], v_new=a["v_new"][:, :1]), "to match k_cache"),
    ("v_new", lambda a: a.update(v_new=a["v_new"][:2]), "must have the shape of k_new"),
    ("seq_ids", lambda a: a.update(seq_ids=a["seq_ids"][:2]), "must have 3 elements"),
    ("positions", lambda a: a.update(positions=a["positions"].long()), "must be int32"),
    ("page_table", lambda a: a.update(page_table=a["page_table"].float()), "must be int32"),
    ("page_size", lambda a: a.update(k_cache=a["k_cache"][:, :3], v_cache=a["v_cache"][:, :3]),
     "must be a power of two"),
]


def _valid_append():
    k_cache = rand(10, 16, 2, 128, dtype=torch.bfloat16)
    return dict(k_cache=k_cache, v_cache=k_cache.clone(), k_new=rand(3, 2, 128, dtype=torch.bfloat16),
                v_new=rand(3, 2, 128, dtype=torch.bfloat16), page_table=torch.zeros(2, 4, dtype=torch.int32),
                seq_ids=torch.zeros(3, dtype=torch.int32), positions=torch.arange(3, dtype=torch.int32))


@kernels
@pytest.mark.parametrize("argument,change,message", APPEND_BAD, ids=[f"{a}-{m}" for a, _, m in APPEND_BAD])
def test_append_validation(argument, change, message):
    ops.load()
    a = _valid_append()
    change(a)
    with pytest.raises(RuntimeError) as info:
        torch.ops.astrai.paged_kv_append(*a.values())
    text = str(info.value)
    assert "astrai.paged_kv_append" in text and argument in text and message in text, text
    assert "must be a CUDA tensor" not in text


@kernels
def test_append_on_cpu_raises_must_be_cuda():
    ops.load()
    with pytest.raises(RuntimeError, match=r"astrai\.paged_kv_append: k_cache must be a CUDA tensor"):
        torch.ops.astrai.paged_kv_append(*_valid_append().values())


# --- prefill ops: validation ------------------------------------------------------------------------------------
# Shared with tests/gpu/attention/test_prefill_gpu.py, which runs the same table on CUDA tensors.

PREFILL_OPS = {"dense": "attn_prefill", "ragged": "attn_prefill_ragged", "paged": "attn_paged_prefill",
               "paged_ragged": "attn_paged_prefill"}


def valid_prefill(kind: str, device="cpu") -> dict:
    """Arguments one prefill op accepts: B = 3, Hq = 8, Hkv = 2, D = 128."""
    def bf16(*shape):
        return torch.randn(*shape, device=device).to(torch.bfloat16)

    def i32(values):
        return torch.tensor(values, dtype=torch.int32, device=device)

    if kind == "dense":
        k = bf16(3, 40, 2, 128)
        return dict(q=bf16(3, 5, 8, 128), k=k, v=k.clone(), kv_lens=i32([5, 40, 1]), mask=None)
    if kind == "ragged":
        k = bf16(50, 2, 128)
        return dict(q=bf16(20, 8, 128), k=k, v=k.clone(), qo_indptr=i32([0, 5, 12, 20]),
                    kv_indptr=i32([0, 10, 30, 50]), mask=None)
    k = bf16(10, 16, 2, 128)
    args = dict(q=bf16(3, 5, 8, 128), k=k, v=k.clone(), qo_indptr=None,
                page_table=torch.zeros(3, 4, dtype=torch.int32, device=device), kv_lens=i32([5, 64, 1]), mask=None)
    if kind == "paged_ragged":
        args.update(q=bf16(20, 8, 128), qo_indptr=i32([0, 5, 12, 20]))
    return args


def call_prefill(kind: str, a: dict):
    scale, causal = a.get("scale", 0.1), a.get("is_causal", True)
    if kind == "dense":
        return torch.ops.astrai.attn_prefill(a["q"], a["k"], a["v"], a["kv_lens"], a["mask"], causal, scale)
    if kind == "ragged":
        return torch.ops.astrai.attn_prefill_ragged(a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"],
                                                    a["mask"], causal, scale)
    return torch.ops.astrai.attn_paged_prefill(a["q"], a["k"], a["v"], a["qo_indptr"], a["page_table"],
                                               a["kv_lens"], a["mask"], causal, scale)


def _like(a, name, *shape, dtype=None):
    """A fresh tensor on the device of a[name] (masks, indptrs of a new shape)."""
    dev = a["q"].device
    if dtype is torch.bool:
        return torch.ones(*shape, dtype=torch.bool, device=dev)
    return torch.zeros(*shape, dtype=dtype or torch.int32, device=dev)


def _bf16_like(a, *shape):
    return torch.randn(*shape, device=a["q"].device).to(torch.bfloat16)


# (kind, argument the message must name, what, change, message fragment)
PREFILL_BAD = [
    ("dense", "q", "dtype", lambda a: a.update(q=a["q"].float()), "must be bfloat16"),
    ("dense", "k", "dtype", lambda a: a.update(k=a["k"].half()), "must be bfloat16"),
    ("dense", "v", "dtype", lambda a: a.update(v=a["v"].float()), "must be bfloat16"),
    ("dense", "q", "rank", lambda a: a.update(q=a["q"][0]), "must be 4-D"),
    ("dense", "k", "rank", lambda a: a.update(k=a["k"][0], v=a["v"][0]), "must be 4-D"),
    ("dense", "head_dim", "unsupported",
     lambda a: a.update(q=a["q"][..., :96], k=a["k"][..., :96], v=a["v"][..., :96]), "must be 64, 128 or 256"),
    ("dense", "heads", "not a multiple", lambda a: a.update(q=a["q"][:, :, :7]), "must be a positive multiple"),
    ("dense", "k", "head_dim", lambda a: a.update(k=a["k"][..., :64], v=a["v"][..., :64]), "must equal head_dim"),
    ("dense", "v", "shape", lambda a: a.update(v=a["v"][:, :30]), "must have the shape of k"),
    ("dense", "k", "batch", lambda a: a.update(k=a["k"][:2], v=a["v"][:2]), "must equal the batch"),
    ("dense", "kv_lens", "dtype", lambda a: a.update(kv_lens=a["kv_lens"].long()), "must be int32"),
    ("dense", "kv_lens", "size", lambda a: a.update(kv_lens=a["kv_lens"][:2]), "must have 3 elements"),
    ("dense", "kv_lens", "strided", lambda a: a.update(kv_lens=_like(a, "kv_lens", 6)[::2]), "must be contiguous"),
    ("dense", "mask", "dtype", lambda a: a.update(mask=_like(a, "mask", 3, 40, dtype=torch.float32)),
     "must be bool"),
    ("dense", "mask", "rank", lambda a: a.update(mask=_like(a, "mask", 3, 5, 40, 1, dtype=torch.bool)),
     "must be 2-D"),
    ("dense", "mask", "keys", lambda a: a.update(mask=_like(a, "mask", 3, 39, dtype=torch.bool)),
     "must equal the keys per sequence"),
    ("dense", "mask", "rows", lambda a: a.update(mask=_like(a, "mask", 3, 4, 40, dtype=torch.bool)),
     "must equal the query rows"),
    ("dense", "mask", "batch", lambda a: a.update(mask=_like(a, "mask", 2, 40, dtype=torch.bool)),
     "must equal the batch"),
    ("dense", "mask", "last stride", lambda a: a.update(mask=_like(a, "mask", 3, 40, 2, dtype=torch.bool)[..., 0]),
     "stride 1 in its last dimension"),
    ("dense", "scale", "nan", lambda a: a.update(scale=float("nan")), "must be finite and non-zero"),
    ("dense", "scale", "zero", lambda a: a.update(scale=0.0), "must be finite and non-zero"),
    ("dense", "scale", "inf", lambda a: a.update(scale=float("inf")), "must be finite and non-zero"),
    ("dense", "q", "layout", lambda a: a.update(q=_bf16_like(a, 3, 5, 8, 129)[..., 1:]), "must be 16-byte aligned"),
    ("dense", "k", "layout",
     lambda a: a.update(k=_bf16_like(a, 3, 40, 2, 129)[..., 1:], v=_bf16_like(a, 3, 40, 2, 129)[..., 1:]),
     "must be 16-byte aligned"),
    ("dense", "q", "last stride", lambda a: a.update(q=_bf16_like(a, 3, 5, 8, 128, 2)[..., 0]),
     "stride 1 in its last dimension"),
    ("ragged", "q", "rank", lambda a: a.update(q=a["q"][None]), "must be 3-D"),
    ("ragged", "k", "rank", lambda a: a.update(k=a["k"][None], v=a["v"][None]), "must be 3-D"),
    ("ragged", "heads", "not a multiple", lambda a: a.update(q=a["q"][:, :5]), "must be a positive multiple"),
    ("ragged", "qo_indptr", "dtype", lambda a: a.update(qo_indptr=a["qo_indptr"].long()), "must be int32"),
    ("ragged", "qo_indptr", "rank", lambda a: a.update(qo_indptr=a["qo_indptr"][None]), "must be 1-D"),
    ("ragged", "qo_indptr", "empty", lambda a: a.update(qo_indptr=a["qo_indptr"][:0]), "B + 1 >= 1 elements"),
    ("ragged", "qo_indptr", "strided", lambda a: a.update(qo_indptr=_like(a, "qo_indptr", 8)[::2]),
     "must be contiguous"),
    ("ragged", "kv_indptr", "size", lambda a: a.update(kv_indptr=a["kv_indptr"][:3]), "must have 4 elements"),
    ("ragged", "kv_indptr", "dtype", lambda a: a.update(kv_indptr=a["kv_indptr"].long()), "must be int32"),
    ("ragged", "mask", "batch", lambda a: a.update(mask=_like(a, "mask", 2, 50, dtype=torch.bool)),
     "must equal the batch"),
    ("ragged", "mask", "rank", lambda a: a.update(mask=_like(a, "mask", 3, dtype=torch.bool)), "must be 2-D"),
    ("ragged", "v", "shape", lambda a: a.update(v=a["v"][:49]), "must have the shape of k"),
    ("paged", "page_size", "not a power of two", lambda a: a.update(k=a["k"][:, :12], v=a["v"][:, :12]),
     "must be a power of two"),
    ("paged", "page_size", "above 128", lambda a: a.update(k=_bf16_like(a, 2, 256, 2, 128),
                                                           v=_bf16_like(a, 2, 256, 2, 128)),
     "must be a power of two in [1, 128]"),
    ("paged", "page_table", "dtype", lambda a: a.update(page_table=a["page_table"].long()), "must be int32"),
    ("paged", "page_table", "batch", lambda a: a.update(page_table=a["page_table"][:2]), "must equal the batch"),
    ("paged", "page_table", "rank", lambda a: a.update(page_table=a["page_table"][0]), "must be 2-D"),
    ("paged", "page_table", "last stride", lambda a: a.update(page_table=_like(a, "page_table", 3, 8)[:, ::2]),
     "stride 1 in its last dimension"),
    ("paged", "kv_lens", "size", lambda a: a.update(kv_lens=a["kv_lens"][:1]), "must have 3 elements"),
    ("paged", "kv_lens", "dtype", lambda a: a.update(kv_lens=a["kv_lens"].float()), "must be int32"),
    ("paged", "v_cache", "shape", lambda a: a.update(v=a["v"][:9]), "must have the shape of k_cache"),
    ("paged", "k_cache", "head_dim", lambda a: a.update(k=a["k"][..., :64], v=a["v"][..., :64]),
     "must equal head_dim"),
    ("paged", "k_cache", "rank", lambda a: a.update(k=a["k"][0], v=a["v"][0]), "must be 4-D"),
    ("paged", "q", "rank (no qo_indptr)", lambda a: a.update(q=a["q"][0]), "must be 4-D"),
    ("paged", "mask", "rows", lambda a: a.update(mask=_like(a, "mask", 3, 6, 64, dtype=torch.bool)),
     "must equal the query rows"),
    ("paged", "mask", "dtype", lambda a: a.update(mask=_like(a, "mask", 3, 64, dtype=torch.uint8)),
     "must be bool"),
    ("paged_ragged", "qo_indptr", "size", lambda a: a.update(qo_indptr=a["qo_indptr"][:3]), "must have 4 elements"),
    ("paged_ragged", "qo_indptr", "dtype", lambda a: a.update(qo_indptr=a["qo_indptr"].long()), "must be int32"),
    ("paged_ragged", "q", "rank (with qo_indptr)", lambda a: a.update(q=a["q"][None]), "must be 3-D"),
    ("paged_ragged", "mask", "batch", lambda a: a.update(mask=_like(a, "mask", 4, 7, 64, dtype=torch.bool)),
     "must equal the batch"),
    ("paged_ragged", "mask", "expanded rows",
     lambda a: a.update(mask=_like(a, "mask", 3, 1, 64, dtype=torch.bool).expand(3, 7, 64)), "stride 0 along its rows"),
    ("ragged", "mask", "expanded rows",
     lambda a: a.update(mask=_like(a, "mask", 3, 1, 50, dtype=torch.bool).expand(3, 4, 50)), "stride 0 along its rows"),
]
PREFILL_BAD_IDS = [f"{kind}-{arg}-{what}" for kind, arg, what, _, _ in PREFILL_BAD]


def check_prefill_rejects(kind, argument, change, message, device="cpu"):
    """Apply `change` to valid arguments: the op must raise naming itself, the argument and the rule, before
    the device check (a CPU call) or before launch (a CUDA call)."""
    args = valid_prefill(kind, device)
    change(args)
    with pytest.raises(RuntimeError) as info:
        call_prefill(kind, args)
    text = str(info.value)
    assert re.search(rf"astrai\.{PREFILL_OPS[kind]}\b", text), f"op name not in: {text}"
    assert argument in text and message in text, f"expected {argument!r} and {message!r} in: {text}"
    assert "must be a CUDA tensor" not in text and "CUDA error" not in text, f"checked too late: {text}"


@kernels
@pytest.mark.parametrize("kind,argument,what,change,message", PREFILL_BAD, ids=PREFILL_BAD_IDS)
def test_prefill_validation_names_op_and_argument(kind, argument, what, change, message):
    ops.load()
    check_prefill_rejects(kind, argument, change, message)


@kernels
@pytest.mark.parametrize("kind", list(PREFILL_OPS))
def test_prefill_on_cpu_raises_must_be_cuda(kind):
    """Valid arguments on the CPU pass every check and stop at the device (the masks included)."""
    ops.load()
    args = valid_prefill(kind)
    keys = 40 if kind == "dense" else 64 if kind.startswith("paged") else 50
    args["mask"] = torch.rand(3, 5 if kind in ("dense", "paged") else 9, keys) > 0.5
    with pytest.raises(RuntimeError, match=rf"astrai\.{PREFILL_OPS[kind]}: q must be a CUDA tensor, got cpu"):
        call_prefill(kind, args)
    args["mask"] = args["mask"][:, 0]
    with pytest.raises(RuntimeError, match="q must be a CUDA tensor"):
        call_prefill(kind, args)


@pytest.mark.parametrize("values,message", [
    ([0, 5, 3, 20], r"qo_indptr\[2\] = 3 < qo_indptr\[1\] = 5"),
    ([-1, 5, 12, 20], r"qo_indptr\[0\] = -1 < 0"),
    ([0, 5, 12, 21], r"qo_indptr\[-1\] = 21 > q.size\(0\) = 20"),
])
def test_indptr_range_check(values, message):
    """The wrappers' one-sync range check (no image needed: it runs before the op)."""
    good = torch.tensor([0, 10, 30, 50], dtype=torch.int32)
    with pytest.raises(ValueError, match=message):
        ops.check_indptr_range("astrai.attn_prefill_ragged", [
            ("kv_indptr", good, 50, "k.size(0)"), ("qo_indptr", torch.tensor(values, dtype=torch.int32), 20,
                                                    "q.size(0)")])
    ops.check_indptr_range("op", [("qo_indptr", good, 50, "q.size(0)")])  # a valid one passes
    ops.check_indptr_range("op", [("qo_indptr", good.long() - 7, 1, "q.size(0)")])  # int64: left to the op
    ops.check_indptr_range("op", [("qo_indptr", _meta(4, dtype=torch.int32), 1, "q.size(0)")])  # meta: no values


@kernels
def test_prefill_wrappers_check_indptr_then_the_op_runs():
    ops.load()
    a = valid_prefill("ragged")
    bad = torch.tensor([0, 12, 5, 20], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"astrai\.attn_prefill_ragged: qo_indptr must start at >= 0, never "
                                         r"decrease and end at most at q.size\(0\) = 20"):
        ops.attn_prefill_ragged(a["q"], a["k"], a["v"], bad, a["kv_indptr"])
    with pytest.raises(ValueError, match=r"kv_indptr\[-1\] = 51 > k.size\(0\) = 50"):
        ops.attn_prefill_ragged(a["q"], a["k"], a["v"], a["qo_indptr"], a["kv_indptr"] + 1)
    with pytest.raises(RuntimeError, match="q must be a CUDA tensor"):  # unchecked: the op sees it
        ops.attn_prefill_ragged(a["q"], a["k"], a["v"], bad, a["kv_indptr"], check_indptr=False)
    p = valid_prefill("paged_ragged")
    with pytest.raises(ValueError, match=r"astrai\.attn_paged_prefill: .*qo_indptr\[2\] = 5 < qo_indptr\[1\]"):
        ops.attn_paged_prefill(p["q"], p["k"], p["v"], p["page_table"], p["kv_lens"], qo_indptr=bad)


def _i32(values):
    return torch.tensor(values, dtype=torch.int32)


# page_size 16, 10 pages; row b reads ceil(kv_lens[b] / 16) entries of its row of 4
GOOD_TABLE = [[3, 1, -1, 77], [0, 9, 5, 2], [4, -1, -1, -1]]  # unread entries may hold anything
GOOD_LENS = [20, 64, 16]


@pytest.mark.parametrize("table,lens,message", [
    (GOOD_TABLE, [20, 65, 16], r"kv_lens\[1\] = 65 is outside \[0, max_pages \* page_size\] = \[0, 64\]"),
    (GOOD_TABLE, [20, 64, -1], r"kv_lens\[2\] = -1 is outside"),
    (GOOD_TABLE, [33, 64, 16], r"page_table\[0, 2\] = -1 is outside \[0, num_pages\) = \[0, 10\) "
                               r"\(k_cache.size\(0\)\); sequence 0 reads the first 3 entries of its row "
                               r"\(kv_lens\[0\] = 33, page_size 16\)"),
    ([[3, 1, -1, 77], [0, 10, 5, 2], [4, -1, -1, -1]], GOOD_LENS, r"page_table\[1, 1\] = 10 is outside"),
    ([[3, 1, -1, 77], [0, 9, 5, 2], [-4, -1, -1, -1]], [20, 64, 1], r"page_table\[2, 0\] = -4 is outside"),
])
def test_page_range_check(table, lens, message):
    """The paged calls' opt-in one-sync check (no image needed: it runs before the op)."""
    with pytest.raises(ValueError, match=r"astrai\.attn_paged_decode: " + message):
        ops.check_page_range("astrai.attn_paged_decode", _i32(table), _i32(lens), 10, 16)


def test_page_range_check_passes_what_is_in_range_and_leaves_the_rest_to_the_op():
    ops.check_page_range("op", _i32(GOOD_TABLE), _i32(GOOD_LENS), 10, 16)
    ops.check_page_range("op", _i32([[0], [1]]), _i32([0, 0]), 2, 16)   # length 0 reads no entry
    ops.check_page_range("op", torch.zeros(0, 4, dtype=torch.int32), _i32([]), 10, 16)
    bad_table = _i32([[-1, -1, -1, -1]] * 3)
    ops.check_page_range("op", bad_table.long(), _i32(GOOD_LENS), 10, 16)      # int64: left to the op
    ops.check_page_range("op", bad_table, _i32(GOOD_LENS[:2]), 10, 16)         # B mismatch: left to the op
    ops.check_page_range("op", _meta(3, 4, dtype=torch.int32), _meta(3, dtype=torch.int32), 10, 16)  # no values


@pytest.mark.parametrize("seq_ids,positions,message", [
    ([0, 1, 3, 1], [0, 1, 2, 3], r"seq_ids\[2\] = 3 is outside \[0, page_table.size\(0\)\) = \[0, 3\)"),
    ([0, 1, 2, -1], [0, 1, 2, 3], r"seq_ids\[3\] = -1 is outside"),
    ([0, 1, 2, 1], [0, 64, 2, 3], r"positions\[1\] = 64 is outside \[0, max_pages \* page_size\) = \[0, 64\) "
                                  r"\(page_table \[3, 4\], page_size 16\)"),
    ([0, 1, 2, 1], [0, 1, 17, 3], r"token 2 \(seq_ids\[2\] = 2, positions\[2\] = 17\) lands in "
                                  r"page_table\[2, 1\] = -1, outside \[0, num_pages\) = \[0, 10\)"),
    ([0, 0, 2, 1], [0, 63, 2, 3], r"token 1 .* page_table\[0, 3\] = 77, outside"),
])
def test_append_range_check(seq_ids, positions, message):
    with pytest.raises(ValueError, match=r"astrai\.paged_kv_append: " + message):
        ops.check_append_range("astrai.paged_kv_append", _i32(GOOD_TABLE), _i32(seq_ids), _i32(positions), 10, 16)
    ops.check_append_range("op", _i32(GOOD_TABLE), _i32([0, 0, 1, 2]), _i32([0, 17, 63, 15]), 10, 16)
    ops.check_append_range("op", _i32(GOOD_TABLE), _i32(seq_ids).long(), _i32(positions), 10, 16)  # int64: the op
    ops.check_append_range("op", _i32(GOOD_TABLE), _i32(seq_ids), _i32(positions)[:2], 10, 16)    # N mismatch
    ops.check_append_range("op", torch.zeros(0, 4, dtype=torch.int32), _i32([]), _i32([]), 10, 16)  # no token


@kernels
def test_paged_wrappers_check_pages_only_when_asked():
    """check_pages=True stops a bad page id before the op; off (the default) the op runs (here: stops at the
    device, the CPU)."""
    ops.load()
    d = _valid_decode(paged=True)
    d["page_table"][1, 2] = 10
    with pytest.raises(ValueError, match=r"astrai\.attn_paged_decode: page_table\[1, 2\] = 10 is outside"):
        ops.attn_paged_decode(d["q"], d["k"], d["v"], d["page_table"], d["kv_lens"], check_pages=True)
    with pytest.raises(RuntimeError, match="q must be a CUDA tensor"):
        ops.attn_paged_decode(d["q"], d["k"], d["v"], d["page_table"], d["kv_lens"])
    p = valid_prefill("paged")
    p["kv_lens"][0] = 65
    with pytest.raises(ValueError, match=r"astrai\.attn_paged_prefill: kv_lens\[0\] = 65 is outside"):
        ops.attn_paged_prefill(p["q"], p["k"], p["v"], p["page_table"], p["kv_lens"], check_pages=True)
    with pytest.raises(RuntimeError, match="q must be a CUDA tensor"):
        ops.attn_paged_prefill(p["q"], p["k"], p["v"], p["page_table"], p["kv_lens"])
    a = _valid_append()
    a["positions"][2] = 64
    with pytest.raises(ValueError, match=r"astrai\.paged_kv_append: positions\[2\] = 64 is outside"):
        ops.paged_kv_append(*a.values(), check_pages=True)
    with pytest.raises(RuntimeError, match="k_cache must be a CUDA tensor"):
        ops.paged_kv_append(*a.values())


def test_cache_with_check_pages_checks_every_append_and_read():
    cache = PagedKVCache(1, 2, 8, num_pages=4, page_size=4, max_batch_size=2, check_pages=True)
    cache.reset(2)
    cache.extend([5, 3])
    cache.append(0, rand(8, 2, 8), rand(8, 2, 8))
    q = rand(2, 1, 4, 8)
    attention(q, kv_cache=cache, layer_id=0)  # what extend wrote is in range
    cache.page_table[0, 1] = 7                # a page id written by hand
    with pytest.raises(ValueError, match=r"^attention: page_table\[0, 1\] = 7 is outside \[0, num_pages\) = "
                                         r"\[0, 4\)"):
        attention(q, kv_cache=cache, layer_id=0)
    cache.extend(1)                           # rewrites the table from the allocator's pages
    attention(q, kv_cache=cache, layer_id=0)
    cache.page_table[0, 1] = 7
    with pytest.raises(ValueError, match=r"^PagedKVCache\.append: token 0 \(seq_ids\[0\] = 0, positions\[0\] = "
                                         r"5\) lands in page_table\[0, 1\] = 7"):
        cache.append(0, rand(2, 2, 8), rand(2, 2, 8))
    cache.check_pages = False                 # unchecked: the torch path drops the page, as the kernels do
    cache.append(0, rand(2, 2, 8), rand(2, 2, 8))
    assert attention(q, kv_cache=cache, layer_id=0).shape == q.shape


def _meta(*shape, dtype=torch.bfloat16):
    return torch.empty(*shape, dtype=dtype, device="meta")


@kernels
def test_fakes_on_meta():
    ops.load()
    q = _meta(4, 1, 32, 128)
    k = _meta(4, 100, 8, 128)
    out = ops.attn_decode(q, k, k, _meta(4, dtype=torch.int32))
    assert out.shape == (4, 1, 32, 128) and out.is_meta and out.dtype == torch.bfloat16
    cache = _meta(50, 16, 8, 128)
    out = ops.attn_paged_decode(q[:, 0], cache, cache, _meta(4, 7, dtype=torch.int32), _meta(4, dtype=torch.int32))
    assert out.shape == (4, 32, 128)
    assert ops.paged_kv_append(cache, cache, _meta(4, 8, 128), _meta(4, 8, 128), _meta(4, 7, dtype=torch.int32),
                               _meta(4, dtype=torch.int32), _meta(4, dtype=torch.int32)) is None
    with pytest.raises(ValueError, match=r"a 4-D q must be \[B, 1, Hq, D\]"):
        ops.attn_decode(_meta(4, 2, 32, 128), k, k)


@kernels
def test_prefill_fakes_on_meta():
    ops.load()
    i32 = torch.int32
    q = _meta(4, 100, 32, 128)
    k = _meta(4, 300, 8, 128)
    out = ops.attn_prefill(q, k, k, _meta(4, dtype=i32), mask=_meta(4, 100, 300, dtype=torch.bool), is_causal=True)
    assert out.shape == q.shape and out.is_meta and out.dtype == torch.bfloat16
    packed = _meta(211, 32, 128)
    out = ops.attn_prefill_ragged(packed, _meta(500, 8, 128), _meta(500, 8, 128), _meta(4, dtype=i32),
                                  _meta(4, dtype=i32), is_causal=True)
    assert out.shape == (211, 32, 128) and out.is_meta
    cache = _meta(50, 16, 8, 128)
    table, lens = _meta(3, 7, dtype=i32), _meta(3, dtype=i32)
    assert ops.attn_paged_prefill(packed, cache, cache, table, lens, qo_indptr=_meta(4, dtype=i32)).shape == \
        (211, 32, 128)
    assert ops.attn_paged_prefill(q[:3], cache, cache, table, lens).shape == (3, 100, 32, 128)


@kernels
def test_prefill_compiles_with_fullgraph():
    """torch.compile traces the prefill ops through their fakes (CPU inputs: the graph never runs a kernel)."""
    ops.load()

    def f(q, k, v, qo, kv):
        return ops.attn_prefill_ragged(q, k, v, qo, kv, is_causal=True) * 2

    args = (_meta(20, 8, 128), _meta(50, 2, 128), _meta(50, 2, 128), _meta(4, dtype=torch.int32),
            _meta(4, dtype=torch.int32))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(allow_non_fake_inputs=True):
        out = torch.compile(f, fullgraph=True, backend="eager")(*args)
    assert out.shape == (20, 8, 128)


@kernels
@pytest.mark.parametrize("name", list(CONTRACT_SCHEMAS))
def test_opcheck_on_meta(name):
    """opcheck returns early on meta inputs; this proves the op and its fake accept these arguments."""
    ops.load()
    i32 = torch.int32
    args = {
        "attn_decode": (_meta(4, 32, 128), _meta(4, 64, 8, 128), _meta(4, 64, 8, 128), _meta(4, dtype=i32), None,
                        0.1, 0),
        "attn_paged_decode": (_meta(4, 32, 128), _meta(9, 16, 8, 128), _meta(9, 16, 8, 128), _meta(4, 3, dtype=i32),
                              _meta(4, dtype=i32), _meta(4, 40, dtype=torch.bool), 0.1, 64),
        "paged_kv_append": (_meta(9, 16, 8, 128), _meta(9, 16, 8, 128), _meta(5, 8, 128), _meta(5, 8, 128),
                            _meta(4, 3, dtype=i32), _meta(5, dtype=i32), _meta(5, dtype=i32)),
        "attn_prefill": (_meta(4, 33, 32, 128), _meta(4, 64, 8, 128), _meta(4, 64, 8, 128), _meta(4, dtype=i32),
                         _meta(4, 33, 64, dtype=torch.bool), True, 0.1),
        "attn_prefill_ragged": (_meta(70, 32, 64), _meta(90, 8, 64), _meta(90, 8, 64), _meta(4, dtype=i32),
                                _meta(4, dtype=i32), None, False, 0.1),
        "attn_paged_prefill": (_meta(70, 32, 256), _meta(9, 16, 8, 256), _meta(9, 16, 8, 256), _meta(4, dtype=i32),
                               _meta(3, 3, dtype=i32), _meta(3, dtype=i32), _meta(3, 40, dtype=torch.bool), True,
                               0.1),
    }[name]
    torch.library.opcheck(getattr(torch.ops.astrai, name).default, args, test_utils=("test_schema", "test_faketensor"))


@kernels
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: tests/gpu runs the smoke test")
def test_smoke_test_without_gpu_raises():
    with pytest.raises(RuntimeError, match="no CUDA device is visible"):
        ops.smoke_test()


# --- fallbacks of the automatic choice -------------------------------------------------------------------------

def test_auto_fallback_is_logged_once_per_reason_and_shown_by_info(caplog):
    from astrai.extension import _fallbacks, loader
    _fallbacks.reset()
    q, k = rand(2, 1, 4, 64), rand(2, 10, 2, 64)
    with caplog.at_level("INFO", logger="astrai.extension"):
        attention(q, k, k)
        attention(q, k, k)
        with attn_backend("torch"):  # a strict choice is no fallback
            attention(q, k, k)
    logged = [r for r in caplog.records if r.name == "astrai.extension"]
    assert len(logged) == 1 and logged[0].levelname == "INFO"  # CPU tensors: INFO, once
    assert "attention ran on torch instead of this package's CUDA kernels: q and K/V must be CUDA tensors" \
        in logged[0].getMessage()
    snap = loader.describe()["fallbacks"]
    assert snap["total"] == 2 and snap["last"]["op"] == "attention" and snap["last"]["count"] == 2
    assert "fallbacks  2 call(s) in this process, 1 reason(s); last: attention ran on torch" in loader.info()
    with caplog.at_level("INFO", logger="astrai.extension"):
        _fallbacks.record("attention", "head_dim 96 is not one of (64, 128, 256)", "torch", on_gpu=True)
    assert caplog.records[-1].levelname == "WARNING"  # CUDA tensors: WARNING
    _fallbacks.reset()
    assert loader.describe()["fallbacks"]["last"] is None
