"""Benchmark dashboard: one static HTML page (matplotlib PNGs beside it; no server, no network).

    python ci/dashboard.py --history benchmarks/history/h200 [--run OUT/bench.json] [--gate OUT/bench-gate.json]
                           [--baseline-dir benchmarks/baselines/h200] --out OUT/dashboard

The page: the environment of the latest run; a worst-first table of each case's ratio to its anchor against
the baseline, with the gate's verdict; per case, time series by commit of the ratio to the anchor and of
the fraction of the ceiling (measured in the same run: the copy bandwidth, or for a compute-bound case the
cuBLAS GEMM of the same FLOPs). A small inline script records
script errors and counts the figures that loaded into data attributes of <body> (read by the browser test).
"""

from __future__ import annotations

import argparse
import html
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_gate  # noqa: E402

PAGE_SCRIPT = """
window.astraiErrors = [];
window.addEventListener('error', function (e) { window.astraiErrors.push(String(e.message || e)); }, true);
var originalError = console.error;
console.error = function () { window.astraiErrors.push(Array.from(arguments).join(' ')); originalError.apply(console, arguments); };
window.addEventListener('load', function () {
  var figures = document.querySelectorAll('img.figure');
  var loaded = 0;
  figures.forEach(function (img) {
    if (img.complete && img.naturalWidth > 0) { loaded += 1; } else { window.astraiErrors.push('figure did not load: ' + img.getAttribute('src')); }
  });
  document.body.dataset.figuresExpected = String(figures.length);
  document.body.dataset.figuresLoaded = String(loaded);
  document.body.dataset.errors = String(window.astraiErrors.length);
  document.getElementById('page-errors').textContent = window.astraiErrors.join('\\n');
  document.body.dataset.ready = '1';
});
"""

STYLE = """
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1500px; }
table { border-collapse: collapse; margin: 12px 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th { background: #f0f0f0; } td.case { text-align: left; font-family: monospace; }
tr.FAIL td { background: #fdd; } tr.inconclusive td { background: #ffe9b3; } tr.new td, tr.missing td { background: #e8f0ff; }
tr.no-baseline td { background: #eee; color: #555; }
.env { font-family: monospace; font-size: 12px; background: #f7f7f7; padding: 8px; white-space: pre-wrap; }
.grid { display: flex; flex-wrap: wrap; gap: 12px; } .grid figure { margin: 0; }
.grid img { width: 460px; border: 1px solid #ddd; } figcaption { font-size: 12px; font-family: monospace; }
#page-errors { color: #a00; }
"""


def load_history(paths: list[Path]) -> list[dict]:
    runs = []
    for p in paths:
        files = sorted(p.glob("*.json")) if p.is_dir() else [p]
        for f in files:
            try:
                runs.append(bench_gate.load_run(f))
            except (ValueError, KeyError, json.JSONDecodeError) as exc:
                print(f"dashboard: skipping {f}: {exc}", file=sys.stderr)
    return sorted(runs, key=lambda r: r.get("date") or "")


def _label(run: dict) -> str:
    return f"{(run.get('date') or '?')[:10]}\n{(run.get('commit') or '?')[:8]}"


