"""What the image loader tells the user: its errors and warning, `describe()` / `info()` and `verify()`.

Part of the image loader (`astrai.extension.loader` is the public face and re-exports these names). The
functions here take the selection and the loader's state as arguments; `verify` also takes the loader's
load and smoke-test hooks, so that the loader's module-level seams (patched by tests) are the ones used.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from ._cuda_driver import format_version
from ._loader_images import ImageRecord, sha256_file
from ._loader_selection import Selection

INFO_COMMAND = "python -m astrai.extension info"


class FamilyUnavailableError(RuntimeError):
    """An op family cannot be loaded; the message says what was asked, every image seen, and why."""


class PTXJITWarning(UserWarning):
    """The chosen image runs on some visible device only through the driver's PTX JIT (slow first call)."""



# --- the unavailability message -------------------------------------------------------------------------


def _machine_line(sel: Selection) -> str:
    torch_text = (f"torch {sel.torch_version} (CUDA {sel.torch_cuda or 'none'})" if sel.torch_version
                  else sel.torch_error)
    driver_text = (f"driver CUDA {format_version(sel.driver_version)}" if sel.driver_version is not None
                   else f"no driver ({sel.driver_reason})")
    if sel.devices:
        devices_text = ", ".join(d.describe() for d in sel.devices)
    else:
        devices_text = f"no GPU visible ({sel.devices_reason})"
    return f"{torch_text}; {driver_text}; {devices_text}"


def unavailable_message(family: str, why: str, sel: Selection, op: str | None) -> str:
    asked = f"op {op} (family '{family}')" if op else f"family '{family}'"
    lines = [f"astrai-kernels: {asked} is unavailable: {why}.",
             f"  machine: {_machine_line(sel)}"]
    if sel.images:
        lines.append("  images seen:")
        for record in sel.images:
            lines.append(f"    {record.name} ({record.path}, from {record.source}): {record.status}"
                         + (f": {record.reason}" if record.reason else ""))
    else:
        lines.append("  images seen: none")
    searched = []
    for root in sel.roots:
        where = str(root.path) if root.path is not None else root.source
        searched.append(f"{where} [{root.source}]" + (f" ({root.note})" if root.note else ""))
    lines.append("  searched: " + "; ".join(searched))
    lines.append("  overrides: " + (", ".join(f"{k}={v}" for k, v in sel.overrides.items()) or "none"))
    lines.append(f"run: {INFO_COMMAND}")
    return "\n".join(lines)


# --- describe, info, verify -----------------------------------------------------------------------------


def _image_dict(record: ImageRecord) -> dict[str, Any]:
    meta = record.meta
    return {
        "name": record.name,
        "path": str(record.path),
        "root": str(record.root),
        "source": record.source,
        "toolkit": record.toolkit_text if record.cuda_major is not None else None,
        "cuda_major": record.cuda_major,
        "cuda_minor": record.cuda_minor,
        "archs": meta.get("archs"),
        "git_revision": meta.get("git_revision"),
        "built_at": meta.get("built_at"),
        "status": record.status,
        "reason": record.reason,
        "serves": record.serves,
        "jit": list(record.jit),
        "checksums": record.checksums,
        "libraries": {family: {"file": lib.file, "sha256": lib.sha256, "size": lib.size,
                               "sass": list(lib.sass), "ptx": list(lib.ptx)}
                      for family, lib in record.libraries.items()},
    }


def describe(sel: Selection, loaded: dict[str, str], failed: dict[str, str],
             fallbacks: dict[str, Any]) -> dict[str, Any]:
    """Everything `info --json` prints: machine, roots, images with verdicts, choice, loaded families (family ->
    library path), failed ones (family -> why) and this process's fallbacks (`_fallbacks.snapshot()`)."""
    chosen = sel.chosen
    return {
        "torch": {"version": sel.torch_version, "cuda": sel.torch_cuda, "error": sel.torch_error or None},
        "driver": {"cuda": format_version(sel.driver_version) if sel.driver_version is not None else None,
                   "version": sel.driver_version, "reason": sel.driver_reason or None},
        "gpu_visible": sel.gpu_visible,
        "devices": [{"index": d.index, "name": d.name, "capability": d.capability, "sm": d.sm}
                    for d in sel.devices],
        "devices_reason": sel.devices_reason or None,
        "roots": [{"source": r.source, "path": str(r.path) if r.path is not None else None, "status": r.status,
                   "note": r.note or None, "images": list(r.images)} for r in sel.roots],
        "images": [_image_dict(r) for r in sel.images],
        "chosen": None if chosen is None else {"image": chosen.name, "path": str(chosen.path),
                                               "registration_only": sel.registration_only,
                                               "serves": chosen.serves},
        "why": sel.why,
        "forced": sel.forced,
        "loaded_families": loaded,
        "failed_families": failed,
        "overrides": dict(sel.overrides),
        "fallbacks": fallbacks,
    }


