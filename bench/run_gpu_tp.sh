#!/usr/bin/env bash
# One device call: tensor parallelism on the GPUs of one host (bench/tensor_parallel.py). First the all-reduce
# between the GPUs (in processes of its own), then, per model and size, batch-1 decode against size 1 and rank
# 0's floor, and a 64-sequence offline workload against size 1.
#
# Run from the repo root on a machine with 2 GPUs (the device tool's nvidia-h200-x2):  bash bench/run_gpu_tp.sh
# The Llama-3.1-70B shape needs 4 GPUs (nvidia-h200-x4):  MODELS=Llama-3.1-70B SIZES=4 bash bench/run_gpu_tp.sh
# (141 GB of bf16 weights fit no single GPU, so that run has no size 1; its goal is >= 80% of rank 0's floor).
# Carries nothing: random weights from bench/configs, a synthetic tokenizer (.whl is installed when present).
# Writes into $OUT (default bench/results/tmp): run.log, gpu.txt (with the GPUs' link topology),
# tensor_parallel.{json,md} (commit them as bench/results/<gpu>/tensor_parallel.{json,md}; the JSON and markdown
# are rewritten after each step, so a run cut off by its limit keeps what it measured).
#   MODELS (default Llama-3.1-8B) and SIZES (default 1,2) choose what is measured; a size above the GPUs the
#   machine has is skipped with a note in the report. BENCH_TIMEOUT_S (default 480) limits the benchmark.
set -uo pipefail

OUT="${OUT:-bench/results/tmp}"
PYTHON="${PYTHON:-python3}"
MODELS="${MODELS:-Llama-3.1-8B}"
SIZES="${SIZES:-1,2}"
# NVLink multicast (NVLS) stays off on the shared machines; the all-reduces of a decode step are small anyway
export OUT NCCL_NVLS_ENABLE=0
source bench/gpu_env.sh
mkdir -p "$OUT"
LOG="$OUT/run.log"
: >"$LOG"
started=$SECONDS

phase() { echo "=== $1 (t=$((SECONDS - started))s)" | tee -a "$LOG"; }

phase environment
gpu_info "$OUT/gpu.txt" >>"$LOG"
nvidia-smi topo -m 2>&1 | tee -a "$OUT/gpu.txt" >>"$LOG"

phase "tensor parallel ($MODELS at sizes $SIZES)"
timeout --kill-after=20 "${BENCH_TIMEOUT_S:-480}" "$PYTHON" -m bench.tensor_parallel --models "$MODELS" \
    --sizes "$SIZES" --out "$OUT" 2>&1 | tee -a "$LOG"
bench_rc=${PIPESTATUS[0]}

phase done
echo "exit code (124 = ran out of time): bench $bench_rc" | tee -a "$LOG"
[ "$bench_rc" -eq 0 ]
