"""The attention policy (astrai.extension.attention_plan) on the CPU: the library's own rules asked about devices this
machine does not have, the plans it makes for them, the switches and their environment seed."""

import re

import pytest
import torch

from astrai.extension import attention_plan as ap
from astrai.extension.backend import attention as backend
from astrai.extension.ops import attention as ops

pytestmark = pytest.mark.requires_cuda_kernels("attention")

H200 = ap.AttnFacts((9, 0), 90, 90, 132, 227 * 1024)
H200_PTX80 = ap.AttnFacts((9, 0), 80, 90, 132, 227 * 1024)  # the ptx80 image JIT-compiled on an H200
A100 = ap.AttnFacts((8, 0), 80, 80, 108, 163 * 1024)
RTX5090 = ap.AttnFacts((12, 0), 120, 120, 170, 99 * 1024)
GQA = dict(num_q_heads=32, num_kv_heads=8)


@pytest.fixture(autouse=True)
def fresh_policy():
    ap.reset()
    yield
    ap.reset()


@pytest.mark.parametrize("shape,want", [
    ((128, 32, 8, 0), None),
    ((64, 4, 1, 16), None),
    ((96, 32, 8, 0), "head_dim must be 64, 128 or 256, got 96"),
    ((128, 12, 8, 0), "q heads (12) must be a positive multiple of kv heads (8)"),
    ((128, 32, 0, 0), "q heads (32) must be a positive multiple of kv heads (0)"),
    ((128, 32, 8, 12), "page_size must be a power of two in [1, 128], got 12"),
    ((128, 32, 8, 256), "page_size must be a power of two in [1, 128], got 256"),
])
def test_shape_rules_are_the_librarys(shape, want):
    head_dim, hq, hkv, page = shape
    assert ap.can_implement("prefill", head_dim, hq, hkv, page_size=page) == want
    assert ap.shapes_reason(head_dim, hq, hkv, page) == (want or "")


@pytest.mark.parametrize("facts,head_dim,page,scale,want", [
    (H200, 128, 0, None, None),
    (H200, 128, 8, None, None),
    (H200, 64, 0, None, "the sm90 prefill kernel takes head_dim 128, got 64"),
    (H200, 128, 4, None, "the sm90 prefill kernel takes pages of at least 8 keys, got 4"),
    (H200, 128, 0, -0.1, "the sm90 prefill kernel takes a positive softmax scale"),
    (A100, 128, 0, None, "the sm90 prefill kernel runs on compute capability 9.0, the device is 8.0"),
    (RTX5090, 128, 0, None, "the sm90 prefill kernel runs on compute capability 9.0, the device is 12.0"),
    (H200_PTX80, 128, 0, None, "the image in use has no sm_90a code for the device (its attention code is "
                               "compute_80), so the sm90 prefill kernel is empty there"),
    (H200._replace(smem_optin=200 * 1024), 128, 0, None,
     "the sm90 prefill kernel needs 230704 bytes of shared memory a block, the device allows 204800"),
])
def test_sm90_prefill_rules_for_described_devices(facts, head_dim, page, scale, want):
    assert ap.can_implement("prefill", head_dim, 32, 8, page_size=page, scale=scale, kernel="sm90",
                            facts=facts) == want
    assert ap.can_implement("prefill", head_dim, 32, 8, page_size=page, scale=scale, kernel="mma",
                            facts=facts) is None  # the portable kernel runs everywhere


def test_decode_dependent_launch_needs_code_that_waits():
    assert ap.can_implement("decode", 128, 32, 8, pdl=True, facts=H200) is None
    assert ap.can_implement("decode", 128, 32, 8, pdl=True, facts=RTX5090) is None
    assert ap.can_implement("decode", 128, 32, 8, pdl=True, facts=H200_PTX80) == (
        "a programmatic dependent launch needs code built for sm_90 or later; this image's attention code for the "
        "device is compute_80")


