#!/usr/bin/env bash
# GPU tiers 1-4 in one call, for a lent GPU machine or a CI farm node: logs, JSON and the dashboard go under
# $OUT (default ./gpu-out); a summary table (tier, status, seconds, detail) is printed last.
#
# Needs: a CUDA torch >= 2.10 in `python3`, the image in astrai/extension/lib/ (nox -s build; the test-only
# ptx80/ptx89 images from `nox -s build -- ptx-images`), the standalone test binaries and their ctest
# registration (build/<tag>/tests/ and build/<tag>/csrc/CTestTestfile.cmake, made by the same build),
# compute-sanitizer, nvcc + cmake/ctest (the sanitizer's negative controls are built here, for this GPU's
# arch), and for the bench tier pytest-benchmark. matplotlib is optional (dashboard tier).
#
# Standalone tests (cu-tests, sanitize) are the ctest registration's, never a list: ci/sanitize.py
# --locate-ctest uses build/<tag>/csrc as is when it was configured for this tree, else a copy under
# $OUT/ctest with the recorded source/build roots rewritten to this tree (a GPU machine given a copy of the
# build). Only when no registration is usable do the build/*/tests/*_test binaries run directly, and the
# summary says why. ASTRAI_CTEST_DIR=<build>/csrc picks one registration where several builds exist.
#
# Commit: results are recorded under the commit they measure: ASTRAI_GIT_COMMIT=<sha> when given (set it on the
# call, e.g. ASTRAI_GIT_COMMIT=$(git rev-parse --short=12 HEAD) on the machine that copied the tree: a copied
# tree may carry an older .git than its files, as on the lent H200), else git's HEAD here, else the git revision
# recorded in the native image's image.json (the commit it was built from, blind to uncommitted changes). It is exported to every tier (the bench JSON's commit_info,
# hence bench-gate, benchmarks/history and the dashboard) and printed in the summary with its source.
#
# Dashboard: rendered where matplotlib is (the CPU side when the GPU machine lacks it) from $OUT's JSON:
#   nox -s dashboard -- --run $OUT/bench.json --gate $OUT/bench-gate.json
# (the summary prints this line with the real paths).
#
# Usage: ci/gpu_run.sh [tiers...]
#   default: info cu-tests sanitize test-gpu bench bench-gate dashboard test-gpu-ptx80 test-gpu-ptx89
#   also:    golden (regenerate tests/golden/ for this image and GPU: explicit only, never by default)
#            models (tests/bench/bench_models.py: a Llama-3-8B-shaped model end to end against transformers + sdpa
#            + cuBLAS, $OUT/models.json; not gated; 53 s on the H200 for five setups (2026-12-05): explicit only;
#            MODELS_ARGS="--setups=a,b --batches=1" a subset, models.json rewritten after every row)
#            decode-probe (tests/bench/probe_decode_step.py: that model's graphed batch-1 decode step kernel by kernel,
#            the chain's plans against every plan on the step's M = 1 GEMM shapes, the attention call at each KV split,
#            an L2 pre-warm experiment; $OUT/decode_step.json; not gated; explicit only; PROBE_PARTS="prewarm ..."
#            picks parts and their order, the JSON rewritten after each)
#            plan-sweeps (python -m astrai.extension.gemm_tune sweep over SWEEP_GRIDS, default "holdout16 holdout15
#            train train_small train_mid": every recipe of the GEMM plan chain timed twice on this GPU,
#            $OUT/sweep_<grid>.json, each written when its grid ends; then w8a8 with int32 out over SWEEP_INT32_GRIDS, default "holdout16 train
#            train_mid", $OUT/sweep_i32_<grid>.json; the input of `gemm_tune evaluate / fit`; 14-25 s a 31-shape holdout on
#            an H100 (2026-12-06; six grids 141 s; int32 ~6 s a holdout), a training grid three times its cells: explicit only)
#            sass-digest (a CPU gate, `nox -s sass-digest`; here it needs the same cuobjdump/nvdisasm release;
#            skips with the reason when the image's toolkit or arches differ from the recorded digest's)
# Time: BUDGET_S (default 560) for the whole call; a tier that would start past it is skipped, and each tier
# runs under its own limit (seconds in TIER_LIMIT below; override with TIER_LIMITS="test-gpu=300 bench=200").
# Exit 0 only if every tier that ran passed (a pytest tier where nothing passed, or a bench with no case, fails).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-560}  # under the 600 s a lent GPU machine allows one command
tiers=("$@")
[ ${#tiers[@]} -gt 0 ] || tiers=(info cu-tests sanitize test-gpu bench bench-gate dashboard test-gpu-ptx80 test-gpu-ptx89)
declare -A status seconds detail
# bench: four suites, rotary, quantize and attention sized to finish within 150 s on an H200 and gemm's gated
# subset within 90 s (60 cases; its full grid, ASTRAI_BENCH_GEMM=full, is a separate call); the limit leaves
# room for a slower node. The PTX-image tiers run test-gpu's tests after JIT-compiling every kernel from PTX, so
# they get more time than test-gpu. test-gpu's ~2850 cases took 147 s on a machine that had run them once and
# passed 65% in 180 s on a fresh one (torch.compile's caches cold; H100, 2026-12-05); ptx89 passed 95% in 290 s there,
# and ran whole in 217 s on a warm machine (ptx80: 302 s; H100, 2026-12-05, thirty-third session): 400 s each
# leaves room for the 64-bit indexing cases added after (gigabyte outputs).
# cu-tests took 115 s there. Measured tier times: docs/benchmarks.md, "GPU tiers".
declare -A TIER_LIMIT=([info]=60 [cu-tests]=150 [sanitize]=240 [test-gpu]=300 [test-gpu-ptx80]=400
  [test-gpu-ptx89]=400 [bench]=330 [bench-gate]=30 [sass-digest]=120 [dashboard]=60 [golden]=300 [models]=300
  [decode-probe]=300 [plan-sweeps]=300)
for kv in ${TIER_LIMITS:-}; do TIER_LIMIT[${kv%%=*}]=${kv#*=}; done  # e.g. TIER_LIMITS="test-gpu=300 bench=200"
START=$SECONDS

run_tier() {  # run_tier NAME CMD...: logs to $OUT/NAME.log under the tier's time limit; records status and time
  local name=$1; shift
  local t0=$SECONDS
  echo "=== $name: $*"
  timeout --kill-after=10 "${TIER_LIMIT[$name]:-120}" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  seconds[$name]=$((SECONDS - t0))
  if [ $rc -eq 0 ]; then status[$name]=pass
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status[$name]="FAIL(timeout)"
  else status[$name]="FAIL($rc)"; fi
  tail -n 25 "$OUT/$name.log"
}

require_passed() {  # require_passed TIER JUNIT: a pytest tier where nothing passed (all skipped) fails
  local n
  n=$($PY ci/tier_detail.py passed "$2")
  if [ "${status[$1]}" = pass ] && [ "${n:-0}" -eq 0 ]; then status[$1]="FAIL(0 passed)"; fi
}

test_bins=$(ls build/*/tests/*_test 2>/dev/null | tr '\n' ' ')
# The ctest registration, relocated to this tree when it was configured elsewhere (see the header).
ctest_dir=$($PY ci/sanitize.py --locate-ctest "$OUT/ctest" 2>"$OUT/ctest-locate.log")
ctest_how=$(tail -n 1 "$OUT/ctest-locate.log")
command -v ctest >/dev/null || { ctest_how="ctest is not on PATH (${ctest_how})"; ctest_dir=""; }
# The commit the results belong to (see the header): $ASTRAI_GIT_COMMIT, else git, else the image's revision.
if [ -n "${ASTRAI_GIT_COMMIT:-}" ]; then
  commit_source="ASTRAI_GIT_COMMIT (set by the caller)"
elif git_head=$(git rev-parse --short=12 HEAD 2>/dev/null); then
  ASTRAI_GIT_COMMIT=$git_head; commit_source=git
else
  ASTRAI_GIT_COMMIT=$($PY -c "import json, sys; print(json.load(open(sys.argv[1])).get('git_revision') or '')" \
    "$(ls astrai/extension/lib/cu*/image.json 2>/dev/null | tail -1)" 2>/dev/null)
  commit_source="git_revision of the image (no git here, no ASTRAI_GIT_COMMIT given)"
fi
export ASTRAI_GIT_COMMIT=${ASTRAI_GIT_COMMIT:-unknown}
gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
gpu_arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
gpu_slug=$($PY -c "import sys; sys.path.insert(0, 'ci'); import bench_gate; print(bench_gate.gpu_slug(sys.argv[1]))" "${gpu_name:-unknown}" 2>/dev/null)

for tier in "${tiers[@]}"; do
  if [ $((SECONDS - START)) -ge "$BUDGET_S" ]; then status[$tier]="skip(budget)"; continue; fi
  case $tier in
    info)
      run_tier info bash -c "nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm,clocks.mem,temperature.gpu --format=csv; $PY -m astrai.extension info && $PY -m astrai.extension info --json > '$OUT/info.json' && $PY -m astrai.extension verify" ;;
    cu-tests)
      # Tier 2: the ctest registration of every csrc/tests/*.cu (full tables; the .small twins are the sanitizer's).
      if [ -n "$ctest_dir" ]; then
        run_tier cu-tests ctest --test-dir "$ctest_dir" -L cu-test -E '\.small$' --no-tests=error --output-on-failure --output-junit "$OUT/cu-tests.xml"
        detail[cu-tests]="$($PY ci/tier_detail.py junit "$OUT/cu-tests.xml"); ctest in ${ctest_how#sanitize: ctest directory: }"
      elif [ -n "$test_bins" ]; then
        echo "cu-tests: no usable ctest registration, running the binaries directly: $ctest_how"
        run_tier cu-tests bash -c "echo 'no usable ctest registration: $ctest_how'; rc=0; for t in $test_bins; do echo \"## \$t\"; \$t || rc=1; done; exit \$rc"
        detail[cu-tests]="ran $(echo $test_bins | wc -w) binaries directly: no usable ctest registration ($OUT/ctest-locate.log)"
      else status[cu-tests]="skip(no binaries)"; fi ;;
    sanitize)
      # Tier 3: builds the negative controls for this GPU, then every tool over tests, a pytest subset, controls.
      if [ -z "$test_bins" ]; then status[sanitize]="skip(no binaries)"; continue; fi
      # The standalone tests are the ctest registration's .small entries (ci/sanitize.py discovers them).
      run_tier sanitize bash -c "rm -rf build/selftest && cmake -S csrc/tests/selftest -B build/selftest -DCMAKE_CUDA_ARCHITECTURES=${gpu_arch:-90} --log-level=WARNING && cmake --build build/selftest && $PY ci/sanitize.py --out '$OUT' --python $PY"
      detail[sanitize]=$($PY ci/tier_detail.py sanitize "$OUT/sanitize.json") ;;
    test-gpu)
      run_tier test-gpu $PY -m pytest tests/gpu -q -rs -p no:cacheprovider --junitxml="$OUT/test-gpu.xml"
      detail[test-gpu]=$($PY ci/tier_detail.py junit "$OUT/test-gpu.xml")
      require_passed test-gpu "$OUT/test-gpu.xml" ;;
    test-gpu-ptx80|test-gpu-ptx89)
      # A test-only PTX image (nox -s build -- ptx-images), JIT-compiled here: runs the sm_80 / sm_89 paths.
      img=${tier#test-gpu-}
      if [ ! -f astrai/extension/lib/$img/image.json ]; then status[$tier]="skip(no $img image)"; continue; fi
      run_tier $tier env ASTRAI_IMAGE=$img $PY -m pytest tests/gpu -q -rs -p no:cacheprovider --junitxml="$OUT/$tier.xml"
      detail[$tier]=$($PY ci/tier_detail.py junit "$OUT/$tier.xml")
      require_passed $tier "$OUT/$tier.xml" ;;
    bench)
      # Tier 4: every pytest-benchmark suite in tests/bench (rotary, quantize, attention, gemm's gated subset:
      # CUDA-event timing of graph replays, anchors in the same run); the JSON's commit_info carries
      # $ASTRAI_GIT_COMMIT. Until benchmarks/baselines/<gpu>/gemm.json is recorded, bench-gate reads
      # FAIL(no baseline).
      run_tier bench $PY -m pytest tests/bench -q -p no:cacheprovider --benchmark-only \
        --benchmark-json="$OUT/bench.json" --benchmark-columns=min,median,max,rounds --benchmark-sort=name
      n_cases=$($PY -c "import json,sys; print(len(json.load(open(sys.argv[1]))['benchmarks']))" "$OUT/bench.json" 2>/dev/null || echo 0)
      detail[bench]="$n_cases cases"
      if [ "${status[bench]}" = pass ] && [ "$n_cases" -eq 0 ]; then status[bench]="FAIL(no case ran)"; fi ;;
    bench-gate)
      if [ ! -f "$OUT/bench.json" ]; then status[bench-gate]="skip(no bench.json)"; continue; fi
      # Every family of the run against benchmarks/baselines/<gpu>/<family>.json; a family with no baseline file
      # exits 3, shown as FAIL(no baseline) (record one on purpose: ci/bench_gate.py ... --update-baseline).
      run_tier bench-gate $PY ci/bench_gate.py "$OUT/bench.json" --baseline-dir "benchmarks/baselines/${gpu_slug:-unknown}" \
        --report "$OUT/bench-gate.json"
      [ "${status[bench-gate]}" = "FAIL(3)" ] && status[bench-gate]="FAIL(no baseline)"
      detail[bench-gate]=$($PY ci/tier_detail.py gate "$OUT/bench-gate.json") ;;
    sass-digest)
      # CPU work, cheap here too: each cu* image's SASS per arch vs its committed digest (skips, with the
      # reason, when the image's toolkit or arches differ from the recorded ones).
      digests=$(for d in astrai/extension/lib/cu*; do [ -f tests/golden/sass/$(basename $d).json ] && echo $d; done)
      if [ -z "$digests" ]; then status[sass-digest]="skip(no digest)"; continue; fi
      if ! command -v cuobjdump >/dev/null; then status[sass-digest]="skip(no cuobjdump)"; continue; fi
      run_tier sass-digest bash -c "rc=0; for d in $digests; do $PY ci/sass_digest.py \$d --compare tests/golden/sass/\$(basename \$d).json --if-same-toolchain --out '$OUT'/sass-digest-\$(basename \$d).json || rc=1; done; exit \$rc"
      detail[sass-digest]=$(grep '^sass-digest:' "$OUT/sass-digest.log" | tr '\n' ' ') ;;
    dashboard)
      if ! $PY -c "import matplotlib" 2>/dev/null; then
        status[dashboard]="skip(no matplotlib)"; detail[dashboard]="rendered on the CPU side from this run's JSON (see below)"; continue
      fi
      if [ ! -f "$OUT/bench.json" ]; then status[dashboard]="skip(no bench.json)"; continue; fi
      run_tier dashboard $PY ci/dashboard.py --history "benchmarks/history/${gpu_slug:-unknown}" --run "$OUT/bench.json" \
        --gate "$OUT/bench-gate.json" --out "$OUT/dashboard" ;;
    models)
      # End to end, not gated (docs/benchmarks.md "Models end to end"): tokens/s per setup and batch, the decode
      # step's parts, the batch-1 eager prefill's parts and decode host profile, an fp8 training step.
      # MODELS_ARGS (e.g. "--setups=hf,w8a16-fused-rope --batches=1") times a subset first; models.json is rewritten
      # after every row, so a tier cut off by its limit keeps what it timed.
      # shellcheck disable=SC2086
      run_tier models env OUT="$OUT" PYTHONPATH="$PWD:$PWD/tests/bench" $PY tests/bench/bench_models.py ${MODELS_ARGS:-}
      detail[models]=$([ -f "$OUT/models.json" ] && echo "$OUT/models.json" || echo "no models.json") ;;
    decode-probe)
      # Where a batch-1 decode step's time goes (docs/benchmarks.md "Models end to end"), not gated.
      # PROBE_PARTS (e.g. "prewarm timeline") runs those parts in that order; the JSON is rewritten after each part.
      # shellcheck disable=SC2086
      run_tier decode-probe env OUT="$OUT" PYTHONPATH="$PWD:$PWD/tests/bench" $PY tests/bench/probe_decode_step.py ${PROBE_PARTS:-}
      detail[decode-probe]=$([ -f "$OUT/decode_step.json" ] && echo "$OUT/decode_step.json" || echo "no decode_step.json") ;;
    plan-sweeps)
      # The plan chain's sweeps, not gated (docs/benchmarks.md "GEMM plan chain"): one JSON a grid, judged offline by
      # `python -m astrai.extension.gemm_tune evaluate <json>`; a grid that fails leaves the others' JSON.
      # Then w8a8 with int32 out (the 4-byte-output model's data) over SWEEP_INT32_GRIDS.
      run_tier plan-sweeps bash -c "rc=0; for g in ${SWEEP_GRIDS:-holdout16 holdout15 train train_small train_mid}; do
          $PY -m astrai.extension.gemm_tune sweep --grid \$g --out '$OUT'/sweep_\$g.json || rc=1; done
        for g in ${SWEEP_INT32_GRIDS:-holdout16 train train_mid}; do $PY -m astrai.extension.gemm_tune sweep --grid \$g \
          --pairs w8a8 --out-dtype int32 --out '$OUT'/sweep_i32_\$g.json || rc=1; done; exit \$rc"
      detail[plan-sweeps]=$(cd "$OUT" && ls sweep_*.json 2>/dev/null | tr '\n' ' ' | sed 's/ $//')
      [ -n "${detail[plan-sweeps]}" ] || detail[plan-sweeps]="no sweep JSON" ;;
    golden)
      # Explicit only: digests for the native image and each test-only PTX image present, written into the tree
      # (later tiers of this call compare against them) and copied to $OUT/golden to bring back and commit.
      run_tier golden bash -c "set -e; for img in '' ptx80 ptx89; do
          if [ -n \"\$img\" ] && [ ! -f astrai/extension/lib/\$img/image.json ]; then continue; fi
          ASTRAI_IMAGE=\$img $PY tests/golden/regenerate.py; done
        mkdir -p '$OUT/golden' && cp tests/golden/*.json '$OUT/golden/'"
      detail[golden]="copy $OUT/golden/*.json into tests/golden/ and commit" ;;
    *) echo "unknown tier $tier"; exit 2 ;;
  esac
done

echo
if [[ " ${tiers[*]} " == *" dashboard "* ]] && [ "${status[dashboard]:-}" != pass ]; then
  echo "dashboard: not rendered on this machine (${status[dashboard]:-not run}); render it on the CPU side from this run's JSON,"
  echo "  after copying $OUT back: nox -s dashboard -- --run <copy of $OUT>/bench.json --gate <copy of $OUT>/bench-gate.json"
fi
echo "commit: $ASTRAI_GIT_COMMIT (from $commit_source)"
echo "=== summary ($(date -u +%Y-%m-%dT%H:%MZ), ${gpu_name:-no GPU}, $((SECONDS - START)) s of ${BUDGET_S} s budget, output $OUT)"
printf '%-15s %-20s %7s  %s\n' tier status seconds detail
rc=0
for tier in "${tiers[@]}"; do
  printf '%-15s %-20s %7s  %s\n' "$tier" "${status[$tier]:-?}" "${seconds[$tier]:--}" "${detail[$tier]:-}"
  case ${status[$tier]:-?} in pass|skip*) ;; *) rc=1 ;; esac
done
exit $rc
