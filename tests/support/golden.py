"""Golden digests: sha256 of kernel outputs on fixed seeded inputs, stored per image and GPU arch.

Digests live in tests/golden/<family>.json as {"<image>/sm_<cc>": {"<case>": "<sha256>", ...}, ...}; cases
live in tests/golden/<family>_cases.py as CASES = {"<case>": fn() -> outputs}. Inputs come from a CPU
torch.Generator, so they are the same bytes on every machine. Only `nox -s golden` (or
`ci/gpu_run.sh golden`, which runs tests/golden/regenerate.py) writes digests; tests only read them.

A family's cases are a table: `op_cases(FAMILY, {"<case>": OpCase("<op>", build), ...})` calls
`torch.ops.astrai.<op>(*build(generator))` (the schema's positional arguments) on inputs drawn from a
generator seeded by the case name. A case whose op the running image does not register (an op still being
written) skips, in the test and in the regeneration alike.
"""

from __future__ import annotations

import importlib.util
import json
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from support.bitwise import digest

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"
# Where case inputs are placed; read at call time. Tier 0 sets "cpu" to run every case's arguments through
# the op's CPU-dispatched validation (which then refuses a CPU tensor) without a GPU.
DEVICE = "cuda"


def seeded(seed: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed(seed)


def randn_bf16(gen: torch.Generator, *shape: int, device: str | None = None) -> torch.Tensor:
    """Standard-normal bf16 drawn on the CPU from `gen` (machine-independent), then moved to `device` (DEVICE)."""
    return randn(gen, *shape, device=device)


def randn(gen: torch.Generator, *shape: int, dtype: torch.dtype = torch.bfloat16, device: str | None = None
          ) -> torch.Tensor:
    """Standard-normal values of `dtype` drawn on the CPU from `gen`, then moved to `device` (DEVICE)."""
    return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype).to(device or DEVICE)


def case_seed(name: str) -> int:
    """The input seed of a table case: fixed by its name, so adding or reordering cases changes no digest."""
    return zlib.crc32(name.encode())


class OpCase(NamedTuple):
    """One golden case of a table: `torch.ops.astrai.<op>(*build(generator))`.

    op: the registered op name; build: generator -> the schema's positional arguments (CUDA tensors and
    values); written: indices of arguments the op writes in place (e.g. the caches of paged_kv_append),
    whose contents after the call are outputs too (after the op's own tensor results); post: maps the
    outputs before they are digested (e.g. to include the padding of a strided layout).
    """
    op: str
    build: Callable[[torch.Generator], tuple]
    written: tuple[int, ...] = ()
    post: Callable[[tuple[torch.Tensor, ...]], tuple[torch.Tensor, ...]] | None = None


def require_op(family: str, op: str):
    """`torch.ops.astrai.<op>` after loading `family`'s library from the chosen image (the loader itself: the
    digests are of the kernels, whatever the Python wrappers register); skips (pytest.skip, caught by
    regenerate.py) when the image does not register the op yet."""
    from astrai.extension import loader
    loader.load_family(family, op=f"astrai::{op}")
    if not hasattr(torch.ops.astrai, op):
        pytest.skip(f"torch.ops.astrai.{op} is not registered by this image (an op not written or not built yet)")
    return getattr(torch.ops.astrai, op)


def outputs_of(result, args: tuple = (), written: tuple[int, ...] = ()) -> tuple[torch.Tensor, ...]:
    """An op's tensor results (None and empty placeholders dropped), then the arguments it wrote."""
    results = (result,) if isinstance(result, torch.Tensor) else tuple(result or ())
    kept = tuple(t for t in results if isinstance(t, torch.Tensor) and t.numel() > 0)
    return kept + tuple(args[i] for i in written)


def op_cases(family: str, table: dict[str, OpCase]) -> dict[str, Callable[[], tuple[torch.Tensor, ...]]]:
    """CASES for a family from a table of OpCase: each runs its op on inputs seeded by the case name."""
    def make(name: str, case: OpCase):
        def run():
            fn = require_op(family, case.op)
            args = case.build(seeded(case_seed(name)))
            outputs = outputs_of(fn(*args), args, case.written)
            return case.post(outputs) if case.post else outputs
        run.op = case.op
        return run
    return {name: make(name, case) for name, case in table.items()}


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
