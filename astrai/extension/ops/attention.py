"""Stateless wrappers over the torch.ops.astrai attention kernels: run the kernel or raise, never fall back.

Ops (schemas in docs/contracts.md, "Attention ops"):

- `attn_decode`: one query token per sequence, q `[B, Hq, D]` (or `[B, 1, Hq, D]`), against contiguous K/V
  `[B, L, Hkv, D]` with optional per-sequence lengths `kv_lens` `[B]` int32 (a ragged batch);
- `attn_paged_decode`: the same against a paged cache `[num_pages, page_size, Hkv, D]` through a page table
  `[B, max_pages]` int32 and `kv_lens` `[B]` int32;
- `attn_prefill`: many query rows per sequence, q `[B, Lq, Hq, D]` against contiguous K/V `[B, L, Hkv, D]`
  (optional `kv_lens`), masks `[B, L]` or `[B, Lq, L]`, causal aligned to the end of each sequence;
- `attn_prefill_ragged`: packed variable-length sequences (as `flash_attn_varlen_func`): q `[Tq, Hq, D]`,
  K/V `[Tkv, Hkv, D]`, sequence b owning rows `qo_indptr[b]:qo_indptr[b+1]` and keys
  `kv_indptr[b]:kv_indptr[b+1]`;
- `attn_paged_prefill`: q dense `[B, Lq, Hq, D]` or packed `[Tq, Hq, D]` (with `qo_indptr`) against a paged
  cache;
- `paged_kv_append`: write N new K/V tokens (`[N, Hkv, D]`) into a paged cache at (`seq_ids[n]`,
  `positions[n]`), one launch.

bf16, head_dim 64/128/256, Hq a multiple of Hkv (GQA, MQA), softmax scale `1/sqrt(D)` unless given, fp32
online softmax. Decode splits the KV and merges by log-sum-exp; prefill tiles the query rows (no KV split).
These wrappers add only: loading the family on first use and registering the fake implementations, the 4-D
q view of decode, the default scale, and optional range checks of the values the device would clamp or drop
(one host sync each; skipped under CUDA-graph capture and torch.compile): the indptr arrays of packed
sequences (`check_indptr`, on by default) and the page ids and lengths of the paged calls (`check_pages`,
off by default: decode is latency-bound). Everything else is checked by the op,
which raises `RuntimeError` naming the op and the argument. Code that wants "the best available
implementation" calls `astrai.extension.attention` instead.

Example::

    from astrai.extension.ops import attention as ops
    out = ops.attn_decode(q, k, v, kv_lens)                        # q [B, 32, 128], k/v [B, L, 8, 128]
    out = ops.attn_paged_decode(q, k_cache, v_cache, page_table, kv_lens)
    out = ops.attn_prefill(q, k, v, is_causal=True)                # q [B, Lq, 32, 128]
    out = ops.attn_prefill_ragged(q, k, v, cu_seqlens, cu_seqlens, is_causal=True)  # q/k/v [T, H, 128]
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
OP_PREFILL = "astrai.attn_prefill"
OP_PREFILL_RAGGED = "astrai.attn_prefill_ragged"
OP_PAGED_PREFILL = "astrai.attn_paged_prefill"
MAX_PAGE_SIZE = 128

_loaded = False
_has_prefill = False


def _fake_decode(q, k, v, kv_lens, mask, scale, kv_split_size):
    return q.new_empty(q.shape)  # [B, Hq, D] contiguous bf16


def _fake_paged_decode(q, k_cache, v_cache, page_table, kv_lens, mask, scale, kv_split_size):
    return q.new_empty(q.shape)


def _fake_append(k_cache, v_cache, k_new, v_new, page_table, seq_ids, positions):
    return None


def _fake_prefill(q, k, v, kv_lens, mask, is_causal, scale):
    return q.new_empty(q.shape)  # [B, Lq, Hq, D] contiguous bf16


def _fake_prefill_ragged(q, k, v, qo_indptr, kv_indptr, mask, is_causal, scale):
    return q.new_empty(q.shape)  # [Tq, Hq, D]


def _fake_paged_prefill(q, k_cache, v_cache, qo_indptr, page_table, kv_lens, mask, is_causal, scale):
    return q.new_empty(q.shape)  # like q: [Tq, Hq, D] or [B, Lq, Hq, D]


_FAKES = {"astrai::attn_decode": _fake_decode,
          "astrai::attn_paged_decode": _fake_paged_decode,
          "astrai::paged_kv_append": _fake_append}
_PREFILL_FAKES = {"astrai::attn_prefill": _fake_prefill,
                  "astrai::attn_prefill_ragged": _fake_prefill_ragged,
                  "astrai::attn_paged_prefill": _fake_paged_prefill}


@torch.compiler.assume_constant_result
def load() -> bool:
    """Load the attention family and register its fake implementations; idempotent.

    Raises
    ------
    loader.FamilyUnavailableError
        No image serves the attention family here; the message says why and how to find out more.
    """
    global _loaded, _has_prefill
    if not _loaded:
        loader.load_family(FAMILY, op=OP_DECODE)
        register_fakes(_FAKES)
        # An image built before the prefill kernels registers only the decode ops: load it all the same.
        _has_prefill = hasattr(torch.ops.astrai, "attn_prefill")
        if _has_prefill:
            register_fakes(_PREFILL_FAKES)
        _loaded = True
    return True


def has_prefill() -> bool:
    """True when the loaded image registers the prefill ops (loads the family; False when it is unavailable)."""
    try:
        load()
    except loader.FamilyUnavailableError:
        return False
    return _has_prefill


def _load_prefill(op: str) -> None:
    load()
    if not _has_prefill:
        raise RuntimeError(f"{op}: the attention library of this image predates the prefill ops; rebuild or "
                           f"reinstall astrai-kernels (python -m astrai.extension info shows the image in use)")


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def check_indptr_range(op: str, indptrs: list[tuple[str, torch.Tensor, int, str]]) -> None:
    """Raise ValueError unless each indptr starts at >= 0, never decreases and ends at most at its total; one
    host sync for all of them.

    `indptrs`: (name, int32 [B + 1] tensor, total rows, where the total comes from). Skipped (returns at once)
    for meta tensors, tensors the op itself rejects (dtype, rank), `torch.compile` tracing and CUDA-graph
    capture, where a host sync is impossible; the device then clamps each sequence's range into [0, total]
    and a sequence whose end precedes its start is empty.
    """
    usable = [(n, t, total, src) for n, t, total, src in indptrs
              if t.dim() == 1 and t.numel() > 0 and t.dtype == torch.int32 and not t.is_meta]
    if not usable or torch.compiler.is_compiling() or any(_capturing(t) for _, t, _, _ in usable):
        return
    values = torch.cat([t.to(usable[0][1].device) for _, t, _, _ in usable]).tolist()  # the one sync
    start = 0
    for name, t, total, src in usable:
        row = values[start:start + t.numel()]
        start += t.numel()
        bad = next((i for i in range(1, len(row)) if row[i] < row[i - 1]), None)
        if row[0] < 0 or bad is not None or row[-1] > total:
            where = (f"{name}[0] = {row[0]} < 0" if row[0] < 0 else
                     f"{name}[{bad}] = {row[bad]} < {name}[{bad - 1}] = {row[bad - 1]}" if bad is not None else
                     f"{name}[-1] = {row[-1]} > {src} = {total}")
            raise ValueError(f"{op}: {name} must start at >= 0, never decrease and end at most at {src} = {total}; "
                             f"got {where}. Pass check_indptr=False to skip this check (one host sync); the "
                             f"device then clamps every range into [0, {total}]")


def _first_true(flags: torch.Tensor) -> torch.Tensor:
    """Index of the first True of a 1-D bool tensor, or its length when there is none (a 0-d device tensor)."""
    return torch.cat([flags, flags.new_ones(1)]).to(torch.int32).argmax()


def _skip_page_check(tensors: list[torch.Tensor], ranks: list[int], page_size: int) -> bool:
    """True where `check_page_range` / `check_append_range` leave the call to the op: a tensor the op rejects
    (dtype, rank, devices), a meta tensor, torch.compile tracing, CUDA-graph capture (no host sync possible)."""
    if page_size < 1 or any(t.dim() != r or t.dtype != torch.int32 or t.is_meta for t, r in zip(tensors, ranks)):
        return True
    if any(t.device != tensors[0].device for t in tensors):
        return True
    return torch.compiler.is_compiling() or _capturing(tensors[0])


def check_page_range(op: str, page_table: torch.Tensor, kv_lens: torch.Tensor, num_pages: int,
                     page_size: int) -> None:
    """Raise ValueError unless every length is in `[0, max_pages * page_size]` and every page id the call reads
    is in `[0, num_pages)`; one host sync.

    Sequence b reads the first `ceil(kv_lens[b] / page_size)` entries of `page_table[b]` (`[B, max_pages]`
    int32; `kv_lens` `[B]` int32). Skipped (returns at once) as `check_indptr_range` is: for meta tensors,
    tensors the op itself rejects (dtype, rank, B, devices), `torch.compile` tracing and CUDA-graph capture;
    the device then clamps the lengths into that range and drops the keys of a page id out of range.
    """
    if _skip_page_check([page_table, kv_lens], [2, 1], page_size) or kv_lens.shape[0] != page_table.shape[0]:
        return
    batch, max_pages = page_table.shape
    if batch == 0:
        return
    capacity = max_pages * page_size
    lens = kv_lens.long()
    bad_len = (lens < 0) | (lens > capacity)                                                        # [B]
    reads = (lens.clamp(0, capacity) + page_size - 1) // page_size                                  # [B]
    read = torch.arange(max_pages, device=lens.device)[None, :] < reads[:, None]                    # [B, max_pages]
    ids = page_table.long()
    bad_page = (read & ((ids < 0) | (ids >= num_pages))).flatten()                                  # [B * max_pages]
    first_len, first_page = torch.stack([_first_true(bad_len), _first_true(bad_page)]).tolist()  # the one sync
    if first_len < batch:
        raise ValueError(f"{op}: kv_lens[{first_len}] = {int(kv_lens[first_len])} is outside [0, max_pages * "
                         f"page_size] = [0, {capacity}] (page_table [{batch}, {max_pages}], page_size {page_size}); "
                         f"unchecked (check_pages=False), the device clamps it into that range")
    if first_page < bad_page.numel():
        b, j = divmod(first_page, max_pages)
        raise ValueError(f"{op}: page_table[{b}, {j}] = {int(page_table[b, j])} is outside [0, num_pages) = "
                         f"[0, {num_pages}) (k_cache.size(0)); sequence {b} reads the first {int(reads[b])} entries "
                         f"of its row (kv_lens[{b}] = {int(kv_lens[b])}, page_size {page_size}); unchecked "
                         f"(check_pages=False), the device drops that page's keys")


def check_append_range(op: str, page_table: torch.Tensor, seq_ids: torch.Tensor, positions: torch.Tensor,
                       num_pages: int, page_size: int) -> None:
    """Raise ValueError unless every token of a `paged_kv_append` lands in the cache: `seq_ids[n]` a row of
    `page_table`, `positions[n]` in `[0, max_pages * page_size)` and the page id there in `[0, num_pages)`;
    one host sync.

    `page_table` `[rows, max_pages]` int32, `seq_ids` and `positions` `[N]` int32. Skipped as
    `check_page_range` is; the device then skips every such token.
    """
    if (_skip_page_check([page_table, seq_ids, positions], [2, 1, 1], page_size)
            or seq_ids.shape != positions.shape or seq_ids.numel() == 0):
        return
    rows, max_pages = page_table.shape
    capacity = max_pages * page_size
    seq, pos = seq_ids.long(), positions.long()
    bad_seq = (seq < 0) | (seq >= rows)                                                             # [N]
    bad_pos = (pos < 0) | (pos >= capacity)                                                         # [N]
    if rows and max_pages:
        ids = page_table.long()[seq.clamp(0, rows - 1), (pos // page_size).clamp(0, max_pages - 1)]  # [N]
        bad_page = ~bad_seq & ~bad_pos & ((ids < 0) | (ids >= num_pages))
    else:
        bad_page = torch.zeros_like(bad_seq)  # every token already fails on its sequence or its position
    firsts = torch.stack([_first_true(bad_seq), _first_true(bad_pos), _first_true(bad_page)]).tolist()  # the sync
    n_tokens = seq.numel()
    unchecked = "unchecked (check_pages=False), the device skips that token"
    if firsts[0] < n_tokens:
        n = firsts[0]
        raise ValueError(f"{op}: seq_ids[{n}] = {int(seq_ids[n])} is outside [0, page_table.size(0)) = [0, {rows}); "
                         f"{unchecked}")
    if firsts[1] < n_tokens:
        n = firsts[1]
        raise ValueError(f"{op}: positions[{n}] = {int(positions[n])} is outside [0, max_pages * page_size) = "
                         f"[0, {capacity}) (page_table [{rows}, {max_pages}], page_size {page_size}); {unchecked}")
    if firsts[2] < n_tokens:
        n = firsts[2]
        s_n, p_n = int(seq_ids[n]), int(positions[n])
        raise ValueError(f"{op}: token {n} (seq_ids[{n}] = {s_n}, positions[{n}] = {p_n}) lands in page_table"
                         f"[{s_n}, {p_n // page_size}] = {int(page_table[s_n, p_n // page_size])}, outside "
                         f"[0, num_pages) = [0, {num_pages}) (k_cache.size(0)); {unchecked}")


def _pages(k_cache: torch.Tensor) -> tuple[int, int]:
    """(num_pages, page_size) of a `[num_pages, page_size, Hkv, D]` cache; page_size 0 (no check) for another rank,
    which the op rejects."""
    return (k_cache.shape[0], k_cache.shape[1]) if k_cache.dim() == 4 else (0, 0)


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
        At most this many keys per KV split, after rounding it up to a multiple of 64 (S, the kernels' key
        step): max_kv_len (L here, `max_pages * page_size` paged) is spread over `ceil(max_kv_len / S)` splits
        (at most 1024) of one length rounded up to a multiple of 64, so a split may be shorter than S (L = 1000
        with 640: two splits of 512 keys). 0 picks the count from the shapes and the SM count. A fixed value
        makes each sequence's result independent of the rest of the batch at one max_kv_len (batch
        invariance). No Python call reports the plan; a launch that fails names it (`splits=<count>x<keys>`).

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
                      kv_split_size: int = 0, check_pages: bool = False) -> torch.Tensor:
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
    check_pages : bool
        Check before launch that every `kv_lens[b]` is in `[0, max_pages * page_size]` and every page id the
        call reads (the first `ceil(kv_lens[b] / page_size)` of row b) is in `[0, num_pages)`; ValueError
        naming the first bad entry (`check_page_range`). One host sync, hence off by default; skipped under
        CUDA-graph capture and torch.compile, as `check_indptr` is.

    Example
    -------
    >>> out = attn_paged_decode(q, cache.k[layer], cache.v[layer], cache.page_table, cache.kv_lens)
    """
    load()
    if check_pages:
        check_page_range(OP_PAGED_DECODE, page_table, kv_lens, *_pages(k_cache))
    q3 = _q3(q, OP_PAGED_DECODE)
    out = torch.ops.astrai.attn_paged_decode(q3, k_cache, v_cache, page_table, kv_lens, mask, _scale(q, scale),
                                             int(kv_split_size))
    return out.view(q.shape) if q.dim() == 4 else out


