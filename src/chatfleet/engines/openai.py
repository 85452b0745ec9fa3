"""Any OpenAI-compatible server without admin endpoints (`transformers serve`, a hosted API).

No flush, no metrics, no cached-token report to count on, and a strict request schema:
`transformers serve` answers 422 to a field the OpenAI API does not define (`ignore_eos`
included), so `shape_payload` keeps only the OpenAI fields. Without `ignore_eos`/`min_tokens`
answers may end early, and without `continuous_usage_stats` the client counts one token per
chunk (the run's ITL is marked estimated).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import aiohttp

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.specs import Precision
from chatfleet.engines.base import (
    OPENAI_FIELDS,
    OPENAI_STREAM_OPTIONS,
    EngineAdapter,
    LaunchCommand,
    as_precision,
    check_launch_args,
    get_json,
)


class OpenAIAdapter(EngineAdapter):
    name: ClassVar[str] = "openai"
    flush_path: ClassVar[str | None] = None
    accepts_ignore_eos: ClassVar[bool] = False
    accepts_continuous_usage: ClassVar[bool] = False
    has_metrics: ClassVar[bool] = False
    default_port: ClassVar[int] = 8000

    def shape_payload(self, payload: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in payload.items() if k in OPENAI_FIELDS}
        so = out.get("stream_options")
        if isinstance(so, Mapping):
            kept = {k: v for k, v in so.items() if k in OPENAI_STREAM_OPTIONS}
            if kept:
                out["stream_options"] = kept
            else:
                del out["stream_options"]
        return out

    async def server_info(self, session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
        info = await super().server_info(session, url)
        health = await get_json(session, url, "/health")
        info["healthy"] = not (isinstance(health, dict) and "error" in health)
        info["flags"] = {}
        return info

    def launch_command(self, model_path: str, prec: Precision | str | tuple[str, str],
                       mem_fraction: float | None = None,
                       max_running_requests: int | None = None, *,
                       host: str = "127.0.0.1", port: int | None = None,
                       context_length: int | None = None,
                       chunked_prefill_size: int | None = None,
                       served_model_name: str | None = None,
                       extra: Sequence[str] = ()) -> LaunchCommand:
        """`transformers serve` with continuous batching: BF16 only here, no memory fraction, no
        request cap (the gateway's cap is the only one)."""
        p = as_precision(prec)
        check_launch_args(mem_fraction, max_running_requests)
        if p.weights != "bf16" or p.kv_cache != "bf16":
            raise ChatfleetError("the openai adapter launches `transformers serve` in "
                                 "bf16/bf16 only")
        argv = ["transformers", "serve", model_path, "--continuous-batching",
                "--dtype", "bfloat16", "--host", host, "--port", str(port or self.default_port),
                *extra]
        notes = ["create ~/.cache/huggingface/hub first or /v1/models answers 500; use /health "
                 "for readiness"]
        if mem_fraction is not None or max_running_requests is not None:
            notes.append("transformers serve has no memory fraction or request cap: not passed")
        return LaunchCommand(argv, {"HF_HUB_OFFLINE": "1"}, notes)
