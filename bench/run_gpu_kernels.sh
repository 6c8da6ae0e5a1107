#!/usr/bin/env bash
# One device call: the kernel tests for real on the GPU, then the kernel benchmarks.
# Run from the repo root:  bash bench/run_gpu_kernels.sh   (carry .whl: tests/conftest.py imports redis,
# which the GPU machine lacks; bench/gpu_carry.sh builds it, bench/gpu_env.sh installs it there)
# Writes into $OUT (default bench/results/tmp): gpu.txt, tests.log, bench.log, kernels.json, kernels.md,
# and ncu.txt: Nsight Compute's report of the kernels whose goals are missed (bench/kernel_profile.py;
# skipped when ncu is absent or PROFILE=0; PROFILE_CASES names a subset).
# Each phase has its own time limit (TESTS_TIMEOUT_S, BENCH_TIMEOUT_S) so that one slow
# phase cannot starve the other inside a 10-minute call; the bench writes its JSON and
# markdown after every suite, so a cut-off run keeps what it measured.
set -uo pipefail

OUT="${OUT:-bench/results/tmp}"
source bench/gpu_env.sh
PYTHON="${PYTHON:-python3}"
export OUT PYTHONUNBUFFERED=1
mkdir -p "$OUT"

gpu_info "$OUT/gpu.txt"

# Tests compile many kernel variants: spread them over processes when pytest-xdist is there.
xdist_args=()
if "$PYTHON" -c 'import xdist' 2>/dev/null; then
    xdist_args=(-n "${TEST_WORKERS:-8}")
fi
timeout "${TESTS_TIMEOUT_S:-300}" "$PYTHON" -m pytest tests/kernels -q -p no:cacheprovider -p no:benchmark --durations=10 \
    "${xdist_args[@]}" 2>&1 | tee "$OUT/tests.log"
tests_rc=${PIPESTATUS[0]}

timeout "${BENCH_TIMEOUT_S:-270}" "$PYTHON" -m bench.kernels --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
bench_rc=${PIPESTATUS[0]}

profile_rc=0
NCU="${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}"
if [ "${PROFILE:-1}" = 1 ] && [ -n "$NCU" ]; then
    # --clock-control none: leave the GPU's clocks as they are (never change its settings)
    timeout "${PROFILE_TIMEOUT_S:-150}" "$NCU" --clock-control none --profile-from-start off --target-processes all \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
        --section WarpStateStats --section SchedulerStats \
        "$PYTHON" -m bench.kernel_profile ${PROFILE_CASES:-} >"$OUT/ncu.txt" 2>&1
    profile_rc=$?
fi

echo "tests exit code: $tests_rc, bench exit code: $bench_rc, profile exit code: $profile_rc (124 = ran out of time)"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ]
