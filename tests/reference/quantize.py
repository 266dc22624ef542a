"""Plain-torch quantization references, written from the contract (docs/contracts.md, "Quantize ops").

fp8: `(x.float() * s).clamp(-max, max).to(fp8)`, torch's own cast (round to nearest even), with every NaN
written as 0x7f (torch on CUDA produces that byte, because its float multiply returns the positive canonical
NaN; on the CPU a negative NaN would keep its sign). int8: `round_half_even(x.float() * s)` clamped to
[-127, 127], NaN -> 0. Dynamic multipliers: `qmax / amax` in float32 (FLT_MAX past it, 2^127 when rounded to
a power of two), optionally rounded down to a power of two, 1 for an amax of 0, inf or NaN; the returned
scale_inv is `1 / multiplier` in float32. amax is `max |x|`, NaN if x holds a NaN.
"""

from __future__ import annotations

import torch

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
INT8_MAX = 127.0
FLT_MAX = torch.finfo(torch.float32).max
POW2_127 = 2.0**127


def qmax_of(dtype: torch.dtype) -> float:
    return INT8_MAX if dtype == torch.int8 else FP8_MAX[dtype]


def cast(y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 values (already scaled) -> fp8 or int8 by the contract's rule."""
    y = y.float()
    nan = torch.isnan(y)
    if dtype == torch.int8:
        q = torch.round(y.clamp(-INT8_MAX, INT8_MAX))  # torch.round: half to even
        return torch.where(nan, torch.zeros_like(q), q).to(torch.int8)
    m = FP8_MAX[dtype]
    out = y.clamp(-m, m).to(dtype)
    bits = out.view(torch.uint8).clone()
    bits[nan] = 0x7F
    return bits.view(dtype)


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [M, N] with a multiplier [] / [1] (tensor), [M, 1] (row) or [1, N] (column)."""
    s = scale.float().reshape(-1)[0] if scale.numel() == 1 else scale.float()
    return cast(x.float() * s, dtype)


def amax(x: torch.Tensor, dim=None) -> torch.Tensor:
    """max |x| in float32 (NaN if any NaN); dim=None: whole tensor, shape [1]."""
    a = x.float().abs()
    if dim is None:
        return a.amax().reshape(1) if a.numel() else torch.zeros(1, device=x.device)
    return a.amax(dim=dim)


def scale_from_amax(amax_: torch.Tensor, qmax: float, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(multiplier, 1 / multiplier), float32, elementwise over amax."""
    a = amax_.float()
    ok = (a > 0) & torch.isfinite(a)
    safe = torch.where(ok, a, torch.ones_like(a))
    mul = torch.tensor(qmax, dtype=torch.float32, device=a.device) / safe
    mul = torch.where(torch.isinf(mul), torch.full_like(mul, POW2_127 if pow2 else FLT_MAX), mul)
    if pow2:
        mul = (mul.view(torch.int32) & -8388608).view(torch.float32)  # clear the mantissa (0xff800000)
    mul = torch.where(ok, mul, torch.ones_like(mul))
    return mul, torch.ones_like(mul) / mul


def quantize_dynamic(x: torch.Tensor, dtype: torch.dtype, granularity: str, pow2: bool = False):
    """(q, scale_inv): granularity "tensor" (scale_inv [1]) or "row" (scale_inv [M, 1])."""
    a = amax(x) if granularity == "tensor" else amax(x, dim=1).reshape(-1, 1) if x.shape[1] else \
        torch.zeros(x.shape[0], 1, device=x.device)
    mul, inv = scale_from_amax(a, qmax_of(dtype), pow2)
    return cast(x.float() * mul, dtype), inv


def quantize_block(x: torch.Tensor, dtype: torch.dtype, block_rows: int, pow2: bool = False):
    """(q, scale_inv [ceil(M / block_rows), N / 128]) for 1 x 128 groups or 128 x 128 blocks."""
    M, N = x.shape
    rows_p = -(-M // block_rows) * block_rows
    xf = torch.zeros(rows_p, N, dtype=torch.float32, device=x.device)
    xf[:M] = x.float()
    blocks = xf.view(rows_p // block_rows, block_rows, N // 128, 128)
    a = blocks.abs().amax(dim=(1, 3))  # [row blocks, col blocks]
    mul, inv = scale_from_amax(a, qmax_of(dtype), pow2)
    y = blocks * mul[:, None, :, None]
    return cast(y.view(rows_p, N)[:M], dtype), inv


def ue8m0_pack_bitwise(sf: torch.Tensor) -> list[list[int]]:
    """Bit-level model of the packed layout: for each row i a list of packed_sf_k uint32 words; byte j of word
    k is the biased exponent of sf[i, 4k + j] (0 past sf_k). Plain Python integers, one value at a time."""
    import struct
    mn, sf_k = sf.shape
    words = []
    for i in range(mn):
        row = []
        for k in range((sf_k + 3) // 4):
            w = 0
            for j in range(4):
                if 4 * k + j < sf_k:
                    bits = struct.unpack("<I", struct.pack("<f", float(sf[i, 4 * k + j])))[0]
                    w |= ((bits >> 23) & 0xFF) << (8 * j)
            row.append(w)
        words.append(row)
    return words


def special_values(dtype: torch.dtype) -> list[float]:
    """Values that probe the cast: ±0, ±inf, NaN, past max, ties, subnormals of the format and of x's type."""
    m = FP8_MAX.get(dtype, 127.0)
    vals = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), m, -m, m * 1.01, m * 4, -m * 4, 1e30, -1e30,
            1.0, -1.0, 0.5, 1.5, 2.5, -2.5, 3.5, 1.0625, 1.125, 1.1875]
    if dtype == torch.float8_e4m3fn:
        vals += [2.0**-9, 2.0**-10, 3 * 2.0**-10, 2.0**-7 * 1.0625, 464.0, 463.99, 2.0**-6, 2.0**-8 * 1.5]
    elif dtype == torch.float8_e5m2:
        vals += [2.0**-16, 2.0**-17, 3 * 2.0**-17, 61440.0, 61439.0, 2.0**-14, 2.0**-15 * 1.5]
    vals += [1e-38, -1e-39, 1e-45]
    return vals


def random_input(rows: int, cols: int, dtype: torch.dtype, *, device=None, specials: bool = True,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """Random x [rows, cols]: normal values with outliers (x1000) and magnitudes over 2^-12..2^12, never all
    zeros; with `specials`, about 2% of the elements replaced by special values (±0, ±inf, NaN, huge,
    subnormal). Generated on `device` (from `generator`'s device when one is given)."""
    gen_device = generator.device if generator is not None else device
    kw = dict(generator=generator, device=gen_device)
    x = torch.randn(rows, cols, dtype=torch.float32, **kw)
    x *= torch.where(torch.rand(rows, cols, **kw) < 0.01, 1000.0, 1.0)
    x *= torch.randint(-12, 12, (rows, cols), **kw).float().exp2()
    if specials and x.numel():
        pool = torch.tensor(special_values(torch.float8_e4m3fn) + special_values(torch.float8_e5m2),
                            dtype=torch.float32, device=gen_device)
        mask = torch.rand(rows, cols, **kw) < 0.02
        idx = torch.randint(0, pool.numel(), (rows, cols), **kw)
        x = torch.where(mask, pool[idx], x)
    return x.to(dtype).to(device)
