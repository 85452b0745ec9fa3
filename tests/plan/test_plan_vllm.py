"""`chatfleet plan --engine-model vllm`: vLLM's pool rule, the vLLM twin's knee, vLLM's launch
command and a gateway config that points at vLLM replicas."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.core.memory import plan_vllm_pool
from chatfleet.core.specs import builtin_model, get_gpu
from chatfleet.gateway.config import parse_config
from tests.plan.test_plan import FAST, words

runner = CliRunner()


@pytest.fixture(scope="module")
def answer() -> dict[str, Any]:
    res = runner.invoke(app, ["plan", "--users", "100", *FAST, "--engine-model", "vllm",
                              "--json"])
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(res.output)
    return doc


def test_the_answer_comes_from_the_vllm_models_sweeps_and_pool(answer: dict[str, Any]) -> None:
    assert answer["engine_model"] == "vllm"
    rec = answer["recommendation"]
    assert rec is not None
    for name, p in answer["by_precision"].items():
        sweep = answer["sweeps"][name]["document"]
        assert sweep["target"]["engine_model"] == "vllm"
        assert p["users_per_card"] == sweep["knee"]["meets"]
        w = p["weights"]
        pool = plan_vllm_pool(get_gpu("l4"), builtin_model("qwen3-8b"), w, p["kv_cache"])
        assert p["pool"]["kv_pool_tokens"] == pool.kv_pool_tokens
        assert p["pool"]["num_gpu_blocks"] == pool.num_gpu_blocks
    assert answer["host_tier"]["enable"] is False


def test_it_launches_vllm_at_the_cap_and_the_gateway_points_at_vllm(
        answer: dict[str, Any]) -> None:
    rec = answer["recommendation"]
    assert set(answer["launch"]) == {"vllm"}
    argv = answer["launch"]["vllm"]["argv"]
    assert argv[:2] == ["vllm", "serve"]
    assert argv[argv.index("--max-num-seqs") + 1] == str(rec["gateway_cap"])
    assert argv[argv.index("--max-num-batched-tokens") + 1] == "2048"
    gw = answer["gateway_config"]
    assert [r["name"] for r in gw["replicas"]] == [f"vllm-{i}" for i in range(rec["replicas"])]
    assert all(r["url"].endswith(":8000") for r in gw["replicas"])
    parse_config(gw)


def test_the_tables_print_the_vllm_command() -> None:
    res = runner.invoke(app, ["plan", "--users", "50", *FAST, "--precisions", "fp8",
                              "--engine-model", "vllm"])
    assert res.exit_code == 0, res.output
    text = words(res.output)
    assert "vllm: VLLM_SERVER_DEV_MODE=1 vllm serve" in text
    assert "sglang.launch_server" not in text


def test_pool_sizing_alone_follows_vllms_rule() -> None:
    res = runner.invoke(app, ["plan", "--engine-model", "vllm", "--weights", "fp8",
                              "--kv-cache", "fp8", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    pool = plan_vllm_pool(get_gpu("l4"), builtin_model("qwen3-8b"), "fp8", "fp8")
    assert doc["kv_pool_tokens"] == pool.kv_pool_tokens == pool.num_gpu_blocks * 16
    assert doc["gpu_memory_utilization"] == 0.9 and doc["calibrated"] is False
    res = runner.invoke(app, ["plan", "--engine-model", "vllm"])
    assert res.exit_code == 0 and "vLLM KV pool" in res.output
    res = runner.invoke(app, ["plan", "--engine-model", "mlc"])
    assert res.exit_code == 2 and "--engine-model" in res.output
