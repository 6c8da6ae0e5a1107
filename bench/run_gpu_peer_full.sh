#!/usr/bin/env bash
# One device call: the engine's offline run, then transformers over the whole offline workload on
# the same machine (bench/hf_full_workload.py), so the ratio compares two figures of one run.
# Run from the repo root:  MODELS=Llama-3.1-8B bash bench/run_gpu_peer_full.sh
#   MODELS   comma-separated (default Llama-3.1-8B)
#   ORDER    arrival (default: workload order, vLLM's hf baseline, the peer of the offline goal's 20x) or by_output
#            (batches grouped by output length, the least-waste order)
#   BATCHES  the peer's batch indices to run (default all); a cut-off run's rest goes into another
#            call, and `python -m bench.hf_full_workload --combine` merges the two JSON files
#   COLD=1   times the peer without its warm-up (bench/hf_full_workload.py's warm_up_steps)
#   ENGINE=0 leaves out the engine's run; PEER_TIMEOUT_S (default 480) bounds the peer. On an H100 a
#            whole call (engine, warm-up, all 4 batches) took ~4.5 min at Qwen3-0.6B and 7.2 min at
#            Llama-3.1-8B (2026-11-26: the 8B's batches 242 s), within one 10-minute call; in arrival order
#            the 8B's warm-up (~157 s) and batches (~379 s) take two calls: BATCHES=0,1 then 2,3 (2026-11-27)
# Writes into $OUT: gpu.txt, run.log, offline_throughput.{json,md}, hf_full_workload.{json,md}.
set -uo pipefail

OUT="${OUT:-bench/results/tmp}"
source bench/gpu_env.sh
PYTHON="${PYTHON:-python3}"
MODELS="${MODELS:-Llama-3.1-8B}"
export OUT PYTHONUNBUFFERED=1
mkdir -p "$OUT"
LOG="$OUT/run.log"

gpu_info "$OUT/gpu.txt"

engine_rc=0
if [ "${ENGINE:-1}" = 1 ]; then
    timeout "${ENGINE_TIMEOUT_S:-150}" "$PYTHON" -m bench.offline_throughput --skip-hf --models "$MODELS" --out "$OUT" 2>&1 | tee "$LOG"
    engine_rc=${PIPESTATUS[0]}
fi
timeout "${PEER_TIMEOUT_S:-480}" "$PYTHON" -m bench.hf_full_workload --models "$MODELS" --order "${ORDER:-arrival}" \
    --batches "${BATCHES:-}" --out "$OUT" $([ "${COLD:-0}" = 1 ] && echo --cold) 2>&1 | tee -a "$LOG"
peer_rc=${PIPESTATUS[0]}
echo "exit codes (124 = ran out of time): engine $engine_rc, peer $peer_rc" | tee -a "$LOG"
[ "$engine_rc" -eq 0 ] && [ "$peer_rc" -eq 0 ]
