"""Tier 0 (CPU): the GEMM plan chain (ops/gemm_plan.py) on fabricated device facts: row files and their errors,
chain order and fall-through, planner settings, staging, batch invariance, the log, the environment seed, the plan
cache's rules (atomic entries, read-only roots, rejected files, eight processes at once) and the tie policy."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
from pathlib import Path

import pytest
import torch

from astrai.extension.ops import gemm as ops
from astrai.extension.ops import gemm_plan as gp

# The chain asks the image's op whether a plan can run (gemm_plan.image_reason): the gemm library, loaded on the CPU.
pytestmark = pytest.mark.requires_cuda_kernels("gemm")

H200 = gp.Facts("NVIDIA H200", (9, 0), 132, 227 * 1024, True, "580.65", "ab" * 32)
A100 = gp.Facts("NVIDIA A100-SXM4-80GB", (8, 0), 108, 163 * 1024, False, "580.65", "ab" * 32)
RTX5090 = gp.Facts("NVIDIA GeForce RTX 5090", (12, 0), 170, 99 * 1024, False, "580.65", "ab" * 32)
HEADER = f"{gp.ROWS_HEADER} {gp.ROWS_VERSION}\n"
BF16, I8, E4M3 = torch.bfloat16, torch.int8, torch.float8_e4m3fn


@pytest.fixture(autouse=True)
def fresh_chain():
    gp.reset()
    yield
    gp.reset()


def call(pair="w16a16", layout="nt", m=1, n=4096, k=4096, batch=None, bi=False):
    return gp.Call(pair, layout, batch, m, n, k, bi)


def test_a_four_byte_output_is_planned_apart_at_large_m():
    """w8a8 with int32 out (`torch._int_mm`'s raw accumulators; fp32 alike) is priced by SM90_WIDE_OUT_MODEL at
    M > SM90_MID_MAX_M: at M = 1024 / 4096, N = K = 4096 the H100 timed recipe 5 fastest with int32 out and recipe 4 /
    10 with bf16 (docs/benchmarks.md, forty-third session). Below that band, and for a pair with no such row, the
    output's width changes nothing; tuned plans of the two widths are cached apart."""
    for m, narrow, wide in ((1024, (4, 1), (5, 1)), (4096, (10, 0), (5, 1))):
        assert gp.probe(m, 4096, 4096, dtypes=(I8, I8), facts=H200).plan == narrow
        for out in (torch.int32, torch.float32):
            assert gp.probe(m, 4096, 4096, dtypes=(I8, I8), facts=H200, out_dtype=out).plan == wide
        assert ops.builtin_plan(m, 4096, 4096, "w8a8", 132, sm90=True, wide_out=True) == wide
    assert "w16a16" not in ops.SM90_WIDE_OUT_MODEL
    assert (gp.probe(1024, 4096, 4096, facts=H200, out_dtype=torch.float32).plan
            == gp.probe(1024, 4096, 4096, facts=H200).plan)
    assert (gp.probe(200, 4096, 4096, dtypes=(I8, I8), facts=H200, out_dtype=torch.int32).plan
            == gp.probe(200, 4096, 4096, dtypes=(I8, I8), facts=H200).plan)
    assert gp._key_text(call("w8a8", m=1024)) == "w8a8.nt.b-.m1024.n4096.k4096"  # as before outputs were told apart
    assert gp._key_text(gp.Call("w8a8", "nt", None, 1024, 4096, 4096, wide_out=True)).endswith(".k4096.o4")
    with pytest.raises(ValueError, match="probe: out_dtype must be a torch.dtype"):
        gp.probe(1024, 4096, 4096, facts=H200, out_dtype="int32")


# ---- rows ----------------------------------------------------------------------------------------------

def test_rows_parse_every_field_form():
    rows = gp.parse_rows(HEADER + "# a comment\n\nsm90 w8a16 nt 1-8 7168-* * sm90_stream 2  # trailing\n"
                         "* * * 64 4096 0-16384 0 4\n", "t.rows")
    assert [r.text() for r in rows] == ["sm90 w8a16 nt 1-8 7168-* * sm90_stream 2", "* * * 64 4096 0-16384 0 4"]
    assert rows[0].recipe == 6 and rows[0].source == "t.rows:4"
    assert rows[1].m == gp.Range(64, 64) and rows[1].k == gp.Range(0, 16384) and rows[1].n.holds(4096)
    assert not rows[1].n.holds(4097)


@pytest.mark.parametrize("text, line, field", [
    ("sm90 w16a16 nt * * * 0 1\n", 1, "header"),
    ("astrai-gemm-rows 2\n", 1, "version"),
    (HEADER + "sm90 w16a16 nt * * 0 1\n", 2, "row"),
    (HEADER + "hopper w16a16 nt * * * 0 1\n", 2, "arch"),
    (HEADER + "sm90 w4a16 nt * * * 0 1\n", 2, "pair"),
    (HEADER + "sm90 w16a16 xt * * * 0 1\n", 2, "layout"),
    (HEADER + "\n# c\nsm90 w16a16 nt 8-1 * * 0 1\n", 4, "m"),
    (HEADER + "sm90 w16a16 nt * 4k * 0 1\n", 2, "n"),
    (HEADER + "sm90 w16a16 nt * * -1 0 1\n", 2, "k"),
    (HEADER + "sm90 w16a16 nt * * * 4.0 1\n", 2, "recipe"),
    (HEADER + "sm90 w16a16 nt * * * 0 65\n", 2, "split"),
    (HEADER + "sm90 w16a16 nt * * * 0 two\n", 2, "split"),
    ("", 1, "header"),
])
def test_rows_errors_name_source_line_and_field(text, line, field):
    with pytest.raises(gp.RowsError, match=rf"gemm plan rows bad\.rows, line {line}: field '{field}'"):
        gp.parse_rows(text, "bad.rows")


def test_set_table_file_errors_keep_the_previous_override(tmp_path):
    good = tmp_path / "good.rows"
    good.write_text(HEADER + "* w16a16 * * * * 0 2\n")
    gp.set_table(good)
    bad = tmp_path / "bad.rows"
    bad.write_text(HEADER + "* w16a16 * * * * 0\n")
    with pytest.raises(gp.RowsError, match=rf"{bad}, line 2: field 'row'"):
        gp.set_table(str(bad))
    with pytest.raises(gp.RowsError, match="cannot be read"):
        gp.set_table(tmp_path / "missing.rows")
    assert gp.state()["override"] == {"rows": 1, "source": str(good)}
    assert gp.probe(100, 4096, 4096, facts=A100) == gp.Decision((0, 2), "override", f"{good}:2", ())
    gp.set_table(None)
    assert gp.probe(100, 4096, 4096, facts=A100).planner == "model"


def test_set_table_reads_stdin(monkeypatch):
    import io
    monkeypatch.setattr(sys, "stdin", io.StringIO(HEADER + "* * * * * * 1 1\n"))
    gp.set_table("-")
    assert gp.probe(5000, 64, 64, facts=A100).plan == (1, 1)
    assert gp.state()["override"]["source"] == "<stdin>"


# ---- the chain -----------------------------------------------------------------------------------------

def test_chain_order_override_injected_builtin_model(monkeypatch, tmp_path):
    (tmp_path / "sm90.rows").write_text(HEADER + "sm90 w16a16 nt * * * 3 1\n")
    monkeypatch.setattr(gp, "BUILTIN_DIR", tmp_path)
    gp.reset()
    assert gp.probe(256, 4096, 4096, facts=H200)[:2] == ((3, 1), "builtin")
    assert gp.probe(256, 4096, 4096, facts=A100).planner == "model"  # sm90 rows only serve sm90
    gp.inject_rows(HEADER + "* w16a16 nt * * * 1 2\n")
    assert gp.probe(256, 4096, 4096, facts=H200)[:2] == ((1, 2), "injected")
    gp.set_table(HEADER + "sm90 * nt 200-300 * * 0 4\n")
    assert gp.probe(256, 4096, 4096, facts=H200)[:2] == ((0, 4), "override")
    assert gp.probe(301, 4096, 4096, facts=H200)[:2] == ((1, 2), "injected")  # outside the override's M
    assert gp.inject_rows("", replace=True) == 0
    assert gp.probe(301, 4096, 4096, facts=H200)[:2] == ((3, 1), "builtin")
    model = ops.plan_problem(0, ops.Problem(None, 301, 4096, 4096, 4096), "w16a16", 132, False, sm90=True)
    assert gp.probe(301, 4096, 4096, dtypes=(BF16, I8), facts=H200)[:2] == (
        ops.plan_problem(0, ops.Problem(None, 301, 4096, 4096, 4096), "w8a16", 132, False, sm90=True), "model")
    gp.set_planner("model")  # injected / builtin rows out, override rows in
    assert gp.probe(301, 4096, 4096, facts=H200)[:2] == (model, "model")
    assert gp.probe(256, 4096, 4096, facts=H200)[:2] == ((0, 4), "override")


def test_first_matching_row_wins_and_injected_rows_stack():
    gp.inject_rows(HEADER + "* * * * * * 0 2\n")
    gp.inject_rows(HEADER + "* * * 1-16 * * 2 8\n")  # ranked above the earlier injection
    assert gp.probe(8, 512, 4096, facts=A100).plan == (2, 8)
    assert gp.probe(17, 512, 4096, facts=A100).plan == (0, 2)
    assert gp.state()["injected"] == {"rows": 2}


@pytest.mark.parametrize("row, why", [  # the op's own reasons (gemm_unsupported_on, gemm_plan_unfit) but the first two
    ("* * * * * * sm90_megatile 1", "recipe 'sm90_megatile' does not exist in this image"),
    ("* * * * * * 12 1", "recipe 12 does not exist in this image"),
    ("* * * * * * 4 1", "recipes 4 and 5 (the sm_90a wgmma mainloop) need a compute capability 9.0 GPU (H100 / H200)"),
    ("* * * * * * 6 1", "recipe 6 (the sm_90a weight stream) needs a compute capability 9.0 GPU (H100 / H200)"),
    ("* * * * * * 0 0",
     "split_k must be in [1, 64], got 0 (0, the last wave split along K, is for recipes 4, 5 and 7-11)"),
    ("* w16a16 * * * * 7 1", "recipes 7-9 and 11 run w8a16 only"),
    ("* * * * * * 4 1", "recipes 4 and 5 (the sm_90a wgmma mainloop) run layout nt only"),
])
def test_a_row_that_cannot_run_falls_through_to_the_next_planner(row, why, capsys):
    gp.set_table(HEADER + row + "\n* * * * * * 1 1\n")  # the first matching row decides for its planner
    gp.set_log(True)
    layout = "nn" if "layout nt only" in why else "nt"
    device = H200 if "layout nt only" in why else A100
    decision = gp.probe(33, 4096, 4096, layout=layout, facts=device)
    assert decision.planner == "model" and decision.passed == (("override", f"<text>:2: {why}"),)
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"[gemm-plan] w16a16 {layout} M=33 N=4096 K=4096 -> recipe {decision.plan[0]} split "
                           f"{decision.plan[1]} by model (override passed: <text>:2: {why}")


