"""Golden cases for the attention family: decode (contiguous and paged, a fixed kv_split_size so the plan does not
depend on the GPU's SM count), the paged KV append, and prefill (dense, ragged, paged), on fixed seeded inputs
(CPU generator).

Each case calls `torch.ops.astrai.<op>` with the schema's arguments (docs/contracts.md, "Attention ops");
tests/gpu/test_golden.py compares the outputs' sha256 with tests/golden/attention.json. A case whose op the
image does not register yet skips. Adding a case is one line of DECODE or PREFILL (inputs are seeded by the
case name, so existing digests do not move).
"""

from __future__ import annotations

import math

import torch

from support import golden
from support.golden import OpCase, op_cases, randn



def _lens(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=golden.DEVICE)


def _paged(gen, k, v, page_size, extra_pages=3):
    """Scatter contiguous [B, L, Hkv, D] into a shuffled paged cache (unused slots random, never read);
    returns k_cache, v_cache, page_table [B, ceil(L / page_size)] int32."""
    batch, length, heads_kv, head_dim = k.shape
    max_pages = -(-length // page_size)
    num_pages = batch * max_pages + extra_pages
    table = torch.randperm(num_pages, generator=gen)[:batch * max_pages].view(batch, max_pages).to(golden.DEVICE)
    k_cache, v_cache = (randn(gen, num_pages, page_size, heads_kv, head_dim) for _ in range(2))
    pad = max_pages * page_size - length
    for cache, src in ((k_cache, k), (v_cache, v)):
        cache[table.long()] = torch.nn.functional.pad(src, (0, 0, 0, 0, 0, pad)).view(
            batch, max_pages, page_size, heads_kv, head_dim)
    return k_cache, v_cache, table.to(torch.int32)


def _keep(gen, *shape) -> torch.Tensor:
    """A bool keep-mask, about 80% True."""
    return (torch.rand(*shape, generator=gen) < 0.8).to(golden.DEVICE)


# ---- decode: q [B, Hq, D] against K/V [B, L, Hkv, D] or a paged cache --------------------------------------

def decode(batch, length, heads_q, heads_kv, head_dim, lens, split, masked=False) -> OpCase:
    """attn_decode(q, k, v, kv_lens, mask, scale, kv_split_size); lens None: every sequence uses all L."""
    def build(gen):
        q = randn(gen, batch, heads_q, head_dim)
        k, v = randn(gen, batch, length, heads_kv, head_dim), randn(gen, batch, length, heads_kv, head_dim)
        mask = _keep(gen, batch, length) if masked else None
        return q, k, v, None if lens is None else _lens(lens), mask, 1 / math.sqrt(head_dim), split
    return OpCase("attn_decode", build)


def paged_decode(batch, length, heads_q, heads_kv, head_dim, lens, split, page_size, masked=False) -> OpCase:
    """attn_paged_decode(q, k_cache, v_cache, page_table, kv_lens, mask, scale, kv_split_size)."""
    def build(gen):
        q = randn(gen, batch, heads_q, head_dim)
        k, v = randn(gen, batch, length, heads_kv, head_dim), randn(gen, batch, length, heads_kv, head_dim)
        k_cache, v_cache, table = _paged(gen, k, v, page_size)
        mask = _keep(gen, batch, length) if masked else None
        return q, k_cache, v_cache, table, _lens(lens), mask, 1 / math.sqrt(head_dim), split
    return OpCase("attn_paged_decode", build)


def append(tokens, heads_kv, head_dim, page_size, batch=5, max_pages=6) -> OpCase:
    """paged_kv_append into random caches at distinct (sequence, position) pairs, some out of range (dropped);
    the outputs are the caches after the call."""
    def build(gen):
        num_pages = batch * max_pages + 2
        k_cache, v_cache = (randn(gen, num_pages, page_size, heads_kv, head_dim) for _ in range(2))
        table = torch.randperm(num_pages, generator=gen)[:batch * max_pages].view(batch, max_pages).to(torch.int32)
        table[1, 2], table[3, 0] = -1, num_pages + 4  # page ids outside the cache: never written
        seqs = torch.randint(-1, batch + 1, (4 * tokens,), generator=gen)
        positions = torch.randint(-2, max_pages * page_size + 2, (4 * tokens,), generator=gen)
        pairs = sorted({(int(s), int(p)) for s, p in zip(seqs, positions)})[:tokens]  # distinct: no slot races
        seq_ids = torch.tensor([s for s, _ in pairs], dtype=torch.int32)
        pos = torch.tensor([p for _, p in pairs], dtype=torch.int32)
        order = torch.randperm(len(pairs), generator=gen)
        k_new, v_new = (randn(gen, len(pairs), heads_kv, head_dim) for _ in range(2))
        return (k_cache, v_cache, k_new, v_new, table.to(golden.DEVICE), seq_ids[order].to(golden.DEVICE),
                pos[order].to(golden.DEVICE))
    return OpCase("paged_kv_append", build, written=(0, 1))


DECODE = {
    # contiguous: ragged lengths, GQA 4 / MQA 8 / GQA 8, D 128 / 64 / 256, a key mask
    "decode_B4_L989_H32x8_D128_ragged_split256": decode(4, 989, 32, 8, 128, [989, 1, 77, 500], 256),
    "decode_B3_L300_H8x1_D64_split64": decode(3, 300, 8, 1, 64, None, 64),
    "decode_B2_L1000_H16x2_D256_mask_split128": decode(2, 1000, 16, 2, 256, [1000, 999], 128, masked=True),
    "decode_B1_L4099_H32x8_D128_split1000": decode(1, 4099, 32, 8, 128, [4099], 1000),
    # paged: page sizes 1, 16, 128 over a shuffled page table
    "paged_decode_B4_L989_H32x8_D128_page16_split256": paged_decode(4, 989, 32, 8, 128, [989, 1, 77, 500], 256, 16),
    "paged_decode_B3_L300_H8x2_D64_page1_split64": paged_decode(3, 300, 8, 2, 64, [300, 299, 3], 64, 1),
    "paged_decode_B2_L1000_H16x2_D256_page128_mask_split128": paged_decode(2, 1000, 16, 2, 256, [1000, 640], 128,
                                                                           128, masked=True),
    # the append: bitwise copies into page slots
    "append_N200_H8_D128_page16": append(200, 8, 128, 16),
    "append_N60_H2_D64_page1": append(60, 2, 64, 1),
}


# ---- prefill: many query rows per sequence, causal aligned to the end of the keys ---------------------------

def prefill(batch, q_len, length, heads_q, heads_kv, head_dim, lens, causal, masked=False) -> OpCase:
    """attn_prefill(q [B, Lq, Hq, D], k, v [B, L, Hkv, D], kv_lens, mask [B, Lq, L], is_causal, scale)."""
    def build(gen):
        q = randn(gen, batch, q_len, heads_q, head_dim)
        k, v = randn(gen, batch, length, heads_kv, head_dim), randn(gen, batch, length, heads_kv, head_dim)
        mask = _keep(gen, batch, q_len, length) if masked else None
        return q, k, v, None if lens is None else _lens(lens), mask, causal, 1 / math.sqrt(head_dim)
    return OpCase("attn_prefill", build)


def _indptr(counts) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(counts).cumsum(0).tolist()], dtype=torch.int32, device=golden.DEVICE)