def test_decode_probe_plans_splits_and_the_launch():
    short = ap.probe("decode", batch=1, kv_len=4096, head_dim=128, facts=H200, **GQA)
    assert short.plan["splits"] > 1 and short.plan["pdl"] is True and short.passed == ()
    assert short.plan["splits"] * short.plan["split_len"] >= 4096 and short.plan["split_len"] % 64 == 0
    fixed = ap.probe("decode", batch=1, kv_len=1000, head_dim=128, kv_split_size=256, facts=H200, **GQA)
    assert fixed.plan == {"splits": 4, "split_len": 256, "pdl": True}
    one = ap.probe("decode", batch=1, kv_len=1000, head_dim=128, kv_split_size=4096, facts=H200, **GQA)
    assert one.plan == {"splits": 1, "split_len": 1024, "pdl": False}
    assert one.passed == ("pdl: a one-split plan launches plainly (no gain measured)",)
    jit = ap.probe("decode", batch=1, kv_len=4096, head_dim=128, facts=H200_PTX80, **GQA)
    assert jit.plan["pdl"] is False and "compute_80" in jit.passed[0]
    ap.set_staging(pdl=False)
    off = ap.probe("decode", batch=1, kv_len=4096, head_dim=128, facts=H200, **GQA)
    assert off.plan == dict(short.plan, pdl=False) and "off by the policy" in off.passed[0]
    # More SMs, more splits for the same call (one wave); a fixed split size ignores the device.
    wide = ap.probe("decode", batch=1, kv_len=4096, head_dim=128, facts=H200._replace(sm_count=264), **GQA)
    assert wide.plan["splits"] >= short.plan["splits"]


def test_prefill_probe_picks_the_kernel_by_the_rules_and_the_switches():
    dense = dict(batch=2, q_len=1000, kv_len=1000, **GQA)
    got = ap.probe("prefill", head_dim=128, facts=H200, **dense)
    assert got.plan["kernel"] == "sm90" and got.plan["tma"] is True and got.passed == ()
    assert got.plan["q_tiles"] > 0
    assert ap.probe("prefill", head_dim=64, facts=H200, **dense).passed == (
        "sm90: the sm90 prefill kernel takes head_dim 128, got 64",)
    assert ap.probe("prefill", head_dim=128, facts=A100, **dense).plan["kernel"] == "mma"
    assert ap.probe("prefill", head_dim=128, facts=H200, page_size=4, **dense).plan["kernel"] == "mma"
    assert ap.probe("prefill", head_dim=128, facts=H200, page_size=16, **dense).plan["kernel"] == "sm90"
    ap.set_staging(tma=False)
    copied = ap.probe("prefill", head_dim=128, facts=H200, **dense)
    assert copied.plan == dict(got.plan, tma=False) and "off by the policy" in copied.passed[0]
    ap.set_staging(sm90=False)
    mma = ap.probe("prefill", head_dim=128, facts=H200, **dense)
    assert mma.plan["kernel"] == "mma" and "set_staging(sm90=False)" in mma.passed[0]
    packed = dict(dense, q_len=2000)  # ragged: q_len counts the rows of every sequence
    ragged = ap.probe("prefill", head_dim=128, facts=H200, ragged=True, **packed)
    assert ragged.plan["q_tiles"] >= got.plan["q_tiles"]  # a bound: floor(rows / tile) + a tile a sequence


def test_bad_arguments_name_the_function():
    with pytest.raises(ValueError, match="probe: kind must be one of"):
        ap.probe("append", num_q_heads=8, num_kv_heads=8, head_dim=128, kv_len=8, facts=H200)
    with pytest.raises(ValueError, match="probe: head_dim must be 64, 128 or 256, got 80"):
        ap.probe("decode", num_q_heads=8, num_kv_heads=8, head_dim=80, kv_len=8, facts=H200)
    with pytest.raises(ValueError, match="can_implement: kernel must be one of"):
        ap.can_implement("prefill", 128, 8, 8, kernel="wgmma")
    with pytest.raises(RuntimeError, match=r"astrai\.attn_plan: kind must be 'decode' or 'prefill', got 'x'"):
        torch.ops.astrai.attn_plan("x", 1, 1, 8, 8, 128, 8, 0, False, 1.0, 0, 90, 90, 90, 132, 232448)
    with pytest.raises(RuntimeError, match=r"astrai\.attn_plan: kv_split_size must be >= 0"):
        torch.ops.astrai.attn_plan("decode", 1, 1, 8, 8, 128, 8, 0, False, 1.0, -1, 90, 90, 90, 132, 232448)


def test_switches_reach_the_library_and_the_env_seed_is_read_once(monkeypatch):
    """The launchers read no environment: the policy's switches are pushed into the loaded library (and again on
    each change); ASTRAI_DECODE_PDL / ASTRAI_PREFILL_SM90 / ASTRAI_PREFILL_SM90_TMA = 0 seed them once."""
    ops.load()
    ap.set_staging(pdl=False, tma=False)
    assert list(torch.ops.astrai.attn_set_policy(True, True, True)) == [0, 1, 0]  # returns what the policy left
    ap.set_staging(sm90=False)  # pushes the whole state again
    assert list(torch.ops.astrai.attn_set_policy(True, True, True)) == [0, 0, 0]
    monkeypatch.setenv("ASTRAI_PREFILL_SM90", "0")
    monkeypatch.setenv("ASTRAI_DECODE_PDL", "1")  # only exactly "0" turns a switch off
    ap._state = ap._State()
    ap._pushed = False
    assert ap.state()["staging"] == {"pdl": True, "sm90": False, "tma": True}
    assert ap.state()["env_seeds"] == ["ASTRAI_PREFILL_SM90"]
    ops.load()
    ap.sync_native()
    assert list(torch.ops.astrai.attn_set_policy(True, True, True)) == [1, 0, 1]
    monkeypatch.delenv("ASTRAI_PREFILL_SM90")
    ap.set_staging(sm90=True)  # an explicit call wins over the seed
    assert ap.state()["staging"]["sm90"] is True and ap.state()["pushed"] is True


