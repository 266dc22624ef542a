"""Developer probe of explicit GEMM plans, each timed by CUDA-graph replay beside its anchor in the same run.
Input for the built-in plan's rules (ops/gemm.py) and the planning issue; not gated.

- `grid` (default): every (recipe, split_k) of PLANS at M in MS over the issue's (N, K) grid, w16a16 against
  cuBLAS bf16 `F.linear` and w8a8 (int32 out) against `torch._int_mm`; ratio = anchor / plan, and the built-in
  plan's pick.
- `sm90`: recipes 4 and 5 (the sm_90a mainloop) at splits SM90_SPLITS over M in 1, 16, 64 and MS x NK: w16a16
  against cuBLAS bf16, fp8 (unit tensorwise scales) against `torch._scaled_mm`, w8a8 (int32 out, M > 16) against
  `torch._int_mm`, with recipe 0 beside them; a result off the anchor's by more than 2e-2 (relative) is flagged.
  `sm90-quick`: the same at M = 1024 and 4096 without splits.
- `stream90`: recipe 6 (the sm_90a weight stream) at splits 1, 2, 4, 8 for every pair at M in 1, 8, 16, 32, 64
  over NK, weights rotated past the L2, beside cuBLAS bf16 `F.linear` on bf16 weights (every pair), tensorwise
  `torch._scaled_mm` (fp8), `torch._int_mm` (w8a8, M > 16) and the portable plan (recipe 2, or recipe 1 past M = 16);
  microseconds, the built-in pick, and a result off the float64 reference by more than 2e-2 (relative) flagged.
  `stream90-quick`: the same at M = 1 and 16; `stream90-w8a16`: w8a16 alone at M = 1, 8, 16, 32.
- `sm90-tail`: the last wave split (split_k 0) on recipes 4 and 5 beside split 1 and the model's pick without it,
  over M in MS x NK, w16a16 / fp8 (tensorwise and rowwise scales) / w8a8 against their anchors; `*` marks the
  built-in pick, `=` the pick without the tail split. `sm90-tail-quick`: M = 1024 and 4096; `sm90-tail-mid`: M =
  128, 256, 384, 512, 768 and 2048.
- `w8a16-sm90`: recipes 7, 8 and 9 (Hopper w8a16) at their splits over M in 32-4096 x NK against cuBLAS bf16 and the
  portable plan; `w8a16-sm90-quick`: M = 256, 1024, 4096; `w8a16-sm90-small`: M = 17, 24, 48, 96;
  `w8a16-sm90-mid`: M = 32-256.
- `stream`: w8a16 recipe 2 in layout nt (the weight-stream kernel) at M = 1 and 16 for each split of SPLITS,
  weights rotated past the L2, against cuBLAS bf16 on the bf16 weights; microseconds and the built-in split.

    PYTHONPATH=.:tests/bench python tests/bench/probe_gemm_plans.py MODE   (MODE: one of the names above)
"""
import statistics
import sys

import torch
import torch.nn.functional as F

from astrai.extension.ops import gemm as ops
from gpu_timing import l2_bytes, time_graph

ops.load()
op = torch.ops.astrai.quant_gemm
NUM_SMS = torch.cuda.get_device_properties(0).multi_processor_count
PLANS = [(0, 1), (0, 2), (0, 4), (3, 1), (3, 2), (3, 4), (1, 1), (1, 2), (1, 4)]
MS = [128, 256, 1024, 4096]
NK = [(4096, 4096), (6144, 4096), (14336, 4096), (4096, 14336), (2112, 7168), (24576, 1536), (7168, 16384),
      (4096, 7168), (7168, 2048)]
SM90_SPLITS = [1, 2, 4, 8]
SPLITS = [1, 2, 3, 4, 6, 8, 11, 12, 14, 16, 19, 24, 32, 48]


def us(fn, sets, calls=10):
    return statistics.median(time_graph(fn, sets, calls, 7))


