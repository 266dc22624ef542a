"""Timing and machine record shared by the benchmark scripts (shared/MEASURE.md's method).

`time_graph` times CUDA-graph replays of many calls with CUDA events; `environment` is the record (GPU,
driver, CUDA, torch, image, clocks, date) written beside every result.
"""

from __future__ import annotations

import collections
import datetime
import os
import platform
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
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up: module load, lazy kernel load, allocator
        for s in sets:
            step(s)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    held = collections.deque(maxlen=len(sets))  # outputs rotate with the inputs instead of reusing one block
    with torch.cuda.graph(graph):
        for i in range(calls):
            held.append(step(sets[i % len(sets)]))
    held.clear()
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    torch.cuda.synchronize()
    return times


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


def environment(family: str) -> dict:
    """GPU, driver, CUDA, torch, image (with `family`'s library) and clocks, for the record beside every result."""
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
            family: image["libraries"].get(family)},
        "overrides": desc.get("overrides"),
        "env": {k: os.environ[k] for k in ("ASTRAI_IMAGE", "CUDA_VISIBLE_DEVICES") if k in os.environ},
    }
