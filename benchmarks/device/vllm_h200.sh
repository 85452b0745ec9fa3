#!/usr/bin/env bash
# chatfleet against a real vLLM 0.26.0 on the H200 machine (issue 13; the power phases of issue
# 12). Run from the repository root on the device machine, after the three ferry steps
# (docs/device/vllm.md), one or more steps a run:
#   bash benchmarks/device/vllm_h200.sh up power l4pool     # run 3 (with .ferry3 carried)
#   bash benchmarks/device/vllm_h200.sh full gateway        # run 4, the machine still warm
# Steps:
#   up       build the random-weight Qwen3-8B (bf16) and start three vLLM processes (setsid: they
#            outlive the run while the machine stays warm): A :8001 with an L4-sized KV pool
#            (3,552,804,864 bytes: 24,080 tokens), B :8002 and C :8003 with 20 GiB each, each
#            pinned to 4 cores of its own (A 0-3, B 4-7, C 8-11; the client 12-15): in eager
#            mode vLLM is bound by its host, and engines that shared 12 cores ran steps of 25 or
#            47 ms at the same batch (the runs of 2026-12-03)
#   power    NVML power by phase on B: a prefill-bound load (4,000-token prompts, 2 tokens out)
#            and a decode-bound one (64-token prompts, 1,024 out), and the idle card
#   l4pool   the pool-bound regime on A: fixed 512/128, no shared prompt, $L4POOL_GRID users
#            (1,4,16,32,64; a later call with another grid adds to the same sweep: --resume)
#   full     B: the 2,048-token shared prompt, uniform lengths, $FULL_GRID users and $FULL_RATES
#            rps (also resumable)
#   gateway  chatfleet gateway over B and C (cap 16 each), 4-turn sessions, affinity on and off,
#            the replicas' own gauges sampled
#   GRAPHS=1 before `up`: A and B run vLLM's default CUDA graphs (no --enforce-eager;
#            torch.compile) and C is not started, so `l4pool` and `full` measure what users run
#            (the runs of 2026-12-03's second session; `promise` and `gateway` need C)
#   graphs   stop A and start D :8004 on A's cores with vLLM's default CUDA graphs (no
#            --enforce-eager; torch.compile), 20 GiB, then the full step's workload at
#            $GRAPHS_GRID users: whether this build runs what users run, and its step time
# Every step packs its results into $OUT/<step>.tgz as soon as it ends (a run cut off at its
# limit keeps the finished steps), with host.jsonl: the host's CPUs (busy, steal) and the vLLM
# processes' CPU every second during the step (host_sampler.py). Windows are $DUR s (45 by
# default) after a $WARM-s warm-up (8). These are H200 figures of vLLM with Triton attention in eager
# mode, never L4 figures.
# SIM=1 runs the same steps here, without a GPU, against simservers (a dry run of the script:
# no model, no NVML, the power step skipped).
set -uo pipefail
SIM=${SIM:-0}
ENGINE=vllm; TELEMETRY=nvml; FLUSH_PATH=/reset_prefix_cache
CLIENT_CPUS=12-15; CPUS_A=0-3; CPUS_B=4-7; CPUS_C=8-11
[ "$SIM" = 1 ] && { ENGINE=simserver; TELEMETRY=simserver; FLUSH_PATH=/flush_cache
                    CLIENT_CPUS=0-1; CPUS_A=0-1; CPUS_B=0-1; CPUS_C=0-1; }
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 \
  VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_SERVER_DEV_MODE=1
