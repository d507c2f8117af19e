"""The two images install a complete inferq, checked without a Docker daemon.

Each Dockerfile's context COPY lines and its .dockerignore are replayed into a folder
(tests/deploy/dockerfile_replay.py); that folder must hold every package and package-data
file pyproject.toml lists, build a wheel, and the wheel, installed on its own, must run the
image's command. The replayed install is imported with ``python -S`` and a PYTHONPATH of the
install then the venv's site-packages: the repository's editable finder (a .pth file that
only `site` reads) stays out, so only what the image would hold is seen."""
from __future__ import annotations

import fnmatch
import os
import re
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.deploy.dockerfile_replay import command, instructions, replay

ROOT = Path(__file__).resolve().parents[2]
IMAGES = {"slim": ROOT / "docker" / "Dockerfile.slim", "worker": ROOT / "docker" / "Dockerfile.worker"}
WHEEL_FILES = ["inferq/cli.py", "inferq/producer/gateway/dashboard/static/index.html",
               "inferq/kernels/cpu/*.c", "inferq/schemas/lua/*.lua", "inferq/producer/admission.lua"]


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def package_folder(package: str, package_dir: dict[str, str]) -> str:
    """The source folder of a package under setuptools' package-dir mapping."""
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in package_dir:
            return "/".join([package_dir[".".join(parts[:n])], *parts[n:]])
    return "/".join(parts)


def build_and_install(name: str, tmp: Path) -> tuple[str, Path, Path, Path]:
    """(name, replayed build folder, the wheel built from it, the folder it is installed into)."""
    folder = replay(IMAGES[name], ROOT, tmp / "context")
    wheels, target = tmp / "wheels", tmp / "site"
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INDEX="1")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                        "-w", str(wheels), str(folder)], capture_output=True, text=True, timeout=300, cwd=tmp, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    (wheel,) = wheels.glob("inferq-*.whl")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                       capture_output=True, text=True, timeout=300, cwd=tmp, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return name, folder, wheel, target


@pytest.fixture(scope="module")
def installs(tmp_path_factory):
    """installs(name): that image's replayed build and install, made once per module."""
    done: dict[str, tuple] = {}

    def get(name: str) -> tuple[str, Path, Path, Path]:
        if name not in done:
            done[name] = build_and_install(name, tmp_path_factory.mktemp(f"image-{name}"))
        return done[name]

    return get


@pytest.fixture(params=sorted(IMAGES))
def image(request, installs):
    return installs(request.param)


def run_installed(target: Path, cwd: Path, *args: str, code: str) -> subprocess.CompletedProcess:
    """``python -S -c code args`` seeing only the replayed install and the venv's dependencies."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = os.pathsep.join([str(target), sysconfig.get_paths()["purelib"]])
    return subprocess.run([sys.executable, "-S", "-c", code, *args], capture_output=True, text=True, timeout=300,
                          cwd=cwd, env=env)


def test_the_build_context_holds_every_package_and_package_data_file(image):
    _, folder, _, _ = image
    tools = pyproject()["tool"]["setuptools"]
    for package in tools["packages"]:
        source = package_folder(package, tools.get("package-dir", {}))
        assert (folder / source / "__init__.py").is_file(), f"{package} ({source}/) is not in the build context"
    for package, patterns in tools.get("package-data", {}).items():
        source = package_folder(package, tools.get("package-dir", {}))
        for pattern in patterns:
            in_repo = sorted(p.relative_to(ROOT) for p in (ROOT / source).glob(pattern))
            assert in_repo, f"package-data {package}: {pattern} matches nothing in the repository"
            for path in in_repo:
                assert (folder / path).is_file(), f"{path} (package-data of {package}) is not in the build context"


def test_the_wheel_holds_the_package_and_its_data(image):
    _, _, wheel, _ = image
    names = zipfile.ZipFile(wheel).namelist()
    for pattern in WHEEL_FILES:
        assert [n for n in names if fnmatch.fnmatch(n, pattern)], f"{pattern} is not in the wheel"
    # Nothing of the repository's tests or tooling rides along.
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "docs/"))]


def test_the_installed_cli_runs_from_the_wheel_alone(image, tmp_path):
    _, _, _, target = image
    r = run_installed(target, tmp_path, "--help", code="from inferq.cli import main; main()")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "worker" in r.stdout and "gateway" in r.stdout
    r = run_installed(target, tmp_path, code="import inferq; print(inferq.__file__)")
    assert r.stdout.strip().startswith(str(target)), r.stdout + r.stderr  # not the repository's copy


def test_the_image_command_is_a_cli_command(image, tmp_path):
    """CMD parses with the installed CLI: the subcommand exists and takes its flags."""
    name, _, _, target = image
    cmd = command(IMAGES[name].read_text())
    assert cmd[0] == "inferq", cmd  # the console script pyproject.toml installs
    assert pyproject()["project"]["scripts"]["inferq"] == "inferq.cli:main"
    code = ("import sys\nargv = sys.argv[1:]\n"
            "if argv[0] == 'worker':\n"
            "    from inferq.gpuworker.service.cli import parser\n    parser().parse_args(argv[1:])\n"
            "else:\n"
            "    from inferq.cli import build_parser\n    build_parser().parse_args(argv)\n")
    r = run_installed(target, tmp_path, *cmd[1:], code=code)
    assert r.returncode == 0, r.stderr[-3000:]
    r = run_installed(target, tmp_path, cmd[1], "--help", code="from inferq.cli import main; main()")
    assert r.returncode == 0, r.stderr[-3000:]


def test_the_worker_image_imports_the_worker_and_finds_its_kernel_sources(installs, tmp_path):
    _, _, _, target = installs("worker")
    code = ("import inferq.gpuworker.service, inferq.gpuworker.service.worker\n"
            "from inferq.kernels.cpu import loader\n"
            "assert loader.source('paged_decode')\n"  # the .c file and the headers it includes
            "print(loader.SOURCE_DIR)")
    r = run_installed(target, tmp_path, code=code)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().startswith(str(target))


def test_the_slim_image_imports_what_compose_runs_on_it(installs, tmp_path):
    """Gateway and Celery (compose's `celery -A <app>`) from the slim install."""
    _, _, _, target = installs("slim")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    apps = {s["command"][s["command"].index("-A") + 1] for s in compose["services"].values()
            if s.get("build", {}).get("dockerfile") == "docker/Dockerfile.slim" and "-A" in s.get("command", [])}
    assert apps == {"inferq.producer.celery_app"}
    r = run_installed(target, tmp_path, code="import inferq.producer.gateway.app, " + ", ".join(apps))
    assert r.returncode == 0, r.stderr[-3000:]


def test_the_worker_image_has_what_triton_and_the_cpu_kernels_build_with():
    text = IMAGES["worker"].read_text()
    installs = " ".join(args for word, args in instructions(text) if word == "RUN" and "apt-get install" in args)
    python = re.search(r"\bpython(3\.\d+)-venv\b", installs).group(1)  # the interpreter the venv is made from
    assert re.search(rf"\bpython{re.escape(python)}-dev\b", installs), f"python{python}-dev (Python.h) is not installed"
    assert re.search(r"\b(gcc|build-essential|clang)\b", installs), "no C compiler is installed"
    assert re.search(rf"\bpython{re.escape(python)} -m venv\b", text)
