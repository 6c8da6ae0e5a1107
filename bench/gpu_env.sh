# Sourced (from the repo root) by the device-call scripts that run the engine: Hugging Face offline,
# the carried SmolLM2 tokenizer, and the carried wheelhouse (.whl, bench/gpu_carry.sh) installed into
# /tmp/inferq-site, which goes on PYTHONPATH (its bin on PATH: py-spy). gpu_info FILE records the GPU
# and the versions a result was measured with.
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export INFERQ_TOKENIZER_DIR="${INFERQ_TOKENIZER_DIR:-$PWD/artifacts/smollm2-tokenizer}"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/inferq-site .whl/*.whl
    export PYTHONPATH="/tmp/inferq-site" PATH="/tmp/inferq-site/bin:$PATH"
fi
gpu_info() {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee "$1"
    python3 -c 'import torch, triton, transformers; print("torch", torch.__version__, "triton", triton.__version__,
"transformers", transformers.__version__)' | tee -a "$1"
}
