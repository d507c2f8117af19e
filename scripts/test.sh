#!/usr/bin/env bash
# The test command: installs what the tests need into the project environment
# (see scripts/install.sh), then runs the whole suite from it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
venv=${VIRTUAL_ENV:-$PWD/.venv}
export PATH="$venv/bin:$PATH"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
