#!/usr/bin/env python3
"""One-command GPU check of inferq's Triton path (an NVIDIA H100 or H200; no network; 300 s).

    bash scripts/gpu_check.sh prepare                  # here: carried wheels + tokenizer into .gpu_carry/
    bash scripts/gpu_check.sh --out "$OUT"             # on the GPU machine (carry .gpu_carry)
    python3 -m scripts.gpu_check --dry-run --out DIR   # on any CPU: every stage that needs no GPU
    python3 -m scripts.gpu_check --cpu-smoke --out DIR # on any CPU: the GPU stages too, interpreted, tiny shapes

docs/gpu-check.md is the manual. Stages, in order (each is one entry of gpu_check.json):

 compiler        Triton builds its CUDA launcher with $CC, else gcc, else clang, against the running
                 interpreter's Python.h: both must be there, and a probe compile must pass.
 device          the GPU's name, SMs, memory, and its memory bandwidth from BANDWIDTH_BY_NAME
                 (H100 3.35 TB/s, H200 4.8 TB/s; unknown names get no floor ratio).
 import-root     inferq.* importable the way the tests' subprocesses import it (PYTHONPATH=repo): on
                 the GPU machine the checkout is not installed, so a .pth in site-packages maps the
                 import root onto it, as an editable install would (dry run: only says so).
 carried         the wheels carried in .gpu_carry/whl (pydantic, llguidance, ...) are importable.
 budget          the time plan: each section's share of --budget-s, and whether a rerun fits in the
                 device time (DEVICE_TIME_S) after the first call.
 imports         every section's imports. Dry run: in child processes with the packages the GPU
                 image lacks made unimportable (image_lacks), with and without the carried ones.
 pytest-collect  collect-only of exactly the GPU selection (gpu_test_args); test files that cannot be
                 collected only because a package is missing (pydantic) are left out, named.
                 Dry run: with the image's packages only, then again without the files left out.
 kernels         Triton vs the torch reference on the GPU: fp16/bf16/fp32, GQA 1-8, head sizes
                 64/128, block sizes 16-128, prefill chunks, split-K; NaN-poisoned outputs.
 decode          one layer's decode attention, SmolLM2-135M shapes, batches 1/64/256 at 1k context:
                 time, bytes moved, GB/s against the device's bandwidth; whole-step floors computed
                 from the bytes a decode step moves (weights + KV).
 engine          inferq.bench.offline on a SmolLM2-135M-shaped bf16 model (random weights) against
                 HF generate; needs the carried wheels.
 invariance      the cost of batch-invariant mode (EngineConfig.batch_invariant, default on): the
                 same offline workload with it on and off, output tokens/s of each and the ratio,
                 and whether requests run alone give the tokens they got in the batch (on: must).
 pytest          the kernel tests compiled on the GPU (TRITON_INTERPRET=0), junit XML under --out.
 output          gpu_check.json (rewritten after every row), gpu_check.log, the children's logs.

Everything is written under --out (default $OUT), never into the repository (the GPU run's only
other writes: the import-root .pth where needed, Triton's cache, temporary folders). Exit status 0:
no stage FAILED, ERRORED or TIMED OUT; 1: some did; 2: bad arguments.
"""
from __future__ import annotations

import argparse
import faulthandler
import importlib
import importlib.util
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CARRY_DIR = REPO / ".gpu_carry"

# ----------------------------------------------------------------------------- facts and arithmetic
# Peak memory bandwidth, bytes/s, vendor datasheets; keyed by a substring of
# torch.cuda.get_device_properties().name ("NVIDIA H100 80GB HBM3", "NVIDIA H200").
# The most specific key first: "H100 PCIe" and "H100 NVL" also contain "H100".
BANDWIDTH_BY_NAME: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 2.0e12),
    ("H100 NVL", 3.9e12),
    ("H200", 4.8e12),
    ("H100", 3.35e12),  # H100 SXM5 80GB HBM3
)


def bandwidth_for(device_name: str | None) -> tuple[str | None, float | None]:
    """(table key, bytes/s) for a device name, or (None, None) if the table has no entry for it."""
    for key, bandwidth in BANDWIDTH_BY_NAME:
        if device_name and key.lower() in device_name.lower():
            return key, bandwidth
    return None, None


SMOLLM2_CONFIG = dict(  # SmolLM2-135M-Instruct, as the engine converts the bundled GGUF
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=49152, hidden_size=576,
    intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
    rms_norm_eps=1e-5, max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True,
    bos_token_id=1, eos_token_id=2, hidden_act="silu",
)
SMOL = dict(num_heads=9, num_kv_heads=3, head_dim=64, layers=30)
DECODE_CONTEXT = 1024
DECODE_BATCHES = (1, 64, 256)


def smollm2_parameters(cfg: dict = SMOLLM2_CONFIG) -> int:
    """Parameters of a Llama-architecture model with this config (tied embeddings counted once)."""
    h, i, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    d = cfg["head_dim"]
    q_o = 2 * h * cfg["num_attention_heads"] * d
    k_v = 2 * h * cfg["num_key_value_heads"] * d
    per_layer = q_o + k_v + 3 * h * i + 2 * h  # attention, gated MLP, two RMSNorms
    embed = cfg["vocab_size"] * h * (1 if cfg["tie_word_embeddings"] else 2)
    return layers * per_layer + embed + h  # + the final norm


def decode_step_bytes(num_seqs: int, context: int = DECODE_CONTEXT, dtype_bytes: int = 2,
                      cfg: dict = SMOLLM2_CONFIG) -> int:
    """Fewest bytes one whole decode step must read: every weight once, and K and V of every
    context token in every layer (bf16). Activations and logits are small next to these."""
    kv_per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * dtype_bytes
    return smollm2_parameters(cfg) * dtype_bytes + num_seqs * context * kv_per_token


def step_floors_us(bandwidth: float, batches=DECODE_BATCHES, context: int = DECODE_CONTEXT) -> dict[int, float]:
    """Whole decode-step floors (µs) at this bandwidth: bytes moved / bandwidth.
    At the H200's 4.8 TB/s: 61 / 371 / 1314 µs for batches 1 / 64 / 256 at 1k context."""
    return {b: decode_step_bytes(b, context) / bandwidth * 1e6 for b in batches}


# ----------------------------------------------------------------------------- time and device budget
# The device tool (docs/gpu-check.md): 15 minutes of device time per task, starts and idle included;
# a machine goes back 30 s after a call, so a rerun usually pays a fresh start.
DEVICE_TIME_S = 900
START_ALLOWANCE_S = 90  # a machine's start plus the transfers, per call
SETUP_ALLOWANCE_S = 20  # gpu_check.sh's wheel install and the interpreter start, before the budget clock
GRACE_S = 15  # the watchdog ends the run this long after the budget
DEFAULT_BUDGET_S = 320
PRE_SECTION_ESTIMATE_S = 30  # compiler .. pytest-collect on the GPU machine (torch import, editable install)
RESERVE_S = 10  # writing the table and the JSON at the end
SECTION_WEIGHTS = {"kernels": 0.8, "decode": 0.5, "engine": 1.7, "invariance": 1.4, "pytest": 1.5}
SECTION_MIN_S = {"kernels": 15, "decode": 10, "engine": 75, "invariance": 60, "pytest": 45}
GPU_SECTIONS = tuple(SECTION_WEIGHTS)
STAGES = ("compiler", "device", "import-root", "carried", "budget", "imports", "pytest-collect",
          *GPU_SECTIONS, "output")


def recommended_timeout_s(budget_s: float) -> int:
    """timeout_s for the device tool's run: the budget, the set-up before it and the watchdog's grace."""
    return int(math.ceil((budget_s + SETUP_ALLOWANCE_S + GRACE_S) / 10) * 10)


def section_shares(seconds: float, sections=GPU_SECTIONS) -> dict[str, float]:
    """Split `seconds` among sections by SECTION_WEIGHTS (time a section leaves unused rolls over
    to the ones after it: Budget.section_deadline recomputes from what is left)."""
    total = sum(SECTION_WEIGHTS[s] for s in sections)
    return {s: seconds * SECTION_WEIGHTS[s] / total for s in sections}


def plan_budget(budget_s: float, sections=GPU_SECTIONS) -> dict:
    timeout_s = recommended_timeout_s(budget_s)
    first_call_s = START_ALLOWANCE_S + timeout_s
    shares = section_shares(max(budget_s - PRE_SECTION_ESTIMATE_S - RESERVE_S, 0.0), sections)
    return {
        "budget_s": budget_s,
        "recommended_timeout_s": timeout_s,
        "device_time_s": DEVICE_TIME_S,
        "start_allowance_s": START_ALLOWANCE_S,
        "first_call_worst_s": first_call_s,
        "left_after_first_call_s": DEVICE_TIME_S - first_call_s,
        "fits_with_rerun": 2 * first_call_s <= DEVICE_TIME_S,
        "section_shares_s": {s: round(v, 1) for s, v in shares.items()},
        "sections_below_minimum": [s for s, v in shares.items() if v < SECTION_MIN_S[s]],
    }


