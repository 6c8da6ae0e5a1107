#!/usr/bin/env bash
# One device call: the quantized linear layers' tests on the GPU, then their benchmark at the Llama-3.1-8B and
# Llama-3.2-1B projection shapes (bench/quant_gemm.py: every format, 1..256 tokens, against the bytes and
# compute floors and against F.linear / torch._scaled_mm in the same run).
# Run from the repo root:  bash bench/run_gpu_quant.sh   (carry .whl: tests/conftest.py imports redis, which
# the GPU machine lacks; bench/gpu_carry.sh builds it, bench/gpu_env.sh installs it there)
# Writes into $OUT (default bench/results/tmp): gpu.txt, tests.log, bench.log, quant_gemm.{json,md}
# (commit the last two as bench/results/<gpu>/quant_gemm.*). Each phase has its own time limit
# (TESTS_TIMEOUT_S, BENCH_TIMEOUT_S; together under 5 minutes); the benchmark rewrites its files after every
# projection, so a cut-off run keeps what it measured.
#   PHASES="tests bench" (default: both); extra arguments go to bench.quant_gemm (--models 8B --tokens 1,64 ...).
#   PHASES=tiles (a call of its own, TILES_TIMEOUT_S): bench.quant_tiles times tile alternatives around the
#   launcher's defaults at 1, 16 and 64 tokens (quant_tiles.{json,md}).
set -uo pipefail

OUT="${OUT:-bench/results/tmp}"
source bench/gpu_env.sh
PYTHON="${PYTHON:-python3}"
export OUT PYTHONUNBUFFERED=1
mkdir -p "$OUT"
wants() { case " ${PHASES:-tests bench} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

gpu_info "$OUT/gpu.txt"

# The tests compile some 80 kernel variants: spread them over processes when pytest-xdist is there.
xdist_args=()
if "$PYTHON" -c 'import xdist' 2>/dev/null; then
    xdist_args=(-n "${TEST_WORKERS:-8}")
fi

tests_rc=0 bench_rc=0
if wants tests; then
    timeout "${TESTS_TIMEOUT_S:-80}" "$PYTHON" -m pytest tests/kernels/test_quant_gpu.py tests/kernels/test_quant_gemv.py \
        tests/kernels/test_quant_matmul.py \
        -q -p no:cacheprovider -p no:benchmark --durations=10 "${xdist_args[@]}" 2>&1 | tee "$OUT/tests.log"
    tests_rc=${PIPESTATUS[0]}
fi

if wants bench; then
    timeout "${BENCH_TIMEOUT_S:-215}" "$PYTHON" -m bench.quant_gemm --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log"
    bench_rc=${PIPESTATUS[0]}
fi

tiles_rc=0
if wants tiles; then
    timeout "${TILES_TIMEOUT_S:-280}" "$PYTHON" -m bench.quant_tiles --out "$OUT" 2>&1 | tee "$OUT/tiles.log"
    tiles_rc=${PIPESTATUS[0]}
fi

echo "exit codes (124 = ran out of time): tests $tests_rc, bench $bench_rc, tiles $tiles_rc"
[ "$tests_rc" -eq 0 ] && [ "$bench_rc" -eq 0 ] && [ "$tiles_rc" -eq 0 ]
