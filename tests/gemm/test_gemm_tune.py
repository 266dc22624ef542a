"""Tier 0 (CPU): the offline tuning tool (astrai/extension/gemm_tune.py) on fabricated sweeps: fit emits rows only
where a fixed plan beats the chain, validate accepts a table that helps and rejects one that slows any holdout
shape by >= 2%, install writes the builtin rows of the device class, and the command line drives all of it."""

from __future__ import annotations

import json

import pytest

from astrai.extension import gemm_tune as tune
from astrai.extension.ops import gemm_plan as gp

pytestmark = pytest.mark.requires_cuda_kernels("gemm")  # the chain asks the image's op (gemm_plan.image_reason)

H200 = gp.Facts("NVIDIA H200", (9, 0), 132, 227 * 1024, True, "580.65", "ab" * 32)


@pytest.fixture(autouse=True)
def fresh_chain():
    gp.reset()
    yield
    gp.reset()


def record(pair, m, n, k, times, chain=None):
    chain = chain or gp.decide(gp.Call(pair, "nt", None, m, n, k), H200).plan
    times = dict(times)
    times.setdefault(tuple(chain), 100.0)
    keyed = {tune._plan_key(p): us for p, us in times.items()}
    return {"pair": pair, "layout": "nt", "m": m, "n": n, "k": k, "chain": list(chain),
            "tuned": list(gp.pick(times, tuple(chain))), "tune_s": 0.5, "first": keyed, "second": keyed}


def sweep(records):
    return {"format": tune.SWEEP_FORMAT, "version": tune.SWEEP_VERSION, "facts": tune._facts_record(H200),
            "torch": "x", "date": "2026-12-04T00:00:00Z", "records": records}


def test_fit_emits_a_row_only_where_a_fixed_plan_beats_the_chain():
    # M in (129, 256]: (3, 2) is 20% faster than the chain on both shapes of the (N < 3072, K 3072-8191) cell
    train = sweep([record("w16a16", 200, 2112, 7168, {(3, 2): 80.0}), record("w16a16", 256, 2048, 4096, {(3, 2): 80.0}),
                   # a cell where the fixed plan wins on one shape and loses on the other: no row
                   record("w8a8", 1024, 4096, 4096, {(0, 1): 80.0}), record("w8a8", 1024, 6144, 4096, {(0, 1): 120.0})])
    text = tune.fit(train)
    rows = gp.parse_rows(text, "fit")
    assert [r.text() for r in rows] == ["sm90 w16a16 nt 129-256 0-3071 3072-8191 3 2", "sm90 w16a16 nt 129-256 * * 3 2"]


def test_validate_accepts_a_helping_table_and_rejects_a_harmful_one():
    holdout = sweep([record("w16a16", 200, 1000, 5000, {(3, 2): 80.0}),
                     record("w16a16", 7, 1000, 5000, {(3, 2): 150.0, (0, 1): 120.0})])
    ok, report = tune.validate(f"{gp.ROWS_HEADER} 1\nsm90 w16a16 nt 129-256 * * 3 2\n", holdout)
    assert ok and report[-1].endswith("accepted") and "with the table" in report[-1]
    ok, report = tune.validate(f"{gp.ROWS_HEADER} 1\nsm90 w16a16 nt * * * 3 2\n", holdout)
    assert not ok and "+50.0% against the chain's" in report[0] and report[-1].endswith("REJECTED")
    ok, report = tune.validate(f"{gp.ROWS_HEADER} 1\nsm90 w16a16 nt * * * 1 16\n", holdout)
    assert not ok and "was not timed" in report[0]
    assert gp.state()["injected"]["rows"] == 0  # validation leaves the chain as it found it


def test_regret_report():
    data = sweep([record("fp8", 4096, 4096, 4096, {(4, 1): 90.0}, chain=(4, 0)),
                  record("fp8", 64, 4096, 4096, {}, chain=(6, 1))])
    (line,) = tune.regret_report(data)
    assert line.startswith("fp8: 2 shapes; chain regret 5.41% (worst 11.1%); tuned 0.00% (worst 0.0%); "
                           "same pick twice 2/2")


