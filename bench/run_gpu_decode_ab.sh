#!/usr/bin/env bash
# One device call: a few GPU tests, then batch-1 decode latency (bench/decode_latency.py, no transformers
# peer) of several variants on the same machine, alternating, and last the fused-GEMV tile sweep. For
# A/Bs of the engine's one-token dispatch or of a tree against an earlier one (host and GPU speed differ
# between machines of one kind, so only runs of one call are compared).
#
#   VARIANTS="name|tree|args; name|tree|args; ..."   tree: . or an earlier tree (git archive REV engine
#       kernels bench | tar -x -C build/X; carry build); args: flags of bench.decode_latency
#   TEST_PATHS="..."   the GPU tests first (default: the one-token kernels and the engine parity tests)
#   SWEEP=0            leave out bench/fused_gemv_sweep.py
# Needs artifacts/smollm2-tokenizer and .whl (bench/gpu_carry.sh). Writes $OUT/ab.tgz (every result
# and log) and prints each variant's table rows.
set -uo pipefail
source bench/gpu_ab_prelude.sh

gpu_tests "tests/kernels/test_rms_norm_gemv.py tests/engine/test_fused_decode_layers.py tests/engine/test_gpu_parity.py" 150
decode_variants

if [ "${SWEEP:-1}" = 1 ]; then
    OUT="$R" PYTHONPATH="$PWD:${PYTHONPATH:-}" timeout "${SWEEP_TIMEOUT_S:-170}" python3 -m bench.fused_gemv_sweep \
        >"$R/sweep.log" 2>&1
    tail -12 "$R/sweep.log"
fi
tar -C "$OUT" -czf "$OUT/ab.tgz" ab && rm -rf "$R"