def attn_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_lens: torch.Tensor | None = None, *,
                 mask: torch.Tensor | None = None, is_causal: bool = False,
                 scale: float | None = None) -> torch.Tensor:
    """Prefill attention over contiguous K/V: `torch.ops.astrai.attn_prefill`.

    Parameters
    ----------
    q : Tensor
        `[B, Lq, Hq, D]` bf16 CUDA, D in {64, 128, 256}.
    k, v : Tensor
        `[B, L, Hkv, D]` bf16, Hq a multiple of Hkv; q head h reads kv head `h // (Hq // Hkv)`.
    kv_lens : Tensor, optional
        `[B]` int32: keys used per sequence (clamped to [0, L] on the device). None: all L.
    mask : Tensor, optional
        bool, True = keep: `[B, L]` (every row) or `[B, Lq, L]`.
    is_causal : bool
        Row i of a sequence with n keys sees keys `j <= n - Lq + i` (aligned to the end: prior context counts).
    scale : float, optional
        Softmax scale; default `1/sqrt(D)`.

    Returns
    -------
    Tensor
        `[B, Lq, Hq, D]` bf16, contiguous. A row that keeps no key gets zeros.

    Example
    -------
    >>> q = torch.randn(2, 1000, 32, 128, device="cuda", dtype=torch.bfloat16)
    >>> k = torch.randn(2, 1500, 8, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    >>> out = attn_prefill(q, k, v, is_causal=True)       # rows see 500 keys of prior context, then their own
    """
    _load_prefill(OP_PREFILL)
    return torch.ops.astrai.attn_prefill(q, k, v, kv_lens, mask, bool(is_causal), _scale(q, scale))


