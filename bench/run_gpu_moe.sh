#!/usr/bin/env bash
# One device call: the MoE GPU tests, the MoE kernels' tuning, the MoE layer benchmark, and the engine
# benchmarks (batch-1 decode, offline throughput, time per output token at 10 concurrent requests of 2,048 /
# 1,024 tokens) on an MoE model with random weights of its real shape.
#
# Run from the repo root on the GPU machine:  bash bench/run_gpu_moe.sh
# Carry what bench/run_gpu_engine.sh needs (artifacts/smollm2-tokenizer for the tiny checkpoints of the GPU
# tests, .whl for redis; `bash bench/gpu_carry.sh` builds both).
# Writes into $OUT (default bench/results/tmp): run.log, moe_configs/<GPU>.json (the tuning: commit it as
# kernels/moe_configs/<GPU>.json), moe_layer.{json,md}, decode_latency.{json,md},
# offline_throughput.{json,md}, concurrent_decode.{json,md}. Each phase has its own time limit (the sum stays under 10 minutes);
# the tuned file is copied into kernels/moe_configs/ of this tree first, so the benchmarks after it run the
# tuned tiles.
#   PHASES="tests tune layer decode offline concurrent" (default: all) runs a subset.
#   MOE_MODEL (default Qwen3-30B-A3B: 61 GB of bf16 weights; Mixtral-8x7B's 93 GB need an H200) is the engine
#   benchmarks' model; TUNE_MODELS the bench/configs models whose layer shape is tuned, beside Mixtral-8x7B's
#   TP=2 shard (vLLM's E=8 N=7168, the layer benchmark's comparison).
set -uo pipefail

OUT="${OUT:-bench/results/tmp}"
PYTHON="${PYTHON:-python3}"
MOE_MODEL="${MOE_MODEL:-Qwen3-30B-A3B}"
TUNE_MODELS="${TUNE_MODELS:-Qwen3-30B-A3B,Qwen1.5-MoE-A2.7B}"
export OUT PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export INFERQ_TOKENIZER_DIR="${INFERQ_TOKENIZER_DIR:-$PWD/artifacts/smollm2-tokenizer}"
mkdir -p "$OUT"
LOG="$OUT/run.log"
: >"$LOG"
started=$SECONDS

phase() { echo "=== $1 (t=$((SECONDS - started))s)" | tee -a "$LOG"; }
wants() { case " ${PHASES:-tests tune layer decode offline concurrent} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

phase environment
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/inferq-site \
        .whl/*.whl 2>&1 | tee -a "$LOG"
    export PYTHONPATH="/tmp/inferq-site${PYTHONPATH:+:$PYTHONPATH}"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
"$PYTHON" -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__, "transformers", transformers.__version__)' 2>&1 | tee -a "$LOG"

tests_rc=0 tune_rc=0 layer_rc=0 decode_rc=0 offline_rc=0 concurrent_rc=0
if wants tests; then
    phase "MoE GPU tests"
    # the kernels at real shapes and tiles, graph replays of new routings; the MoE kinds of the engine's GPU
    # parity (Triton kernels with CUDA graphs against the torch references, same tokens)
    timeout "${TESTS_TIMEOUT_S:-110}" "$PYTHON" -m pytest tests/kernels/test_moe_gpu.py tests/kernels/test_moe_router.py \
        tests/kernels/test_moe_align.py tests/kernels/test_moe_gemm.py tests/engine/test_gpu_parity.py \
        -k "not test_gpu_parity or moe or mixtral or olmoe" -q -p no:cacheprovider --durations=10 2>&1 | tee -a "$LOG"
    tests_rc=${PIPESTATUS[0]}
fi

if wants tune; then
    phase "MoE tuning"
    timeout "${TUNE_TIMEOUT_S:-170}" "$PYTHON" -m bench.moe_tune --models "$TUNE_MODELS" --shape 8,2,4096,7168 \
        --tokens "${TUNE_TOKENS:-1,2,4,8,16,32,64,128,512,2048,8192}" --budget-s "${TUNE_BUDGET_S:-40}" \
        --config-dir "$OUT/moe_configs" 2>&1 | tee -a "$LOG"
    tune_rc=${PIPESTATUS[0]}
    if compgen -G "$OUT/moe_configs/*.json" >/dev/null; then
        cp "$OUT"/moe_configs/*.json kernels/moe_configs/
    fi
fi

if wants layer; then
    phase "MoE layer"
    timeout "${LAYER_TIMEOUT_S:-100}" "$PYTHON" -m bench.moe_layer --out "$OUT" \
        --tokens "${LAYER_TOKENS:-1,4,16,32,64,256,1536,2048,8192}" 2>&1 | tee -a "$LOG"
    layer_rc=${PIPESTATUS[0]}
fi

if wants decode; then
    phase "decode latency ($MOE_MODEL)"
    timeout "${DECODE_TIMEOUT_S:-90}" "$PYTHON" -m bench.decode_latency --models "$MOE_MODEL" --skip-hf --out "$OUT" \
        2>&1 | tee -a "$LOG"
    decode_rc=${PIPESTATUS[0]}
fi

if wants offline; then
    phase "offline throughput ($MOE_MODEL)"
    timeout "${OFFLINE_TIMEOUT_S:-100}" "$PYTHON" -m bench.offline_throughput --models "$MOE_MODEL" --skip-hf \
        --out "$OUT" 2>&1 | tee -a "$LOG"
    offline_rc=${PIPESTATUS[0]}
fi

if wants concurrent; then
    phase "concurrent requests ($MOE_MODEL)"
    timeout "${CONCURRENT_TIMEOUT_S:-90}" "$PYTHON" -m bench.concurrent_decode --models "$MOE_MODEL" --out "$OUT" \
        2>&1 | tee -a "$LOG"
    concurrent_rc=${PIPESTATUS[0]}
fi

phase done
echo "exit codes (124 = ran out of time): tests $tests_rc, tune $tune_rc, layer $layer_rc, decode $decode_rc," \
    "offline $offline_rc, concurrent $concurrent_rc" | tee -a "$LOG"
[ "$tests_rc" -eq 0 ] && [ "$tune_rc" -eq 0 ] && [ "$layer_rc" -eq 0 ] && [ "$decode_rc" -eq 0 ] && [ "$offline_rc" -eq 0 ] \
    && [ "$concurrent_rc" -eq 0 ]
