"""Tier 4 setup: benchmarks need a GPU (marked `gpu`, so they skip on the CPU), the machine record (GPU, driver,
CUDA, torch, image with every family's library, clocks, commit) goes into pytest-benchmark's machine_info,
and a run in a tree without git (a GPU machine given a copy) still names its commit: $ASTRAI_GIT_COMMIT, else
the chosen image's recorded git revision (gpu_timing.commit)."""

from __future__ import annotations

import os

import sys
from pathlib import Path

import pytest
import torch

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))
import gpu_timing  # noqa: E402


def pytest_collection_modifyitems(config, items):
    for item in items:
        if BENCH_DIR in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.gpu)


@pytest.hookimpl(optionalhook=True)  # pytest-benchmark's hook: tier 0 collects without it
def pytest_benchmark_update_machine_info(config, machine_info):
    if not torch.cuda.is_available():
        return
    machine_info["astrai"] = gpu_timing.environment()  # the one machine record every bench script shares


@pytest.hookimpl(optionalhook=True)  # pytest-benchmark's hook: tier 0 collects without it
def pytest_benchmark_update_commit_info(config, commit_info):
    """Name the commit a run measures: $ASTRAI_GIT_COMMIT when set (a tree copied to a GPU machine may carry an
    older .git than its files), else git's answer (pytest-benchmark asked it), else the image's revision."""
    if os.environ.get("ASTRAI_GIT_COMMIT", "").strip() not in gpu_timing.UNVERSIONED:
        commit_info["id"], commit_info["source"] = os.environ["ASTRAI_GIT_COMMIT"].strip(), "ASTRAI_GIT_COMMIT"
        return
    if str(commit_info.get("id") or "") not in gpu_timing.UNVERSIONED:
        commit_info.setdefault("source", "git")
        return
    commit_info["id"], commit_info["source"] = gpu_timing.commit(use_git=False)
