#!/usr/bin/env bash
# One device call: the service overhead benchmark (bench/service_overhead.py): the offline engine,
# then redis-server + worker + API on the same GPU, same workload, in the same run.
#
# Run from the repo root on the GPU machine:  bash bench/run_gpu_service.sh   (flags go to the benchmark;
# the canonical run is the default: 4 API processes, REPEATS=3 seeds, medians reported)
# Carry .whl (fastapi, starlette, uvicorn, sse-starlette, pydantic(-core, -settings), python-dotenv,
# annotated-types/-doc, typing-inspection/-extensions, httpx, httpcore, anyio, sniffio, idna, certifi,
# h11, click, redis, prometheus-client: the versions of the dev venv) and .redisbin (redis-server
# copied from a Debian/Ubuntu x86-64 machine, with the shared libraries it links in .redisbin/lib),
# and install the wheels first, e.g.
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# Writes into $OUT (default bench/results/tmp): service_overhead.{json,md}, run log and the
# logs of redis, the worker and the API; the committed result is bench/results/<gpu>/service_overhead.*.
set -uo pipefail

OUT="${OUT:-bench/results/tmp}"
PYTHON="${PYTHON:-python3}"
export OUT PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH="${PYTHONPATH:-$PWD}"
mkdir -p "$OUT"
LOG="$OUT/service_run.log"
: >"$LOG"

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee -a "$LOG"
"$PYTHON" -c 'import torch, triton, fastapi, uvicorn, redis, httpx, pydantic_settings, sse_starlette; print("torch", torch.__version__, "triton", triton.__version__, "fastapi", fastapi.__version__, "uvicorn", uvicorn.__version__)' 2>&1 | tee -a "$LOG"

# redis-server: the carried one (with its libraries only if it needs them), else one on PATH.
if [ -x .redisbin/redis-server ]; then
    export INFERQ_REDIS_SERVER="$PWD/.redisbin/redis-server"
    if ! "$INFERQ_REDIS_SERVER" --version >/dev/null 2>&1; then
        export INFERQ_REDIS_LIB="$PWD/.redisbin/lib"
    fi
    LD_LIBRARY_PATH="${INFERQ_REDIS_LIB:-}" "$INFERQ_REDIS_SERVER" --version 2>&1 | tee -a "$LOG"
fi

timeout "${SERVICE_TIMEOUT_S:-480}" "$PYTHON" -m bench.service_overhead --repeats "${REPEATS:-3}" --out "$OUT" "$@" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
for f in "$OUT"/service_overhead_*.log; do
    [ -f "$f" ] && { echo "--- tail of $f"; tail -n 15 "$f"; } | tee -a "$LOG"
done
echo "exit code (124 = ran out of time): $rc" | tee -a "$LOG"
exit "$rc"