def _slug(case: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", case).strip("_")


def render_figures(runs: list[dict], baseline: dict, out: Path) -> list[tuple[str, str]]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted({c for r in runs for c in r["cases"]})
    figures = []
    for case in cases:
        points = [(i, r["cases"][case]) for i, r in enumerate(runs) if case in r["cases"]]
        fig, (ax_ratio, ax_frac) = plt.subplots(1, 2, figsize=(9, 3.2))
        xs = [i for i, _ in points]
        ax_ratio.plot(xs, [rec["ratio"] for _, rec in points], "o-", color="tab:blue", label="this run")
        for i, rec in points:
            ratios = rec.get("ratios") or []
            if len(ratios) > 1:
                ax_ratio.vlines(i, min(ratios), max(ratios), color="tab:blue", alpha=0.4)
        if case in baseline:
            base = baseline[case]["ratio"]
            t = float(baseline[case].get("threshold") or bench_gate.DEFAULT_THRESHOLD)
            ax_ratio.axhline(base, color="gray", ls="--", lw=1, label="baseline")
            ax_ratio.axhspan(base * (1 - t), base, color="gray", alpha=0.12, label=f"gate -{100 * t:.0f}%")
        anchor = points[-1][1].get("anchor") or "anchor"
        ax_ratio.set_title(f"ratio to {anchor} (higher is better)", fontsize=9)
        ax_ratio.legend(fontsize=7, loc="lower left")
        fracs = [(i, rec.get("fraction_of_ceiling")) for i, rec in points if rec.get("fraction_of_ceiling") is not None]
        ax_frac.plot([i for i, _ in fracs], [100 * f for _, f in fracs], "s-", color="tab:green")
        ax_frac.set_ylim(0, 105)
        ceiling = points[-1][1].get("ceiling") or "ceiling"
        ax_frac.set_title(f"% of the {ceiling} {'speed' if rec_is_compute(points[-1][1]) else 'bandwidth'}, same run",
                          fontsize=9)
        for ax in (ax_ratio, ax_frac):
            ax.set_xticks(range(len(runs)))
            ax.set_xticklabels([_label(r) for r in runs], fontsize=7)
            ax.set_xlim(-0.5, len(runs) - 0.5)
            ax.grid(alpha=0.3)
        fig.suptitle(case, fontsize=10, family="monospace")
        fig.tight_layout()
        name = f"{_slug(case)}.png"
        fig.savefig(out / name, dpi=80)
        plt.close(fig)
        figures.append((case, name))
    return figures


def rec_is_compute(rec: dict) -> bool:
    """A compute-bound case: its record has TFLOP/s (and a GEMM ceiling) instead of TB/s (and a copy)."""
    return rec.get("tflops") is not None


def environment_block(run: dict) -> str:
    env = run.get("environment") or {}
    smi = env.get("nvidia_smi") or {}
    image = env.get("image") or {}
    gpu = env.get("gpu") or {}
    lines = [
        f"GPU      {gpu.get('name', run.get('gpu'))} (sm_{str(gpu.get('capability', '?')).replace('.', '')}, "
        f"{gpu.get('sms', '?')} SMs), driver {smi.get('driver_version', '?')}, driver CUDA {env.get('driver_cuda', '?')}",
        f"clocks   SM {smi.get('clocks.sm', '?')} / {smi.get('clocks.max.sm', '?')} MHz, memory "
        f"{smi.get('clocks.mem', '?')} MHz, {smi.get('pstate', '?')}, {smi.get('power.draw', '?')} W, "
        f"{smi.get('temperature.gpu', '?')} C",
        f"software torch {env.get('torch', '?')} (CUDA {env.get('torch_cuda', '?')}), Python {env.get('python', '?')}",
        f"image    {image.get('name', '?')} (toolkit {image.get('toolkit', '?')}, serves {image.get('serves', '?')}, "
        f"revision {image.get('git_revision', '?')})",
        f"run      {run.get('date', '?')}, commit {run.get('commit', '?')} (from {run.get('commit_source', '?')}), "
        f"source {run.get('source', '?')}",
    ]
    return "\n".join(lines)


def gate_table(rows: list[dict]) -> str:
    def pct(x):
        return "-" if x is None else f"{100 * x:+.1f}%"

    def num(x):
        return "-" if x is None else f"{x:.3f}"

    out = ["<table id='gate'><tr><th>case</th><th>ratio</th><th>baseline</th><th>change</th><th>noise</th>"
           "<th>limit</th><th>verdict</th></tr>"]
    for r in rows:
        cls = r["verdict"].split(" ")[0]
        out.append(
            f"<tr class='{html.escape(cls)}'><td class='case'>{html.escape(r['case'])}</td>"
            f"<td>{num(r['ratio'])}</td><td>{num(r['baseline'])}</td><td>{pct(r['change'])}</td>"
            f"<td>{'-' if r['noise'] is None else format(100 * r['noise'], '.1f') + '%'}</td>"
            f"<td>{100 * r['threshold']:.0f}%</td><td>{html.escape(r['verdict'])}</td></tr>")
    out.append("</table>")
    return "\n".join(out)


def render(history: list[Path], run_path: Path | None, gate_path: Path | None, baseline_dir: Path | None,
           out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    runs = load_history(history)
    if run_path is not None:
        current = bench_gate.load_run(run_path)
        runs = [r for r in runs if (r.get("date"), r.get("commit")) != (current.get("date"), current.get("commit"))]
        runs.append(current)
    if not runs:
        raise SystemExit("dashboard: no benchmark runs found")
    latest = runs[-1]
    baseline_dir = baseline_dir or Path(__file__).resolve().parents[1] / "benchmarks" / "baselines" / \
        bench_gate.gpu_slug(latest["gpu"])
    baseline = bench_gate.load_baseline(baseline_dir)
    if gate_path is not None and gate_path.exists():
        rows = json.loads(gate_path.read_text())["rows"]
    else:
        rows = bench_gate.gate(latest, baseline, bench_gate.DEFAULT_THRESHOLD)
    figures = render_figures(runs, baseline, out)
    counts = bench_gate.counts(rows)
    body = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>astrai-kernels benchmarks: {html.escape(latest['gpu'])}</title>",
        f"<style>{STYLE}</style><script>{PAGE_SCRIPT}</script></head><body>",
        f"<h1>astrai-kernels benchmarks: {html.escape(latest['gpu'])}</h1>",
        f"<p>{len(runs)} runs in the history; gate of the latest run vs <code>{html.escape(str(baseline_dir.name))}"
        f"</code> baseline: " + ", ".join(f"{n} {html.escape(k)}" for k, n in counts.items()) + ".</p>",
        "<h2>Environment (latest run)</h2>",
        f"<div class='env' id='environment'>{html.escape(environment_block(latest))}</div>",
        "<h2>Ratio to anchor vs baseline, worst first</h2>",
        gate_table(rows),
        "<h2>Per case, by commit</h2><div class='grid'>",
    ]
    for case, name in figures:
        body.append(f"<figure><img class='figure' src='{html.escape(name)}' alt='{html.escape(case)}'>"
                    f"<figcaption>{html.escape(case)}</figcaption></figure>")
    body += ["</div>", "<pre id='page-errors'></pre>", "</body></html>"]
    page = out / "index.html"
    page.write_text("\n".join(body) + "\n")
    return page


def find_chromium() -> str | None:
    import shutil
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _chromium_args(chromium: str) -> list[str]:
    # --no-sandbox: CI and the nox sessions run as root, where Chromium's sandbox refuses to start.
    return [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            "--virtual-time-budget=10000"]


def browser_check(page: Path, chromium: str, timeout: float = 120) -> dict:
    """Load the page in headless Chromium and read back what its script recorded:
    {"ready", "figures_expected", "figures_loaded", "errors", "error_text"}."""
    import subprocess
    proc = subprocess.run([*_chromium_args(chromium), "--dump-dom", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=timeout)
    dom = proc.stdout
    body = re.search(r"<body([^>]*)>", dom)
    attrs = dict(re.findall(r'data-([a-z-]+)="([^"]*)"', body.group(1))) if body else {}
    errors = re.search(r"<pre id=\"page-errors\">(.*?)</pre>", dom, re.S)
    return {"ready": attrs.get("ready") == "1", "figures_expected": int(attrs.get("figures-expected", -1)),
            "figures_loaded": int(attrs.get("figures-loaded", -1)), "errors": int(attrs.get("errors", -1)),
            "error_text": html.unescape(errors.group(1)) if errors else "", "exit_code": proc.returncode}


def screenshot(page: Path, png: Path, chromium: str, size: str = "1400,2000", timeout: float = 120) -> Path:
    import subprocess
    png.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([*_chromium_args(chromium), f"--window-size={size}", f"--screenshot={png.resolve()}",
                    page.resolve().as_uri()], capture_output=True, timeout=timeout, check=True)
    return png


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history", type=Path, nargs="*", default=[],
                        help="benchmark history: directories of run JSON, or files")
    parser.add_argument("--run", type=Path, help="the current run (pytest-benchmark or bench_rotary JSON)")
    parser.add_argument("--gate", type=Path, help="bench_gate.py --report output for the current run")
    parser.add_argument("--baseline-dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--check", action="store_true", help="load it in headless Chromium: no errors, all figures")
    parser.add_argument("--screenshot", type=Path, help="save a PNG of the page here (needs Chromium)")
    args = parser.parse_args(argv)
    page = render(args.history, args.run, args.gate, args.baseline_dir, args.out)
    print(f"dashboard: wrote {page}")
    if args.check or args.screenshot:
        chromium = find_chromium()
        if chromium is None:
            print("dashboard: chromium not found (Debian package `chromium`)", file=sys.stderr)
            return 1
        if args.check:
            result = browser_check(page, chromium)
            print(f"dashboard: browser check {result}")
            if not (result["ready"] and result["errors"] == 0
                    and result["figures_loaded"] == result["figures_expected"] > 0):
                return 1
        if args.screenshot:
            print(f"dashboard: screenshot {screenshot(page, args.screenshot, chromium)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