class Budget:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def section_deadline(self, section: str, remaining: list[str]) -> float:
        """Monotonic time by which `section` should end: its weighted share of what is left."""
        usable = max(self.left() - RESERVE_S, 0.0)
        return time.monotonic() + section_shares(usable, remaining)[section]


# ----------------------------------------------------------------------------- what the GPU image has
# The distributions of the device image ('cuda'), as the device tool's KINDS.md lists them (read on
# that image 2026-11-17; python3 there is 3.12). The dry run hides the packages inferq needs that are
# not among them (image_lacks), so what it collects and imports is what the GPU machine can.
IMAGE_PACKAGES = frozenset("""
    absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
    botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
    coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
    diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
    frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
    hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
    jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
    linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
    meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
    narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
    nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
    nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
    nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
    onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
    packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
    propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
    pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
    python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
    scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
    sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels
    sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
    tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
    torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
    urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())
# What `gpu_check.sh prepare` downloads as cp312 wheels (distribution, import name): enough for the
# engine section (inferq.schemas needs pydantic; the engine's structured outputs need llguidance).
# The dry run checks that the engine's imports succeed with only these added to the image.
CARRY_WHEELS = (("pydantic", "pydantic"), ("pydantic-core", "pydantic_core"),
                ("annotated-types", "annotated_types"), ("typing-inspection", "typing_inspection"),
                ("typing-extensions", "typing_extensions"), ("llguidance", "llguidance"))
CARRY_MODULES = tuple(module for _, module in CARRY_WHEELS)
REPO_MODULES = ("inferq", "tests", "scripts")  # import names of this checkout, never a missing package


def normalize(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()


def load_pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def requirement_names(requirements) -> set[str]:
    """Distribution names of requirement strings, those that apply here without extras."""
    from packaging.requirements import Requirement

    names = set()
    for text in requirements or ():
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            names.add(normalize(req.name))
    return names


def image_lacks(carried=()) -> list[str]:
    """Import names to hide to make this environment look like the GPU image (plus `carried`):
    inferq's declared dependencies (every extra) that the image does not have, and what those need
    in turn, as far as it is installed here. Left visible: whatever the image's packages need in the
    versions installed here (the image meets its own versions' needs), and packages other tools load
    through entry points (pytest plugins, hypothesis hooks: hiding their modules but not their
    metadata would break those tools, where on the image they simply are not there)."""
    from importlib.metadata import PackageNotFoundError, entry_points, packages_distributions, requires

    project = load_pyproject()["project"]
    declared = requirement_names(project["dependencies"])
    for extra in project.get("optional-dependencies", {}).values():
        declared |= requirement_names(extra)
    present = IMAGE_PACKAGES | {normalize(d) for d in carried}
    lacking, todo, seen = set(), list(declared - {"inferq"}), set()
    while todo:
        dist = todo.pop()
        if dist in seen or dist in IMAGE_PACKAGES:
            continue
        seen.add(dist)
        if dist not in present:
            lacking.add(dist)
        try:
            todo.extend(requirement_names(requires(dist)))
        except PackageNotFoundError:  # not installed here, so nothing here can import it anyway
            pass
    # Never hidden: what the image's packages and the autoloaded ones need, in the versions
    # installed here (on the image, its own versions' needs are met), short of inferq's own
    # dependencies (it imports them; the image lacks them).
    autoloaded = {normalize(ep.dist.name) for group in ("pytest11", "hypothesis")
                  for ep in entry_points(group=group) if ep.dist is not None}
    needed, todo = set(), [*IMAGE_PACKAGES, *autoloaded]
    while todo:
        dist = todo.pop()
        if dist in needed or (dist in declared and dist not in IMAGE_PACKAGES | autoloaded):
            continue
        needed.add(dist)
        try:
            todo.extend(requirement_names(requires(dist)))
        except PackageNotFoundError:
            pass
    lacking -= needed
    return sorted(name for name, dists in packages_distributions().items()
                  if name not in REPO_MODULES and any(normalize(d) in lacking for d in dists))


def is_missing_package(module: str | None) -> bool:
    """A top-level import name that is not this checkout's: a package absent from this machine."""
    return bool(module) and module not in REPO_MODULES


SECTION_IMPORTS = {
    "kernels": ("torch", "triton", "inferq.kernels.reference", "inferq.kernels.reshape_and_cache",
                "inferq.kernels.runtime", "inferq.kernels.unified_attention", "tests.kernels.paged_batch"),
    "decode": ("triton.testing", "inferq.kernels.split_k_decode", "inferq.gpuworker.attention.base",
               "inferq.gpuworker.attention.torch_backend", "inferq.gpuworker.attention.triton_backend"),
    "engine": ("transformers", "safetensors", "inferq.bench.offline", "inferq.gpuworker.llm",
               "inferq.gpuworker.models.loader", "inferq.gpuworker.engine.llm_engine"),
    "invariance": ("inferq.kernels.batch_invariant_matmul", "inferq.kernels.batch_invariant_rowwise",
                   "inferq.gpuworker.models.batch_invariant"),
    "pytest": ("pytest", "tests.kernels.conftest"),
}


def gpu_test_args(ignore: list[str] = ()) -> list[str]:
    """The pytest selection of the GPU run (pytest-collect collects exactly this)."""
    args = ["-q", "-p", "no:cacheprovider", "-rfEs", "tests/kernels", "-k", "not engine",
            # C kernels on the CPU and the sm_90 compile without a GPU: CI runs them; no GPU needed
            "--ignore-glob=tests/kernels/test_cpu_*.py",
            "--ignore=tests/kernels/test_compile_for_hopper.py",
            # this script's own dry run
            "--ignore=tests/kernels/test_gpu_check_dry_run.py",
            # batch-invariant mode's bit-for-bit checks, compiled: what the interpreter cannot prove
            "tests/gpu_path/test_batch_invariant_triton_attention.py",
            "tests/gpu_path/test_batch_invariant_triton_rowwise.py"]
    return args + [f"--ignore={path}" for path in ignore]


# ----------------------------------------------------------------------------- report
FAILING = ("FAIL", "ERROR", "TIMEOUT")


class Report:
    """Rows and stages, printed, logged to gpu_check.log and rewritten into gpu_check.json as they come."""

    def __init__(self, out_dir: Path, mode: str, budget_s: float):
        self.out_dir = out_dir
        self.mode = mode
        self.rows: list[dict] = []
        self.stages: list[dict] = []
        self.info: dict = {"budget": plan_budget(budget_s)}
        self.log = open(out_dir / "gpu_check.log", "a", buffering=1)
        self.started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.log.write(text + "\n")

    def row(self, section: str, item: str, result: str, detail: str = "") -> None:
        self.rows.append({"section": section, "item": item, "result": result, "detail": detail})
        self.say(f"[{section}] {item}: {result} {detail}")
        self.write()

    def stage(self, name: str, status: str, detail: str, seconds: float) -> None:
        self.stages.append({"name": name, "status": status, "detail": detail, "seconds": round(seconds, 2)})
        self.say(f"== stage {name}: {status} ({seconds:.1f}s) {detail}")
        self.write()

    def ok(self) -> bool:
        return not any(s["status"] in FAILING for s in self.stages)

    def write(self) -> None:
        doc = {"date": self.started, "mode": self.mode, "ok": self.ok(), "out": str(self.out_dir),
               "stages": self.stages, "rows": self.rows, **self.info}
        tmp = self.out_dir / "gpu_check.json.tmp"
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        tmp.replace(self.out_dir / "gpu_check.json")

    def table(self) -> None:
        rows = [{"section": "stage", "item": s["name"], "result": s["status"], "detail": s["detail"]}
                for s in self.stages] + self.rows
        head = {"section": "section", "item": "item", "result": "result"}
        widths = [min(max(len(r[k]) for r in rows + [head]), 48) for k in ("section", "item", "result")]
        self.say("\n" + "=" * 100)
        self.say(f"{'section':<{widths[0]}} | {'item':<{widths[1]}} | {'result':<{widths[2]}} | detail")
        self.say("-" * 100)
        for r in rows:
            self.say(f"{r['section']:<{widths[0]}} | {r['item']:<{widths[1]}} | {r['result']:<{widths[2]}} | {r['detail']}")
        self.say("=" * 100)


REPORT: Report | None = None
CPU_SMOKE = False
DRY_RUN = False
DEVICE = None  # torch.device, set in main()
BANDWIDTH: tuple[str | None, float | None] = (None, None)


def row(section: str, item: str, result: str, detail: str = "") -> None:
    REPORT.row(section, item, result, detail)


# ----------------------------------------------------------------------------- small helpers
def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def hide_modules(names) -> None:
    """Make these top-level modules unimportable, as if not installed: `import x` raises
    ModuleNotFoundError and importlib.util.find_spec('x') returns None (None in sys.modules)."""
    for name in names:
        if name not in sys.modules or sys.modules[name] is None:
            sys.modules[name] = None


def missing_module(text: str) -> str | None:
    """The top-level module a ModuleNotFoundError in this text names, if any."""
    m = re.search(r"No module named '([\w.]+)'", text) or re.search(r"import of ([\w.]+) halted", text)
    return m.group(1).split(".")[0] if m else None


def child_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_CORE_"))}
    env.update(PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    env.update(extra)
    return env


def run_child(cmd: list[str], log_path: Path, timeout: float, env: dict | None = None,
              stdout_path: Path | None = None) -> tuple[int, bool]:
    """Run cmd with its output appended to log_path (stdout to stdout_path instead, if given);
    at the timeout send SIGINT (pytest then writes its summary and junit XML), and kill it 20 s
    later. Returns (exit status, timed out)."""
    with open(log_path, "a") as log, open(stdout_path or os.devnull, "w") as stdout:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=stdout if stdout_path else log,
                                stderr=subprocess.STDOUT if not stdout_path else log)
        try:
            return proc.wait(timeout=max(timeout, 1.0)), False
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return proc.returncode, True


def tail(path: Path, lines: int = 1) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:])


