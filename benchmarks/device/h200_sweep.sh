#!/usr/bin/env bash
# The live harness on a real GPU: a sweep against `transformers serve` (continuous batching)
# with a random-weight Qwen3-8B-shaped model, the real Qwen3 tokenizer and NVML telemetry.
# Run on the device machine (an H200) from the repository root, with .whl carried:
#   bash benchmarks/device/h200_sweep.sh
# Results land in $OUT/sweep (sweep.json, runs.jsonl, per-run telemetry). These are H200
# figures of a reference engine (bound by Python overhead, not the GPU), never L4 figures.
set -euo pipefail
OUT=${OUT:-/tmp/out}
CONCURRENCY=${CONCURRENCY:-1,2,4,8,16}
DURATION=${DURATION:-40}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
mkdir -p ~/.cache/huggingface/hub "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
MODEL=/tmp/qwen3-8b-random
[ -f "$MODEL/config.json" ] || python3 benchmarks/device/make_random_qwen3.py "$MODEL"
PORT=8765
setsid transformers serve "$MODEL" --continuous-batching --dtype bfloat16 \
    --host 127.0.0.1 --port $PORT > "$OUT/engine.log" 2>&1 &
SERVER=$!
trap 'kill -INT -$SERVER 2>/dev/null || true; sleep 2; kill -9 -$SERVER 2>/dev/null || true' EXIT
health() { python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; }
for i in $(seq 1 240); do
  if health; then echo "engine up after ${i}s"; break; fi
  sleep 1
done
health || { echo "engine did not come up"; tail -50 "$OUT/engine.log"; exit 1; }
python3 -c "from chatfleet.cli import main; main()" sweep \
    --target "http://127.0.0.1:$PORT" --engine openai --model "$MODEL" \
    --gpu h200 --weights bf16 --kv-cache bf16 --engine-log "$OUT/engine.log" \
    --concurrency "$CONCURRENCY" --lengths uniform --input-len 256 --output-len 64 \
    --range-ratio 0.5 --range-convention vllm --system-prompt-tokens 512 \
    --duration "$DURATION" --warmup 10 --drain 120 --no-flush \
    --telemetry nvml --clock-floor 1000 --cooldown-temp 60 --cooldown-max 60 \
    --out "$OUT/sweep" 2>&1 | tee "$OUT/sweep.log"
# the device returns at most 8 files, 2 folders deep: pack the sweep directory
tar -czf "$OUT/h200-sweep.tgz" -C "$OUT" sweep && rm -rf "$OUT/sweep"
