#!/usr/bin/env bash
# GPU check of the Triton path, in two halves.
#
#   bash scripts/gpu_check.sh prepare   # here, on a machine with PyPI access and the bundled model:
#                                       # fills .gpu_carry/ (git-ignored via .git/info/exclude) with
#                                       # cp312 wheels the GPU image lacks and the SmolLM2 tokenizer files
#   bash scripts/gpu_check.sh [ARGS]    # on the GPU machine (carry .gpu_carry): installs the carried
#                                       # wheels into /tmp/site, then runs scripts/gpu_check.py ARGS
#                                       # (as `python -m scripts.gpu_check`: it uses tests/ helpers)
#
# The GPU image (Python 3.12, torch, triton, transformers, safetensors, pytest) has no
# pydantic, which `schemas` needs; without the wheels the engine section is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.gpu_carry
PY=${PYTHON:-python3}

if [[ "${1:-}" == "prepare" ]]; then
    mkdir -p "$CARRY/whl" "$CARRY/tokenizer"
    grep -qxF "/$CARRY/" .git/info/exclude 2>/dev/null || echo "/$CARRY/" >> .git/info/exclude
    rm -f "$CARRY"/whl/*.whl
    versions=$($PY - <<'PY'
from importlib.metadata import version
print(" ".join(f"{n}=={version(n)}" for n in ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "typing-extensions")))
PY
)
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$CARRY/whl" $versions
    $PY - "$CARRY/tokenizer" <<'PY'
import shutil, sys
from pathlib import Path
from tests.tiny_models import TOKENIZER_FILES, tokenizer_source
src, dst = tokenizer_source(), Path(sys.argv[1])
for name in TOKENIZER_FILES:
    if (src / name).is_file():
        shutil.copy(src / name, dst / name)
PY
    du -sh "$CARRY"
    ls "$CARRY"/whl "$CARRY"/tokenizer
    exit 0
fi

if compgen -G "$CARRY/whl/*.whl" > /dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$CARRY"/whl/*.whl
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
exec $PY -m scripts.gpu_check "$@"
