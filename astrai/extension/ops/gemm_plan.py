"""The GEMM plan chain: which `(recipe, split_k)` `quant_gemm` launches for a call, and who decided it.

`ops.gemm.quant_gemm` with `plan=None` asks `decide(...)`. Planners are asked in this order; the first plan that
this device and image can run (`can_run`) is launched, a plan that cannot run falls through to the next planner
(with the reason, in `probe(...)` and the `[gemm-plan]` log line):

  override  rows given by `set_table(file | text | "-")`: the caller's word, asked under every planner setting
  injected  rows added by `inject_rows(...)` (a library or a serving engine shipping its own table)
  builtin   the rows shipped for the device's class (`BUILTIN_DIR/<class>.rows`, e.g. sm90.rows)
  tuned     the autotuner's winners (`enable(...)`), from this process or the on-disk plan cache
  model     `ops.gemm.builtin_plan`: the analytical plan (H200-fitted costs; the same rules on every device)
  degraded  the band ladder (recipe 2 / 1 / 0 by M at split 1): valid for every pair, layout and device

`set_planner("table")` skips the model, `set_planner("model")` skips injected, builtin and tuned rows; override
rows and the degraded ladder always take part. Decisions are memoized per (dtypes, layout, shapes, device); any
setter clears the memo. Row files: docs/contracts.md, "GEMM plan rows"; the autotuner and its cache: "GEMM
autotuner".

Every setting is process state, read and written under one lock; the deprecated `ASTR_GEMM_*` environment
variables are read once, at the first use of the chain, as a seed that explicit calls override (`ENV_SEEDS`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import math
import os
import re
import statistics
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from astrai.extension import loader
from astrai.extension.ops._fakes import cuda_index

ROWS_HEADER = "astrai-gemm-rows"
ROWS_VERSION = 1
ROW_FIELDS = ("arch", "pair", "layout", "m", "n", "k", "recipe", "split")
PLANNERS = ("hybrid", "table", "model")
DEFAULT_PLANNER = "hybrid"
BUILTIN_DIR = Path(__file__).with_name("gemm_rows")

CACHE_FORMAT = "astrai-gemm-plan-cache"
CACHE_VERSION = 1
# Autotuner defaults: tune a shape at its first call, at most this many shapes a process.
DEFAULT_MAX_SHAPES = 256
DEFAULT_TRIGGER = 1
# Timing: every candidate once untimed, then TUNE_ROUNDS interleaved rounds of CUDA-event times; after
# PRUNE_AFTER rounds a candidate slower than PRUNE_FACTOR x the best median so far stops being timed.
TUNE_ROUNDS = 7
PRUNE_AFTER = 2
PRUNE_FACTOR = 1.5
# Before the rounds, each candidate runs once (timed): one slower than SCREEN_FACTOR x the fastest is not timed
# further, which bounds a tune's time for large shapes (a first launch also pays the kernel's loading: generous).
SCREEN_FACTOR = 3.0
# Tie policy: candidates within TIE of the fastest median are equal; among them the chain's own plan wins if it is
# one, else the first in vocabulary order (recipe id, then split). Keeps two tunes on an idle GPU on one answer.
TIE = 0.01

# Splits the autotuner tries a recipe at (those the op accepts, each keeping >= one K tile a slice). At M <= 16 it
# times recipe 6 (the weight stream) only where its grid is at most `ops.gemm.SM90_STREAM_FILL` CTAs a SM, the model's
# own limit: past one CTA a SM the grid does not launch as a programmatic dependent of the call before, an overlap
# that timing one launch at a time cannot see (13-17% at M = 1 in the gated suite's chains of our calls), but a model's
# linears mostly follow other kernels, which is what a tune's timing sees (docs/benchmarks.md).
TUNE_SPLITS = (1, 2, 4, 8, 16)
TAIL_SPLIT = 0
MAX_SPLIT_K = 64          # the op's limit (csrc/bindings/gemm.cpp)
MAX_GRID_YZ = 65535       # the op's grid limit: tiles of rows, and batch * split_k
SM90_STREAM_MAX_SPLIT = 8

# The deprecated environment variables read once as a seed (name -> what replaces it).
ENV_SEEDS = {
    "ASTR_GEMM_TABLE": "set_table(path)",
    "ASTR_GEMM_MODEL": "set_planner(name)",
    "ASTR_GEMM_PLAN": 'set_table("* * * * * * RECIPE SPLIT")',
    "ASTR_GEMM_NO_TMA": "set_staging(tma=False)",
    "ASTR_GEMM_NO_MX": "set_staging(mx=False)",
    "ASTR_GEMM_AUTOTUNE": "enable(...)",
    "ASTR_GEMM_TUNE_DIR": "enable(cache_dir=...)",
    "ASTR_GEMM_TUNE_MAX_SHAPES": "enable(max_shapes=...)",
    "ASTR_GEMM_TUNE_TRIGGER": "enable(trigger=...)",
}
# Not deprecated, read once: the portable kernels on a Hopper GPU (seeds set_staging(tma=False)); plain launches instead
# of programmatic dependents (ASTRAI_GEMM_PDL=0 seeds set_staging(pdl=False)).
PORTABLE_KNOB = "ASTRAI_GEMM_PORTABLE"
PDL_KNOB = "ASTRAI_GEMM_PDL"


def _gemm():
    """ops.gemm (imported here, at call time: it imports this module)."""
    from astrai.extension.ops import gemm
    return gemm


# ---- recipes -------------------------------------------------------------------------------------------

class RecipeInfo(NamedTuple):
    """One recipe of the image as the planner sees it (`tile_vocabulary()`)."""

    id: int
    name: str
    tile_m: int
    tile_n: int
    kernel: str           # which mainloop runs it
    smem_bytes: int       # the most dynamic shared memory any of its kernels asks for (the C++ shapes' budget)
    layouts: tuple        # layout names it runs natively
    pairs: tuple          # pair names it runs
    needs_sm90: bool      # compute capability 9.0 and sm_90a code in the image
    tma: bool             # stages its operands by TMA (set_staging(tma=False) drops it)
    splits: tuple         # split_k values the op accepts ("1-64" spelled as a range)


# What the planner knows of a recipe beyond the op's rules: its mainloop, the most dynamic shared memory any of its
# kernels asks for (csrc/kernels/gemm/sm80_gemm.cuh's Recipe budgets, sm90_gemm.cuh 227 KB, sm90_stream.cuh 72 KB,
# sm90_w8a16.cuh 192-200 KB of stages + barriers) and whether it stages by TMA. Recipe ids are the op's
# (ops.gemm.RECIPES); which layouts and pairs each runs is the op's to say (`image_reason`).
_RECIPE_FACTS = {
    0: ("portable mma.sync", 96 * 1024, False),
    1: ("portable mma.sync", 96 * 1024, False),
    2: ("portable mma.sync (w8a16 nt: the weight stream)", 96 * 1024, False),
    3: ("portable mma.sync", 80 * 1024, False),
    4: ("sm90 wgmma + TMA", 227 * 1024, True),
    5: ("sm90 wgmma + TMA", 227 * 1024, True),
    6: ("sm90 weight stream (TMA, mma.sync)", 72 * 1024, True),
    7: ("sm90 w8a16 wgmma + TMA", 197 * 1024, True),
    8: ("sm90 w8a16 wgmma + TMA", 202 * 1024, True),
    9: ("sm90 w8a16 wgmma + TMA", 197 * 1024, True),
    10: ("sm90 wgmma + TMA", 227 * 1024, True),
    11: ("sm90 w8a16 wgmma + TMA", 197 * 1024, True),
}
def _recipe_splits(recipe: int) -> tuple:
    if recipe == 6:
        return tuple(range(1, SM90_STREAM_MAX_SPLIT + 1))
    return ((TAIL_SPLIT,) if recipe in _gemm().TAIL_RECIPES else ()) + (f"1-{MAX_SPLIT_K}",)


@functools.lru_cache(maxsize=1)
def _vocabulary() -> tuple:
    gemm = _gemm()
    out = []
    for rid, recipe in gemm.RECIPES.items():
        kernel, smem, tma = _RECIPE_FACTS[rid]

        def runs(pair: str, layout: str, device: Facts = _EVERYTHING) -> bool:
            return image_reason(Call(pair, layout, None, 128, 128, 1024), (rid, 1), device) is None
        layouts = tuple(lay for lay in gemm.LAYOUTS if any(runs(p, lay) for p in gemm.PAIRS))
        pairs = tuple(p for p in gemm.PAIRS if any(runs(p, lay) for lay in gemm.LAYOUTS))
        needs_sm90 = not runs(pairs[0], layouts[0], _EVERYTHING._replace(sm90_code=False))
        out.append(RecipeInfo(rid, recipe.name, recipe.tile_m, recipe.tile_n, kernel, smem, layouts, pairs,
                              needs_sm90, tma, _recipe_splits(rid)))
    return tuple(out)


def tile_vocabulary() -> list[RecipeInfo]:
    """Every recipe of this image: its id, name, tile, mainloop, shared-memory need, layouts, pairs and splits.

    Example
    -------
    >>> [r.name for r in tile_vocabulary()][:3]
    ['m128n128', 'm64n128', 'm16n64']
    """
    return list(_vocabulary())


def _recipe_id(value: str) -> int | None:
    """A row's recipe field: an id or a recipe name; None for a name this image does not have."""
    if value.isdigit():
        return int(value)
    for rid, recipe in _gemm().RECIPES.items():
        if recipe.name == value:
            return rid
    return None


