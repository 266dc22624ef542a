#!/usr/bin/env bash
# A/B of two images' GEMM kernels in one device call: tests/bench/bench_gemm.py on the same cells under image A, then
# B, with the plan chain's plans and with ASTRAI_GEMM_PORTABLE=1 (the portable kernels on every cell), the pair A/B
# twice more with the order reversed; then a table of B's time over A's a cell and the geomean ratios to the anchor
# (tests/bench/gemm_ab_summary.py). Both images sit in astrai/extension/lib/ under their own directory names (carry
# both; ASTRAI_IMAGE picks one a run). JSON and logs under $OUT/ab.
#
# Usage: ci/gemm_ab.sh IMAGE_A IMAGE_B [PAIR [M...]]      e.g. ci/gemm_ab.sh cu130old cu130 w8a16 1 16
# Env:   AB_SHAPES (N x K list, default the gated grid's nine), AB_REPLAYS (20), AB_LIMIT (seconds a run, 75)
set -u
cd "$(dirname "$0")/.."
A=$1 B=$2 PAIR=${3:-w8a16}
shift $(( $# < 3 ? $# : 3 ))
MS=${*:-1 16}
OUT=${OUT:-$PWD/gpu-out}; D=$OUT/ab; mkdir -p "$D"
SHAPES=${AB_SHAPES:-4096x4096 6144x4096 14336x4096 4096x14336 2112x7168 24576x1536 7168x16384 4096x7168 7168x2048}
export PYTHONPATH=$PWD:$PWD/tests/bench${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
T0=$SECONDS
run() {  # run IMAGE PORTABLE TAG
  ASTRAI_IMAGE=$1 ASTRAI_GEMM_PORTABLE=$2 timeout "${AB_LIMIT:-75}" python3 tests/bench/bench_gemm.py --pairs "$PAIR" \
    --m $MS --shapes $SHAPES --replays "${AB_REPLAYS:-20}" --json "$D/$3.json" > "$D/$3.txt" 2>&1
  echo "gemm_ab: $3 ($1, portable=$2) rc=$? at $((SECONDS - T0)) s"
}
run "$A" 1 a_portable; run "$B" 1 b_portable; run "$A" 0 a_chain; run "$B" 0 b_chain
run "$B" 1 b_portable2; run "$A" 1 a_portable2
python3 tests/bench/gemm_ab_summary.py "$D" "$A" "$B"
