#!/usr/bin/env bash
# One device call: the Batch API benchmark (bench/batch_api.py): the offline engine on a 10,000-line workload,
# then redis-server + the worker + 2 API processes + one Celery batch worker (`python -m batch`) on the same
# GPU: interactive TTFT at 50% of capacity alone, the 10,000-line batch alone, the same load with a batch running.
#
# Run from the repo root on the GPU machine:  bash bench/run_gpu_batch.sh   (flags go to the benchmark)
# Carry .whl, .redisbin and artifacts (bench/gpu_carry.sh: its wheels include celery, kombu and their
# dependencies, and python-multipart). Writes into $OUT (default bench/results/tmp): gpu.txt, batch_api.{json,md},
# the run log and the services' logs; the committed result is bench/results/<gpu>/batch_api.{json,md}.
#   BATCH_TIMEOUT_S (default 460): the whole benchmark (the offline pass ~1 min, the batch ~1 min, two loads of
#   SECONDS_PER_LOAD (default 30) s, two engine starts).
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
python3 -c 'import celery, kombu, python_multipart; print("celery", celery.__version__, "kombu", kombu.__version__)' \
    | tee -a "$OUT/gpu.txt"
log="$OUT/batch_api_run.log"
timeout "${BATCH_TIMEOUT_S:-460}" python3 -m bench.batch_api --seconds "${SECONDS_PER_LOAD:-30}" --out "$OUT" "$@" \
    >"$log" 2>&1
rc=$?
echo "exit code (124 = ran out of time): $rc"
[ "$rc" = 0 ] || { tail -n 40 "$log"; for f in "$OUT"/batch_api_batch.log "$OUT"/batch_api_worker.log; do
    [ -f "$f" ] && { echo "--- tail of $f"; tail -n 15 "$f"; }; done; }
[ -f "$OUT/batch_api.md" ] && cat "$OUT/batch_api.md"
exit "$rc"