MODEL=/tmp/qwen3-8b-random
WORK=${WORK:-/tmp/cf}
mkdir -p "$WORK" ~/.cache/huggingface/hub
cf() { taskset -c $CLIENT_CPUS python3 -c 'from chatfleet.cli import main; main()' "$@"; }
health() { python3 -c "import urllib.request; urllib.request.urlopen('$1/health', timeout=2)" 2>/dev/null; }
wait_up() {
  for i in $(seq 1 240); do
    local all=1
    for u in "$@"; do health "$u" || all=0; done
    [ $all = 1 ] && { echo "up after ${i}s: $*"; return 0; }
    sleep 1
  done
  echo "not up: $*"; tail -30 $WORK/vllm-*.log; return 1
}
pack() { tar -czf "$OUT/$1.tgz" -C "$WORK" "$1" && echo "packed $1: $(du -h "$OUT/$1.tgz" | cut -f1)"; }
# the host's CPUs while a step runs: host_sampler DIR starts it, host_sampler_stop ends it
host_sampler() {
  mkdir -p "$1"
  python3 benchmarks/device/host_sampler.py --out "$1/host-$(date +%H%M%S).jsonl" \
    --match "${HOST_MATCH:-vllm}" --seconds 900 < /dev/null > /dev/null 2>&1 &
  SAMPLER=$!
}
host_sampler_stop() { kill -INT $SAMPLER 2>/dev/null; wait $SAMPLER 2>/dev/null; }
COMMON=(--model qwen3-8b --gpu h200 --weights bf16 --kv-cache bf16 --telemetry $TELEMETRY
        --clock-floor 1000 --duration ${DUR:-45} --warmup ${WARM:-8} --drain 60)

vllm_start() {  # name port kv_bytes cpus
  if [ "$SIM" = 1 ]; then
    setsid python3 -c 'from chatfleet.cli import main; main()' simserver --port "$2" \
      --weights bf16 --kv-cache bf16 --pool-tokens $(( $3 / 147456 )) --time-scale 4 \
      > "$WORK/vllm-$1.log" 2>&1 < /dev/null &
    return
  fi
  local eager=--enforce-eager; [ "${GRAPHS:-0}" = 1 ] && eager=
  setsid taskset -c "$4" python3 -m vllm.entrypoints.openai.api_server --model $MODEL \
    --served-model-name qwen3-8b --host 127.0.0.1 --port "$2" $eager \
    --attention-backend TRITON_ATTN --max-model-len 8192 --enable-prefix-caching \
    --enable-prompt-tokens-details --gpu-memory-utilization 0.3 --kv-cache-memory "$3" \
    > "$WORK/vllm-$1.log" 2>&1 < /dev/null &
}

step_up() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,power.limit --format=csv | tee "$WORK/gpu.txt"
  [ "$SIM" = 1 ] || [ -f "$MODEL/config.json" ] || python3 benchmarks/device/make_random_qwen3.py "$MODEL"
  vllm_start A 8001 3552804864 $CPUS_A
  vllm_start B 8002 21474836480 $CPUS_B
  local ports="8001 8002 8003"
  if [ "${GRAPHS:-0}" = 1 ]; then ports="8001 8002"; else vllm_start C 8003 21474836480 $CPUS_C; fi
  wait_up $(for p in $ports; do echo http://127.0.0.1:$p; done) || return 1
  grep -h "GPU KV cache size" $WORK/vllm-*.log
  # compile the Triton kernels before anything is measured (short and long prompts, batches)
  for port in $ports; do
    cf sweep --target http://127.0.0.1:$port --engine $ENGINE "${COMMON[@]}" --concurrency 8 \
      --lengths uniform --input-len 1024 --output-len 64 --range-ratio 0.9 --range-convention vllm \
      --duration 6 --warmup 0 --drain 30 --no-flush --out $WORK/warm-$port >/dev/null 2>&1
  done
  echo "warmed"
}

