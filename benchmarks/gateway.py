"""The gateway's benchmark (issue 5): `chatfleet gateway` against direct connections, LiteLLM's
proxy and SGLang's router, side by side in one run, at 32 and 256 streams, on the fake engine
of benchmarks/gateway_relay.py (64 SSE chunks per request, 20 ms apart).

    python benchmarks/gateway.py [--peer-litellm /tmp/ll/bin/python]
        [--peer-router /tmp/sr/bin/sglang-router] [--reps 3] [--profile DIR] [--json FILE]

Every option of `gateway_relay.py run` is accepted (its docstring says what each figure is).
The peers live in their own virtual environments, never in requirements.lock:

    python3 -m venv /tmp/ll && /tmp/ll/bin/pip install 'litellm[proxy]==1.108.7'
    python3 -m venv /tmp/sr && /tmp/sr/bin/pip install 'sglang-router==0.3.2'

The client runs without --quickack by default (Linux's delayed ACKs, as SDK clients), so a
relay that writes without TCP_NODELAY shows its Nagle stall. The gateway runs with a cap no run
reaches (2,000) and its connection limit checked; a run in which it (or any target but
LiteLLM) delivers less than it was offered fails loudly. Figures: docs/gateway.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gateway_relay import main

if __name__ == "__main__":
    main(["run", "--impls", "aiohttp-pass-uvloop", "--chatfleet", *sys.argv[1:]])
