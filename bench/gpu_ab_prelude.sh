# Sourced (from the repo root) by the device-call A/B scripts after they set PHASES' default: the result
# folder $R ($OUT/ab), bench/gpu_env.sh, the GPU and versions into $R/gpu.txt, $here (this tree first on
# PYTHONPATH), has PHASE, and gpu_tests DEFAULT_PATHS DEFAULT_TIMEOUT_S (TEST_PATHS and TESTS_TIMEOUT_S
# override them), which runs the GPU tests into $R/tests.log and prints their summary, run_variants,
# which runs a benchmark module for each of VARIANTS="name|tree|args; ..." in order (tree: . or an
# earlier tree; args: its flags) into $R/<name> and prints each one's table rows, and decode_variants,
# run_variants of bench.decode_latency.
# MUTANTS="name|file|sed; ..." first makes each tree $MUTANT_ROOT/<name> (default /tmp/ab_trees): a copy of
# this tree's engine, kernels, bench and artifacts with the sed expression applied to kernels/<file>.py,
# for one-line probes (session 17: the merge kernel's warps); it stops the call if a sed changed nothing.
# The sed may hold neither "|" nor ";" (the separators here).
OUT="${OUT:-bench/results/tmp}"
R="$OUT/ab"
BASE="${BASE:-build/base}"
mkdir -p "$R"
source bench/gpu_env.sh
gpu_info "$R/gpu.txt"
here="$PWD:${PYTHONPATH:-}"
has() { [[ " $PHASES " == *" $1 "* ]]; }
gpu_tests() {
    local tests
    read -r -a tests <<<"${TEST_PATHS:-$1}"
    PYTHONPATH="$here" timeout "${TESTS_TIMEOUT_S:-$2}" python3 -m pytest -q -p no:cacheprovider -n 8 "${tests[@]}" \
        >"$R/tests.log" 2>&1
    echo "tests rc $?: $(tail -1 "$R/tests.log")"
}
# run_variants MODULE TIMEOUT_S PRINT_ROWS: python3 -m MODULE --skip-hf ARGS --out $R/NAME for each of
# VARIANTS="name|tree|args; ..." in order (tree: . or an earlier tree), its output in $R/NAME.log; then
# PRINT_ROWS NAME OUT_DIR prints the rows of its table worth reading in the call's output.
run_variants() {
    local module="$1" timeout_s="$2" print_rows="$3" variants variant name tree args out_abs
    IFS=';' read -r -a variants <<<"${VARIANTS:?set VARIANTS}"
    for variant in "${variants[@]}"; do
        IFS='|' read -r name tree args <<<"$variant"
        name="${name// /}" tree="${tree// /}"
        out_abs="$(cd "$R" && pwd)/$name"
        # shellcheck disable=SC2086  # args is a list of flags
        (cd "$tree" && PYTHONPATH="$PWD:${PYTHONPATH:-}" timeout "$timeout_s" python3 -m "$module" \
            --skip-hf $args --out "$out_abs") >"$R/$name.log" 2>&1
        echo "== $name ($tree $args) rc $?"
        "$print_rows" "$name" "$out_abs"
    done
}
decode_rows() { grep -E '^\| Llama' "$R/$1.log" | grep -E 'CUDA graphs \||\| [0-9]+ \| [0-9]+ \|' | tail -4; }
decode_variants() { run_variants bench.decode_latency "${DECODE_TIMEOUT_S:-100}" decode_rows; }
MUTANT_ROOT="${MUTANT_ROOT:-/tmp/ab_trees}"
make_mutants() {
    local mutants mutant name file expr tree changed
    IFS=';' read -r -a mutants <<<"${MUTANTS:-}"
    for mutant in "${mutants[@]}"; do
        IFS='|' read -r name file expr <<<"$mutant"
        name="${name// /}" file="${file// /}"
        [ -n "$name" ] || continue
        tree="$MUTANT_ROOT/$name"
        rm -rf "$tree" && mkdir -p "$tree" && cp -r engine kernels bench artifacts pyproject.toml "$tree"/
        sed -i "$expr" "$tree/kernels/$file.py"
        changed=$(diff "kernels/$file.py" "$tree/kernels/$file.py" | grep -c '^>')
        echo "mutant $name: $changed line(s) of kernels/$file.py changed"
        [ "$changed" -gt 0 ] || { echo "mutant $name changed nothing: its sed no longer matches"; exit 1; }
    done
}
make_mutants
