"""Tier 0: the bitwise helpers (tests/support/bitwise.py, golden.py) on the CPU, each with the negative control
that proves it fails on a perturbed output."""

from __future__ import annotations

import json

import pytest
import torch
from support import bitwise, golden

DTYPES = [torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.float8_e4m3fn, torch.float8_e5m2, torch.bool]


def sample(dtype, *shape):
    if dtype == torch.bool:
        return torch.rand(*shape) > 0.5
    if dtype in (torch.int8, torch.uint8, torch.int32, torch.int64):
        return torch.randint(0, 100, shape).to(dtype)
    return (torch.randn(*shape) + 3).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_equal_passes_and_one_bit_fails(dtype):
    t = sample(dtype, 7, 13)
    bitwise.assert_bitwise_equal(t.clone(), t, "same")
    bitwise.assert_detects_perturbation(t)


def test_report_names_first_element_byte_and_values():
    want = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) + 1
    got = want.clone()
    got[1, 2, 3] = 100.0
    got[1, 0, 0] = -5.0
    with pytest.raises(AssertionError) as info:
        bitwise.assert_bitwise_equal(got, want, "ctx")
    text = str(info.value)
    assert text.startswith("ctx: 2 of 24 elements differ; first at index (1, 0, 0)")
    assert "got -5.0 (0x" in text and "want 13.0 (0x41500000)" in text
    # element 12 spans bytes 48..51; 13.0 vs -5.0 first differ in bit 20, which little-endian puts in byte 50
    assert "(byte 50)" in text
    flat = 1 * 12 + 0
    offset = int(text.split("(byte ")[1].split(")")[0])
    assert flat * 4 <= offset < flat * 4 + 4


def test_nan_payload_and_signed_zero_differ():
    a = torch.tensor([0.0, float("nan")])
    b = torch.tensor([-0.0, float("nan")])
    with pytest.raises(AssertionError, match="1 of 2"):
        bitwise.assert_bitwise_equal(a, b)
    nan2 = torch.tensor([0x7FC00001], dtype=torch.int32).view(torch.float32)
    with pytest.raises(AssertionError, match="1 of 1"):
        bitwise.assert_bitwise_equal(nan2, torch.tensor([float("nan")]))
    bitwise.assert_bitwise_equal(torch.tensor([float("nan")]), torch.tensor([float("nan")]))


def test_shape_and_dtype_mismatch_fail():
    with pytest.raises(AssertionError, match="float32"):
        bitwise.assert_bitwise_equal(torch.zeros(3), torch.zeros(4))
    with pytest.raises(AssertionError, match="bfloat16"):
        bitwise.assert_bitwise_equal(torch.zeros(3), torch.zeros(3, dtype=torch.bfloat16))


def test_non_contiguous_views():
    base = torch.randn(8, 6).to(torch.bfloat16)
    view = base.t()[1:4]
    bitwise.assert_bitwise_equal(view, view.contiguous())
    bitwise.assert_detects_perturbation(view)


def test_detects_perturbation_itself_fails_when_the_check_is_blind(monkeypatch):
    """The control of the control: with a comparison that ignores differences, the negative control fails."""
    monkeypatch.setattr(bitwise, "first_difference", lambda got, want: None)
    with pytest.raises(AssertionError, match="passed on a perturbed tensor"):
        bitwise.assert_detects_perturbation(torch.ones(4))


def test_deterministic_passes_and_catches_a_flaky_function():
    x = torch.randn(64)
    bitwise.assert_deterministic(lambda: (x * 2, x + 1), runs=5)
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        return bitwise.perturbed(x, index=5) if calls["n"] == 4 else x.clone()

    with pytest.raises(AssertionError, match="run 3 vs run 0, output 0: 1 of 64"):
        bitwise.assert_deterministic(flaky, runs=5)


class FakeReplay:
    """A stand-in for a captured graph: replay recomputes into static outputs unless `stale`."""

    def __init__(self, fn, inputs, stale=False):
        self.fn, self.inputs, self.stale = fn, inputs, stale
        self.out = fn(*inputs).clone()

    def static_outputs(self):
        return (self.out,)

    def __call__(self):
        if not self.stale:
            self.out.copy_(self.fn(*self.inputs))
        return (self.out,)


@pytest.mark.parametrize("stale", [False, True])
def test_replay_matches_eager_and_catches_a_stale_output(stale):
    x = torch.randn(32)
    fn = lambda t: t * 3 + 1  # noqa: E731
    replay = FakeReplay(fn, [x], stale=stale)

    def refresh(trial):
        x.copy_(torch.randn(32))

    if stale:  # the poisoned static output is returned as it is: NaN vs the eager result
        with pytest.raises(AssertionError, match="graph replay 0, output 0: 32 of 32"):
            bitwise.assert_replay_matches_eager(replay, lambda: fn(x), refresh)
    else:
        bitwise.assert_replay_matches_eager(replay, lambda: fn(x), refresh)


def test_batch_invariance_passes_rowwise_and_catches_a_cross_row_op():
    x = torch.randn(50, 16)
    rows = [slice(0, 1), slice(7, 8), slice(49, 50), slice(10, 30)]
    bitwise.assert_batch_invariant(lambda t: t * 2 - 1, [x], rows, "rowwise")
    with pytest.raises(AssertionError, match="rows 0:1"):  # subtracting the batch mean couples the rows
        bitwise.assert_batch_invariant(lambda t: t - t.mean(0), [x], rows, "batch mean")


def test_batch_invariance_passes_unsliced_inputs_whole():
    x, table = torch.randn(20, 4), torch.randn(100, 4)
    idx = torch.randint(0, 100, (20,))
    bitwise.assert_batch_invariant(lambda t, tab, i: t * tab[i], [x, table, idx], [slice(3, 9)],
                                   slice_input=[True, False, True])


def test_digest_changes_with_one_bit_dtype_or_shape():
    t = torch.randn(5, 7).to(torch.bfloat16)
    d = bitwise.digest(t)
    assert d == bitwise.digest(t.clone()) == bitwise.digest((t,))
    assert bitwise.digest(bitwise.perturbed(t, index=0)) != d
    assert bitwise.digest(t.reshape(7, 5)) != d
    assert bitwise.digest(t.view(torch.int16)) != d
    assert bitwise.digest((t, t)) != d


def test_golden_store_check_and_negative_control(tmp_path):
    t = torch.randn(9).to(torch.bfloat16)
    golden.store_digests("fam", "cu130/sm_90", {"a": bitwise.digest(t)}, tmp_path)
    golden.store_digests("fam", "ptx80/sm_90", {"a": "0" * 64}, tmp_path)
    stored = golden.load_digests("fam", tmp_path)
    assert set(stored) == {"cu130/sm_90", "ptx80/sm_90"}  # storing one key keeps the others
    golden.check(t, stored["cu130/sm_90"]["a"], "case a")
    with pytest.raises(AssertionError, match="golden digest changed"):
        golden.check(bitwise.perturbed(t), stored["cu130/sm_90"]["a"], "case a")
    assert json.loads((tmp_path / "fam.json").read_text()) == stored


def test_golden_cases_are_discoverable_and_keys_formatted():
    assert "rotary" in golden.families()
    assert golden.load_cases("rotary")
    assert golden.key("cu130", "9.0") == "cu130/sm_90"


def test_golden_inputs_are_machine_independent():
    a = golden.randn_bf16(golden.seeded(7), 3, 4, device="cpu")
    b = golden.randn_bf16(golden.seeded(7), 3, 4, device="cpu")
    bitwise.assert_bitwise_equal(a, b)
    assert bitwise.digest(a) == bitwise.digest(b)
