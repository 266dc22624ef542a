"""Timing and machine record shared by the benchmark scripts (shared/MEASURE.md's method).

`time_graph` times CUDA-graph replays of many calls with CUDA events (`time_graphs`: several steps, their replays
interleaved); `time_copy` the device copy that is the memory-bound ceiling, `time_gemm` the cuBLAS bf16 GEMM that
is the compute-bound one; `summarize` folds repeated
runs of one case into the record the pytest-benchmark suites store; `environment` is the record (GPU, driver,
CUDA, torch, image, clocks, commit, date) written beside every result; `commit` says which commit a result
belongs to where the tree has no git.
"""

from __future__ import annotations

import collections
import datetime
import math
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from astrai.extension import loader


def l2_bytes() -> int:
    """The current device's L2 size; input sets are rotated past it for memory-bound cases."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 0) or 60 << 20)


def time_graph(step, sets: list, calls: int, replays: int) -> list[float]:
    """Microseconds per call for each replay of a graph of `calls` calls of step(set) over the sets in turn."""
    return time_graphs({"step": step}, sets, calls, replays)["step"]


def time_graphs(steps: dict, sets: list, calls: int, replays: int) -> dict[str, list[float]]:
    """`time_graph` for several steps over the same sets, their replays interleaved: replay r times every step's graph
    once, in the given order on even r and reversed on odd r, so that a drift of the GPU's speed within the
    measurement (clocks or power under sustained load: the H100's back-to-back graphs drifted 10-15% within seconds)
    falls on every step alike instead of on whichever was timed later. Microseconds per call for each replay, by
    step name."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: module load, lazy kernel load, allocator
        for step in steps.values():
            for s in sets:
                step(s)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graphs = {}
    for name, step in steps.items():
        graph = torch.cuda.CUDAGraph()
        held = collections.deque(maxlen=len(sets))  # outputs rotate with the inputs instead of reusing one block
        with torch.cuda.graph(graph):
            for i in range(calls):
                held.append(step(sets[i % len(sets)]))
        held.clear()
        graphs[name] = graph
    for graph in graphs.values():
        for _ in range(3):
            graph.replay()
    times = {name: [] for name in steps}
    order = list(steps)
    for r in range(replays):
        for name in (order if r % 2 == 0 else order[::-1]):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[name].replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1e3 / calls)
    del graphs
    torch.cuda.synchronize()
    return times


