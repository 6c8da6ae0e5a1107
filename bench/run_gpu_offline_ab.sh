#!/usr/bin/env bash
# One device call for changes of the large-batch decode path (session 18: decode attention's grid takes
# the batch longest context first). PHASES (default "tests trials offline") picks what runs:
#   tests    the GPU tests of TEST_PATHS (default: attention, the PDL contract, engine parity, CUDA graphs)
#   trials   bench.decode_varlen_trials: decode attention over mixed context lengths, as scheduled, sorted,
#            in the kernel's order and split
#   offline  bench.offline_throughput --skip-hf for each of VARIANTS="name|tree|args; ..." in order (tree: .
#            or an earlier tree, e.g. BASE: git archive REV engine kernels bench | tar -x -C build/base,
#            plus artifacts; carry build/base); alternate the trees, the host differs run to run
# Needs artifacts/smollm2-tokenizer and .whl (bench/gpu_carry.sh). Writes everything under $OUT/ab (as
# $OUT/ab.tgz) and prints the tables' rows.
set -uo pipefail
PHASES="${PHASES:-tests trials offline}"
source bench/gpu_ab_prelude.sh

has tests && gpu_tests "tests/kernels/test_attention.py tests/kernels/test_pdl_contract.py
    tests/engine/test_gpu_parity.py tests/engine/test_cuda_graphs.py" "${TESTS_TIMEOUT_S:-200}"

if has trials; then
    PYTHONPATH="$here" timeout 200 python3 -m bench.decode_varlen_trials --out "$R/trials" >"$R/trials.log" 2>&1
    echo "== decode varlen trials rc $?"
    grep -E '^\| (Qwen|Llama)' "$R/trials/decode_varlen_trials.md"
fi

offline_rows() { grep -E '^\| (Qwen|Llama)' "$2/engine_offline_throughput.md" | head -4; }
has offline && run_variants bench.offline_throughput "${OFFLINE_TIMEOUT_S:-150}" offline_rows
tar -C "$OUT" -czf "$OUT/ab.tgz" ab && rm -rf "$R"
