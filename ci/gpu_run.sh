#!/usr/bin/env bash
# GPU tiers 1-4 in one call, for a lent GPU machine or a CI farm node: logs, JSON and the dashboard go under
# $OUT (default ./gpu-out); a summary table (tier, status, seconds, detail) is printed last.
#
# Needs: a CUDA torch >= 2.10 in `python3`, the image in astrai/extension/lib/ (nox -s build; the test-only
# ptx80/ptx89 images from `nox -s build -- ptx-images`), the standalone test binaries (build/<tag>/tests/,
# made by the same build), compute-sanitizer, nvcc + cmake (the sanitizer's negative controls are built here,
# for this GPU's arch), and for the bench tier pytest-benchmark. matplotlib is optional (dashboard tier).
#
# Usage: ci/gpu_run.sh [tiers...]
#   default: info cu-tests sanitize test-gpu bench bench-gate dashboard test-gpu-ptx80 test-gpu-ptx89
#   also:    golden (regenerate tests/golden/ for this image and GPU: explicit only, never by default)
#            sass-digest (a CPU gate, `nox -s sass-digest`; here it needs the same cuobjdump/nvdisasm release)
# Time: BUDGET_S (default 480) for the whole call; a tier that would start past it is skipped, and each tier
# runs under its own limit (seconds in TIER_LIMIT below; override with TIER_LIMITS="test-gpu=300 bench=200").
# Exit 0 only if every tier that ran passed (a pytest tier where nothing passed, or a bench with no case, fails).
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
BUDGET_S=${BUDGET_S:-480}
tiers=("$@")
[ ${#tiers[@]} -gt 0 ] || tiers=(info cu-tests sanitize test-gpu bench bench-gate dashboard test-gpu-ptx80 test-gpu-ptx89)
declare -A status seconds detail
declare -A TIER_LIMIT=([info]=60 [cu-tests]=120 [sanitize]=240 [test-gpu]=180 [test-gpu-ptx80]=150
  [test-gpu-ptx89]=150 [bench]=150 [bench-gate]=30 [sass-digest]=60 [dashboard]=60 [golden]=120)
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
# ctest's registration holds absolute paths: use it only when it was configured for this very tree.
ctest_file=$(ls -t build/*/csrc/CTestTestfile.cmake 2>/dev/null | head -1)
ctest_dir=${ctest_file:+$(dirname "$ctest_file")}
if [ -n "$ctest_dir" ] && ! grep -qx "CMAKE_HOME_DIRECTORY:INTERNAL=$PWD" "$ctest_dir/../CMakeCache.txt" 2>/dev/null; then
  ctest_dir=""
fi
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
        detail[cu-tests]=$($PY ci/tier_detail.py junit "$OUT/cu-tests.xml")
      elif [ -n "$test_bins" ]; then
        run_tier cu-tests bash -c "rc=0; for t in $test_bins; do echo \"## \$t\"; \$t || rc=1; done; exit \$rc"
        detail[cu-tests]="no ctest dir: ran $(echo $test_bins | wc -w) binaries directly"
      else status[cu-tests]="skip(no binaries)"; fi ;;
    sanitize)
      # Tier 3: builds the negative controls for this GPU, then every tool over tests, a pytest subset, controls.
      if [ -z "$test_bins" ]; then status[sanitize]="skip(no binaries)"; continue; fi
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
      # Tier 4: pytest-benchmark suites (CUDA-event timing of graph replays, anchors in the same run).
      run_tier bench $PY -m pytest tests/bench -q -p no:cacheprovider --benchmark-only \
        --benchmark-json="$OUT/bench.json" --benchmark-columns=min,median,max,rounds --benchmark-sort=name
      n_cases=$($PY -c "import json,sys; print(len(json.load(open(sys.argv[1]))['benchmarks']))" "$OUT/bench.json" 2>/dev/null || echo 0)
      detail[bench]="$n_cases cases"
      if [ "${status[bench]}" = pass ] && [ "$n_cases" -eq 0 ]; then status[bench]="FAIL(no case ran)"; fi ;;
    bench-gate)
      if [ ! -f "$OUT/bench.json" ]; then status[bench-gate]="skip(no bench.json)"; continue; fi
      run_tier bench-gate $PY ci/bench_gate.py "$OUT/bench.json" --baseline-dir "benchmarks/baselines/${gpu_slug:-unknown}" \
        --report "$OUT/bench-gate.json"
      detail[bench-gate]=$($PY ci/tier_detail.py gate "$OUT/bench-gate.json") ;;
    sass-digest)
      # CPU work, cheap here too: the image's SASS per arch vs the committed digest.
      if [ ! -f tests/golden/sass/cu130.json ] || [ ! -d astrai/extension/lib/cu130 ]; then status[sass-digest]="skip(no digest)"; continue; fi
      if ! command -v cuobjdump >/dev/null; then status[sass-digest]="skip(no cuobjdump)"; continue; fi
      run_tier sass-digest $PY ci/sass_digest.py astrai/extension/lib/cu130 --compare tests/golden/sass/cu130.json --out "$OUT/sass-digest.json"
      detail[sass-digest]=$(tail -n 1 "$OUT/sass-digest.log") ;;
    dashboard)
      if ! $PY -c "import matplotlib" 2>/dev/null; then status[dashboard]="skip(no matplotlib)"; detail[dashboard]="render elsewhere: nox -s dashboard -- --run $OUT/bench.json"; continue; fi
      if [ ! -f "$OUT/bench.json" ]; then status[dashboard]="skip(no bench.json)"; continue; fi
      run_tier dashboard $PY ci/dashboard.py --history "benchmarks/history/${gpu_slug:-unknown}" --run "$OUT/bench.json" \
        --gate "$OUT/bench-gate.json" --out "$OUT/dashboard" ;;
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
echo "=== summary ($(date -u +%Y-%m-%dT%H:%MZ), ${gpu_name:-no GPU}, $((SECONDS - START)) s of ${BUDGET_S} s budget, output $OUT)"
printf '%-15s %-18s %7s  %s\n' tier status seconds detail
rc=0
for tier in "${tiers[@]}"; do
  printf '%-15s %-18s %7s  %s\n' "$tier" "${status[$tier]:-?}" "${seconds[$tier]:--}" "${detail[$tier]:-}"
  case ${status[$tier]:-?} in pass|skip*) ;; *) rc=1 ;; esac
done
exit $rc
