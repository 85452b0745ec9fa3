"""Instructions, not seconds: the 64-user FP8 mixed-length point's cost beyond a 6-s point,
counted by valgrind's callgrind for one or more versions of chatfleet.

Usage (valgrind from Debian: apt-get install valgrind; each run takes 10-40 s under it):
    git worktree add --detach /tmp/old 57ac46e
    .venv/bin/python benchmarks/twin_instructions.py /tmp/old/src src [--native-off]

A count is the same for the same code and inputs whatever else the machine does, so a ratio
of two counts holds on a shared, noisy machine where wall-clock ratios move by tens of per
cent. It is a proxy: it weighs every instruction alike (a long memcpy counts one per byte moved
on this CPU's `rep movsb`), so the time ratio is measured too (benchmarks/twin_speed_ab.py).
--native-off runs every version from source (CHATFLEET_NATIVE=0), to count what compiling
(chatfleet/_native.py) saves.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys

from twin_speed_ab import POINT_SETUP  # the same point as the timed benchmark

POINT = POINT_SETUP + "import sys\nrun(float(sys.argv[1]))\n"


def instructions(src: str, virtual_s: float, native: bool) -> int:
    # a fixed hash seed (set and dict orders of str keys) and no OpenBLAS helper thread, whose
    # spin-waits count too: the same code then counts the same, run after run
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src), PYTHONHASHSEED="0",
               OPENBLAS_NUM_THREADS="1")
    if not native:
        env["CHATFLEET_NATIVE"] = "0"
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                          sys.executable, "-c", POINT, str(virtual_s)],
                         env=env, capture_output=True, text=True, cwd="/", check=False)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode or found is None:
        sys.exit(f"{src}: {out.stderr[-1500:]}")
    return int(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("srcs", nargs="+", help="src folders of the versions to count")
    ap.add_argument("--native-off", action="store_true", help="every version from source")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed (Debian: apt-get install valgrind)")
    first = None
    print(f"{'version':40s} {'600 s':>15s} {'6 s':>15s} {'beyond 6 s':>15s} {'ratio':>6s}")
    for src in args.srcs:
        long, short = (instructions(src, v, not args.native_off) for v in (600.0, 6.0))
        beyond = long - short
        first = first or beyond
        print(f"{src:40s} {long:15,d} {short:15,d} {beyond:15,d} {beyond / first:6.3f}")


if __name__ == "__main__":
    main()
