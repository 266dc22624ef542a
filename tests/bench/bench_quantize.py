"""Benchmark: the quantize kernels against torch's own quantize expressions and a device-to-device copy of the
same bytes.

Method (shared/MEASURE.md): CUDA events around replays of a CUDA graph that holds many calls, median over
replays, inputs rotated over sets larger than the L2 cache; the anchors (torch, copy) are measured in the same
run. Bytes counted are the fewest each case must move: x read once (bf16), the fp8 output(s) written once,
plus the scales written (per row: 4 bytes per row; 1 x 128: 4 bytes per group). The copy anchor moves the
same number of bytes (half read, half written) in one launch; "of copy" is the kernel's bandwidth over the
copy's. Cases: per-tensor static multiplier, dynamic per tensor (amax pass + cast pass: x is read twice, the
bytes counted are still the minimum), dynamic per row (one pass), transposed, dual, 1 x 128 blocks,
128 x 128 blocks, int8 per row.

    python tests/bench/bench_quantize.py --json quantize.json          # from the repository root, on a GPU
    python tests/bench/bench_quantize.py --shapes 4096x4096 --replays 50

Importable: `measure(...)` returns the rows and `environment()` the machine record.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

try:
    import astrai.extension  # noqa: F401
except ImportError:  # run as a script from a source tree: the repository root is two levels up
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from astrai.extension.ops import quantize as ops

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_timing  # noqa: E402

DEFAULT_SHAPES = ((65536, 4096), (4096, 4096))
CASES = ("per_tensor", "dynamic_tensor", "dynamic_row", "transposed", "dual", "block_1x128", "block_128x128",
         "int8_row")
E4M3 = torch.float8_e4m3fn
FMAX = 448.0


def _bytes(case: str, m: int, n: int) -> int:
    """The fewest bytes the case must move."""
    x = 2 * m * n
    return {"per_tensor": x + m * n, "dynamic_tensor": x + m * n, "dynamic_row": x + m * n + 4 * m,
            "transposed": x + m * n, "dual": x + 2 * m * n, "block_1x128": x + m * n + 4 * m * (n // 128),
            "block_128x128": x + m * n + 4 * (-(-m // 128)) * (n // 128), "int8_row": x + m * n + 4 * m}[case]


def _kernel_step(case: str):
    def per_tensor(s):
        return ops.quantize(s["x"], s["scale"], E4M3, check_scale=False)[0]
    return {
        "per_tensor": per_tensor,
        "dynamic_tensor": lambda s: ops.quantize_dynamic(s["x"], E4M3)[0],
        "dynamic_row": lambda s: ops.quantize_dynamic(s["x"], E4M3, granularity="row")[0],
        "transposed": lambda s: ops.quantize(s["x"], s["scale"], E4M3, layout="transposed", check_scale=False)[1],
        "dual": lambda s: ops.quantize(s["x"], s["scale"], E4M3, layout="dual", check_scale=False)[1],
        "block_1x128": lambda s: ops.quantize_block(s["x"], E4M3, block_rows=1)[0],
        "block_128x128": lambda s: ops.quantize_block(s["x"], E4M3, block_rows=128)[0],
        "int8_row": lambda s: ops.quantize_dynamic(s["x"], torch.int8, granularity="row")[0],
    }[case]


def _torch_step(case: str):
    """torch's own expressions for the same result (no NaN canonicalisation: what users write today)."""
    def static(s):
        return (s["x"].float() * s["scale"]).clamp(-FMAX, FMAX).to(E4M3)

    def dyn(x, amax, qmax, dtype):
        mul = qmax / amax.float().clamp_min(1e-12)
        y = (x.float() * mul).clamp(-qmax, qmax)
        return y.round().to(dtype) if dtype == torch.int8 else y.to(dtype)

    def block(x, rows):
        m, n = x.shape
        xb = x.float().view(m // rows, rows, n // 128, 128)
        mul = FMAX / xb.abs().amax(dim=(1, 3), keepdim=True).clamp_min(1e-12)
        return (xb * mul).clamp(-FMAX, FMAX).to(E4M3).view(m, n), (1 / mul).view(m // rows, n // 128)

    return {
        "per_tensor": static,
        "dynamic_tensor": lambda s: dyn(s["x"], s["x"].abs().amax(), FMAX, E4M3),
        "dynamic_row": lambda s: dyn(s["x"], s["x"].abs().amax(1, keepdim=True), FMAX, E4M3),
        "transposed": lambda s: static(s).t().contiguous(),
        "dual": lambda s: (lambda q: (q, q.t().contiguous()))(static(s)),
        "block_1x128": lambda s: block(s["x"], 1),
        "block_128x128": lambda s: block(s["x"], 128),
        "int8_row": lambda s: dyn(s["x"], s["x"].abs().amax(1, keepdim=True), 127.0, torch.int8),
    }[case]


def _make_set(m: int, n: int, copy_words: int) -> dict:
    dev = "cuda"
    return {"x": torch.randn(m, n, device=dev).to(torch.bfloat16),
            "scale": torch.tensor([FMAX / 8.0], device=dev),
            "copy_src": torch.randint(-2**31, 2**31 - 1, (copy_words,), device=dev, dtype=torch.int32),
            "copy_dst": torch.empty(copy_words, device=dev, dtype=torch.int32)}


def _check(case: str, s: dict) -> None:
    """Refuse to time a kernel that disagrees with the contract's torch path."""
    from astrai.extension.backend import quantize as backend
    x = s["x"][:512]
    if case in ("per_tensor", "transposed", "dual"):
        got = ops.quantize(x, s["scale"], E4M3, check_scale=False)[0]
        want = backend.quantize_fp8(x, s["scale"], out_dtype=E4M3, path="torch", check_scale=False)[0]
    elif case in ("dynamic_tensor", "dynamic_row", "int8_row"):
        dtype = torch.int8 if case == "int8_row" else E4M3
        g = "tensor" if case == "dynamic_tensor" else "row"
        got = ops.quantize_dynamic(x, dtype, granularity=g)[0]
        want = backend.quantize_fp8_dynamic(x, out_dtype=dtype, granularity=g, path="torch")[0]
    else:
        rows = 1 if case == "block_1x128" else 128
        got = ops.quantize_block(x, E4M3, block_rows=rows)[0]
        want = backend.quantize_fp8_block(x, out_dtype=E4M3, block_rows=rows, path="torch")[0]
    if not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
        raise RuntimeError(f"bench_quantize: kernel disagrees with the torch path ({case})")


def measure(m: int, n: int, *, cases=CASES, replays: int = 20, min_calls: int = 32, max_sets: int = 16) -> list[dict]:
    """Rows for one shape: each case's kernel, torch's expression and the copy anchor, measured in this run."""
    ops.load()
    rows = []
    for case in cases:
        kernel_bytes = _bytes(case, m, n)
        copy_words = kernel_bytes // 8  # int32 words: half the bytes read, half written
        per_set = 3 * m * n + 8 * copy_words
        n_sets = max(1, min(max_sets, math.ceil(3 * gpu_timing.l2_bytes() / max(per_set, 1))))
        calls = n_sets * max(1, math.ceil(min_calls / n_sets))
        sets = [_make_set(m, n, copy_words) for _ in range(n_sets)]
        _check(case, sets[0])
        copy_us = statistics.median(gpu_timing.time_graph(lambda s: s["copy_dst"].copy_(s["copy_src"]), sets, calls, replays))
        torch_us = statistics.median(gpu_timing.time_graph(_torch_step(case), sets, calls, replays))
        times = gpu_timing.time_graph(_kernel_step(case), sets, calls, replays)
        kernel_us = statistics.median(times)
        copy_bytes = 8 * copy_words
        kernel_gbps, copy_gbps = kernel_bytes / kernel_us / 1e3, copy_bytes / copy_us / 1e3
        rows.append({
            "m": m, "n": n, "case": case, "kernel_us": kernel_us, "kernel_us_min": min(times),
            "kernel_us_max": max(times), "torch_us": torch_us, "copy_us": copy_us,
            "kernel_bytes": kernel_bytes, "copy_bytes": copy_bytes, "kernel_gbps": kernel_gbps, "copy_gbps": copy_gbps,
            "torch_gbps": kernel_bytes / torch_us / 1e3, "fraction_of_copy": kernel_gbps / copy_gbps,
            "speedup_vs_torch": torch_us / kernel_us, "input_sets": n_sets, "calls_per_graph": calls,
            "replays": replays,
        })
        del sets
        torch.cuda.empty_cache()
    return rows


def environment() -> dict:
    """The machine record for quantize results (see gpu_timing.environment)."""
    return gpu_timing.environment("quantize")


HEADER = ("M", "N", "case", "kernel us", "torch us", "copy us", "kernel GB/s", "torch GB/s", "of copy", "vs torch")


def _format_row(r: dict) -> str:
    return " ".join(f"{v:>14}" for v in (
        r["m"], r["n"], r["case"], f"{r['kernel_us']:.2f}", f"{r['torch_us']:.2f}", f"{r['copy_us']:.2f}",
        f"{r['kernel_gbps']:.0f}", f"{r['torch_gbps']:.0f}", f"{100 * r['fraction_of_copy']:.0f}%",
        f"{r['speedup_vs_torch']:.1f}x"))


def format_table(rows: list[dict]) -> str:
    return "\n".join([" ".join(f"{h:>14}" for h in HEADER)] + [_format_row(r) for r in rows])


def _shape(text: str) -> tuple[int, int]:
    m, n = text.lower().split("x")
    return int(m), int(n)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", type=_shape, nargs="+", default=list(DEFAULT_SHAPES), help="MxN, e.g. 4096x4096")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--replays", type=int, default=20, help="timed graph replays (median reported)")
    parser.add_argument("--min-calls", type=int, default=32, help="calls captured per graph, at least")
    parser.add_argument("--json", type=Path, help="write the environment and rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_quantize: no CUDA device is visible", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    env_before = environment()
    rows = []
    print(format_table([]), flush=True)
    for m, n in args.shapes:
        new_rows = measure(m, n, cases=args.cases, replays=args.replays, min_calls=args.min_calls)
        print("\n".join(_format_row(r) for r in new_rows), flush=True)
        rows += new_rows
    env = environment()
    env["nvidia_smi_before"] = env_before["nvidia_smi"]
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "rows": rows}, indent=2) + "\n")
        print(f"wrote {args.json}")
    print()
    print(f"{env['gpu']['name']} (sm_{env['gpu']['capability'].replace('.', '')}), driver CUDA "
          f"{env['driver_cuda']}, torch {env['torch']}, image {(env['image'] or {}).get('name')}, {env['date']}")
    print(format_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
