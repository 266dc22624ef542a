"""Image selection: which found image serves this machine, which is preferred, and the reason for each verdict.

Part of the image loader (`astrai.extension.loader` is the public face and re-exports these names). Pure
functions of what the loader queried (torch, driver, devices) and scanned (roots, images): no queries, no state.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ._cuda_driver import Device
from ._loader_images import (ENV_IMAGE, OVERRIDE_VARS, ImageRecord, Root, checksum_problem, driver_pair,
                             library_on_device)


@dataclass
class Selection:
    """The per-process choice of image and everything seen while making it (treat as read-only)."""

    torch_version: str | None
    torch_cuda: str | None
    torch_error: str
    driver_version: int | None
    driver_reason: str
    devices: tuple[Device, ...]
    devices_reason: str
    roots: list[Root]
    images: list[ImageRecord]
    chosen: ImageRecord | None
    why: str  # why the chosen image won, or why there is none
    forced: str | None
    overrides: dict[str, str]

    @property
    def gpu_visible(self) -> bool:
        return self.driver_version is not None and bool(self.devices)

    @property
    def registration_only(self) -> bool:
        """The chosen image is loaded only so that op schemas register: no GPU is visible."""
        return self.chosen is not None and not self.gpu_visible


# --- eligibility and preference -------------------------------------------------------------------------


def _evaluate(record: ImageRecord, driver_version: int, devices: tuple[Device, ...]) -> None:
    """Mark the image eligible (serves = "sass" | "ptx") or rejected for this driver and these devices."""
    driver = driver_pair(driver_version)
    if driver[0] < record.cuda_major:
        record.reject(f"driver too old for the image: it supports CUDA {driver[0]}.{driver[1]}, the image "
                      f"(toolkit {record.toolkit_text}) needs a CUDA {record.cuda_major}.x driver or newer")
        return
    problems, jit = [], []
    for device in devices:
        for family, library in record.libraries.items():
            mode, detail = library_on_device(library, device, record, driver)
            if mode is None:
                problems.append(f"{device.describe()} not served: '{family}' has {detail}")
            elif mode == "ptx":
                jit.append(f"{device.describe()}: '{family}' through {detail} PTX")
    if problems:
        record.reject("; ".join(problems))
        return
    record.status, record.serves, record.jit = "eligible", ("ptx" if jit else "sass"), jit


def _torch_major(torch_cuda: str | None) -> int | None:
    match = re.match(r"\s*(\d+)", torch_cuda or "")
    return int(match.group(1)) if match else None


def _rank(record: ImageRecord, torch_major: int | None) -> tuple:
    """Smaller is preferred: SASS over PTX, toolkit major equal to torch's, newest toolkit, search order."""
    return (0 if record.serves != "ptx" else 1,
            0 if torch_major is not None and record.cuda_major == torch_major else 1,
            tuple(-part for part in record.toolkit),
            record.order)


def _why_not(loser: ImageRecord, winner: ImageRecord, torch_cuda: str | None) -> str:
    torch_major = _torch_major(torch_cuda)
    a, b = _rank(winner, torch_major), _rank(loser, torch_major)
    if a[0] != b[0]:
        return f"{winner.name} has SASS for every visible device, {loser.name} needs the PTX JIT"
    if a[1] != b[1]:
        return (f"{winner.name}'s toolkit major {winner.cuda_major} matches torch's CUDA {torch_cuda}, "
                f"{loser.name}'s {loser.cuda_major} does not")
    if a[2] != b[2]:
        return f"{winner.name} has the newer toolkit ({winner.toolkit_text} over {loser.toolkit_text})"
    return f"same rank as {winner.name}, which comes earlier in the search order"


def _why_chosen(record: ImageRecord, rivals: int, gpu_visible: bool, torch_cuda: str | None) -> str:
    parts = []
    if gpu_visible:
        parts.append("SASS for every visible device" if record.serves == "sass"
                     else "runs through the driver's PTX JIT: " + "; ".join(record.jit))
    else:
        parts.append("no GPU visible: chosen by toolkit preference alone and loaded for registration only "
                     "(op schemas for CPU validation, fake tensors, torch.compile tracing)")
    torch_major = _torch_major(torch_cuda)
    if torch_major is None:
        parts.append("torch has no CUDA version to match")
    elif record.cuda_major == torch_major:
        parts.append(f"toolkit major {record.cuda_major} matches torch's CUDA {torch_cuda}")
    else:
        parts.append(f"toolkit major {record.cuda_major} differs from torch's CUDA {torch_cuda}")
    if rivals:
        parts.append(f"preferred over {rivals} other usable image(s)")
    parts.append("checksums verified")
    return "; ".join(parts)


