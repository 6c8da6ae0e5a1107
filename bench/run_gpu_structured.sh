#!/usr/bin/env bash
# One device call: structured output's GPU checks and costs. The token bitmask kernel's tests on CUDA, then
# bench/structured_output.py on Llama-3.1-8B's shape with random weights: decode ms/step at batch 1 and 64 with
# and without a JSON-schema constraint, the host's mask fill per token, the device's mask apply, grammar compile
# times cold and cached.
#
# Run from the repo root on the GPU machine:  bash bench/run_gpu_structured.sh
# Carry .whl (bench/gpu_carry.sh: it holds xgrammar and apache-tvm-ffi, which the GPU machine's Python lacks) and
# artifacts/smollm2-tokenizer. Writes into $OUT (default bench/results/tmp): run.log, gpu.txt,
# structured_output.{json,md}. Each phase has its own time limit; the sum stays under 6 minutes.
#   STRUCTURED_MODEL (default Llama-3.1-8B), STRUCTURED_BATCHES (default 1,64), STRUCTURED_TOKENS (default 128).
set -uo pipefail

OUT="${OUT:-bench/results/tmp}"
export OUT
mkdir -p "$OUT"
source bench/gpu_env.sh
LOG="$OUT/run.log"
: >"$LOG"
started=$SECONDS
phase() { echo "=== $1 (t=$((SECONDS - started))s)" | tee -a "$LOG"; }

phase environment
gpu_info "$OUT/gpu.txt"
python3 -c 'import xgrammar; print("xgrammar", xgrammar.__file__)' 2>&1 | tee -a "$LOG"

phase "bitmask and sampling kernel tests (CUDA)"
timeout "${TESTS_TIMEOUT_S:-90}" python3 -m pytest tests/kernels/test_token_bitmask.py tests/kernels/test_greedy_sample.py \
    tests/kernels/test_random_sample.py -q -p no:cacheprovider 2>&1 \
    | tee -a "$LOG"
tests_rc=${PIPESTATUS[0]}

phase "structured output benchmark"
timeout "${BENCH_TIMEOUT_S:-270}" python3 -m bench.structured_output --model "${STRUCTURED_MODEL:-Llama-3.1-8B}" \
    --batches "${STRUCTURED_BATCHES:-1,64}" --new-tokens "${STRUCTURED_TOKENS:-128}" --out "$OUT" 2>&1 | tee -a "$LOG"
bench_rc=${PIPESTATUS[0]}

phase done
echo "exit codes (124 = ran out of time): tests $tests_rc, bench $bench_rc" | tee -a "$LOG"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
