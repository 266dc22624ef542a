"""Stateless wrappers over the torch.ops.astrai attention kernels: run the kernel or raise, never fall back.

Ops (schemas in docs/contracts.md, "Attention ops"):

- `attn_decode`: one query token per sequence, q `[B, Hq, D]` (or `[B, 1, Hq, D]`), against contiguous K/V
  `[B, L, Hkv, D]` with optional per-sequence lengths `kv_lens` `[B]` int32 (a ragged batch);
- `attn_paged_decode`: the same against a paged cache `[num_pages, page_size, Hkv, D]` through a page table
  `[B, max_pages]` int32 and `kv_lens` `[B]` int32;
- `paged_kv_append`: write N new K/V tokens (`[N, Hkv, D]`) into a paged cache at (`seq_ids[n]`,
  `positions[n]`), one launch.

bf16, head_dim 64/128/256, Hq a multiple of Hkv (GQA, MQA), softmax scale `1/sqrt(D)` unless given, fp32
online softmax, split-KV with a log-sum-exp combine. These wrappers add only: loading the family on first
use and registering the fake implementations, the 4-D q view, and the default scale. Everything else is
checked by the op, which raises `RuntimeError` naming the op and the argument. Code that wants "the best
available implementation" calls `astrai.extension.attention` instead.

Example::

    from astrai.extension.ops import attention as ops
    out = ops.attn_decode(q, k, v, kv_lens)                        # q [B, 32, 128], k/v [B, L, 8, 128]
    out = ops.attn_paged_decode(q, k_cache, v_cache, page_table, kv_lens)
"""

from __future__ import annotations

import math

import torch

from astrai.extension import loader
from astrai.extension.ops._fakes import register_fakes

FAMILY = "attention"
OP_DECODE = "astrai.attn_decode"
OP_PAGED_DECODE = "astrai.attn_paged_decode"
OP_APPEND = "astrai.paged_kv_append"
HEAD_DIMS = (64, 128, 256)
MAX_PAGE_SIZE = 128

_loaded = False


def _fake_decode(q, k, v, kv_lens, mask, scale, kv_split_size):
    return q.new_empty(q.shape)  # [B, Hq, D] contiguous bf16


def _fake_paged_decode(q, k_cache, v_cache, page_table, kv_lens, mask, scale, kv_split_size):
    return q.new_empty(q.shape)


def _fake_append(k_cache, v_cache, k_new, v_new, page_table, seq_ids, positions):
    return None


_FAKES = {"astrai::attn_decode": _fake_decode,
          "astrai::attn_paged_decode": _fake_paged_decode,
          "astrai::paged_kv_append": _fake_append}


@torch.compiler.assume_constant_result
def load() -> bool:
    """Load the attention family and register its fake implementations; idempotent.

    Raises
    ------
    loader.FamilyUnavailableError
        No image serves the attention family here; the message says why and how to find out more.
    """
    global _loaded
    if not _loaded:
        loader.load_family(FAMILY, op=OP_DECODE)
        register_fakes(_FAKES)
        _loaded = True
    return True


def _q3(q: torch.Tensor, op: str) -> torch.Tensor:
    """[B, 1, Hq, D] -> [B, Hq, D] (a view); other ranks pass through for the op to judge."""
    if q.dim() == 4:
        if q.shape[1] != 1:
            raise ValueError(f"{op}: a 4-D q must be [B, 1, Hq, D] (one query token per sequence), "
                             f"got shape {list(q.shape)}")
        return q.select(1, 0)
    return q


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)


def attn_decode(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_lens: torch.Tensor | None = None, *,
                mask: torch.Tensor | None = None, scale: float | None = None,
                kv_split_size: int = 0) -> torch.Tensor:
    """Decode attention over contiguous K/V: `torch.ops.astrai.attn_decode`.

    Parameters
    ----------
    q : Tensor
        `[B, Hq, D]` or `[B, 1, Hq, D]` bf16 CUDA, D in {64, 128, 256}.
    k, v : Tensor
        `[B, L, Hkv, D]` bf16, Hq a multiple of Hkv; q head h reads kv head `h // (Hq // Hkv)`.
    kv_lens : Tensor, optional
        `[B]` int32: keys used per sequence (the first `kv_lens[b]`; clamped to [0, L] on the device).
        None: all L.
    mask : Tensor, optional
        `[B, L]` bool, True = keep.
    scale : float, optional
        Softmax scale; default `1/sqrt(D)`.
    kv_split_size : int
        Keys per KV split; 0 picks it from the shapes and the SM count. A fixed value makes each
        sequence's result independent of the rest of the batch (batch invariance).

    Returns
    -------
    Tensor
        q's shape, bf16. A query with no key kept (length 0, everything masked) gets zeros.

    Example
    -------
    >>> q = torch.randn(4, 32, 128, device="cuda", dtype=torch.bfloat16)
    >>> k = torch.randn(4, 4096, 8, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    >>> out = attn_decode(q, k, v, torch.tensor([4096, 1, 70, 999], device="cuda", dtype=torch.int32))
    """
    load()
    q3 = _q3(q, OP_DECODE)
    out = torch.ops.astrai.attn_decode(q3, k, v, kv_lens, mask, _scale(q, scale), int(kv_split_size))
    return out.view(q.shape) if q.dim() == 4 else out


