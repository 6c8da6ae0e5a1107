#!/usr/bin/env bash
# One device call (< 10 min on an H100): sliding windows and Gemma 3 on the GPU.
#   1. tests: the window paths of the attention kernels, GeGLU, the dense attention tests (unchanged), and the
#      engine's Triton path against its torch path on the tiny windowed checkpoints (Mistral, Qwen2, Gemma 3);
#   2. kernels: decode attention of Gemma-3-4B's heads (Hq 8, Hkv 4, D 256) with a 1,024-key window at 32k
#      context, GB/s of the bytes inside the window against the read ceiling (goal >= 85%), beside the same heads
#      without a window at 1,024 keys (the same bytes), and the dense decode suite (Llama-3-8B heads: must not
#      move against bench/results/h100/kernels.md);
#   3. engine: batch-1 decode latency and offline throughput of Gemma-3-1B and Gemma-3-4B shapes (random bf16
#      weights), bench/roofline.py's floors counting each sliding layer's reads up to its window;
#   4. window_kv_memory: the KV one long sequence holds (CPU arithmetic through the block manager).
# Run from the repo root:  bash bench/run_gpu_gemma.sh   (carry .whl and artifacts/smollm2-tokenizer: bench/gpu_carry.sh)
# Writes into $OUT (default bench/results/tmp): run.log, gpu.txt, kernels_window/, kernels_dense_1k/,
# kernels_dense/, decode_latency.{json,md}, offline_throughput.{json,md}, window_kv_memory.{json,md}.
#   PHASES="tests kernels decode offline memory" (default: all) runs a subset, so that the work can span calls.
#   BASELINE_TREE=build/baseline (an earlier commit: `git archive REV engine kernels bench | tar -x -C build/baseline`;
#   carry build): also batch-1 decode of Llama-3.2-1B from that tree and from this one, same machine, into
#   $OUT/baseline and $OUT/dense: the dense model's A/B (the window path must cost nothing without a window).
#   That adds up to 3 minutes: give it a call of its own (PHASES=decode MODELS=Gemma-3-1B, say).
# The phases' time limits (TESTS_TIMEOUT_S, KERNELS_TIMEOUT_S, DECODE_TIMEOUT_S, OFFLINE_TIMEOUT_S) add up to
# under 10 minutes; each benchmark writes its files after every model or suite, so a cut-off phase keeps them.
set -uo pipefail

OUT="${OUT:-bench/results/tmp}"
source bench/gpu_env.sh
PYTHON="${PYTHON:-python3}"
export OUT PYTHONUNBUFFERED=1
mkdir -p "$OUT"
LOG="$OUT/run.log"
: >"$LOG"
started=$SECONDS
phase() { echo "=== $1 (t=$((SECONDS - started))s)" | tee -a "$LOG"; }
wants() { case " ${PHASES:-tests kernels decode offline memory} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
MODELS="${MODELS:-Gemma-3-1B,Gemma-3-4B}"

gpu_info "$OUT/gpu.txt" | tee -a "$LOG"
tests_rc=0 kernels_rc=0 decode_rc=0 offline_rc=0 memory_rc=0

if wants tests; then
    phase "GPU tests"
    xdist_args=()
    if "$PYTHON" -c 'import xdist' 2>/dev/null; then
        xdist_args=(-n "${TEST_WORKERS:-8}")
    fi
    timeout "${TESTS_TIMEOUT_S:-140}" "$PYTHON" -m pytest tests/kernels/test_attention_window.py \
        tests/kernels/test_gelu_tanh_and_mul.py tests/kernels/test_attention.py tests/engine/test_gpu_parity.py \
        -k "not test_gpu_parity or window or gemma3 or llama" \
        -q -p no:cacheprovider -p no:benchmark --durations=10 "${xdist_args[@]}" 2>&1 | tee -a "$LOG"
    tests_rc=${PIPESTATUS[0]}
fi

if wants kernels; then
    phase "decode attention: 1,024-key window at 32k context (Gemma-3-4B heads)"
    timeout "${KERNELS_TIMEOUT_S:-45}" "$PYTHON" -m bench.kernels --suites decode --decode-heads 8,4,256 \
        --decode-window 1024 --decode-cases 1x32768,8x32768,32x32768,64x32768,128x32768 \
        --out "$OUT/kernels_window" 2>&1 | tee -a "$LOG"
    kernels_rc=${PIPESTATUS[0]}
    phase "decode attention: the same heads without a window at 1,024 keys"
    timeout "${KERNELS_TIMEOUT_S:-45}" "$PYTHON" -m bench.kernels --suites decode --decode-heads 8,4,256 \
        --decode-cases 1x1024,8x1024,32x1024,64x1024,128x1024 --out "$OUT/kernels_dense_1k" 2>&1 | tee -a "$LOG"
    phase "dense attention suites (Llama-3-8B heads), against bench/results/h100/kernels.md"
    timeout "${KERNELS_TIMEOUT_S:-60}" "$PYTHON" -m bench.kernels --suites prefill,decode \
        --out "$OUT/kernels_dense" 2>&1 | tee -a "$LOG"
fi

if wants decode; then
    phase "batch-1 decode latency: $MODELS"
    timeout "${DECODE_TIMEOUT_S:-140}" "$PYTHON" -m bench.decode_latency --models "$MODELS" --skip-hf \
        --out "$OUT" 2>&1 | tee -a "$LOG"
    decode_rc=${PIPESTATUS[0]}
    if [ -n "${BASELINE_TREE:-}" ]; then
        phase "dense A/B: Llama-3.2-1B batch-1 decode, this tree then $BASELINE_TREE"
        mkdir -p "$OUT/dense" "$OUT/baseline"
        timeout 90 "$PYTHON" -m bench.decode_latency --models Llama-3.2-1B --skip-hf --out "$OUT/dense" 2>&1 | tee -a "$LOG"
        out_abs="$(cd "$OUT/baseline" && pwd)"
        (cd "$BASELINE_TREE" && PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" timeout 90 \
            "$PYTHON" -m bench.decode_latency --models Llama-3.2-1B --skip-hf --out "$out_abs") 2>&1 | tee -a "$LOG"
    fi
fi

if wants offline; then
    phase "offline throughput: $MODELS"
    timeout "${OFFLINE_TIMEOUT_S:-160}" "$PYTHON" -m bench.offline_throughput --models "$MODELS" --skip-hf \
        --out "$OUT" 2>&1 | tee -a "$LOG"
    offline_rc=${PIPESTATUS[0]}
fi

if wants memory; then
    phase "KV memory of one long sequence"
    timeout 60 "$PYTHON" -m bench.window_kv_memory --out "$OUT" 2>&1 | tee -a "$LOG"
    memory_rc=${PIPESTATUS[0]}
fi

phase done
echo "exit codes (124 = ran out of time): tests $tests_rc, kernels $kernels_rc, decode $decode_rc," \
    "offline $offline_rc, memory $memory_rc" | tee -a "$LOG"
[ "$tests_rc" -eq 0 ] && [ "$kernels_rc" -eq 0 ] && [ "$decode_rc" -eq 0 ] && [ "$offline_rc" -eq 0 ] \
    && [ "$memory_rc" -eq 0 ]
