"""The defaults of a load point's run window and of the reference workload, in one place.

A load point warms up for `WARMUP_S`, then measures a window of `DURATION_S`; the window's
requests then get at most `DRAIN_S` more to finish (live), or `TWIN_DRAIN_S` virtual seconds in
the twin, where waiting costs nothing; a live run waits at most `COOLDOWN_MAX_S` for the card to
cool before it starts. Point i of a sweep uses seed `SEED` + i. Every prompt starts with the
shared system prompt of `SYSTEM_PROMPT_TOKENS` tokens (docs/facts.md#the-reference-case). The
twin, the live sweep, the plan and their command-line flags all read these.
"""

from __future__ import annotations

DURATION_S = 300.0
WARMUP_S = 30.0
DRAIN_S = 300.0
COOLDOWN_MAX_S = 300.0
TWIN_DRAIN_S = 600.0
SEED = 1
SYSTEM_PROMPT_TOKENS = 2048