def time_copy(nbytes: int, replays: int = 20, min_calls: int = 32, max_sets: int = 64) -> float:
    """Median microseconds of a device-to-device copy moving `nbytes` (half read, half written), inputs rotated
    past the L2: the memory-bound ceiling for a kernel that moves `nbytes`, measured in the caller's run."""
    words = max(1, nbytes // 8)  # int32 words per source and per destination
    n_sets = max(1, min(max_sets, math.ceil(3 * l2_bytes() / max(8 * words, 1))))
    calls = n_sets * max(1, math.ceil(min_calls / n_sets))
    sets = [(torch.randint(-2**31, 2**31 - 1, (words,), device="cuda", dtype=torch.int32),
             torch.empty(words, device="cuda", dtype=torch.int32)) for _ in range(n_sets)]
    us = statistics.median(time_graph(lambda s: s[1].copy_(s[0]), sets, calls, replays))
    del sets
    torch.cuda.empty_cache()
    return us


def time_gemm(flops: float, replays: int = 10, target_ms: float = 2.0) -> float:
    """Microseconds cuBLAS takes for `flops` of bf16 GEMM: F.linear of n x n by n x n (n a multiple of 256 with
    2 n^3 nearest `flops`), its median time scaled to exactly `flops`. The compute-bound ceiling of a kernel doing
    `flops` tensor-core work, measured in the caller's run."""
    n = max(256, round((flops / 2) ** (1 / 3) / 256) * 256)
    gemm_flops = 2.0 * n ** 3
    calls = max(1, min(32, math.ceil(target_ms * 1e-3 * 600e12 / gemm_flops)))
    a = torch.randn(n, n, device="cuda").to(torch.bfloat16)
    w = torch.randn(n, n, device="cuda").to(torch.bfloat16)
    us = statistics.median(time_graph(lambda s: torch.nn.functional.linear(s[0], s[1]), [(a, w)], calls, replays))
    del a, w
    torch.cuda.empty_cache()
    return us * flops / gemm_flops


def _median_or_none(values) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarize(rows: list[dict], *, anchor: str, ceiling: str) -> dict:
    """One case's record from its repeated runs. Each row holds kernel_us, anchor_us, ceiling_us, fraction (of
    the ceiling) and tbps (memory-bound cases) or tflops (compute-bound ones), all measured in that run.

    Returns kernel_us, anchor, anchor_us, ratio = anchor_us / kernel_us (higher is better; median over the
    repeats), ratios (one per repeat), spread = (max - min) / median of the ratios, ceiling, ceiling_us, tbps or
    tflops, fraction_of_ceiling (medians) and repeats: the keys ci/bench_gate.py and ci/dashboard.py read.
    """
    ratios = [r["anchor_us"] / r["kernel_us"] for r in rows]
    ratio = statistics.median(ratios)
    rec = {
        "kernel_us": statistics.median(r["kernel_us"] for r in rows), "anchor": anchor,
        "anchor_us": statistics.median(r["anchor_us"] for r in rows), "ratio": ratio, "ratios": ratios,
        "spread": (max(ratios) - min(ratios)) / ratio, "ceiling": ceiling,
        "ceiling_us": statistics.median(r["ceiling_us"] for r in rows),
        "tbps": _median_or_none(r.get("tbps") for r in rows),
        "fraction_of_ceiling": statistics.median(r["fraction"] for r in rows), "repeats": len(rows),
    }
    tflops = _median_or_none(r.get("tflops") for r in rows)
    if tflops is not None:
        rec["tflops"] = tflops
    return rec


UNVERSIONED = ("", "unknown", "unversioned")  # what pytest-benchmark and the build record where git is absent


def commit(use_git: bool = True) -> tuple[str, str]:
    """(commit, where it came from) for a result: $ASTRAI_GIT_COMMIT when set (ci/gpu_run.sh exports it; set it
    when copying a tree to a GPU machine: a copied .git there may name an older commit than the files, as seen
    on the lent H200), else git in the working tree (unless `use_git` is False), else the git revision recorded
    in the chosen image's image.json (the commit the image was built from, which may predate uncommitted
    changes), else "unknown"."""
    if os.environ.get("ASTRAI_GIT_COMMIT", "").strip() not in UNVERSIONED:
        return os.environ["ASTRAI_GIT_COMMIT"].strip(), "ASTRAI_GIT_COMMIT"
    if use_git:
        try:
            out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                                 timeout=10, cwd=Path(__file__).resolve().parent)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip(), "git"
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        desc = loader.describe()
        chosen = (desc.get("chosen") or {}).get("image")
        image = next((i for i in desc.get("images", []) if i["name"] == chosen), None) or {}
        if (image.get("git_revision") or "") not in UNVERSIONED:
            return image["git_revision"], f"image {chosen} git_revision"
    except Exception:  # the record must not break a benchmark run
        pass
    return "unknown", "none (no git, no ASTRAI_GIT_COMMIT, no image revision)"


def nvidia_smi(index: int) -> dict | None:
    """Clocks, power and temperature as nvidia-smi reads them, or None where it is not available."""
    fields = ("name", "driver_version", "pstate", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
              "power.draw", "power.limit", "temperature.gpu")
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits",
                              "-i", str(index)], capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    values = [v.strip() for v in out.strip().split(",")]
    return dict(zip(fields, values)) if len(values) == len(fields) else None


def environment(family: str | None = None) -> dict:
    """GPU, driver, CUDA, torch, image (with `family`'s library, or every library when None), clocks and commit,
    for the record beside every result."""
    index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    desc = loader.describe()
    chosen = desc.get("chosen") or {}
    image = next((i for i in desc.get("images", []) if i["name"] == chosen.get("image")), None)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "gpu": {"name": props.name, "capability": f"{props.major}.{props.minor}",
                "sms": props.multi_processor_count, "memory_bytes": props.total_memory, "l2_bytes": l2_bytes()},
        "nvidia_smi": nvidia_smi(index),
        "driver_cuda": desc["driver"]["cuda"],
        "torch": torch.__version__, "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "image": None if image is None else {
            "name": image["name"], "toolkit": image["toolkit"], "serves": image["serves"],
            "git_revision": image["git_revision"], "built_at": image["built_at"], "path": image["path"],
            **({family: image["libraries"].get(family)} if family else {"libraries": image["libraries"]})},
        "commit": dict(zip(("id", "source"), commit())),
        "overrides": desc.get("overrides"),
        "env": {k: os.environ[k] for k in ("ASTRAI_IMAGE", "CUDA_VISIBLE_DEVICES") if k in os.environ},
    }
