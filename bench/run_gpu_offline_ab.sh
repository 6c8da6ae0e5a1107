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

if has offline; then
    IFS=';' read -r -a variants <<<"${VARIANTS:?set VARIANTS}"
    for variant in "${variants[@]}"; do
        IFS='|' read -r name tree args <<<"$variant"
        name="${name// /}" tree="${tree// /}"
        out_abs="$(cd "$R" && pwd)/$name"
        # shellcheck disable=SC2086  # args is a list of flags
        (cd "$tree" && PYTHONPATH="$PWD:${PYTHONPATH:-}" timeout "${OFFLINE_TIMEOUT_S:-150}" python3 -m \
            bench.offline_throughput --skip-hf $args --out "$out_abs") >"$R/$name.log" 2>&1
        echo "== $name ($tree $args) rc $?"
        grep -E '^\| (Qwen|Llama)' "$out_abs/engine_offline_throughput.md" | head -4
    done
fi
tar -C "$OUT" -czf "$OUT/ab.tgz" ab && rm -rf "$R"
