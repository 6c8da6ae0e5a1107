# Sourced (from the repo root) by the device-call A/B scripts after they set PHASES' default: the result
# folder $R ($OUT/ab), bench/gpu_env.sh, the GPU and versions into $R/gpu.txt, $here (this tree first on
# PYTHONPATH), has PHASE, and gpu_tests DEFAULT_PATHS DEFAULT_TIMEOUT_S (TEST_PATHS and TESTS_TIMEOUT_S
# override them), which runs the GPU tests into $R/tests.log and prints their summary.
OUT="${OUT:-bench/results/tmp}"
R="$OUT/ab"
BASE="${BASE:-build/base}"
mkdir -p "$R"
source bench/gpu_env.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$R/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$R/gpu.txt"
here="$PWD:${PYTHONPATH:-}"
has() { [[ " $PHASES " == *" $1 "* ]]; }
gpu_tests() {
    local tests
    read -r -a tests <<<"${TEST_PATHS:-$1}"
    PYTHONPATH="$here" timeout "${TESTS_TIMEOUT_S:-$2}" python3 -m pytest -q -p no:cacheprovider -n 8 "${tests[@]}" \
        >"$R/tests.log" 2>&1
    echo "tests rc $?: $(tail -1 "$R/tests.log")"
}
