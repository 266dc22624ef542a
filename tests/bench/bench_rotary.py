"""Benchmark: the fused rotary q+k kernel against the torch path and a device-to-device copy of the same bytes.

Method (shared/MEASURE.md): CUDA events around replays of a CUDA graph that holds many calls, median over
replays, inputs rotated over sets larger than the L2 cache; the anchors (torch path, copy) are measured in the
same run. Bytes counted are the fewest the kernel must move: q and k read once and written once, plus the
positions and the cos/sin rows the positions touch.

    python tests/bench/bench_rotary.py --json rotary.json          # from the repository root, on a GPU
    python tests/bench/bench_rotary.py --tokens 1 4096 --replays 50

Importable: `measure(...)` returns the rows and `environment()` the machine record (GPU, driver, CUDA,
torch, image, clocks, date).
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

from astrai.extension.backend import rotary as backend
from astrai.extension.ops import rotary as ops

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_timing  # noqa: E402

DEFAULT_TOKENS = (1, 64, 4096, 32768)
MODES = ("out_of_place", "in_place")


def _make_set(tokens: int, heads_q: int, heads_k: int, head_dim: int, max_pos: int) -> dict:
    """One input set: fresh random q, k (never zeros), its own cos/sin cache, distinct random positions."""
    dev = "cuda"
    angles = torch.rand(max_pos, head_dim // 2, device=dev, dtype=torch.float64) * (2 * math.pi)
    return {
        "q": torch.randn(tokens, heads_q, head_dim, device=dev).to(torch.bfloat16),
        "k": torch.randn(tokens, heads_k, head_dim, device=dev).to(torch.bfloat16),
        "cos": angles.cos().float(),
        "sin": angles.sin().float(),
        "positions": torch.randperm(max_pos, device=dev)[:tokens].to(torch.int32),
        # the copy anchor: the bytes of q and k, one contiguous source and destination (one launch)
        "copy_src": torch.randn(tokens * (heads_q + heads_k) * head_dim, device=dev).to(torch.bfloat16),
        "copy_dst": torch.empty(tokens * (heads_q + heads_k) * head_dim, device=dev, dtype=torch.bfloat16),
    }


def _check(s: dict, interleaved: bool) -> None:
    """Refuse to time a kernel that disagrees with the torch path (beyond one bf16 ulp)."""
    got = ops.rotary_embedding_qk(s["q"], s["k"], s["cos"], s["sin"], s["positions"], interleaved=interleaved)
    want = backend.apply_rotary_emb_qk(s["q"], s["k"], (s["cos"], s["sin"]), s["positions"],
                                       interleaved=interleaved, path="torch")
    for name, g, w in zip("qk", got, want):
        bound = w.float().abs() * 2.0**-7 + 1e-5
        if not bool(((g.float() - w.float()).abs() <= bound).all()):
            raise RuntimeError(f"bench_rotary: kernel {name} disagrees with the torch path (interleaved={interleaved})")


def measure(tokens: int, *, heads_q: int = 32, heads_k: int = 8, head_dim: int = 128, replays: int = 20,
            min_calls: int = 64, max_sets: int = 64) -> list[dict]:
    """Rows for one T: both pairings x {out_of_place, in_place} of the fused q+k kernel, with the torch path
    (out of place, forced) and the copy anchor measured in the same run."""
    ops.load()
    max_pos = max(tokens, 8192)
    elem = 2  # bf16
    qk_bytes = tokens * (heads_q + heads_k) * head_dim * elem
    # enough sets that one pass over them moves (reads + writes) at least 3x the L2
    n_sets = max(1, min(max_sets, math.ceil(3 * gpu_timing.l2_bytes() / max(2 * qk_bytes, 1))))
    calls = n_sets * max(1, math.ceil(min_calls / n_sets))
    sets = [_make_set(tokens, heads_q, heads_k, head_dim, max_pos) for _ in range(n_sets)]
    rows_touched = int(sets[0]["positions"].unique().numel())
    kernel_bytes = 2 * qk_bytes + tokens * 4 + rows_touched * head_dim * 4  # q,k in+out; positions; cos+sin rows
    copy_bytes = 2 * qk_bytes

    copy_us = statistics.median(gpu_timing.time_graph(lambda s: s["copy_dst"].copy_(s["copy_src"]), sets, calls, replays))
    rows = []
    for interleaved in (False, True):
        _check(sets[0], interleaved)
        torch_us = statistics.median(gpu_timing.time_graph(
            lambda s: backend.apply_rotary_emb_qk(s["q"], s["k"], (s["cos"], s["sin"]), s["positions"],
                                                  interleaved=interleaved, check_positions=False, path="torch"),
            sets, calls, replays))
        steps = {
            "out_of_place": lambda s: ops.rotary_embedding_qk(s["q"], s["k"], s["cos"], s["sin"], s["positions"],
                                                              interleaved=interleaved, check_positions=False),
            "in_place": lambda s: ops.rotary_embedding_(s["q"], s["k"], s["cos"], s["sin"], s["positions"],
                                                        interleaved=interleaved, check_positions=False),
        }
        for mode in MODES:
            times = gpu_timing.time_graph(steps[mode], sets, calls, replays)
            kernel_us = statistics.median(times)
            kernel_gbps = kernel_bytes / kernel_us / 1e3
            copy_gbps = copy_bytes / copy_us / 1e3
            rows.append({
                "tokens": tokens, "heads_q": heads_q, "heads_k": heads_k, "head_dim": head_dim,
                "pairing": "gptj" if interleaved else "neox", "mode": mode,
                "kernel_us": kernel_us, "kernel_us_min": min(times), "kernel_us_max": max(times),
                "torch_us": torch_us, "copy_us": copy_us,
                "kernel_bytes": kernel_bytes, "copy_bytes": copy_bytes,
                "kernel_gbps": kernel_gbps, "copy_gbps": copy_gbps,
                "fraction_of_copy": kernel_gbps / copy_gbps, "speedup_vs_torch": torch_us / kernel_us,
                "input_sets": n_sets, "calls_per_graph": calls, "replays": replays,
            })
    del sets
    torch.cuda.empty_cache()
    return rows


def environment() -> dict:
    """The machine record for rotary results (see gpu_timing.environment)."""
    return gpu_timing.environment("rotary")


HEADER = ("T", "pairing", "mode", "kernel us", "torch us", "copy us", "kernel GB/s", "of copy", "vs torch")


def _format_row(r: dict) -> str:
    return " ".join(f"{v:>11}" for v in (
        r["tokens"], r["pairing"], r["mode"], f"{r['kernel_us']:.2f}", f"{r['torch_us']:.2f}",
        f"{r['copy_us']:.2f}", f"{r['kernel_gbps']:.0f}", f"{100 * r['fraction_of_copy']:.0f}%",
        f"{r['speedup_vs_torch']:.1f}x"))


def format_table(rows: list[dict]) -> str:
    return "\n".join([" ".join(f"{h:>11}" for h in HEADER)] + [_format_row(r) for r in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=list(DEFAULT_TOKENS))
    parser.add_argument("--heads-q", type=int, default=32)
    parser.add_argument("--heads-k", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--replays", type=int, default=20, help="timed graph replays (median reported)")
    parser.add_argument("--min-calls", type=int, default=64, help="calls captured per graph, at least")
    parser.add_argument("--json", type=Path, help="write the environment and rows here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_rotary: no CUDA device is visible", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    env_before = environment()
    rows = []
    print(format_table([]), flush=True)
    for tokens in args.tokens:
        new_rows = measure(tokens, heads_q=args.heads_q, heads_k=args.heads_k, head_dim=args.head_dim,
                           replays=args.replays, min_calls=args.min_calls)
        print("\n".join(_format_row(r) for r in new_rows), flush=True)
        rows += new_rows
    env = environment()
    env["nvidia_smi_before"] = env_before["nvidia_smi"]
    print()
    print(f"{env['gpu']['name']} (sm_{env['gpu']['capability'].replace('.', '')}), driver CUDA "
          f"{env['driver_cuda']}, torch {env['torch']}, image {(env['image'] or {}).get('name')}, {env['date']}")
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "rows": rows}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
