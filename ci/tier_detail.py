"""One line of detail for ci/gpu_run.sh's summary table, read from a tier's JUnit XML or JSON output.

    python ci/tier_detail.py junit OUT/test-gpu.xml      -> "546 passed, 0 failed, 3 skipped; image cu130 (sass)"
    python ci/tier_detail.py sanitize OUT/sanitize.json  -> "20/20 clean, 4/4 controls caught"
    python ci/tier_detail.py gate OUT/bench-gate.json    -> "16 pass, 0 FAIL, 0 inconclusive, 0 new, 0 missing,
                                                            30 no-baseline (no baseline: attention, quantize)"
    python ci/tier_detail.py passed OUT/test-gpu.xml     -> "546" (tests that passed; 0 when unreadable)
Prints "-" when the file is missing or unreadable: the detail never decides a tier's status.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET


def junit(path: str) -> str:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    total = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors", "skipped")}
    props = {p.get("name"): p.get("value") for s in suites for p in s.iter("property")}
    passed = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    text = f"{passed} passed, {total['failures']} failed, {total['errors']} errors, {total['skipped']} skipped"
    if props.get("astrai_image"):
        text += f"; image {props['astrai_image']} ({props.get('astrai_serves') or '?'}) on sm_" \
                f"{(props.get('astrai_capability') or '?').replace('.', '')}"
    return text


def passed(path: str) -> str:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    return str(sum(int(s.get("tests", 0)) - int(s.get("failures", 0)) - int(s.get("errors", 0))
                   - int(s.get("skipped", 0)) for s in suites))


def sanitize(path: str) -> str:
    runs = json.load(open(path))["runs"]
    clean = [r for r in runs if r["expect"] == "clean"]
    controls = [r for r in runs if r["expect"] == "caught"]
    return (f"{sum(r['verdict'] == 'pass' for r in clean)}/{len(clean)} clean, "
            f"{sum(r['verdict'] == 'caught' for r in controls)}/{len(controls)} controls caught")


def gate(path: str) -> str:
    report = json.load(open(path))
    text = ", ".join(f"{n} {k}" for k, n in report["counts"].items())
    if report.get("no_baseline"):
        text += f" (no baseline: {', '.join(report['no_baseline'])})"
    return text


def main(argv: list[str]) -> int:
    kind, path = argv[1], argv[2]
    try:
        print({"junit": junit, "passed": passed, "sanitize": sanitize, "gate": gate}[kind](path))
    except Exception:
        print("0" if kind == "passed" else "-")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
