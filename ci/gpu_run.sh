#!/usr/bin/env bash
# GPU tiers in one call, for a lent GPU machine or a CI farm node: writes logs and JSON under $OUT
# (default ./gpu-out) and prints a summary table last.
#
# Needs: a CUDA torch >= 2.10 in `python3`, the image in astrai/extension/lib/ (nox -s build), and for
# tier 2 the standalone test binaries (build/<wheel tag>/tests/, made by the same build).
# Usage: ci/gpu_run.sh [tiers...]   tiers: info cu-tests sanitize test-gpu test-gpu-ptx80 test-gpu-ptx89 bench (default: all)
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
tiers=("$@")
[ ${#tiers[@]} -gt 0 ] || tiers=(info cu-tests sanitize test-gpu test-gpu-ptx80 test-gpu-ptx89 bench)
declare -A status seconds

run_tier() {  # run_tier NAME CMD...: logs to $OUT/NAME.log, records status and time
  local name=$1; shift
  local t0=$SECONDS
  echo "=== $name: $*"
  "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  seconds[$name]=$((SECONDS - t0))
  if [ $rc -eq 0 ]; then status[$name]=pass; else status[$name]="FAIL($rc)"; fi
  tail -n 25 "$OUT/$name.log"
}

test_bins=$(ls build/*/tests/*_test 2>/dev/null)

for tier in "${tiers[@]}"; do
  case $tier in
    info)
      run_tier info bash -c "nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv; $PY -m astrai.extension info && $PY -m astrai.extension info --json > '$OUT/info.json' && $PY -m astrai.extension verify" ;;
    cu-tests)
      if [ -z "$test_bins" ]; then status[cu-tests]="skip(no binaries)"; continue; fi
      run_tier cu-tests bash -c "rc=0; for t in $test_bins; do echo \"## \$t\"; \$t || rc=1; done; exit \$rc" ;;
    sanitize)
      if [ -z "$test_bins" ]; then status[sanitize]="skip(no binaries)"; continue; fi
      run_tier sanitize bash -c "rc=0; for tool in memcheck racecheck synccheck initcheck; do for t in $test_bins; do
          echo \"## \$tool \$t\"; compute-sanitizer --tool \$tool --error-exitcode 9 \$t --small || rc=1; done; done; exit \$rc" ;;
    test-gpu)
      run_tier test-gpu $PY -m pytest tests/gpu -q -rs --junitxml="$OUT/test-gpu.xml" ;;
    test-gpu-ptx80|test-gpu-ptx89)
      # A test-only PTX image (nox -s build -- ptx-images), JIT-compiled here: runs the sm_80 / sm_89 paths.
      img=${tier#test-gpu-}
      if [ ! -f astrai/extension/lib/$img/image.json ]; then status[$tier]="skip(no $img image)"; continue; fi
      run_tier $tier env ASTRAI_IMAGE=$img $PY -m pytest tests/gpu -q -rs --junitxml="$OUT/$tier.xml" ;;
    bench)
      run_tier bench $PY tests/bench/bench_rotary.py --json "$OUT/bench_rotary.json" ;;
    *) echo "unknown tier $tier"; exit 2 ;;
  esac
done

echo
echo "=== summary ($(date -u +%Y-%m-%dT%H:%MZ), $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1))"
printf '%-10s %-18s %6s\n' tier status seconds
rc=0
for tier in "${tiers[@]}"; do
  printf '%-10s %-18s %6s\n' "$tier" "${status[$tier]:-?}" "${seconds[$tier]:--}"
  case ${status[$tier]:-?} in pass|skip*) ;; *) rc=1 ;; esac
done
exit $rc
