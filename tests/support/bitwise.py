"""Bitwise checks for every family's tests, each with a negative control that proves it can fail.

    assert_bitwise_equal(got, want, what)      bit-for-bit, NaN payloads and -0.0 included; reports the first
                                               differing element (index, flat byte offset, both values and bits)
    assert_detects_perturbation(t)             negative control: a one-bit flip must make the check above fail
    assert_deterministic(fn, runs)             N calls give bit-identical outputs
    assert_replay_matches_eager(...)           a captured CUDA graph's outputs equal eager calls on fresh inputs
    assert_batch_invariant(fn, inputs, rows)   row i of a batched call equals the call on row i alone
    digest(outputs)                            sha256 of dtypes, shapes and bytes (golden digests)

Every helper works on CPU tensors too: tests/harness/test_bitwise.py runs each negative control on the CPU.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence

import torch

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

Outputs = torch.Tensor | Sequence[torch.Tensor]


def _as_tuple(out: Outputs) -> tuple[torch.Tensor, ...]:
    return (out,) if isinstance(out, torch.Tensor) else tuple(out)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The same storage reinterpreted as integers of the element's size (works for bf16, fp8, bool...)."""
    return t.contiguous().view(_INT_OF_SIZE[t.element_size()])


def first_difference(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None when bit-identical, else a description of the first differing element."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"{got.dtype}{list(got.shape)} vs {want.dtype}{list(want.shape)}"
    if got.numel() == 0:
        return None
    differ = _bits(got) != _bits(want.to(got.device))
    count = int(differ.sum())
    if count == 0:
        return None
    index = tuple(int(i) for i in differ.nonzero()[0].tolist())
    flat = 0
    for i, size in zip(index, got.shape):
        flat = flat * size + i
    width = got.element_size()
    g_bits = int(_bits(got)[index].item()) & ((1 << (8 * width)) - 1)
    w_bits = int(_bits(want.to(got.device))[index].item()) & ((1 << (8 * width)) - 1)
    xor = g_bits ^ w_bits
    byte = (xor & -xor).bit_length() - 1  # lowest differing bit
    byte_offset = flat * width + byte // 8  # little-endian: the lowest bit lives in the first byte
    g_val, w_val = got[index].item(), want[index].item()
    return (f"{count} of {got.numel()} elements differ; first at index {index} (byte {byte_offset}): "
            f"got {g_val!r} (0x{g_bits:0{2 * width}x}) vs want {w_val!r} (0x{w_bits:0{2 * width}x})")


def assert_bitwise_equal(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """Bit-for-bit equality; the message names the first differing element, its byte and both values."""
    problem = first_difference(got, want)
    if problem is not None:
        raise AssertionError(f"{what}: {problem}")


def perturbed(t: torch.Tensor, index: int | None = None, bit: int = 0) -> torch.Tensor:
    """A copy of t with one bit of one element flipped (element `index` of the flattened tensor, random when
    None)."""
    changed = t.detach().clone().contiguous()
    flat = _bits(changed).view(-1)
    if index is None:
        index = int(torch.randint(0, flat.numel(), ()))
    flat[index] ^= 1 << bit
    return changed


def assert_detects_perturbation(t: torch.Tensor) -> None:
    """Negative control: assert_bitwise_equal must fail on a copy of t with its lowest bit flipped in one
    element, and name exactly one differing element."""
    if t.numel() == 0:
        raise AssertionError("negative control on an empty tensor proves nothing")
    changed = perturbed(t)
    try:
        assert_bitwise_equal(changed, t, "negative control")
    except AssertionError as exc:
        if f"1 of {t.numel()} elements differ" not in str(exc):
            raise AssertionError(f"negative control reported the wrong difference: {exc}") from None
        return
    raise AssertionError("negative control: assert_bitwise_equal passed on a perturbed tensor")


def assert_outputs_equal(got: Outputs, want: Outputs, what: str = "") -> None:
    got_t, want_t = _as_tuple(got), _as_tuple(want)
    if len(got_t) != len(want_t):
        raise AssertionError(f"{what}: {len(got_t)} outputs vs {len(want_t)}")
    for i, (g, w) in enumerate(zip(got_t, want_t)):
        assert_bitwise_equal(g, w, f"{what}, output {i}")


def assert_deterministic(fn: Callable[[], Outputs], runs: int = 10, what: str = "") -> tuple[torch.Tensor, ...]:
    """Calls fn() `runs` times (keeping every result alive, so each lands in fresh memory) and asserts all are
    bit-identical to the first. Returns the first run's outputs."""
    results = [tuple(t.clone() for t in _as_tuple(fn())) for _ in range(runs)]
    for i, result in enumerate(results[1:], 1):
        assert_outputs_equal(result, results[0], f"{what} run {i} vs run 0")
    return results[0]


def assert_replay_matches_eager(replay: Callable[[], Outputs], eager: Callable[[], Outputs],
                                refresh: Callable[[int], None], trials: int = 3, what: str = "graph replay",
                                poison: bool = True) -> None:
    """For each trial: refresh(trial) writes new values into the captured inputs, eager() computes the expected
    outputs, the static outputs are poisoned with NaN / all-ones (each element must be rewritten), then
    replay() (graph.replay(), returning the static outputs) must equal them bit for bit. `poison=False` for
    in-place ops whose static outputs are their inputs."""
    for trial in range(trials):
        refresh(trial)
        want = tuple(t.clone() for t in _as_tuple(eager()))
        if poison:
            for t in _as_tuple(replay.static_outputs() if hasattr(replay, "static_outputs") else ()):
                t.fill_(float("nan") if t.is_floating_point() else -1)
        got = replay()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        assert_outputs_equal(got, want, f"{what} {trial}")


class GraphReplay:
    """fn captured into a CUDA graph (after a warm-up on a side stream, as torch advises). Call it to replay;
    static_outputs() returns the tensors the graph writes."""

    def __init__(self, fn: Callable[[], Outputs], warmup: int = 3):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._outputs = _as_tuple(fn())

    def static_outputs(self) -> tuple[torch.Tensor, ...]:
        return self._outputs

    def __call__(self) -> tuple[torch.Tensor, ...]:
        self.graph.replay()
        return self._outputs


def assert_batch_invariant(fn: Callable[..., Outputs], batched_inputs: Sequence[torch.Tensor | None],
                           rows: Iterable[slice], what: str = "", slice_input: Sequence[bool] | None = None
                           ) -> tuple[torch.Tensor, ...]:
    """fn(*inputs) on the whole batch, then on each slice of rows alone: the slice's outputs must equal the
    same rows of the batched outputs bit for bit. slice_input[i] False passes input i whole (e.g. a cos/sin
    cache indexed by positions). Returns the batched outputs."""
    slice_input = slice_input or [t is not None for t in batched_inputs]
    full = tuple(t.clone() for t in _as_tuple(fn(*batched_inputs)))
    for rows_ in rows:
        part_inputs = [t[rows_] if (t is not None and cut) else t for t, cut in zip(batched_inputs, slice_input)]
        part = _as_tuple(fn(*part_inputs))
        for i, (p, f) in enumerate(zip(part, full)):
            assert_bitwise_equal(p, f[rows_], f"{what} rows {rows_.start}:{rows_.stop}, output {i}")
    return full


def digest(outputs: Outputs) -> str:
    """sha256 over every output's dtype, shape and bytes (row-major), in order."""
    h = hashlib.sha256()
    for t in _as_tuple(outputs):
        t = t.detach().contiguous().cpu()
        h.update(f"{t.dtype}{list(t.shape)};".encode())
        if t.numel():
            h.update(_bits(t).reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
