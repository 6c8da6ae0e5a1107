# Sourced (from the repo root) by the device-call scripts that run the engine: Hugging Face offline,
# the carried SmolLM2 tokenizer, and the carried wheelhouse (.whl, bench/gpu_carry.sh) installed into
# /tmp/inferq-site, which goes on PYTHONPATH (its bin on PATH: py-spy).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export INFERQ_TOKENIZER_DIR="${INFERQ_TOKENIZER_DIR:-$PWD/artifacts/smollm2-tokenizer}"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/inferq-site .whl/*.whl
    export PYTHONPATH="/tmp/inferq-site" PATH="/tmp/inferq-site/bin:$PATH"
fi
