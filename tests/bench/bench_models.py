"""End-to-end model benchmark (not gated): a Llama-3-8B-shaped transformers model with fewer layers, randomly
initialised from the real configuration (nothing is downloaded), under four setups timed in one run:

  hf       transformers + sdpa + bf16 nn.Linear (cuBLAS): the baseline a user has
  bf16     attn_implementation="astrai" (our attention), bf16 nn.Linear (cuBLAS)
  w16a16   ours, every linear on our bf16 GEMM (`quant_gemm` pair w16a16, through `OurBf16Linear` below)
  w8a16    ours + quantize_linear_(model, "w8a16") (every linear, lm_head included)
  fp8      ours + quantize_linear_(model, "fp8")
  w8a16-fused, fp8-fused   the same with fuse=True: q / k / v and gate / up stacked, one GEMM each (4 a layer, not 7)
  w8a16-fused-rope, fp8-fused-rope   and the rotary embedding on our kernel (astrai_hf.patch_rotary(); transformers'
           own apply_rotary_pos_emb is ~10 elementwise kernels a layer at batch 1)
  w8a16-fused-rope-prefetch   and, after each quantized GEMM, a side stream asking the L2 for the next GEMM's
           weight (`ops.gemm.l2_prefetch`, up to half the L2 of it; `WeightPrefetch` below, bench-only wiring of an
           experiment) while the norms, rotary and attention run; joined before that GEMM

Per setup and batch (1, 8, 64): prefill tokens/s (one forward over `PROMPT` tokens a sequence, DynamicCache) and
decode tokens/s, each two ways: eager (what `model(...)` costs as written, host included) and graphed (a StaticCache
decode step captured in a CUDA graph and replayed: the GPU's time; skipped with the error where capture fails).
Then one graphed decode step per setup at batch 1 and 64 under torch.profiler, its CUDA time split into attention,
GEMM and the rest by kernel name (the unclassified names printed); at batch 1 also one eager prefill's CUDA time by
part, the eager decode step's CUDA time by part against its wall time, and its host time by Python function
(cProfile); last, one training step (forward and backward)
of two such layers in bf16 against fp8_autocast's recipes. Writes `$OUT/models.json` when OUT is set.

    PYTHONPATH=.:tests/bench python tests/bench/bench_models.py [quick] [--setups=hf,w8a16,...] [--batches=1,8]
        # from the repository root, on a GPU; models.json is rewritten after every row ("complete": false until the end)
    PYTHONPATH=.:tests/bench python tests/bench/bench_models.py static      # decode through generate() with a
        StaticCache, which transformers compiles itself (the graphed path a user has): hf, w8a16, w8a16-fused-rope at
        batch 1, $OUT/models_static.json
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parents[1]),
                str(Path(__file__).resolve().parent)]
import torch  # noqa: E402
from support.bitwise import GraphReplay  # noqa: E402

import gpu_timing  # noqa: E402

DEVICE = "cuda"
LAYERS = 8
PROMPT = 512
DECODE_STEPS = 32
BATCHES = (1, 8, 64)
LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=128, rope_theta=500000.0, rms_norm_eps=1e-5, vocab_size=128256, num_hidden_layers=LAYERS,
                 max_position_embeddings=8192, pad_token_id=0)
SETUPS = ("hf", "bf16", "w16a16", "w8a16", "fp8", "w8a16-fused", "fp8-fused", "w8a16-fused-rope", "fp8-fused-rope",
          "w8a16-fused-rope-prefetch")
# Kernel-name fragments of each part of a decode step (lower case); anything else is "rest".
ATTENTION_KERNELS = ("attn", "flash", "fmha", "sdpa", "softmax", "attention")
GEMM_KERNELS = ("gemm", "gemv", "cutlass", "xmma", "nvjet", "quant_gemm", "splitk", "sm90_", "sm80_")


class OurBf16Linear(torch.nn.Module):
    """An nn.Linear's bf16 weight and bias on `quant_gemm` (pair w16a16, the plan chain's choice)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x):
        import astrai.extension as ae
        y = ae.quant_gemm(x.reshape(-1, x.shape[-1]), self.weight, bias=self.bias, out_dtype=x.dtype)
        return y.reshape(*x.shape[:-1], self.weight.shape[0])


