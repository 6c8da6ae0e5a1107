#!/usr/bin/env bash
# One device call: the few-rows projections (kernels/gemv_rows.py) tested for real on the GPU, measured alone
# against cuBLAS (bench/gemv_rows.py), and in the engine: time per output token of 2 and 4 concurrent requests
# with the kernels and without them (engine.ops.GEMV_ROWS_MAX 0), at the SmolLM2-135M and Qwen2.5-0.5B shapes.
#
# Run from the repo root on the GPU machine:  bash bench/run_gpu_rows.sh
# Carry .whl and artifacts (bench/gpu_carry.sh builds both).
# Writes into $OUT (default bench/results/tmp): run.log (the tests and the engine A/B), gpu.txt,
# gemv_rows.{json,md} (commit them as bench/results/<gpu>/gemv_rows.{json,md}). About 4 minutes.
set -uo pipefail

OUT="${OUT:-bench/results/tmp}"
PYTHON="${PYTHON:-python3}"
export OUT
source bench/gpu_env.sh
mkdir -p "$OUT"
LOG="$OUT/run.log"
: >"$LOG"
started=$SECONDS
phase() { echo "=== $1 (t=$((SECONDS - started))s)" | tee -a "$LOG"; }

phase environment
gpu_info "$OUT/gpu.txt" >>"$LOG"
xdist_args=()
if "$PYTHON" -c 'import xdist' 2>/dev/null; then
    xdist_args=(-n "${TEST_WORKERS:-8}")
fi

phase "tests (the kernels, and the engine's few-sequence steps under CUDA graphs)"
timeout "${TESTS_TIMEOUT_S:-120}" "$PYTHON" -m pytest tests/kernels/test_gemv_rows.py tests/engine/test_fused_decode_layers.py \
    -q -p no:cacheprovider -p no:benchmark "${xdist_args[@]}" 2>&1 | tee -a "$LOG"
tests_rc=${PIPESTATUS[0]}

phase "engine A/B: concurrent requests with the few-rows kernels (GEMV_ROWS_MAX 4) and without (0)"
ab_rc=0
for case in "SmolLM2-135M 2" "SmolLM2-135M 4" "Qwen2.5-0.5B 2" "Qwen2.5-0.5B 4"; do
    set -- $case
    for rows in 4 0; do
        timeout 45 "$PYTHON" -m bench.concurrent_decode --models "$1" --requests "$2" --prompt-len 128 --output-len 256 \
            --gemv-rows-max "$rows" --out "/tmp/rows_ab_$1_$2_$rows" >"/tmp/rows_ab.log" 2>&1 || ab_rc=$?
        echo "$1, $2 requests, GEMV_ROWS_MAX $rows: $(grep -hE "^\| $1" /tmp/rows_ab_"$1"_"$2"_"$rows"/*.md 2>/dev/null)" \
            | tee -a "$LOG"
    done
done

phase "the kernels alone (bench/gemv_rows.py)"
timeout "${BENCH_TIMEOUT_S:-100}" "$PYTHON" -m bench.gemv_rows --out "$OUT" >>"$LOG" 2>&1
bench_rc=$?

phase done
echo "exit codes (124 = ran out of time): tests $tests_rc, engine A/B $ab_rc, bench $bench_rc" | tee -a "$LOG"
[ "$tests_rc" -eq 0 ] && [ "$ab_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