def test_sm90_stream_split_limit():
    gp.set_table(HEADER + "* * * * * * 6 9\n")
    assert gp.probe(4, 4096, 4096, facts=H200).passed[0][1].endswith(
        "split_k must be in [1, 8] for recipe 6 (the sm_90a weight stream runs its K slices as one cluster of CTAs), "
        "got 9")


def test_shared_memory_ceiling_falls_through():
    small = H200._replace(smem_optin=100 * 1024)
    gp.set_table(HEADER + "* * * * * * 5 1\n")
    decision = gp.probe(4096, 4096, 4096, facts=small)
    assert decision.passed[0][1].endswith("needs 232448 bytes of shared memory, the device allows 102400")
    assert decision.planner == "degraded" and decision.plan == (0, 1)  # the model's recipe 5 does not fit either
    assert decision.passed[1][0] == "model"


def test_table_planner_without_rows_is_the_degraded_ladder():
    gp.set_planner("table")
    for m, recipe in ((1, 2), (16, 2), (17, 1), (64, 1), (65, 0), (8192, 0)):
        assert gp.probe(m, 4096, 4096, facts=A100)[:2] == ((recipe, 1), "degraded")  # no sm80 rows
    # "tt" runs swapped for w16a16: the kernel's rows are N (8: recipe 2), whatever M is
    assert gp.probe(4096, 8, 4096, layout="tt", facts=A100)[:2] == ((2, 1), "degraded")
    gp.set_planner("")
    assert gp.state()["planner"] == "hybrid"
    with pytest.raises(ValueError, match="set_planner: planner must be one of"):
        gp.set_planner("fastest")