def prefetch_run(nbytes: int, budget: float) -> int:
    """`run` of `ops.gemm.l2_prefetch(w, run=run, period=4096)` asking the L2 for at most `budget` bytes of a weight of
    `nbytes`: all of it (4096 of every 4096) when it fits, else the same share of every 4 KB (uniform over the GEMM's
    CTAs), at least 16 bytes."""
    fraction = min(1.0, budget / max(nbytes, 1))
    return 4096 if fraction >= 1.0 else max(16, int(4096 * fraction) // 16 * 16)


class WeightPrefetch:
    """Bench-only wiring of `ops.gemm.l2_prefetch` into the quantized linears (process-wide while installed): the
    first forward after `install()` records the order in which the GEMMs read their weights (a fused group's stacked
    buffer once); from then on, right after each GEMM a side stream asks the L2 for the next weight in that order
    (whole, or the first `run` bytes of every 4 KB so that at most `share` of the L2 is asked for), and the main
    stream joins the side stream before that next GEMM (CUDA graphs need every fork joined; the request kernel ends
    once its requests are out, so the join waits for little). The last GEMM of a forward prefetches nothing (its
    successor is the next forward's first, outside a captured step)."""

    def __init__(self, share: float = 0.5):
        self.share, self.order, self.recording, self.side, self.original = share, [], True, None, None
        self.following = {}  # once recorded: a weight's data_ptr -> (the next GEMM's weight, its prefetch run)
        self.pending = False  # a prefetch issued and not yet joined (only joined then: no wait on an event that
        #                       was recorded outside a capture in progress)

    def install(self) -> None:
        from astrai.extension.backend import linear as lin
        from astrai.extension.ops import gemm as ops_gemm
        if self.original is not None:
            return
        self.original, self.side = lin.QuantLinear._gemm, torch.cuda.Stream()
        budget = self.share * gpu_timing.l2_bytes()
        this = self

        def _gemm(module, x, weight, scale, bias):
            if torch.compiler.is_compiling():
                return this.original(module, x, weight, scale, bias)
            main = torch.cuda.current_stream()
            if this.pending:  # the prefetch issued after the previous GEMM
                main.wait_stream(this.side)
                this.pending = False
            y = this.original(module, x, weight, scale, bias)
            key = weight.data_ptr()
            if this.recording:
                if this.order and this.order[0][0] == key:  # the second forward began: the order is known
                    this.recording = False
                    for (k, _), (_, nxt) in zip(this.order, this.order[1:]):
                        this.following.setdefault(k, (nxt, prefetch_run(nxt.numel() * nxt.element_size(), budget)))
                else:
                    this.order.append((key, weight))
                    return y
            found = this.following.get(key)
            if found is None:  # the last GEMM of a forward, or one not seen while recording
                return y
            nxt, run = found
            this.side.wait_stream(main)
            with torch.cuda.stream(this.side):
                ops_gemm.l2_prefetch(nxt, run=run, period=4096)
            this.pending = True
            return y

        lin.QuantLinear._gemm = _gemm

    def uninstall(self) -> None:
        from astrai.extension.backend import linear as lin
        if self.original is not None:
            lin.QuantLinear._gemm = self.original
            self.original = None


_prefetch: WeightPrefetch | None = None


def reset_patches() -> None:
    """Undo what `build` patched process-wide (our rotary, the weight prefetch)."""
    global _prefetch
    import astrai.integrations.transformers as astrai_hf
    astrai_hf.unpatch_rotary()
    if _prefetch is not None:
        _prefetch.uninstall()
        _prefetch = None


def base_model():
    """The benchmark's model: Llama-3-8B-shaped, LAYERS layers, random weights (seed 0), bf16, on DEVICE; our attention
    registered with transformers."""
    import transformers

    import astrai.integrations.transformers as astrai_hf
    astrai_hf.register()
    torch.manual_seed(0)
    with torch.device(DEVICE):
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA3_8B)).to(torch.bfloat16).eval()


def build(setup: str, base):
    """The setup's model. `astrai_hf.patch_rotary()` and the weight prefetch are process-wide: this installs them for a
    "-rope" / "-prefetch" setup and removes them otherwise, so build each setup right before timing it (as `main`
    does; `reset_patches()` after the last)."""
    import astrai.extension as ae
    import astrai.integrations.transformers as astrai_hf
    global _prefetch
    mode, *features = setup.split("-")
    reset_patches()
    if "rope" in features:
        astrai_hf.patch_rotary()
    if "prefetch" in features:
        _prefetch = WeightPrefetch()
        _prefetch.install()
    model = copy.deepcopy(base)
    model.set_attn_implementation("sdpa" if setup == "hf" else "astrai")
    if mode in ("w8a16", "fp8"):
        ae.quantize_linear_(model, mode, fuse="fused" in features)
    elif setup == "w16a16":
        for name, module in list(model.named_modules()):
            if type(module) is torch.nn.Linear:
                parent, _, child = name.rpartition(".")
                setattr(model.get_submodule(parent), child, OurBf16Linear(module))
    return model