# step promise (issue 23), about 5 minutes: the gateway over B and C (cap 16 each) with its
# default config (each replica's prefill reserve learned) at 1.5x and 3x the fleet's cap (48
# and 96 users, 4-turn sessions on the shared prompt, 30 s windows); then 8-turn sessions with
# long answers (history past the shared prompt) at 40 users, affinity off, on (spill when
# waiting costs more than recomputing: `cost`) and strict (`never`); AFFINITY_MODES="off cost
# full never" adds bounded-load spill. Results: $OUT/promise.tgz (docs/device/README.md).
gw_start() {  # name [config file]: the gateway over B and C, cap 16 each, on :8080
  local cfg=(); [ -n "${2:-}" ] && cfg=(--config "$2")
  setsid taskset -c $CLIENT_CPUS python3 -c 'from chatfleet.cli import main; main()' gateway \
    --replica http://127.0.0.1:8002 --replica http://127.0.0.1:8003 --cap 16 --queue-depth 64 \
    --port 8080 "${cfg[@]}" > $WORK/promise/gateway-$1.log 2>&1 < /dev/null &
  GW=$!
  wait_up http://127.0.0.1:8080 || { kill -9 -$GW 2>/dev/null; return 1; }
  python3 benchmarks/device/replica_sampler.py --engine $ENGINE --url http://127.0.0.1:8002 \
    --url http://127.0.0.1:8003 --seconds 400 --out $WORK/promise/samples-$1.jsonl \
    --summary $WORK/promise/replicas-$1.json > /dev/null &
  SMP=$!
}
gw_stop() {  # name: the gateway's metrics (its learned reserves, routes, sheds), then stop
  kill -INT $SMP; wait $SMP
  curl -s http://127.0.0.1:8080/metrics > $WORK/promise/gateway-metrics-$1.txt
  grep -E '^chatfleet_gateway_(prefill_reserve_seconds|routes_total|shed_total)' \
    $WORK/promise/gateway-metrics-$1.txt | tr '\n' ' '; echo
  kill -INT -$GW 2>/dev/null; sleep 2; kill -9 -$GW 2>/dev/null
  echo "$1: $(tr -d '\n ' < $WORK/promise/replicas-$1.json)"
}
flush_bc() {
  for port in 8002 8003; do
    curl -s -X POST http://127.0.0.1:$port$FLUSH_PATH -o /dev/null -w "flush $port: %{http_code}\n"
  done
}

step_promise() {
  mkdir -p $WORK/promise
  host_sampler $WORK/promise
  # the shared prompt is on every replica; a spill is priced on the H200's (uncalibrated) model
  local routing='  shared_prefix_tokens: 2048\n  gpu: h200\n  weights: bf16\n  kv_cache: bf16\n'
  printf "routing:\n$routing" > $WORK/promise/learned.yaml
  # item 1: the default config (reserve learned, prefill_reserve_s 0 its prior), 1.5x and 3x
  flush_bc
  if gw_start learned $WORK/promise/learned.yaml; then
    cf sweep --target http://127.0.0.1:8080 --engine $ENGINE "${COMMON[@]}" --no-flush \
      --concurrency 48,96 --turns 4 --lengths uniform --input-len 256 --output-len 128 \
      --range-ratio 0.5 --range-convention vllm --system-prompt-tokens 2048 --duration 30 \
      --warmup 5 --drain 30 --out $WORK/promise/sweep-learned | tail -7
    gw_stop learned
  fi
  # item 3: 8 turns, long answers (192 in / 256 out, range ratio 0.5: up to 7,400 tokens with
  # the template by the 8th turn, within --max-model-len 8192), 40 users (1.25x the cap)
  for mode in ${AFFINITY_MODES:-off cost never}; do
    case $mode in
      off) printf "routing:\n$routing  affinity: false\n" ;;
      cost) printf "routing:\n$routing" ;;
      *) printf "routing:\n$routing  spill: $mode\n" ;;
    esac > $WORK/promise/affinity-$mode.yaml
    flush_bc
    gw_start affinity-$mode $WORK/promise/affinity-$mode.yaml || continue
    cf sweep --target http://127.0.0.1:8080 --engine $ENGINE "${COMMON[@]}" --no-flush \
      --concurrency 40 --turns 8 --lengths uniform --input-len 192 --output-len 256 \
      --range-ratio 0.5 --range-convention vllm --system-prompt-tokens 2048 --duration 30 \
      --warmup 25 --drain 30 --out $WORK/promise/sweep-affinity-$mode | tail -6
    gw_stop affinity-$mode
  done
  host_sampler_stop
  pack promise
}

