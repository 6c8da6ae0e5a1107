#!/usr/bin/env bash
# One device call: quantized weights in the engine. Batch-1 decode ms/token, offline output tok/s and the KV
# pool each format leaves, for bf16, fp8, int8 and int4 (random weights quantized on the fly) at the
# Llama-3.2-1B and Llama-3.1-8B shapes (bench/quantized_decode.py), after the engine's quantized GPU check
# (tests/engine/test_quantized_gpu.py: the tiny real-format checkpoints through the Triton kernels, the same
# greedy tokens as through the torch references; fp8 within the references' own noise, decision 0073).
#
# Run from the repo root on the GPU machine:  bash bench/run_gpu_quant_engine.sh
# Carry what bench/run_gpu_engine.sh needs (artifacts/smollm2-tokenizer, .whl: `bash bench/gpu_carry.sh`).
# Writes into $OUT (default bench/results/tmp): run.log, quantized_decode.{json,md} (commit them under
# bench/results/<gpu>/). Phase limits: tests 90 s, benchmark 360 s (under 8 minutes in all).
#   MODELS, QUANTIZATIONS (default "none,fp8,int8,int4"; none is bf16; add bf16-streaming for bf16 with the dense
#   streaming GEMM at 2..64 tokens, engine.ops.DENSE_STREAMING_MAX_TOKENS) choose what is measured.
set -uo pipefail

OUT="${OUT:-bench/results/tmp}"
MODELS="${MODELS:-Llama-3.1-8B,Llama-3.2-1B}"
QUANTIZATIONS="${QUANTIZATIONS:-none,fp8,int8,int4}"
mkdir -p "$OUT"
LOG="$OUT/run.log"
: >"$LOG"
source bench/gpu_env.sh
started=$SECONDS
phase() { echo "=== $1 (t=$((SECONDS - started))s)" | tee -a "$LOG"; }

phase environment
gpu_info "$OUT/gpu_info.txt" 2>&1 | tee -a "$LOG"

phase "quantized engine GPU check"
# NOTE: each format's case takes ~36 s on an H200 (its kernels' compiles): spread over processes where
# pytest-xdist is there (all ten finished in 56 s on 8 workers, 2026-11-29), else the phase runs out of time
xdist_args=()
if python3 -c 'import xdist' 2>/dev/null; then
    xdist_args=(-n "${TEST_WORKERS:-8}")
fi
timeout "${TESTS_TIMEOUT_S:-90}" python3 -m pytest -q -p no:cacheprovider \
    tests/engine/test_quantized_gpu.py --durations=5 "${xdist_args[@]}" 2>&1 | tee -a "$LOG"
tests_rc=${PIPESTATUS[0]}

phase "quantized decode and offline ($MODELS: $QUANTIZATIONS)"
timeout "${BENCH_TIMEOUT_S:-360}" python3 -m bench.quantized_decode --models "$MODELS" \
    --quantizations "$QUANTIZATIONS" --out "$OUT" 2>&1 | tee -a "$LOG"
bench_rc=${PIPESTATUS[0]}

phase done
echo "exit codes (124 = ran out of time): tests $tests_rc, bench $bench_rc" | tee -a "$LOG"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
