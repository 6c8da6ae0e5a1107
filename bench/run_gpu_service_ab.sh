#!/usr/bin/env bash
# One device call: the service overhead benchmark (bench/run_gpu_service.sh) of several trees on the
# same machine, alternating, so that a change of the worker or the API is compared with the tree before
# it under the same host (host speed moves the service's figures more than most changes do:
# bench/results/h100/service_history.md).
#
#   VARIANTS="name|tree[|flags[|env]]; ..."   tree: . or an earlier tree (git archive REV api worker engine
#       kernels bench pyproject.toml | tar -x -C build/X; carry build); flags: more flags of
#       bench.service_overhead for this variant only; env: K=V assignments for its processes
#       (e.g. INFERQ_EVENT_LOOP=asyncio)
#   ROUNDS=2      how many times the list is run
#   ARGS="..."    flags of bench.service_overhead for every run (default: --api-replicas 4 --repeats 2)
# Needs .whl and .redisbin (bench/gpu_carry.sh). Writes $OUT/service_ab.tgz (every run's JSON, table
# and logs) and prints each run's summary line.
set -uo pipefail
OUT="${OUT:-bench/results/tmp}"
R="$OUT/service_ab"
mkdir -p "$R"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/inferq-site .whl/*.whl
    export PYTHONPATH="/tmp/inferq-site" PATH="/tmp/inferq-site/bin:$PATH"  # bin: py-spy (BENCH_PYSPY=1)
fi
redisbin="$(pwd)/.redisbin"
IFS=';' read -r -a variants <<<"${VARIANTS:?set VARIANTS}"
for round in $(seq 1 "${ROUNDS:-2}"); do
    for variant in "${variants[@]}"; do
        IFS='|' read -r name tree flags envs <<<"$variant"
        name="${name// /}" tree="${tree// /}"
        out_abs="$(cd "$R" && pwd)/${round}_$name"
        mkdir -p "$out_abs"
        [ "$tree" = . ] || { rm -rf "$tree/.redisbin"; cp -r "$redisbin" "$tree/.redisbin"; }
        # shellcheck disable=SC2086  # ARGS, flags and envs are lists
        (cd "$tree" && env ${envs:-} OUT="$out_abs" PYTHONPATH="$PWD:${PYTHONPATH:-}" bash bench/run_gpu_service.sh \
            ${ARGS:---api-replicas 4 --repeats 2} ${flags:-}) >"$out_abs/stdout.log" 2>&1
        echo "== round $round $name ($tree) rc $? at $(date -u +%H:%M:%S)"
        grep -h -E '^\| (offline|service)|^The throughput workload ran' "$out_abs"/service_overhead*.md 2>/dev/null
    done
done
tar -C "$OUT" -czf "$OUT/service_ab.tgz" service_ab && rm -rf "$R"
