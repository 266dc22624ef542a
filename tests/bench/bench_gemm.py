"""Benchmark: quant_gemm (built-in plan) against the torch call a user makes for the same product, and the
weight-stream floor of the same run.

Method (shared/MEASURE.md): CUDA events around replays of a CUDA graph of many calls, median over replays; the
anchor and the floor are measured in the same run, the anchor's and the kernel's replays interleaved (order alternated
each replay, `gpu_timing.time_graphs`) so that a GPU whose speed drifts within the case does not favour either side.
Anchors per pair (`ANCHORS`):

- w16a16 (bf16 x bf16): cuBLAS bf16 `F.linear(x, w)`;
- w8a16 (bf16 x int8, per-channel scale): cuBLAS bf16 `F.linear` on the bf16 weights the int8 ones and scales
  stand for; beside it, the dequantize-then-`F.linear` path a user writes in torch
  (`F.linear(x, (w_int8.to(bf16) * scale[:, None]).to(bf16))`, the dequantize timed) as extra figures;
- w8a8 (int8 x int8): `torch._int_mm`, both sides returning the raw int32 accumulators; `torch._int_mm` needs
  M > 16 on CUDA, so for M <= 16 the anchor is cuBLAS bf16 `F.linear` on the bf16 operands the int8 ones and
  their scales stand for, and the kernel writes bf16 with per-row / per-channel scales (the anchor's name says
  so);
- fp8_tensor (e4m3 x e4m3): `torch._scaled_mm` with per-tensor float32 scales, bf16 out;
- fp8_row: `torch._scaled_mm` with rowwise scales (a_scale [M, 1], b_scale [1, N] float32), bf16 out; the
  kernel gets the same scales as 1-D views ([M] per row, [N] per column).

The kernel runs through `astrai.extension.ops.gemm.quant_gemm` with no plan (its built-in plan; the row
records which). Before timing, its output on the first input set must match the anchor's (int32: exactly;
bf16: within TOLERANCE of the largest output) or the case raises: a wrong kernel gets no ratio.

Input sets: enough that one pass over them touches at least 3x the L2 (weights, activation and output of
the kernel's call, the smallest footprint of the timed calls), so each call streams its weights from HBM;
one set where a single set already touches that much (large M). Floor: a device-to-device copy moving the
weight bytes (the int8 / bf16 / fp8 weights and their per-channel scales), inputs rotated past the L2
(gpu_timing.time_copy): the time of a weight stream at copy bandwidth, the bound at small M.

    python tests/bench/bench_gemm.py --json gemm.json                  # from the repository root, on a GPU
    python tests/bench/bench_gemm.py --pairs w8a16 --m 1 16 --shapes 4096x4096 --replays 50

Importable: `measure(pair, m, n, k)` returns one row, `environment()` the machine record.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    import astrai.extension  # noqa: F401
except ImportError:  # run as a script from a source tree: the repository root is two levels up
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from astrai.extension.backend import gemm as backend
from astrai.extension.ops import gemm_plan
from astrai.extension.ops import gemm as ops

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_timing  # noqa: E402

PAIRS = ("w16a16", "w8a16", "w8a8", "fp8_tensor", "fp8_row")
OP_PAIR = {"w16a16": "w16a16", "w8a16": "w8a16", "w8a8": "w8a8", "fp8_tensor": "fp8", "fp8_row": "fp8"}
DTYPES_OF = {"w16a16": (torch.bfloat16, torch.bfloat16), "w8a16": (torch.bfloat16, torch.int8),
             "w8a8": (torch.int8, torch.int8), "fp8_tensor": (torch.float8_e4m3fn, torch.float8_e4m3fn),
             "fp8_row": (torch.float8_e4m3fn, torch.float8_e4m3fn)}
INT_MM_MIN_M = 17  # torch._int_mm on CUDA refuses M <= 16
ANCHORS = {
    "w16a16": "cuBLAS bf16 F.linear",
    "w8a16": "cuBLAS bf16 F.linear (bf16 weights)",
    "w8a8": "torch._int_mm",
    "w8a8_small_m": "cuBLAS bf16 F.linear (M <= 16: torch._int_mm needs M > 16)",
    "fp8_tensor": "torch._scaled_mm tensorwise",
    "fp8_row": "torch._scaled_mm rowwise",
}
DEQUANT = "torch dequantize then F.linear"  # w8a16's extra figures
CEILING = "weight stream (copy)"
TOLERANCE = 2e-2  # of max |anchor|: bf16 rounding of both outputs (and of the anchor's bf16 weights) is ~2^-8
BF16, E4M3 = torch.bfloat16, torch.float8_e4m3fn

# Calls per graph: about TARGET_GRAPH_US of the anchor's work per replay, so event resolution and the gaps
# between graph nodes stay small against it; the estimate takes the anchors' H200 rates (shared/MEASURE.md).
TARGET_GRAPH_US = 2000.0
MIN_CALLS, MAX_CALLS = 2, 64
MAX_SETS = 64
STREAM_BYTES_PER_US = 3e6          # cuBLAS's weight stream at small M, ~3 TB/s
FLOPS_PER_US = {"w16a16": 7e8, "w8a16": 7e8, "w8a8": 8e8, "fp8_tensor": 13e8, "fp8_row": 11e8}


class Unavailable(Exception):
    """This case cannot run here (fp8 on this GPU or image, or an anchor torch refuses): skip, saying why."""


def anchor_name(pair: str, m: int) -> str:
    return ANCHORS["w8a8_small_m"] if pair == "w8a8" and m < INT_MM_MIN_M else ANCHORS[pair]


def out_dtype(pair: str, m: int) -> torch.dtype:
    """The kernel's output: int32 where the anchor is torch._int_mm (the same raw accumulators), else bf16."""
    return torch.int32 if pair == "w8a8" and m >= INT_MM_MIN_M else BF16