# --- the choice -----------------------------------------------------------------------------------------


def _first_verified(records) -> ImageRecord | None:
    """The first record whose checksums match image.json; each one before it that does not is rejected."""
    for record in records:
        problem = checksum_problem(record)
        if not problem:
            return record
        record.reject(problem)
    return None


def choose(env: dict[str, str], torch_info: tuple[str | None, str | None, str],
           driver: tuple[int | None, str], devices: tuple[tuple[Device, ...], str], roots: list[Root],
           images: list[ImageRecord]) -> Selection:
    """Judge every scanned image against the machine and choose one: `ASTRAI_IMAGE` (in `env`) strictly, else
    the best ranked; checksums are verified for the image about to be chosen (a mismatch rejects it).

    `torch_info`, `driver` and `devices` are what `loader.query_torch`, `query_driver_version` and
    `query_devices` returned (devices `((), why)` without a driver). Marks every record (status, reason) and
    returns the selection.
    """
    torch_version, torch_cuda, torch_error = torch_info
    driver_version, driver_reason = driver
    devices, devices_reason = tuple(devices[0]), devices[1]
    gpu_visible = driver_version is not None and bool(devices)
    for record in images:
        if record.defects:
            record.reject("; ".join(record.defects))
        elif gpu_visible:
            _evaluate(record, driver_version, devices)
        else:
            record.status = "eligible"
    forced = env.get(ENV_IMAGE, "").strip() or None
    overrides = {name: env[name] for name in OVERRIDE_VARS if env.get(name)}
    torch_major = _torch_major(torch_cuda)
    candidates = sorted((r for r in images if r.status == "eligible"), key=lambda r: _rank(r, torch_major))
    chosen, why = None, ""

    if forced is not None:
        named = [r for r in images if r.name == forced]
        chosen = _first_verified(r for r in named if r.status == "eligible")
        if chosen is not None:
            why = f"forced by {ENV_IMAGE}={forced}; " + _why_chosen(chosen, 0, gpu_visible, torch_cuda)
        elif not named:
            found = ", ".join(sorted({r.name for r in images})) or "none"
            why = f"{ENV_IMAGE}={forced}: no image named '{forced}' in the search roots (images found: {found})"
        else:
            why = f"{ENV_IMAGE}={forced} cannot be used: " + "; ".join(
                f"{r.path}: {r.reason}" for r in named)
        for record in images:
            if record.status == "eligible" and record is not chosen:
                record.reason = f"not considered: {ENV_IMAGE}={forced} is in force"
    else:
        chosen = _first_verified(candidates)
        if chosen is not None:
            rivals = [r for r in candidates if r is not chosen and r.status == "eligible"]
            why = _why_chosen(chosen, len(rivals), gpu_visible, torch_cuda)
            for record in rivals:
                record.reason = "not chosen: " + _why_not(record, chosen, torch_cuda)
        elif not images:
            why = "no image found in the search roots"
        else:
            why = "no image found can run here (every one was rejected)"
    if chosen is not None:
        chosen.status = "chosen"
        chosen.reason = why
    return Selection(torch_version=torch_version, torch_cuda=torch_cuda, torch_error=torch_error,
                     driver_version=driver_version, driver_reason=driver_reason, devices=devices,
                     devices_reason=devices_reason, roots=roots, images=images, chosen=chosen, why=why,
                     forced=forced, overrides=overrides)


def family_problem(family: str, sel: Selection) -> str:
    """"" when the selection serves `family`, else why not (no image chosen, or it lacks that library)."""
    chosen = sel.chosen
    if chosen is None:
        return sel.why
    if family not in chosen.libraries:
        have = ", ".join(sorted(chosen.libraries)) or "none"
        others = [r.name for r in sel.images if r is not chosen and family in r.libraries]
        hint = f"; images that have it: {', '.join(others)}" if others else ""
        return f"the chosen image {chosen.name} has no '{family}' library (it has: {have}){hint}"
    return ""


def failed_selection(why: str, env: dict[str, str]) -> Selection:
    """The selection when choosing raised (a loader bug): nothing chosen, `why` says what broke."""
    return Selection(torch_version=None, torch_cuda=None, torch_error="not queried", driver_version=None,
                     driver_reason="not queried", devices=(), devices_reason="not queried", roots=[], images=[],
                     chosen=None, why=why, forced=env.get(ENV_IMAGE) or None,
                     overrides={name: env[name] for name in OVERRIDE_VARS if env.get(name)})
