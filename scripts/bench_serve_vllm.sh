#!/usr/bin/env bash
# Serving benchmark: inferq through Redis (producer SDK) vs `vllm serve` (OpenAI HTTP),
# same model folder, same dtype, same arrivals, one server at a time on this machine,
# alternating rounds so machine noise hits both alike. vLLM runs from its own venv
# (scripts/setup_vllm_peer.sh); it is never a dependency of inferq.
#
#   scripts/bench_serve_vllm.sh [ROUNDS]        (default 2)
#
# Environment: VLLM_PYTHON (default $INFERQ_VLLM_PYTHON or ~/.venvs/inferq-vllm-peer/bin/python),
# MODEL_DIR (default: the bundled SmolLM2 converted to an HF folder, as bench offline uses),
# OUT (result folder, default bench-serve-vllm), and the workload: NUM_PROMPTS (64),
# INPUT_LEN (128), OUTPUT_LEN (64), RATE (4), DTYPE (bfloat16), KV_GIB (2); WORKER_THREADS
# (default: the worker's own, all cores but one, as vLLM keeps one core for its front end).
set -euo pipefail
ROUNDS="${1:-2}"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$HERE/.venv/bin/python}"
VLLM_PYTHON="${VLLM_PYTHON:-${INFERQ_VLLM_PYTHON:-$HOME/.venvs/inferq-vllm-peer/bin/python}}"
OUT="${OUT:-bench-serve-vllm}"
NUM_PROMPTS="${NUM_PROMPTS:-64}" INPUT_LEN="${INPUT_LEN:-128}" OUTPUT_LEN="${OUTPUT_LEN:-64}"
RATE="${RATE:-4}" DTYPE="${DTYPE:-bfloat16}" KV_GIB="${KV_GIB:-2}" NAME=smollm2
MODEL_DIR="${MODEL_DIR:-$("$PY" -c 'from inferq.gpuworker.models.loader import resolve_model_folder; print(resolve_model_folder(None)[0])')}"
mkdir -p "$OUT"
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_http() {  # URL PID: until it answers, or the process died
  for _ in $(seq 1 900); do
    curl -sf "$1" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || { echo "server exited; see $OUT/*.log" >&2; return 1; }
    sleep 1
  done
  return 1
}
stop() { kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }
BENCH=(--model "$NAME" --num-prompts "$NUM_PROMPTS" --random-input-len "$INPUT_LEN"
       --random-output-len "$OUTPUT_LEN" --request-rate "$RATE" --num-warmups 2 --seed 0
       --percentiles 50,90,99 --no-progress --no-figure)

for round in $(seq 1 "$ROUNDS"); do
  # vLLM: its OpenAI server, through `inferq bench serve --backend http`.
  port=$(free_port)
  VLLM_CPU_KVCACHE_SPACE="$KV_GIB" "$VLLM_PYTHON" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL_DIR" --served-model-name "$NAME" --dtype "$DTYPE" --port "$port" \
    >"$OUT/vllm-$round.log" 2>&1 &
  pid=$!
  wait_http "http://127.0.0.1:$port/v1/models" "$pid"
  "$PY" -m inferq.cli bench serve --backend http --base-url "http://127.0.0.1:$port" "${BENCH[@]}" \
    --result-file "$OUT/vllm-$round.json" | tee "$OUT/vllm-$round.txt"
  stop "$pid"

  # inferq: a private redis-server and one worker, through `--backend redis`.
  rport=$(free_port)
  redis-server --port "$rport" --save '' --appendonly no >"$OUT/redis-$round.log" 2>&1 &
  rpid=$!
  export INFERQ_REDIS_URL="redis://127.0.0.1:$rport/0"
  "$PY" -m inferq.gpuworker.service ${WORKER_THREADS:+--torch-threads "$WORKER_THREADS"} --model "$MODEL_DIR" --served-model-name "$NAME" \
    --dtype "$DTYPE" --metrics-port 0 >"$OUT/inferq-$round.log" 2>&1 &
  wpid=$!
  until "$PY" -c "import sys; from inferq.producer import Producer; sys.exit(0 if Producer(default_model='$NAME').workers() else 1)" 2>/dev/null; do
    kill -0 "$wpid" 2>/dev/null || { echo "worker exited; see $OUT/inferq-$round.log" >&2; exit 1; }
    sleep 1
  done
  "$PY" -m inferq.cli bench serve --backend redis "${BENCH[@]}" --result-file "$OUT/inferq-$round.json" \
    | tee "$OUT/inferq-$round.txt"
  stop "$wpid"
  stop "$rpid"
  unset INFERQ_REDIS_URL
done
