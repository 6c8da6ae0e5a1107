#!/usr/bin/env bash
# One device call for a change of the KV pool's block size (session 13: 16 -> 64 tokens, with prefill
# attention's TMA path, which needs blocks of 64): the GPU tests of attention and the engine, the
# attention kernels at both block sizes, then offline throughput and batch-1 decode of this tree
# against an earlier one (BASE, default build/base: git archive REV api worker engine kernels bench
# pyproject.toml | tar -x -C build/base), alternating, on the same machine.
# Needs artifacts/smollm2-tokenizer and .whl (bench/gpu_carry.sh); carry build, artifacts, .whl.
# PHASES (default "tests kernels offline decode") picks what runs, so that the work can be split over
# two calls. Writes everything under $OUT/ab and prints the tables' rows.
set -uo pipefail
PHASES="${PHASES:-tests kernels offline decode}"
source bench/gpu_ab_prelude.sh

has tests && gpu_tests "tests/kernels/test_attention.py tests/engine/test_gpu_parity.py tests/engine/test_cuda_graphs.py tests/engine/test_mixed_graphs.py" 240

has kernels && for block in default 16; do
    flag=""; [ "$block" = default ] || flag="--block-size $block"
    # shellcheck disable=SC2086  # flag is one option or none
    PYTHONPATH="$here" timeout 150 python3 -m bench.kernels --suites prefill,decode $flag --out "$R/kernels_$block" \
        >"$R/kernels_$block.log" 2>&1
    echo "== kernels, pool blocks: $block, rc $?"
    grep -E '^\| [0-9]+ \| [0-9]+ \|' "$R/kernels_$block/kernels.md"
done

run_tree() {  # name tree module args...
    local name=$1 tree=$2 module=$3; shift 3
    local out_abs; out_abs="$(cd "$R" && pwd)/$name"
    (cd "$tree" && PYTHONPATH="$PWD:${PYTHONPATH:-}" timeout "${RUN_TIMEOUT_S:-150}" python3 -m "$module" --skip-hf "$@" \
        --out "$out_abs") >"$R/$name.log" 2>&1
    echo "== $name ($tree) rc $?"
    grep -E '^\| (Qwen|Llama)' "$R/$name.log" | head -4
}
has offline && for round in 1 2; do
    run_tree "offline_base_$round" "$BASE" bench.offline_throughput --models "${OFFLINE_MODELS:-Qwen3-0.6B}"
    run_tree "offline_new_$round" . bench.offline_throughput --models "${OFFLINE_MODELS:-Qwen3-0.6B}"
done
if has decode; then
    run_tree decode_base "$BASE" bench.decode_latency --models "${DECODE_MODELS:-Llama-3.2-1B}"
    run_tree decode_new . bench.decode_latency --models "${DECODE_MODELS:-Llama-3.2-1B}"
fi
