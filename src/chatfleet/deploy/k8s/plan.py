"""The deployment's inputs: a `DeployPlan` (the SGLang command line, the cap, the replica count
and the gateway configuration), read from a `chatfleet plan --json` document (`plan_from_file`)
or built from flags with the same adapters the plan uses (`plan_from_flags`)."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.memory import plan_pool
from chatfleet.core.specs import SpecError, builtin_model, get_gpu, precision
from chatfleet.engines.sglang import SGLangAdapter

SGLANG_PORT = 30000  # where the plan's SGLang listens (its container's port)


class DeployError(ChatfleetError):
    """A plan or an option the generator cannot use, with the key or flag named."""


@dataclass(frozen=True, slots=True)
class DeployPlan:
    argv: list[str]  # SGLang's launch command, as the plan gives it
    cap: int  # requests in flight per replica (the gateway's cap)
    replicas: int
    gateway_config: dict[str, Any]  # the gateway's YAML config format, replicas filled later
    env: dict[str, str] = field(default_factory=dict)
    source: str = "flags"


def _get(doc: Mapping[str, Any], path: str, where: str) -> Any:
    cur: Any = doc
    for key in path.split("."):
        if not isinstance(cur, Mapping) or key not in cur:
            raise DeployError(f"{where}: missing {path} (a `chatfleet plan --json` document "
                              "carries recommendation, launch.sglang and gateway_config)")
        cur = cur[key]
    return cur


def positive_int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DeployError(f"{what} must be a positive whole number, not {value!r}")
    return value


def plan_from_file(path: Path, replicas: int | None = None) -> DeployPlan:
    """The deployment inputs of a `chatfleet plan --json` document; `replicas` overrides the
    plan's recommendation."""
    where = str(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DeployError(f"cannot read the plan {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError:
        raise DeployError(f"{path} is not a plan: not UTF-8 text (give the file `chatfleet "
                          "plan --json` writes)") from None
    except json.JSONDecodeError as exc:
        raise DeployError(f"{path} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise DeployError(f"{path}: the top level must be an object")
    argv = _get(doc, "launch.sglang.argv", where)
    if (not isinstance(argv, list) or not argv
            or not all(isinstance(a, str) for a in argv)):
        raise DeployError(f"{where}: launch.sglang.argv must be a non-empty list of strings")
    env = doc["launch"]["sglang"].get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise DeployError(f"{where}: launch.sglang.env must map names to strings")
    cap = positive_int(_get(doc, "recommendation.gateway_cap", where),
                        f"{where}: recommendation.gateway_cap")
    n = positive_int(replicas if replicas is not None
                      else _get(doc, "recommendation.replicas", where),
                      "--replicas" if replicas is not None
                      else f"{where}: recommendation.replicas")
    cfg = _get(doc, "gateway_config", where)
    if not isinstance(cfg, dict):
        raise DeployError(f"{where}: gateway_config must be an object")
    cfg = copy.deepcopy(cfg)
    cfg.setdefault("cap", cap)
    return DeployPlan(list(argv), cap, n, cfg, dict(env), source=path.name)


def default_model_path(model: str, weights: str) -> str:
    if model == "qwen3-8b":
        return "Qwen/Qwen3-8B-FP8" if weights == "fp8" else "Qwen/Qwen3-8B"
    raise DeployError(f"--model-path is needed for {model!r} (the checkpoint SGLang loads)")


def plan_from_flags(*, cap: int, weights: str, kv_cache: str, replicas: int = 2,
                    gpu: str = "l4", model: str = "qwen3-8b", model_path: str | None = None,
                    queue_depth: int | None = None) -> DeployPlan:
    """What the plan would give, from the pool planner and the SGLang adapter: the engine
    capped at the gateway's cap (a second guard), SGLang's memory fraction and chunked prefill
    for the card made explicit."""
    positive_int(cap, "--cap")
    positive_int(replicas, "--replicas")
    if queue_depth is not None and queue_depth < 0:
        raise DeployError("--queue-depth must not be negative")
    try:
        prec = precision(weights, kv_cache)
        pool = plan_pool(get_gpu(gpu), builtin_model(model), prec.weights, prec.kv_cache)
    except SpecError as exc:
        raise DeployError(str(exc)) from exc
    path = model_path or default_model_path(model, prec.weights)
    cmd = SGLangAdapter().launch_command(
        path, (prec.weights, prec.kv_cache), pool.mem_fraction_static, cap,
        chunked_prefill_size=pool.chunked_prefill_size, served_model_name=model,
        host="0.0.0.0", port=SGLANG_PORT)
    cfg: dict[str, Any] = {"cap": cap}
    if queue_depth is not None:
        cfg["queue_depth"] = queue_depth
    cfg["routing"] = {"gpu": gpu, "model": model, "weights": prec.weights,
                      "kv_cache": prec.kv_cache}
    return DeployPlan(cmd.argv, cap, replicas, cfg, dict(cmd.env))