def timed(fn, repeats: int = 5) -> float:
    """Median seconds of fn() (synchronized), after one warm-up call."""
    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def prefill_eager(model, batch: int) -> float:
    ids = torch.randint(1, 32000, (batch, PROMPT), device=DEVICE)
    with torch.inference_mode():
        return batch * PROMPT / timed(lambda: model(input_ids=ids, use_cache=True))


def decode_eager(model, batch: int) -> float:
    from transformers import DynamicCache
    ids = torch.randint(1, 32000, (batch, PROMPT), device=DEVICE)
    nxt = torch.randint(1, 32000, (batch, 1), device=DEVICE)

    def run():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(DECODE_STEPS):
            model(input_ids=nxt, past_key_values=cache, use_cache=True)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    with torch.inference_mode():
        run()
        seconds = statistics.median(run() for _ in range(3))
    return batch * DECODE_STEPS / seconds


def decode_graph(model, batch: int):
    """(tokens/s, replay callable) of a StaticCache decode step at position PROMPT captured in a CUDA graph."""
    from transformers import StaticCache
    max_len = PROMPT + DECODE_STEPS + 8
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    ids = torch.randint(1, 32000, (batch, PROMPT), device=DEVICE)
    nxt = torch.randint(1, 32000, (batch, 1), device=DEVICE)
    position = torch.tensor([PROMPT], device=DEVICE)
    with torch.inference_mode():
        model(input_ids=ids, past_key_values=cache, use_cache=True,
              cache_position=torch.arange(PROMPT, device=DEVICE))
        graph = GraphReplay(lambda: model(input_ids=nxt, past_key_values=cache, use_cache=True,
                                          cache_position=position).logits).graph
    replays = 20
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / replays
    return batch / seconds, graph.replay


def decode_static_generate(model, batch: int) -> float:
    """Decode tokens/s as a user gets a graphed decode: `model.generate` with a StaticCache, which transformers
    compiles on its own (its default CompileConfig: torch.compile with CUDA graphs). The time of a generate of
    2 x DECODE_STEPS new tokens less one of DECODE_STEPS (same prompt, same cache, reset): prefill and the first
    calls' compilation fall out."""
    from transformers import StaticCache
    ids = torch.randint(1, 32000, (batch, PROMPT), device=DEVICE)
    mask = torch.ones_like(ids)
    cache = StaticCache(config=model.config, max_cache_len=PROMPT + 2 * DECODE_STEPS + 8)

    def run(new_tokens: int) -> float:
        cache.reset()
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False)
        torch.cuda.synchronize()
        return time.perf_counter() - start

    with torch.inference_mode():
        run(DECODE_STEPS)  # compile and record the graphs
        run(2 * DECODE_STEPS)
        short = statistics.median(run(DECODE_STEPS) for _ in range(3))
        long = statistics.median(run(2 * DECODE_STEPS) for _ in range(3))
    return batch * DECODE_STEPS / (long - short)


def static_generate(setups=("hf", "w8a16", "w8a16-fused-rope"), batches=(1,)) -> list[dict]:
    """`decode_static_generate` per setup (each compiles its model: ~a minute a setup; not in the default run)."""
    base = base_model()
    rows = []
    print("\ndecode tokens/s through generate(past_key_values=StaticCache(...)) (transformers compiles the step)")
    for setup in setups:
        model = build(setup, base)
        for batch in batches:
            row = {"setup": setup, "batch": batch}
            try:
                row["decode_static_generate"] = decode_static_generate(model, batch)
                print(f"{setup:16} {batch:>3} | {row['decode_static_generate']:9.0f}", flush=True)
            except Exception as exc:
                row["decode_static_generate_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                print(f"{setup:16} {batch:>3} | failed: {row['decode_static_generate_error']}", flush=True)
            rows.append(row)
        del model
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    reset_patches()
    return rows


def kernel_parts(prof, runs: int) -> dict:
    """CUDA microseconds a run by part (attention / GEMM / rest, by kernel name) from a torch.profiler trace of `runs`
    runs, with the largest unclassified and GEMM kernels."""
    parts = {"attention": 0.0, "gemm": 0.0, "rest": 0.0}
    named = {"rest": {}, "gemm": {}}
    for event in prof.key_averages():
        us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)
        if not us:
            continue
        name = event.key.lower()
        part = ("attention" if any(f in name for f in ATTENTION_KERNELS) else
                "gemm" if any(f in name for f in GEMM_KERNELS) else "rest")
        parts[part] += us / runs
        if part in named:
            named[part][event.key[:80]] = named[part].get(event.key[:80], 0.0) + us / runs
    parts["rest_top"] = sorted(named["rest"].items(), key=lambda kv: -kv[1])[:6]
    parts["gemm_top"] = sorted(named["gemm"].items(), key=lambda kv: -kv[1])[:6]
    return parts


