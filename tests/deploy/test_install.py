"""The README's first command, install part, on a stock system Python.

Debian 12's /usr/bin/python3 is "externally managed" (PEP 668): a bare `pip
install` there fails with externally-managed-environment. scripts/install.sh
must install into a project virtual environment instead, from a fresh clone,
and the CLI must then run from that environment."""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SYSTEM_PYTHON = Path("/usr/bin/python3")
# PATH without pyenv/virtualenv shims, so `python3` is the distribution's own.
STOCK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@pytest.mark.slow
@pytest.mark.skipif(not SYSTEM_PYTHON.exists(), reason="this machine has no distribution Python at /usr/bin/python3")
def test_install_on_the_system_python_uses_a_project_venv(tmp_path):
    clone = tmp_path / "inferq"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHON", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = STOCK_PATH
    assert subprocess.run(["bash", "-c", "command -v python3"], env=env, capture_output=True,
                          text=True).stdout.strip() in ("/usr/bin/python3", "/bin/python3")

    r = subprocess.run(["bash", "scripts/install.sh"], cwd=clone, env=env, capture_output=True, text=True,
                       timeout=1200, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "externally-managed-environment" not in r.stderr
    venv = clone / ".venv"
    assert f"inferq installed in {venv}" in r.stdout  # one line: where, and how to run the CLI
    # The environment is built on the system interpreter, not a copy of the test's.
    cfg = (venv / "pyvenv.cfg").read_text()
    assert "home = /usr/bin" in cfg or "home = /bin" in cfg, cfg

    cli = subprocess.run([str(venv / "bin" / "inferq"), "--help"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert "up" in cli.stdout and "worker" in cli.stdout
    # The worker side and the bundled model are in that environment too.
    probe = subprocess.run([str(venv / "bin" / "python"), "-c",
                            "import torch, inferq.gpuworker.engine.llm_engine\n"
                            "from inferq.gpuworker.models.loader import bundled_model_path; print(bundled_model_path())"],
                           env=env, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr


def test_install_says_which_package_is_missing_when_venv_is(tmp_path):
    """A Python without the venv module (Debian without python3-venv) gets a
    plain-words hint, not a traceback. Simulated with an interpreter shim whose
    `-m venv` fails the way Debian's does."""
    clone = tmp_path / "inferq"
    clone.mkdir()
    (clone / "scripts").mkdir()
    (clone / "scripts" / "install.sh").write_text((ROOT / "scripts" / "install.sh").read_text())
    shim = tmp_path / "python3"
    shim.write_text("#!/bin/sh\n"
                    "if [ \"$1\" = -m ] && [ \"$2\" = venv ]; then\n"
                    "  echo 'The virtual environment was not created successfully because ensurepip is not\n"
                    "available.  On Debian/Ubuntu systems, you need to install the python3-venv package' >&2\n"
                    "  exit 1\nfi\nexec /usr/bin/env python3 \"$@\"\n")
    shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)}
    env["PYTHON"] = str(shim)
    r = subprocess.run(["bash", "scripts/install.sh"], cwd=clone, env=env, capture_output=True, text=True,
                       timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode != 0
    assert "apt-get install python3-venv" in r.stderr
    assert not (clone / ".venv").exists()  # no half-made environment left behind
