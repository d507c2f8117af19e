#!/usr/bin/env bash
# GPU check of the Triton path, in two halves (docs/gpu-check.md).
#
#   bash scripts/gpu_check.sh prepare          # here, with PyPI access and the bundled model: fills
#                                              # .gpu_carry/ (git-ignored via .git/info/exclude) with the
#                                              # cp312 wheels the GPU image lacks and the SmolLM2 tokenizer
#   bash scripts/gpu_check.sh --out "$OUT"     # on the GPU machine (carry [".gpu_carry"]): installs the
#                                              # carried wheels into /tmp/site, then runs
#                                              # scripts/gpu_check.py with the same arguments
#   bash scripts/gpu_check.sh --dry-run --out DIR   # any CPU machine: the stages that need no GPU
#
# The GPU image (Python 3.12, torch, triton, transformers, safetensors, pytest) has no pydantic,
# which inferq.schemas needs, nor llguidance, which the engine imports; without the carried
# wheels the engine section is skipped and the kernel tests that import them are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.gpu_carry
PY=${PYTHON:-python3}

if [[ "${1:-}" == "prepare" ]]; then
    mkdir -p "$CARRY/whl" "$CARRY/tokenizer"
    # ignored, so it travels only when named in the device tool's carry list
    exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || true)
    if [[ -n "$exclude" ]]; then
        mkdir -p "$(dirname "$exclude")"
        grep -qxF "/$CARRY/" "$exclude" 2>/dev/null || echo "/$CARRY/" >> "$exclude"
    fi
    rm -f "$CARRY"/whl/*.whl
    # the versions installed here, so what the GPU machine imports is what the tests here import
    versions=$($PY scripts/gpu_check.py --carry-wheels)
    # shellcheck disable=SC2086
    $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_35_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
        -d "$CARRY/whl" $versions
    if ! $PY - "$CARRY/tokenizer" <<'PY'
import shutil, sys
from pathlib import Path
from tests.tiny_models import TOKENIZER_FILES, tokenizer_source
src, dst = tokenizer_source(), Path(sys.argv[1])
for name in TOKENIZER_FILES:
    if (src / name).is_file():
        shutil.copy(src / name, dst / name)
PY
    then
        echo "gpu_check.sh: no SmolLM2 tokenizer copied (bundled model missing?): the engine section will be skipped" >&2
    fi
    du -sh "$CARRY"
    ls "$CARRY"/whl "$CARRY"/tokenizer
    exit 0
fi

# The carried wheels are cp312 builds for the GPU image; a dry run emulates them instead.
if [[ " $* " != *" --dry-run "* ]] && compgen -G "$CARRY/whl/*.whl" > /dev/null; then
    if $PY -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
        $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$CARRY"/whl/*.whl
        export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
    else
        echo "gpu_check.sh: $CARRY/whl holds cp312 wheels and $PY is not Python 3.12: not installing them" >&2
    fi
fi
export PYTHONUNBUFFERED=1
# By path, not `-m scripts.gpu_check`: scripts/ is a namespace package, which any installed
# regular package named `scripts` would shadow. The script puts the repository root on sys.path.
exec $PY scripts/gpu_check.py "$@"