def grid():
    for m in MS:
        for n, k in NK:
            s16 = (torch.randn(m, k, device="cuda").bfloat16(), torch.randn(n, k, device="cuda").bfloat16())
            s8 = (torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8),
                  torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8))
            a16 = us(lambda s: F.linear(s[0], s[1]), [s16])
            a8 = us(lambda s: torch._int_mm(s[0], s[1].t()), [s8])
            for name, sets, anchor, out in (("w16a16", s16, a16, torch.bfloat16), ("w8a8", s8, a8, torch.int32)):
                row = []
                for recipe, split in PLANS:
                    t = us(lambda s: op(s[0], s[1], None, None, None, out, 0, recipe, split), [sets])
                    row.append(f"{recipe}/{split} {anchor / t:.3f}")
                pick = ops.builtin_plan(m, n, k, name, NUM_SMS)
                print(f"{name} M={m} N={n} K={k} anchor {anchor:.1f} us, built-in {pick[0]}/{pick[1]}: "
                      + "  ".join(row), flush=True)


def stream():
    for n, k in NK:
        sets_needed = max(1, -(-3 * l2_bytes() // (n * k)))
        w8 = [torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8) for _ in range(sets_needed)]
        w16 = [w.bfloat16() for w in w8]
        scale = torch.rand(n, device="cuda") + 0.5
        for m in (1, 16):
            x = torch.randn(m, k, device="cuda").bfloat16()
            anchor = us(lambda w: F.linear(x, w), w16, 20)
            row = []
            for split in SPLITS:
                if split > -(-k // 128):
                    continue
                t = us(lambda w: op(x, w, None, scale, None, torch.bfloat16, 0, 2, split), w8, 20)
                row.append(f"{split}: {t:.2f}")
            pick = ops.builtin_plan(m, n, k, "w8a16", NUM_SMS)[1]
            print(f"w8a16 M={m} N={n} K={k} cuBLAS bf16 {anchor:.2f} us, built-in split {pick}; us per split: "
                  + "  ".join(row), flush=True)


def stream90(ms=(1, 8, 16, 32, 64), nks=NK, pairs=("w16a16", "w8a16", "w8a8", "fp8")):
    e4 = torch.float8_e4m3fn
    one = torch.ones((), device="cuda")
    for n, k in nks:
        sets_needed = max(1, -(-3 * l2_bytes() // (n * k)))
        w8 = [torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8) for _ in range(sets_needed)]
        w16 = [(torch.randn(n, k, device="cuda") / 8).bfloat16() for _ in range(sets_needed)]
        wf = [w.to(e4) for w in w16]
        sb = torch.rand(n, device="cuda") + 0.5
        for m in ms:
            x16 = torch.randn(m, k, device="cuda").bfloat16()
            x8 = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8)
            xf = x16.to(e4)
            sa = torch.rand(m, device="cuda") + 0.5
            bf16 = us(lambda w: F.linear(x16, w), w16, 20)
            cases = [("w16a16", x16, w16, None, None, torch.bfloat16, {}),
                     ("w8a16", x16, w8, None, sb, torch.bfloat16, {}),
                     ("w8a8", x8, w8, sa, sb, torch.bfloat16,
                      {"int_mm": lambda w: torch._int_mm(x8, w.t())} if m > 16 else {}),
                     ("fp8", xf, wf, one.reshape(1), one.reshape(1), torch.bfloat16,
                      {"scaled_mm": lambda w: torch._scaled_mm(xf, w.t(), one, one, out_dtype=torch.bfloat16)})]
            for name, x, ws, a_s, b_s, out, extra in cases:
                if name not in pairs:
                    continue
                row = [f"bf16 {bf16:.2f}"] + [f"{key} {us(fn, ws, 20):.2f}" for key, fn in extra.items()]
                portable = ops.builtin_plan(m, n, k, name, NUM_SMS)
                t = us(lambda w: op(x, w, a_s, b_s, None, out, 0, *portable), ws, 20)
                row.append(f"r{portable[0]}/{portable[1]} {t:.2f}")
                ref = (x.double() @ ws[0].double().t())
                if a_s is not None:
                    ref = ref * (a_s.double().reshape(-1, 1) if a_s.numel() > 1 else a_s.double())
                if b_s is not None:
                    ref = ref * b_s.double()
                for split in SM90_SPLITS:
                    got = op(x, ws[0], a_s, b_s, None, torch.float32, 0, 6, split).double()
                    err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
                    t = us(lambda w: op(x, w, a_s, b_s, None, out, 0, 6, split), ws, 20)
                    row.append(f"6/{split} {t:.2f}" + (f" ERR {err:.1e}" if err > 2e-2 else ""))
                pick = ops.builtin_plan(m, n, k, name, NUM_SMS, sm90=True)
                print(f"{name} M={m} N={n} K={k} built-in {pick[0]}/{pick[1]} us: " + "  ".join(row), flush=True)


def sm90(quick: bool = False):
    """Recipes 4 and 5 (the sm_90a mainloop) at each split of SM90_SPLITS against the anchors and recipe 0;
    `quick`: M = 1024 and 4096, no split."""
    e4 = torch.float8_e4m3fn
    one = torch.ones((), device="cuda")
    splits = [1] if quick else SM90_SPLITS
    for m in [1024, 4096] if quick else [1, 16, 64] + MS:
        for n, k in NK:
            a16, b16 = torch.randn(m, k, device="cuda").bfloat16(), torch.randn(n, k, device="cuda").bfloat16()
            a8 = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8)
            b8 = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8)
            af, bf = a16.to(e4), b16.to(e4)
            cases = [("w16a16", (a16, b16), lambda s: F.linear(s[0], s[1]), None, None, torch.bfloat16),
                     ("fp8", (af, bf), lambda s: torch._scaled_mm(s[0], s[1].t(), one, one, out_dtype=torch.bfloat16),
                      one.reshape(1), one.reshape(1), torch.bfloat16)]
            if m > 16:  # _int_mm needs M > 16
                cases.append(("w8a8", (a8, b8), lambda s: torch._int_mm(s[0], s[1].t()), None, None, torch.int32))
            for name, sets, anchor_fn, sa, sb, out in cases:
                anchor = us(anchor_fn, [sets])
                ref = anchor_fn(sets).double()
                row = [f"r0 {anchor / us(lambda s: op(s[0], s[1], sa, sb, None, out, 0, 0, 1), [sets]):.3f}"]
                for recipe in (4,) if name == "fp8" else (4, 5):  # recipe 5 has no fp8 kernel
                    for split in splits:
                        got = op(sets[0], sets[1], sa, sb, None, out, 0, recipe, split).double()
                        err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
                        t = us(lambda s: op(s[0], s[1], sa, sb, None, out, 0, recipe, split), [sets])
                        row.append(f"{recipe}/{split} {anchor / t:.3f}" + (f" ERR {err:.1e}" if err > 2e-2 else ""))
                print(f"{name} M={m} N={n} K={k} anchor {anchor:.1f} us: " + "  ".join(row), flush=True)