def breakdown(replay) -> dict:
    """CUDA microseconds of one replayed decode step by part, and the unclassified kernel names."""
    from torch.profiler import ProfilerActivity, profile
    replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            replay()
        torch.cuda.synchronize()
    return kernel_parts(prof, 5)


def prefill_breakdown(model, batch: int = 1) -> dict:
    """CUDA microseconds of one eager prefill forward (PROMPT tokens a sequence) by part: where a slow prefill's GPU
    time goes (its host time is the rest of `prefill_eager`'s)."""
    from torch.profiler import ProfilerActivity, profile
    ids = torch.randint(1, 32000, (batch, PROMPT), device=DEVICE)
    with torch.inference_mode():
        model(input_ids=ids, use_cache=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            model(input_ids=ids, use_cache=True)
            torch.cuda.synchronize()
    return kernel_parts(prof, 1)


def _next_decode_step(model, batch: int):
    """Under inference_mode: a DynamicCache filled by a PROMPT-token prefill and one decode step (warm), and a callable
    that runs the next eager decode step on it."""
    from transformers import DynamicCache
    ids = torch.randint(1, 32000, (batch, PROMPT), device=DEVICE)
    nxt = torch.randint(1, 32000, (batch, 1), device=DEVICE)
    cache = DynamicCache(config=model.config)
    model(input_ids=ids, past_key_values=cache, use_cache=True)
    model(input_ids=nxt, past_key_values=cache, use_cache=True)
    torch.cuda.synchronize()
    return lambda: model(input_ids=nxt, past_key_values=cache, use_cache=True)


def decode_eager_breakdown(model, batch: int = 1, steps: int = 4) -> dict:
    """CUDA microseconds of one eager DynamicCache decode step by part, its kernel count and its wall time: GPU busy
    time near the wall time means the eager step is GPU-bound (extra or slower kernels), far below it host-bound."""
    from torch.profiler import ProfilerActivity, profile
    with torch.inference_mode():
        step = _next_decode_step(model, batch)
        start = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall_us = (time.perf_counter() - start) / steps * 1e6
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
    parts = kernel_parts(prof, steps)
    parts["kernels_a_step"] = sum(e.count for e in prof.key_averages()
                                  if (getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0.0))) / steps
    parts["wall_us"] = wall_us
    return parts


def host_profile(model, batch: int = 1, steps: int = 8) -> list:
    """The eager decode step's host time by Python function (cProfile, `steps` DynamicCache steps after a warm-up):
    the 12 largest (function, own µs a step, calls a step)."""
    import cProfile
    import pstats

    with torch.inference_mode():
        step = _next_decode_step(model, batch)
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        profiler.disable()
    stats = pstats.Stats(profiler).stats
    rows = [(f"{Path(f).name}:{line}({fn})", own / steps * 1e6, calls / steps)
            for (f, line, fn), (_, calls, own, _, _) in stats.items()]
    return sorted(rows, key=lambda r: -r[1])[:12]