# ---- device facts --------------------------------------------------------------------------------------

class Facts(NamedTuple):
    """What the planners know of a device (`facts()`); fabricate one to plan for another GPU (`probe(facts=)`)."""

    name: str
    cc: tuple          # (major, minor)
    num_sms: int
    smem_optin: int    # bytes of dynamic shared memory a CTA may opt in to
    sm90_code: bool    # the image holds sm_90a code for it (recipes 4-10 can run)
    driver: str
    image_sha256: str  # the gemm library's sha256 ("" where none is loaded)
    fp8_code_arch: int | None = None  # the arch of the image's fp8 code on it (None: its own, as with SASS for it)

    @property
    def arch(self) -> str:
        """The device class rows and builtin tables are keyed by: "sm90", "sm89", ..."""
        return f"sm{self.cc[0]}{self.cc[1]}"

    @property
    def fp8_arch(self) -> int:
        return self.cc[0] * 10 + self.cc[1] if self.fp8_code_arch is None else self.fp8_code_arch

    def signature(self) -> dict:
        """The plan cache's device signature: a tuned plan is reused only where all of this matches."""
        return {"gpu": self.name, "num_sms": self.num_sms, "cc": f"{self.cc[0]}.{self.cc[1]}",
                "driver": self.driver, "image_sha256": self.image_sha256}

    def signature_id(self) -> str:
        text = json.dumps(self.signature(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


# Opt-in shared memory by compute capability, for a torch without the property.
_SMEM_OPTIN = {(8, 0): 163 * 1024, (8, 6): 99 * 1024, (8, 7): 163 * 1024, (8, 9): 99 * 1024, (9, 0): 227 * 1024,
               (10, 0): 227 * 1024, (12, 0): 99 * 1024}


def _image_sha256() -> str:
    chosen = loader.selection().chosen
    library = chosen.libraries.get("gemm") if chosen is not None else None
    return library.sha256 if library is not None else ""


def _device_facts(index: int) -> Facts:
    props = torch.cuda.get_device_properties(index)
    cc = tuple(torch.cuda.get_device_capability(index))
    smem = getattr(props, "shared_memory_per_block_optin", None) or _SMEM_OPTIN.get(cc, 48 * 1024)
    version, _ = loader.query_driver_version()
    return Facts(str(getattr(props, "name", "cuda")), cc, int(props.multi_processor_count), int(smem),
                 bool(_gemm().sm90_code_in_image(index)), str(version or ""), _image_sha256(),
                 _gemm().fp8_code_arch_in_image(index))


_facts_memo: dict[int, Facts] = {}


def facts(device=None) -> Facts:
    """The device facts the planners use (queried once per device index and process).

    `device`: a CUDA device, index or None (the current device)."""
    index = cuda_index(device)
    found = _facts_memo.get(index)
    if found is None:
        found = _facts_memo[index] = _device_facts(index)
    return found


_facts_of = facts  # for probe(), whose `facts` argument shadows the function
# A device that lacks nothing, for asking the op which layouts and pairs a recipe runs.
_EVERYTHING = Facts("any", (9, 0), 132, 227 * 1024, True, "", "")


# ---- rows ----------------------------------------------------------------------------------------------

class Range(NamedTuple):
    lo: int
    hi: int | None  # None: unbounded

    def holds(self, value: int) -> bool:
        return self.lo <= value and (self.hi is None or value <= self.hi)

    @property
    def is_any(self) -> bool:
        return self.lo == 0 and self.hi is None

    def __str__(self) -> str:
        if self.is_any:
            return "*"
        if self.hi == self.lo:
            return str(self.lo)
        return f"{self.lo}-{'*' if self.hi is None else self.hi}"


ANY = Range(0, None)
_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+|\*))?$")