def sm90_tail(ms=(128, 256, 1024, 4096)):
    """The last wave split (split_k = ops.TAIL_SPLIT) on recipes 4 and 5 beside split 1 and the model's pick without
    it, every pair but w8a16 (anchors as `sm90`, fp8 also rowwise scales against rowwise `_scaled_mm`); the built-in
    pick marked. A result off the anchor's by more than 2e-2 (relative) is flagged."""
    e4 = torch.float8_e4m3fn
    one = torch.ones((), device="cuda")
    for m in ms:
        for n, k in NK:
            a16, b16 = torch.randn(m, k, device="cuda").bfloat16(), torch.randn(n, k, device="cuda").bfloat16()
            a8 = torch.randint(-128, 128, (m, k), device="cuda", dtype=torch.int8)
            b8 = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8)
            af, bf = a16.to(e4), b16.to(e4)
            ra, rb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
            cases = [("w16a16", "w16a16", (a16, b16), lambda s: F.linear(s[0], s[1]), None, None, torch.bfloat16),
                     ("fp8", "fp8", (af, bf),
                      lambda s: torch._scaled_mm(s[0], s[1].t(), one, one, out_dtype=torch.bfloat16),
                      one.reshape(1), one.reshape(1), torch.bfloat16),
                     ("fp8_row", "fp8", (af, bf),
                      lambda s: torch._scaled_mm(s[0], s[1].t(), ra, rb, out_dtype=torch.bfloat16),
                      ra.reshape(m), rb.reshape(n), torch.bfloat16),
                     ("w8a8", "w8a8", (a8, b8), lambda s: torch._int_mm(s[0], s[1].t()), None, None, torch.int32)]
            for name, pair, sets, anchor_fn, sa, sb, out in cases:
                anchor = us(anchor_fn, [sets])
                ref = anchor_fn(sets).double()
                pick = ops.builtin_plan(m, n, k, pair, NUM_SMS, sm90=True)
                plain = ops._sm90_plan(m, n, k, pair, NUM_SMS, tail=False)
                plans = [(4, 1), (4, 0)] + ([] if pair == "fp8" else [(5, 1), (5, 0)])
                plans += [p for p in dict.fromkeys((plain, pick)) if p not in plans]
                row = []
                for plan in plans:
                    got = op(sets[0], sets[1], sa, sb, None, out, 0, *plan).double()
                    err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
                    t = us(lambda s: op(s[0], s[1], sa, sb, None, out, 0, *plan), [sets])
                    mark = ("*" if plan == pick else "") + ("=" if plan == plain else "")
                    flag = f" ERR {err:.1e}" if err > 2e-2 else ""
                    row.append(f"{plan[0]}/{plan[1]}{mark} {anchor / t:.3f}{flag}")
                print(f"{name} M={m} N={n} K={k} anchor {anchor:.1f} us: " + "  ".join(row), flush=True)


