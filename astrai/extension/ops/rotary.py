"""Stateless wrappers over the torch.ops.astrai rotary-embedding kernels: run the kernel or raise, never fall back.

The three ops (schemas in docs/contracts.md) take q `[T, H, D]` bf16 and float32 cos/sin, either per token
`[T, D/2]` or a cache `[max_pos, D/2]` indexed by `positions` `[T]`. These wrappers add, and only add:

- loading the family on first use (`loader.load_family("rotary")`, which raises with a diagnosis when no
  image serves it) and registering the fake (meta) implementations that `torch.compile` and
  `torch.library.opcheck` need;
- 4-D inputs: `[B, S, H, D]` is flattened to `[B*S, H, D]` (likewise cos/sin `[B, S, D/2]` and positions
  `[B, S]`). Out-of-place ops use a view when the B and S axes merge (`stride(0) == S * stride(1)`) and a
  copy otherwise; the in-place op needs the view and raises `ValueError` when it does not exist;
- the positions range check: one host sync before launch (`ValueError` naming the op, `positions`, the bad
  value and the range). It is skipped under CUDA-graph capture, under `torch.compile` tracing, and with
  `check_positions=False`; the kernel then writes NaN in every output element of a token whose position
  lies outside `[0, max_pos)` and never reads outside the cache.

Everything else (device, dtype, rank, shapes, strides) is checked by the op itself, which raises
`RuntimeError` naming the op and the argument. Code that wants "the best available implementation" calls
`astrai.extension.apply_rotary_emb` instead.

Example::

    from astrai.extension.ops import rotary
    q_out, k_out = rotary.rotary_embedding_qk(q, k, cos, sin, positions)       # q: [T, 32, 128] bf16
    rotary.rotary_embedding_(q, k, cos, sin, positions, interleaved=True)     # in place
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from astrai.extension import loader
from astrai.extension.ops._fakes import load_family_once

FAMILY = "rotary"
# Op names as error messages spell them (the binding's spelling); the dispatcher's are "astrai::<name>".
OP = "astrai.rotary_embedding"
OP_QK = "astrai.rotary_embedding_qk"
OP_INPLACE = "astrai.rotary_embedding_"



def _fake_rotary_embedding(q, cos, sin, positions, interleaved):
    return q.new_empty(q.shape)  # [T, H, D] contiguous, q's dtype (bf16) and device


def _fake_rotary_embedding_qk(q, k, cos, sin, positions, interleaved):
    return q.new_empty(q.shape), k.new_empty(k.shape)


def _fake_rotary_embedding_(q, k, cos, sin, positions, interleaved):
    return None


_FAKES = {"astrai::rotary_embedding": _fake_rotary_embedding,
          "astrai::rotary_embedding_qk": _fake_rotary_embedding_qk,
          "astrai::rotary_embedding_": _fake_rotary_embedding_}


@torch.compiler.assume_constant_result  # traced code calls it at trace time, once, and keeps the result
def load() -> bool:
    """Load the family once, with its fakes; loader.FamilyUnavailableError (saying why) when no image serves it."""
    return load_family_once(FAMILY, OP, _FAKES)


def _tokens(t: torch.Tensor, op: str, name: str, *, inplace: bool) -> torch.Tensor:
    """[B, S, H, D] -> [B*S, H, D]; any other rank passes through for the op to judge."""
    if t.dim() != 4:
        return t
    batch, seq = t.shape[:2]
    if inplace and batch > 1 and seq > 1 and t.stride(0) != seq * t.stride(1):
        raise ValueError(
            f"{op}: {name} of shape {list(t.shape)} and strides {list(t.stride())} cannot be viewed as "
            f"[B*S, H, D] (needs stride(0) == S * stride(1)) and the in-place op cannot work on a copy; "
            f"pass {name} as [T, H, D] or with batch and sequence axes that merge")
    return t.flatten(0, 1)


def _freqs(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None):
    """Flatten per-token cos/sin [B, S, D/2] and positions [B, S] to match a flattened 4-D q."""
    if q.dim() == 4:
        if positions is None:
            cos = cos.flatten(0, 1) if cos.dim() == 3 else cos
            sin = sin.flatten(0, 1) if sin.dim() == 3 else sin
        elif positions.dim() == 2:
            positions = positions.reshape(-1)
    return cos, sin, positions


def _capturing(t: torch.Tensor) -> bool:
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def check_positions_range(op: str, positions: torch.Tensor, max_pos: int) -> None:
    """Raise ValueError if a position lies outside [0, max_pos); one host sync.

    Skipped (returns at once) for empty or non-integer positions (the op reports the dtype), meta tensors,
    `torch.compile` tracing and CUDA-graph capture, where a host sync is impossible.
    """
    if positions.numel() == 0 or positions.dtype not in (torch.int32, torch.int64) or positions.is_meta:
        return
    if torch.compiler.is_compiling() or _capturing(positions):
        return
    low, high = torch.stack(torch.aminmax(positions)).tolist()  # the one sync
    if low < 0 or high >= max_pos:
        bad = low if low < 0 else high
        raise ValueError(
            f"{op}: positions holds {bad}, outside the cos/sin cache rows [0, {max_pos}); pass "
            f"check_positions=False to skip this check (one host sync), and the kernel then writes NaN "
            f"for every token whose position is out of range")


def _check(op: str, cos: torch.Tensor, positions: torch.Tensor | None, check_positions: bool) -> None:
    if positions is not None and check_positions and cos.dim() == 2:
        check_positions_range(op, positions, cos.shape[0])


def rotary_embedding(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                     positions: torch.Tensor | None = None, *, interleaved: bool = False,
                     check_positions: bool = True) -> torch.Tensor:
    """Rotate q by (cos, sin) into a new tensor: `torch.ops.astrai.rotary_embedding`.

    Parameters
    ----------
    q : Tensor
        `[T, H, D]` or `[B, S, H, D]` bf16 CUDA, last-dim stride 1, other strides free; D even.
    cos, sin : Tensor
        float32, last-dim stride 1. Without `positions`: per token, `[T, D/2]` or `[B, S, D/2]`. With
        `positions`: a cache `[max_pos, D/2]`.
    positions : Tensor, optional
        int32 or int64 `[T]` or `[B, S]`: the cache row of each token.
    interleaved : bool
        False: NeoX pairs `(i, i + D/2)`; True: GPT-J pairs `(2i, 2i + 1)`.
    check_positions : bool
        Check `0 <= positions < max_pos` before launch (one host sync; skipped under CUDA-graph capture and
        torch.compile). Without the check, an out-of-range token gets NaN in every output element.

    Returns
    -------
    Tensor
        q's shape, contiguous, bf16: `y0 = x0*cos - x1*sin`, `y1 = x1*cos + x0*sin` per pair, computed
        in float32 and rounded once.

    Example
    -------
    >>> q = torch.randn(19, 32, 128, device="cuda", dtype=torch.bfloat16)
    >>> cos, sin = astrai.extension.rotary_cos_sin_cache(4096, 128, device="cuda")
    >>> out = rotary_embedding(q, cos, sin, torch.arange(19, device="cuda"))
    """
    load()
    q3 = _tokens(q, OP, "q", inplace=False)
    cos, sin, positions = _freqs(q, cos, sin, positions)
    _check(OP, cos, positions, check_positions)
    out = torch.ops.astrai.rotary_embedding(q3, cos, sin, positions, interleaved)
    return out.view(q.shape) if q.dim() == 4 else out  # the op's output is contiguous [B*S, H, D]


def rotary_embedding_qk(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                        positions: torch.Tensor | None = None, *, interleaved: bool = False,
                        check_positions: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q `[T, Hq, D]` and k `[T, Hk, D]` in one launch into new tensors:
    `torch.ops.astrai.rotary_embedding_qk`.

    Arguments as in `rotary_embedding`; q and k share T (or B and S), D, cos, sin and positions and may
    have different head counts (GQA). Returns `(q_out, k_out)`, contiguous bf16 of q's and k's shapes.

    Example
    -------
    >>> q_out, k_out = rotary_embedding_qk(q, k, cos, sin, positions)  # q [T, 32, 128], k [T, 8, 128]
    """
    load()
    q3 = _tokens(q, OP_QK, "q", inplace=False)
    k3 = _tokens(k, OP_QK, "k", inplace=False)
    cos, sin, positions = _freqs(q, cos, sin, positions)
    _check(OP_QK, cos, positions, check_positions)
    q_out, k_out = torch.ops.astrai.rotary_embedding_qk(q3, k3, cos, sin, positions, interleaved)
    if q.dim() == 4:
        return q_out.view(q.shape), k_out.view(k.shape)  # contiguous [B*S, H, D] each
    return q_out, k_out