step_power() {
  [ "$SIM" = 1 ] && { echo "power: skipped (SIM)"; return 0; }
  mkdir -p $WORK/power
  python3 - > $WORK/power/idle.json <<'EOF'
import json, time, statistics, pynvml as nv
nv.nvmlInit(); h = nv.nvmlDeviceGetHandleByIndex(0); p = []; c = []
for _ in range(50):
    p.append(nv.nvmlDeviceGetPowerUsage(h) / 1000); c.append(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)); time.sleep(0.1)
print(json.dumps({"power_w_p50": statistics.median(p), "sm_mhz_p50": statistics.median(c),
                  "power_limit_w": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000}))
EOF
  cat $WORK/power/idle.json
  cf sweep --target http://127.0.0.1:8002 --engine $ENGINE "${COMMON[@]}" --engine-log $WORK/vllm-B.log \
    --concurrency 48 --lengths fixed --input-len 4000 --output-len 2 --system-prompt-tokens 0 \
    --duration 25 --warmup 5 --drain 20 --out $WORK/power/prefill | tail -4
  cf sweep --target http://127.0.0.1:8002 --engine $ENGINE "${COMMON[@]}" --engine-log $WORK/vllm-B.log \
    --concurrency 128 --lengths fixed --input-len 64 --output-len 1024 --system-prompt-tokens 0 \
    --duration 25 --warmup 8 --drain 1 --out $WORK/power/decode | tail -4
  pack power
}

resume() { [ -f "$1/runs.jsonl" ] && echo --resume; }

step_l4pool() {
  host_sampler $WORK/l4pool
  cf sweep --target http://127.0.0.1:8001 --engine $ENGINE "${COMMON[@]}" --engine-log $WORK/vllm-A.log \
    --concurrency ${L4POOL_GRID:-1,4,16,32,64} --lengths fixed --input-len 512 --output-len 128 \
    --system-prompt-tokens 0 --out $WORK/l4pool $(resume $WORK/l4pool) | tail -14
  host_sampler_stop
  cp $WORK/vllm-A.log $WORK/l4pool/engine.log
  pack l4pool
}

step_full() {
  host_sampler $WORK/full
  local rates=${FULL_RATES-6,12,24}
  cf sweep --target http://127.0.0.1:8002 --engine $ENGINE "${COMMON[@]}" --engine-log $WORK/vllm-B.log \
    --concurrency ${FULL_GRID:-4,16,64,128} ${rates:+--rate $rates} --lengths uniform --input-len 512 \
    --output-len 128 --range-ratio 0.5 --range-convention vllm --system-prompt-tokens 2048 \
    --out $WORK/full $(resume $WORK/full) | tail -16
  host_sampler_stop
  cp $WORK/vllm-B.log $WORK/full/engine.log
  pack full
}

