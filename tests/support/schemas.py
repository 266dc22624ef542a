"""The op schemas a family registers, against the ones docs/contracts.md states."""

from __future__ import annotations

import torch


def assert_schema_matches(load, name: str, contract: dict) -> None:
    """Load the family (`load()`) and compare torch.ops.astrai.<name>'s schema with contract[name]."""
    load()
    schema = getattr(torch.ops.astrai, name).default._schema
    assert str(schema) == str(torch._C.parse_schema("astrai::" + contract[name]))
