"""Plain-torch quantized-GEMM reference: float64 truth, written from the contract's formula.

`y[m, n] = acc[m, n] * sa[m] * sb[n] + bias[n]` with `acc` the exact dot product of the upcast operands, each
layout spelled as its own einsum (independent of the library's transposed views). Returned in float64 (int64
for the raw int32 accumulators), unrounded: tests round or bound it.
"""

from __future__ import annotations

import torch

# Layout -> einsum of a and b (as stored) into [..., M, N].
EINSUM = {"nt": "...mk,...nk->...mn", "nn": "...mk,...kn->...mn",
          "tn": "...km,...kn->...mn", "tt": "...km,...nk->...mn"}


def quant_gemm(a: torch.Tensor, b: torch.Tensor, *, a_scale=None, b_scale=None, bias=None,
               layout: str = "nt") -> torch.Tensor:
    """The float64 result before the output cast; a 2-D operand broadcasts over the other's batch."""
    acc = torch.einsum(EINSUM[layout], a.double(), b.double())
    if a_scale is not None:
        acc = acc * a_scale.double().flatten()[:, None]
    if b_scale is not None:
        acc = acc * b_scale.double().flatten()
    if bias is not None:
        acc = acc + bias.double()
    return acc