def weight_bytes(pair: str, n: int, k: int) -> int:
    """Bytes of the kernel's weight operand and its per-channel scales: what a weight stream must read."""
    elem = 2 if pair == "w16a16" else 1
    per_channel = pair in ("w8a16", "fp8_row")
    return elem * n * k + (4 * n if per_channel else 0)


def flops(m: int, n: int, k: int) -> int:
    return 2 * m * n * k


def kernel_bytes(pair: str, m: int, n: int, k: int) -> int:
    """Bytes the kernel's call touches at the least: activation, weights (and scales), output."""
    a_elem = 2 if pair in ("w16a16", "w8a16") else 1
    return a_elem * m * k + weight_bytes(pair, n, k) + out_dtype(pair, m).itemsize * m * n


def estimate_us(pair: str, m: int, n: int, k: int) -> float:
    """The anchor's time by the H200 rates: its weight stream (bf16 weights for the F.linear anchors) or the
    FLOPs, whichever is longer."""
    bf16_weights = anchor_name(pair, m).startswith("cuBLAS bf16")
    stream = (2 * n * k if bf16_weights else weight_bytes(pair, n, k)) / STREAM_BYTES_PER_US
    return max(stream, flops(m, n, k) / FLOPS_PER_US[pair])


def sets_and_calls(touched: int, est_us: float, l2: int) -> tuple[int, int]:
    """(input sets, calls per graph): sets until one pass touches >= 3x the L2 (at most MAX_SETS), calls for
    ~TARGET_GRAPH_US per replay (MIN_CALLS..MAX_CALLS) in whole passes over the sets (at least one)."""
    n_sets = max(1, min(MAX_SETS, math.ceil(3 * l2 / max(touched, 1))))
    calls = min(MAX_CALLS, max(MIN_CALLS, math.ceil(TARGET_GRAPH_US / max(est_us, 1e-3))))
    return n_sets, n_sets * max(1, calls // n_sets)


# ---- input sets and the timed calls ----------------------------------------------------------------------

def make_set(pair: str, m: int, n: int, k: int, device: str = "cuda") -> dict:
    """One input set: fresh random operands (never zeros) for the kernel ("a", "b", scales) and the anchor."""
    def bf16(*shape):
        return torch.randn(*shape, device=device).to(BF16)

    def int8(*shape):
        return torch.randint(-128, 128, shape, device=device, dtype=torch.int8)

    def fp8(*shape):
        return (torch.randn(*shape, device=device) * 2).to(E4M3)

    def scale(*shape):  # int8 scales bring the dequantized values near unit size
        return (torch.rand(*shape, device=device) + 0.5) / 128

    if pair == "w16a16":
        return {"a": bf16(m, k), "b": bf16(n, k)}
    if pair == "w8a16":
        b, sb = int8(n, k), scale(n)
        return {"a": bf16(m, k), "b": b, "b_scale": sb, "w16": (b.float() * sb[:, None]).to(BF16)}
    if pair == "w8a8":
        s = {"a": int8(m, k), "b": int8(n, k)}
        if m < INT_MM_MIN_M:  # bf16 out with scales; the anchor's bf16 operands are what the int8 ones stand for
            s["a_scale"], s["b_scale"] = scale(m), scale(n)
            s["x16"] = (s["a"].float() * s["a_scale"][:, None]).to(BF16)
            s["w16"] = (s["b"].float() * s["b_scale"][:, None]).to(BF16)
        return s
    if pair == "fp8_tensor":
        return {"a": fp8(m, k), "b": fp8(n, k), "a_scale": torch.rand((), device=device) + 0.5,
                "b_scale": torch.rand((), device=device) + 0.5}
    if pair == "fp8_row":
        sa, sb = torch.rand(m, 1, device=device) + 0.5, torch.rand(1, n, device=device) + 0.5
        return {"a": fp8(m, k), "b": fp8(n, k), "a_scale_2d": sa, "b_scale_2d": sb,  # [M, 1], [1, N]: _scaled_mm's
                "a_scale": sa.view(m), "b_scale": sb.view(n)}                        # [M], [N]: the same scales
    raise ValueError(f"bench_gemm: pair must be one of {PAIRS}, got {pair!r}")


def kernel_step(pair: str, m: int, gemm=ops.quant_gemm):
    """The kernel's call on a set; `gemm` is ops.gemm.quant_gemm (the CPU tests pass the torch path)."""
    dtype = out_dtype(pair, m)

    def step(s):
        return gemm(s["a"], s["b"], a_scale=s.get("a_scale"), b_scale=s.get("b_scale"), out_dtype=dtype)
    return step


def anchor_step(pair: str, m: int):
    """The anchor's call on a set: the same product as torch gives it."""
    if pair == "w16a16":
        return lambda s: F.linear(s["a"], s["b"])
    if pair == "w8a16":
        return lambda s: F.linear(s["a"], s["w16"])
    if pair == "w8a8":
        if m < INT_MM_MIN_M:
            return lambda s: F.linear(s["x16"], s["w16"])
        return lambda s: torch._int_mm(s["a"], s["b"].t())
    if pair == "fp8_tensor":
        return lambda s: torch._scaled_mm(s["a"], s["b"].t(), scale_a=s["a_scale"], scale_b=s["b_scale"],
                                          out_dtype=BF16)
    if pair == "fp8_row":
        return lambda s: torch._scaled_mm(s["a"], s["b"].t(), scale_a=s["a_scale_2d"], scale_b=s["b_scale_2d"],
                                          out_dtype=BF16)
    raise ValueError(f"bench_gemm: pair must be one of {PAIRS}, got {pair!r}")


def dequant_step(s):
    """w8a16 as a user writes it in torch: dequantize the int8 weights to bf16 on every call, then F.linear."""
    return F.linear(s["a"], (s["b"].to(BF16) * s["b_scale"][:, None]).to(BF16))


def check(pair: str, m: int, s: dict, gemm=ops.quant_gemm) -> float:
    """Refuse to time a kernel whose output disagrees with the anchor's; returns the relative error (0 for int32).
    An anchor that torch refuses here raises Unavailable."""
    try:
        want = anchor_step(pair, m)(s)
    except RuntimeError as exc:
        raise Unavailable(f"{anchor_name(pair, m)} refused the call here: {str(exc).splitlines()[0]}") from exc
    got = kernel_step(pair, m, gemm)(s)
    where = f"bench_gemm: {pair} M={s['a'].shape[0]} N={s['b'].shape[0]} K={s['a'].shape[1]}"
    if got.shape != want.shape or got.dtype != want.dtype:
        raise RuntimeError(f"{where}: kernel gives {got.dtype} {list(got.shape)}, {anchor_name(pair, m)} "
                           f"{want.dtype} {list(want.shape)}")
    if got.dtype == torch.int32:
        if not torch.equal(got, want):
            bad = int((got != want).sum())
            raise RuntimeError(f"{where}: kernel disagrees with {anchor_name(pair, m)} in {bad} int32 outputs")
        return 0.0
    scale = want.float().abs().max().item()
    err = (got.float() - want.float()).abs().max().item() if bool(torch.isfinite(got).all()) else math.inf
    if not err <= TOLERANCE * scale:
        raise RuntimeError(f"{where}: kernel disagrees with {anchor_name(pair, m)} (max error {err:.3g}, "
                           f"allowed {TOLERANCE:g} of max |anchor| = {scale:.3g})")
    return err / scale if scale else 0.0


def fp8_blocker(device: str = "cuda") -> str | None:
    """Why the fp8 cases cannot run here, or None: the backend's device rule (sm_89+, an image that serves the
    family), then the op's own refusal (e.g. the compute_80 PTX image, which has no fp8 mma)."""
    a = torch.ones(16, 64, device=device).to(E4M3)
    why = backend._cuda_blocker(a, a, (), None)
    if why:
        return why
    try:
        ops.quant_gemm(a, a)
    except RuntimeError as exc:
        if "fp8" not in str(exc):
            raise
        return str(exc).splitlines()[0]
    return None


# ---- one measurement -------------------------------------------------------------------------------------

def measure(pair: str, m: int, n: int, k: int, *, replays: int = 20) -> dict:
    """One row: kernel, anchor (and for w8a16 the torch dequantize path) and the weight-stream copy, timed in
    this run on the same input sets."""
    ops.load()
    if pair in ("fp8_tensor", "fp8_row") and (why := fp8_blocker()):
        raise Unavailable(f"fp8: {why}")
    n_sets, calls = sets_and_calls(kernel_bytes(pair, m, n, k), estimate_us(pair, m, n, k), gpu_timing.l2_bytes())
    sets = [make_set(pair, m, n, k) for _ in range(n_sets)]
    rel_error = check(pair, m, sets[0])
    steps = {"anchor": anchor_step(pair, m), "kernel": kernel_step(pair, m)}
    if pair == "w8a16":
        steps["dequant"] = dequant_step
    timed = gpu_timing.time_graphs(steps, sets, calls, replays)  # interleaved: a drift falls on both sides alike
    anchor_us, times = statistics.median(timed["anchor"]), timed["kernel"]
    dequant_us = statistics.median(timed["dequant"]) if pair == "w8a16" else None
    del sets
    torch.cuda.empty_cache()
    wbytes = weight_bytes(pair, n, k)
    copy_us = gpu_timing.time_copy(wbytes)
    kernel_us = statistics.median(times)
    return {
        "pair": pair, "m": m, "n": n, "k": k, "anchor": anchor_name(pair, m), "out_dtype": str(out_dtype(pair, m)),
        "plan": list(gemm_plan.probe(m, n, k, dtypes=DTYPES_OF[pair], out_dtype=out_dtype(pair, m)).plan),  # the op's
        "kernel_us": kernel_us, "kernel_us_min": min(times), "kernel_us_max": max(times), "anchor_us": anchor_us,
        "dequant_us": dequant_us, "copy_us": copy_us, "weight_bytes": wbytes, "flops": flops(m, n, k),
        "kernel_tflops": flops(m, n, k) / kernel_us / 1e6, "anchor_tflops": flops(m, n, k) / anchor_us / 1e6,
        "kernel_wtbps": wbytes / kernel_us / 1e6, "copy_tbps": wbytes / copy_us / 1e6,
        "fraction_of_copy": copy_us / kernel_us, "speedup_vs_anchor": anchor_us / kernel_us,
        "check_rel_error": rel_error, "input_sets": n_sets, "calls_per_graph": calls, "replays": replays,
    }


def environment() -> dict:
    """The machine record for gemm results (see gpu_timing.environment)."""
    return gpu_timing.environment("gemm")


HEADER = ("pair", "M", "N", "K", "plan", "kernel us", "anchor us", "floor us", "TFLOP/s", "w TB/s", "of floor",
          "vs anchor")


def _format_row(r: dict) -> str:
    return " ".join(f"{v:>10}" for v in (
        r["pair"], r["m"], r["n"], r["k"], "/".join(map(str, r["plan"])), f"{r['kernel_us']:.1f}",
        f"{r['anchor_us']:.1f}", f"{r['copy_us']:.1f}", f"{r['kernel_tflops']:.0f}", f"{r['kernel_wtbps']:.2f}",
        f"{100 * r['fraction_of_copy']:.0f}%", f"{r['speedup_vs_anchor']:.2f}x"))


def format_table(rows: list[dict]) -> str:
    return "\n".join([" ".join(f"{h:>10}" for h in HEADER)] + [_format_row(r) for r in rows])


def _shape(text: str) -> tuple[int, int]:
    n, k = text.lower().split("x")
    return int(n), int(k)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=PAIRS)
    parser.add_argument("--m", type=int, nargs="+", default=[1, 16, 1024, 4096])
    parser.add_argument("--shapes", type=_shape, nargs="+", default=[(4096, 4096), (14336, 4096)],
                        help="NxK, e.g. 4096x14336")
    parser.add_argument("--replays", type=int, default=20, help="timed graph replays (median reported)")
    parser.add_argument("--json", type=Path, help="write the environment and rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_gemm: no CUDA device is visible", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    env_before = environment()
    rows = []
    print(format_table([]), flush=True)
    for n, k in args.shapes:
        for m in args.m:
            for pair in args.pairs:
                try:
                    row = measure(pair, m, n, k, replays=args.replays)
                except Unavailable as exc:
                    print(f"bench_gemm: {pair} M={m} N={n} K={k} skipped: {exc}", file=sys.stderr)
                    continue
                print(_format_row(row), flush=True)
                rows.append(row)
    env = environment()
    env["nvidia_smi_before"] = env_before["nvidia_smi"]
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "rows": rows}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