@dataclasses.dataclass(frozen=True)
class Row:
    """One plan row: where (arch, pair, layout, M, N, K ranges) it applies, what it launches, where it came from."""

    arch: str            # "sm90", ... or "*"
    pair: str            # a pair name or "*"
    layout: str          # a layout name or "*"
    m: Range
    n: Range
    k: Range
    recipe: int | None   # None: a recipe name this image does not have (falls through)
    split: int
    recipe_text: str
    source: str          # "<file>:<line>"

    def matches(self, arch: str, pair: str, layout: str, m: int, n: int, k: int) -> bool:
        return ((self.arch == "*" or self.arch == arch) and (self.pair == "*" or self.pair == pair)
                and (self.layout == "*" or self.layout == layout) and self.m.holds(m) and self.n.holds(n)
                and self.k.holds(k))

    def text(self) -> str:
        return " ".join((self.arch, self.pair, self.layout, str(self.m), str(self.n), str(self.k),
                         self.recipe_text, str(self.split)))


class RowsError(ValueError):
    """A malformed rows file or text: the message names the source, the line and the field."""


def _bad(source: str, line: int, field: str, expected: str, got: str) -> RowsError:
    return RowsError(f"gemm plan rows {source}, line {line}: field {field!r} must be {expected}, got {got!r}")


def _parse_range(source: str, line: int, field: str, value: str) -> Range:
    if value == "*":
        return ANY
    match = _RANGE_RE.match(value)
    if not match:
        raise _bad(source, line, field, "'*', N, 'LO-HI' or 'LO-*' (integers >= 0)", value)
    lo = int(match.group(1))
    hi_text = match.group(2)
    hi = lo if hi_text is None else (None if hi_text == "*" else int(hi_text))
    if hi is not None and hi < lo:
        raise _bad(source, line, field, "a range with LO <= HI", value)
    return Range(lo, hi)


def parse_rows(text: str, source: str = "<text>") -> list[Row]:
    """Parse rows text: a header line `astrai-gemm-rows 1`, then one row a line (`# ...` comments, blank lines
    ignored): `arch pair layout m n k recipe split`. RowsError naming `source`, the line and the field otherwise."""
    gemm = _gemm()
    rows: list[Row] = []
    header_seen = False
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        fields = line.split()
        if not header_seen:
            if fields[0] != ROWS_HEADER:
                raise _bad(source, number, "header", f"'{ROWS_HEADER} {ROWS_VERSION}' as the first line", line)
            if len(fields) != 2 or fields[1] != str(ROWS_VERSION):
                raise _bad(source, number, "version", f"{ROWS_VERSION} (the version this release reads)",
                           " ".join(fields[1:]))
            header_seen = True
            continue
        if len(fields) != len(ROW_FIELDS):
            raise _bad(source, number, "row", f"{len(ROW_FIELDS)} fields ({' '.join(ROW_FIELDS)})", line)
        arch, pair, layout, m, n, k, recipe, split = fields
        if arch != "*" and not re.match(r"^sm\d{2,3}$", arch):
            raise _bad(source, number, "arch", "'*' or smXY (the compute capability, e.g. sm90)", arch)
        if pair != "*" and pair not in gemm.PAIRS:
            raise _bad(source, number, "pair", f"'*' or one of {tuple(gemm.PAIRS)}", pair)
        if layout != "*" and layout not in gemm.LAYOUTS:
            raise _bad(source, number, "layout", f"'*' or one of {tuple(gemm.LAYOUTS)}", layout)
        ranges = [_parse_range(source, number, name, value) for name, value in (("m", m), ("n", n), ("k", k))]
        if not re.match(r"^(\d+|[a-z][a-z0-9_]*)$", recipe):
            raise _bad(source, number, "recipe", "a recipe id or name (tile_vocabulary())", recipe)
        if not split.isdigit() or int(split) > MAX_SPLIT_K:
            raise _bad(source, number, "split", f"an integer in [0, {MAX_SPLIT_K}] (0: the last wave split)", split)
        rows.append(Row(arch, pair, layout, *ranges, _recipe_id(recipe), int(split), recipe, f"{source}:{number}"))
    if not header_seen:
        raise _bad(source, 1, "header", f"'{ROWS_HEADER} {ROWS_VERSION}' as the first line", "(no rows)")
    return rows


def _read_rows_file(path: str | os.PathLike) -> list[Row]:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise RowsError(f"gemm plan rows {path}: cannot be read ({exc.strerror or exc})") from exc
    return parse_rows(text, str(path))


def _builtin_rows(arch: str) -> list[Row]:
    path = BUILTIN_DIR / f"{arch}.rows"
    return parse_rows(path.read_text(), f"{BUILTIN_DIR.name}/{path.name}") if path.is_file() else []


# ---- can a plan run here -------------------------------------------------------------------------------

class Call(NamedTuple):
    """A call as the planners see it: the caller's sizes (not the kernel's), dtypes named by pair."""

    pair: str
    layout: str
    batch: int | None
    m: int
    n: int
    k: int
    batch_invariant: bool = False
    wide_out: bool = False  # a 4-byte output (int32, fp32): at large M the model prices its plans apart


def is_wide_out(out_dtype: torch.dtype) -> bool:
    """`Call.wide_out` for an output dtype: whether the planners price it as a 4-byte output."""
    return out_dtype.itemsize == 4


def image_reason(call: Call, plan: tuple[int, int], device: Facts) -> str | None:
    """Why this image's op would refuse `plan` for `call` on `device`, or None: the op's own rules
    (`torch.ops.astrai.quant_gemm_can_implement`, the C++ `gemm_unsupported_on` and `gemm_plan_unfit` that the op
    checks before a launch), asked with the device's facts instead of the current device's. Loads the gemm family
    (on a CPU too); FamilyUnavailableError naming why where no image serves it."""
    gemm = _gemm()
    gemm.load()
    a_dtype, b_dtype = gemm.PAIRS[call.pair][0]  # every dtype pair of a pair name follows the same rules
    why = torch.ops.astrai.quant_gemm_can_implement(a_dtype, b_dtype, gemm.LAYOUTS[call.layout], int(plan[0]),
                                                     int(plan[1]), call.m, call.n, call.batch or 1,
                                                     device.cc[0] * 10 + device.cc[1], bool(device.sm90_code),
                                                     device.fp8_arch)
    return why or None