def self_cmd(*args: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), *args]


# ----------------------------------------------------------------------------- stage: compiler
def python_include_dir() -> str:
    """Where Triton looks for Python.h (triton/runtime/build.py does the same)."""
    scheme = sysconfig.get_default_scheme()
    if scheme == "posix_local":
        scheme = "posix_prefix"
    return sysconfig.get_paths(scheme=scheme)["include"]


def check_compiler(env: dict | None = None, include_dir: str | None = None, which=shutil.which,
                   probe: bool = True) -> dict:
    """Can Triton build its launcher here? It compiles a C file with $CC, else gcc, else clang (not
    plain `cc`), against this interpreter's Python.h. Returns {"ok", "message", ...}."""
    env = dict(os.environ) if env is None else env
    path = env.get("PATH", "")
    cc_var = env.get("CC")
    if cc_var:
        cc = which(cc_var, path=path) or (cc_var if os.path.isfile(cc_var) and os.access(cc_var, os.X_OK) else None)
        if cc is None:
            return {"ok": False, "compiler": None,
                    "message": f"no C compiler: CC={cc_var!r} is set but is not an executable on PATH={path!r}; "
                               "Triton builds its CUDA launcher with $CC. Fix CC or unset it to use gcc."}
    else:
        cc = which("gcc", path=path) or which("clang", path=path)
        if cc is None:
            plain = which("cc", path=path)
            hint = (f" There is a plain {plain}, which Triton does not try: export CC={plain}." if plain else
                    " Install gcc (apt-get install gcc) or set CC to a C compiler.")
            return {"ok": False, "compiler": None,
                    "message": "no C compiler: Triton builds its CUDA launcher with $CC, else gcc, else clang, "
                               f"and none is on PATH={path!r}.{hint}"}
    include_dir = include_dir or python_include_dir()
    if not (Path(include_dir) / "Python.h").is_file():
        return {"ok": False, "compiler": cc, "python_include": include_dir,
                "message": f"no Python.h in {include_dir}: Triton compiles its launcher against this interpreter's "
                           f"headers; install python{sys.version_info[0]}.{sys.version_info[1]}-dev."}
    result = {"ok": True, "compiler": cc, "python_include": include_dir,
              "message": f"{cc} with Python.h from {include_dir}"}
    if probe:
        with tempfile.TemporaryDirectory(prefix="gpu_check_cc-") as tmp:
            src = Path(tmp) / "probe.c"
            src.write_text("#include <Python.h>\nint probe(void) { return Py_IsInitialized(); }\n")
            try:
                proc = subprocess.run([cc, "-fsyntax-only", f"-I{include_dir}", str(src)], env={**env, "PATH": path},
                                      capture_output=True, text=True, timeout=60)
                err = proc.stderr.strip()[-400:] if proc.returncode else ""
            except (OSError, subprocess.TimeoutExpired) as exc:
                err = repr(exc)
        if err:
            result.update(ok=False, message=f"{cc} could not compile a file including Python.h: {err}")
        else:
            result["message"] += "; probe compile passed"
    return result


def stage_compiler() -> tuple[str, str]:
    result = check_compiler()
    REPORT.info["compiler"] = result
    return ("PASS" if result["ok"] else "FAIL"), result["message"]


# ----------------------------------------------------------------------------- stage: import-root
# Finds the modules without running them (no torch import): only the package-dir mapping is in question.
IMPORT_ROOT_PROBE = """
import importlib.util
for name in ("inferq.kernels.runtime", "inferq.gpuworker.attention.base", "inferq.bench.paged_metadata"):
    if importlib.util.find_spec(name) is None:
        raise SystemExit(f"ModuleNotFoundError: No module named {name!r}")
"""


def import_root_error() -> str:
    """'' if a fresh interpreter imports inferq.* with PYTHONPATH=repo (as the kernel tests' own
    subprocesses do, from outside the repo), else the error."""
    env = child_env(PYTHONPATH=str(REPO), TRITON_INTERPRET="1")
    with tempfile.TemporaryDirectory(prefix="gpu_check_root-") as cwd:
        proc = subprocess.run([sys.executable, "-c", IMPORT_ROOT_PROBE], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=120)
    return "" if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["rc %d" % proc.returncode])[-1]


ROOT_MODULE = "_inferq_gpu_check_root"
ROOT_FINDER_SOURCE = """\
# Written by scripts/gpu_check.py: inferq's one import root mapped onto the checkout, as an editable
# install maps it (pyproject.toml's [tool.setuptools.package-dir]); delete this file and the .pth beside it.
import importlib.util
import sys

REPO = {repo!r}
PACKAGE_DIRS = {package_dirs!r}


class InferqRootFinder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        folder = PACKAGE_DIRS.get(name)
        if folder is None:
            return None
        folder = REPO + "/" + folder
        return importlib.util.spec_from_file_location(name, folder + "/__init__.py",
                                                      submodule_search_locations=[folder])

    @classmethod
    def invalidate_caches(cls):
        pass


def install():
    if not any(getattr(f, "__name__", "") == "InferqRootFinder" for f in sys.meta_path):
        sys.meta_path.append(InferqRootFinder)
"""


def root_finder_source() -> str:
    package_dirs = dict(load_pyproject()["tool"]["setuptools"]["package-dir"])
    return ROOT_FINDER_SOURCE.format(repo=str(REPO), package_dirs=package_dirs)


def install_root_finder_in_process() -> None:
    """What the .pth does at start-up, for this process only (dry-run children of an uninstalled checkout)."""
    namespace: dict = {"__name__": ROOT_MODULE}
    exec(compile(root_finder_source(), ROOT_MODULE, "exec"), namespace)
    namespace["install"]()
    importlib.invalidate_caches()


def install_root_finder() -> str:
    """Make inferq.* importable for this interpreter and every process it starts, whatever their
    PYTHONPATH: a finder module and a .pth that installs it, in the interpreter's site-packages.
    Needs no build tools and no network (an editable pip install needs a recent setuptools)."""
    purelib = Path(sysconfig.get_paths()["purelib"])
    (purelib / f"{ROOT_MODULE}.py").write_text(root_finder_source())
    (purelib / f"{ROOT_MODULE}.pth").write_text(f"import {ROOT_MODULE}; {ROOT_MODULE}.install()\n")
    install_root_finder_in_process()
    return str(purelib)


def stage_import_root(may_install: bool) -> tuple[str, str]:
    """may_install: only a GPU run on a GPU writes the .pth (the lent machine is bare and given back)."""
    err = import_root_error()
    if not err:
        spec = importlib.util.find_spec("inferq")
        return "PASS", f"inferq.* importable ({Path(spec.origin).parent if spec and spec.origin else '?'})"
    if DRY_RUN:
        REPORT.info["root_mapped_in_children"] = True
        return "WARN", (f"inferq is not installed ({err}); the GPU run would write {ROOT_MODULE}.py/.pth into "
                        "site-packages (the dry run's children map it themselves)")
    if not may_install:
        return "FAIL", f"inferq is not installed ({err}): python3 -m pip install --no-deps -e ."
    REPORT.say(f"[import-root] {err}: mapping inferq.* onto {REPO} with a .pth in site-packages")
    try:
        where = install_root_finder()
    except OSError as exc:
        return "FAIL", (f"could not write {ROOT_MODULE}.pth into site-packages ({exc}); install the checkout "
                        "instead: python3 -m pip install --no-deps -e .")
    err = import_root_error()
    if err:
        return "FAIL", f"{ROOT_MODULE}.pth written to {where}, but a fresh interpreter still fails: {err}"
    return "PASS", f"inferq.* mapped onto the checkout by {where}/{ROOT_MODULE}.pth (not installed before)"


# ----------------------------------------------------------------------------- stage: carried
def stage_carried() -> tuple[str, str]:
    wheels = sorted(p.name for p in (CARRY_DIR / "whl").glob("*.whl"))
    tokenizer = (CARRY_DIR / "tokenizer" / "tokenizer.json").is_file()
    missing = [m for m in CARRY_MODULES if not _importable(m)]
    REPORT.info["carried"] = {"wheels": wheels, "tokenizer": tokenizer, "missing_modules": missing}
    detail = f"{len(wheels)} wheels in .gpu_carry/whl, tokenizer {'present' if tokenizer else 'absent'}"
    if DRY_RUN:
        return "PASS", detail + " (dry run: the imports stage emulates the image with and without them)"
    if wheels and missing:
        return "WARN", (detail + f"; carried but not importable: {missing} (run through scripts/gpu_check.sh, "
                                 "which installs them into /tmp/site)")
    if missing:
        return "WARN", detail + f"; not importable: {missing}: the engine section will be skipped " \
                                "(bash scripts/gpu_check.sh prepare, then carry .gpu_carry)"
    return "PASS", detail + "; all importable"