def attn_prefill_ragged(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, qo_indptr: torch.Tensor,
                        kv_indptr: torch.Tensor, *, mask: torch.Tensor | None = None, is_causal: bool = False,
                        scale: float | None = None, check_indptr: bool = True) -> torch.Tensor:
    """Prefill attention over packed variable-length sequences: `torch.ops.astrai.attn_prefill_ragged`.

    Parameters
    ----------
    q : Tensor
        `[Tq, Hq, D]` bf16 CUDA: the rows of every sequence, packed.
    k, v : Tensor
        `[Tkv, Hkv, D]` bf16: the keys of every sequence, packed.
    qo_indptr, kv_indptr : Tensor
        `[B + 1]` int32 (cumulative lengths, like flash-attn's `cu_seqlens`): sequence b owns rows
        `qo_indptr[b]:qo_indptr[b + 1]` of q and of the output, and keys `kv_indptr[b]:kv_indptr[b + 1]`.
    mask : Tensor, optional
        bool, True = keep, indexed by the row and key *within* the sequence: `[B, M]` or `[B, max_q, M]`;
        keys at or past M and rows at or past max_q keep nothing.
    is_causal : bool
        Row i of a sequence with m rows and n keys sees keys `j <= n - m + i`.
    scale : float, optional
        Softmax scale; default `1/sqrt(D)`.
    check_indptr : bool
        Check that each indptr starts at >= 0, never decreases and ends within q (k) before launch (one host
        sync; skipped under CUDA-graph capture and torch.compile). Unchecked, the device clamps the ranges.

    Returns
    -------
    Tensor
        `[Tq, Hq, D]` bf16, contiguous. Rows outside `[qo_indptr[0], qo_indptr[B])` are not written.

    Example
    -------
    >>> cu = torch.tensor([0, 70, 80, 210], device="cuda", dtype=torch.int32)
    >>> q = torch.randn(210, 32, 128, device="cuda", dtype=torch.bfloat16)
    >>> k = torch.randn(210, 8, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    >>> out = attn_prefill_ragged(q, k, v, cu, cu, is_causal=True)
    """
    _load_prefill(OP_PREFILL_RAGGED)
    if check_indptr:
        check_indptr_range(OP_PREFILL_RAGGED, [("qo_indptr", qo_indptr, q.shape[0], "q.size(0)"),
                                               ("kv_indptr", kv_indptr, k.shape[0], "k.size(0)")])
    return torch.ops.astrai.attn_prefill_ragged(q, k, v, qo_indptr, kv_indptr, mask, bool(is_causal),
                                                _scale(q, scale))


