"""The paged KV cache: page pool, page table and lengths for many layers, with a host-side page allocator.

`PagedKVCache` (public as `astrai.extension.PagedKVCache`) owns the storage; `attention(q, kv_cache=cache,
layer_id=i)` (astrai.extension.backend.attention) reads it. `append_reference` and `gather_paged` are the torch
forms of the append and of a paged read, with the kernels' rules for ids out of range.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from astrai.extension import _fallbacks, loader
from astrai.extension.ops import attention as ops
from astrai.extension.ops import attention_plan


class PagedKVCache:
    """Paged K/V storage for `num_layers` layers and up to `max_batch_size` sequences.

    Storage: `k`, `v` `[num_layers, num_pages, page_size, Hkv, D]`; `layer(i)` gives the per-layer views
    `[num_pages, page_size, Hkv, D]`. `page_table` `[max_batch_size, max_pages_per_seq]` int32 (unused
    entries -1) and `kv_lens` `[max_batch_size]` int32 live on the cache's device; a host mirror of the
    lengths assigns pages without a device sync.

    A step: `extend(n)` reserves room for n new tokens per sequence (pages, page table, lengths, the append
    positions); then, per layer, `append(layer_id, k_new, v_new)` writes them (one kernel launch on CUDA
    bf16, a bitwise-equal torch scatter elsewhere) and `attention(q, kv_cache=cache, layer_id=i)` reads
    them. `append` and attention are CUDA-graph capturable; `extend` is host bookkeeping.

    `extend` only writes page ids and lengths in range. For a page table or lengths written by hand,
    `check_pages=True` checks them before every `append` and every `attention` over the cache (the ops'
    `check_page_range` / `check_append_range`: ValueError naming the first bad entry; one host sync each,
    skipped under CUDA-graph capture and torch.compile); unchecked, the kernels drop what is out of range.

    Example
    -------
    >>> cache = PagedKVCache(32, 8, 128, num_pages=4096, page_size=16, max_batch_size=8, device="cuda")
    >>> cache.reset(batch_size=2)
    >>> cache.extend([70, 10])                       # prefill: 80 tokens, ragged
    >>> cache.append(0, k_prompt, v_prompt)          # k_prompt [80, 8, 128]
    >>> cache.extend(1)                              # a decode step: one token per sequence
    >>> cache.append(0, k_tok, v_tok)                # k_tok [2, 1, 8, 128] or [2, 8, 128]
    >>> out = attention(q, kv_cache=cache, layer_id=0, fwd="decode")
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, *, num_pages: int, page_size: int = 16,
                 max_batch_size: int, max_pages_per_seq: int | None = None, dtype: torch.dtype = torch.bfloat16,
                 device: torch.device | str | None = None, check_pages: bool = False):
        if page_size < 1 or page_size > ops.MAX_PAGE_SIZE or page_size & (page_size - 1):
            raise ValueError(f"PagedKVCache: page_size must be a power of two in [1, {ops.MAX_PAGE_SIZE}], "
                             f"got {page_size}")
        for name, value in (("num_layers", num_layers), ("num_kv_heads", num_kv_heads), ("head_dim", head_dim),
                            ("num_pages", num_pages), ("max_batch_size", max_batch_size)):
            if value < 1:
                raise ValueError(f"PagedKVCache: {name} must be >= 1, got {value}")
        self.num_layers, self.num_kv_heads, self.head_dim = num_layers, num_kv_heads, head_dim
        self.num_pages, self.page_size, self.max_batch_size = num_pages, page_size, max_batch_size
        self.max_pages_per_seq = max_pages_per_seq or num_pages
        shape = (num_layers, num_pages, page_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.page_table = torch.full((max_batch_size, self.max_pages_per_seq), -1, dtype=torch.int32, device=device)
        self.kv_lens = torch.zeros(max_batch_size, dtype=torch.int32, device=device)
        self.device = self.k.device
        self.check_pages = bool(check_pages)
        self.reset(0)

    @property
    def capacity(self) -> int:
        """Keys one sequence can hold: max_pages_per_seq * page_size."""
        return self.max_pages_per_seq * self.page_size

    def layer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) views of one layer: `[num_pages, page_size, Hkv, D]`."""
        if not 0 <= layer_id < self.num_layers:
            raise ValueError(f"PagedKVCache: layer_id must be in [0, {self.num_layers}), got {layer_id}")
        return self.k[layer_id], self.v[layer_id]

    def reset(self, batch_size: int) -> None:
        """Forget every sequence and free every page; the next `batch_size` sequences start empty."""
        if not 0 <= batch_size <= self.max_batch_size:
            raise ValueError(f"PagedKVCache: batch_size must be in [0, {self.max_batch_size}], got {batch_size}")
        self.batch_size = batch_size
        self._free = list(range(self.num_pages - 1, -1, -1))  # pop() hands out page 0 first
        self._pages: list[list[int]] = [[] for _ in range(self.max_batch_size)]
        self._lens = [0] * self.max_batch_size
        self.page_table.fill_(-1)
        self.kv_lens.zero_()
        self._seq_ids = self._positions = None
        self._pending = 0

    def lengths(self) -> list[int]:
        """Host copy of the active sequences' lengths (no device sync)."""
        return self._lens[:self.batch_size]

    def extend(self, num_new: int | Sequence[int]) -> None:
        """Reserve room for `num_new` more tokens per active sequence (an int for all, or one per sequence):
        assign pages, update page_table and kv_lens, and set the positions the next `append`s write."""
        counts = [int(num_new)] * self.batch_size if isinstance(num_new, int) else [int(n) for n in num_new]
        if len(counts) != self.batch_size or any(n < 0 for n in counts):
            raise ValueError(f"PagedKVCache.extend: need {self.batch_size} non-negative counts, got {counts}")
        new_lens = [old + n for old, n in zip(self._lens, counts)]
        if any(n > self.capacity for n in new_lens):
            raise ValueError(f"PagedKVCache.extend: a sequence would hold {max(new_lens)} tokens, more than "
                             f"max_pages_per_seq * page_size = {self.capacity}")
        need = sum(-(-n // self.page_size) - len(self._pages[b]) for b, n in enumerate(new_lens))
        if need > len(self._free):
            raise RuntimeError(f"PagedKVCache.extend: out of pages ({need} needed, {len(self._free)} free)")
        rows = []
        for b, n in enumerate(new_lens):
            while len(self._pages[b]) * self.page_size < n:
                self._pages[b].append(self._free.pop())
            rows.append(self._pages[b] + [-1] * (self.max_pages_per_seq - len(self._pages[b])))
        if rows:
            self.page_table[:self.batch_size].copy_(torch.tensor(rows, dtype=torch.int32))
            self.kv_lens[:self.batch_size].copy_(torch.tensor(new_lens, dtype=torch.int32))
        seq_ids = [b for b, n in enumerate(counts) for _ in range(n)]
        positions = [old + i for old, n in zip(self._lens, counts) for i in range(n)]
        self._seq_ids = torch.tensor(seq_ids, dtype=torch.int32).to(self.device)
        self._positions = torch.tensor(positions, dtype=torch.int32).to(self.device)
        self._counts = counts
        self._pending = len(seq_ids)
        self._lens[:self.batch_size] = new_lens

    def append(self, layer_id: int, k_new: torch.Tensor, v_new: torch.Tensor) -> None:
        """Write the tokens reserved by the last `extend` into layer `layer_id`, all sequences in one launch.

        `k_new`, `v_new`: `[N, Hkv, D]` with N the tokens reserved (sequences in order, ragged), or
        `[B, T, Hkv, D]` when every sequence reserved T.
        """
        k_cache, v_cache = self.layer(layer_id)
        if self._seq_ids is None:
            raise RuntimeError("PagedKVCache.append: call extend(num_new) first")
        k_new, v_new = self._flat(k_new, "k_new"), self._flat(v_new, "v_new")
        page_table = self.page_table[:self.batch_size]
        if self.check_pages:
            ops.check_append_range("PagedKVCache.append", page_table, self._seq_ids, self._positions,
                                   self.num_pages, self.page_size)
        reason = self._append_blocker(k_new, v_new)
        if reason is None:
            ops.paged_kv_append(k_cache, v_cache, k_new.contiguous(), v_new.contiguous(), page_table,
                                self._seq_ids, self._positions)
            return
        _fallbacks.record("PagedKVCache.append", reason, "torch", on_gpu=self.k.is_cuda)
        append_reference(k_cache, v_cache, k_new, v_new, page_table, self._seq_ids, self._positions)

    def _append_blocker(self, k_new: torch.Tensor, v_new: torch.Tensor) -> str | None:
        """Why the append kernel cannot write these tokens (None: it can)."""
        if not self.k.is_cuda:
            return f"the cache is on {self.device}, not a CUDA device"
        if not loader.family_available(ops.FAMILY):
            return "no image serves the attention family here (python -m astrai.extension info says why)"
        # The library's own rules (what paged_kv_append refuses), asked for k_new and v_new.
        return (attention_plan.append_reason(k_new.dtype, self.k.dtype, self.head_dim, self.page_size)
                or attention_plan.append_reason(v_new.dtype, self.k.dtype, self.head_dim, self.page_size))

    def _flat(self, t: torch.Tensor, name: str) -> torch.Tensor:
        if t.dim() == 4:
            if len(set(self._counts)) > 1 or t.shape[0] != self.batch_size or t.shape[1] != self._counts[0]:
                raise ValueError(f"PagedKVCache.append: {name} [B, T, Hkv, D] needs every sequence to have "
                                 f"reserved T tokens; reserved {self._counts}, got shape {list(t.shape)}")
            t = t.flatten(0, 1)
        want = (self._pending, self.num_kv_heads, self.head_dim)
        if tuple(t.shape) != want:
            raise ValueError(f"PagedKVCache.append: {name} must be {list(want)} (the tokens reserved by extend), "
                             f"got {list(t.shape)}")
        return t

    def check_read(self, op: str) -> None:
        """With `check_pages`, raise ValueError unless the active sequences' lengths and the page ids they read
        are in range (`ops.attention.check_page_range`; one host sync). `attention` calls it."""
        if self.check_pages:
            ops.check_page_range(op, self.page_table[:self.batch_size], self.kv_lens[:self.batch_size],
                                 self.num_pages, self.page_size)

    def gather(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Contiguous copies of one layer's active sequences: k, v `[B, capacity, Hkv, D]` and the valid
        keys `[B, capacity]` bool (position < kv_len and a page id in range). No host sync."""
        k_cache, v_cache = self.layer(layer_id)
        return gather_paged(k_cache, v_cache, self.page_table[:self.batch_size], self.kv_lens[:self.batch_size])


def append_reference(k_cache, v_cache, k_new, v_new, page_table, seq_ids, positions) -> None:
    """The paged_kv_append contract in torch: the same drops for out-of-range ids, bitwise the same writes."""
    num_pages, page_size = k_cache.shape[:2]
    seq, pos = seq_ids.long(), positions.long()
    ok = (seq >= 0) & (seq < page_table.shape[0]) & (pos >= 0) & (pos < page_table.shape[1] * page_size)
    page = page_table[seq.clamp(0, page_table.shape[0] - 1), (pos // page_size).clamp(0, page_table.shape[1] - 1)]
    page = page.long()
    ok &= (page >= 0) & (page < num_pages)
    flat = (page * page_size + pos % page_size)[ok]
    k_cache.view(-1, *k_cache.shape[2:])[flat] = k_new[ok].to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[flat] = v_new[ok].to(v_cache.dtype)


def gather_paged(k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor, kv_lens: torch.Tensor):
    """k, v `[B, max_pages * page_size, Hkv, D]` gathered through the page table, and valid `[B, same]`."""
    num_pages, page_size = k_cache.shape[:2]
    batch, max_pages = page_table.shape
    t = torch.arange(max_pages * page_size, device=page_table.device)
    page = page_table.long()[:, t // page_size]                      # [B, Lmax]
    valid = (t[None, :] < kv_lens.long()[:, None]) & (page >= 0) & (page < num_pages)
    flat = page.clamp(0, num_pages - 1) * page_size + t % page_size  # [B, Lmax]
    k = k_cache.reshape(-1, *k_cache.shape[2:])[flat]
    v = v_cache.reshape(-1, *v_cache.shape[2:])[flat]
    return k, v, valid