def rotary_embedding_(q: torch.Tensor, k: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                      positions: torch.Tensor | None = None, *, interleaved: bool = False,
                      check_positions: bool = True) -> None:
    """Rotate q, and k when given, in place in one launch: `torch.ops.astrai.rotary_embedding_`.

    Arguments as in `rotary_embedding_qk`; k may be None. 4-D q and k must be viewable as `[B*S, H, D]`
    (ValueError otherwise): views into a fused qkv buffer `[B, S, Hq + 2*Hk, D]` are. Strides other than the
    last are free, so only q's and k's own elements are written.

    Example
    -------
    >>> qkv = torch.randn(T, 48, 128, device="cuda", dtype=torch.bfloat16)
    >>> rotary_embedding_(qkv[:, :32], qkv[:, 32:40], cos, sin, positions)  # v = qkv[:, 40:] untouched
    """
    load()
    q3 = _tokens(q, OP_INPLACE, "q", inplace=True)
    k3 = None if k is None else _tokens(k, OP_INPLACE, "k", inplace=True)
    cos, sin, positions = _freqs(q, cos, sin, positions)
    _check(OP_INPLACE, cos, positions, check_positions)
    torch.ops.astrai.rotary_embedding_(q3, k3, cos, sin, positions, interleaved)


class RotaryPlan(NamedTuple):
    """The explicit plan a rotary launch takes (csrc/kernels/rotary/rotary.h, rotary_plan)."""

    pairs: int    # rotation pairs a thread moves at a time: 8 or 4 (16-byte runs of q/k) or 1 (scalar)
    vec_cs: bool  # cos/sin in 16-byte runs
    block: tuple  # (threads across a head's chunks, across heads, tokens a block)
    blocks: int   # the grid; tokens past it loop