def test_info_shows_the_switches():
    from astrai.extension import loader
    ap.set_staging(tma=False)
    assert "attn plan  staging pdl on, sm90 on, tma off; environment seeds none" in loader.info()


def test_the_blocker_asks_the_library():
    """CudaBackend's blocker words a shape it cannot take as the library does (it no longer keeps its own list)."""
    assert not hasattr(ops, "HEAD_DIMS")
    assert backend.attention_plan.shapes_reason(96, 8, 2) == "head_dim must be 64, 128 or 256, got 96"


@pytest.mark.parametrize("dtype,kv_dtype,want", [
    (torch.float16, None, "q must be bfloat16, got float16"),
    (torch.bfloat16, torch.float32, "K/V must be bfloat16, got float32"),
    (torch.bfloat16, torch.bfloat16, ""),
])
def test_the_blocker_asks_the_library_about_dtypes(dtype, kv_dtype, want):
    """The dtype rule too is the library's (attn_can_implement); the decode op refuses with the same words."""
    assert backend.attention_plan.shapes_reason(128, 8, 2, 0, dtype, kv_dtype) == want
    if want.startswith("q "):
        q = torch.zeros(2, 8, 128, dtype=dtype)
        kv = torch.zeros(2, 16, 2, 128, dtype=torch.bfloat16)
        with pytest.raises(RuntimeError, match=r"astrai\.attn_decode: " + re.escape(want)):
            torch.ops.astrai.attn_decode(q, kv, kv, None, None, 1.0, 0)


@pytest.mark.parametrize("new,cache,head_dim,page,want", [
    (torch.bfloat16, torch.bfloat16, 128, 16, None),
    (torch.float16, torch.bfloat16, 128, 16, "k_new / v_new must be bfloat16, got float16"),
    (torch.bfloat16, torch.float32, 128, 16, "the cache must be bfloat16, got float32"),
    (torch.bfloat16, torch.bfloat16, 12, 16, "head_dim must be a positive multiple of 8, got 12"),
    (torch.bfloat16, torch.bfloat16, 128, 24, "page_size must be a power of two in [1, 128], got 24"),
])
def test_the_append_rules_are_the_librarys(new, cache, head_dim, page, want):
    assert ap.append_reason(new, cache, head_dim, page) == want


def test_kv_heads_of_a_packed_call():
    """The blocker asks about the call's kv heads: K/V [Tkv, Hkv, D] when packed, [B, L, Hkv, D] otherwise."""
    q, k = torch.zeros(30, 8, 128, dtype=torch.bfloat16), torch.zeros(40, 2, 128, dtype=torch.bfloat16)
    qo, kv = torch.tensor([0, 10, 30], dtype=torch.int32), torch.tensor([0, 15, 40], dtype=torch.int32)
    packed = backend._canonical(q, k, k, None, None, None, True, None, None, None, qo, kv)
    assert packed.packed and packed.num_kv_heads == 2
    dense = backend._canonical(q.view(3, 10, 8, 128), k.view(2, 20, 2, 128)[:1].expand(3, 20, 2, 128),
                               k.view(2, 20, 2, 128)[:1].expand(3, 20, 2, 128), None, None, None, True, None, None,
                               None)
    assert dense.num_kv_heads == 2


def test_a_direct_load_gets_the_switches(monkeypatch):
    """Loading the family through the loader alone (torch.ops.astrai.* called directly) pushes the switches too."""
    from astrai.extension import loader
    ops.load()
    ap.set_staging(pdl=False)
    torch.ops.astrai.attn_set_policy(True, True, True)  # the library drifts from the policy
    ap._pushed = False
    monkeypatch.delitem(loader._state.loaded, "attention")  # as if not loaded yet
    loader.load_family("attention")  # loading the library again is harmless; the loader pushes the policy
    assert list(torch.ops.astrai.attn_set_policy(True, True, True)) == [0, 1, 1]