def test_where_the_op_refuses_every_plan_the_ladder_goes_ahead():
    """fp8 below sm_89: no plan can run; the chain hands the op the ladder's plan, whose launch raises the op's
    reason (as with an explicit plan), and says so."""
    decision = gp.probe(100, 4096, 4096, dtypes=(E4M3, E4M3), facts=A100)
    assert decision.planner == "degraded" and decision.plan == (0, 1)
    assert decision.passed[-1] == ("degraded", "fp8 operands need an sm_89 or newer GPU")


def test_model_is_the_builtin_plan():
    for m in (1, 8, 16, 17, 64, 65, 1024, 4096):
        for pair, dtypes in (("w16a16", (BF16, BF16)), ("w8a16", (BF16, I8)), ("w8a8", (I8, I8)),
                             ("fp8", (E4M3, E4M3))):
            for device in (H200, A100) if pair != "fp8" else (H200,):
                want = ops.builtin_plan(m, 7168, 2048, pair, device.num_sms, sm90=device.sm90_code)
                assert gp.probe(m, 7168, 2048, dtypes=dtypes, facts=device)[:2] == (want, "model")


def test_staging_without_tma_keeps_the_portable_recipes():
    gp.set_table(HEADER + "sm90 * nt * * * 6 1\n")
    assert gp.probe(4, 4096, 4096, facts=H200).plan == (6, 1)
    gp.set_staging(tma=False)
    decision = gp.probe(4, 4096, 4096, facts=H200)
    assert decision.planner == "model" and "set_staging(tma=False)" in decision.passed[0][1]
    for m in (1, 4, 64, 256, 4096):
        assert gp.probe(m, 4096, 4096, facts=H200).plan[0] in (0, 1, 2, 3)
        assert gp.probe(m, 4096, 4096, dtypes=(BF16, I8), facts=H200).plan[0] in (0, 1, 2, 3)
    assert gp.state()["staging"] == {"tma": False, "mx": True, "pdl": True}


def test_mx_off_refuses_fp8_on_sm120_only():
    gp.set_staging(mx=False)
    with pytest.raises(ValueError, match="fp8 on sm_120 runs the block-scale"):
        gp.probe(16, 4096, 4096, dtypes=(E4M3, E4M3), facts=RTX5090)
    assert gp.probe(16, 4096, 4096, dtypes=(E4M3, E4M3), facts=H200).planner == "model"
    assert gp.probe(16, 4096, 4096, facts=RTX5090).planner == "model"


def test_batch_invariant_calls_take_only_rows_with_every_m():
    gp.set_table(HEADER + "* w16a16 nt 1-64 * * 2 2\n* w16a16 nt * * * 4 0\n* w16a16 nt * * * 4 2\n")
    for m in (1, 64, 65, 5000):
        decision = gp.probe(m, 4096, 4096, batch_invariant=True, facts=H200)
        assert decision.plan == (4, 2) and decision.row == "<text>:4"
    assert gp.probe(1, 4096, 4096, facts=H200).plan == (2, 2)
    gp.set_table(None)
    gp.set_planner("table")
    assert {gp.probe(m, 4096, 4096, batch_invariant=True, facts=A100).plan for m in (1, 17, 999)} == {(0, 1)}