def attn_paged_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, page_table: torch.Tensor,
                       kv_lens: torch.Tensor, *, qo_indptr: torch.Tensor | None = None,
                       mask: torch.Tensor | None = None, is_causal: bool = False, scale: float | None = None,
                       check_indptr: bool = True, check_pages: bool = False) -> torch.Tensor:
    """Prefill attention over a paged KV cache: `torch.ops.astrai.attn_paged_prefill`.

    Parameters
    ----------
    q : Tensor
        Dense `[B, Lq, Hq, D]` bf16 CUDA, or packed `[Tq, Hq, D]` with `qo_indptr`.
    k_cache, v_cache : Tensor
        `[num_pages, page_size, Hkv, D]` bf16, page_size a power of two in [1, 128].
    page_table : Tensor
        `[B, max_pages]` int32: key t of sequence b lives in page `page_table[b, t // page_size]`, slot
        `t % page_size`. A page id outside `[0, num_pages)` is never read: its keys are dropped.
    kv_lens : Tensor
        `[B]` int32 keys per sequence (the new rows' keys included), clamped on the device to
        `[0, max_pages * page_size]`.
    qo_indptr : Tensor, optional
        `[B + 1]` int32: sequence b owns rows `qo_indptr[b]:qo_indptr[b + 1]` of a packed q. None: q is dense.
    mask : Tensor, optional
        bool, True = keep, by row and key within the sequence: `[B, M]` or `[B, Lq (max_q), M]`; keys at or
        past M are dropped.
    is_causal : bool
        Row i of a sequence with m rows and n keys sees keys `j <= n - m + i` (the rows are the last m keys).
    scale, check_indptr
        As in `attn_prefill_ragged`.
    check_pages : bool
        As in `attn_paged_decode` (off by default; one more host sync).

    Returns
    -------
    Tensor
        q's shape, bf16, contiguous.

    Example
    -------
    >>> out = attn_paged_prefill(q, cache.k[layer], cache.v[layer], cache.page_table[:B], cache.kv_lens[:B],
    ...                          is_causal=True)
    """
    _load_prefill(OP_PAGED_PREFILL)
    if qo_indptr is not None and check_indptr:
        check_indptr_range(OP_PAGED_PREFILL, [("qo_indptr", qo_indptr, q.shape[0], "q.size(0)")])
    if check_pages:
        check_page_range(OP_PAGED_PREFILL, page_table, kv_lens, *_pages(k_cache))
    return torch.ops.astrai.attn_paged_prefill(q, k_cache, v_cache, qo_indptr, page_table, kv_lens, mask,
                                               bool(is_causal), _scale(q, scale))


