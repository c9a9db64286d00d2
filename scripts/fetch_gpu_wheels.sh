#!/usr/bin/env bash
# Wheels the GPU image lacks (it has torch, triton, transformers, numpy, safetensors; no network).
# Fetched here into .whl/ (git-ignored) and carried to the device with `carry: [".whl"]`; there:
#   python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(
  gguf==0.19.0 pyyaml==6.0.3 typing-extensions annotated-doc opentelemetry-api
  pytest==8.4.2 pluggy==1.6.0 iniconfig==2.3.0 pytest-timeout==2.4.0
  fastapi==0.165.0 starlette uvicorn==0.54.0 pydantic==2.14.3 pydantic-core==2.50.4
  annotated-types typing-inspection h11 anyio sniffio click prometheus-client
  httpx httpcore certifi idna openai distro jiter
)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any -d .whl "${PACKAGES[@]}"
ls .whl