def test_install_and_cli(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gp, "BUILTIN_DIR", tmp_path / "builtin")
    train = tmp_path / "train.json"
    train.write_text(json.dumps(sweep([record("w16a16", 200, 2112, 7168, {(3, 2): 80.0}),
                                       record("w16a16", 256, 2048, 4096, {(3, 2): 80.0})])))
    rows = tmp_path / "sm90.rows"
    assert tune.main(["fit", str(train), "--out", str(rows)]) == 0
    assert tune.main(["validate", str(rows), str(train)]) == 0
    assert tune.main(["report", str(train)]) == 0
    assert tune.main(["install", str(rows)]) == 0
    assert (tmp_path / "builtin" / "sm90.rows").read_text() == rows.read_text()
    gp.reset()
    assert gp.probe(200, 2112, 7168, facts=H200)[:2] == ((3, 2), "builtin")
    star = tmp_path / "any.rows"
    star.write_text(f"{gp.ROWS_HEADER} 1\n* * * * * * 0 1\n")
    with pytest.raises(ValueError, match="pass --arch"):
        tune.main(["install", str(star)])
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="is not a astrai-gemm-sweep v1 file"):
        tune.main(["report", str(bad)])
    with pytest.raises(SystemExit):
        tune.main(["sweep", "--pairs", "w4a4", "--out", str(tmp_path / "x.json")])
    assert "unknown pair" in capsys.readouterr().err


def test_prune_keeps_the_rows_every_holdout_accepts():
    holdout = sweep([record("w16a16", 200, 1000, 5000, {(3, 2): 80.0}),
                     record("w16a16", 7, 1000, 5000, {(3, 2): 150.0, (0, 1): 120.0})])
    text = f"{gp.ROWS_HEADER} 1\n# fitted\nsm90 w16a16 nt 129-256 * * 3 2\nsm90 w16a16 nt 1-8 * * 3 2\n"
    pruned = tune.prune(text, [holdout, holdout])
    rows = gp.parse_rows(pruned, "pruned")
    assert [r.text() for r in rows] == ["sm90 w16a16 nt 129-256 * * 3 2"]
    assert "1 row(s) dropped" in pruned and "# dropped: sm90 w16a16 nt 1-8 * * 3 2" in pruned
    assert tune.validate(pruned, holdout)[0]


def test_evaluate_judges_the_chain_as_installed():
    data = sweep([record("w16a16", 200, 1000, 5000, {(3, 2): 80.0}), record("w8a8", 4, 2048, 2048, {})])
    data["records"][1]["second"] = {"0,1": 50.0}  # the chain's plan untimed: counted 3x
    lines = tune.evaluate(data)
    assert lines[0] == "all: 2 shapes, chain regret 93.65% (worst 3.00x, 2 over 10%)"
    assert "w16a16: 1 shapes, chain regret 25.00% (worst 1.25x, 1 over 10%)" in lines
    assert lines[-1] == "plans the sweep did not time (counted 3.0x): 1"


def test_an_int32_record_is_judged_as_a_four_byte_output():
    """A sweep record with "out": "int32" (`sweep --out-dtype int32`) is the call with a 4-byte output: evaluate
    judges the plan the chain makes for that (SM90_WIDE_OUT_MODEL at M > 256), not the 16-bit one."""
    wide = gp.decide(gp.Call("w8a8", "nt", None, 1024, 4096, 4096, wide_out=True), H200).plan
    narrow = gp.decide(gp.Call("w8a8", "nt", None, 1024, 4096, 4096), H200).plan
    assert wide != narrow  # the premise: the two outputs are planned apart here
    r = record("w8a8", 1024, 4096, 4096, {wide: 27.0, narrow: 30.0}, chain=wide)
    assert tune._chain_plan(r, H200) == narrow  # no "out": a bf16 record
    r["out"] = "int32"
    assert tune._chain_plan(r, H200) == wide
    assert tune.evaluate(sweep([r]))[0] == "all: 1 shapes, chain regret 0.00% (worst 1.00x, 0 over 10%)"


def test_sweep_refuses_int32_out_beyond_w8a8():
    with pytest.raises(ValueError, match="out_dtype int32 is w8a8's alone"):
        tune.sweep([(64, 64, 64)], ["w16a16"], None, out_dtype="int32")
    with pytest.raises(ValueError, match="out_dtype must be one of"):
        tune.sweep([(64, 64, 64)], ["w8a8"], None, out_dtype="fp16")