# ----------------------------------------------------------------------------- stage: device
def stage_device() -> tuple[str, str]:
    global BANDWIDTH
    table = {key: bw for key, bw in BANDWIDTH_BY_NAME}
    info = {"bandwidth_table_Bps": table, "step_floor_us_by_device": {
        key: {str(b): round(us, 1) for b, us in step_floors_us(bw).items()} for key, bw in BANDWIDTH_BY_NAME},
        "dev_nvidia0": os.path.exists("/dev/nvidia0")}
    REPORT.info["device"] = info
    if DRY_RUN:
        info["name"] = None
        return "PASS", ("dry run, no GPU; bandwidth by name: "
                        + ", ".join(f"{k} {bw / 1e12:g} TB/s" for k, bw in BANDWIDTH_BY_NAME))
    import torch

    if CPU_SMOKE:
        info["name"] = "cpu"
        return "PASS", "CPU (TRITON_INTERPRET=1 smoke run): figures below are NOT GPU measurements"
    if not torch.cuda.is_available():
        return "FAIL", "no CUDA device visible to torch (try --dry-run or --cpu-smoke on a CPU machine)"
    props = torch.cuda.get_device_properties(0)
    key, bandwidth = bandwidth_for(props.name)
    BANDWIDTH = (key, bandwidth)
    info.update(name=props.name, sms=props.multi_processor_count, memory_gib=round(props.total_memory / 2**30, 1),
                l2_mb=round(getattr(props, "L2_cache_size", 0) / 1e6, 1), bandwidth_key=key, bandwidth_Bps=bandwidth,
                step_floor_us={str(b): round(us, 1) for b, us in step_floors_us(bandwidth).items()} if bandwidth else None)
    detail = f"{props.name}, {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB"
    if bandwidth is None:
        return "WARN", detail + f"; unknown device: no bandwidth in the table, so no floor ratios ({list(table)})"
    return "PASS", detail + f"; bandwidth {bandwidth / 1e12:g} TB/s ({key})"


# ----------------------------------------------------------------------------- stage: budget
def stage_budget(budget: Budget) -> tuple[str, str]:
    plan = plan_budget(budget.seconds)
    REPORT.info["budget"] = plan
    detail = (f"{budget.seconds:.0f} s of checks, device-tool timeout_s {plan['recommended_timeout_s']}; "
              f"first call <= {plan['first_call_worst_s']} s of {DEVICE_TIME_S} s device time, "
              f"{plan['left_after_first_call_s']} s left; shares {plan['section_shares_s']}")
    problems = []
    if not plan["fits_with_rerun"]:
        problems.append(f"no room for a rerun (2 x {plan['first_call_worst_s']} s > {DEVICE_TIME_S} s): lower --budget-s")
    if plan["sections_below_minimum"]:
        problems.append(f"sections below their minimum time, to be skipped: {plan['sections_below_minimum']}")
    return ("WARN" if problems else "PASS"), detail + ("; " + "; ".join(problems) if problems else "")


# ----------------------------------------------------------------------------- stage: imports
def import_sections(sections=tuple(SECTION_IMPORTS)) -> dict[str, dict[str, str]]:
    """{section: {module: error}} for every module of SECTION_IMPORTS that fails to import."""
    errors: dict[str, dict[str, str]] = {}
    for section in sections:
        for module in SECTION_IMPORTS[section]:
            try:
                importlib.import_module(module)
            except Exception as exc:  # noqa: BLE001 - reported, not raised
                errors.setdefault(section, {})[module] = f"{type(exc).__name__}: {exc}"
    return errors


def judge_imports(errors: dict[str, dict[str, str]], engine_may_lack_packages: bool) -> tuple[str, list[str]]:
    """FAIL if a section other than the engine cannot import; for the engine, WARN if it only lacks
    packages (and may: it is then skipped, as without the carried wheels), else FAIL."""
    status, notes = "PASS", []
    for section, modules in errors.items():
        missing = {missing_module(e) for e in modules.values()}
        if section == "engine" and engine_may_lack_packages and all(is_missing_package(m) for m in missing):
            status = "WARN" if status == "PASS" else status
            notes.append(f"engine would be skipped: missing {sorted(missing)} (carry wheels)")
        else:
            status = "FAIL"
            notes.append(f"{section}: " + "; ".join(f"{m}: {e}" for m, e in modules.items()))
    return status, notes


def imports_in_child(hidden: list[str], log_path: Path, map_root: bool = False) -> dict[str, dict[str, str]]:
    with tempfile.TemporaryDirectory(prefix="gpu_check_imports-") as tmp:
        spec, result = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec.write_text(json.dumps({"hide": hidden, "result": str(result), "map_root": map_root}))
        rc, timed_out = run_child(self_cmd("--import-child", str(spec)), log_path, 180,
                                  child_env(TRITON_INTERPRET="1"))
        if not result.is_file():
            return {"child": {"--import-child": f"rc {rc}{', timed out' if timed_out else ''}; see {log_path.name}"}}
        return json.loads(result.read_text())


ENGINE_IMPORT_ERRORS: dict[str, str] = {}  # GPU run: what the imports stage saw

# Dry run: the child processes of the imports and pytest-collect stages start together (prefetch)
# and each stage waits for its own; on two cores that halves the dry run's time.
PREFETCH: dict = {}
DRY_RUN_MAP_ROOT = [False]  # an uninstalled checkout: the dry run's children map inferq.* themselves


def start_dry_run_children() -> None:
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=3, thread_name_prefix="gpu_check")
    out = REPORT.out_dir
    try:
        map_root = DRY_RUN_MAP_ROOT[0] = bool(import_root_error())
    except (OSError, subprocess.SubprocessError):  # the import-root stage will say why
        map_root = False
    # everything inside the threads: an exception surfaces in the stage that waits for it (ERROR)
    PREFETCH["image"] = pool.submit(lambda: imports_in_child(image_lacks(), out / "imports_image.log", map_root))
    PREFETCH["image_plus_carried"] = pool.submit(lambda: imports_in_child(
        image_lacks(carried=[d for d, _ in CARRY_WHEELS]), out / "imports_carried.log", map_root))
    PREFETCH["collect"] = pool.submit(lambda: run_pytest_child(
        gpu_test_args() + ["--collect-only"], dry_run_hidden(), pytest_env(), out / "pytest_collect.log", 240))
    pool.shutdown(wait=False)


def stage_imports() -> tuple[str, str]:
    if not DRY_RUN:
        errors = import_sections()
        REPORT.info["imports"] = errors
        status, notes = judge_imports(errors, engine_may_lack_packages=True)
        ENGINE_IMPORT_ERRORS.update(errors.get("engine", {}))
        return status, "; ".join(notes) or "every section's modules import"
    image = PREFETCH["image"].result()
    with_carry = PREFETCH["image_plus_carried"].result()
    REPORT.info["imports"] = {"image": image, "image_plus_carried": with_carry}
    status_a, notes_a = judge_imports(image, engine_may_lack_packages=True)
    status_b, notes_b = judge_imports(with_carry, engine_may_lack_packages=False)
    notes = [f"as the image: {n}" for n in notes_a] + [f"image + carried wheels: {n}" for n in notes_b]
    if status_b == "FAIL":
        notes.append(f"the carried wheels ({', '.join(d for d, _ in CARRY_WHEELS)}) do not cover the engine")
    status = "FAIL" if "FAIL" in (status_a, status_b) else "PASS"
    return status, "; ".join(notes) or "all sections import"


# ----------------------------------------------------------------------------- stage: pytest-collect / pytest
class PytestFacts:
    """A pytest plugin object (child side): collection errors, outcomes, and whether the kernel
    tests run compiled on the GPU or in the interpreter."""

    def __init__(self):
        self.facts = {"collect_errors": [], "collected": 0, "outcomes": {}, "on_gpu": None,
                      "triton_interpret": None}

    def pytest_collectreport(self, report):
        if report.failed:
            self.facts["collect_errors"].append({"nodeid": report.nodeid, "text": report.longreprtext[-3000:]})

    def pytest_collection_finish(self, session):
        self.facts["collected"] = len(session.items)
        conftest = sys.modules.get("tests.kernels.conftest")
        self.facts["on_gpu"] = getattr(conftest, "ON_GPU", None)
        self.facts["triton_interpret_env"] = os.environ.get("TRITON_INTERPRET")
        if "triton.language" in sys.modules:
            self.facts["triton_interpret"] = type(sys.modules["triton.language"].cdiv).__name__ == "InterpretedFunction"

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            key = "error" if report.failed and report.when != "call" else report.outcome
            self.facts["outcomes"][key] = self.facts["outcomes"].get(key, 0) + 1