def paged_kv_append(k_cache: torch.Tensor, v_cache: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor,
                    page_table: torch.Tensor, seq_ids: torch.Tensor, positions: torch.Tensor, *,
                    check_pages: bool = False) -> None:
    """Write new tokens into a paged cache in one launch: `torch.ops.astrai.paged_kv_append`.

    Token n of `k_new`/`v_new` (`[N, Hkv, D]` bf16) goes to sequence `seq_ids[n]` (`[N]` int32, a row of
    `page_table`) at position `positions[n]` (`[N]` int32): page `page_table[seq, pos // page_size]`, slot
    `pos % page_size`. Tokens whose sequence, position or page id is out of range are not written. Two
    tokens aimed at one slot race (which one lands is undefined). Bitwise copies.

    `check_pages=True` checks before launch that every token lands (`check_append_range`: ValueError naming
    the first token whose sequence, position or page id is out of range); one host sync, off by default,
    skipped under CUDA-graph capture and torch.compile.

    Example
    -------
    >>> paged_kv_append(k_cache, v_cache, k_new, v_new, page_table, seq_ids, positions)
    """
    load()
    if check_pages:
        check_append_range(OP_APPEND, page_table, seq_ids, positions, *_pages(k_cache))
    torch.ops.astrai.paged_kv_append(k_cache, v_cache, k_new, v_new, page_table, seq_ids, positions)


