"""The twin's outputs the document tests pin: each made by the public CLI with fixed flags.

`python -m tests.documents.fixtures DIR` writes them into DIR; the files under
tests/documents/data were written so by the code before the documents were typed (dict
literals: main at 7b05dad, the fleet sweep again at d6d5bb3, when the fleet core's shed
counters gained `key_limit`, and the thermal twin sweep again at df64e4f, the untyped code with
decode runs under the thermal model, which moved the last bit of three figures: a TPOT p99 of
117.97500766540648 became ...647), and tests/documents/test_round_trip.py checks that the typed
code writes the same bytes. cache.json was written again by the typed code when the host tier
took SGLang's rules (issue 22: a host tier larger than the pool, write policies, a load-back
beside the prefill, each round's mean TTFT). Regenerate them (and say why in the commit) only
when a change to the engine model, the fleet core or the metrics is meant to change the
figures.
"""

from __future__ import annotations

import sys
from pathlib import Path

from typer.testing import CliRunner

TWIN = ["twin", "sweep", "--duration", "20", "--warmup", "5"]
RUNS: dict[str, list[str]] = {
    # closed and open loop, both knees refined, the thermal model on: every block of a point
    "twin-sweep.json": [*TWIN, "--weights", "fp8", "--kv-cache", "fp8", "--lengths", "uniform",
                        "--range-ratio", "0.5", "--concurrency", "1,8,32", "--rate", "0.5,4",
                        "--refine", "--thermal"],
    # a fleet of two behind the gateway's admission and routing: the point's fleet block
    # (written again for issue 23, when the fleet learned each replica's prefill reserve by
    # default and the block gained learn_reserve, spill and reserve_s)
    "twin-fleet-sweep.json": [*TWIN, "--concurrency", "8,40", "--replicas", "2", "--cap", "6",
                              "--queue-depth", "4"],
    # the vLLM engine model
    "twin-vllm-sweep.json": [*TWIN, "--engine-model", "vllm", "--concurrency", "1,16",
                             "--rate", "1", "--arrival", "gamma:0.5"],
    # the plan: twin sweeps of both precisions, the recommendation, doubled traffic (whose
    # runs were written again for issue 23: the gateway's learned reserve)
    "plan.json": ["plan", "--users", "30", "--grid", "1,4,16", "--rates", "0.5,2",
                  "--duration", "20", "--warmup", "5", "--doubling-hours", "0.01"],
    # a plan that finds no precision meeting the target
    "plan-none.json": ["plan", "--users", "30", "--grid", "1,2", "--rates", "0.5",
                       "--duration", "10", "--warmup", "2", "--slo-ttft-ms", "1",
                       "--doubling-hours", "0.01"],
    # host tiers larger than both pools (SGLang refuses a smaller one), two write policies
    "cache.json": ["cache", "--sessions", "6", "--turns", "3", "--pool", "8192,16384",
                   "--policy", "lru,fifo", "--host-pool-tokens", "0,20000",
                   "--hicache-write-policy", "write_through,write_back"],
}


def out_flag(name: str) -> list[str]:
    return ["--json", name] if name.startswith("twin") else ["--out", name]


def make(name: str, out_dir: Path) -> Path:
    """Write fixture `name` into `out_dir` with the CLI; its path."""
    from chatfleet.cli.app import app

    path = out_dir / name
    flag, _ = out_flag(name)
    res = CliRunner().invoke(app, [*RUNS[name], flag, str(path)])
    if res.exit_code != 0:
        raise RuntimeError(f"{name}: exit {res.exit_code}: {res.output}\n{res.exception!r}")
    return path


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    for fixture in sys.argv[2:] or RUNS:
        print(make(fixture, target))
