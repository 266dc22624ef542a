"""The attention family's launch policy: which kernel a prefill runs, how a decode splits its keys and whether it
launches as a programmatic dependent, and the switches that steer them.

The rules live once, in C++ (`csrc/kernels/attention/attention_policy.h`): the ops plan every call explicitly
(the decode's KV split plan, the prefill's kernel and K/V copy) from the switches this module pushes into the
library, and the launchers take that plan and choose nothing. This module holds the switches (read from the
environment once, as a seed), shows them (`state()`, `python -m astrai.extension info`) and asks the library
what it would do (`probe`) or whether it can (`can_implement`), also for a device not in hand (`facts=`).

Example
-------
>>> from astrai.extension import attention_plan
>>> attention_plan.probe("prefill", batch=1, q_len=2048, num_q_heads=32, num_kv_heads=8, head_dim=128, kv_len=2048)
AttnDecision(kind='prefill', plan={'kernel': 'sm90', 'tma': True, 'q_tiles': 64}, passed=())
>>> attention_plan.set_staging(sm90=False)   # every prefill on the portable mma.sync kernel
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from typing import NamedTuple

import torch

from astrai.extension.ops._fakes import cuda_index

# Read once per process, as seeds of set_staging (exactly "0" turns a switch off; explicit calls win).
ENV_KNOBS = {"ASTRAI_DECODE_PDL": "pdl", "ASTRAI_PREFILL_SM90": "sm90", "ASTRAI_PREFILL_SM90_TMA": "tma"}
KINDS = ("decode", "prefill")
KERNELS = ("mma", "sm90")  # prefill kernels, in the library's numbering


class AttnFacts(NamedTuple):
    """What the attention plans depend on for a device (`facts()`); fabricate one to ask about another GPU."""

    cc: tuple          # (major, minor)
    code_arch: int     # the PTX arch of the image's attention code for it (90: the sm_90a build; 80: compute_80 PTX)
    binary_arch: int   # the SASS arch that code runs as
    sm_count: int
    smem_optin: int    # bytes of shared memory a block may opt in to


class AttnDecision(NamedTuple):
    kind: str          # "decode" or "prefill"
    plan: dict         # decode: splits, split_len, pdl; prefill: kernel ("sm90" / "mma"), tma, q_tiles
    passed: tuple      # why the faster option was not taken (the sm90 kernel, the dependent launch): empty if it was


@dataclasses.dataclass
class _State:
    pdl: bool = True    # decode plans with splits launch as programmatic dependents (where the code waits)
    sm90: bool = True   # the sm_90a wgmma prefill wherever it can run
    tma: bool = True    # its K/V tiles by TMA wherever TMA can describe them
    seeded: bool = False
    seeds: list = dataclasses.field(default_factory=list)


_lock = threading.RLock()
_state = _State()
_pushed = False  # the library holds the current switches


def _seed_from_env() -> None:
    if _state.seeded:
        return
    env = os.environ
    _state.seeds = [name for name in ENV_KNOBS if env.get(name) == "0"]
    for name in _state.seeds:
        setattr(_state, ENV_KNOBS[name], False)
    _state.seeded = True


def _library_loaded() -> bool:
    from astrai.extension import loader
    return "attention" in loader.loaded_families() and hasattr(torch.ops.astrai, "attn_set_policy")


def sync_native() -> None:
    """Push the switches into the attention library once it is loaded (the loader calls it as the family loads) and
    after each change. The launchers read no environment."""
    global _pushed
    if _pushed or not _library_loaded():
        return
    with _lock:
        _seed_from_env()
        torch.ops.astrai.attn_set_policy(_state.pdl, _state.sm90, _state.tma)
        _pushed = True


def set_staging(*, pdl: bool | None = None, sm90: bool | None = None, tma: bool | None = None) -> None:
    """The attention launch switches for this process (None leaves one as it is; same results either way unless
    noted): `pdl=False` launches every decode plainly instead of as a programmatic dependent of the stream's
    previous kernel (same bits); `sm90=False` runs every prefill on the portable mma.sync kernel (within accuracy of
    the sm_90a kernel, not bitwise); `tma=False` copies the sm_90a prefill's K/V tiles by cp.async (same bits)."""
    global _pushed
    with _lock:
        _seed_from_env()
        for name, value in (("pdl", pdl), ("sm90", sm90), ("tma", tma)):
            if value is not None:
                setattr(_state, name, bool(value))
        _pushed = False
    sync_native()


