"""Benchmark: split-KV decode and Q-tiled prefill (contiguous and paged, page 16) against cuDNN and flash SDPA.

Method (shared/MEASURE.md): CUDA events around replays of a CUDA graph that holds many calls, median over
replays; the anchors are measured in the same run: `scaled_dot_product_attention` under
`sdpa_kernel(SDPBackend.CUDNN_ATTENTION)` and `sdpa_kernel(SDPBackend.FLASH_ATTENTION)`, GQA through
`enable_gqa=True`, over contiguous K/V (a paged cache is gathered into contiguous K/V for the anchors,
outside the timed region).

- Decode (memory-bound): inputs rotated over sets larger than the L2 cache. Bytes counted: K and V read
  once (2 * B * L * Hkv * D * 2), the floor every decode must move; q and out are negligible. The graph's
  calls follow each other, so on sm_90+ each call's launch overlaps the previous call's tail (programmatic
  dependent launch); the `-serial` rows time the same calls with set_staging(pdl=False), as after a kernel that
  does not release its dependents early.
- Prefill (compute-bound, self-attention Lq = L): one input set. FLOPs counted: 4 * B * Hq * D * kept pairs
  (two matmuls of 2 FLOPs per multiply-add; kept pairs L^2, or L (L + 1) / 2 causal). Reported: TFLOP/s,
  the ratio to flash and to cuDNN (their time over ours: > 1 is faster), and paged over contiguous time. At
  head_dim 128 a `contig-mma` row times the contiguous call on the mma.sync kernel
  (attention_plan.set_staging(sm90=False)), beside the sm_90a kernel that takes it on an H100/H200 by default.

Decode and prefill alike, the anchors' and the kernels' graphs of one shape are replayed in turn, the order reversed
every other replay (`gpu_timing.time_graphs`, as the GEMM bench), so that a drift of the GPU's speed under sustained
load falls on every call alike instead of on whichever is timed last. An anchor that refuses the shapes (a
RuntimeError on a trial call) is left out of that shape's rows.

    python tests/bench/bench_attention.py --json attention.json          # from the repository root, on a GPU
    python tests/bench/bench_attention.py --only decode --shapes 1x4096 1x32768 16x4096 --replays 50
    python tests/bench/bench_attention.py --only prefill --prefill-shapes 1x2048 8x8192 --json prefill.json

Importable: `measure(batch, length, ...)` returns the decode rows, `measure_prefill(batch, length, causal,
...)` the prefill rows.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

try:
    import astrai.extension  # noqa: F401
except ImportError:  # run as a script from a source tree: the repository root is two levels up
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_timing  # noqa: E402  timing and the machine record every bench script shares

from astrai.extension.ops import attention as ops  # noqa: E402
from astrai.extension.ops import attention_plan  # noqa: E402

DEFAULT_SHAPES = ("1x512", "1x4096", "1x32768", "16x4096", "16x16384", "64x4096", "64x16384")
PAGE_SIZE = 16


def _make_set(batch, length, heads_q, heads_kv, head_dim) -> dict:
    """Fresh random q, K, V (never zeros), a shuffled paged copy of K/V, lengths; anchors' views."""
    dev = "cuda"
    q = torch.randn(batch, heads_q, head_dim, device=dev).to(torch.bfloat16)
    k = torch.randn(batch, length, heads_kv, head_dim, device=dev).to(torch.bfloat16)
    v = torch.randn(batch, length, heads_kv, head_dim, device=dev).to(torch.bfloat16)
    pages = -(-length // PAGE_SIZE)
    table = torch.randperm(batch * pages, device=dev, dtype=torch.int32).view(batch, pages)
    k_cache = torch.empty(batch * pages, PAGE_SIZE, heads_kv, head_dim, device=dev, dtype=torch.bfloat16)
    v_cache = torch.empty_like(k_cache)
    pad = pages * PAGE_SIZE - length
    k_cache[table.long()] = F.pad(k, (0, 0, 0, 0, 0, pad)).view(batch, pages, PAGE_SIZE, heads_kv, head_dim)
    v_cache[table.long()] = F.pad(v, (0, 0, 0, 0, 0, pad)).view(batch, pages, PAGE_SIZE, heads_kv, head_dim)
    return {"q": q, "k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "page_table": table,
            "kv_lens": torch.full((batch,), length, dtype=torch.int32, device=dev),
            # anchors: [B, H, 1, D] query, [B, Hkv, L, D] views of the same contiguous K/V
            "q_sdpa": q.unsqueeze(2), "k_sdpa": k.transpose(1, 2), "v_sdpa": v.transpose(1, 2)}


def _sdpa_step(backend):
    from torch.nn.attention import sdpa_kernel

    def step(s):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(s["q_sdpa"], s["k_sdpa"], s["v_sdpa"], enable_gqa=True)
    return step


def _check(s: dict) -> None:
    """Refuse to time kernels that disagree with float32 torch (beyond bf16 rounding); the first two
    sequences, to bound the float32 copies."""
    s = {**s, "q": s["q"][:2], "k": s["k"][:2], "v": s["v"][:2], "page_table": s["page_table"][:2],
         "kv_lens": s["kv_lens"][:2]}
    k = s["k"].float().repeat_interleave(s["q"].shape[1] // s["k"].shape[2], dim=2).transpose(1, 2)
    v = s["v"].float().repeat_interleave(s["q"].shape[1] // s["v"].shape[2], dim=2).transpose(1, 2)
    want = F.scaled_dot_product_attention(s["q"].float().unsqueeze(2), k, v).squeeze(2)
    for name, got in (("contiguous", ops.attn_decode(s["q"], s["k"], s["v"], s["kv_lens"])),
                      ("paged", ops.attn_paged_decode(s["q"], s["k_cache"], s["v_cache"], s["page_table"],
                                                      s["kv_lens"]))):
        err = (got.float() - want).abs().max().item()
        if err > 2e-2:
            raise RuntimeError(f"bench_attention: {name} decode disagrees with torch (max error {err:.3g})")


def _usable_anchors(anchor_steps: dict, sample, what: str) -> dict:
    """The anchors that run on `sample` here: each is tried once; one that raises RuntimeError (its SDPA backend
    refuses these shapes on this GPU) is left out, with a note on stderr."""
    usable = {}
    for name, step in anchor_steps.items():
        try:
            step(sample)
            torch.cuda.synchronize()
        except RuntimeError as exc:
            print(f"bench_attention: {name} SDPA unavailable for {what}: {str(exc).splitlines()[0]}", file=sys.stderr)
            continue
        usable[name] = step
    return usable


def measure(batch: int, length: int, *, heads_q: int = 32, heads_kv: int = 8, head_dim: int = 128,
            replays: int = 20, min_calls: int = 32, max_sets: int = 32, serial_rows: bool = True) -> list[dict]:
    """Rows for one (B, L): the contiguous and paged kernels, with the cuDNN and flash SDPA anchors; with
    serial_rows also both calls with the programmatic launch overlap off ("-serial":
    attention_plan.set_staging(pdl=False))."""
    from torch.nn.attention import SDPBackend

    ops.load()
    kv_bytes = 2 * batch * length * heads_kv * head_dim * 2
    n_sets = max(1, min(max_sets, math.ceil(3 * gpu_timing.l2_bytes() / kv_bytes)))
    calls = n_sets * max(1, math.ceil(min_calls / n_sets))
    sets = [_make_set(batch, length, heads_q, heads_kv, head_dim) for _ in range(n_sets)]
    _check(sets[0])
    steps = {
        "contiguous": lambda s: ops.attn_decode(s["q"], s["k"], s["v"], s["kv_lens"]),
        "paged16": lambda s: ops.attn_paged_decode(s["q"], s["k_cache"], s["v_cache"], s["page_table"],
                                                   s["kv_lens"]),
    }
    if serial_rows:  # the same calls with pdl off: what the launch overlap contributes
        steps["contiguous-serial"] = _with_staging(steps["contiguous"], pdl=False)
        steps["paged16-serial"] = _with_staging(steps["paged16"], pdl=False)
    anchor_steps = _usable_anchors({"cudnn": _sdpa_step(SDPBackend.CUDNN_ATTENTION),
                                    "flash": _sdpa_step(SDPBackend.FLASH_ATTENTION)}, sets[0], f"B={batch} L={length}")
    timed = gpu_timing.time_graphs({**anchor_steps, **steps}, sets, calls, replays)  # interleaved replays
    anchors = {name: statistics.median(timed[name]) if name in anchor_steps else None for name in ("cudnn", "flash")}
    rows = []
    for kind in steps:
        times = timed[kind]
        us = statistics.median(times)
        row = {"batch": batch, "kv_len": length, "heads_q": heads_q, "heads_kv": heads_kv, "head_dim": head_dim,
               "kind": kind, "kernel_us": us, "kernel_us_min": min(times), "kernel_us_max": max(times),
               "kv_bytes": kv_bytes, "kernel_tbps": kv_bytes / us / 1e6,
               "cudnn_us": anchors["cudnn"], "flash_us": anchors["flash"],
               "input_sets": n_sets, "calls_per_graph": calls, "replays": replays}
        for name in ("cudnn", "flash"):
            a = anchors[name]
            row[f"{name}_tbps"] = None if a is None else kv_bytes / a / 1e6
            row[f"speedup_vs_{name}"] = None if a is None else a / us
        rows.append(row)
    del sets
    torch.cuda.empty_cache()
    return rows


# ---- prefill ---------------------------------------------------------------------------------------------

DEFAULT_PREFILL_SHAPES = ("1x2048", "1x8192", "8x2048", "8x8192")
PREFILL_CHECK_ROWS = 256  # the last rows of sequence 0 checked against float32 torch before timing


def _make_prefill_set(batch, length, heads_q, heads_kv, head_dim) -> dict:
    """Fresh random q, K, V [B, L, H, D] (never zeros), a shuffled paged copy of K/V; the anchors' views."""
    dev = "cuda"
    q = torch.randn(batch, length, heads_q, head_dim, device=dev).to(torch.bfloat16)
    k = torch.randn(batch, length, heads_kv, head_dim, device=dev).to(torch.bfloat16)
    v = torch.randn(batch, length, heads_kv, head_dim, device=dev).to(torch.bfloat16)
    pages = -(-length // PAGE_SIZE)
    table = torch.randperm(batch * pages, device=dev, dtype=torch.int32).view(batch, pages)
    k_cache = torch.empty(batch * pages, PAGE_SIZE, heads_kv, head_dim, device=dev, dtype=torch.bfloat16)
    v_cache = torch.empty_like(k_cache)
    pad = pages * PAGE_SIZE - length
    k_cache[table.long()] = F.pad(k, (0, 0, 0, 0, 0, pad)).view(batch, pages, PAGE_SIZE, heads_kv, head_dim)
    v_cache[table.long()] = F.pad(v, (0, 0, 0, 0, 0, pad)).view(batch, pages, PAGE_SIZE, heads_kv, head_dim)
    return {"q": q, "k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "page_table": table,
            "kv_lens": torch.full((batch,), length, dtype=torch.int32, device=dev),
            # anchors: [B, H, L, D] views of the same blhd tensors
            "q_sdpa": q.transpose(1, 2), "k_sdpa": k.transpose(1, 2), "v_sdpa": v.transpose(1, 2)}


def _sdpa_prefill_step(backend, causal):
    from torch.nn.attention import sdpa_kernel

    def step(s):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(s["q_sdpa"], s["k_sdpa"], s["v_sdpa"], is_causal=causal,
                                                  enable_gqa=True)
    return step


def _check_prefill(s: dict, causal: bool, steps: dict) -> None:
    """Refuse to time kernels that disagree with float32 torch (beyond bf16 rounding) on the last rows of
    sequence 0 (causal rows there see the most keys)."""
    q, k, v = s["q"][0], s["k"][0], s["v"][0]
    length, heads_q = q.shape[0], q.shape[1]
    rows = min(PREFILL_CHECK_ROWS, length)
    group = heads_q // k.shape[1]
    qf = q[-rows:].float().transpose(0, 1)                                      # [Hq, rows, D]
    kf = k.float().repeat_interleave(group, dim=1).transpose(0, 1)              # [Hq, L, D]
    vf = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
    scores = (qf @ kf.transpose(1, 2)) / math.sqrt(q.shape[-1])                 # [Hq, rows, L]
    if causal:
        pos = length - rows + torch.arange(rows, device=q.device)
        scores = scores.masked_fill(torch.arange(length, device=q.device)[None, :] > pos[:, None], float("-inf"))
    want = (torch.softmax(scores, dim=-1) @ vf).transpose(0, 1)                 # [rows, Hq, D]
    for name, step in steps.items():
        got = step(s)[0, -rows:].float()
        err = (got - want).abs().max().item()
        if err > 2e-2:
            raise RuntimeError(f"bench_attention: {name} prefill disagrees with torch (max error {err:.3g})")


def prefill_flops(batch: int, length: int, heads_q: int, head_dim: int, causal: bool) -> int:
    """4 * B * Hq * D * kept (query, key) pairs, Lq = L."""
    pairs = length * (length + 1) // 2 if causal else length * length
    return 4 * batch * heads_q * head_dim * pairs


def _with_staging(step, **switches):
    """`step` with the attention policy's switches (attention_plan.set_staging) set while it launches (the op plans
    each call from them, and a captured graph keeps what it planned), then restored."""
    def run(s):
        before = attention_plan.state()["staging"]
        attention_plan.set_staging(**switches)
        try:
            return step(s)
        finally:
            attention_plan.set_staging(**{name: before[name] for name in switches})
    return run


def measure_prefill(batch: int, length: int, causal: bool, *, heads_q: int = 32, heads_kv: int = 8,
                    head_dim: int = 128, replays: int = 10, target_ms: float = 2.0) -> list[dict]:
    """Rows for one (B, L, causal): the contiguous and paged (page 16) prefill kernels (and, at head_dim 128, the
    contiguous call on the mma.sync kernel: set_staging(sm90=False)), with the flash and cuDNN SDPA anchors. Each
    graph holds enough calls for about `target_ms` at 300 TFLOP/s (at least one)."""
    from torch.nn.attention import SDPBackend

    ops.load()
    flops = prefill_flops(batch, length, heads_q, head_dim, causal)
    calls = max(1, min(32, math.ceil(target_ms * 1e-3 * 300e12 / flops)))
    s = _make_prefill_set(batch, length, heads_q, heads_kv, head_dim)
    steps = {
        "contiguous": lambda s: ops.attn_prefill(s["q"], s["k"], s["v"], is_causal=causal),
        "paged16": lambda s: ops.attn_paged_prefill(s["q"], s["k_cache"], s["v_cache"], s["page_table"],
                                                    s["kv_lens"], is_causal=causal),
    }
    if head_dim == 128:  # the mma.sync kernel too, where an sm_90a one may take the call
        steps["contig-mma"] = _with_staging(steps["contiguous"], sm90=False)
    _check_prefill(s, causal, steps)
    # Anchors and kernels with their replays interleaved (see the module docstring).
    anchor_steps = _usable_anchors({"cudnn": _sdpa_prefill_step(SDPBackend.CUDNN_ATTENTION, causal),
                                    "flash": _sdpa_prefill_step(SDPBackend.FLASH_ATTENTION, causal)}, s,
                                   f"prefill B={batch} L={length}")
    times = gpu_timing.time_graphs({**anchor_steps, **steps}, [s], calls, replays)
    anchors = {name: statistics.median(times[name]) if name in anchor_steps else None for name in ("cudnn", "flash")}
    rows = []
    for kind in steps:
        us = statistics.median(times[kind])
        row = {"batch": batch, "q_len": length, "kv_len": length, "heads_q": heads_q, "heads_kv": heads_kv,
               "head_dim": head_dim, "causal": causal, "kind": kind, "kernel_us": us,
               "kernel_us_min": min(times[kind]), "kernel_us_max": max(times[kind]), "flops": flops,
               "kernel_tflops": flops / us / 1e6, "cudnn_us": anchors["cudnn"], "flash_us": anchors["flash"],
               "calls_per_graph": calls, "replays": replays, "paged_over_contiguous": None}
        for name in ("cudnn", "flash"):
            a = anchors[name]
            row[f"{name}_tflops"] = None if a is None else flops / a / 1e6
            row[f"speedup_vs_{name}"] = None if a is None else a / us
        rows.append(row)
    rows[1]["paged_over_contiguous"] = rows[1]["kernel_us"] / rows[0]["kernel_us"]
    del s
    torch.cuda.empty_cache()
    return rows


PREFILL_HEADER = ("B", "L", "causal", "kind", "kernel us", "TFLOP/s", "flash TF/s", "vs flash", "cuDNN TF/s",
                  "vs cuDNN", "paged/cont")


def _format_prefill_row(r: dict) -> str:
    return " ".join(f"{v:>10}" for v in (
        r["batch"], r["kv_len"], "yes" if r["causal"] else "no", r["kind"], _fmt(r["kernel_us"], ".1f"),
        _fmt(r["kernel_tflops"], ".1f"), _fmt(r["flash_tflops"], ".1f"), _fmt(r["speedup_vs_flash"], ".2f") + "x",
        _fmt(r["cudnn_tflops"], ".1f"), _fmt(r["speedup_vs_cudnn"], ".2f") + "x",
        _fmt(r["paged_over_contiguous"], ".3f")))


def format_prefill_table(rows: list[dict]) -> str:
    return "\n".join([" ".join(f"{h:>10}" for h in PREFILL_HEADER)] + [_format_prefill_row(r) for r in rows])


HEADER = ("B", "L", "kind", "kernel us", "TB/s", "cuDNN us", "cuDNN TB/s", "vs cuDNN", "flash us", "vs flash")


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def _cells(values) -> str:
    """Decode table cells, right-aligned; the kind (third) is wide enough for "contiguous-serial"."""
    return " ".join(f"{v:>17}" if i == 2 else f"{v:>10}" for i, v in enumerate(values))


def _format_row(r: dict) -> str:
    return _cells((
        r["batch"], r["kv_len"], r["kind"], _fmt(r["kernel_us"], ".2f"), _fmt(r["kernel_tbps"], ".2f"),
        _fmt(r["cudnn_us"], ".2f"), _fmt(r["cudnn_tbps"], ".2f"), _fmt(r["speedup_vs_cudnn"], ".2f") + "x",
        _fmt(r["flash_us"], ".2f"), _fmt(r["speedup_vs_flash"], ".2f") + "x"))


def format_table(rows: list[dict]) -> str:
    return "\n".join([_cells(HEADER)] + [_format_row(r) for r in rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("decode", "prefill"), help="run one part (default: both)")
    parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), help="decode BxL pairs, e.g. 1x4096")
    parser.add_argument("--prefill-shapes", nargs="+", default=list(DEFAULT_PREFILL_SHAPES),
                        help="prefill BxL pairs (Lq = L), each timed causal and not")
    parser.add_argument("--heads-q", type=int, default=32)
    parser.add_argument("--heads-kv", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--replays", type=int, default=20)
    parser.add_argument("--prefill-replays", type=int, default=10)
    parser.add_argument("--min-calls", type=int, default=32)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_attention: no CUDA device is visible", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    env_before = gpu_timing.environment("attention")
    rows, prefill_rows = [], []
    if args.only in (None, "decode"):
        print(format_table([]), flush=True)
        for shape in args.shapes:
            batch, length = (int(x) for x in shape.lower().split("x"))
            new = measure(batch, length, heads_q=args.heads_q, heads_kv=args.heads_kv, head_dim=args.head_dim,
                          replays=args.replays, min_calls=args.min_calls)
            print("\n".join(_format_row(r) for r in new), flush=True)
            rows += new
    if args.only in (None, "prefill"):
        print(format_prefill_table([]), flush=True)
        for shape in args.prefill_shapes:
            batch, length = (int(x) for x in shape.lower().split("x"))
            for causal in (False, True):
                new = measure_prefill(batch, length, causal, heads_q=args.heads_q, heads_kv=args.heads_kv,
                                      head_dim=args.head_dim, replays=args.prefill_replays)
                print("\n".join(_format_prefill_row(r) for r in new), flush=True)
                prefill_rows += new
    env = gpu_timing.environment("attention")
    env["nvidia_smi_before"] = env_before["nvidia_smi"]
    print()
    print(f"{env['gpu']['name']} (sm_{env['gpu']['capability'].replace('.', '')}), driver CUDA {env['driver_cuda']}, "
          f"torch {env['torch']}, image {(env['image'] or {}).get('name')}, {env['date']}")
    if rows:
        print(format_table(rows))
    if prefill_rows:
        print(format_prefill_table(prefill_rows))
    if args.json:
        args.json.write_text(json.dumps({"environment": env, "rows": rows, "prefill_rows": prefill_rows},
                                        indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