def pytest_child(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    hide_modules(spec.get("hide", ()))
    sys.path[0:1] = [str(REPO)]  # as `python -m pytest` from the repository root
    if spec.get("map_root"):
        install_root_finder_in_process()
    import pytest

    plugin = PytestFacts()
    rc = 3
    try:
        rc = int(pytest.main(spec["args"], plugins=[plugin]))
    finally:
        plugin.facts["exit_status"] = rc
        Path(spec["facts"]).write_text(json.dumps(plugin.facts))
    return rc


def run_pytest_child(args: list[str], hidden: list[str], env: dict, log_path: Path, timeout: float) -> tuple[dict, bool]:
    with tempfile.TemporaryDirectory(prefix="gpu_check_pytest-") as tmp:
        spec, facts = Path(tmp) / "spec.json", Path(tmp) / "facts.json"
        spec.write_text(json.dumps({"args": args, "hide": hidden, "facts": str(facts),
                                    "map_root": DRY_RUN and DRY_RUN_MAP_ROOT[0]}))
        rc, timed_out = run_child(self_cmd("--pytest-child", str(spec)), log_path, timeout, env)
        result = json.loads(facts.read_text()) if facts.is_file() else {"collect_errors": [], "collected": 0,
                                                                        "outcomes": {}}
        result.setdefault("exit_status", rc)
        result["rc"] = rc
        return result, timed_out


def pytest_env() -> dict:
    # tests/conftest.py sets TRITON_INTERPRET=1 (setdefault) when torch sees no GPU; an explicit
    # value wins, so the kernel tests here run compiled, or interpreted in a CPU run.
    interpret = "1" if (CPU_SMOKE or DRY_RUN) else "0"
    return child_env(TRITON_INTERPRET=interpret)


PYTEST_IGNORES: list[str] = []  # decided by pytest-collect, used by pytest


def stage_pytest_collect() -> tuple[str, str]:
    """Collect exactly the GPU selection; files that fail to collect only for want of a package the
    image lacks are left out of the run, named; any other collection error fails."""
    hidden = dry_run_hidden() if DRY_RUN else []
    log = REPORT.out_dir / "pytest_collect.log"
    if "collect" in PREFETCH:
        facts, timed_out = PREFETCH.pop("collect").result()
    else:
        facts, timed_out = run_pytest_child(gpu_test_args() + ["--collect-only"], hidden, pytest_env(), log, 240)
    if timed_out:
        return "TIMEOUT", f"collection took over 240 s; see {log.name}"
    ignores, other = [], []
    for err in facts["collect_errors"]:
        module = missing_module(err["text"])
        path = err["nodeid"].split("::")[0]
        if is_missing_package(module) and path.endswith(".py"):
            ignores.append(path)
            row("pytest-collect", path, "LEFT OUT", f"needs {module}, which {'the GPU image' if DRY_RUN else 'this machine'} "
                f"lacks{' (carried as a wheel by gpu_check.sh prepare)' if module in CARRY_MODULES else ''}")
        else:
            other.append(f"{err['nodeid'] or '<session>'}: {err['text'].strip().splitlines()[-1:]}")
    PYTEST_IGNORES[:] = ignores
    REPORT.info["pytest_selection"] = {"args": gpu_test_args(ignores), "hidden_in_dry_run": hidden}
    if other:
        return "FAIL", "collection errors: " + "; ".join(other)
    if ignores and DRY_RUN:  # collect again without them: the selection the GPU run runs must collect
        # cleanly (on the GPU machine the pytest stage's run is that proof, at no extra cost)
        facts, timed_out = run_pytest_child(gpu_test_args(ignores) + ["--collect-only"], hidden, pytest_env(), log, 240)
        if timed_out or facts["collect_errors"] or facts["rc"] not in (0, 5):
            return "FAIL", f"selection without {ignores} still fails to collect (rc {facts['rc']}); see {log.name}"
    if facts["collected"] == 0:
        return "FAIL", f"the selection collects no tests (rc {facts['rc']}); see {log.name}"
    return "PASS", (f"{facts['collected']} tests collected, no collection error"
                    + (f"; left out {ignores}" if ignores else "")
                    + (f" (dry run: {len(hidden)} packages the GPU image lacks hidden"
                       f"{', pydantic among them' if 'pydantic' in hidden else ''})" if DRY_RUN else ""))


def dry_run_hidden() -> list[str]:
    """What a dry run hides: the packages the GPU image lacks, less those carried in .gpu_carry/whl now."""
    return image_lacks(carried=[p.name.split("-")[0] for p in (CARRY_DIR / "whl").glob("*.whl")])


def run_pytest(deadline: float) -> tuple[str, str]:
    if not _importable("pytest"):
        return "SKIPPED", "pytest is not installed"
    timeout = deadline - time.monotonic()
    if timeout < SECTION_MIN_S["pytest"]:
        return "SKIPPED", f"time budget ({timeout:.0f} s left)"
    log = REPORT.out_dir / "pytest_kernels.log"
    args = gpu_test_args(PYTEST_IGNORES) + [f"--junitxml={REPORT.out_dir / 'pytest_kernels.xml'}"]
    facts, timed_out = run_pytest_child(args, [], pytest_env(), log, timeout)
    where = "interpreted on CPU" if CPU_SMOKE else "compiled, CUDA"
    summary = tail(log)
    row("pytest", f"tests/kernels ({where})", "TIMEOUT" if timed_out else ("PASS" if facts["rc"] == 0 else "FAIL"),
        f"{summary}; outcomes {facts.get('outcomes')}")
    if not CPU_SMOKE and (facts.get("on_gpu") is False or facts.get("triton_interpret")):
        row("pytest", "kernel tests on the GPU", "FAIL",
            f"they ran in the CPU interpreter (ON_GPU={facts.get('on_gpu')}, TRITON_INTERPRET="
            f"{facts.get('triton_interpret_env')}): see tests/conftest.py's GPU test")
    return "PASS", f"{timeout:.0f} s allowed"


# ----------------------------------------------------------------------------- section: kernels
def kernel_cases():
    import torch

    return [
        # name, chunks (context_len, query_len), Hq, Hkv, D, block size, dtype, num_kv_splits
        ("smollm mixed", [(0, 37), (100, 1), (1023, 1), (16, 16), (5, 60)], 9, 3, 64, 16, torch.bfloat16, None),
        ("smollm mixed", [(0, 37), (100, 1), (1023, 1), (16, 16), (5, 60)], 9, 3, 64, 16, torch.float16, None),
        ("llama8b-like chunk", [(1000, 512), (300, 1), (0, 200)], 32, 8, 128, 16, torch.bfloat16, None),
        ("gqa1 d128 bs32", [(70, 33), (0, 1), (511, 1)], 8, 8, 128, 32, torch.float16, None),
        ("gqa4 bs128", [(130, 1), (257, 70), (0, 129)], 16, 4, 64, 128, torch.bfloat16, None),
        ("gqa8 bs64 d128", [(64, 64), (1, 1), (999, 1)], 32, 4, 128, 64, torch.bfloat16, None),
        ("split-K auto 1 seq 4k", [(4095, 1)], 9, 3, 64, 16, torch.bfloat16, None),
        ("split-K forced 5 decodes", [(2000, 1), (1, 1), (300, 1), (777, 1), (16, 1)], 9, 3, 64, 16, torch.float16, 7),
        ("split-K forced mixed", [(0, 100), (500, 1), (40, 20)], 8, 2, 64, 16, torch.bfloat16, 4),
        ("ieee dots", [(0, 50), (200, 1), (33, 17)], 6, 2, 64, 16, torch.float32, None),
        ("d128 split", [(900, 1), (10, 1)], 4, 1, 128, 16, torch.float32, 8),
    ]


def check_kernels(deadline: float) -> tuple[str, str]:
    import torch

    from inferq.kernels import reference
    from inferq.kernels.reshape_and_cache import reshape_and_cache
    from inferq.kernels.runtime import is_interpreted
    from inferq.kernels.unified_attention import _unified_attention_kernel, unified_attention
    from tests.kernels.paged_batch import ERROR_BOUNDS, make_paged_batch

    if is_interpreted(_unified_attention_kernel) != CPU_SMOKE:
        return "FAIL", f"kernels {'interpreted' if not CPU_SMOKE else 'compiled'}: TRITON_INTERPRET was set wrongly"
    dev = DEVICE
    for name, chunks, hq, hkv, d, bs, dtype, splits in kernel_cases():
        if CPU_SMOKE:  # the interpreter is slow: shrink every sequence
            chunks = [(min(c, 40), min(q, 9)) for c, q in chunks]
            hq, hkv = hq // hkv, 1
        if deadline - time.monotonic() < 3:
            row("kernels", f"{name} {str(dtype)[6:]}", "SKIPPED", "time budget")
            continue
        batch = make_paged_batch(
            chunks, num_heads=hq, num_kv_heads=hkv, head_dim=d, block_size=bs,
            dtype=dtype, device=dev, seed=len(name), pad_rows=3,
        )
        scale = d**-0.5
        out = unified_attention(*batch.attention_args(batch.poisoned_out(), scale, splits))
        ref = reference.unified_attention(*batch.attention_args(batch.poisoned_out(), scale))
        synchronize()
        n = batch.num_rows
        diff = (out[:n].float() - ref[:n].float()).abs()
        bound = ERROR_BOUNDS[dtype]
        ratio = (diff / (bound["atol"] + bound["rtol"] * ref[:n].float().abs())).max().item()
        nan_rows = int(out[:n].isnan().any(dim=(1, 2)).sum())
        pad_touched = not bool(out[n:].isnan().all())
        ok = nan_rows == 0 and not pad_touched and ratio <= 1.0
        row("kernels", f"{name} {str(dtype)[6:]}", "PASS" if ok else "FAIL",
            f"max|err| {diff.max().item():.2e} = {ratio:.2f} of bound; nan rows {nan_rows}; pad written {pad_touched}")

    # reshape_and_cache: bit-exact against the reference, negative slots skipped
    gen = torch.Generator().manual_seed(0)
    num_tokens = 20 if CPU_SMOKE else 300
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        shape = (64, 16, 8, 128)
        kc = torch.randn(shape, generator=gen).to(dtype).to(dev)
        vc = torch.randn(shape, generator=gen).to(dtype).to(dev)
        key = torch.randn(num_tokens, 8, 128, generator=gen).to(dtype).to(dev)
        val = torch.randn(num_tokens, 8, 128, generator=gen).to(dtype).to(dev)
        slots = torch.randperm(64 * 16, generator=gen)[:num_tokens].to(dev)
        slots[::7] = -1
        kr, vr = kc.clone(), vc.clone()
        reference.reshape_and_cache(key, val, kr, vr, slots)
        reshape_and_cache(key, val, kc, vc, slots)
        ok = torch.equal(kc, kr) and torch.equal(vc, vr)
        row("kernels", f"reshape_and_cache {str(dtype)[6:]}", "PASS" if ok else "FAIL", "bit-exact vs reference")
    return "PASS", ""


# ----------------------------------------------------------------------------- section: decode timing
def decode_batch(num_seqs: int, seq_len: int, block_size: int = 16, dtype=None):
    """A decode-only step: every sequence has seq_len tokens, the last one new."""
    import torch

    dtype = dtype or torch.bfloat16
    dev = DEVICE
    hq, hkv, d = SMOL["num_heads"], SMOL["num_kv_heads"], SMOL["head_dim"]
    blocks_per_seq = -(-seq_len // block_size)
    num_blocks = num_seqs * blocks_per_seq + 8
    key_cache = torch.randn(num_blocks, block_size, hkv, d, device=dev, dtype=dtype)
    value_cache = torch.randn(num_blocks, block_size, hkv, d, device=dev, dtype=dtype)
    tables = torch.randperm(num_blocks, device=dev)[: num_seqs * blocks_per_seq].view(num_seqs, blocks_per_seq)
    return dict(
        q=torch.randn(num_seqs, hq, d, device=dev, dtype=dtype),
        k=torch.randn(num_seqs, hkv, d, device=dev, dtype=dtype),
        v=torch.randn(num_seqs, hkv, d, device=dev, dtype=dtype),
        key_cache=key_cache,
        value_cache=value_cache,
        block_tables=tables.int().contiguous(),
        seq_lens=torch.full((num_seqs,), seq_len, dtype=torch.int32, device=dev),
        query_start_loc=torch.arange(num_seqs + 1, dtype=torch.int32, device=dev),
        slot_mapping=(tables[:, (seq_len - 1) // block_size].long() * block_size + (seq_len - 1) % block_size),
        num_seqs=num_seqs,
        seq_len=seq_len,
        block_size=block_size,
    )


def attention_bytes(b: dict) -> int:
    """Bytes one layer's decode attention must move: K and V of every context token, q in, out."""
    elt = b["key_cache"].element_size()
    kv = 2 * b["num_seqs"] * b["seq_len"] * SMOL["num_kv_heads"] * SMOL["head_dim"] * elt
    qo = 2 * b["num_seqs"] * SMOL["num_heads"] * SMOL["head_dim"] * elt
    return kv + qo


def synchronize() -> None:
    import torch

    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def time_ms(fn) -> float:
    if CPU_SMOKE:  # one interpreted run: checks the plumbing, not the speed
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    import triton.testing

    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")  # flushes L2 between runs


def time_graph_ms(fn, calls: int = 20, replays: int = 10) -> float | None:
    """Device time of fn without launch overhead: `calls` x (L2 flush, fn) captured in one CUDA
    graph, minus a graph of the flushes alone. do_bench's eager timing of a few-µs kernel mostly
    measures the host launching it; an engine that replays CUDA graphs pays only this."""
    if CPU_SMOKE:
        return None
    import torch

    flush = torch.empty(128 * 2**20, dtype=torch.int8, device=DEVICE)  # over twice the L2 (H100 50 MB, H200 60 MB)
    fn()  # compile and warm outside the capture
    torch.cuda.synchronize()

    def capture(with_fn: bool):
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                for _ in range(calls):
                    flush.zero_()
                    if with_fn:
                        fn()
        torch.cuda.current_stream().wait_stream(stream)
        return graph

    def replay_ms(graph) -> float:
        graph.replay()  # warm
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(replays):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]

    try:
        with_fn, flush_only = capture(True), capture(False)
        return max(replay_ms(with_fn) - replay_ms(flush_only), 0.0) / calls
    except Exception as exc:  # noqa: BLE001 - reported
        REPORT.say(f"graph timing failed: {exc!r}")
        return None


def floor_note(nbytes: int, t_us: float) -> str:
    key, bandwidth = BANDWIDTH
    if bandwidth is None:
        return "unknown device: no bandwidth floor"
    floor_us = nbytes / bandwidth * 1e6
    return f"{100 * floor_us / t_us:.0f}% of {key}'s {bandwidth / 1e12:g} TB/s (floor {floor_us:.1f} µs)"


def time_decode(deadline: float) -> tuple[str, str]:
    import torch

    from inferq.kernels.split_k_decode import choose_num_kv_splits
    from inferq.kernels.unified_attention import unified_attention

    seq_len = 64 if CPU_SMOKE else DECODE_CONTEXT
    sms = torch.cuda.get_device_properties(0).multi_processor_count if DEVICE.type == "cuda" else 132
    key, bandwidth = BANDWIDTH
    step_floor = step_floors_us(bandwidth) if bandwidth else {}
    torch_backend = metadata_cls = triton_backend = None
    try:
        from inferq.gpuworker.attention.base import AttentionMetadata as metadata_cls
        from inferq.gpuworker.attention.torch_backend import TorchAttentionBackend
        from inferq.gpuworker.attention.triton_backend import TritonAttentionBackend

        torch_backend, triton_backend = TorchAttentionBackend(), TritonAttentionBackend()
    except Exception as exc:  # noqa: BLE001 - the backends only need torch, but say why if they fail
        row("decode", "backend comparison", "SKIPPED", f"inferq.gpuworker.attention import failed: {exc!r}")

    for num_seqs in DECODE_BATCHES:
        if CPU_SMOKE and num_seqs > 1:
            continue
        if deadline - time.monotonic() < 8:
            row("decode", f"batch {num_seqs}", "SKIPPED", "time budget")
            continue
        b = decode_batch(num_seqs, seq_len)
        scale = SMOL["head_dim"] ** -0.5
        out = torch.empty_like(b["q"])
        auto_splits = choose_num_kv_splits(num_seqs, SMOL["num_kv_heads"], 1, seq_len, sms)

        def attend(splits):
            return lambda: unified_attention(
                b["q"], b["key_cache"], b["value_cache"], out, b["query_start_loc"], b["seq_lens"],
                b["block_tables"], 1, seq_len, scale, splits,
            )

        nbytes = attention_bytes(b)
        t_auto = time_ms(attend(None)) * 1e3
        t_graph = time_graph_ms(attend(None))
        layers = SMOL["layers"]
        step = (f"; x{layers} layers {layers * t_auto:.0f} µs vs whole-step floor {step_floor[num_seqs]:.0f} µs"
                if num_seqs in step_floor and seq_len == DECODE_CONTEXT else "")
        detail = (f"eager {t_auto:.1f} µs/layer ({auto_splits} split{'s' if auto_splits > 1 else ''}); "
                  f"{nbytes / 1e6:.2f} MB -> {nbytes / t_auto / 1e3:.0f} GB/s = {floor_note(nbytes, t_auto)}{step}")
        row("decode", f"batch {num_seqs} @{seq_len} triton attention", f"{nbytes / t_auto / 1e3:.0f} GB/s", detail)
        if t_graph:
            t_graph *= 1e3
            row("decode", f"batch {num_seqs} @{seq_len} triton attention, CUDA graph",
                f"{nbytes / t_graph / 1e3:.0f} GB/s",
                f"{t_graph:.1f} µs/layer without launch overhead, L2 flushed = {floor_note(nbytes, t_graph)}; "
                f"x{layers} layers {layers * t_graph:.0f} µs")
        if auto_splits > 1:
            t_one = time_ms(attend(1)) * 1e3
            t_one_graph = time_graph_ms(attend(1))
            graph_note = ""
            if t_graph and t_one_graph:
                graph_note = f"; CUDA graph {t_one_graph * 1e3:.1f} µs, split-K speed-up x{t_one_graph * 1e3 / t_graph:.2f}"
            row("decode", f"batch {num_seqs} @{seq_len} without split-K", f"{nbytes / t_one / 1e3:.0f} GB/s",
                f"eager {t_one:.1f} µs/layer, split-K speed-up x{t_one / t_auto:.2f}{graph_note}")
        if torch_backend is not None:
            meta = metadata_cls(
                slot_mapping=b["slot_mapping"], query_start_loc=b["query_start_loc"], seq_lens=b["seq_lens"],
                context_lens=b["seq_lens"] - 1, block_tables=b["block_tables"], max_query_len=1,
                max_seq_len=seq_len, block_size=b["block_size"], query_lens_cpu=[1] * num_seqs,
                seq_lens_cpu=[seq_len] * num_seqs,
            )
            cache = (b["key_cache"], b["value_cache"])
            t_triton = time_ms(lambda: triton_backend.forward(b["q"], b["k"], b["v"], cache, meta, scale)) * 1e3
            t_torch = time_ms(lambda: torch_backend.forward(b["q"], b["k"], b["v"], cache, meta, scale)) * 1e3
            row("decode", f"batch {num_seqs} @{seq_len} backend forward",
                f"triton {t_triton:.1f} µs vs torch {t_torch:.1f} µs",
                f"cache write + attention; triton x{t_torch / t_triton:.1f} faster")
        del b
        if DEVICE.type == "cuda":
            torch.cuda.empty_cache()
    return "PASS", (f"floors from {key}'s {bandwidth / 1e12:g} TB/s" if bandwidth else "no bandwidth floor")


# ----------------------------------------------------------------------------- section: engine
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")


def find_tokenizer(arg: str | None) -> Path | None:
    """The SmolLM2 tokenizer files: --tokenizer, the carried .gpu_carry/tokenizer, or the local GGUF conversion."""
    for candidate in (arg, CARRY_DIR / "tokenizer"):
        if candidate and (Path(candidate) / "tokenizer.json").is_file():
            return Path(candidate)
    try:
        from tests.tiny_models import tokenizer_source

        return tokenizer_source()
    except Exception:  # noqa: BLE001 - then the section is skipped with a reason
        return None


def smollm2_shaped_model(folder: Path, tokenizer: Path, small: bool, vocab_size: int | None = None) -> Path:
    """SmolLM2-135M's architecture with random bf16 weights: same FLOPs and bytes per token.

    The real weights (a 98 MB GGUF) exceed what can be carried to the GPU
    machine, and throughput with ignore_eos does not depend on weight values.
    """
    import torch
    import transformers

    cfg = dict(SMOLLM2_CONFIG)
    if small:  # --cpu-smoke
        cfg.update(hidden_size=48, intermediate_size=128, num_hidden_layers=2, num_attention_heads=3,
                   num_key_value_heads=1, head_dim=16)
    if vocab_size:  # a smaller LM head (the interpreted smoke run of the invariance section)
        cfg.update(vocab_size=vocab_size)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**cfg))
    with torch.no_grad():
        for p in model.parameters():  # wider than HF's init so logits are not flat
            p.normal_(0.0, 0.05)
    model.to(torch.float32 if small else torch.bfloat16).save_pretrained(folder)
    for name in TOKENIZER_FILES:
        if (tokenizer / name).is_file():
            shutil.copy(tokenizer / name, folder / name)
    return folder


def run_engine_benchmark(deadline: float, tokenizer_arg: str | None) -> tuple[str, str]:
    """The offline benchmark (inferq.bench.offline) on a SmolLM2-shaped model, in a child process."""
    missing = sorted({missing_module(e) or e for e in ENGINE_IMPORT_ERRORS.values()})
    if missing:
        return "SKIPPED", f"its imports fail, missing {missing}: carry wheels (bash scripts/gpu_check.sh prepare)"
    tokenizer = find_tokenizer(tokenizer_arg)
    if tokenizer is None:
        return "SKIPPED", "no SmolLM2 tokenizer files (bash scripts/gpu_check.sh prepare)"
    if deadline - time.monotonic() < SECTION_MIN_S["engine"]:
        return "SKIPPED", f"time budget ({deadline - time.monotonic():.0f} s left)"
    small = CPU_SMOKE
    with tempfile.TemporaryDirectory(prefix="smollm2-shaped-") as tmp:
        model_dir = smollm2_shaped_model(Path(tmp), tokenizer, small)
        timeout = deadline - time.monotonic()
        cmd = [
            sys.executable, "-m", "inferq.bench.offline", "--model", str(model_dir), "--device", str(DEVICE),
            "--dtype", "float32" if small else "bfloat16", "--threads", "4", "--peers", "static",
            "--static-batch-size", "64", "--json", str(REPORT.out_dir / "bench_offline.json"),
        ]
        if small:
            cmd += ["--num-requests", "4", "--min-input", "4", "--max-input", "24", "--min-output", "2",
                    "--max-output", "6"]
        row("engine", "command", "RUN", " ".join(cmd[1:]))
        log, stdout = REPORT.out_dir / "bench_offline.log", Path(tmp) / "stdout.txt"
        rc, timed_out = run_child(cmd, log, timeout, child_env(), stdout_path=stdout)
        printed = stdout.read_text(errors="replace")
    stderr_tail = tail(log, 3)[-600:]
    with open(log, "a") as f:  # stderr (progress bars, tracebacks) came first; the report last
        f.write("--- stdout ---\n" + printed)
    if timed_out:
        row("engine", "offline benchmark", "TIMEOUT", f"after {timeout:.0f} s; see {log.name}")
    elif rc != 0:
        row("engine", "offline benchmark", "FAIL", f"rc {rc}: {stderr_tail}")
    else:
        for line in printed.strip().splitlines()[-10:]:
            row("engine", "bench_offline", "", line.strip())
    return "PASS", f"{timeout:.0f} s allowed"


# ----------------------------------------------------------------------------- section: invariance
INVARIANCE_CHECKED = 3  # requests also run alone, per mode


def invariance_run(model_dir: Path, batch_invariant: bool, workload, deadline: float) -> dict:
    """One engine in one mode: a warm-up, the workload timed in one generate call, then the first
    INVARIANCE_CHECKED requests alone (greedy, so their tokens must match where the mode holds)."""
    import gc

    import torch

    from inferq.gpuworker import LLM
    from inferq.schemas import SamplingParams

    kw = dict(max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=1024, enable_prefix_caching=False)
    if DEVICE.type == "cuda":
        kw.update(gpu_memory_utilization=0.5)
    else:  # --cpu-smoke: the GPU path's own ops, interpreted
        kw.update(attention_backend="triton", prepack_weights=False, cpu_kernels=False, num_kv_blocks=64)
    start = time.perf_counter()
    llm = LLM(model=str(model_dir), device=str(DEVICE), dtype="float32" if CPU_SMOKE else "bfloat16",
              batch_invariant=batch_invariant, **kw)
    try:
        params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in workload.output_lens]
        llm.generate(workload.prompts[:1], params[:1])  # compiles, graphs' first replays
        ready_s = time.perf_counter() - start
        if time.monotonic() > deadline:
            raise TimeoutError(f"engine start and warm-up took {ready_s:.0f} s")
        if DEVICE.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        batch = llm.generate(workload.prompts, params)
        seconds = time.perf_counter() - t0
        alone = [llm.generate([p], [q])[0] for p, q in zip(workload.prompts[:INVARIANCE_CHECKED], params)]
        same = sum(a.token_ids == b.token_ids for a, b in zip(alone, batch))
        tokens = sum(len(o.token_ids) for o in batch)
        return dict(batch_invariant=batch_invariant, ready_s=round(ready_s, 1), seconds=round(seconds, 3),
                    output_tokens=tokens, tokens_per_s=round(tokens / seconds, 1), alone_equal=same,
                    alone_checked=len(alone))
    finally:
        del llm
        gc.collect()
        if DEVICE.type == "cuda":
            torch.cuda.empty_cache()


