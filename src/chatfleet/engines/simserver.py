"""The simserver: SGLang's surface (flush, sglang:* metrics, /get_server_info) plus /telemetry."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from chatfleet.core.specs import Precision
from chatfleet.engines.base import LaunchCommand, as_precision, check_launch_args, optional_flags
from chatfleet.engines.sglang import SGLangAdapter


class SimserverAdapter(SGLangAdapter):
    name: ClassVar[str] = "simserver"
    cache_report_flag: ClassVar[str | None] = None  # always reports cached tokens
    default_port: ClassVar[int] = 0

    def launch_command(self, model_path: str, prec: Precision | str | tuple[str, str],
                       mem_fraction: float | None = None,
                       max_running_requests: int | None = None, *,
                       host: str = "127.0.0.1", port: int | None = None,
                       context_length: int | None = None,
                       chunked_prefill_size: int | None = None,
                       served_model_name: str | None = None,
                       extra: Sequence[str] = ()) -> LaunchCommand:
        """`chatfleet simserver`; `model_path` is a built-in model name or a config.json. The
        simserver plans its pool with SGLang's rule; `mem_fraction` and the chunk size are
        SGLang's defaults there and cannot be set."""
        p = as_precision(prec)
        check_launch_args(mem_fraction, max_running_requests)
        argv = ["chatfleet", "simserver", "--model", model_path, "--weights", p.weights,
                "--kv-cache", p.kv_cache, "--host", host, "--port", str(port or 0)]
        argv += optional_flags(("--max-running-requests", max_running_requests),
                               ("--served-model-name", served_model_name))
        notes = []
        if mem_fraction is not None or context_length is not None or chunked_prefill_size:
            notes.append("the simserver uses SGLang's default memory fraction, context and "
                         "chunk size for the card: those settings are not passed")
        return LaunchCommand([*argv, *extra], {}, notes)
