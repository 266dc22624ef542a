"""Developer probe of the gemm family on a GPU (not a gated suite): correctness of every pair x recipe x split on
awkward shapes against float64, then CUDA-graph timings (GPU time per call) against cuBLAS bf16 (F.linear) and
torch._int_mm on the Llama shapes, the recipe-0 large-M table and a split-K sweep of the weight stream. The gated
timings are tests/bench/test_bench_gemm.py's (bench_gemm.py).

    python tests/bench/probe_gemm.py          (with the image that serves this GPU; docs/benchmarks.md, GEMM)
"""
import torch

from astrai.extension.ops import gemm as ops

ops.load()
op = torch.ops.astrai.quant_gemm
dev = "cuda"
torch.manual_seed(0)
E4, E5 = torch.float8_e4m3fn, torch.float8_e5m2

def ref(a, b, sa, sb, bias):
    y = a.double() @ b.double().transpose(-1, -2)
    if sa is not None: y = y * sa.double().reshape(-1, 1)
    if sb is not None: y = y * sb.double().reshape(1, -1)
    if bias is not None: y = y + bias.double()
    return y

def make(dt, shape):
    if dt == torch.int8: return torch.randint(-128, 128, shape, device=dev, dtype=torch.int8)
    if dt in (E4, E5): return (torch.randn(shape, device=dev) * 2).to(dt)
    return torch.randn(shape, device=dev, dtype=dt)

pairs = [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16), (torch.bfloat16, torch.int8),
         (torch.float16, torch.int8), (torch.int8, torch.int8), (E4, E4), (E5, E4), (E4, E5)]
fails = 0; n = 0
for (ta, tb) in pairs:
    for (M, N, K) in [(1, 64, 16), (7, 130, 1008), (129, 257, 512), (1000, 300, 272), (64, 4096, 4096)]:
        for recipe in (0, 1, 2):
            for split in (1, 3):
                a = make(ta, (M, K)); b = make(tb, (N, K))
                sa = sb = bias = None
                if tb == torch.int8: sb = torch.rand(N, device=dev) + 0.5
                if ta == torch.int8: sa = torch.rand(M, device=dev) + 0.5
                if ta in (E4, E5): sa = torch.rand(1, device=dev) + 0.5; sb = torch.rand(N, device=dev) + 0.5
                if split == 3: bias = torch.randn(N, device=dev, dtype=torch.float32)
                out = op(a, b, sa, sb, bias, torch.float32, 0, recipe, split)
                r = ref(a, b, sa, sb, bias)
                err = (out.double() - r).abs().max().item(); scale = r.abs().max().item() + 1e-9
                tol = 1e-3 if ta in (torch.int8,) or tb == torch.int8 and ta != torch.int8 else 2e-3
                n += 1
                if not (err / scale < tol) or not torch.isfinite(out).all():
                    fails += 1; print("FAIL", ta, tb, M, N, K, recipe, split, err, scale)
# exact int32
a = make(torch.int8, (33, 784)); b = make(torch.int8, (45, 784))
for split in (1, 4):
    o = op(a, b, None, None, None, torch.int32, 0, 2, split)
    e = (o.cpu().long() - (a.cpu().long() @ b.cpu().long().T)).abs().max().item(); n += 1
    if e != 0: fails += 1; print("FAIL int32 exact", split, e)
# batch broadcast
a = make(torch.bfloat16, (3, 40, 128)); b = make(torch.bfloat16, (96, 128))
o = op(a, b, None, None, None, torch.bfloat16, 0, 1, 1); r = ref(a, b.expand(3, 96, 128), None, None, None)
n += 1
if (o.double() - r).abs().max() > 0.05 * r.abs().max(): fails += 1; print("FAIL batch")
print(f"correctness: {n - fails}/{n} passed")

def bench(f, it=20):
    # CUDA graph of `it` calls: GPU time per call, without the host's dispatch cost.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(3): f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(it): f()
    for _ in range(2): g.replay()
    torch.cuda.synchronize(); st = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(7):
        st.record(); g.replay(); e.record(); torch.cuda.synchronize(); ts.append(st.elapsed_time(e) / it * 1e3)
    return sorted(ts)[3]
F = torch.nn.functional
for (N, K) in [(4096, 4096), (14336, 4096), (4096, 14336)]:
    for M in (1, 16, 64, 128, 1024, 4096):
        x = make(torch.bfloat16, (M, K)); w = make(torch.bfloat16, (N, K)); w8 = make(torch.int8, (N, K))
        sb = torch.rand(N, device=dev) + 0.5
        t_ref = bench(lambda: F.linear(x, w))
        rec, split = ops.builtin_plan(M, N, K, "w8a16", ops.num_sms(x.device))
        t16 = bench(lambda: op(x, w, None, None, None, torch.bfloat16, 0, rec, split))
        t8 = bench(lambda: op(x, w8, None, sb, None, torch.bfloat16, 0, rec, split))
        xi = make(torch.int8, (max(M, 32), K)); sa = torch.rand(max(M, 32), device=dev) + 0.5
        t_int = bench(lambda: torch._int_mm(xi, w8.T))
        t88 = bench(lambda: op(xi, w8, None, None, None, torch.int32, 0, rec if M > 16 else 2, split))
        tb = bench(lambda: w8.view(torch.uint8).clone()) / 2  # read + write of the int8 weight
        print(f"copy-floor(int8 read) {tb:.1f}us N={N} K={K} M={M} rec={rec} split={split}: cublas {t_ref:.1f}us w16a16 {t16:.1f}us ({t_ref/t16:.2f}x) "
              f"w8a16 {t8:.1f}us ({t_ref/t8:.2f}x) | int_mm {t_int:.1f}us w8a8 {t88:.1f}us ({t_int/t88:.2f}x)")

print("--- large M (recipe 0), and the split-K sweep of the weight stream (recipe 2)")
for (N, K) in [(4096, 4096), (14336, 4096), (4096, 14336), (7168, 16384)]:
    for M in (1024, 4096, 8192):
        x = make(torch.bfloat16, (M, K)); w = make(torch.bfloat16, (N, K)); w8 = make(torch.int8, (N, K)); sb = torch.rand(N, device=dev) + 0.5
        t_ref = bench(lambda: F.linear(x, w))
        r = bench(lambda: op(x, w, None, None, None, torch.bfloat16, 0, 0, 1))
        r8 = bench(lambda: op(x, w8, None, sb, None, torch.bfloat16, 0, 0, 1))
        print(f"N={N} K={K} M={M}: cublas {t_ref:.1f} | w16a16 {t_ref/r:.2f}x | w8a16 {t_ref/r8:.2f}x")
    for M in (1, 16):
        x = make(torch.bfloat16, (M, K)); w = make(torch.bfloat16, (N, K)); w8 = make(torch.int8, (N, K)); sb = torch.rand(N, device=dev) + 0.5
        t_ref = bench(lambda: F.linear(x, w)); tb = bench(lambda: w8.view(torch.uint8).clone()) / 2
        res = []
        for split in (1, 2, 4, 8, 16):
            res.append(f"s{split} {bench(lambda: op(x, w8, None, sb, None, torch.bfloat16, 0, 2, split)):.1f}")
        print(f"N={N} K={K} M={M}: cublas {t_ref:.1f}us floor {tb:.1f}us w8a16 rec2 " + " ".join(res))
