"""Probe (not gated): where one graphed batch-1 decode step of bench_models' Llama-3-8B-shaped model goes, kernel
by kernel, and what the step's GEMM shapes and attention call could cost on their own.

  1. timeline: one replay of the captured decode step (bench_models.decode_graph) per setup, every kernel in
     launch order with its duration, grid and the idle gap before it (chrome trace of torch.profiler); printed for
     the first layer and the last kernels, summed by name.
  2. plans: every GEMM plan (recipe, split) the chain may pick, timed by `gemm_tune.sweep` on the step's M = 1
     shapes (weights past the L2, as the sweep times them), against the chain's pick.
  3. attention: our decode call as the transformers backend makes it (a static cache's K / V `[B, Hkv, L, D]`
     transposed, a bool mask over the whole cache) at each KV split size, against sdpa on the same tensors.
  4. prewarm: an experiment for the step's fixed cost a GEMM. A w8a16 M = 1 GEMM behind transformers' batch-1
     RMSNorm (seven small kernels, DRAM idle), weights rotated past the L2, timed as one graph a call: as it runs in
     a model, and with a second stream reading the first part of each weight row into L2 while the norm runs (a
     stand-in for a prefetch op we do not have), and with that read on the main stream (serial, no overlap).
     Then the same GEMM behind an idle gap of 5, 10 and 20 us (`torch.cuda._sleep` on one SM: the time a decode
     step's norms, rotary, cache write and attention leave DRAM idle between two GEMMs), alone and with the second
     stream reading as much of the weight as fits in 60% of the L2 during the gap (a torch amax, and the
     `ops.gemm.l2_prefetch` op, which only asks the L2 for the lines): what a prefetch of the next GEMM's weights
     during the rest of the step would be worth (the whole "rest" is ~480 us of a 1500 us step).

    PYTHONPATH=.:tests/bench python tests/bench/probe_decode_step.py [timeline] [plans] [attention] [prewarm]
Writes `$OUT/decode_step.json` when OUT is set.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]
import torch  # noqa: E402

import bench_models as bm  # noqa: E402

# The step's GEMMs at batch 1 (N, K): q / o, k / v, gate / up, down, lm_head; then the stacked q+k+v and gate+up of
# quantize_linear_(..., fuse=True).
STEP_NK = ((4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (128256, 4096), (6144, 4096), (28672, 4096))


def timeline(replay) -> list[dict]:
    """Kernels of one replay in start order: name, µs, grid, idle µs since the previous kernel ended."""
    from torch.profiler import ProfilerActivity, profile
    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "trace.json")
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    rows, end = [], None
    for e in kernels:
        rows.append({"name": e["name"][:100], "us": e["dur"], "grid": e.get("args", {}).get("grid"),
                     "gap": (e["ts"] - end) if end is not None else 0.0})
        end = e["ts"] + e["dur"]
    return rows


def print_timeline(setup: str, rows: list[dict]) -> None:
    total, gaps = sum(r["us"] for r in rows), sum(r["gap"] for r in rows)
    print(f"\n{setup}: {len(rows)} kernels, {total:.1f} us of kernels, {gaps:.1f} us idle between them")
    per_layer = max(1, (len(rows) - 8) // bm.LAYERS)
    for i, r in enumerate(rows):
        if i < per_layer + 4 or i >= len(rows) - 8:
            print(f"  {i:4d} {r['us']:8.2f} gap {r['gap']:6.2f} {str(r['grid']):>16} {r['name']}")
        elif i == per_layer + 4:
            print("  ...")
    by_name: dict[str, list] = {}
    for r in rows:
        by_name.setdefault(r["name"][:70], []).append(r["us"])
    print("  by name (us a step, calls):")
    for name, us in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:14]:
        print(f"    {sum(us):8.1f} {len(us):4d}  {name}")


def timelines(setups=("hf", "w8a16", "w8a16-fused", "w8a16-fused-rope", "w8a16-fused-rope-prefetch", "fp8")) -> dict:
    base = bm.base_model()
    out = {}
    for setup in setups:
        model = bm.build(setup, base)
        tokens_s, replay = bm.decode_graph(model, 1)
        rows = timeline(replay)
        out[setup] = {"tokens_s": tokens_s, "kernels": rows}
        print(f"\n{setup}: graphed decode {tokens_s:.0f} tokens/s ({1e6 / tokens_s:.1f} us a step)")
        print_timeline(setup, rows)
        del model, replay
        torch.cuda.empty_cache()
    bm.reset_patches()
    return out


def plans(pairs=("w8a16", "fp8", "w16a16")) -> dict:
    from astrai.extension import gemm_tune
    with tempfile.TemporaryDirectory() as tmp:
        data = gemm_tune.sweep(tuple((1, n, k) for n, k in STEP_NK), list(pairs), Path(tmp, "sweep.json"),
                               log=lambda *a, **k: None)
    print("\nM = 1 plans (us, the better of two passes): the chain's pick against the best plan")
    for rec in data["records"]:
        times = {p: min(rec["first"].get(p, 1e9), rec["second"].get(p, 1e9)) for p in rec["first"]}
        chain = f"{rec['chain'][0]},{rec['chain'][1]}"
        best = min(times, key=times.get)
        print(f"  {rec['pair']:7} N={rec['n']:6} K={rec['k']:5}  chain {chain:6} {times.get(chain, float('nan')):7.2f}"
              f"  best {best:6} {times[best]:7.2f}  ({times.get(chain, float('nan')) / times[best]:.3f})")
    return data


def attention() -> dict:
    import torch.nn.functional as F

    import astrai.extension as ae
    from astrai.extension.ops import attention as attn_ops
    length, heads, kv_heads, d = bm.PROMPT + bm.DECODE_STEPS + 8, 32, 8, 128
    q = torch.randn(1, heads, 1, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(1, kv_heads, length, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    mask = torch.zeros(1, 1, 1, length, device="cuda", dtype=torch.bool)
    mask[..., : bm.PROMPT + 1] = True
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    cases = {
        "sdpa (transformers' call)": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
        "ours, public attention()": lambda: ae.attention(qt, kt, vt, attn_mask=mask[:, 0, 0]),
    }
    for split in (0, 32, 64, 128, 256, 1024):
        cases[f"attn_decode kv_split_size={split}"] = (
            lambda s=split: attn_ops.attn_decode(qt[:, 0], kt, vt, mask=mask[:, 0, 0], kv_split_size=s))
    results = {}
    print(f"\nattention decode, B = 1, {heads} / {kv_heads} heads, D = {d}, cache {length}, {bm.PROMPT + 1} valid:")
    for name, fn in cases.items():
        try:
            us = _graph_us(fn)
            results[name] = us
            print(f"  {us:8.2f} us  {name}")
        except Exception as exc:
            results[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
            print(f"  failed  {name}: {results[name]}")
    return results


def prewarm(shapes=((4096, 4096), (6144, 4096), (14336, 4096), (28672, 4096)), fractions=(0.25, 0.5, 1.0)) -> dict:
    import math

    import astrai.extension as ae
    l2 = bm.gpu_timing.l2_bytes()
    reader = torch.cuda.Stream()
    norm_w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    x0 = torch.randn(1, 4096, device="cuda", dtype=torch.bfloat16)

    def norm(x):  # transformers' LlamaRMSNorm as it runs at batch 1
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-5)
        return norm_w * h.to(x.dtype)

    # torch.cuda._sleep spins for clock cycles: its rate on this GPU, from one timed call.
    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(2_000_000)
    end.record()
    torch.cuda.synchronize()
    cycles_per_us = 2_000_000 / (start.elapsed_time(end) * 1e3)
    from astrai.extension.ops import gemm as ops_gemm
    ops_gemm.load()
    prefetch_op = hasattr(torch.ops.astrai, "l2_prefetch")  # an image older than the op: the amax cases only
    results = {"l2_bytes": l2, "sleep_cycles_per_us": cycles_per_us, "l2_prefetch_op": prefetch_op}
    print(f"\nprewarm: w8a16 M = 1 GEMM behind an RMSNorm, us a call (graph, weights rotated past the "
          f"{l2 >> 20} MiB L2)")
    for n, k in shapes:
        sets = [torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8)
                for _ in range(max(2, math.ceil(3 * l2 / (n * k))))]
        scale = torch.rand(n, device="cuda", dtype=torch.float32) / 64

        def gemm(x, w):
            return ae.quant_gemm(x, w, b_scale=scale)

        def side_read(cols):
            def step(w):
                main = torch.cuda.current_stream()
                reader.wait_stream(main)
                with torch.cuda.stream(reader):  # the first `cols` bytes of every weight row into L2
                    w.view(torch.int32)[:, : cols // 4].amax()
                y = gemm(norm(x0), w)
                main.wait_stream(reader)
                return y
            return step

        cases = {"norm only": lambda w: norm(x0), "gemm only": lambda w: gemm(x0, w),
                 "norm + gemm": lambda w: gemm(norm(x0), w),
                 "read all, then norm + gemm (serial)": lambda w: (w.view(torch.int32).amax(), gemm(norm(x0), w))[1]}
        for fraction in fractions:
            cols = min(k, int(k * fraction) // 64 * 64, int(0.6 * l2 / n) // 64 * 64)
            if cols >= 64:
                cases[f"side read {cols}/{k} of each row during the norm"] = side_read(cols)

        def gap_then_gemm(gap_us, cols, op=None):
            def step(w):
                main = torch.cuda.current_stream()
                if cols or op:
                    reader.wait_stream(main)
                    with torch.cuda.stream(reader):
                        if op:  # the prefetch op: (run, period) bytes of the weight
                            ops_gemm.l2_prefetch(w, run=op[0], period=op[1])
                        else:
                            w.view(torch.int32)[:, : cols // 4].amax()
                torch.cuda._sleep(int(gap_us * cycles_per_us))  # DRAM idle on the main stream
                if cols or op:
                    main.wait_stream(reader)  # joined before the GEMM, as the linears would (graphs need it)
                return gemm(x0, w)
            return step

        most = min(k, int(0.6 * l2 / n) // 64 * 64)
        op_pattern = (bm.prefetch_run(n * k, 0.6 * l2), 4096)  # the op's pattern for the same share of the L2
        for gap_us in (5, 10, 20):
            cases[f"gap {gap_us} us + gemm"] = gap_then_gemm(gap_us, 0)
            cases[f"gap {gap_us} us with a side read of {most}/{k} of each row + gemm"] = gap_then_gemm(gap_us, most)
            if prefetch_op:
                cases[f"gap {gap_us} us with l2_prefetch {op_pattern[0]}/{op_pattern[1]} + gemm"] = gap_then_gemm(
                    gap_us, 0, op_pattern)
        shape = {}
        for name, step in cases.items():
            try:
                shape[name] = statistics.median(bm.gpu_timing.time_graph(step, sets, 4 * len(sets), 10))
                print(f"  N={n:6} K={k}  {shape[name]:8.2f} us  {name}")
            except Exception as exc:
                shape[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                print(f"  N={n:6} K={k}  failed  {name}: {shape[name]}")
        results[f"{n}x{k}"] = shape
        del sets
        torch.cuda.empty_cache()
    return results


def _graph_us(fn, calls: int = 50, replays: int = 20) -> float:
    """µs a call: the median replay of `calls` calls captured in one CUDA graph (`gpu_timing.time_graph`), L2 not
    flushed (a decode step's K / V are this small)."""
    return statistics.median(bm.gpu_timing.time_graph(lambda _: fn(), [None], calls, replays))


def main(argv: list[str]) -> int:
    parts = argv or ["timeline", "plans", "attention", "prewarm"]
    record = {"environment": bm.gpu_timing.environment()}
    out = os.environ.get("OUT")
    for part in parts:
        try:
            record[part] = {"timeline": timelines, "plans": plans, "attention": attention, "prewarm": prewarm}[part]()
        except Exception as exc:  # one part's failure must not hide the others
            import traceback
            traceback.print_exc(limit=4)
            record[part + "_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        # After every part that ran (a call cut off by its time limit keeps them); nothing ran (no GPU): no JSON,
        # so the tier reports it.
        if out and any(p in record for p in parts):
            Path(out, "decode_step.json").write_text(json.dumps(record, indent=1, default=str))
    failed = [key for key in record if key.endswith("_error")]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