def w8a16_sm90(ms=(32, 64, 128, 256, 1024, 4096)):
    """Recipes 7 and 9 (splits 1, 2, 4, 8) and 8 (1, 2, 4), Hopper w8a16, against cuBLAS bf16 on the bf16 weights,
    with the portable built-in plan beside them; a result off the float64 reference by more than 2e-2 (relative) is
    flagged. The input of SM90_W8A16_MODEL."""
    for m in ms:
        for n, k in NK:
            x = torch.randn(m, k, device="cuda").bfloat16()
            w = torch.randint(-128, 128, (n, k), device="cuda", dtype=torch.int8)
            sb = torch.rand(n, device="cuda") / 64 + 1e-3
            wb = (w.float() * sb[:, None]).bfloat16()
            sets = [(x, w, wb)]
            ref = (x.double() @ (w.double() * sb.double()[:, None]).t())
            anchor = us(lambda s: F.linear(s[0], s[2]), sets)
            portable = ops.builtin_plan(m, n, k, "w8a16", NUM_SMS)
            row = [f"r{portable[0]}/{portable[1]} {anchor / us(lambda s: op(s[0], s[1], None, sb, None, torch.bfloat16, 0, *portable), sets):.3f}"]
            for recipe, split in ((7, 1), (7, 2), (7, 4), (7, 8), (8, 1), (8, 2), (8, 4),
                                  (9, 1), (9, 2), (9, 4), (9, 8)):
                got = op(x, w, None, sb, None, torch.bfloat16, 0, recipe, split).double()
                err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
                t = us(lambda s: op(s[0], s[1], None, sb, None, torch.bfloat16, 0, recipe, split), sets)
                row.append(f"{recipe}/{split} {anchor / t:.3f}" + (f" ERR {err:.1e}" if err > 2e-2 else ""))
            print(f"w8a16 M={m} N={n} K={k} cuBLAS {anchor:.1f} us: " + "  ".join(row), flush=True)


if __name__ == "__main__":
    modes = {
        "grid": grid, "stream": stream, "stream90": stream90,
        "stream90-quick": lambda: stream90(ms=(1, 16)),
        "stream90-w8a16": lambda: stream90(ms=(1, 8, 16, 32), pairs=("w8a16",)),
        "sm90": sm90, "sm90-quick": lambda: sm90(quick=True),
        "sm90-tail": sm90_tail, "sm90-tail-quick": lambda: sm90_tail(ms=(1024, 4096)),
        "sm90-tail-mid": lambda: sm90_tail(ms=(128, 256, 384, 512, 768, 2048)),
        "w8a16-sm90": w8a16_sm90,
        "w8a16-sm90-quick": lambda: w8a16_sm90(ms=(256, 1024, 4096)),
        "w8a16-sm90-small": lambda: w8a16_sm90(ms=(17, 24, 48, 96)),
        "w8a16-sm90-mid": lambda: w8a16_sm90(ms=(32, 64, 128, 256)),
    }
    modes[sys.argv[1] if len(sys.argv) > 1 else "grid"]()
