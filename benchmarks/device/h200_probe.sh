#!/usr/bin/env bash
# Diagnostic: the raw SSE lines `transformers serve` sends for one chat request, with arrival
# times, to check what the harness counts as the first token.
set -euo pipefail
OUT=${OUT:-/tmp/out}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p ~/.cache/huggingface/hub "$OUT"
MODEL=/tmp/qwen3-8b-random
[ -f "$MODEL/config.json" ] || python3 benchmarks/device/make_random_qwen3.py "$MODEL"
PORT=8765
setsid transformers serve "$MODEL" --continuous-batching --dtype bfloat16 \
    --host 127.0.0.1 --port $PORT > "$OUT/engine.log" 2>&1 &
SERVER=$!
trap 'kill -INT -$SERVER 2>/dev/null || true; sleep 2; kill -9 -$SERVER 2>/dev/null || true' EXIT
for i in $(seq 1 240); do
  python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null && break
  sleep 1
done
python3 - "$MODEL" <<'PY' | tee "$OUT/probe.txt"
import json, sys, time, urllib.request
model = sys.argv[1]
for prompt_words in (20, 600):
    body = {"model": model, "stream": True, "max_tokens": 8,
            "messages": [{"role": "user", "content": "word " * prompt_words}],
            "stream_options": {"include_usage": True}}
    req = urllib.request.Request("http://127.0.0.1:8765/v1/chat/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=60) as resp:
        for line in resp:
            line = line.strip()
            if line:
                print(f"{(time.monotonic() - t0) * 1000:8.1f} ms  {line[:300].decode()}")
PY
