#!/usr/bin/env bash
# One device call for changes of the batch-1 decode path (session 15: decode attention's first tile and
# the qkv kernels' metadata loaded before the PDL wait, the LM head writing fp32 logits itself, RoPE and
# the KV store inside the qkv projection by default). PHASES (default "tests mutation kernels decode")
# picks what runs:
#   tests     the GPU tests of TEST_PATHS (default: the kernels touched, PDL, the engine's GPU parity)
#   mutation  the PDL early-read test against a copy of this tree whose decode attention reads the newest
#             token's K/V before its wait only: the test must fail (rc 1), or it could not catch that race
#   kernels   the decode attention suite of bench.kernels for BASE and this tree (KERNEL_ARGS: more flags,
#             e.g. --decode-cases 1x512 --decode-heads 32,8,64)
#   trials    bench.norm_epilogue_trials (o_proj -> gate|up: the engine's chain, the norm prepared in the
#             o_proj's epilogue, the fused norms off) into $R/trials (never by default)
#   decode    bench.decode_latency for each of VARIANTS="name|tree|args; ..." in order (tree: . or BASE)
# BASE (default build/base): git archive REV engine kernels bench | tar -x -C build/base; carry build.
# Needs artifacts/smollm2-tokenizer and .whl (bench/gpu_carry.sh). Writes everything under $OUT/ab and
# prints the tables' rows.
set -uo pipefail
PHASES="${PHASES:-tests mutation kernels decode}"
source bench/gpu_ab_prelude.sh

has tests && gpu_tests "tests/kernels/test_pdl.py tests/kernels/test_pdl_contract.py tests/kernels/test_attention.py
    tests/kernels/test_gemv.py tests/kernels/test_rms_norm_qkv_rope.py tests/kernels/test_rope_store_kv.py
    tests/kernels/test_kv_store.py tests/engine/test_fused_decode_layers.py tests/engine/test_gpu_parity.py
    tests/engine/test_cuda_graphs.py" "${TESTS_TIMEOUT_S:-240}"

if has mutation; then
    mutant=/tmp/mutant
    rm -rf "$mutant" && mkdir -p "$mutant" && cp -r kernels engine tests pyproject.toml "$mutant"/
    # every earlier row read before the wait and the newest never after it (with EARLY_FIRST_TILE on)
    sed -i -e 's/^    earlier = first_in_seq & (first_kpos < seq_len - 1) & EARLY_FIRST_TILE$/    earlier = first_in_seq \& EARLY_FIRST_TILE/' \
        -e 's/^    newest = first_in_seq & ((first_kpos == seq_len - 1) | (not EARLY_FIRST_TILE))$/    newest = first_in_seq \& (first_kpos < 0)/' \
        "$mutant/kernels/decode_attention.py"
    mutated=$(grep -c -E '^    (earlier = first_in_seq & EARLY_FIRST_TILE$|newest = first_in_seq & \(first_kpos < 0\))' \
        "$mutant/kernels/decode_attention.py")
    echo "mutated lines: $mutated (2 expected; otherwise the kernel changed and this phase tests nothing)"
    (cd "$mutant" && PYTHONPATH="$mutant:${PYTHONPATH:-}" timeout 150 python3 -m pytest -q -p no:cacheprovider \
        tests/kernels/test_pdl.py -k newest) >"$R/mutation.log" 2>&1
    echo "mutation (newest K/V read before the wait only): test rc $? (1: caught); $(tail -1 "$R/mutation.log")"
fi

if has kernels; then
    for side in base new; do
        tree=.; [ "$side" = base ] && tree="$BASE"
        out_abs="$(cd "$R" && pwd)/kernels_$side"
        # shellcheck disable=SC2086  # KERNEL_ARGS is a list of flags
        (cd "$tree" && PYTHONPATH="$PWD:${PYTHONPATH:-}" timeout 150 python3 -m bench.kernels --suites decode \
            ${KERNEL_ARGS:-} --out "$out_abs") >"$R/kernels_$side.log" 2>&1
        echo "== decode attention, $side, rc $?"
        grep -E '^\| [0-9]+ \| [0-9]+ \|' "$out_abs/kernels.md"
    done
fi

if has trials; then
    PYTHONPATH="$here" timeout 150 python3 -m bench.norm_epilogue_trials --out "$R/trials" >"$R/trials.log" 2>&1
    echo "== norm-epilogue trials rc $?"
    grep -E '^\| (1B|8B) ' "$R/trials/norm_epilogue_trials.md"
fi

has decode && decode_variants
tar -C "$OUT" -czf "$OUT/ab.tgz" ab && rm -rf "$R"
