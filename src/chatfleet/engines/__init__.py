"""Engine adapters: SGLang, vLLM, the simserver, and any OpenAI-compatible server.

    adapter = get_adapter("vllm")
    result = await adapter.flush(session, url)      # FlushResult(ok, status, detail, ...)
    figures = adapter.read_metrics(metrics)         # running, queue, token_usage, ...
"""

from __future__ import annotations

from chatfleet.core.errors import ChatfleetError
from chatfleet.engines.base import (
    EngineAdapter,
    FlushResult,
    FlushVerdict,
    LaunchCommand,
    MetricNames,
    cached_tokens,
    flush_and_verify,
    verify_flush_counters,
    verify_flush_from_cached,
)
from chatfleet.engines.openai import OpenAIAdapter
from chatfleet.engines.sglang import SGLangAdapter
from chatfleet.engines.simserver import SimserverAdapter
from chatfleet.engines.vllm import VLLMAdapter

ADAPTERS: dict[str, EngineAdapter] = {
    "sglang": SGLangAdapter(),
    "vllm": VLLMAdapter(),
    "simserver": SimserverAdapter(),
    "openai": OpenAIAdapter(),
}
ALIASES = {"transformers": "openai", "transformers-serve": "openai", "sim": "simserver"}


def adapter_names() -> list[str]:
    return list(ADAPTERS)


def get_adapter(name: str) -> EngineAdapter:
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    try:
        return ADAPTERS[key]
    except KeyError:
        raise ChatfleetError(f"unknown engine {name!r}: choose one of "
                             f"{', '.join(ADAPTERS)}") from None


__all__ = [
    "ADAPTERS",
    "EngineAdapter",
    "FlushResult",
    "FlushVerdict",
    "LaunchCommand",
    "MetricNames",
    "OpenAIAdapter",
    "SGLangAdapter",
    "SimserverAdapter",
    "VLLMAdapter",
    "adapter_names",
    "cached_tokens",
    "flush_and_verify",
    "get_adapter",
    "verify_flush_counters",
    "verify_flush_from_cached",
]
