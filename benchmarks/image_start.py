"""The image's size, and the time from starting it to a passing /health (docs/deploy.md#the-image).

Usage (as root, after `make image`):
    .venv/bin/python benchmarks/image_start.py [--archive out/image/chatfleet-TAG.oci.tar]
        [--starts 5] [--json FILE]

The image is the newest archive `make image` wrote (or --archive). Its size: the archive, each
layer compressed, and unpacked (the layers' tars). Then, side by side in one run, --starts
times each: the gateway in the image started by podman (`podman start` of a created
container: the storage is ready, as on a node that has pulled the image), by chroot into the
unpacked root, and for scale the same command from this checkout's virtual environment. Each
start is the image's entrypoint with the config the manifests mount (one replica: a simserver
started here) on 127.0.0.1 at a free port; the clock runs from the start command to the first
/health that answers 200 (polled every 10 ms), then SIGTERM stops it and the time to its exit is
recorded too. Medians, minimum and maximum per way, and the ratio of each median to the
venv's. A start that does not answer within 60 s, or a stop that does not exit 0, fails the
benchmark.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import requests
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tools.image_run import Runner, archive_config, runner  # noqa: E402

from chatfleet.deploy import image  # noqa: E402

HEALTH_TIMEOUT_S = 60.0
GRACE_S = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_health(url: str, started: float) -> float:
    while time.monotonic() - started < HEALTH_TIMEOUT_S:
        try:
            if requests.get(url + image.HEALTH_PATH, timeout=1).status_code == 200:
                return time.monotonic() - started
        except requests.RequestException:
            pass
        time.sleep(0.01)
    raise SystemExit(f"FAILED: no passing {image.HEALTH_PATH} at {url} within "
                     f"{HEALTH_TIMEOUT_S:.0f} s")


def in_image(r: Runner, config: str) -> tuple[float, float]:
    port = free_port()
    c = r.start(["--config", image.CONFIG_PATH, "--host", "127.0.0.1", "--port", str(port)],
                files={image.CONFIG_PATH: config.encode()})
    try:
        healthy = wait_health(f"http://127.0.0.1:{port}", c.started)
        code, stopped = c.stop(GRACE_S)
    finally:
        if c.proc.poll() is None:
            c.stop(5)
    if code != 0:
        raise SystemExit(f"FAILED: the gateway in the image ({r.kind}) exited {code} on "
                         "SIGTERM")
    return healthy, stopped


def in_venv(config_path: Path) -> tuple[float, float]:
    port = free_port()
    t = time.monotonic()
    proc = subprocess.Popen([str(Path(sys.executable).with_name("chatfleet")), "gateway",
                             "--config", str(config_path), "--host", "127.0.0.1",
                             "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        healthy = wait_health(f"http://127.0.0.1:{port}", t)
        t = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(GRACE_S)
        stopped = time.monotonic() - t
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if code != 0:
        raise SystemExit(f"FAILED: the gateway from the venv exited {code} on SIGTERM")
    return healthy, stopped


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def newest_archive() -> Path:
    found = sorted((ROOT / "out" / "image").glob(f"{image.NAME}-*.oci.tar"),
                   key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit("no archive in out/image: run `make image` first")
    return found[-1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--archive", type=Path, default=None)
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    archive = args.archive or newest_archive()
    view = archive_config(archive)
    layers = [int(d["size"]) for d in view.manifest["layers"]]
    sizes: dict[str, Any] = {"archive_bytes": archive.stat().st_size,
                             "layers_compressed_bytes": layers}
    meta_path = archive.with_suffix("").with_suffix(".json")
    unpacked = ""
    if meta_path.exists():  # make image's description: the layers' tars
        sizes["unpacked_bytes"] = json.loads(meta_path.read_text())["layers_bytes"]
        unpacked = f", {sizes['unpacked_bytes'] / 1e6:.1f} MB unpacked"
    print(f"{view.name}: archive {archive.stat().st_size / 1e6:.1f} MB, layers "
          + " + ".join(f"{b / 1e6:.1f}" for b in layers) + f" MB compressed{unpacked}",
          flush=True)
    sim = subprocess.Popen([str(Path(sys.executable).with_name("chatfleet")), "simserver",
                            "--weights", "fp8", "--kv-cache", "fp8", "--port", "0"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert sim.stdout is not None
    sim_url = sim.stdout.readline().decode().strip()
    results: dict[str, Any] = {"image": view.name, **sizes, "starts": args.starts, "ways": {}}
    with tempfile.TemporaryDirectory(prefix="image-start-") as tmp_s:
        tmp = Path(tmp_s)
        config = yaml.safe_dump({"replicas": [{"name": "sim", "url": sim_url}], "cap": 4})
        config_path = tmp / "gateway.yaml"
        config_path.write_text(config)
        runners: dict[str, Runner] = {}
        try:
            for kind in ("podman", "chroot"):
                t = time.monotonic()
                r, why = runner(kind, archive, tmp / kind)
                if r is None:
                    print(f"{kind}: cannot run here ({why})", flush=True)
                    continue
                print(f"{kind}: ready in {time.monotonic() - t:.1f} s (load or unpack)",
                      flush=True)
                runners[kind] = r
            ways: dict[str, list[tuple[float, float]]] = {k: [] for k in runners}
            ways["venv"] = []
            for i in range(args.starts):  # interleaved: the machine's load falls on all
                for kind, r in runners.items():
                    ways[kind].append(in_image(r, config))
                ways["venv"].append(in_venv(config_path))
                print(f"start {i + 1}/{args.starts}: " + ", ".join(
                    f"{k} {v[-1][0]:.2f} s" for k, v in ways.items()), flush=True)
        finally:
            for r in runners.values():
                r.close()
            sim.send_signal(signal.SIGINT)
            sim.wait(20)
    base = statistics.median(h for h, _ in ways["venv"])
    for kind, runs in ways.items():
        health = summary([h for h, _ in runs])
        results["ways"][kind] = {"start_to_health_s": health,
                                 "sigterm_to_exit_s": summary([s for _, s in runs]),
                                 "ratio_to_venv": round(health["median"] / base, 2)}
        print(f"{kind:7s} start to a passing /health: median {health['median']:.2f} s (min "
              f"{health['min']:.2f}, max {health['max']:.2f}; {health['median'] / base:.2f}x "
              f"the venv's); SIGTERM to exit: median "
              f"{results['ways'][kind]['sigterm_to_exit_s']['median']:.2f} s", flush=True)
    results["cpu_count"] = os.cpu_count()
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