def measure_batch_invariance(deadline: float, tokenizer_arg: str | None) -> tuple[str, str]:
    """Offline throughput with batch_invariant on and off on a SmolLM2-135M-shaped random model
    (its real shape: hidden 576, 30 layers, 9/3 heads, vocabulary 49,152), in this process."""
    missing = sorted({missing_module(e) or e for e in ENGINE_IMPORT_ERRORS.values()})
    if missing:
        return "SKIPPED", f"the engine's imports fail, missing {missing}: carry wheels (bash scripts/gpu_check.sh prepare)"
    tokenizer = find_tokenizer(tokenizer_arg)
    if tokenizer is None:
        return "SKIPPED", "no SmolLM2 tokenizer files (bash scripts/gpu_check.sh prepare)"
    if deadline - time.monotonic() < SECTION_MIN_S["invariance"]:
        return "SKIPPED", f"time budget ({deadline - time.monotonic():.0f} s left)"
    from inferq.bench.offline import make_workload

    small = CPU_SMOKE
    workload = (make_workload(2, 4, 12, 2, 3, 512, 0) if small
                else make_workload(48, 16, 384, 32, 96, SMOLLM2_CONFIG["vocab_size"], 0))
    runs = {}
    with tempfile.TemporaryDirectory(prefix="smollm2-shaped-") as tmp:
        model_dir = smollm2_shaped_model(Path(tmp), tokenizer, small, vocab_size=512 if small else None)
        for mode in (True, False):  # on first: its kernels are in Triton's cache from the engine section
            try:
                runs[mode] = invariance_run(model_dir, mode, workload, deadline)
            except TimeoutError as exc:
                row("invariance", f"batch_invariant={mode}", "TIMEOUT", str(exc))
                break
            r = runs[mode]
            ok = r["alone_equal"] == r["alone_checked"] or not mode  # off: differences are allowed
            row("invariance", f"batch_invariant={mode}", "PASS" if ok else "FAIL",
                f"{r['tokens_per_s']} output tok/s ({r['output_tokens']} tokens in {r['seconds']} s; ready in "
                f"{r['ready_s']} s); alone == in the batch for {r['alone_equal']}/{r['alone_checked']} requests")
    REPORT.info["invariance"] = {str(k): v for k, v in runs.items()}
    if len(runs) < 2:
        return "PASS", "only part measured (time budget)"
    ratio = runs[True]["tokens_per_s"] / runs[False]["tokens_per_s"]
    row("invariance", "on / off throughput", f"{ratio:.2f}x", "not a measurement on --cpu-smoke" if small else
        f"{len(workload.prompts)} requests, {sum(map(len, workload.prompts))} prompt tokens, bf16, CUDA graphs")
    return "PASS", f"on / off = {ratio:.2f}x"