def prefill_ragged(q_lens, kv_lens, heads_q, heads_kv, head_dim, causal) -> OpCase:
    """attn_prefill_ragged(q [Tq, Hq, D], k, v [Tkv, Hkv, D], qo_indptr, kv_indptr, mask, is_causal, scale)."""
    def build(gen):
        q = randn(gen, sum(q_lens), heads_q, head_dim)
        k, v = randn(gen, sum(kv_lens), heads_kv, head_dim), randn(gen, sum(kv_lens), heads_kv, head_dim)
        return q, k, v, _indptr(q_lens), _indptr(kv_lens), None, causal, 1 / math.sqrt(head_dim)
    return OpCase("attn_prefill_ragged", build)


def paged_prefill(q_lens, kv_lens, heads_q, heads_kv, head_dim, page_size, causal) -> OpCase:
    """attn_paged_prefill(q, k_cache, v_cache, qo_indptr, page_table, kv_lens, mask, is_causal, scale): q packed
    [Tq, Hq, D] by qo_indptr when q_lens is a list, dense [B, q_lens, Hq, D] (qo_indptr None) when an int."""
    def build(gen):
        batch, length = len(kv_lens), max(kv_lens)
        dense = isinstance(q_lens, int)
        q = randn(gen, batch, q_lens, heads_q, head_dim) if dense else randn(gen, sum(q_lens), heads_q, head_dim)
        k, v = randn(gen, batch, length, heads_kv, head_dim), randn(gen, batch, length, heads_kv, head_dim)
        k_cache, v_cache, table = _paged(gen, k, v, page_size)
        return (q, k_cache, v_cache, None if dense else _indptr(q_lens), table, _lens(kv_lens), None, causal,
                1 / math.sqrt(head_dim))
    return OpCase("attn_paged_prefill", build)


PREFILL = {
    "prefill_B2_Lq77_L300_H32x8_D128_causal": prefill(2, 77, 300, 32, 8, 128, [300, 120], True),
    "prefill_B1_Lq256_L256_H8x8_D64": prefill(1, 256, 256, 8, 8, 64, None, False),
    "prefill_B2_Lq33_L99_H16x2_D256_causal_mask": prefill(2, 33, 99, 16, 2, 256, None, True, masked=True),
    "prefill_ragged_H32x8_D128_causal": prefill_ragged([1, 77, 300], [19, 300, 300], 32, 8, 128, True),
    "paged_prefill_H32x8_D128_page16_causal": paged_prefill([5, 64, 1], [989, 64, 33], 32, 8, 128, 16, True),
    "paged_prefill_dense_B2_Lq64_H16x2_D64_page1_causal": paged_prefill(64, [300, 64], 16, 2, 64, 1, True),
}

CASES = op_cases("attention", {**DECODE, **PREFILL})
