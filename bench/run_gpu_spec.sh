#!/usr/bin/env bash
# One device call: speculative decoding's GPU check and speed.
#
# Run from the repo root on the GPU machine:  bash bench/run_gpu_spec.sh
# Carry what bench/run_gpu_engine.sh needs (artifacts/smollm2-tokenizer for the tiny checkpoints of the tests,
# .whl for redis; `bash bench/gpu_carry.sh` builds both).
# Writes into $OUT (default bench/results/tmp): run.log, speculative_decode.{json,md} (commit them as
# bench/results/<gpu>/speculative_decode.{json,md}). Each phase has its own time limit (the sum stays under
# 6 minutes).
#   PHASES="tests bench" (default: both) runs a subset.
#   SPEC_MODELS (default Llama-3.1-8B) are the bench/configs models measured with random weights.
set -uo pipefail

OUT="${OUT:-bench/results/tmp}"
PYTHON="${PYTHON:-python3}"
SPEC_MODELS="${SPEC_MODELS:-Llama-3.1-8B}"
export OUT
source bench/gpu_env.sh
mkdir -p "$OUT"
LOG="$OUT/run.log"
: >"$LOG"
started=$SECONDS

phase() { echo "=== $1 (t=$((SECONDS - started))s)" | tee -a "$LOG"; }
wants() { case " ${PHASES:-tests bench} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

phase environment
gpu_info "$OUT/gpu.txt" >>"$LOG"

tests_rc=0 bench_rc=0
if wants tests; then
    phase "speculative decoding tests (CUDA: Triton kernels, graphs, verification in mixed-bucket graphs)"
    timeout "${TESTS_TIMEOUT_S:-120}" "$PYTHON" -m pytest tests/engine/test_speculative_gpu.py -q -p no:cacheprovider \
        --durations=5 2>&1 | tee -a "$LOG"
    tests_rc=${PIPESTATUS[0]}
fi

if wants bench; then
    phase "speculative decode ($SPEC_MODELS)"
    timeout "${BENCH_TIMEOUT_S:-220}" "$PYTHON" -m bench.speculative_decode --models "$SPEC_MODELS" --out "$OUT" \
        2>&1 | tee -a "$LOG"
    bench_rc=${PIPESTATUS[0]}
fi

phase done
echo "exit codes (124 = ran out of time): tests $tests_rc, bench $bench_rc" | tee -a "$LOG"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
