"""The cache analysis's old home, kept for one release: import from `chatfleet.core.cache`.

The module is split into `core/cache/trace.py` (traces), `core/cache/replay.py` (what a replay
records) and `core/cache/recommend.py` (summaries, the recommendation, the document). The
replay's loop moved to `chatfleet.twin.cache_replay` (`Replay`, `replay`): it drives the twin's
own scheduler, and the core does not import the twin. Gone with the old copy of the engine's
lifecycle: `LOAD_BACK_THRESHOLD` (it is `SchedulerConfig.load_back_threshold`), the fallback
per-token times and `prefill_seconds` / `decode_seconds` (the scheduler's step times replace
them; `turn_seconds` remains for the synthetic trace's send times).
"""

from __future__ import annotations

from chatfleet.core.cache.recommend import (
    HOLD_TOLERANCE,
    SCHEMA,
    THRASH_GAP,
    cache_document,
    recommend,
    summarize,
    working_set_block,
)
from chatfleet.core.cache.replay import (
    DEFAULT_POLICY,
    CacheConfig,
    ReplayLedger,
    ReplayResult,
    TurnOutcome,
    unbounded_pool,
    union_size,
)
from chatfleet.core.cache.trace import (
    UNIQUE_ID_BASE,
    SyntheticConfig,
    Turn,
    answer_ids,
    check_trace,
    common_prefix_len,
    count_prompt_ids,
    sessions_of,
    sort_trace,
    synthetic_trace,
    turn_seconds,
)

__all__ = [
    "DEFAULT_POLICY", "HOLD_TOLERANCE", "SCHEMA", "THRASH_GAP", "UNIQUE_ID_BASE", "CacheConfig",
    "ReplayLedger", "ReplayResult", "SyntheticConfig", "Turn", "TurnOutcome", "answer_ids",
    "cache_document", "check_trace", "common_prefix_len", "count_prompt_ids", "recommend",
    "sessions_of", "sort_trace", "summarize", "synthetic_trace", "turn_seconds",
    "unbounded_pool", "union_size", "working_set_block",
]