def test_grid_limits_fall_through_to_a_plan_that_launches():
    gp.set_table(HEADER + "* * * * * * 2 1\n")
    decision = gp.probe(65535 * 16 + 1, 64, 64, facts=A100)
    assert decision.planner == "model" and "more than 65535 tiles of 16 rows" in decision.passed[0][1]


def test_log_prints_once_per_decision(capsys):
    gp.set_log(True)
    gp.probe(1, 4096, 4096, facts=A100)
    gp.probe(1, 4096, 4096, facts=A100)
    gp.probe(1, 4096, 4096, batch=3, facts=A100)
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["[gemm-plan] w16a16 nt M=1 N=4096 K=4096 -> recipe 2 split 4 by model",
                     "[gemm-plan] w16a16 nt B=3 M=1 N=4096 K=4096 -> recipe 2 split 4 by model"]
    assert gp.state()["decisions"] == 2
    gp.set_log(False)
    gp.set_planner("table")  # a setter clears the memo
    assert gp.state()["decisions"] == 0


def test_probe_and_api_errors():
    with pytest.raises(ValueError, match="probe: dtypes must be a supported pair"):
        gp.probe(1, 2, 3, dtypes=(torch.float32, torch.float32), facts=A100)
    with pytest.raises(ValueError, match="probe: layout must be one of"):
        gp.probe(1, 2, 3, layout="xx", facts=A100)
    with pytest.raises(ValueError, match="probe: m must be an int >= 0, got -1"):
        gp.probe(-1, 2, 3, facts=A100)
    with pytest.raises(ValueError, match="enable: trigger must be an int >= 1"):
        gp.enable("/tmp/x", trigger=0)
    with pytest.raises(ValueError, match="enable: max_shapes must be an int >= 0"):
        gp.enable("/tmp/x", max_shapes=-2)
    with pytest.raises(ValueError, match="enable: cache_dir must name at least one directory"):
        gp.enable(":")


def test_api_is_reachable_from_ops_gemm_and_the_package():
    import astrai.extension as ext
    for name in ops.PLAN_API:
        assert getattr(ops, name) is getattr(gp, name)
        assert getattr(ext.gemm_plan, name) is getattr(gp, name)
    with pytest.raises(AttributeError):
        ops.no_such_name  # noqa: B018


def test_tile_vocabulary_matches_the_ops_recipes():
    vocabulary = gp.tile_vocabulary()
    assert [r.id for r in vocabulary] == list(ops.RECIPES)
    for r in vocabulary:
        assert (r.name, r.tile_m, r.tile_n) == tuple(ops.RECIPES[r.id])
        assert 0 < r.smem_bytes <= 227 * 1024
        assert r.needs_sm90 == (r.id >= 4) and r.tma == (r.id >= 4)
    assert vocabulary[6].splits == tuple(range(1, 9)) and vocabulary[4].splits == (0, "1-64")


def test_plan_for_and_plan_call_off_a_gpu():
    a, b = torch.zeros(4, 64, dtype=BF16), torch.zeros(64, 64, dtype=BF16)
    assert ops.plan_for(a, b, 0, False) == (0, 1)
    assert gp.plan_call(a, b, None, None, None, BF16, 0, None, False) == (0, 1)


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_compiled_quant_gemm_plans_when_the_graph_runs(monkeypatch, dynamic):
    """Traced quant_gemm calls `astrai::quant_gemm_planned`, which asks the chain (never tuning) on each run's real
    tensors: static and symbolic sizes alike (op and chain stubbed here)."""
    from astrai.extension.ops import gemm as og
    seen = []
    monkeypatch.setattr(og, "load", lambda: True)
    monkeypatch.setattr(gp, "plan_call",
                        lambda a, b, *rest, may_tune=True: seen.append((tuple(a.shape), may_tune)) or (4, 2))

    def op(a, b, a_scale, b_scale, bias, out_dtype, layout, recipe, split_k):  # the plan, visible in the result
        return (a.float() @ b.float().t() + recipe * 10 + split_k).to(out_dtype)

    monkeypatch.setattr(torch.ops.astrai, "quant_gemm", op, raising=False)
    f = torch.compile(lambda a, b: og.quant_gemm(a, b), backend="eager", dynamic=dynamic, fullgraph=True)
    for m in (3, 5, 7):
        y = f(torch.ones(m, 8, dtype=BF16), torch.ones(16, 8, dtype=BF16))
        assert torch.equal(y, torch.full((m, 16), 8.0 + 42, dtype=BF16))
    assert seen == [((3, 8), False), ((5, 8), False), ((7, 8), False)]


# ---- the environment seed ------------------------------------------------------------------------------

def reseed(monkeypatch, **env):
    for name in list(gp.ENV_SEEDS) + [gp.PORTABLE_KNOB, gp.PDL_KNOB]:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    gp._state = gp._State()  # not yet seeded
    gp._changed()


