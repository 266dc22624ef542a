"""Probe (GPU): host time a call of our eager Python paths, beside the torch calls a model would make instead.

    python tests/bench/probe_host_cost.py
    python tests/bench/probe_host_cost.py cpu      # no GPU: the ops' argument checks alone (below)

Small shapes (M = 1, 1024 x 1024 weights, one decode step of 8 sequences) so that the GPU keeps up with the host:
each case runs `CALLS` calls back to back; "host" is the loop's time before the final synchronize (what the Python
path costs the caller), "wall" includes the synchronize. Eager decoding calls every linear, rotary and attention of
every layer once a token, so these microseconds multiply by ~7 linears + 1 attention + 1 rotary a layer.
Reference for docs/benchmarks.md ("Host cost of the eager paths"); not a gate.

`cpu`: the ops' CPU registrations with valid CPU operands run every argument check a CUDA call runs, then refuse the
device (an exception, caught here): the same refusal in every image, so comparing two images (`ASTRAI_IMAGE`) times
what their passing checks cost. No GPU needed.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

import astrai.extension as ae
from astrai.extension import loader
from astrai.extension.backend import gemm as gemm_backend
from astrai.extension.ops import gemm as gemm_ops
from astrai.extension.ops import gemm_plan

CALLS = 2000
DEVICE = "cuda"


def host_us(fn, calls: int = CALLS, repeats: int = 5) -> tuple[float, float]:
    hosts, walls = [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        hosts.append((t1 - t0) / calls * 1e6)
        walls.append((t2 - t0) / calls * 1e6)
    return statistics.median(hosts), statistics.median(walls)


def main() -> None:
    torch.manual_seed(0)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    lin = torch.nn.Linear(1024, 1024, bias=False).to(DEVICE, torch.bfloat16)
    x = torch.randn(1, 1024, device=DEVICE, dtype=torch.bfloat16)
    cases = {"F.linear bf16 (cuBLAS)": lambda: F.linear(x, lin.weight),
             "nn.Linear bf16 (module call)": lambda: lin(x)}
    for mode in ("w8a16", "w8a8", "fp8"):
        q = ae.quantize_linear_(torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False)).to(DEVICE, torch.bfloat16),
                                mode)[0]
        cases[f"{type(q).__name__} (fast path)"] = (lambda q=q: q(x))
    class Qkv(torch.nn.Module):  # a layer's q / k / v, called as transformers calls them
        def __init__(self):
            super().__init__()
            self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(1024, n, bias=False) for n in (1024, 256, 256))

        def forward(self, h):
            return self.q_proj(h), self.k_proj(h), self.v_proj(h)

    for fuse in (False, True):
        qkv = ae.quantize_linear_(Qkv().to(DEVICE, torch.bfloat16), "w8a16", fuse=fuse)
        cases[f"q / k / v W8A16Linear, fuse={fuse} (3 calls)"] = (lambda qkv=qkv: qkv(x))
    w8 = ae.W8A16Linear.from_linear(lin)
    cases["quant_gemm w8a16 (public, checked)"] = lambda: ae.quant_gemm(x, w8.weight, b_scale=w8.weight_scale)
    cases["ops.gemm.quant_gemm w8a16 (op wrapper)"] = lambda: gemm_ops.quant_gemm(x, w8.weight,
                                                                                 b_scale=w8.weight_scale)
    # The op alone, its plan given (the C++ side: dispatcher, checks, output, launch), beside the stable-ABI op with
    # no tensors (the dispatcher's floor for our ops) and torch's own mm through torch.ops.
    recipe, split = gemm_plan.plan_call(x, w8.weight, None, w8.weight_scale, None, torch.bfloat16, 0, None, False)
    op = torch.ops.astrai.quant_gemm.default
    cases[f"op quant_gemm w8a16, plan ({recipe}, {split}) given"] = lambda: op(
        x, w8.weight, None, w8.weight_scale, None, torch.bfloat16, 0, recipe, split)
    cases["op quant_gemm w8a16 (the packet), plan given"] = lambda: torch.ops.astrai.quant_gemm(
        x, w8.weight, None, w8.weight_scale, None, torch.bfloat16, 0, recipe, split)
    cases["op quant_gemm w16a16, plan (2, 1) given"] = lambda: op(x, lin.weight, None, None, None, torch.bfloat16, 0,
                                                                  2, 1)
    cases["op quant_gemm_set_pdl (no tensors)"] = lambda: torch.ops.astrai.quant_gemm_set_pdl.default(True)
    cases["torch.ops.aten.mm.default bf16"] = lambda: torch.ops.aten.mm.default(x, lin.weight.t())
    cases["gemm_backend.validate + cuda_blocker"] = lambda: (
        gemm_backend.validate("probe", x, w8.weight, None, w8.weight_scale, None, torch.bfloat16, 0, None),
        gemm_backend.cuda_blocker(x, w8.weight, b_scale=w8.weight_scale))
    q4 = torch.randn(8, 1, 32, 128, device=DEVICE, dtype=torch.bfloat16)
    kv = torch.randn(8, 512, 8, 128, device=DEVICE, dtype=torch.bfloat16)
    cases["attention decode (ours, policy + op)"] = lambda: ae.attention(q4, kv, kv)
    cases["op attn_decode alone (split 0: the op's own)"] = lambda: torch.ops.astrai.attn_decode.default(
        q4.view(8, 32, 128), kv, kv, None, None, 128 ** -0.5, 0)
    qt, kt = q4.transpose(1, 2), kv.transpose(1, 2)
    cases["F.scaled_dot_product_attention (GQA)"] = lambda: F.scaled_dot_product_attention(qt, kt, kt,
                                                                                          enable_gqa=True)
    cos, sin = ae.rotary_cos_sin_cache(4096, 128, device=DEVICE)
    pos = torch.full((8, 1), 100, device=DEVICE, dtype=torch.int64)
    cases["apply_rotary_emb (ours)"] = lambda: ae.apply_rotary_emb(q4, (cos, sin), pos, check_positions=False)
    with torch.inference_mode():
        for fn in cases.values():
            fn()  # warm: plans, fast-path keys, lazy loads
        print("libraries: " + ", ".join(sorted(set(loader.loaded_families().values()))))
        print(f"{'case':44s} {'host us/call':>12s} {'wall us/call':>12s}")
        for name, fn in cases.items():
            host, wall = host_us(fn)
            print(f"{name:44s} {host:12.2f} {wall:12.2f}")


def checks_on_cpu(calls: int = 20000, repeats: int = 5) -> None:
    """Host us a call of the ops' CPU registrations (checks, then the device refusal), median of `repeats` loops."""
    from astrai.extension.ops import attention as attention_ops
    gemm_ops.load()
    attention_ops.load()
    x = torch.randn(1, 1024, dtype=torch.bfloat16)
    w = torch.zeros(1024, 1024, dtype=torch.int8)
    scale = torch.ones(1024)
    q = torch.randn(8, 32, 128, dtype=torch.bfloat16)
    kv = torch.randn(8, 512, 8, 128, dtype=torch.bfloat16)
    cases = {"quant_gemm w8a16 (1 x 1024 x 1024)": lambda: torch.ops.astrai.quant_gemm.default(
                 x, w, None, scale, None, torch.bfloat16, 0, 2, 1),
             "attn_decode (8 x 32 x 128, L 512)": lambda: torch.ops.astrai.attn_decode.default(
                 q, kv, kv, None, None, 128 ** -0.5, 0),
             "quant_gemm_set_pdl (no tensors, no refusal)": lambda: torch.ops.astrai.quant_gemm_set_pdl.default(True)}

    def loop(fn, n):
        t0 = time.perf_counter()
        for _ in range(n):
            try:
                fn()
            except RuntimeError:  # "a must be a CUDA tensor": after every other check passed
                pass
        return (time.perf_counter() - t0) / n * 1e6

    print("libraries: " + ", ".join(sorted(set(loader.loaded_families().values()))))
    print(f"{'case (CPU registration)':44s} {'host us/call':>12s}")
    for name, fn in cases.items():
        loop(fn, calls // 10)
        print(f"{name:44s} {statistics.median(loop(fn, calls) for _ in range(repeats)):12.2f}")


if __name__ == "__main__":
    import sys
    checks_on_cpu() if sys.argv[1:] == ["cpu"] else main()
