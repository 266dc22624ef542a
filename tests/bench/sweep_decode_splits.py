"""Sweep: decode time per KV split size, to fit or check the split planner (csrc/kernels/attention/attention_launch.cu).

For each shape, attn_decode (or attn_paged_decode, page 16) with kv_split_size 0 (the planner's choice) and every
power-of-two split from 64 keys to L, CUDA-graph timed as bench_attention (median of replays, inputs rotated past
the L2). Prints the fastest split per shape with its blocks per SM (B * Hkv * splits / SMs) and writes JSON.

    python3 tests/bench/sweep_decode_splits.py --kind contiguous --head-dim 128 --json OUT.json
    python3 tests/bench/sweep_decode_splits.py --kind paged --head-dim 256 --shapes 1x4096 16x1024
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_attention as ba  # noqa: E402
import gpu_timing  # noqa: E402

from astrai.extension.ops import attention as ops  # noqa: E402

DEFAULT_SHAPES = [f"{b}x{L}" for b in (1, 2, 4, 8, 16, 32, 64) for L in (1024, 4096, 16384, 32768) if b * L <= 64 * 16384]


def sweep(kind: str, head_dim: int, shapes: list[str], heads_q: int = 32, heads_kv: int = 8, replays: int = 10) -> dict:
    ops.load()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = {}
    for shape in shapes:
        batch, length = (int(x) for x in shape.lower().split("x"))
        kv_bytes = 2 * batch * length * heads_kv * head_dim * 2
        n_sets = max(1, min(16, math.ceil(3 * gpu_timing.l2_bytes() / kv_bytes)))
        calls = n_sets * max(1, math.ceil(16 / n_sets))
        sets = [ba._make_set(batch, length, heads_q, heads_kv, head_dim) for _ in range(n_sets)]

        def step(s, split):
            if kind == "paged":
                return ops.attn_paged_decode(s["q"], s["k_cache"], s["v_cache"], s["page_table"], s["kv_lens"],
                                             kv_split_size=split)
            return ops.attn_decode(s["q"], s["k"], s["v"], s["kv_lens"], kv_split_size=split)

        gpu_timing.time_graph(lambda s: step(s, 0), sets, calls, 3)  # warm-up: clocks, first launches
        row = {}
        split = 0
        while split <= length:
            row[split] = statistics.median(gpu_timing.time_graph(lambda s, sp=split: step(s, sp), sets, calls, replays))
            split = 64 if split == 0 else 2 * split
        best_us, best = min((v, k) for k, v in row.items() if k)
        blocks = batch * heads_kv * math.ceil(length / best)
        print(f"{kind} D={head_dim} B={batch} L={length}: planner {row[0]:.2f} us, fastest {best_us:.2f} us at "
              f"{best} keys ({blocks / sms:.1f} blocks/SM)", flush=True)
        out[shape] = row
        del sets
        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=("contiguous", "paged"), default="contiguous")
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="BxL pairs")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    rows = sweep(args.kind, args.head_dim, args.shapes)
    if args.json:
        args.json.write_text(json.dumps({"environment": gpu_timing.environment("attention"), "kind": args.kind,
                                         "head_dim": args.head_dim, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
