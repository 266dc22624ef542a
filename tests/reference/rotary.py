"""Plain-torch rotary-embedding reference: float64 truth (upcast=True) or the same-precision baseline (upcast=False).

Written from the contract's formula with real arithmetic only, independent of the library's complex-multiply
torch path: pair j of a head rotates by (cos[., j], sin[., j]),
`y0 = x0*cos - x1*sin`, `y1 = x1*cos + x0*sin`; NeoX pairs are (j, j + D/2), GPT-J pairs are (2j, 2j + 1).
"""

from __future__ import annotations

import torch


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor | None = None, *,
           interleaved: bool = False, upcast: bool = True) -> torch.Tensor:
    """Rotate x `[T, H, D]` or `[B, S, H, D]`.

    cos/sin: per token `[T, D/2]` / `[B, S, D/2]`, `[S, D/2]` shared by a 4-D batch, or with `positions`
    (`[T]` / `[B, S]`, any integer dtype) a cache `[max_pos, D/2]`.
    upcast=True: every operation in float64, result float64 (the truth).
    upcast=False: every operation in x's dtype, result x's dtype (what naive same-precision code gets).
    """
    dtype = torch.float64 if upcast else x.dtype
    if positions is not None:
        cos, sin = cos[positions.long()], sin[positions.long()]
    c = cos.to(dtype).unsqueeze(-2)  # [..., 1, D/2]
    s = sin.to(dtype).unsqueeze(-2)
    xx = x.to(dtype)
    half = x.shape[-1] // 2
    if interleaved:
        x0, x1 = xx[..., 0::2], xx[..., 1::2]
    else:
        x0, x1 = xx[..., :half], xx[..., half:]
    y0 = x0 * c - x1 * s
    y1 = x1 * c + x0 * s
    if interleaved:
        return torch.stack((y0, y1), dim=-1).flatten(-2)
    return torch.cat((y0, y1), dim=-1)


def random_freqs(rows: int, half: int, *, device=None, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin `[rows, half]` of uniformly random angles in [-pi, pi): fresh, never zero, cos^2 + sin^2 = 1."""
    angles = (torch.rand(rows, half, dtype=torch.float64, device=device) * 2 - 1) * torch.pi
    return angles.cos().to(dtype), angles.sin().to(dtype)