def can_run(call: Call, plan: tuple[int, int], device: Facts, *, tma: bool = True, mx: bool = True) -> str | None:
    """Why `plan` cannot run `call` on `device` with this image and the staging switches, or None when it can: the
    op's rules (`image_reason`), then the policy's own: TMA and mx staging, the shared-memory ceiling, batch
    invariance."""
    recipe, split = plan
    if recipe not in _RECIPE_FACTS or recipe not in _gemm().RECIPES:
        return f"recipe {recipe} does not exist in this image"
    why = image_reason(call, plan, device)
    if why is not None:
        return why
    kernel, smem, uses_tma = _RECIPE_FACTS[recipe]
    if uses_tma and not tma:
        return f"recipe {recipe} stages by TMA, and set_staging(tma=False) is in force"
    if smem > device.smem_optin:
        return f"recipe {recipe} needs {smem} bytes of shared memory, the device allows {device.smem_optin}"
    if call.pair == "fp8" and device.cc >= (12, 0) and not mx:
        return "fp8 on sm_120 runs the block-scale (mx) mma cell only, and set_staging(mx=False) is in force"
    if split == TAIL_SPLIT and call.batch_invariant:
        return "split 0 (the last wave split) depends on M: not batch-invariant"
    return None


# ---- state ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _Tuning:
    enabled: bool = False
    roots: tuple = ()
    max_shapes: int = DEFAULT_MAX_SHAPES
    trigger: int = DEFAULT_TRIGGER
    tuned: int = 0                                   # shapes tuned by this process
    calls: dict = dataclasses.field(default_factory=dict)   # key -> calls seen before tuning
    plans: dict = dataclasses.field(default_factory=dict)   # key -> (recipe, split) or None (looked up: no entry)
    full_noted: bool = False


@dataclasses.dataclass
class _State:
    planner: str = DEFAULT_PLANNER
    log: bool = False
    tma: bool = True
    mx: bool = True
    pdl: bool = True
    override: list = dataclasses.field(default_factory=list)
    override_source: str = ""
    injected: list = dataclasses.field(default_factory=list)
    builtin: dict = dataclasses.field(default_factory=dict)   # arch -> rows
    tuning: _Tuning = dataclasses.field(default_factory=_Tuning)
    seeded: bool = False
    seeds: list = dataclasses.field(default_factory=list)      # the environment variables that seeded the state


_lock = threading.RLock()
_state = _State()
# Memo of decisions: (Call, Facts) -> Decision. Cleared by every setter.
_decisions: dict = {}
# plan_call's memo of final plans (no tuning pending), keyed by what a call's tensors say directly: (a.dtype,
# b.dtype, layout, a.shape, b.shape, batch_invariant, a.device) -> plan. Cleared with _decisions.
_final_plans: dict = {}


def _changed() -> None:
    _decisions.clear()
    _final_plans.clear()


def _env_int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {value!r}") from None


def _seed_from_env() -> None:
    """The deprecated environment variables, once per process, before any explicit call takes effect (applying them
    again after an error is harmless: each sets a value)."""
    if _state.seeded:
        return
    env = os.environ
    used = [name for name in ENV_SEEDS if env.get(name, "") != ""]
    for name in used:
        warnings.warn(f"{name} is deprecated: call astrai.extension.gemm_plan.{ENV_SEEDS[name]} instead (read once "
                      "per process; explicit calls override it)", DeprecationWarning, stacklevel=3)
    _state.seeds = (used + ([PORTABLE_KNOB] if env.get(PORTABLE_KNOB, "") not in ("", "0") else [])
                    + ([PDL_KNOB] if env.get(PDL_KNOB) == "0" else []))
    if env.get(PDL_KNOB) == "0":
        _state.pdl = False
    if env.get("ASTR_GEMM_TABLE"):
        _state.override = _read_rows_file(env["ASTR_GEMM_TABLE"])
        _state.override_source = env["ASTR_GEMM_TABLE"]
    if env.get("ASTR_GEMM_PLAN"):
        recipe, _, split = env["ASTR_GEMM_PLAN"].replace(",", " ").partition(" ")
        text = f"{ROWS_HEADER} {ROWS_VERSION}\n* * * * * * {recipe.strip()} {split.strip()}\n"
        _state.override = parse_rows(text, "ASTR_GEMM_PLAN") + _state.override
        _state.override_source = "ASTR_GEMM_PLAN" + (f" + {_state.override_source}" if _state.override_source else "")
    if env.get("ASTR_GEMM_MODEL"):
        _set_planner(env["ASTR_GEMM_MODEL"].strip().lower(), "ASTR_GEMM_MODEL")
    if env.get("ASTR_GEMM_NO_TMA", "") not in ("", "0") or env.get(PORTABLE_KNOB, "") not in ("", "0"):
        _state.tma = False
    if env.get("ASTR_GEMM_NO_MX", "") not in ("", "0"):
        _state.mx = False
    if env.get("ASTR_GEMM_AUTOTUNE", "") not in ("", "0"):
        _enable(env.get("ASTR_GEMM_TUNE_DIR") or None,
                _env_int("ASTR_GEMM_TUNE_MAX_SHAPES", env.get("ASTR_GEMM_TUNE_MAX_SHAPES") or str(DEFAULT_MAX_SHAPES)),
                _env_int("ASTR_GEMM_TUNE_TRIGGER", env.get("ASTR_GEMM_TUNE_TRIGGER") or str(DEFAULT_TRIGGER)))
    _state.seeded = True  # only once it all applied: a bad seed raises at every use of the chain until it is fixed


def _set_planner(name: str, fn: str) -> None:
    if name == "":
        name = DEFAULT_PLANNER
    if name not in PLANNERS:
        raise ValueError(f"{fn}: planner must be one of {PLANNERS} or '' (the default), got {name!r}")
    _state.planner = name


def set_planner(name: str) -> None:
    """Which planners take part: "hybrid" (the default: rows, tuned plans, then the model), "table" (rows and
    tuned plans, no model) or "model" (the model, no injected / builtin / tuned rows); "" restores the default.
    Override rows and the degraded ladder take part under all three."""
    with _lock:
        _seed_from_env()
        _set_planner(name, "set_planner")
        _changed()


def set_table(source: str | os.PathLike | None) -> None:
    """Set the override rows: a rows file's path, rows text (it has a newline), "-" (read standard input) or
    None / "" (no override rows). RowsError naming the file, line and field for a malformed one; the previous
    override stays then.

    Example
    -------
    >>> set_table("astrai-gemm-rows 1\\nsm90 w16a16 nt 1-8 * * 6 2\\n")
    """
    if source is None or source == "":
        rows, name = [], ""
    elif isinstance(source, str) and source == "-":
        rows, name = parse_rows(sys.stdin.read(), "<stdin>"), "<stdin>"
    elif isinstance(source, str) and "\n" in source:
        rows, name = parse_rows(source, "<text>"), "<text>"
    else:
        rows, name = _read_rows_file(source), str(source)
    with _lock:
        _seed_from_env()
        _state.override, _state.override_source = rows, name
        _changed()


