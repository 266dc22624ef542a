"""Tier 1 setup shared by every family: record which image and device ran the session.

The image name, how it serves this GPU (sass or ptx) and the device go into the JUnit XML as test-suite
properties, so ci/gpu_run.sh can report which image ran which tests (native, ptx80, ptx89).
"""

from __future__ import annotations

import pytest


def session_image() -> dict:
    """{"image", "serves", "device", "capability"} as the loader sees them now; values None when unknown."""
    try:
        from astrai.extension import loader
        desc = loader.describe()
    except Exception as exc:  # the suite itself reports a broken loader; here only the record is lost
        return {"image": None, "serves": None, "device": None, "capability": None, "error": str(exc)}
    chosen = desc.get("chosen") or {}
    device = (desc.get("devices") or [{}])[0]
    return {"image": chosen.get("image"), "serves": chosen.get("serves"), "device": device.get("name"),
            "capability": device.get("capability")}


@pytest.fixture(scope="session", autouse=True)
def _record_image(record_testsuite_property):
    for key, value in session_image().items():
        record_testsuite_property(f"astrai_{key}", "" if value is None else str(value))