def format_info(desc: dict[str, Any]) -> str:
    """Human-readable form of `describe()`."""
    torch_info = desc["torch"]
    lines = ["astrai-kernels image loader"]
    if torch_info["version"]:
        lines.append(f"  torch      {torch_info['version']} (CUDA {torch_info['cuda'] or 'none: CPU build'})")
    else:
        lines.append(f"  torch      {torch_info['error']}")
    driver = desc["driver"]
    lines.append(f"  driver     CUDA {driver['cuda']}" if driver["cuda"]
                 else f"  driver     none: {driver['reason']}")
    if desc["gpu_visible"]:
        for d in desc["devices"]:
            lines.append(f"  device {d['index']}   {d['name']}, compute capability {d['capability']} ({d['sm']})")
    else:
        lines.append(f"  devices    no GPU visible ({desc['devices_reason']})")
    lines.append("  search roots")
    for i, root in enumerate(desc["roots"], 1):
        where = root["path"] or "-"
        what = root["status"] if root["status"] != "scanned" else (
            f"{len(root['images'])} image(s)" + (f": {', '.join(root['images'])}" if root["images"] else ""))
        note = f" {root['note']}" if root["note"] else ""
        lines.append(f"    {i}. {root['source']:<18} {where}  [{what}]{note}")
    lines.append("  images" + ("" if desc["images"] else "     none found"))
    for image in desc["images"]:
        checked = "" if image["status"] == "rejected" else f"  checksums {image['checksums']}"
        lines.append(f"    {image['name']}  toolkit {image['toolkit'] or '?'}  {image['status'].upper()}"
                     f"{checked}  {image['path']}")
        if image["libraries"]:
            width = max(len(f) for f in image["libraries"])
            for family, lib in image["libraries"].items():
                lines.append(f"      {family:<{width}}  sass {' '.join(lib['sass']) or '-'}  "
                             f"ptx {' '.join(lib['ptx']) or '-'}")
        if image["reason"] and image["status"] != "chosen":
            lines.append(f"      why: {image['reason']}")
    chosen = desc["chosen"]
    if chosen is None:
        lines.append(f"  chosen     none: {desc['why']}")
    else:
        mode = "registration only" if chosen["registration_only"] else chosen["serves"]
        lines.append(f"  chosen     {chosen['image']} ({mode}): {desc['why']}")
    loaded = desc["loaded_families"]
    lines.append("  loaded     " + (", ".join(f"{f} ({p})" for f, p in loaded.items()) or "none"))
    for family, why in desc["failed_families"].items():
        lines.append(f"  failed     {family}: {why}")
    lines.append("  fallbacks  " + _fallback_line(desc["fallbacks"]))
    if "policy" in desc:
        lines.append("  gemm plan  " + _gemm_plan_line(desc["policy"]["gemm_plan"]))
        if "attention_plan" in desc["policy"]:
            lines.append("  attn plan  " + _attention_plan_line(desc["policy"]["attention_plan"]))
        if "fp8_gemm" in desc["policy"]:
            fp8 = desc["policy"]["fp8_gemm"]
            where = f"cuda:{fp8['device']}" if fp8["device"] is not None else "no CUDA device"
            lines.append(f"  fp8 gemm   {where}: fp8_autocast's GEMMs on {fp8['runs']}"
                         + (f" ({fp8['why']})" if fp8["why"] else ""))
    lines.append("  overrides  " + (", ".join(f"{k}={v}" for k, v in desc["overrides"].items()) or "none"))
    return "\n".join(lines)


def _gemm_plan_line(state: dict[str, Any]) -> str:
    if "error" in state:
        return f"settings unreadable: {state['error']}"
    staging = ", ".join(f"{k} {'on' if v else 'off'}" for k, v in state["staging"].items())
    override = state["override"]
    rows = (f"override {override['rows']}" + (f" ({override['source']})" if override["source"] else "")
            + f", injected {state['injected']['rows']}")
    tune = state["autotune"]
    tuning = (f"autotune on ({', '.join(tune['cache_roots'])}; {tune['tuned_this_process']} tuned)"
              if tune["enabled"] else "autotune off")
    seeds = ", ".join(state["env_seeds"]) or "none"
    return f"planner {state['planner']}; staging {staging}; rows {rows}; {tuning}; environment seeds {seeds}"


def _attention_plan_line(state: dict[str, Any]) -> str:
    staging = ", ".join(f"{k} {'on' if v else 'off'}" for k, v in state["staging"].items())
    return f"staging {staging}; environment seeds {', '.join(state['env_seeds']) or 'none'}"


def _fallback_line(fallbacks: dict[str, Any]) -> str:
    last = fallbacks["last"]
    if last is None:
        return "none in this process"
    distinct = len(fallbacks["reasons"]) + (1 if fallbacks["other"] else 0)
    return (f"{fallbacks['total']} call(s) in this process, {distinct} reason(s); last: {last['op']} ran on "
            f"{last['backend']} at {last['last']} ({last['count']} call(s) for this reason): {last['reason']}")


