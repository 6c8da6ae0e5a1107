#!/usr/bin/env bash
# Builds the ignored folders a GPU `device` call carries (run here, on the dev machine, from the repo root):
#   .whl/       py3.12 x86-64 wheels of what the GPU machine's Python lacks (service + tests), at the
#               versions of this venv, installed there with
#               python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#                   --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
#   .redisbin/  this machine's redis-server and the shared libraries it links (lib/)
#   artifacts/smollm2-tokenizer/  the packaged SmolLM2 tokenizer (python -m bench.engine_assets)
set -euo pipefail
PY="${PY:-.venv/bin/python}"
PACKAGES=(redis hiredis fastapi starlette uvicorn sse-starlette pydantic pydantic-core pydantic-settings
          python-dotenv annotated-types annotated-doc typing-inspection typing-extensions httpx httpcore anyio
          sniffio idna certifi h11 click prometheus-client jinja2 markupsafe opentelemetry-api uvloop httptools
          celery kombu billiard vine amqp click-didyoumean click-repl click-plugins prompt-toolkit wcwidth
          python-dateutil six tzlocal packaging python-multipart xgrammar apache-tvm-ffi
          jsonschema jsonschema-specifications referencing rpds-py attrs gguf)
rm -rf .whl && mkdir -p .whl
for name in "${PACKAGES[@]}"; do
    version=$("$PY" -m pip show "$name" 2>/dev/null | awk '/^Version:/{print $2}')
    [ -n "$version" ] || { echo "skip $name (not in the venv)"; continue; }
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 --platform any -d .whl "$name==$version"
done
# py-spy (~6 MB of the 64 MiB carried): bench/service_overhead.py samples the worker with it when BENCH_PYSPY=1
if [ "${BENCH_PYSPY:-0}" = 1 ]; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_5_x86_64 \
        --platform manylinux1_x86_64 -d .whl py-spy==0.4.3
fi
rm -rf .redisbin && mkdir -p .redisbin/lib
cp "$(command -v redis-server)" .redisbin/
ldd .redisbin/redis-server | awk '/=> \//{print $3}' | grep -v -E 'libc\.so|libm\.so|ld-linux|libpthread|libdl' \
    | xargs -r -I{} cp {} .redisbin/lib/
"$PY" -m bench.engine_assets
du -sh .whl .redisbin artifacts