def inject_rows(rows: str | list[Row], *, replace: bool = False) -> int:
    """Add rows (text with the header, or parsed `Row`s) ranked below override rows and above the builtin table;
    `replace=True` drops the injected rows first (`inject_rows("", replace=True)` clears them). Returns how many
    injected rows are in force."""
    parsed = parse_rows(rows, "<injected>") if isinstance(rows, str) and rows.strip() else (
        [] if isinstance(rows, str) else list(rows))
    with _lock:
        _seed_from_env()
        _state.injected = parsed + ([] if replace else _state.injected)
        _changed()
        return len(_state.injected)


def set_log(on: bool = True) -> None:
    """Print one `[gemm-plan]` line to stderr per decision (a call shape seen the first time): the plan, who
    made it and why the planners before it passed."""
    with _lock:
        _seed_from_env()
        _state.log = bool(on)


def set_staging(*, tma: bool | None = None, mx: bool | None = None, pdl: bool | None = None) -> None:
    """Staging switches: `tma=False` drops the recipes that stage operands by TMA (4-10: the portable kernels
    on a Hopper GPU); `mx=False` drops the block-scale (mx) fp8 cell, which is sm_120's only fp8 kernel (fp8
    calls there then raise); `pdl=False` launches every GEMM kernel plainly instead of as a programmatic dependent
    of the stream's previous kernel (same bits; for comparison). None leaves a switch as it is."""
    with _lock:
        _seed_from_env()
        if tma is not None:
            _state.tma = bool(tma)
        if mx is not None:
            _state.mx = bool(mx)
        if pdl is not None:
            _state.pdl = bool(pdl)
        _changed()
        _native_synced.clear()
    sync_native()


# The library's process-wide switches pushed since the last change ("pdl"); empty: push at the next sync.
_native_synced: set = set()


def sync_native() -> None:
    """Push the switches the launchers read (programmatic dependent launch) into the gemm library, once it is
    loaded and after each change; the loader calls it when the family loads. The launchers read no environment."""
    if _native_synced:
        return
    if "gemm" not in loader.loaded_families() or not hasattr(torch.ops.astrai, "quant_gemm_set_pdl"):
        return
    with _lock:
        _seed_from_env()
        torch.ops.astrai.quant_gemm_set_pdl(_state.pdl)
        _native_synced.add("pdl")


def reset() -> None:
    """Everything back to the defaults (no rows, no tuning, log off); the environment seed is not read again."""
    global _state
    with _lock:
        _state = _State(seeded=True)
        _changed()
        _native_synced.clear()
    sync_native()


# ---- deciding ------------------------------------------------------------------------------------------

class Decision(NamedTuple):
    """A plan and who made it (`planner`: override, injected, builtin, tuned, model or degraded; `row`: the
    row's source for a row planner); `passed`: (planner, why) for each planner that answered a plan it could not
    run here."""

    plan: tuple
    planner: str
    row: str
    passed: tuple


def _degraded(call: Call) -> tuple[int, int]:
    """The band ladder: the portable recipe for the kernel's rows at split 1 (every pair, layout and device)."""
    gemm = _gemm()
    rows = call.n if gemm.runs_swapped(call.pair, gemm.LAYOUTS[call.layout]) else call.m
    if call.batch_invariant:
        return 0, 1  # every portable recipe sums K in one order, so one recipe at every M
    return (2 if rows <= gemm.SMALL_M else 1 if rows <= gemm.MEDIUM_M else 0), 1


def _model(call: Call, device: Facts) -> tuple[int, int]:
    gemm = _gemm()
    shape = gemm.Problem(call.batch, call.m, call.n, call.k, call.k)
    return gemm.plan_problem(gemm.LAYOUTS[call.layout], shape, call.pair, device.num_sms, call.batch_invariant,
                             sm90=device.sm90_code and _state.tma, wide_out=call.wide_out)


def _row_plan(rows: list[Row], call: Call, arch: str) -> Row | None:
    """The first row that serves `call` (a batch-invariant call: only rows that give every M the same plan)."""
    for row in rows:
        if not row.matches(arch, call.pair, call.layout, call.m, call.n, call.k):
            continue
        if call.batch_invariant and (not row.m.is_any or row.split == TAIL_SPLIT):
            continue
        return row
    return None


def _decide(call: Call, device: Facts, tuned: tuple | None) -> Decision:
    passed = []
    planner = _state.planner
    stages = [("override", _state.override)]
    if planner != "model":
        stages += [("injected", _state.injected), ("builtin", _builtin_for(device.arch))]
    for name, rows in stages:
        row = _row_plan(rows, call, device.arch)
        if row is None:
            continue
        if row.recipe is None:
            passed.append((name, f"{row.source}: recipe {row.recipe_text!r} does not exist in this image"))
            continue
        why = can_run(call, (row.recipe, row.split), device, tma=_state.tma, mx=_state.mx)
        if why is None:
            return Decision((row.recipe, row.split), name, row.source, tuple(passed))
        passed.append((name, f"{row.source}: {why}"))
    if planner != "model" and tuned is not None:
        why = can_run(call, tuned, device, tma=_state.tma, mx=_state.mx)
        if why is None:
            return Decision(tuple(tuned), "tuned", "", tuple(passed))
        passed.append(("tuned", why))
    if planner != "table":
        plan = _model(call, device)
        why = can_run(call, plan, device, tma=_state.tma, mx=_state.mx)
        if why is None:
            return Decision(plan, "model", "", tuple(passed))
        passed.append(("model", why))
    plan = _degraded(call)
    why = can_run(call, plan, device, tma=_state.tma, mx=_state.mx)
    if why is not None and image_reason(call, plan, device) is None:
        # the policy's own switches leave nothing (fp8 on sm_120 with mx off); where the op's rules refuse every plan
        # (fp8 below sm_89, a call past the grid limits) the ladder's plan goes ahead and the op raises its reason
        raise ValueError(f"quant_gemm: no plan can run {call.pair} layout {call.layout} M={call.m} N={call.n} "
                         f"K={call.k} here: {why}")
    return Decision(plan, "degraded", "", tuple(passed) + ((("degraded", why),) if why else ()))


def _builtin_for(arch: str) -> list[Row]:
    rows = _state.builtin.get(arch)
    if rows is None:
        rows = _state.builtin[arch] = _builtin_rows(arch)
    return rows


