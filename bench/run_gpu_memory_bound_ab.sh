#!/usr/bin/env bash
# One device call for memory-bound kernel changes (session 14: the KV store and RoPE + KV store issue
# their loads before the slot/position round trip; one-token GEMV load schedules): the GPU tests of
# those kernels, the small-kernel suite of SMALL_OPS for this tree and an earlier one (BASE, default
# build/base: git archive REV api worker engine kernels pyproject.toml | tar -x -C build/base, with this
# tree's bench/ copied in so that both sides are timed by the same code), alternating, and
# bench.gemv_trials. Needs .whl (bench/gpu_carry.sh); carry build and .whl. PHASES (default
# "tests small gemv"; "launch": bench.prefill_launch_cost) picks what runs. Writes everything under
# $OUT/ab and prints the tables' rows.
set -uo pipefail
PHASES="${PHASES:-tests small gemv}"
SMALL_OPS="${SMALL_OPS:-store_kv,rope_store_kv}"
source bench/gpu_ab_prelude.sh

has tests && gpu_tests "tests/kernels/test_kv_store.py tests/kernels/test_rope_store_kv.py tests/kernels/test_rope.py tests/kernels/test_gemv.py tests/kernels/test_rms_norm_gemv.py tests/kernels/test_pdl.py" 200

small() {  # name tree
    local name=$1 tree=$2 out_abs; out_abs="$(cd "$R" && pwd)/$name"
    (cd "$tree" && PYTHONPATH="$PWD:${PYTHONPATH:-}" timeout 240 python3 -m bench.kernels --suites small \
        --small-ops "$SMALL_OPS" --out "$out_abs") >"$R/$name.log" 2>&1
    echo "== $name ($tree) rc $?"
    grep -E '^\| (store_kv|rope_store_kv|rms_norm|fused_add|rope|silu) \| 4096' "$out_abs/kernels.md"
}
has small && for round in 1 2; do
    small "small_base_$round" "$BASE"
    small "small_new_$round" .
done

if has gemv; then
PYTHONPATH="$here" timeout "${GEMV_TIMEOUT_S:-240}" python3 -m bench.gemv_trials --out "$R/gemv" ${GEMV_SHAPES:+--shapes "$GEMV_SHAPES"} \
    >"$R/gemv.log" 2>&1
echo "== gemv trials rc $?"
grep -E '^\| [0-9]' "$R/gemv/gemv_trials.md" | cut -d'|' -f2,4-10,12,13
fi

if has launch; then
PYTHONPATH="$here" timeout 120 python3 -m bench.prefill_launch_cost --out "$R/launch" >"$R/launch.log" 2>&1
echo "== prefill launch cost rc $?"
cat "$R/launch/prefill_launch_cost.md"
fi