def test_env_seed_is_read_once_and_explicit_calls_win(monkeypatch, tmp_path):
    table = tmp_path / "t.rows"
    table.write_text(HEADER + "* * * * * * 1 1\n")
    reseed(monkeypatch, ASTR_GEMM_TABLE=str(table), ASTR_GEMM_MODEL="table", ASTR_GEMM_NO_TMA="1",
           ASTR_GEMM_AUTOTUNE="1", ASTR_GEMM_TUNE_DIR=str(tmp_path / "c1") + os.pathsep + str(tmp_path / "c2"),
           ASTR_GEMM_TUNE_MAX_SHAPES="5", ASTR_GEMM_TUNE_TRIGGER="3")
    with pytest.warns(DeprecationWarning) as record:
        s = gp.state()
    messages = [str(w.message) for w in record]
    assert "ASTR_GEMM_TABLE is deprecated: call astrai.extension.gemm_plan.set_table(path) instead (read once per " \
        "process; explicit calls override it)" in messages
    assert len(messages) == 7  # one a variable
    assert s["planner"] == "table" and s["staging"]["tma"] is False and s["override"]["source"] == str(table)
    assert s["autotune"] == {"enabled": True, "cache_roots": [str(tmp_path / "c1"), str(tmp_path / "c2")],
                             "max_shapes": 5, "trigger": 3, "tuned_this_process": 0}
    assert set(s["env_seeds"]) >= {"ASTR_GEMM_TABLE", "ASTR_GEMM_MODEL", "ASTR_GEMM_NO_TMA", "ASTR_GEMM_AUTOTUNE"}
    monkeypatch.setenv("ASTR_GEMM_MODEL", "model")  # read once: a later change is not seen
    assert gp.state()["planner"] == "table"
    gp.set_planner("hybrid")
    gp.set_staging(tma=True)
    gp.disable()
    assert gp.state()["planner"] == "hybrid" and gp.state()["staging"]["tma"] and not gp.state()["autotune"]["enabled"]


def test_env_plan_and_portable_seeds(monkeypatch):
    reseed(monkeypatch, ASTR_GEMM_PLAN="3,2", ASTRAI_GEMM_PORTABLE="1")
    with pytest.warns(DeprecationWarning, match="ASTR_GEMM_PLAN") as record:
        decision = gp.probe(1000, 4096, 4096, facts=H200)
    assert len(record) == 1  # ASTRAI_GEMM_PORTABLE is not deprecated
    assert decision[:3] == ((3, 2), "override", "ASTR_GEMM_PLAN:2")
    assert gp.state()["staging"]["tma"] is False and "ASTRAI_GEMM_PORTABLE" in gp.state()["env_seeds"]


def test_explicit_call_before_first_use_still_wins(monkeypatch):
    reseed(monkeypatch, ASTR_GEMM_MODEL="model")
    with pytest.warns(DeprecationWarning):
        gp.set_planner("table")  # the seed is read first, then the explicit call
    assert gp.state()["planner"] == "table"


def test_bad_env_seed_raises_naming_the_variable(monkeypatch):
    reseed(monkeypatch, ASTR_GEMM_AUTOTUNE="1", ASTR_GEMM_TUNE_TRIGGER="soon")
    for _ in range(2):  # every use raises until the variable is fixed
        with pytest.raises(ValueError, match="ASTR_GEMM_TUNE_TRIGGER must be an integer, got 'soon'"), \
                pytest.warns(DeprecationWarning):
            gp.state()
    monkeypatch.setenv("ASTR_GEMM_TUNE_TRIGGER", "2")
    with pytest.warns(DeprecationWarning):
        assert gp.state()["autotune"]["trigger"] == 2


# ---- the autotuner's choice and the plan cache ---------------------------------------------------------

def fake_timer(table):
    """A timer that 'measures' each plan from `table` (default 100 us), running nothing."""
    def timer(run, plans):
        return {plan: table.get(plan, 100.0) for plan in plans}
    return timer


def test_candidates_are_runnable_and_ordered():
    c = gp.Call("w16a16", "nt", None, 4096, 4096, 4096)
    plans = gp.candidates(c, H200)
    assert plans == sorted(plans, key=lambda p: (p[0], p[1] if p[1] else -1))
    assert all(gp.can_run(c, p, H200) is None for p in plans)
    assert (4, 0) in plans and (5, 1) in plans and (6, 1) in plans
    assert not any(p[0] in (7, 8, 9, 11) for p in plans)  # w8a8 / w16a16 do not run the w8a16 recipes
    assert all(p[0] < 4 for p in gp.candidates(c, A100))
    gp.set_staging(tma=False)
    assert all(p[0] < 4 for p in gp.candidates(c, H200))
    # 1024 tiles of 128 x 128 already run 7+ waves on 132 SMs: no split beyond 2 for recipe 0
    assert max(s for r, s in plans if r == 0) == 1


def test_tie_policy():
    assert gp.pick({(0, 1): 10.0, (1, 1): 9.0}, None) == (1, 1)
    assert gp.pick({(0, 1): 10.0, (1, 1): 9.95}, None) == (0, 1)        # within 1%: vocabulary order
    assert gp.pick({(0, 1): 10.0, (1, 1): 9.95, (3, 2): 9.96}, (3, 2)) == (3, 2)  # the chain's plan among the tied
    assert gp.pick({(0, 1): 10.0, (1, 1): 9.0}, (0, 1)) == (1, 1)       # not tied: the fastest


