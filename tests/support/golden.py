"""Golden digests: sha256 of kernel outputs on fixed seeded inputs, stored per image and GPU arch.

Digests live in tests/golden/<family>.json as {"<image>/sm_<cc>": {"<case>": "<sha256>", ...}, ...}; cases
live in tests/golden/<family>_cases.py as CASES = {"<case>": fn() -> outputs}. Inputs come from a CPU
torch.Generator, so they are the same bytes on every machine. Only `nox -s golden` (or
`ci/gpu_run.sh golden`, which runs tests/golden/regenerate.py) writes digests; tests only read them.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

import torch

from support.bitwise import digest

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"


def seeded(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def randn_bf16(gen: torch.Generator, *shape: int, device: str = "cuda") -> torch.Tensor:
    """Standard-normal bf16 drawn on the CPU from `gen` (machine-independent), then moved to `device`."""
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(torch.bfloat16).to(device)


def families() -> list[str]:
    return sorted(p.name[: -len("_cases.py")] for p in GOLDEN_DIR.glob("*_cases.py"))


def load_cases(family: str) -> dict[str, Callable[[], object]]:
    path = GOLDEN_DIR / f"{family}_cases.py"
    spec = importlib.util.spec_from_file_location(f"golden_{family}_cases", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return dict(module.CASES)


def key(image: str, capability: str) -> str:
    """'cu130/sm_90' from an image name and a capability '9.0'."""
    return f"{image}/sm_{capability.replace('.', '')}"


def load_digests(family: str, directory: Path = GOLDEN_DIR) -> dict[str, dict[str, str]]:
    path = directory / f"{family}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def store_digests(family: str, where: str, digests: dict[str, str], directory: Path = GOLDEN_DIR) -> Path:
    """Replace the digests of one image/arch key, keeping the others; sorted for stable diffs."""
    directory.mkdir(parents=True, exist_ok=True)
    current = load_digests(family, directory)
    current[where] = dict(sorted(digests.items()))
    path = directory / f"{family}.json"
    path.write_text(json.dumps(dict(sorted(current.items())), indent=2) + "\n")
    return path


def check(outputs, expected: str, what: str) -> None:
    """Raise AssertionError naming the case when the outputs' digest is not `expected`."""
    got = digest(outputs)
    if got != expected:
        raise AssertionError(f"{what}: golden digest changed: got {got}, stored {expected} "
                             "(a real change of results? regenerate only on purpose: nox -s golden)")
