"""The `path=` rule every policy module applies: "auto" | "cuda" | "torch", with fallbacks recorded.

Every family's policy module calls `choose`.
"""

from __future__ import annotations

from typing import Callable

from astrai.extension import _fallbacks

PATHS = ("auto", "cuda", "torch")


def choose(fn: str, path: str, blocker: Callable[[bool], str | None], *, on_gpu: bool) -> str:
    """"cuda" or "torch" for a call of `fn` with `path`.

    `blocker(check_available)` says why the kernels cannot run the call (None when they can); with
    `check_available=False` it skips the image check, which `path="cuda"` leaves to the ops wrapper, whose error
    explains every image seen. "auto" records each fallback (`_fallbacks.record`); "cuda" raises ValueError with
    the reason.
    """
    if path == "torch":
        return "torch"
    if path == "auto":
        reason = blocker(True)
        if reason is None:
            return "cuda"
        _fallbacks.record(fn, reason, "torch", on_gpu=on_gpu)
        return "torch"
    if path == "cuda":
        reason = blocker(False)
        if reason:
            raise ValueError(f"{fn}(path='cuda'): the CUDA kernels cannot run this call: {reason}")
        return "cuda"
    raise ValueError(f"{fn}: path must be one of {PATHS}, got {path!r}")