def smoke_test() -> None:
    """A tiny decode (contiguous and paged), an append and, where the image has it, a causal prefill (contiguous
    and paged) on the current CUDA device against float32 torch.

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
    if not _has_prefill:
        return
    rows = 5
    q_rows = rand(batch, rows, heads_q, head_dim)
    pre = attn_prefill(q_rows, k, v, lens, is_causal=True)
    pre_paged = attn_paged_prefill(q_rows, k_cache, v_cache, page_table, lens, is_causal=True)
    for b in range(batch):
        n = int(lens[b])
        kb = k[b, :n].float().repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, n, D]
        vb = v[b, :n].float().repeat_interleave(group, dim=1).transpose(0, 1)
        scores = (q_rows[b].float().transpose(0, 1) @ kb.transpose(1, 2)) / math.sqrt(head_dim)  # [Hq, rows, n]
        row_pos = n - rows + torch.arange(rows, device="cuda")
        keep = torch.arange(n, device="cuda")[None, :] <= row_pos[:, None]                        # [rows, n]
        p = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
        want = (p @ vb).transpose(0, 1)                                                           # [rows, Hq, D]
        for what, got in (("contiguous", pre[b]), ("paged", pre_paged[b])):
            err = (got.float() - want).abs().max().item()
            if not err <= 2e-2:
                raise RuntimeError(f"attention smoke test failed: {what} causal prefill, sequence {b} (length {n}): "
                                   f"max |kernel - torch| = {err:.3g}")