def test_tune_stores_the_winner_and_the_chain_uses_it(tmp_path, capsys):
    gp.enable(str(tmp_path))
    gp.set_log(True)
    c = gp.Call("w16a16", "nt", None, 300, 4096, 4096)
    assert gp.decide(c, H200).planner == "model"
    winner, timings = gp.tune(c, H200, run=None, timer=fake_timer({(3, 2): 50.0}))
    assert winner == (3, 2) and len(timings) == len(gp.candidates(c, H200))
    assert gp.decide(c, H200)[:2] == ((3, 2), "tuned")
    files = list(tmp_path.rglob("*.json"))
    assert [f.name for f in files] == ["w16a16.nt.b-.m300.n4096.k4096.json"] and files[0].parent.name == \
        H200.signature_id()
    entry = json.loads(files[0].read_text())
    assert entry["plan"] == [3, 2] and entry["signature"] == H200.signature() and entry["key"] == gp._key_text(c)
    assert [3, 2, 50.0] in entry["candidates"]
    # a new process (state reset) finds it on disk
    gp.reset()
    gp.enable(str(tmp_path))
    assert gp.decide(c, H200)[:2] == ((3, 2), "tuned")
    # another device signature does not
    assert gp.decide(c, H200._replace(driver="590.1")).planner == "model"
    # rows still rank above tuned plans; the model planner ignores them
    gp.inject_rows(HEADER + "* * * * * * 0 1\n")
    assert gp.decide(c, H200).planner == "injected"
    gp.inject_rows("", replace=True)
    gp.set_planner("model")
    assert gp.decide(c, H200).planner == "model"


def test_plan_call_tunes_an_untuned_shape_and_keeps_the_winner(tmp_path, monkeypatch):
    """plan_call's own tuning branch (eager, autotune on): the shape is tuned once through the module's `tune`, the
    winner is launched from then on; may_tune=False (compiled code) asks the chain only. CUDA calls stubbed: no GPU
    here (a parameter named like the module's `tune` once shadowed it and failed only on a GPU)."""
    import contextlib
    from types import SimpleNamespace

    def tensor(*shape):  # what plan_call reads of a CUDA tensor
        return SimpleNamespace(dtype=BF16, shape=torch.Size(shape), device=torch.device("cpu", 0), is_cuda=True,
                               dim=lambda: len(shape))

    real_tune, tuned = gp.tune, []

    def tune(call, device, run):
        tuned.append(call)
        return real_tune(call, device, run, timer=fake_timer({(3, 2): 50.0}))

    monkeypatch.setattr(gp, "facts", lambda index=None: H200)
    monkeypatch.setattr(gp, "tune", tune)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    gp.enable(str(tmp_path), trigger=1)
    a, b = tensor(300, 4096), tensor(4096, 4096)
    chain = gp.decide(gp.Call("w16a16", "nt", None, 300, 4096, 4096), H200).plan
    assert chain != (3, 2)
    assert gp.plan_call(a, b, None, None, None, BF16, 0, None, False, may_tune=False) == chain
    assert gp.plan_call(a, b, None, None, None, BF16, 0, None, False) == (3, 2)
    assert gp.plan_call(a, b, None, None, None, BF16, 0, None, False) == (3, 2) and len(tuned) == 1


def test_read_only_root_is_read_and_skipped_for_writes(tmp_path, monkeypatch):
    shared, mine = tmp_path / "shared", tmp_path / "mine"
    c1, c2 = gp.Call("w8a8", "nt", None, 512, 2048, 2048), gp.Call("w8a8", "nt", None, 1024, 2048, 2048)
    gp.enable(str(shared))
    gp.tune(c1, H200, run=None, timer=fake_timer({(0, 1): 1.0}))
    readonly = {shared}
    monkeypatch.setattr(gp, "_writable", lambda path: Path(path) not in readonly)
    gp.reset()
    gp.enable(f"{shared}{os.pathsep}{mine}")
    assert gp.decide(c1, H200)[:2] == ((0, 1), "tuned")  # read from the read-only root
    gp.tune(c2, H200, run=None, timer=fake_timer({(1, 1): 1.0}))
    assert not list(shared.rglob("*m1024*")) and len(list(mine.rglob("*m1024*.json"))) == 1
    readonly.add(mine)
    gp.reset()
    gp.enable(f"{shared}{os.pathsep}{mine}")
    c3 = gp.Call("w8a8", "nt", None, 2048, 2048, 2048)
    assert gp.tune(c3, H200, run=None, timer=fake_timer({(3, 1): 1.0}))[0] == (3, 1)  # kept in memory only
    assert gp.decide(c3, H200).plan == (3, 1) and not list(tmp_path.rglob("*m2048*"))