def training_steps(layers: int = 2, batch: int = 4, seq: int = 1024) -> dict:
    """Milliseconds of one training step (forward, backward, no optimizer) of a Llama-3-8B-shaped model with `layers`
    layers (sdpa attention: ours has no backward), bf16 against fp8_autocast's recipes, and the ratio."""
    import transformers

    import astrai.extension as ae
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**{**LLAMA3_8B, "num_hidden_layers": layers, "vocab_size": 32000},
                                      attn_implementation="sdpa")
    with torch.device(DEVICE):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).train()
    ids = torch.randint(1, 32000, (batch, seq), device=DEVICE)
    results = {}
    for name, ctx in (("bf16", None), ("fp8 delayed", ae.fp8_autocast(recipe=ae.DelayedScaling())),
                      ("fp8 dynamic", ae.fp8_autocast(recipe=ae.DynamicScaling())),
                      ("fp8 dynamic-row", ae.fp8_autocast(recipe=ae.DynamicScaling("row"))),
                      ("fp8 delayed, _scaled_mm", ae.fp8_autocast(recipe=ae.DelayedScaling(), gemm="scaled_mm"))):
        def step():
            model.zero_grad(set_to_none=True)
            if ctx is None:
                loss = model(input_ids=ids, labels=ids).loss
            else:
                with ctx:
                    loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
        try:
            results[name] = timed(step) * 1e3
        except Exception as exc:
            results[name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    print(f"\ntraining step, {layers} Llama-3-8B layers, batch {batch} x {seq} tokens (forward + backward), ms:")
    for name, ms in results.items():
        ratio = f"{results['bf16'] / ms:.2f}x bf16" if isinstance(ms, float) and isinstance(results["bf16"], float) \
            else ""
        print(f"  {name:24} {ms if isinstance(ms, str) else f'{ms:8.2f}'}  {ratio}")
    return results


def require_kernels(setups) -> None:
    """Every setup but hf times our kernels: refuse to run them on torch's fallback paths, which the setups would
    otherwise take silently (a device call without the image carried once timed those as "w8a16", 0.24x hf)."""
    if all(setup == "hf" for setup in setups):
        return
    from astrai.extension import loader
    missing = []
    for family in ("gemm", "attention", "rotary", "quantize"):
        try:
            loader.load_family(family)
        except Exception as exc:  # FamilyUnavailableError and anything else that keeps the family off the GPU
            missing.append(f"{family}: {str(exc).splitlines()[0]}")
    chosen = loader.describe().get("chosen") or {}
    if not missing and not chosen.get("serves"):  # loaded for registration only: no code for this GPU
        missing.append(f"image {chosen.get('image')} has no code for this device")
    if missing:
        raise SystemExit("bench_models: the setups other than hf run our kernels, not served here: "
                         + "; ".join(missing)
                         + " (carry astrai/extension/lib/<image> into the device call, or time --setups=hf only)")


def main(argv: list[str]) -> int:
    import transformers

    if argv[:1] == ["static"]:  # only the user's graphed path (compiles every setup's model)
        require_kernels(("w8a16",))
        record = {"environment": gpu_timing.environment(), "layers": LAYERS, "prompt": PROMPT,
                  "decode_steps": DECODE_STEPS, "static_generate": static_generate()}
        if os.environ.get("OUT"):
            Path(os.environ["OUT"], "models_static.json").write_text(json.dumps(record, indent=1, default=str))
        return 0
    quick = argv[:1] == ["quick"]
    batches = (1, 64) if quick else BATCHES
    setups = SETUPS
    for arg in argv:  # --setups=a,b (in that order) and --batches=1,8: a subset first, under a device call's limit
        if arg.startswith("--setups="):
            setups = tuple(arg.split("=", 1)[1].split(","))
            unknown = [x for x in setups if x not in SETUPS]
            if unknown:
                raise SystemExit(f"bench_models: unknown setups {unknown}; known: {', '.join(SETUPS)}")
        elif arg.startswith("--batches="):
            batches = tuple(int(b) for b in arg.split("=", 1)[1].split(","))
    require_kernels(setups)
    out = os.environ.get("OUT")
    base = base_model()
    record = {"environment": gpu_timing.environment(), "layers": LAYERS, "prompt": PROMPT,
              "decode_steps": DECODE_STEPS, "transformers": transformers.__version__, "rows": [], "complete": False}
    print(f"Llama-3-8B-shaped, {LAYERS} layers, prompt {PROMPT}, {DECODE_STEPS} decode steps; tokens/s")
    print(f"{'setup':16} {'B':>3} | {'prefill':>9} {'decode eager':>12} {'decode graph':>12}")
    breakdowns = {}
    for setup in setups:
        model = build(setup, base)
        for batch in batches:
            row = {"setup": setup, "batch": batch}
            for key, fn in (("prefill", prefill_eager), ("decode_eager", decode_eager)):
                try:
                    row[key] = fn(model, batch)
                except Exception as exc:  # report and go on: one setup's failure must not hide the others
                    row[key] = None
                    row[key + "_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            if batch == 1:  # where the batch-1 eager time goes: the prefill's GPU parts, the decode step's host
                for key, fn in (("prefill_breakdown", prefill_breakdown), ("decode_eager_breakdown", decode_eager_breakdown),
                                ("host_top", host_profile)):
                    try:
                        row[key] = fn(model)
                    except Exception as exc:
                        row[key + "_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            try:
                row["decode_graph"], replay = decode_graph(model, batch)
                if batch in (1, 64):
                    breakdowns[(setup, batch)] = row["breakdown"] = breakdown(replay)
            except Exception as exc:
                row["decode_graph"] = None
                row["decode_graph_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                traceback.print_exc(limit=3)
            record["rows"].append(row)
            cells = [f"{row[k]:>{w}.0f}" if row[k] else f"{'failed':>{w}}"
                     for k, w in (("prefill", 9), ("decode_eager", 12), ("decode_graph", 12))]
            errors = "".join(f"  [{k}: {v}]" for k, v in row.items() if k.endswith("error"))
            print(f"{setup:16} {batch:>3} | {' '.join(cells)}{errors}", flush=True)
            if out:  # after every row: a call cut off by its time limit still leaves the rows it timed
                Path(out, "models.json").write_text(json.dumps(record, indent=1, default=str))
        del model
        torch.cuda.empty_cache()
    reset_patches()
    base_rows = {r["batch"]: r for r in record["rows"] if r["setup"] == "hf"}
    # hf's own best decode (eager or graphed: at batch 64 transformers' graphed sdpa step has run slower than its
    # eager one) is the fair baseline for our graphed decode; both are printed.
    print("\nratios to hf (same batch): prefill, decode eager, decode graph, decode graph vs hf's best decode")
    for r in record["rows"]:
        if r["setup"] == "hf":
            continue
        b = base_rows.get(r["batch"], {})
        ratio = lambda key: (f"{r[key] / b[key]:.2f}x" if r.get(key) and b.get(key) else "-")  # noqa: E731
        hf_best = max((b[key] for key in ("decode_eager", "decode_graph") if b.get(key)), default=None)
        r["decode_graph_vs_hf_best"] = r["decode_graph"] / hf_best if r.get("decode_graph") and hf_best else None
        best = f"{r['decode_graph_vs_hf_best']:.2f}x" if r["decode_graph_vs_hf_best"] else "-"
        print(f"{r['setup']:16} {r['batch']:>3} | {ratio('prefill'):>7} {ratio('decode_eager'):>7} "
              f"{ratio('decode_graph'):>7} {best:>7}")
    print("\ngraphed decode step, CUDA microseconds: attention / GEMM / rest (top unclassified kernels)")
    for (setup, batch), parts in breakdowns.items():
        print(f"{setup:16} {batch:>3} | {parts['attention']:8.1f} {parts['gemm']:8.1f} {parts['rest']:8.1f}  "
              + "; ".join(f"{n} {us:.1f}" for n, us in parts["rest_top"][:3]))
    print("\neager prefill at B = 1, CUDA microseconds: attention / GEMM / rest (top GEMM kernels)")
    for r in record["rows"]:
        parts = r.get("prefill_breakdown")
        if parts:
            print(f"{r['setup']:16} | {parts['attention']:8.1f} {parts['gemm']:8.1f} {parts['rest']:8.1f}  "
                  + "; ".join(f"{n} {us:.1f}" for n, us in parts["gemm_top"][:3]))
    print("\neager decode step at B = 1: wall µs, CUDA µs attention / GEMM / rest, kernels a step")
    for r in record["rows"]:
        parts = r.get("decode_eager_breakdown")
        if parts:
            print(f"{r['setup']:16} | {parts['wall_us']:8.0f} {parts['attention']:8.1f} {parts['gemm']:8.1f} "
                  f"{parts['rest']:8.1f} {parts['kernels_a_step']:6.0f}")
    print("\neager decode step at B = 1, host: the largest functions (own µs a step, calls a step)")
    for r in record["rows"]:
        if r.get("host_top"):
            print(f"{r['setup']}: " + "; ".join(f"{n} {us:.0f} ({calls:g})" for n, us, calls in r["host_top"][:8]))
    record["training"] = training_steps()
    record["complete"] = True
    if out:
        Path(out, "models.json").write_text(json.dumps(record, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
