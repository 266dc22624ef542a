"""Fallbacks of the policy layer: a call that the default choice ("auto") cannot give to this package's kernels.

`record(op, reason, backend, on_gpu=...)` is called by the policy modules (attention, the paged cache's append,
quantize, rotary) each time that happens. Each distinct (op, reason, backend) is logged once, on the logger
"astrai.extension": WARNING when the call's tensors are on a CUDA device (the kernels were expected there and the
reason is usually something to fix: a dtype, a layout, a gradient left on), INFO otherwise (on the CPU the torch
path is the only one). Every fallback is counted, and `snapshot()` gives the counts and the last one, which
`loader.describe()` / `astrai.extension.info()` show. Calls traced by torch.compile are not recorded (logging
there would break the graph). No torch import: the loader reads this module.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

LOGGER_NAME = "astrai.extension"
logger = logging.getLogger(LOGGER_NAME)

# Distinct reasons kept (and logged); fallbacks with a reason past these are counted in `other` only. The
# reasons carry shapes and dtypes, so a process that sweeps many of them must not grow without bound.
MAX_REASONS = 256


@dataclass
class Fallback:
    """One distinct fallback: the op, why the kernels could not take it, the backend that ran it, how often."""

    op: str
    reason: str
    backend: str
    count: int
    first: float  # time.time() of the first and the last call
    last: float

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "reason": self.reason, "backend": self.backend, "count": self.count,
                "first": _iso(self.first), "last": _iso(self.last)}


def _iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


_lock = threading.Lock()
_seen: dict[tuple[str, str, str], Fallback] = {}
_last: Fallback | None = None
_total = 0
_other = 0


def record(op: str, reason: str, backend: str, *, on_gpu: bool) -> None:
    """Count one fallback of `op` to `backend` because of `reason`; log it if the reason is new.

    A dictionary lookup and a few stores under a lock after the first call of a reason: cheap beside the torch
    path the call then takes. Does nothing while torch.compile traces.
    """
    global _last, _total, _other
    torch = sys.modules.get("torch")  # every caller has imported it; this module does not
    if torch is not None and torch.compiler.is_compiling():
        return
    key = (op, reason, backend)
    now = time.time()
    with _lock:
        _total += 1
        entry = _seen.get(key)
        if entry is not None:
            entry.count += 1
            entry.last = now
            _last = entry
            return
        if len(_seen) >= MAX_REASONS:
            _other += 1
            return
        entry = _seen[key] = _last = Fallback(op, reason, backend, 1, now, now)
    logger.log(logging.WARNING if on_gpu else logging.INFO,
               "astrai-kernels: %s ran on %s instead of this package's CUDA kernels: %s (logged once per reason; "
               "astrai.extension.info() lists this process's fallbacks)", op, backend, reason)


def snapshot() -> dict[str, Any]:
    """{"total": fallbacks counted, "last": the last one or None, "reasons": each distinct one, "other": those
    past MAX_REASONS distinct reasons}; times are UTC, ISO 8601."""
    with _lock:
        return {"total": _total, "last": _last.as_dict() if _last is not None else None,
                "reasons": [entry.as_dict() for entry in _seen.values()], "other": _other}


def reset() -> None:
    """Forget every fallback (tests): the next one of each reason is logged again."""
    global _last, _total, _other
    with _lock:
        _seen.clear()
        _last, _total, _other = None, 0, 0