def verify(sel: Selection, smoke: bool, *, load_family: Callable[[str], None],
           torch_cuda_available: Callable[[], bool],
           find_smoke_test: Callable[[str], Callable[[], Any] | None]) -> dict[str, Any]:
    """Recompute every checksum, load every family of the chosen image (`load_family`), smoke-launch each
    (`find_smoke_test`) where `torch_cuda_available()`. Returns a report; `report["ok"]` is False on any failure."""
    failures: list[str] = []
    checksums = []
    for record in sel.images:
        if not record.libraries:
            detail = "; ".join(record.defects) or "no libraries"
            checksums.append({"image": record.name, "family": None, "file": "image.json", "ok": False,
                              "detail": detail})
            failures.append(f"{record.name}: {detail}")
            continue
        for family, library in record.libraries.items():
            try:
                actual = sha256_file(library.path)
                ok = actual == library.sha256
                detail = "ok" if ok else f"mismatch: image.json {library.sha256}, file {actual}"
            except OSError as exc:
                ok, detail = False, f"cannot be read: {exc.strerror or exc}"
            checksums.append({"image": record.name, "family": family, "file": library.file, "ok": ok,
                              "detail": detail})
            if not ok:
                failures.append(f"{record.name}/{library.file}: {detail}")
        for defect in record.defects:
            if not any(defect.startswith(f"library file {lib.file}") for lib in record.libraries.values()):
                checksums.append({"image": record.name, "family": None, "file": "image.json", "ok": False,
                                  "detail": defect})
                failures.append(f"{record.name}: {defect}")

    loads = []
    if sel.chosen is None:
        failures.append(f"no usable image: {sel.why}")
    else:
        for family in sel.chosen.libraries:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", PTXJITWarning)
                    load_family(family)
                loads.append({"family": family, "ok": True, "detail": str(sel.chosen.libraries[family].path)})
            except FamilyUnavailableError as exc:
                loads.append({"family": family, "ok": False, "detail": str(exc).splitlines()[0]})
                failures.append(f"load {family}: {str(exc).splitlines()[0]}")

    smokes, smoke_skipped = [], None
    if not smoke:
        smoke_skipped = "smoke launches not requested"
    elif not torch_cuda_available():
        smoke_skipped = "no GPU: torch.cuda.is_available() is False"
    else:
        for entry in loads:
            if not entry["ok"]:
                continue
            family = entry["family"]
            try:
                test = find_smoke_test(family)
                if test is None:
                    smokes.append({"family": family, "status": "skipped",
                                   "detail": f"astrai.extension.ops.{family} defines no smoke_test()"})
                    continue
                test()
                smokes.append({"family": family, "status": "passed", "detail": ""})
            except Exception as exc:
                detail = f"{type(exc).__name__}: {exc}"
                smokes.append({"family": family, "status": "failed", "detail": detail})
                failures.append(f"smoke {family}: {detail}")
    return {"ok": not failures, "failures": failures, "chosen": sel.chosen.name if sel.chosen else None,
            "why": sel.why, "gpu_visible": sel.gpu_visible, "checksums": checksums, "loads": loads,
            "smoke": smokes, "smoke_skipped": smoke_skipped}


def format_verify(report: dict[str, Any]) -> str:
    """Human-readable form of `verify()`."""
    lines = ["astrai-kernels verify", "  checksums"]
    rows = [(c["image"], c["family"] or "-", c["file"], "ok" if c["ok"] else "FAIL " + c["detail"])
            for c in report["checksums"]]
    if rows:
        widths = [max(len(r[i]) for r in rows + [("IMAGE", "FAMILY", "FILE", "")]) for i in range(3)]
        for row in [("IMAGE", "FAMILY", "FILE", "RESULT")] + rows:
            lines.append("    " + "  ".join(row[i].ljust(widths[i]) for i in range(3)) + "  " + row[3])
    else:
        lines.append("    no images found")
    lines.append(f"  load ({report['chosen'] or 'no usable image'})")
    for entry in report["loads"]:
        lines.append(f"    {entry['family']:<12} {'ok' if entry['ok'] else 'FAIL'}  {entry['detail']}")
    if report["chosen"] is None:
        lines.append(f"    {report['why']}")
    lines.append("  smoke")
    if report["smoke_skipped"]:
        lines.append(f"    skipped: {report['smoke_skipped']}")
    for entry in report["smoke"]:
        lines.append(f"    {entry['family']:<12} {entry['status']}  {entry['detail']}".rstrip())
    lines.append("result: OK" if report["ok"] else f"result: FAILED ({len(report['failures'])} problem(s))")
    lines.extend(f"  - {failure}" for failure in report["failures"])
    return "\n".join(lines)
