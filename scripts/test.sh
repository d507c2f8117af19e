#!/usr/bin/env bash
# The test command: installs what the tests need into the project environment
# (see scripts/install.sh), then runs the whole suite from it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh test
venv=${VIRTUAL_ENV:-$PWD/.venv}
export PATH="$venv/bin:$PATH"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} TOKENIZERS_PARALLELISM=false
# Two pytest workers (INFERQ_TEST_WORKERS; 0 = none), a test file per worker at a time
# (module fixtures are shared within a file): on 2 cores the suite takes ~16 minutes
# instead of ~25, as most tests wait on subprocesses, Redis and HTTP. The slowest
# tests are listed at the end.
workers=${INFERQ_TEST_WORKERS:-2}
par=()
[ "$workers" != 0 ] && par=(-n "$workers" --dist loadfile)
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "${par[@]}" --durations=15 "$@"