def _log(call: Call, decision: Decision) -> None:
    passed = "; ".join(f"{name} passed: {why}" for name, why in decision.passed)
    by = decision.planner + (f" ({decision.row})" if decision.row else "")
    batch = f"B={call.batch} " if call.batch is not None else ""
    print(f"[gemm-plan] {call.pair} {call.layout} {batch}M={call.m} N={call.n} K={call.k}"
          f"{' batch-invariant' if call.batch_invariant else ''}{' out 4-byte' if call.wide_out else ''}"
          f" -> recipe {decision.plan[0]} split "
          f"{decision.plan[1]} by {by}" + (f" ({passed})" if passed else ""), file=sys.stderr)


def decide(call: Call, device: Facts) -> Decision:
    """The chain's decision for `call` on `device` (memoized until a setter changes the state)."""
    key = (call, device)
    found = _decisions.get(key)
    if found is not None:
        return found
    with _lock:
        _seed_from_env()
        tuned = _tuned_plan(call, device) if _state.tuning.enabled and not call.batch_invariant else None
        decision = _decide(call, device, tuned)
        _decisions[key] = decision
        if _state.log:
            _log(call, decision)
    return decision


def probe(m: int, n: int, k: int, *, dtypes=(torch.bfloat16, torch.bfloat16), layout: str = "nt",
          batch: int | None = None, batch_invariant: bool = False, device=None,
          facts: Facts | None = None, out_dtype: torch.dtype = torch.bfloat16) -> Decision:
    """The decision the chain makes for a call of these sizes (the caller's M, N, K, as `quant_gemm` reads them
    from the operands) and output dtype, and who made it. `facts` plans for another device (tier 0 tests, a table
    for a GPU not in hand); default the current CUDA device.

    Example
    -------
    >>> probe(1, 4096, 4096, dtypes=(torch.bfloat16, torch.int8))
    Decision(plan=(2, 16), planner='model', row='', passed=())
    """
    gemm = _gemm()
    pair = gemm.pair_of(*dtypes)
    if pair is None:
        raise ValueError(f"probe: dtypes must be a supported pair ({', '.join(gemm.PAIRS)}), got {tuple(dtypes)}")
    gemm.layout_code("probe", layout)
    for name, value in (("m", m), ("n", n), ("k", k)):
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"probe: {name} must be an int >= 0, got {value!r}")
    if not isinstance(out_dtype, torch.dtype):
        raise ValueError(f"probe: out_dtype must be a torch.dtype, got {out_dtype!r}")
    device_facts = facts if facts is not None else _facts_of(device)
    return decide(Call(pair, layout, batch, m, n, k, bool(batch_invariant), is_wide_out(out_dtype)), device_facts)


def state() -> dict:
    """The chain's settings now: planner, log, staging, rows in force (counts and sources), autotuning, the
    environment variables that seeded it, and how many decisions are memoized."""
    with _lock:
        _seed_from_env()
        t = _state.tuning
        return {
            "planner": _state.planner,
            "log": _state.log,
            "staging": {"tma": _state.tma, "mx": _state.mx, "pdl": _state.pdl},
            "override": {"rows": len(_state.override), "source": _state.override_source},
            "injected": {"rows": len(_state.injected)},
            "builtin": {arch: len(rows) for arch, rows in _state.builtin.items()},
            "autotune": {"enabled": t.enabled, "cache_roots": [str(r) for r in t.roots], "max_shapes": t.max_shapes,
                         "trigger": t.trigger, "tuned_this_process": t.tuned},
            "env_seeds": list(_state.seeds),
            "decisions": len(_decisions),
        }


# ---- the plan cache ------------------------------------------------------------------------------------

def default_cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "astrai-kernels", "gemm-plans")


def _roots(cache_dir) -> tuple[Path, ...]:
    if cache_dir is None or cache_dir == "":
        cache_dir = default_cache_dir()
    parts = cache_dir if isinstance(cache_dir, (list, tuple)) else str(cache_dir).split(os.pathsep)
    roots = tuple(Path(p).expanduser() for p in parts if str(p))
    if not roots:
        raise ValueError(f"enable: cache_dir must name at least one directory, got {cache_dir!r}")
    return roots


def _key_text(call: Call) -> str:
    batch = "-" if call.batch is None else str(call.batch)
    wide = ".o4" if call.wide_out else ""  # a 16-bit output's key is the one written before outputs were told apart
    return f"{call.pair}.{call.layout}.b{batch}.m{call.m}.n{call.n}.k{call.k}{wide}"


def _writable(path: Path) -> bool:
    return os.access(path, os.W_OK | os.X_OK)


