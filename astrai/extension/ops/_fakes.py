"""What the ops modules share: loading a family once with its fake (meta) registrations, which torch.compile
and opcheck trace through; the CUDA device index an argument names."""

from __future__ import annotations

import torch

from astrai.extension import loader


def register_fakes(fakes: dict) -> None:
    """Register `{"astrai::op": fake_fn}` once; a second registration (module reloaded) is not an error."""
    for qualname, fake in fakes.items():
        try:
            torch.library.register_fake(qualname)(fake)
        except RuntimeError as exc:  # torch < 2.13 refuses a second registration
            if "already" not in str(exc):
                raise


_LOADED: set[str] = set()


def load_family_once(family: str, op: str, fakes: dict) -> bool:
    """Load `family` (loader.load_family, which raises FamilyUnavailableError with a diagnosis) and register its
    fakes, once per process; True once loaded. The ops modules' `load()` wraps this."""
    if family not in _LOADED:
        loader.load_family(family, op=op)
        register_fakes(fakes)
        _LOADED.add(family)
    return True


def cuda_index(device=None) -> int:
    """The CUDA device index of `device` (a torch.device, a string, an index, or None: the current device)."""
    if device is None:
        return torch.cuda.current_device()
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()
