"""Tier 0: ci/sanitize.py's plan, parsing and verdicts, driven by a fake compute-sanitizer on the CPU.

The real tools and the real negative controls run on a GPU (ci/gpu_run.sh sanitize); here a stand-in that
prints compute-sanitizer's summary lines proves the harness fails on a report, on a missed control, on a
missing summary and on a timeout, and passes only when everything is as expected.
"""

from __future__ import annotations

import json
import stat
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci"))
import sanitize  # noqa: E402

# The fake reports one error when the target is the selftest in a mode listed in $FAKE_CATCH (tool:mode,...),
# or a test binary named in $FAKE_DIRTY; `hang` sleeps; `nosummary` prints nothing.
FAKE = textwrap.dedent("""\
    #!{python}
    import os, sys, time
    args = sys.argv[1:]
    tool = args[args.index("--tool") + 1]
    target = [a for a in args if not a.startswith("--") and a not in (tool, "9", "20", "all")]
    name = os.path.basename(target[0]) if target else ""
    mode = target[1] if len(target) > 1 else ""
    behaviour = os.environ.get("FAKE_BEHAVIOUR", "")
    if behaviour == "hang":
        time.sleep(30)
    if behaviour == "nosummary":
        sys.exit(0)
    caught = f"{{tool}}:{{mode}}" in os.environ.get("FAKE_CATCH", "").split(",")
    dirty = name in os.environ.get("FAKE_DIRTY", "").split(",") and mode != "clean"
    errors = 1 if (caught or dirty) else 0
    print("========= COMPUTE-SANITIZER")
    if tool == "racecheck":
        print(f"========= RACECHECK SUMMARY: {{errors}} hazards displayed ({{errors}} errors, 0 warnings)")
    print(f"========= ERROR SUMMARY: {{errors}} errors")
    sys.exit(9 if errors else 0)
""")
ALL_CAUGHT = ",".join(f"{tool}:{mode}" for mode, tool in sanitize.CONTROLS)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    path = tmp_path / "compute-sanitizer"
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    for name in ("rotary_test", "sanitizer_selftest"):
        binary = tmp_path / name
        binary.write_text("#!/bin/sh\nexit 0\n")
        binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    monkeypatch.delenv("FAKE_BEHAVIOUR", raising=False)
    monkeypatch.delenv("FAKE_DIRTY", raising=False)
    return tmp_path


def run(fake: Path, *extra: str) -> tuple[int, dict]:
    out = fake / "out"
    rc = sanitize.main(["--out", str(out), "--sanitizer", str(fake / "compute-sanitizer"),
                        "--tests", str(fake / "rotary_test"), "--selftest", str(fake / "sanitizer_selftest"),
                        "--pytest-subset", "", "--timeout", "5", *extra])
    return rc, json.loads((out / "sanitize.json").read_text())


def test_all_clean_and_every_control_caught_passes(fake, monkeypatch):
    monkeypatch.setenv("FAKE_CATCH", ALL_CAUGHT)
    rc, result = run(fake)
    assert rc == 0 and result["passed"]
    verdicts = {(r["tool"], r["name"]): r["verdict"] for r in result["runs"]}
    assert all(verdicts[(tool, "rotary_test")] == "pass" for tool in sanitize.TOOLS)
    assert all(verdicts[(tool, "control:clean")] == "pass" for tool in sanitize.TOOLS)
    assert {verdicts[(tool, f"control:{mode}")] for mode, tool in sanitize.CONTROLS} == {"caught"}


@pytest.mark.parametrize("missed", [c for c in sanitize.CONTROLS], ids=[m for m, _ in sanitize.CONTROLS])
def test_a_missed_negative_control_fails(fake, monkeypatch, missed):
    mode, tool = missed
    monkeypatch.setenv("FAKE_CATCH", ",".join(c for c in ALL_CAUGHT.split(",") if c != f"{tool}:{mode}"))
    rc, result = run(fake)
    assert rc == 1 and not result["passed"]
    row = next(r for r in result["runs"] if r["name"] == f"control:{mode}")
    assert row["verdict"] == "FAIL(not caught)"


def test_a_report_on_a_standalone_test_fails(fake, monkeypatch):
    monkeypatch.setenv("FAKE_CATCH", ALL_CAUGHT)
    monkeypatch.setenv("FAKE_DIRTY", "rotary_test")
    rc, result = run(fake)
    assert rc == 1
    bad = [r for r in result["runs"] if r["verdict"].startswith("FAIL")]
    assert {r["name"] for r in bad} == {"rotary_test"} and len(bad) == len(sanitize.TOOLS)
    assert bad[0]["verdict"] == "FAIL(1 reports)"


def test_no_summary_line_fails_even_with_exit_zero(fake, monkeypatch):
    monkeypatch.setenv("FAKE_BEHAVIOUR", "nosummary")
    rc, result = run(fake, "--tools", "memcheck")
    assert rc == 1
    assert {r["verdict"] for r in result["runs"]} == {"FAIL(no summary)"}


def test_timeout_fails(fake, monkeypatch):
    monkeypatch.setenv("FAKE_BEHAVIOUR", "hang")
    rc, result = run(fake, "--tools", "synccheck", "--timeout", "1")
    assert rc == 1
    assert {r["verdict"] for r in result["runs"]} == {"FAIL(timeout)"}


def test_missing_binaries_fail_rather_than_pass_empty(tmp_path):
    rc = sanitize.main(["--out", str(tmp_path), "--tests", "--selftest", "", "--pytest-subset", "",
                        "--sanitizer", "false"])
    assert rc == 1
    assert json.loads((tmp_path / "sanitize.json").read_text())["problems"]


def test_count_reports_parses_both_summaries():
    assert sanitize.count_reports("========= ERROR SUMMARY: 0 errors\n") == 0
    assert sanitize.count_reports("========= ERROR SUMMARY: 3 errors\n") == 3
    assert sanitize.count_reports("RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)\n"
                                  "ERROR SUMMARY: 0 errors") == 2
    assert sanitize.count_reports("no summary here") is None


def test_dry_run_plans_every_tool_target_and_control(capsys):
    rc = sanitize.main(["--dry-run", "--tests", "bin/a_test", "--selftest", "bin/sanitizer_selftest"])
    assert rc == 0
    lines = capsys.readouterr().out.splitlines()
    for tool in sanitize.TOOLS:
        assert any(f"--tool {tool}" in line and "a_test --small" in line for line in lines)
        assert any(f"--tool {tool}" in line and "pytest" in line for line in lines)
    assert any("--racecheck-report all" in line for line in lines)
    assert sum(line.startswith("[caught]") for line in lines) == len(sanitize.CONTROLS)
