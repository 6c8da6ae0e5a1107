#!/usr/bin/env bash
# One device call: online latency under load (bench/online_latency.py) for each of MODELS, the service
# started afresh for each (redis-server, the worker, 4 API processes) on the GPU machine.
#
# Run from the repo root on the GPU machine:  MODELS="Qwen3-0.6B Llama-3.1-8B" bash bench/run_gpu_online.sh
# Carry .whl, .redisbin and artifacts (bench/gpu_carry.sh). Writes into $OUT (default bench/results/tmp):
# gpu.txt, online_latency.{json,md} (one entry a model), each model's run log (run_<model>.log) and the last
# run's worker and redis logs. The committed result is bench/results/<gpu>/online_latency.{json,md}.
#   SECONDS_PER_LOAD (default 60): arrivals per load; ONLINE_TIMEOUT_S (default 280): per model.
set -uo pipefail
OUT="${OUT:-bench/results/tmp}"
source bench/gpu_env.sh
export OUT PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$PWD"
if [ -x .redisbin/redis-server ]; then
    export INFERQ_REDIS_SERVER="$PWD/.redisbin/redis-server"
    "$INFERQ_REDIS_SERVER" --version >/dev/null 2>&1 || export INFERQ_REDIS_LIB="$PWD/.redisbin/lib"
fi
mkdir -p "$OUT"
gpu_info "$OUT/gpu.txt" >/dev/null
rc=0
for model in ${MODELS:-Qwen3-0.6B}; do
    log="$OUT/run_$model.log"
    timeout "${ONLINE_TIMEOUT_S:-280}" python3 -m bench.online_latency --model "$model" \
        --seconds "${SECONDS_PER_LOAD:-60}" --out "$OUT" >"$log" 2>&1
    code=$?
    echo "== $model: exit code $code (124 = ran out of time)"
    [ "$code" = 0 ] || { tail -n 30 "$log"; rc=$code; }
    rm -f "$OUT"/online_latency_api*.log
done
[ -f "$OUT/online_latency.md" ] && cat "$OUT/online_latency.md"
exit "$rc"
