#!/usr/bin/env bash
# Gateway (OpenAI HTTP) vs SDK (Redis) on one `inferq up`, the issue's serving workload (64
# prompts of 128 random token ids, 64 out, 4 req/s): 6 runs alternating gateway, SDK, ...,
# a fresh dataset file per run so no run hits the prefix cache another run filled.
#   scripts/bench_gateway_vs_sdk.sh [OUT]        (default bench-gateway-vs-sdk)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-bench-gateway-vs-sdk}"; mkdir -p "$OUT"; rm -rf /tmp/gwdata
PY=.venv/bin/python
OMP_NUM_THREADS=1 .venv/bin/inferq up --served-model-name smollm2 --port 8131 --redis-port 6391 --metrics-port 9431 --data-dir /tmp/gwdata > $OUT/up.log 2>&1 &
UP=$!
for _ in $(seq 1 300); do curl -sf http://127.0.0.1:8131/v1/models >/dev/null 2>&1 && break; sleep 1; done
for K in 1 2 3 4 5 6; do
  $PY -c "
import json, random
rng = random.Random($K * 7919)
with open('$OUT/ds-$K.jsonl', 'w') as f:
    for _ in range(64):
        f.write(json.dumps({'prompt_token_ids': [rng.randint(1000, 49151) for _ in range(128)], 'max_tokens': 64}) + '\n')
"
  if [ $((K % 2)) = 1 ]; then B=(--backend http --base-url http://127.0.0.1:8131); name=gateway; else B=(--backend redis --redis-url "redis://:$(cat /tmp/gwdata/redis/password)@127.0.0.1:6391/0"); name=sdk; fi
  .venv/bin/inferq bench serve "${B[@]}" --model smollm2 --dataset jsonl --dataset-path $OUT/ds-$K.jsonl --num-prompts 64 \
    --request-rate 4 --num-warmups 2 --seed 0 --percentiles 50,90,99 --no-progress --no-figure --result-file "$OUT/$name-$K.json" > "$OUT/$name-$K.txt" 2>&1
  echo "$name $K: $(grep 'Output token throughput' $OUT/$name-$K.txt | awk '{print $NF}') tok/s, median TTFT $(grep 'Median TTFT' $OUT/$name-$K.txt | awk '{print $NF}') ms"
done
kill -INT $UP; wait $UP || true
