"""Fake (meta) registration shared by the ops modules: torch.compile and opcheck trace through these."""

from __future__ import annotations

import torch


def register_fakes(fakes: dict) -> None:
    """Register `{"astrai::op": fake_fn}` once; a second registration (module reloaded) is not an error."""
    for qualname, fake in fakes.items():
        try:
            torch.library.register_fake(qualname)(fake)
        except RuntimeError as exc:  # torch < 2.13 refuses a second registration
            if "already" not in str(exc):
                raise
