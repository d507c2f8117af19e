"""The distributions as users get them: an sdist built from the checkout, and the
wheel built from that sdist (what `python -m build` does), once per session."""
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


class Dists:
    def __init__(self, folder: Path):
        self.sdist = next(folder.glob("inferq-*.tar.gz"))
        self.wheel = next(folder.glob("inferq-*.whl"))

    def wheel_files(self) -> set[str]:
        with zipfile.ZipFile(self.wheel) as z:
            return {n for n in z.namelist() if ".dist-info/" not in n}

    def sdist_files(self) -> set[str]:
        with tarfile.open(self.sdist) as t:
            return {m.name.split("/", 1)[1] for m in t.getmembers() if m.isfile() and "/" in m.name}


@pytest.fixture(scope="session")
def dists(tmp_path_factory) -> Dists:
    out = tmp_path_factory.mktemp("dist")
    # --no-isolation: the build backend (setuptools) from the test environment, no download.
    r = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return Dists(out)
