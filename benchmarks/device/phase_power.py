"""Power by phase on a real GPU (NVML), with Qwen3-8B's own weight shapes: what a decode step
(every weight matrix streamed once for a small batch: memory-bound) and a prefill step (the same
matrices against thousands of tokens: compute-bound) draw, against the idle card.

Each phase runs back to back for --seconds while a thread samples NVML every 50 ms; the table
gives each phase's median power and SM clock, its achieved bandwidth or TFLOPS (to show which
bound it is), and the decode/prefill power ratio as the thermal model defines it:
r = (P_decode - P_idle) / (P_prefill - P_idle). Device run only (needs torch and a CUDA GPU):

    python3 benchmarks/device/phase_power.py --out $OUT/phase_power.json

Attention and sampling are left out: a step's weight GEMMs are what sets its power phase.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import pynvml as nv
import torch

HIDDEN, INTER, LAYERS, Q_DIM, KV_DIM = 4096, 12288, 36, 32 * 128, 8 * 128
# one decoder layer's weight matrices (in, out): q, k, v, o, gate, up, down
SHAPES = [(HIDDEN, Q_DIM), (HIDDEN, KV_DIM), (HIDDEN, KV_DIM), (Q_DIM, HIDDEN),
          (HIDDEN, INTER), (HIDDEN, INTER), (INTER, HIDDEN)]


class Sampler(threading.Thread):
    def __init__(self, handle: object, every_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.handle, self.every_s = handle, every_s
        self.rows: list[tuple[float, float, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            self.rows.append((time.monotonic(), nv.nvmlDeviceGetPowerUsage(self.handle) / 1000,
                              nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_SM)))
            time.sleep(self.every_s)


def one_step(weights: list[torch.Tensor], inputs: dict[int, torch.Tensor]) -> None:
    for w in weights:
        torch.matmul(inputs[w.shape[0]], w)


def phase(name: str, tokens: int, weights: list[torch.Tensor], sampler: Sampler,
          seconds: float) -> dict[str, float | str | int]:
    inputs = {k: torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
              for k in {HIDDEN, Q_DIM, INTER}}
    # one step as a CUDA graph: a decode step's 252 small GEMMs must not wait on launches
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        one_step(weights, inputs)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        one_step(weights, inputs)
    torch.cuda.synchronize()
    start = time.monotonic()
    steps = 0
    while time.monotonic() - start < seconds:
        graph.replay()
        steps += 1
        if steps % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    end = time.monotonic()
    rows = [r for r in sampler.rows if start + 1.0 <= r[0] <= end]  # 1 s to settle
    params = sum(w.numel() for w in weights)
    step_s = (end - start) / steps
    return {"phase": name, "tokens": tokens, "steps": steps, "step_ms": round(step_s * 1e3, 3),
            "weight_gb_s": round(params * 2 / step_s / 1e9, 1),
            "tflops": round(2 * params * tokens / step_s / 1e12, 1),
            "power_w_p50": statistics.median(r[1] for r in rows),
            "power_w_max": max(r[1] for r in rows),
            "sm_mhz_p50": statistics.median(r[2] for r in rows), "samples": len(rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--decode-tokens", default="16,64")
    ap.add_argument("--prefill-tokens", type=int, default=4096)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    sampler = Sampler(h)
    sampler.start()
    time.sleep(4.0)
    idle = [r[1] for r in sampler.rows]
    idle_clock = [r[2] for r in sampler.rows]
    weights = [torch.randn(i, o, device="cuda", dtype=torch.bfloat16) * 0.02
               for _ in range(LAYERS) for i, o in SHAPES]
    results: list[dict[str, float | str | int]] = [
        {"phase": "idle", "power_w_p50": statistics.median(idle),
         "sm_mhz_p50": statistics.median(idle_clock), "samples": len(idle)}]
    for b in (int(x) for x in args.decode_tokens.split(",")):
        results.append(phase(f"decode-{b}", b, weights, sampler, args.seconds))
    results.append(phase("prefill", args.prefill_tokens, weights, sampler, args.seconds))
    sampler.stop.set()
    p_idle = float(results[0]["power_w_p50"])
    p_pre = float(results[-1]["power_w_p50"])
    for r in results[1:-1]:
        r["decode_power_ratio"] = round((float(r["power_w_p50"]) - p_idle) / (p_pre - p_idle), 3)
    name = nv.nvmlDeviceGetName(h)
    doc = {"gpu": name.decode() if isinstance(name, bytes) else name,
           "power_limit_w": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000,
           "torch": torch.__version__, "seconds": args.seconds, "phases": results}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    for r in results:
        print(json.dumps(r))
    print(json.dumps({"gpu": doc["gpu"], "power_limit_w": doc["power_limit_w"]}))


if __name__ == "__main__":
    main()
