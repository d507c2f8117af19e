"""llama.cpp's tools as a benchmark peer: find or build ``llama-server``,
``llama-quantize`` and ``llama-perplexity``, and make GGUF copies of the bundled
model in other quantization types with them.

The build takes llama.cpp's tree from the ``llama-cpp-python`` sdist (it vendors
llama.cpp whole, and a package registry is the only network this project may use),
configures it with CMake for this CPU (``GGML_NATIVE``, no curl, no OpenSSL, no web
UI download) and builds only the three tools, into
``$INFERQ_CACHE_DIR/llama.cpp/<version>`` (default ``~/.cache/inferq``), reused when
present. llama.cpp is never a dependency of inferq: only the benchmarks call it.

    python -m inferq.bench.llama_cpp_build [--llama-cpp-dir DIR] [--jobs N]

prints the folder holding the three binaries (building them if needed).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Optional

LLAMA_CPP_PYTHON = "0.3.36"
TOOLS = ("llama-server", "llama-quantize", "llama-perplexity")
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
               "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF")
# A CPU whose AMX tiles fault under its hypervisor (seen: a KVM Xeon, where llama.cpp's AMX
# backend dies with SIGILL at its first tilezero) needs a build without them: its
# AVX512-VNNI / BF16 paths stay. GCC lets an explicit -mno-* win over -march=native.
NO_AMX_FLAGS = ("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
                "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
# The quantization types the benchmarks compare (llama-quantize's names).
QUANT_TYPES = ("Q8_0", "F16", "Q5_K_M", "Q4_K_M", "Q4_0")


def cache_dir(version: str = LLAMA_CPP_PYTHON) -> Path:
    root = Path(os.environ.get("INFERQ_CACHE_DIR") or Path.home() / ".cache" / "inferq")
    return root / "llama.cpp" / version


def _has_tools(folder: Path, needed: tuple[str, ...]) -> bool:
    return all((folder / t).is_file() and os.access(folder / t, os.X_OK) for t in needed)


def find_tools(llama_cpp_dir: Optional[str] = None, needed: tuple[str, ...] = TOOLS) -> Optional[Path]:
    """The folder holding the ``needed`` tools: ``llama_cpp_dir`` (itself, its bin/ or
    build/bin/), else the PATH, else the cached build; None when none has them."""
    if llama_cpp_dir:
        base = Path(llama_cpp_dir).expanduser()
        for folder in (base, base / "bin", base / "build" / "bin"):
            if _has_tools(folder, needed):
                return folder
        raise FileNotFoundError(f"{base} holds no {', '.join(needed)} (looked in it, bin/ and build/bin/)")
    found = [shutil.which(t) for t in needed]
    if all(found) and len({Path(f).parent for f in found}) == 1:
        return Path(found[0]).parent
    built = cache_dir() / "build" / "bin"
    return built if _has_tools(built, needed) else None


def _run(cmd: list[str], log: Path, cwd: Optional[Path] = None) -> None:
    with open(log, "ab") as f:
        f.write(("$ " + " ".join(cmd) + "\n").encode())
        f.flush()
        done = subprocess.run(cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"`{' '.join(cmd[:3])} ...` failed ({done.returncode}); {log} ends:\n{tail}")


def source_tree(version: str = LLAMA_CPP_PYTHON) -> Path:
    """llama.cpp's tree from the llama-cpp-python sdist, downloaded and unpacked once."""
    src = cache_dir(version) / "src"
    tree = src / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if (tree / "CMakeLists.txt").is_file():
        return tree
    src.mkdir(parents=True, exist_ok=True)
    sdist = src / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.is_file():
        _run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
              f"llama-cpp-python=={version}", "-d", str(src)], src / "download.log")
    with tarfile.open(sdist) as tar:
        tar.extractall(src, filter="data")
    if not (tree / "CMakeLists.txt").is_file():
        raise RuntimeError(f"{sdist} has no vendor/llama.cpp tree")
    return tree


def build(version: str = LLAMA_CPP_PYTHON, jobs: Optional[int] = None, no_amx: bool = False) -> Path:
    """Configure and build the three tools (minutes); returns their folder (``build/bin``,
    ``build-no-amx/bin`` without AMX)."""
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"building llama.cpp needs {tool} on PATH (apt-get install cmake ninja-build)")
    tree = source_tree(version)
    build_dir = cache_dir(version) / ("build-no-amx" if no_amx else "build")
    log = cache_dir(version) / f"{build_dir.name}.log"
    print(f"building {', '.join(TOOLS)} from {tree} into {build_dir} (log {log}) ...", file=sys.stderr, flush=True)
    _run(["cmake", "-S", str(tree), "-B", str(build_dir), "-G", "Ninja", *CMAKE_FLAGS,
          *(NO_AMX_FLAGS if no_amx else ())], log)
    _run(["ninja", "-C", str(build_dir), f"-j{jobs or os.cpu_count() or 1}", *TOOLS], log)
    return build_dir / "bin"


def tools(llama_cpp_dir: Optional[str] = None, needed: tuple[str, ...] = TOOLS, allow_build: bool = True) -> Path:
    """find_tools, building all three into the cache when the needed ones are not found."""
    found = find_tools(llama_cpp_dir, needed)
    if found is not None:
        return found
    if not allow_build:
        raise FileNotFoundError(f"no {', '.join(TOOLS)} on PATH or in {cache_dir() / 'build' / 'bin'}; "
                                "run `python -m inferq.bench.llama_cpp_build` or pass --llama-cpp-dir")
    return build()


def quantized_copy(bin_dir: Path, source: Path, qtype: str) -> Path:
    """``source`` requantized to ``qtype`` by llama-quantize, cached beside the build
    (keyed by the source's name and size). The bundled file is Q4_1, so every copy
    starts from its dequantized weights: F16/F32 copies hold them (almost) exactly,
    the others add a second rounding."""
    if qtype.upper() not in {*QUANT_TYPES, "F32", "Q4_1", "Q5_0", "Q5_1", "Q6_K", "Q3_K_M", "Q2_K", "BF16"}:
        raise ValueError(f"unknown quantization type {qtype!r}")
    out_dir = cache_dir() / "gguf"
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{source.stem.rsplit('.', 1)[0]}-{source.stat().st_size}.{qtype.upper()}.gguf"
    if out.is_file():
        return out
    tmp = out.with_suffix(".tmp")
    _run([str(bin_dir / "llama-quantize"), "--allow-requantize", str(source), str(tmp), qtype.upper()],
         out_dir / "quantize.log")
    os.replace(tmp, out)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m inferq.bench.llama_cpp_build", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp-dir", default=None, help="use the tools in this folder instead")
    ap.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all cores)")
    ap.add_argument("--no-amx", action="store_true",
                    help="build without AMX into build-no-amx/ (for a CPU whose AMX tiles fault: "
                         "llama-server dies with SIGILL); pass that folder's bin/ as --llama-cpp-dir")
    args = ap.parse_args(argv)
    if args.no_amx:
        built = cache_dir() / "build-no-amx" / "bin"
        print(built if _has_tools(built, TOOLS) else build(jobs=args.jobs, no_amx=True))
        return 0
    found = find_tools(args.llama_cpp_dir)
    print(found if found is not None else build(jobs=args.jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