step_gateway() {
  mkdir -p $WORK/gateway
  printf 'routing:\n  affinity: false\n' > $WORK/gateway/no-affinity.yaml
  for mode in affinity no-affinity; do
    for port in 8002 8003; do
      curl -s -X POST http://127.0.0.1:$port$FLUSH_PATH -o /dev/null -w "flush $port: %{http_code}\n"
    done
    cfg=(); [ $mode = no-affinity ] && cfg=(--config $WORK/gateway/no-affinity.yaml)
    setsid taskset -c $CLIENT_CPUS python3 -c 'from chatfleet.cli import main; main()' gateway \
      --replica http://127.0.0.1:8002 --replica http://127.0.0.1:8003 --cap 16 --queue-depth 64 \
      --port 8080 "${cfg[@]}" > $WORK/gateway/gateway-$mode.log 2>&1 < /dev/null &
    local gw=$!
    wait_up http://127.0.0.1:8080 || { kill $gw; continue; }
    python3 benchmarks/device/replica_sampler.py --engine $ENGINE --url http://127.0.0.1:8002 \
      --url http://127.0.0.1:8003 --seconds 300 --out $WORK/gateway/samples-$mode.jsonl \
      --summary $WORK/gateway/replicas-$mode.json > /dev/null &
    local smp=$!
    cf sweep --target http://127.0.0.1:8080 --engine $ENGINE "${COMMON[@]}" --no-flush \
      --concurrency 48 --turns 4 --lengths uniform --input-len 256 --output-len 128 \
      --range-ratio 0.5 --range-convention vllm --system-prompt-tokens 2048 --duration 30 \
      --warmup 5 --out $WORK/gateway/sweep-$mode | tail -5
    kill -INT $smp; wait $smp
    curl -s http://127.0.0.1:8080/metrics > $WORK/gateway/gateway-metrics-$mode.txt
    kill -INT -$gw 2>/dev/null; sleep 2; kill -9 -$gw 2>/dev/null
    echo "$mode: $(cat $WORK/gateway/replicas-$mode.json | tr -d '\n ')"
  done
  pack gateway
}

step_graphs() {
  mkdir -p $WORK/graphs
  [ "$SIM" = 1 ] || pkill -f -- "--port 8001" || true
  sleep 2
  if [ "$SIM" = 1 ]; then
    vllm_start D 8004 21474836480 $CPUS_A
  else
    setsid taskset -c $CPUS_A python3 -m vllm.entrypoints.openai.api_server --model $MODEL \
      --served-model-name qwen3-8b --host 127.0.0.1 --port 8004 \
      --attention-backend TRITON_ATTN --max-model-len 8192 --enable-prefix-caching \
      --enable-prompt-tokens-details --gpu-memory-utilization 0.3 --kv-cache-memory 21474836480 \
      > "$WORK/vllm-D.log" 2>&1 < /dev/null &
  fi
  local up=0
  for i in $(seq 1 ${GRAPHS_WAIT:-200}); do
    health http://127.0.0.1:8004 && { up=1; echo "D up after ${i}s (CUDA graphs)"; break; }
    pgrep -f -- "--port 8004" > /dev/null || { echo "D exited"; break; }
    sleep 1
  done
  if [ $up = 0 ]; then
    tail -20 $WORK/vllm-D.log; cp $WORK/vllm-D.log $WORK/graphs/engine.log; pack graphs; return 1
  fi
  cf sweep --target http://127.0.0.1:8004 --engine $ENGINE "${COMMON[@]}" --no-flush \
    --concurrency 8 --lengths uniform --input-len 1024 --output-len 64 --range-ratio 0.9 \
    --range-convention vllm --duration 6 --warmup 0 --drain 30 --out $WORK/warm-8004 >/dev/null 2>&1
  host_sampler $WORK/graphs
  cf sweep --target http://127.0.0.1:8004 --engine $ENGINE "${COMMON[@]}" --engine-log $WORK/vllm-D.log \
    --concurrency ${GRAPHS_GRID:-1,16,64} --lengths uniform --input-len 512 \
    --output-len 128 --range-ratio 0.5 --range-convention vllm --system-prompt-tokens 2048 \
    --out $WORK/graphs/sweep $(resume $WORK/graphs/sweep) | tail -8
  host_sampler_stop
  cp $WORK/vllm-D.log $WORK/graphs/engine.log
  pack graphs
}

for step in "$@"; do
  echo "== $step $(date +%T)"
  "step_$step" || echo "step $step failed"
done
cp $WORK/vllm-*.log "$OUT/" 2>/dev/null || true
echo "== done $(date +%T)"