@pytest.mark.parametrize("damage, why", [
    (lambda text: text[: len(text) // 2], "is not JSON"),
    (lambda text: json.dumps({"hello": 1}), "is not a plan cache entry"),
    (lambda text: text.replace('"version": 1', '"version": 7'), "has version 7"),
    (lambda text: text.replace("580.65", "999.9"), "was tuned on another device"),
    (lambda text: text.replace("m300", "m301"), "holds the entry of another call"),
    (lambda text: text.replace('"plan": [3, 2]', '"plan": "fast"'), "has no valid plan"),
])
def test_truncated_or_foreign_entry_is_rejected_and_retuned(tmp_path, damage, why):
    c = gp.Call("w16a16", "nt", None, 300, 4096, 4096)
    gp.enable(str(tmp_path))
    gp.tune(c, H200, run=None, timer=fake_timer({(3, 2): 50.0}))
    path = next(tmp_path.rglob("*.json"))
    path.write_text(damage(path.read_text()))
    gp.reset()
    gp.enable(str(tmp_path))
    with pytest.warns(RuntimeWarning, match=rf"gemm plan cache: {path} {why}.*tuned again"):
        assert gp.decide(c, H200).planner == "model"
    gp.tune(c, H200, run=None, timer=fake_timer({(0, 1): 20.0}))
    assert json.loads(path.read_text())["plan"] == [0, 1]


def _tune_worker(root: str, worker: int) -> None:
    """One process: tunes 12 shapes, 6 of them shared with every other worker, each with its own winner."""
    gp.reset()
    gp.enable(root)
    for i in range(12):
        m = 100 + i if i < 6 else 1000 + 100 * worker + i
        c = gp.Call("w8a8", "nt", None, m, 2048, 2048)
        winner = (0, 1) if worker % 2 else (1, 1)
        gp.tune(c, H200, run=None, timer=fake_timer({winner: 1.0}))


def test_eight_processes_tuning_into_one_root_lose_and_corrupt_nothing(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_tune_worker, args=(str(tmp_path), w)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    files = sorted(tmp_path.rglob("*"))
    entries = [f for f in files if f.is_file()]
    assert not [f for f in entries if f.name.startswith(".tmp-")]
    assert len(entries) == 6 + 8 * 6
    cache = gp.PlanCache([tmp_path])
    for f in entries:
        m = int(f.name.split(".m")[1].split(".")[0])
        entry = cache.lookup(H200, gp.Call("w8a8", "nt", None, m, 2048, 2048))
        assert entry is not None and entry["plan"] in ([0, 1], [1, 1])
    assert not cache.problems


def test_shipped_builtin_rows_parse_and_serve_their_class():
    files = sorted(gp.BUILTIN_DIR.glob("*.rows"))
    assert [f.name for f in files] == ["sm90.rows"]  # other classes: empty tables (the model)
    rows = gp.parse_rows(files[0].read_text(), "gemm_rows/sm90.rows")  # the source the chain names
    assert rows and all(r.arch == "sm90" and r.recipe is not None for r in rows)
    for row in rows:  # each row can run on an H200 with this image's recipes, and serves its own cell
        m, n, k = row.m.lo, row.n.lo, row.k.lo
        c = gp.Call(row.pair, row.layout, None, m, n, k)
        assert gp.can_run(c, (row.recipe, row.split), H200) is None
        dtypes = {"w16a16": (BF16, BF16), "w8a16": (BF16, I8), "w8a8": (I8, I8), "fp8": (E4M3, E4M3)}[row.pair]
        decision = gp.probe(m, n, k, dtypes=dtypes, facts=H200)
        first = next(r for r in rows if r.matches("sm90", row.pair, row.layout, m, n, k))
        assert decision[:3] == ((first.recipe, first.split), "builtin", first.source)
    assert all(gp.probe(r.m.lo, r.n.lo, r.k.lo, facts=A100).planner == "model" for r in rows if r.pair == "w16a16")


def test_info_shows_the_plan_chain_settings(tmp_path):
    from astrai.extension import loader
    gp.set_planner("table")
    gp.set_staging(tma=False)
    gp.enable(str(tmp_path))
    desc = loader.describe()
    assert desc["policy"]["gemm_plan"]["planner"] == "table"
    line = next(x for x in loader.info().splitlines() if x.startswith("  gemm plan"))
    assert line == (f"  gemm plan  planner table; staging tma off, mx on, pdl on; rows override 0, injected 0; "
                    f"autotune on "
                    f"({tmp_path}; 0 tuned); environment seeds none")


def test_info_survives_a_bad_seed_file(monkeypatch, tmp_path):
    from astrai.extension import loader
    bad = tmp_path / "bad.rows"
    bad.write_text("not rows\n")
    reseed(monkeypatch, ASTR_GEMM_TABLE=str(bad))
    with pytest.warns(DeprecationWarning):
        text = loader.info()
    assert f"gemm plan  settings unreadable: gemm plan rows {bad}, line 1: field 'header'" in text



@pytest.mark.parametrize("args, want", [
    ((BF16, BF16, 0, 4, 1, 256, 4096, 1, 90, True, 90), ""),
    ((BF16, BF16, 0, 4, 1, 256, 4096, 1, 80, False, 80),
     "recipes 4 and 5 (the sm_90a wgmma mainloop) need a compute capability 9.0 GPU (H100 / H200)"),
    ((BF16, BF16, 0, 4, 1, 256, 4096, 1, 90, False, 80),
     "this image has no sm_90a code for this GPU (recipes 4 and 5 need it): use recipes 0-3"),
    ((E4M3, E4M3, 0, 0, 1, 256, 4096, 1, 89, False, 80),
     "this image runs compute_80 code on this GPU, which has no fp8 mma (sm_89+ code needed)"),
    ((E4M3, E4M3, 0, 0, 1, 256, 4096, 1, 86, False, 80), "fp8 operands need an sm_89 or newer GPU"),
    ((E4M3, E4M3, 0, 0, 1, 256, 4096, 1, 120, False, 120), ""),
    ((BF16, I8, 1, 7, 1, 256, 4096, 1, 90, True, 90), "recipes 7-9 and 11 (the sm_90a w8a16 kernels) run layout nt only"),
    ((BF16, BF16, 0, 2, 1, 65535 * 16 + 1, 64, 1, 80, False, 80),
     "M = 1048561 needs more than 65535 tiles of 16 rows for recipe 2: pick recipe 0 (up to 8388480 rows) or split "
     "the call along M (at most 1048560 rows a call with this recipe)"),
    ((BF16, BF16, 3, 2, 1, 64, 65535 * 16 + 1, 1, 80, False, 80),
     "N = 1048561 needs more than 65535 tiles of 16 rows for recipe 2 (layout tt runs as y^T = b a): pick recipe 0 "
     "(up to 8388480 rows) or split the call along N (at most 1048560 rows a call with this recipe)"),
    ((BF16, BF16, 0, 0, 1, 65535 * 128 + 1, 64, 1, 80, False, 80),
     "M = 8388481 needs more than 65535 tiles of 128 rows for recipe 0: split the call along M (at most 8388480 rows "
     "a call with this recipe)"),
    ((BF16, BF16, 0, 0, 2, 64, 64, 40000, 80, False, 80), "batch * split_k must be <= 65535, got 40000 * 2"),
    # Recipe 6's grid row: 4096 weight blocks x 65535 token blocks x 8 slices fit in 2^31 - 1, one block more does not.
    ((BF16, BF16, 0, 6, 8, 65535 * 16, 4096 * 64, 1, 90, True, 90), ""),
    ((BF16, BF16, 0, 6, 8, 65535 * 16, 4096 * 64 + 1, 1, 90, True, 90),
     "recipe 6 runs ceil(N / 64) * ceil(M / 16) * split_k CTAs in one grid row, at most 2147483647, got N = 262145, "
     "M = 1048560, split_k = 8: pick another recipe or split the call along N"),
    ((BF16, BF16, 0, 12, 1, 64, 64, 1, 80, False, 80), "recipe must be in [0, 12), got 12"),
    ((BF16, BF16, 7, 0, 1, 64, 64, 1, 80, False, 80), "layout must be 0 (nt), 1 (nn), 2 (tn) or 3 (tt), got 7"),
    ((torch.float32, BF16, 0, 0, 1, 64, 64, 1, 80, False, 80), "(a, b) dtypes must be one of "),
])
def test_the_ops_own_plan_rules_on_the_cpu(args, want):
    """quant_gemm_can_implement: the op's rules, asked about devices this machine does not have (no tensors)."""
    ops.load()
    got = torch.ops.astrai.quant_gemm_can_implement(*args)
    assert got.startswith(want) if want.endswith(" ") else got == want


def test_fp8_code_arch_from_the_image_record(monkeypatch):
    """What arch of fp8 code a device runs, read from the chosen image's record (SASS, binary-compatible SASS,
    JIT-compiled PTX)."""
    from astrai.extension import loader

    class Library:
        sass = ("sm_80", "sm_89", "sm_90a", "sm_120a")
        ptx = ("compute_80",)

    class Chosen:
        libraries = {"gemm": Library}

    class Selection:
        chosen = Chosen

    monkeypatch.setattr(loader, "selection", lambda: Selection)
    for cc, want in (((9, 0), 90), ((8, 9), 89), ((8, 6), 80), ((12, 0), 120), ((12, 1), 80), ((10, 0), 80),
                     ((7, 5), -1)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index, cc=cc: cc)
        ops.fp8_code_arch_in_image.cache_clear()
        assert ops.fp8_code_arch_in_image(0) == want, cc
    ops.fp8_code_arch_in_image.cache_clear()



def test_pdl_switch_reaches_the_library_and_the_env_seed_is_read_once(monkeypatch):
    """The launchers read no environment: the policy's pdl switch is pushed into the loaded library (and again on
    each change); ASTRAI_GEMM_PDL=0 seeds it once."""
    ops.load()
    gp.set_staging(pdl=False)
    assert torch.ops.astrai.quant_gemm_set_pdl(False) is False  # returns the switch as the policy left it
    gp.set_staging(pdl=True)
    assert torch.ops.astrai.quant_gemm_set_pdl(True) is True
    reseed(monkeypatch, ASTRAI_GEMM_PDL="0")
    assert gp.state()["staging"]["pdl"] is False and "ASTRAI_GEMM_PDL" in gp.state()["env_seeds"]
    gp._native_synced.clear()
    ops.load()  # a load (every op call) pushes a pending change
    assert torch.ops.astrai.quant_gemm_set_pdl(True) is False
    monkeypatch.delenv("ASTRAI_GEMM_PDL")
    gp.reset()
    assert torch.ops.astrai.quant_gemm_set_pdl(True) is True


def test_a_four_byte_output_is_cached_apart(tmp_path):
    """A tuned plan of a 4-byte output lives in its own entry (`.o4`): a 16-bit call of the same shape misses it,
    and the other way round."""
    narrow = gp.Call("w8a8", "nt", None, 1024, 4096, 4096)
    wide = narrow._replace(wide_out=True)
    cache = gp.PlanCache([tmp_path])
    cache.store(H200, wide, gp.make_entry(H200, wide, (5, 1), {(5, 1): 27.0, (4, 1): 29.0}))
    assert cache.lookup(H200, narrow) is None
    assert cache.lookup(H200, wide)["plan"] == [5, 1]
    cache.store(H200, narrow, gp.make_entry(H200, narrow, (4, 1), {(5, 1): 29.0, (4, 1): 28.0}))
    assert cache.lookup(H200, narrow)["plan"] == [4, 1] and cache.lookup(H200, wide)["plan"] == [5, 1]
    assert sorted(f.name for f in tmp_path.rglob("*.json")) == ["w8a8.nt.b-.m1024.n4096.k4096.json",
                                                                "w8a8.nt.b-.m1024.n4096.k4096.o4.json"]
    assert not cache.problems