def reset() -> None:
    """Every switch back to its default (on); the environment seed is not read again."""
    global _state, _pushed
    with _lock:
        _state = _State(seeded=True)
        _pushed = False
    sync_native()


def state() -> dict:
    """The switches now, the environment variables that seeded them, and whether the library holds them."""
    with _lock:
        _seed_from_env()
        return {"staging": {"pdl": _state.pdl, "sm90": _state.sm90, "tma": _state.tma},
                "env_seeds": list(_state.seeds), "pushed": _pushed}


def _load() -> None:
    from astrai.extension.ops import attention
    attention.load()
    if not hasattr(torch.ops.astrai, "attn_plan"):
        raise RuntimeError("attention_plan: the attention image in use predates the planning ops; rebuild it")


_facts_memo: dict[int, AttnFacts] = {}


def facts(device=None) -> AttnFacts:
    """The facts of a CUDA device (index, device or None: the current one) with the image's attention code, queried
    once per device and process."""
    _load()
    index = cuda_index(device)
    found = _facts_memo.get(index)
    if found is None:
        cc, code, binary, sms, smem = torch.ops.astrai.attn_device_facts(index)
        found = _facts_memo[index] = AttnFacts((cc // 10, cc % 10), code, binary, sms, smem)
    return found


def _facts_args(f: AttnFacts) -> tuple:
    return (f.cc[0] * 10 + f.cc[1], f.code_arch, f.binary_arch, f.sm_count, f.smem_optin)


def _kind(fn: str, kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"{fn}: kind must be one of {KINDS}, got {kind!r}")
    return kind


# A device that lacks nothing: the shape rules alone.
_ANY = AttnFacts((9, 0), 90, 90, 132, 227 * 1024)
_ANY_ARGS = _facts_args(_ANY)


@functools.lru_cache(maxsize=1024)
def _reason(kind: str, dtype: torch.dtype, kv_dtype: torch.dtype, head_dim: int, num_q_heads: int,
            num_kv_heads: int, page_size: int, scale: float, kernel: int, pdl: bool, target: tuple) -> str | None:
    why = torch.ops.astrai.attn_can_implement(kind, dtype, kv_dtype, head_dim, num_q_heads, num_kv_heads, page_size,
                                              scale, kernel, pdl, *target)
    return why or None


def can_implement(kind: str, head_dim: int, num_q_heads: int, num_kv_heads: int, *, page_size: int = 0,
                  scale: float | None = None, kernel: str | None = None, pdl: bool = False,
                  facts: AttnFacts | None = None, dtype: torch.dtype = torch.bfloat16,
                  kv_dtype: torch.dtype | None = None) -> str | None:
    """Why the attention ops cannot serve a call of these dtypes (q's, K/V's: default q's) and shapes (page_size 0:
    contiguous K/V), or cannot run `kernel` ("mma" / "sm90", prefill) or a dependent launch (`pdl=True`, decode)
    on the device `facts` describes (default: the current device where a kernel or pdl is asked about); None when
    they can. The library's own rules: the ops refuse the same calls with the same words.

    >>> can_implement("decode", 96, 32, 8)
    'head_dim must be 64, 128 or 256, got 96'
    """
    _kind("can_implement", kind)
    if kernel is not None and kernel not in KERNELS:
        raise ValueError(f"can_implement: kernel must be one of {KERNELS} or None, got {kernel!r}")
    _load()
    asks_device = (kind == "prefill" and kernel is not None) or (kind == "decode" and pdl)
    target = facts if facts is not None else (_facts_of() if asks_device else _ANY)
    code = -1 if kernel is None and not pdl else (KERNELS.index(kernel) if kernel is not None else 0)
    scale = 1.0 / head_dim ** 0.5 if scale is None else float(scale)
    return _reason(kind, dtype, dtype if kv_dtype is None else kv_dtype, int(head_dim), int(num_q_heads),
                   int(num_kv_heads), int(page_size), scale, code, bool(pdl), _facts_args(target))


def append_reason(new_dtype: torch.dtype, cache_dtype: torch.dtype, head_dim: int, page_size: int) -> str | None:
    """Why the paged append kernel cannot write tokens of `new_dtype` into a cache of `cache_dtype` with these sizes
    (None when it can): the library's rule (`paged_kv_append` refuses the same). A constant per argument tuple."""
    _load()
    return _reason("append", new_dtype, cache_dtype, int(head_dim), 0, 0, int(page_size), 1.0, -1, False, _ANY_ARGS)


_facts_of = facts  # for the functions whose `facts` argument shadows it


@torch.compiler.assume_constant_result
def shapes_reason(head_dim: int, num_q_heads: int, num_kv_heads: int, page_size: int = 0,
                  dtype: torch.dtype = torch.bfloat16, kv_dtype: torch.dtype | None = None) -> str:
    """Why the attention kernels cannot take these dtypes and shapes ("" when they can): the backend's blocker asks
    this instead of restating the rules (a constant under torch.compile)."""
    return _shapes_reason(int(head_dim), int(num_q_heads), int(num_kv_heads), int(page_size), dtype,
                          dtype if kv_dtype is None else kv_dtype)


@functools.lru_cache(maxsize=1024)  # the blocker asks at every attention call: one lookup once a shape was seen
def _shapes_reason(head_dim: int, num_q_heads: int, num_kv_heads: int, page_size: int, dtype: torch.dtype,
                   kv_dtype: torch.dtype) -> str:
    return can_implement("decode", head_dim, num_q_heads, num_kv_heads, page_size=page_size, dtype=dtype,
                         kv_dtype=kv_dtype) or ""


def probe(kind: str, *, num_q_heads: int, num_kv_heads: int, head_dim: int, kv_len: int, batch: int = 1,
          q_len: int = 1, page_size: int = 0, ragged: bool = False, scale: float | None = None,
          kv_split_size: int = 0, device=None, facts: AttnFacts | None = None) -> AttnDecision:
    """The plan the attention ops launch for a call of these sizes under the switches now, and why a faster
    option was passed over. kv_len: keys per sequence (the longest; a paged call's max_pages * page_size);
    page_size 0: contiguous K/V; ragged: packed query rows (q_len then the total rows); kv_split_size as the
    decode ops take it (0: the automatic split). `facts` plans for another device (default: `device`'s, the
    current one)."""
    _kind("probe", kind)
    _load()
    sync_native()
    target = facts if facts is not None else _facts_of(device)
    scale = 1.0 / head_dim ** 0.5 if scale is None else float(scale)
    why = can_implement(kind, head_dim, num_q_heads, num_kv_heads, page_size=page_size, scale=scale, facts=target)
    if why:
        raise ValueError(f"probe: {why}")
    plan = torch.ops.astrai.attn_plan(kind, batch, q_len, num_q_heads, num_kv_heads, head_dim, kv_len, page_size,
                                      bool(ragged), scale, kv_split_size, *_facts_args(target))
    st = state()["staging"]
    passed = []
    if kind == "decode":
        splits, split_len, pdl = plan
        if not pdl:
            if not st["pdl"]:
                passed.append("pdl: off by the policy (set_staging(pdl=False) or ASTRAI_DECODE_PDL=0)")
            elif splits == 1:
                passed.append("pdl: a one-split plan launches plainly (no gain measured)")
            else:
                passed.append("pdl: " + (can_implement("decode", head_dim, num_q_heads, num_kv_heads,
                                                       page_size=page_size, pdl=True, facts=target) or "?"))
        return AttnDecision(kind, {"splits": splits, "split_len": split_len, "pdl": bool(pdl)}, tuple(passed))
    kernel, tma, tiles = plan
    if kernel == 0:
        if not st["sm90"]:
            passed.append("sm90: off by the policy (set_staging(sm90=False) or ASTRAI_PREFILL_SM90=0)")
        else:
            passed.append("sm90: " + (can_implement("prefill", head_dim, num_q_heads, num_kv_heads,
                                                    page_size=page_size, scale=scale, kernel="sm90",
                                                    facts=target) or "?"))
    elif not tma:
        passed.append("tma: off by the policy (set_staging(tma=False) or ASTRAI_PREFILL_SM90_TMA=0)")
    return AttnDecision(kind, {"kernel": KERNELS[kernel], "tma": bool(tma), "q_tiles": tiles}, tuple(passed))