class PlanCache:
    """Tuned plans on disk: `roots` searched in order; an entry is one JSON file
    `<root>/<signature id>/<pair>.<layout>.b<batch>.m<M>.n<N>.k<K>[.o4].json` (`.o4`: a 4-byte output, tuned apart),
    written to the first writable root by atomic rename after fsync (so a reader sees a whole entry or none, and
    processes writing the same entry leave one of theirs). A file that does not parse or describes another device or
    call is reported and skipped."""

    def __init__(self, roots) -> None:
        self.roots = tuple(Path(r) for r in roots)
        self.problems: list[str] = []   # what was rejected, for state() and tests

    def _path(self, root: Path, device: Facts, call: Call) -> Path:
        return root / device.signature_id() / f"{_key_text(call)}.json"

    def lookup(self, device: Facts, call: Call) -> dict | None:
        for root in self.roots:
            path = self._path(root, device, call)
            try:
                text = path.read_text()
            except FileNotFoundError:
                continue
            except OSError as exc:
                self._reject(path, f"cannot be read ({exc.strerror or exc})")
                continue
            why = self._problem(text, device, call)
            if why is None:
                return json.loads(text)
            self._reject(path, why)
        return None

    def _reject(self, path: Path, why: str) -> None:
        message = f"gemm plan cache: {path} {why}; ignored (the shape is tuned again)"
        self.problems.append(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)

    @staticmethod
    def _problem(text: str, device: Facts, call: Call) -> str | None:
        try:
            entry = json.loads(text)
        except ValueError:
            return "is not JSON (truncated or foreign)"
        if not isinstance(entry, dict) or entry.get("format") != CACHE_FORMAT:
            return f"is not a plan cache entry (format must be {CACHE_FORMAT!r})"
        if entry.get("version") != CACHE_VERSION:
            return f"has version {entry.get('version')!r}, this release reads {CACHE_VERSION}"
        if entry.get("signature") != device.signature():
            return "was tuned on another device, driver or image (signature differs)"
        if entry.get("key") != _key_text(call):
            return f"holds the entry of another call ({entry.get('key')!r})"
        plan = entry.get("plan")
        if not (isinstance(plan, list) and len(plan) == 2 and all(isinstance(v, int) for v in plan)):
            return f"has no valid plan ({plan!r})"
        return None

    def writable_root(self) -> Path | None:
        """The first root that exists (or can be made) and that this process may write; None if none."""
        for root in self.roots:
            try:
                root.mkdir(parents=True, exist_ok=True)
            except OSError:
                continue
            if _writable(root):
                return root
        return None

    def store(self, device: Facts, call: Call, entry: dict) -> Path | None:
        """Publish `entry` in the first writable root; None when no root is writable."""
        root = self.writable_root()
        if root is None:
            return None
        path = self._path(root, device, call)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=path.parent)
        except OSError:
            return None
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(entry, f, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        with contextlib.suppress(OSError):  # the rename itself made durable
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        return path


def make_entry(device: Facts, call: Call, plan: tuple[int, int], timings: dict) -> dict:
    """A cache entry: the winner and every candidate's median microseconds."""
    return {"format": CACHE_FORMAT, "version": CACHE_VERSION, "signature": device.signature(),
            "key": _key_text(call), "plan": list(plan),
            "candidates": [[r, s, round(us, 3)] for (r, s), us in sorted(timings.items())],
            "torch": torch.__version__, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


# ---- the autotuner -------------------------------------------------------------------------------------

def _enable(cache_dir, max_shapes: int, trigger: int) -> None:
    if not isinstance(max_shapes, int) or max_shapes < 0:
        raise ValueError(f"enable: max_shapes must be an int >= 0, got {max_shapes!r}")
    if not isinstance(trigger, int) or trigger < 1:
        raise ValueError(f"enable: trigger must be an int >= 1 (the call of a shape that tunes it), got {trigger!r}")
    t = _state.tuning
    t.enabled, t.roots, t.max_shapes, t.trigger = True, _roots(cache_dir), max_shapes, trigger
    t.plans.clear()
    t.calls.clear()
    t.full_noted = False


def enable(cache_dir: str | os.PathLike | list | None = None, *, max_shapes: int = DEFAULT_MAX_SHAPES,
           trigger: int = DEFAULT_TRIGGER) -> None:
    """Autotune: a call shape no row serves is timed once over every recipe and split that can run it (on the
    caller's own operands, into a scratch output: tuning never changes a result), and the winner is kept for
    this process and in the plan cache.

    Parameters
    ----------
    cache_dir : str, path or list, optional
        Cache roots, colon-separated (or a list): searched in order; a tuned plan is written to the first
        writable one; a shared read-only root is read only. Default `$XDG_CACHE_HOME/astrai-kernels/gemm-plans`
        (`~/.cache/...`).
    max_shapes : int
        Shapes this process tunes at most; past it, untuned shapes take the rest of the chain.
    trigger : int
        The call of a shape that tunes it (1: its first call; larger skips one-off shapes).

    Example
    -------
    >>> enable("/scratch/plans:/shared/plans", trigger=2)
    """
    with _lock:
        _seed_from_env()
        _enable(cache_dir, max_shapes, trigger)
        _changed()


def disable() -> None:
    """Stop autotuning and forget the tuned plans of this process (the cache on disk stays)."""
    with _lock:
        _seed_from_env()
        _state.tuning = _Tuning()
        _changed()


def _tuned_plan(call: Call, device: Facts) -> tuple | None:
    """The tuned plan for `call` from this process or the cache (looked up once a shape), else None."""
    t = _state.tuning
    key = (call, device)
    if key not in t.plans:
        entry = PlanCache(t.roots).lookup(device, call)
        t.plans[key] = tuple(entry["plan"]) if entry is not None else None
    return t.plans[key]


def candidates(call: Call, device: Facts) -> list[tuple[int, int]]:
    """Every (recipe, split) the autotuner times for `call`: each recipe of `tile_vocabulary()` that can run it
    with the staging switches and shared-memory ceiling, at TUNE_SPLITS (each keeping >= one K tile a slice) and
    the last wave split where allowed, in vocabulary order."""
    gemm = _gemm()
    out = []
    k_tile = 64  # the smallest K tile of any recipe (16-bit values)
    swapped = gemm.runs_swapped(call.pair, gemm.LAYOUTS[call.layout])
    rows, cols = (call.n, call.m) if swapped else (call.m, call.n)
    for info in tile_vocabulary():
        tiles = math.ceil(max(rows, 1) / info.tile_m) * math.ceil(max(cols, 1) / info.tile_n) * (call.batch or 1)
        for split in ((TAIL_SPLIT,) if info.id in gemm.TAIL_RECIPES else ()) + TUNE_SPLITS:
            if split > 1 and math.ceil(call.k / k_tile) < split:
                continue
            if split > 1 and tiles * (split // 2) >= 4 * device.num_sms:
                continue  # the half split already ran four waves of CTAs: more slices only add partial sums
            if info.id == 6 and rows <= gemm.SMALL_M and tiles * split > gemm.SM90_STREAM_FILL * device.num_sms:
                continue  # a grid past the model's fill (TUNE_SPLITS)
            if can_run(call, (info.id, split), device, tma=_state.tma, mx=_state.mx) is None:
                out.append((info.id, split))
    return out


# Host time to enqueue one timed launch (events + the op's Python and binding), generously: a round's sleep covers it.
ENQUEUE_US = 60.0
# GPU time of reading the L2 flush buffer before a timed launch (~120 MB at ~3 TB/s), for the round's sleep.
FLUSH_US = 60.0


def _timed_round(run: Callable, plans: list, stream, flush: torch.Tensor | None) -> dict:
    """Each plan once between two CUDA events, the GPU kept busy (a sleep kernel queued first, long enough to cover
    the host's enqueueing of the round) so each event pair times the kernels alone, not the host's launch gap.
    `flush` (twice the L2) is read before each timed launch, outside its events: operands come from DRAM, as a
    layer's weights do in a model (with operands left in L2, small-M weight streams favour other splits)."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is not None:
        sleep(int((ENQUEUE_US + (FLUSH_US if flush is not None else 0.0)) * len(plans) * 2000))  # cycles, <= 2 GHz
    events = []
    for plan in plans:
        if flush is not None:
            flush.amax()  # read: leaves L2 clean (a write would leave write-backs inside the next timed window)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        run(plan)
        end.record(stream)
        events.append((plan, start, end))
    stream.synchronize()
    return {plan: start.elapsed_time(end) * 1000.0 for plan, start, end in events}


def l2_flush_buffer(device=None) -> torch.Tensor:
    """A CUDA buffer twice the device's L2 (at least 64 MiB), for timing with operands evicted from L2."""
    index = torch.cuda.current_device() if device is None else torch.device(device).index or 0
    l2 = int(getattr(torch.cuda.get_device_properties(index), "L2_cache_size", 0) or 0)
    return torch.zeros(max(2 * l2, 64 << 20) // 4, dtype=torch.float32, device=torch.device("cuda", index))


def time_candidates(run: Callable[[tuple[int, int]], None], plans: list[tuple[int, int]], *,
                    rounds: int = TUNE_ROUNDS, keep=(), flush_l2: bool = True) -> dict[tuple[int, int], float]:
    """Median microseconds of `run(plan)` for each plan: one screening call each (slower than SCREEN_FACTOR x the
    fastest: left out), then `rounds` interleaved rounds timed by CUDA events on the current stream (a plan slower
    than PRUNE_FACTOR x the best median after PRUNE_AFTER rounds is dropped from later rounds). A plan whose run
    raises is left out. Plans in `keep` are timed every round whatever their speed. `flush_l2`: each timed launch
    starts with the operands out of L2 (`_timed_round`)."""
    ok: list = []
    stream = torch.cuda.current_stream()
    flush = l2_flush_buffer() if flush_l2 else None
    for plan in plans:  # each once untimed: a kernel's first launch also loads it
        try:
            run(plan)
        except RuntimeError:
            continue
        ok.append(plan)
    screen = _timed_round(run, ok, stream, flush)
    if not screen:
        return {}
    fastest = min(screen.values())
    keep = {tuple(plan) for plan in keep}
    live = [plan for plan in plans if plan in screen and (screen[plan] <= SCREEN_FACTOR * fastest or plan in keep)]
    times: dict = {plan: [] for plan in live}
    for r in range(rounds):
        for plan, us in _timed_round(run, live, stream, flush).items():
            times[plan].append(us)
        if r + 1 == PRUNE_AFTER and live:
            best = min(statistics.median(times[p]) for p in live)
            live = [p for p in live if statistics.median(times[p]) <= PRUNE_FACTOR * best or p in keep]
    return {plan: statistics.median(ts) for plan, ts in times.items() if ts}


def pick(timings: dict[tuple[int, int], float], chain_plan: tuple[int, int] | None) -> tuple[int, int]:
    """The tie policy: the fastest median, unless the chain's own plan or an earlier plan in vocabulary order is
    within TIE of it (then the chain's plan, else the earliest such)."""
    fastest = min(timings.values())
    tied = sorted(plan for plan, us in timings.items() if us <= fastest * (1 + TIE))
    if chain_plan is not None and tuple(chain_plan) in tied:
        return tuple(chain_plan)
    return tied[0]


def tune(call: Call, device: Facts, run: Callable[[tuple[int, int]], None], *,
         timer: Callable = time_candidates) -> tuple[tuple[int, int], dict]:
    """Time every candidate of `call` through `run(plan)` and return (winner, timings); the winner is kept for
    this process and published in the plan cache when autotuning is enabled."""
    with _lock:
        chain_plan = _decide(call, device, None).plan
        plans = candidates(call, device)
        if tuple(chain_plan) not in plans:
            plans.append(tuple(chain_plan))  # the plan tuning must beat is always timed
    timings = timer(run, plans)
    if not timings:
        return chain_plan, {}
    winner = pick(timings, chain_plan)
    with _lock:
        t = _state.tuning
        t.plans[(call, device)] = winner
        t.tuned += 1
        if t.enabled:
            PlanCache(t.roots).store(device, call, make_entry(device, call, winner, timings))
        _decisions.pop((call, device), None)
        _final_plans.clear()
    return winner, timings


def _wants_tuning(call: Call, device: Facts) -> bool:
    """Count a call of an untuned shape; True at its trigger-th call while the process may still tune."""
    t = _state.tuning
    key = (call, device)
    if call.batch_invariant or _tuned_plan(call, device) is not None:
        return False
    if t.tuned >= t.max_shapes:
        if not t.full_noted and _state.log:
            print(f"[gemm-plan] autotune: {t.max_shapes} shapes tuned (max_shapes): the rest take the chain",
                  file=sys.stderr)
        t.full_noted = True
        return False
    t.calls[key] = t.calls.get(key, 0) + 1
    return t.calls[key] >= t.trigger


def plan_call(a: torch.Tensor, b: torch.Tensor, a_scale, b_scale, bias, out_dtype: torch.dtype, layout: int,
              out: torch.Tensor | None, batch_invariant: bool, may_tune: bool = True) -> tuple[int, int]:
    """The plan `ops.gemm.quant_gemm` launches for a call with plan=None: the chain's decision, tuned first where
    autotuning is on, `may_tune` is True and the call is not captured into a CUDA graph. Eager only: compiled code
    calls it when it runs, with may_tune=False (`ops.gemm.quant_gemm_planned`)."""
    out_dtype = out.dtype if out is not None else out_dtype
    key = (a.dtype, b.dtype, layout, a.shape, b.shape, batch_invariant, a.device, out_dtype)
    plan = _final_plans.get(key)
    if plan is not None:
        return plan
    gemm = _gemm()
    pair = gemm.pair_of(a.dtype, b.dtype)
    if not a.is_cuda or pair is None or a.dim() not in (2, 3) or b.dim() not in (2, 3):
        return 0, 1  # the op raises its own error
    shape = gemm.problem(layout, a.shape, b.shape)
    index = a.device.index if a.device.index is not None else torch.cuda.current_device()
    call = Call(pair, gemm.LAYOUT_NAMES[layout], shape.batch, shape.m, shape.n, shape.k_a, bool(batch_invariant),
                is_wide_out(out_dtype))
    device = facts(index)
    decision = decide(call, device)
    if not _state.tuning.enabled or decision.planner not in ("model", "degraded"):
        _final_plans[key] = decision.plan  # nothing can change it but a setter
        return decision.plan
    if not may_tune or torch.cuda.is_current_stream_capturing():
        return decision.plan  # tuning synchronizes: never while a graph is captured
    with _lock:
        wanted = _wants_tuning(call, device)
    if not wanted:
        if _state.tuning.tuned >= _state.tuning.max_shapes:
            _final_plans[key] = decision.plan
        return decision.plan
    scratch = torch.empty(shape.out_shape, dtype=out_dtype, device=a.device)

    def run(plan: tuple[int, int]) -> None:
        torch.ops.astrai.quant_gemm_out(a, b, a_scale, b_scale, bias, layout, plan[0], plan[1], scratch)

    with torch.cuda.device(a.device):  # the op runs on a's device: time there (events, sleep, L2 flush)
        winner, timings = tune(call, device, run)
    if _state.log:
        print(f"[gemm-plan] autotune {_key_text(call)}: recipe {winner[0]} split {winner[1]} of {len(timings)} "
              f"timed ({min(timings.values()):.1f} us)" if timings else
              f"[gemm-plan] autotune {_key_text(call)}: nothing could be timed", file=sys.stderr)
    plan = decide(call, device).plan
    _final_plans[key] = plan
    return plan