def probe(num_tokens: int, num_q_heads: int, head_dim: int, *, num_k_heads: int = 0, interleaved: bool = False,
          vec_x: bool = True, vec_cs: bool = True, device=None, sm_count: int | None = None,
          threads_per_sm: int | None = None) -> RotaryPlan:
    """The plan the rotary ops launch for a call of these sizes: the library's own rule, asked without tensors.
    vec_x: q/k (and the outputs) 16-byte aligned with token and head strides multiples of 8 elements (contiguous
    tensors are); vec_cs: cos/sin 16-byte aligned with row strides multiples of 4. `sm_count` and
    `threads_per_sm` describe another device (default: `device`'s, the current CUDA device).

    Example
    -------
    >>> probe(4096, 32, 128, num_k_heads=8, sm_count=132, threads_per_sm=2048)   # an H200
    RotaryPlan(pairs=8, vec_cs=True, block=(8, 20, 1), blocks=4096)
    """
    load()
    if sm_count is None or threads_per_sm is None:
        props = torch.cuda.get_device_properties(torch.cuda.current_device() if device is None else device)
        sm_count = props.multi_processor_count if sm_count is None else sm_count
        threads_per_sm = props.max_threads_per_multi_processor if threads_per_sm is None else threads_per_sm
    pairs, cs, bx, by, bz, blocks = torch.ops.astrai.rotary_plan(num_tokens, num_q_heads, num_k_heads, head_dim,
                                                                 interleaved, vec_x, vec_cs, sm_count,
                                                                 threads_per_sm)
    return RotaryPlan(pairs, bool(cs), (bx, by, bz), blocks)


def _reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
               interleaved: bool) -> torch.Tensor:
    """The contract's formula in float32, rounded once: for the smoke test only (ops never imports backend)."""
    half = x.shape[-1] // 2
    c = cos[positions.long()].unsqueeze(-2)  # [T, 1, D/2]
    s = sin[positions.long()].unsqueeze(-2)
    xf = x.float()
    x0, x1 = (xf[..., 0::2], xf[..., 1::2]) if interleaved else (xf[..., :half], xf[..., half:])
    y = torch.empty_like(xf)
    y0, y1 = (y[..., 0::2], y[..., 1::2]) if interleaved else (y[..., :half], y[..., half:])
    y0.copy_(x0 * c - x1 * s)
    y1.copy_(x1 * c + x0 * s)
    return y.to(x.dtype)


def smoke_test() -> None:
    """Run a tiny rotary on the current CUDA device against a float32 torch computation; raise on mismatch.

    Covers both pairings, the fused q+k op, the in-place op and a head_dim off the vector path (D=34).
    `python -m astrai.extension verify` calls it.
    """
    load()
    if not torch.cuda.is_available():
        raise RuntimeError("rotary smoke test: no CUDA device is visible")
    gen = torch.Generator().manual_seed(0)
    tokens, heads_q, heads_k, max_pos = 7, 4, 2, 16
    for head_dim, interleaved in ((128, False), (128, True), (34, False), (34, True)):
        def rand(*shape, dtype=torch.bfloat16):
            return torch.randn(*shape, generator=gen).to(device="cuda", dtype=dtype)

        q, k = rand(tokens, heads_q, head_dim), rand(tokens, heads_k, head_dim)
        angles = rand(max_pos, head_dim // 2, dtype=torch.float32) * 3.0
        cos, sin = angles.cos(), angles.sin()
        positions = torch.randint(0, max_pos, (tokens,), generator=gen).to("cuda")
        q_out, k_out = rotary_embedding_qk(q, k, cos, sin, positions, interleaved=interleaved)
        q_in, k_in = q.clone(), k.clone()
        rotary_embedding_(q_in, k_in, cos, sin, positions, interleaved=interleaved)
        for what, got, x in (("q (fused q+k)", q_out, q), ("k (fused q+k)", k_out, k),
                             ("q (in place)", q_in, q), ("k (in place)", k_in, k)):
            want = _reference(x, cos, sin, positions, interleaved)
            diff = (got.float() - want.float()).abs()
            bound = want.float().abs() * 2.0**-7 + 1e-5  # one bf16 ulp: float32 contraction may differ
            if not bool((diff <= bound).all()):
                raise RuntimeError(
                    f"rotary smoke test failed: {what}, head_dim={head_dim}, interleaved={interleaved}: "
                    f"max |kernel - torch| = {diff.max().item():.3g} (allowed: one bf16 ulp)")
