"""Plain-torch attention references: float64 truth (upcast=True) or the same-precision baseline (upcast=False).

Written from the contract with explicit matmul/softmax, independent of the library's SDPA path:
q `[B, Lq, Hq, D]`, K/V `[B, L, Hkv, D]`, q head h reads kv head `h // (Hq // Hkv)`; key j of sequence b is
kept iff `j < kv_lens[b]`, the mask keeps it, and (causal) `j <= kv_lens[b] - Lq + i` for query i; a query
with no kept key gives zeros. Paged helpers walk the page table with Python loops.
"""

from __future__ import annotations

import math

import torch


def keep_mask(batch: int, q_len: int, length: int, *, kv_lens=None, attn_mask=None, is_causal=False,
              valid=None, device=None) -> torch.Tensor:
    """The keys each query keeps: bool `[B, Lq, L]`."""
    lens = (torch.full((batch,), length, dtype=torch.long, device=device) if kv_lens is None
            else kv_lens.long().clamp(0, length).to(device))
    j = torch.arange(length, device=device)
    keep = (j[None, :] < lens[:, None])[:, None, :].expand(batch, q_len, length).clone()
    if valid is not None:
        keep &= valid[:, None, :].to(device)
    if attn_mask is not None:
        m = attn_mask.to(device)
        m = m[:, None, :] if m.dim() == 2 else m
        if m.shape[-1] < length:
            m = torch.cat([m, m.new_zeros(*m.shape[:-1], length - m.shape[-1])], dim=-1)
        keep &= m
    if is_causal:
        i = torch.arange(q_len, device=device)
        last = lens[:, None] - q_len + i[None, :]  # [B, Lq]: last key query i sees
        keep &= j[None, None, :] <= last[:, :, None]
    return keep


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, kv_lens=None, attn_mask=None,
              is_causal: bool = False, scale: float | None = None, valid=None, upcast: bool = True) -> torch.Tensor:
    """Attention of q `[B, Lq, Hq, D]` over k, v `[B, L, Hkv, D]`; returns `[B, Lq, Hq, D]`.

    upcast=True: float64 throughout (the truth). upcast=False: q's dtype throughout (a naive
    same-precision computation). `valid` `[B, L]` drops further keys (e.g. unaddressable pages).
    """
    dtype = torch.float64 if upcast else q.dtype
    batch, q_len, heads_q, head_dim = q.shape
    length, heads_kv = k.shape[1], k.shape[2]
    group = heads_q // heads_kv
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    keep = keep_mask(batch, q_len, length, kv_lens=kv_lens, attn_mask=attn_mask, is_causal=is_causal, valid=valid,
                     device=q.device)  # [B, Lq, L]
    qq = q.to(dtype).transpose(1, 2)                                         # [B, Hq, Lq, D]
    kk = k.to(dtype).repeat_interleave(group, dim=2).transpose(1, 2)         # [B, Hq, L, D]
    vv = v.to(dtype).repeat_interleave(group, dim=2).transpose(1, 2)
    scores = (qq @ kk.transpose(-1, -2)) * scale                             # [B, Hq, Lq, L]
    scores = scores.masked_fill(~keep[:, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)                    # all-masked rows: zeros
    out = (probs @ vv).transpose(1, 2)                                       # [B, Lq, Hq, D]
    return out.masked_fill(~keep.any(-1)[:, :, None, None], 0.0)


def gather_paged(cache: torch.Tensor, page_table: torch.Tensor, kv_lens: torch.Tensor):
    """Walk the page table: contiguous `[B, max_pages * page_size, Hkv, D]` (zeros where nothing is stored)
    and valid `[B, same]` (key below its length on a page id in range)."""
    num_pages, page_size = cache.shape[:2]
    batch, max_pages = page_table.shape
    out = cache.new_zeros(batch, max_pages * page_size, *cache.shape[2:])
    valid = torch.zeros(batch, max_pages * page_size, dtype=torch.bool)
    table, lens = page_table.cpu().tolist(), kv_lens.cpu().tolist()
    for b in range(batch):
        for t in range(min(max(lens[b], 0), max_pages * page_size)):
            page = table[b][t // page_size]
            if 0 <= page < num_pages:
                out[b, t] = cache[page, t % page_size]
                valid[b, t] = True
    return out, valid.to(cache.device)


def paged_append(k_cache, v_cache, k_new, v_new, page_table, seq_ids, positions) -> None:
    """The append contract, one token at a time (out-of-range sequence, position or page: not written)."""
    num_pages, page_size = k_cache.shape[:2]
    batch, max_pages = page_table.shape
    table = page_table.cpu().tolist()
    for n, (b, t) in enumerate(zip(seq_ids.cpu().tolist(), positions.cpu().tolist())):
        if not (0 <= b < batch and 0 <= t < max_pages * page_size):
            continue
        page = table[b][t // page_size]
        if 0 <= page < num_pages:
            k_cache[page, t % page_size] = k_new[n]
            v_cache[page, t % page_size] = v_new[n]