# ----------------------------------------------------------------------------- main
def run_stage(name: str, fn) -> str:
    start = time.monotonic()
    try:
        status, detail = fn()
    except Exception as exc:  # noqa: BLE001 - a broken stage is reported, the others still run
        REPORT.log.write(traceback.format_exc())
        traceback.print_exc()
        status, detail = "ERROR", repr(exc)[:500]
    if status not in FAILING and any(r["section"] == name and r["result"] in FAILING for r in REPORT.rows):
        status = "FAIL"
    REPORT.stage(name, status, detail, time.monotonic() - start)
    return status


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.environ.get("OUT"),
                        help="folder for gpu_check.json and the logs (default: $OUT); outside the repository")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help=f"wall-clock budget for the whole check (default {DEFAULT_BUDGET_S})")
    parser.add_argument("--sections", default=",".join(GPU_SECTIONS),
                        help=f"GPU sections to run, comma-separated (default all: {','.join(GPU_SECTIONS)})")
    parser.add_argument("--skip-engine", action="store_true")
    parser.add_argument("--skip-pytest", action="store_true")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="on a CPU: every stage that needs no GPU")
    mode.add_argument("--cpu-smoke", action="store_true", help="on a CPU: all stages, interpreted, tiny shapes")
    parser.add_argument("--tokenizer", help="folder with the SmolLM2 tokenizer files (default .gpu_carry/tokenizer)")
    parser.add_argument("--carry-wheels", action="store_true",
                        help="print name==version of the wheels gpu_check.sh prepare downloads, and exit")
    parser.add_argument("--pytest-child", help=argparse.SUPPRESS)
    parser.add_argument("--import-child", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def import_child(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    hide_modules(spec.get("hide", ()))
    sys.path[0:1] = [str(REPO)]
    if spec.get("map_root"):
        install_root_finder_in_process()
    Path(spec["result"]).write_text(json.dumps(import_sections()))
    return 0


def main(argv=None) -> int:
    global REPORT, CPU_SMOKE, DRY_RUN, DEVICE
    args = parse_args(argv)
    if args.pytest_child:
        return pytest_child(args.pytest_child)
    if args.import_child:
        return import_child(args.import_child)
    if args.carry_wheels:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print("\n".join(f"{dist}=={version(dist)}" for dist, _ in CARRY_WHEELS))
        except PackageNotFoundError as exc:
            print(f"gpu_check: {exc} is not installed here; install it to pin its version", file=sys.stderr)
            return 2
        return 0

    CPU_SMOKE, DRY_RUN = args.cpu_smoke, args.dry_run
    sys.dont_write_bytecode = True  # no __pycache__ in the checkout from this run (children: child_env)
    # Before any inferq.kernels import: triton.jit reads it when a kernel is defined.
    if CPU_SMOKE or DRY_RUN:
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.pop("TRITON_INTERPRET", None)  # compiled kernels only
    if str(REPO) not in sys.path:  # `python scripts/gpu_check.py`: tests/ helpers import from the root
        sys.path.insert(0, str(REPO))

    if not args.out:
        args.out = tempfile.mkdtemp(prefix="gpu_check-")
        print(f"gpu_check: no --out and no $OUT: writing to {args.out}", flush=True)
    out_dir = Path(args.out).resolve()
    if out_dir == REPO or REPO in out_dir.parents:
        print(f"gpu_check: --out {out_dir} is inside the repository; give a folder outside it ($OUT)", file=sys.stderr)
        return 2
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - set(GPU_SECTIONS)
    if unknown:
        print(f"gpu_check: unknown sections {sorted(unknown)}; choose from {list(GPU_SECTIONS)}", file=sys.stderr)
        return 2
    if args.skip_engine and "engine" in sections:
        sections.remove("engine")
    if args.skip_pytest and "pytest" in sections:
        sections.remove("pytest")

    out_dir.mkdir(parents=True, exist_ok=True)
    mode = "dry-run" if DRY_RUN else "cpu-smoke" if CPU_SMOKE else "gpu"
    budget = Budget(args.budget_s)
    REPORT = Report(out_dir, mode, args.budget_s)
    REPORT.info["argv"] = sys.argv[1:]
    # A hung CUDA call cannot be interrupted: past the budget, dump the stacks and end, so the device
    # tool's timeout is never what stops the run (gpu_check.json is already on disk).
    faulthandler.dump_traceback_later(args.budget_s + GRACE_S, exit=True)
    REPORT.say(f"gpu_check {mode}: budget {args.budget_s:.0f} s, out {out_dir}, python {sys.version.split()[0]}")

    blocked = ""
    if DRY_RUN:
        start_dry_run_children()
    if run_stage("compiler", stage_compiler) in FAILING and not (DRY_RUN or CPU_SMOKE):
        blocked = "no working C compiler (see the compiler stage): Triton cannot build its launcher"
    if run_stage("device", stage_device) in FAILING and not blocked:
        blocked = "no GPU (see the device stage)"
    may_install = not (blocked or DRY_RUN or CPU_SMOKE)
    if run_stage("import-root", lambda: stage_import_root(may_install)) in FAILING and not blocked:
        blocked = "inferq.* is not importable (see the import-root stage)"
    run_stage("carried", stage_carried)
    run_stage("budget", lambda: stage_budget(budget))
    if not blocked:
        from importlib.metadata import PackageNotFoundError, version

        def version_of(dist: str) -> str:
            try:
                return version(dist)
            except PackageNotFoundError:
                return "not installed"

        REPORT.info["versions"] = {"python": sys.version.split()[0], "torch": version_of("torch"),
                                   "triton": version_of("triton")}
        REPORT.say(f"[device] versions: {REPORT.info['versions']}")
        if not DRY_RUN:
            import torch

            DEVICE = torch.device("cpu" if CPU_SMOKE else "cuda")
    run_stage("imports", stage_imports if not blocked else lambda: ("SKIPPED", blocked))
    run_stage("pytest-collect", stage_pytest_collect if not blocked else lambda: ("SKIPPED", blocked))

    section_fns = {
        "kernels": check_kernels,
        "decode": time_decode,
        "engine": lambda deadline: run_engine_benchmark(deadline, args.tokenizer),
        "invariance": lambda deadline: measure_batch_invariance(deadline, args.tokenizer),
        "pytest": run_pytest,
    }
    for name in GPU_SECTIONS:
        remaining = [s for s in GPU_SECTIONS if s in sections and GPU_SECTIONS.index(s) >= GPU_SECTIONS.index(name)]
        if DRY_RUN:
            run_stage(name, lambda: ("SKIPPED", "dry run: needs a GPU"))
        elif blocked:
            run_stage(name, lambda: ("SKIPPED", blocked))
        elif name not in sections:
            run_stage(name, lambda: ("SKIPPED", "not selected (--sections / --skip-*)"))
        else:
            deadline = budget.section_deadline(name, remaining)
            run_stage(name, lambda fn=section_fns[name], d=deadline: fn(d))

    def stage_output() -> tuple[str, str]:
        REPORT.write()
        doc = json.loads((out_dir / "gpu_check.json").read_text())
        names = sorted(p.name for p in out_dir.iterdir() if p.is_file())
        if len(doc["stages"]) != len(STAGES) - 1:
            return "FAIL", f"gpu_check.json lists {len(doc['stages'])} stages before this one"
        return "PASS", f"{out_dir}: {', '.join(names)}"

    run_stage("output", stage_output)
    faulthandler.cancel_dump_traceback_later()
    REPORT.table()
    ok = REPORT.ok()
    REPORT.say(f"gpu_check {mode}: {'OK' if ok else 'FAILED'} in {args.budget_s - budget.left():.0f} s; "
               f"{out_dir / 'gpu_check.json'}")
    REPORT.log.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
