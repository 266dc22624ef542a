"""Tier 4 setup: benchmarks need a GPU (marked `gpu`, so they skip on the CPU), and the machine record
(GPU, driver, CUDA, torch, image, clocks) goes into pytest-benchmark's machine_info."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

BENCH_DIR = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if BENCH_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.gpu)


def pytest_benchmark_update_machine_info(config, machine_info):
    if not torch.cuda.is_available():
        return
    from bench_rotary import environment  # the one machine record every bench script shares
    machine_info["astrai"] = environment()
