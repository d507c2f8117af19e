"""A second `inferq up` on the same data folder refuses to start (two Redis
servers on one AOF would corrupt it) and leaves nothing running."""
import fcntl
import subprocess
import sys
from pathlib import Path

from tests.cli.procs import env_without

ROOT = Path(__file__).resolve().parents[2]


def test_second_up_on_the_same_folder_refuses(tmp_path):
    data = tmp_path / ".inferq"
    data.mkdir()
    with open(data / "up.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running `inferq up` holds it
        r = subprocess.run([sys.executable, "-m", "inferq.cli", "up"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60, env=env_without("INFERQ_REDIS_URL", PYTHONPATH=str(ROOT)))
    assert r.returncode == 1
    assert "another `inferq up` is using" in r.stdout
    assert not (data / "redis").exists()  # no server was started