def attn_paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                      kv_lens: torch.Tensor, *, mask: torch.Tensor | None = None, scale: float | None = None,
                      kv_split_size: int = 0) -> torch.Tensor:
    """Decode attention over a paged KV cache: `torch.ops.astrai.attn_paged_decode`.

    Parameters
    ----------
    q : Tensor
        `[B, Hq, D]` or `[B, 1, Hq, D]` bf16 CUDA.
    k_cache, v_cache : Tensor
        `[num_pages, page_size, Hkv, D]` bf16, page_size a power of two in [1, 128].
    page_table : Tensor
        `[B, max_pages]` int32: key t of sequence b lives in page `page_table[b, t // page_size]`, slot
        `t % page_size`. A page id outside `[0, num_pages)` is never read: its keys are dropped.
    kv_lens : Tensor
        `[B]` int32 keys per sequence, clamped on the device to `[0, max_pages * page_size]`.
    mask : Tensor, optional
        `[B, M]` bool, True = keep; keys at positions >= M are dropped.
    scale, kv_split_size
        As in `attn_decode`.

    Example
    -------
    >>> out = attn_paged_decode(q, cache.k[layer], cache.v[layer], cache.page_table, cache.kv_lens)
    """
    load()
    q3 = _q3(q, OP_PAGED_DECODE)
    out = torch.ops.astrai.attn_paged_decode(q3, k_cache, v_cache, page_table, kv_lens, mask, _scale(q, scale),
                                             int(kv_split_size))
    return out.view(q.shape) if q.dim() == 4 else out


def paged_kv_append(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                    page_table: torch.Tensor, seq_ids: torch.Tensor, positions: torch.Tensor) -> None:
    """Write new tokens into a paged cache in one launch: `torch.ops.astrai.paged_kv_append`.

    Token n of `k_new`/`v_new` (`[N, Hkv, D]` bf16) goes to sequence `seq_ids[n]` (`[N]` int32, a row of
    `page_table`) at position `positions[n]` (`[N]` int32): page `page_table[seq, pos // page_size]`, slot
    `pos % page_size`. Tokens whose sequence, position or page id is out of range are not written. Two
    tokens aimed at one slot race (which one lands is undefined). Bitwise copies.

    Example
    -------
    >>> paged_kv_append(k_cache, v_cache, k_new, v_new, page_table, seq_ids, positions)
    """
    load()
    torch.ops.astrai.paged_kv_append(k_cache, v_cache, k_new, v_new, page_table, seq_ids, positions)


def smoke_test() -> None:
    """A tiny decode (contiguous and paged) and an append on the current CUDA device against float32 torch.

    `python -m astrai.extension verify` calls it.
    """
    load()
    if not torch.cuda.is_available():
        raise RuntimeError("attention smoke test: no CUDA device is visible")
    gen = torch.Generator().manual_seed(0)
    batch, heads_q, heads_kv, head_dim, length, page = 3, 8, 2, 128, 77, 16

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device="cuda", dtype=torch.bfloat16)

    q = rand(batch, heads_q, head_dim)
    k, v = rand(batch, length, heads_kv, head_dim), rand(batch, length, heads_kv, head_dim)
    lens = torch.tensor([length, 1, 40], dtype=torch.int32, device="cuda")
    out = attn_decode(q, k, v, lens)
    pages_per_seq = -(-length // page)
    page_table = torch.arange(batch * pages_per_seq, dtype=torch.int32, device="cuda").view(batch, pages_per_seq)
    k_cache = torch.zeros(batch * pages_per_seq, page, heads_kv, head_dim, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.zeros_like(k_cache)
    seq_ids = torch.arange(batch, dtype=torch.int32, device="cuda").repeat_interleave(length)
    positions = torch.arange(length, dtype=torch.int32, device="cuda").repeat(batch)
    paged_kv_append(k_cache, v_cache, k.flatten(0, 1), v.flatten(0, 1), page_table, seq_ids, positions)
    paged = attn_paged_decode(q, k_cache, v_cache, page_table, lens)
    group = heads_q // heads_kv
    for b in range(batch):
        n = int(lens[b])
        kb = k[b, :n].float().repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, n, D]
        vb = v[b, :n].float().repeat_interleave(group, dim=1).transpose(0, 1)
        p = torch.softmax((q[b].float().unsqueeze(1) @ kb.transpose(1, 2)) / math.sqrt(head_dim), dim=-1)
        want = (p @ vb).squeeze(1)
        for what, got in (("contiguous", out[b]), ("paged", paged[b])):
            err = (got.float() - want).abs().max().item()
            if not err <= 2e-2:
                raise RuntimeError(f"attention smoke test failed: {what} decode, sequence {b} (length {n}): "
                                   f"max |kernel - torch| = {err:.3g}")
