#!/usr/bin/env bash
# OpenAI-compatible HTTP in front of N reference servers:
#
#   bash scripts/serve-openai.sh [N]        # N replicas (default 1); Ctrl-C stops everything
#
# Installs everything (scripts/setup.sh; the smg gateway is pinned in pyproject.toml and comes
# from PyPI), starts N lmrpc-server replicas on the embedded SmolLM2-135M-Instruct, starts
# `smg launch` in front of them with cache-aware routing (smg speaks their vLLM dialect, fetches
# the tokenizer from them and follows their KV-cache events), and prints the OpenAI base URL.
#
# Environment: SMG_PORT (HTTP, default 8000), LMRPC_PORT (first replica's gRPC port, default
# 50051; replica i listens on LMRPC_PORT+i), LMRPC_METRICS_PORT (first replica's Prometheus
# port, default 9100), SMG_METRICS_PORT (default 29000), LMRPC_ENGINE (model | fake),
# LMRPC_RUN_DIR (logs, default run/openai), LMRPC_SKIP_SETUP=1 (the venv is ready).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1}
[[ "$N" =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [N]  (N >= 1 replicas)" >&2; exit 2; }
SMG_PORT=${SMG_PORT:-8000}
LMRPC_PORT=${LMRPC_PORT:-50051}
LMRPC_METRICS_PORT=${LMRPC_METRICS_PORT:-9100}
SMG_METRICS_PORT=${SMG_METRICS_PORT:-29000}
ENGINE=${LMRPC_ENGINE:-model}
RUN=${LMRPC_RUN_DIR:-run/openai}

if [ "${LMRPC_SKIP_SETUP:-}" != "1" ]; then
  bash scripts/setup.sh
  SMG_PIN=$(grep -o '"smg==[0-9][0-9.]*"' pyproject.toml | tr -d '"')
  .venv/bin/python -m pip install --quiet "$SMG_PIN"  # already there after setup.sh: a check
fi
mkdir -p "$RUN"

PIDS=()
stop_all() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_all EXIT
trap 'exit 130' INT TERM

WORKERS=()
for ((i = 0; i < N; i++)); do
  port=$((LMRPC_PORT + i))
  rm -f "$RUN/replica-$i.ready"
  # one torch thread per replica when several share the machine's cores
  threads=()
  if ((N > 1)); then threads=(--threads 1); fi
  .venv/bin/lmrpc-server --engine "$ENGINE" --no-embedding "${threads[@]}" --port "$port" \
    --metrics-port $((LMRPC_METRICS_PORT + i)) --ready-file "$RUN/replica-$i.ready" \
    >"$RUN/replica-$i.log" 2>&1 &
  PIDS+=($!)
  WORKERS+=("grpc://127.0.0.1:$port")
done
for ((i = 0; i < N; i++)); do
  for _ in $(seq 1 1500); do
    [ -s "$RUN/replica-$i.ready" ] && break
    kill -0 "${PIDS[$i]}" 2>/dev/null || { echo "replica $i failed:" >&2; cat "$RUN/replica-$i.log" >&2; exit 3; }
    sleep 0.2
  done
  [ -s "$RUN/replica-$i.ready" ] || { echo "replica $i did not start" >&2; cat "$RUN/replica-$i.log" >&2; exit 3; }
  echo "replica $i: lmrpc.v1 + vLLM dialect on 127.0.0.1:$((LMRPC_PORT + i)), metrics on :$((LMRPC_METRICS_PORT + i))"
done

.venv/bin/smg launch --host 127.0.0.1 --port "$SMG_PORT" --worker-urls "${WORKERS[@]}" \
  --policy cache_aware --prometheus-host 127.0.0.1 --prometheus-port "$SMG_METRICS_PORT" \
  >"$RUN/smg.log" 2>&1 &
PIDS+=($!)
MODEL=$(.venv/bin/python - "$SMG_PORT" "${PIDS[-1]}" <<'EOF'
import json, os, sys, time, urllib.request

port, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("smg exited")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as response:
            models = [m["id"] for m in json.load(response)["data"]]
        if models:
            body = json.dumps({"model": models[0], "prompt": "ready?"}).encode()
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/v1/tokenize", body, {"content-type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=2):
                print(models[0])
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.2)
sys.exit("smg not ready after 120 s")
EOF
) || { echo "smg did not start:" >&2; cat "$RUN/smg.log" >&2; exit 3; }

cat <<EOF
smg (cache-aware routing over $N replica(s)), metrics on :$SMG_METRICS_PORT, logs in $RUN/
OpenAI base URL: http://127.0.0.1:$SMG_PORT/v1   model: $MODEL
Try: .venv/bin/python -c "from openai import OpenAI; print(OpenAI(base_url='http://127.0.0.1:$SMG_PORT/v1', api_key='none').chat.completions.create(model='$MODEL', messages=[{'role': 'user', 'content': 'What is the capital of France?'}], temperature=0).choices[0].message.content)"
Ctrl-C stops smg and the replicas.
EOF
wait "${PIDS[-1]}"
