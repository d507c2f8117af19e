"""The sdist and the wheel carry the one package ``inferq`` and every file the
product reads at run time (Lua scripts, C sources and headers, the dashboard)."""
import re
import tomllib
from pathlib import Path

from tests.packaging.conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]


def folder_of(package: str) -> Path:
    """A package's folder in the checkout, through pyproject's package-dir."""
    dirs = SETUPTOOLS["package-dir"]
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        head = ".".join(parts[:n])
        if head in dirs:
            return ROOT / dirs[head] / Path(*parts[n:])
    raise AssertionError(f"{package} has no package-dir")


def package_folders() -> dict[str, Path]:
    """Every folder with an __init__.py under the mapped roots, by its import name."""
    found = {}
    for name, folder in SETUPTOOLS["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            if "__pycache__" in init.parts:
                continue
            rel = init.parent.relative_to(ROOT / folder)
            found[".".join([name, *rel.parts])] = init.parent
    return found


def run_time_files() -> set[str]:
    """Every non-Python file inside a package folder, as its path in the wheel."""
    out = set()
    for name, folder in package_folders().items():
        for f in folder.iterdir():
            if f.is_file() and f.suffix not in (".py", ".pyc"):
                out.add("/".join(name.split(".")) + "/" + f.name)
        for sub in folder.iterdir():  # data folders without __init__.py (dashboard/static)
            if sub.is_dir() and sub.name != "__pycache__" and not (sub / "__init__.py").exists():
                out.update("/".join(name.split(".")) + "/" + str(f.relative_to(folder))
                           for f in sub.rglob("*") if f.is_file())
    return out


def test_pyproject_lists_every_package_folder():
    assert sorted(SETUPTOOLS["packages"]) == sorted(package_folders())
    assert all(p == "inferq" or p.startswith("inferq.") for p in SETUPTOOLS["packages"])


def test_the_files_the_code_opens_are_package_files():
    """What the code opens at run time is among the non-Python package files the
    wheel test below checks (so the list cannot silently miss a kind of file)."""
    files = run_time_files()
    assert "inferq/producer/admission.lua" in files
    assert {"inferq/producer/gateway/dashboard/static/" + n
            for n in ("index.html", "login.html", "dashboard.js", "dashboard.css")} <= files
    assert {f for f in files if f.startswith("inferq/schemas/lua/")} >= {"inferq/schemas/lua/finish.lua"}
    c_sources = {f for f in files if re.match(r"inferq/kernels/cpu/\w+\.[ch]$", f)}
    assert "inferq/kernels/cpu/paged_decode.c" in c_sources and "inferq/kernels/cpu/vec_math.h" in c_sources


def test_wheel_holds_one_top_level_package_and_every_run_time_file(dists):
    files = dists.wheel_files()
    assert {f.split("/")[0] for f in files} == {"inferq"}
    missing = run_time_files() - files
    assert not missing, f"the wheel lacks files the product reads: {sorted(missing)}"
    for name, folder in package_folders().items():
        want = {"/".join(name.split(".")) + "/" + p.name for p in folder.glob("*.py")}
        assert want <= files, sorted(want - files)


def test_sdist_holds_every_source_and_run_time_file(dists):
    files = dists.sdist_files()
    tracked = {str(p.relative_to(ROOT)) for folder in package_folders().values()
               for p in folder.iterdir() if p.is_file() and p.suffix != ".pyc"}
    assert tracked - files == set(), sorted(tracked - files)
    static = {str(p.relative_to(ROOT)) for p in (ROOT / "producer/gateway/dashboard/static").iterdir()}
    assert static <= files
    assert {"pyproject.toml", "README.md"} <= files


def test_wheel_declares_the_console_script(dists):
    import zipfile
    with zipfile.ZipFile(dists.wheel) as z:
        eps = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        text = z.read(eps).decode()
    assert re.search(r"^inferq = inferq\.cli:main$", text, re.M), text
