"""`chatfleet plan --users N`: the full answer from twin sweeps or sweep files, traceable to
sweep points, with accuracy able to veto a precision."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.cli.render import cooling_lines
from chatfleet.core.documents.plan import Doubling
from chatfleet.core.documents.sweep import SweepDoc
from chatfleet.gateway.config import parse_config

runner = CliRunner()
# Short twin runs: the answer's shape and its traceability, not the figures of docs/plan.md.
FAST = ("--grid", "1,4,8,16,32", "--rates", "0.5,1,2", "--duration", "120", "--warmup", "10",
        "--doubling-hours", "0.1")


def plan(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, ["plan", *args])
    return res.exit_code, res.output


def words(text: str) -> str:
    """The output with the console's line wrapping undone."""
    return " ".join(text.split())


def plan_json(*args: str) -> dict[str, Any]:
    code, out = plan("--users", "100", *FAST, *args, "--json")
    assert code == 0, out
    doc: dict[str, Any] = json.loads(out)
    return doc


@pytest.fixture(scope="module")
def answer() -> dict[str, Any]:
    return plan_json()


def point_of(doc: dict[str, Any], name: str, index: int) -> dict[str, Any]:
    p: dict[str, Any] = doc["sweeps"][name]["document"]["points"][index]
    return p


def test_qwen3_8b_on_l4_recommends_fp8_with_users_per_card_for_each_precision(
        answer: dict[str, Any]) -> None:
    rec = answer["recommendation"]
    assert rec["precision"] == "fp8"
    bp = answer["by_precision"]
    assert set(bp) == {"bf16", "fp8"}
    assert bp["fp8"]["users_per_card"] > bp["bf16"]["users_per_card"] >= 1
    assert rec["users_per_card"] == bp["fp8"]["users_per_card"]
    # the pool keys of `plan` without --users stay, for the recommended precision
    assert answer["kv_pool_tokens"] == bp["fp8"]["pool"]["kv_pool_tokens"]
    assert answer["weights"] == answer["kv_cache"] == "fp8"


def test_every_figure_traces_to_a_sweep_point(answer: dict[str, Any]) -> None:
    for name, p in answer["by_precision"].items():
        sweep = answer["sweeps"][name]["document"]
        src = p["source"]
        pt = point_of(answer, name, src["point"])
        assert pt["load"] == src["load"]
        assert pt["load"]["concurrency"] == p["users_per_card"] == sweep["knee"]["meets"]
        assert pt["goodput_rps"] == p["goodput_rps"]
        assert pt["ttft_ms"]["p99"] == p["ttft_p99_ms"]
        assert p["gateway_cap"] == sweep["recommended_cap"] == p["engine_guard"]
        assert pt["attainment"] >= answer["slo"]["attainment"] - 1e-9
        rate_pt = point_of(answer, name, src["rate_point"]) if src["rate_point"] is not None \
            else None
        if rate_pt is not None:
            assert rate_pt["load"]["rate_rps"] == p["rate_rps_per_replica"]
    rec = answer["recommendation"]
    assert rec["replicas"] * rec["users_per_card"] >= 100 * (1 + rec["headroom"]) - 1e-9
    assert (rec["replicas"] - 1) * rec["users_per_card"] < 100 * (1 + rec["headroom"])


def test_launch_commands_and_gateway_config_carry_the_plan(answer: dict[str, Any]) -> None:
    rec = answer["recommendation"]
    argv = answer["launch"]["sglang"]["argv"]
    flag = {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}
    assert flag["--model-path"] == "Qwen/Qwen3-8B-FP8"
    assert flag["--kv-cache-dtype"] == "fp8_e4m3"
    assert flag["--max-running-requests"] == str(rec["engine_guard"])
    assert flag["--mem-fraction-static"] == str(answer["mem_fraction_static"])
    assert flag["--chunked-prefill-size"] == str(answer["chunked_prefill_size"])
    assert flag["--radix-eviction-policy"] == "lru"
    assert "--enable-metrics" in argv and "--enable-cache-report" in argv
    assert "--context-length" not in argv  # the FP8 pool (142k) exceeds the 40,960 context
    assert "--enable-hierarchical-cache" not in argv  # single turns: the working set fits
    # BF16's pool (24,093 tokens) is smaller than Qwen3-8B's 40,960-token context
    bf16 = answer["by_precision"]["bf16"]
    bf16_argv = bf16["launch"]["sglang"]["argv"]
    assert bf16_argv[bf16_argv.index("--context-length") + 1] == str(
        bf16["pool"]["kv_pool_tokens"])
    assert bf16_argv[bf16_argv.index("--model-path") + 1] == "Qwen/Qwen3-8B"
    assert answer["launch"] == answer["by_precision"]["fp8"]["launch"]
    vllm = answer["launch"]["vllm"]["argv"]
    assert vllm[:3] == ["vllm", "serve", "Qwen/Qwen3-8B-FP8"]
    assert vllm[vllm.index("--max-num-seqs") + 1] == str(rec["engine_guard"])
    cfg = parse_config(answer["gateway_config"])
    assert cfg.cap == rec["gateway_cap"] and len(cfg.replicas) == rec["replicas"]
    assert 0 < cfg.prefill_reserve_s <= cfg.ttft_budget_s


def test_doubling_shows_the_sheds_and_the_clocks(answer: dict[str, Any]) -> None:
    runs = {(r["traffic"], r["thermal_model"]): r for r in answer["doubling"]["runs"]}
    assert set(runs) == {(t, th) for t in ("target", "doubled") for th in (False, True)}
    cool, hot = runs["doubled", False], runs["doubled", True]
    assert cool["users_simulated"] == 2 * runs["target", False]["users_simulated"]
    assert cool["shed_share"] > runs["target", False]["shed_share"]
    assert cool["gateway_queue_max"] > 0
    assert max(cool["max_in_flight"]) <= answer["recommendation"]["gateway_cap"]
    assert cool["gpu"]["thermal_slowdown_share"] == 0.0
    assert hot["gpu"]["sm_clock_mhz"]["min"] < cool["gpu"]["sm_clock_mhz"]["min"]


def test_doubling_says_whether_the_card_holds_its_clock_and_what_would(
        answer: dict[str, Any]) -> None:
    runs = {(r["traffic"], r["thermal_model"]): r for r in answer["doubling"]["runs"]}
    for traffic in ("target", "doubled"):
        cool, hot = runs[traffic, False], runs[traffic, True]
        assert "cooling" not in cool
        c = hot["cooling"]
        # the load's mix at the loaded clock comes from the thermal-off run
        assert c["busy_share"] == cool["gpu"]["busy_share"]
        assert c["loaded_power_w"] == pytest.approx(cool["gpu"]["power_w"]["at_loaded_clock"],
                                                    abs=0.01)
        assert c["held_clock"] == (hot["gpu"]["thermal_slowdown_share"] == 0.0)
        # what the mix asks of the cooling agrees with what the card did under it
        assert c["holds_clock"] == c["held_clock"]
        assert not c["held_clock"]  # a saturated L4 under the fitted cooling
        assert c["max_r_c_per_w"] < c["profile"]["r_c_per_w"]
        assert c["settled_mhz"] == hot["gpu"]["sm_clock_mhz"]["p50"]
    text = words("\n".join(cooling_lines(Doubling.from_json(answer["doubling"], "doubling"))))
    assert text.count("throttles after") == 2
    assert text.count("to hold the clock: cooling with at most") == 2
    assert f"{runs['target', True]['cooling']['max_r_c_per_w']:.2f} C/W" in text
    assert "--clock-floor" in text
    assert "note: the thermal model" not in text


def test_cooling_lines_for_a_card_that_holds_its_clock(answer: dict[str, Any]) -> None:
    doubling = json.loads(json.dumps(answer["doubling"]))
    for r in doubling["runs"]:
        if r.get("cooling"):
            r["cooling"].update(held_clock=True, holds_clock=True, steady_temp_c=80.0)
    text = words("\n".join(cooling_lines(Doubling.from_json(doubling, "doubling"))))
    assert text.count("holds its clock") == 2
    assert "to hold the clock" not in text and "throttles" not in text
    assert "settling at 80 C" in text


def write_accuracy(path: Path, lo: float, hi: float) -> Path:
    within = lo >= -0.02
    cmp = {"a": "bf16", "b": "fp8", "diff": (lo + hi) / 2, "diff_ci95": [lo, hi],
           "within_margin": within, "mcnemar_p": 0.01}
    path.write_text(json.dumps({
        "schema": "chatfleet.accuracy/1", "reference": "bf16", "margin": 0.02,
        "targets": {"bf16": {"accuracy": 0.9, "ci95": [0.88, 0.92], "n": 1319},
                    "fp8": {"accuracy": 0.87, "ci95": [0.85, 0.89], "n": 1319}},
        "paired": cmp, "comparisons": [cmp]}))
    return path


def test_fp8_outside_the_accuracy_margin_gives_bf16_instead(
        tmp_path: Path, answer: dict[str, Any]) -> None:
    # both precisions from sweep files this time: the twin sweeps nothing
    sweeps = [tmp_path / "bf16.json", tmp_path / "fp8.json"]
    for name, f in zip(("bf16", "fp8"), sweeps, strict=True):
        f.write_text(json.dumps(answer["sweeps"][name]["document"]))
    args = ("--sweep", str(sweeps[0]), "--sweep", str(sweeps[1]))
    ok = plan_json(*args, "--accuracy", str(write_accuracy(tmp_path / "ok.json", -0.015, 0.01)))
    assert ok["recommendation"]["precision"] == "fp8"
    assert ok["by_precision"]["fp8"]["accuracy"]["allowed"]
    assert ok["sweeps"]["fp8"]["source"] == str(sweeps[1])
    assert ok["by_precision"]["fp8"]["source"]["sweep"] == str(sweeps[1])
    bad = plan_json(*args, "--accuracy", str(write_accuracy(tmp_path / "bad.json", -0.05, -0.01)))
    assert bad["recommendation"]["precision"] == "bf16"
    assert not bad["by_precision"]["fp8"]["accuracy"]["allowed"]
    assert bad["recommendation"]["users_per_card"] == answer["by_precision"]["bf16"][
        "users_per_card"]


def test_the_table_and_the_gateway_config_file(tmp_path: Path) -> None:
    gw = tmp_path / "gateway.yaml"
    code, out = plan("--users", "50", *FAST, "--gateway-config-out", str(gw),
                     "--out", str(tmp_path / "plan.json"))
    assert code == 0, out
    assert "recommended: fp8" in out and "sglang.launch_server" in out
    import yaml

    assert parse_config(yaml.safe_load(gw.read_text())).cap > 0
    assert json.loads((tmp_path / "plan.json").read_text())["schema"] == "chatfleet.plan/1"


@pytest.mark.parametrize(("args", "message"), [
    (("--users", "0"), "at least 1"),
    (("--users", "10", "--sweep", "/nonexistent/sweep.json"), "no such file"),
    (("--users", "10", "--accuracy", "/nonexistent/acc.json"), "no such file"),
    (("--users", "10", "--precisions", "int4"), "int4"),
    (("--users", "10", "--precisions", "fp8,fp8"), "twice"),
    (("--users", "10", "--headroom", "-1"), "headroom"),
    (("--users", "10", "--turns", "0"), "turns"),
])
def test_bad_input_is_a_clear_error(args: tuple[str, ...], message: str) -> None:
    code, out = plan(*args, *FAST)
    assert code == 2, out
    assert message in words(out) and "Traceback" not in out


def test_a_file_that_is_not_a_sweep_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "x.json"
    f.write_text('{"schema": "other"}')
    code, out = plan("--users", "10", "--sweep", str(f))
    assert code == 2 and "unsupported schema 'other' (expected 'chatfleet.sweep/1')" in words(out)
    f.write_text("{not json")
    code, out = plan("--users", "10", "--sweep", str(f))
    assert code == 2 and "is not valid JSON" in words(out)


def test_a_live_sweep_directory_is_read_like_its_sweep_json(tmp_path: Path,
                                                            answer: dict[str, Any]) -> None:
    live = tmp_path / "live-fp8"
    live.mkdir()
    (live / "sweep.json").write_text(json.dumps(answer["sweeps"]["fp8"]["document"]))
    doc = plan_json("--sweep", str(live))
    assert set(doc["by_precision"]) == {"fp8"}  # only what was measured
    assert doc["recommendation"]["users_per_card"] == answer["by_precision"]["fp8"][
        "users_per_card"]
    assert doc["sweeps"]["fp8"] == {"source": str(live), "document": None}


def test_with_think_time_a_card_holds_more_users_than_its_cap() -> None:
    """Users who think between turns are not all in flight: users per card (the closed-loop
    knee in users) exceeds the gateway cap (requests in flight at that point)."""
    doc = plan_json("--turns", "4", "--think-time", "10", "--precisions", "fp8")
    fp8 = doc["by_precision"]["fp8"]
    assert fp8["users_per_card"] > fp8["gateway_cap"] >= 1
    assert doc["session_profile"]["turns"] == 4


def test_hicache_flags_when_the_working_set_calls_for_them() -> None:
    from chatfleet.core.plan import figures_from_sweep
    from chatfleet.core.specs import builtin_model, get_gpu
    from chatfleet.core.workload import SessionProfile
    from chatfleet.jobs.plan import PlanRequest, host_tier_of, launch_commands, pool_of

    doc = {"schema": "chatfleet.sweep/1", "target": {"weights": "fp8", "kv_cache": "fp8"},
           "knee": {"meets": 128, "fails": 130}, "recommended_cap": 18,
           "points": [{"load": {"mode": "closed", "concurrency": 128}, "valid": True,
                       "goodput_rps": 1.0, "output_tok_s": 100.0, "ttft_ms": {"p99": 500.0}}]}
    fig = figures_from_sweep(SweepDoc.from_json(doc), "s.json")
    req = PlanRequest(get_gpu("l4"), builtin_model("qwen3-8b"), users=500,
                      profile=SessionProfile(turns=4, think_time_s=120.0))
    pool = pool_of(req, "fp8", "fp8")
    tier = host_tier_of(req, fig, pool)
    # 128 users x 4 turns x 640 tokens + the prompt: larger than the 142k pool, within + host
    assert tier.working_set_tokens == 2048 + 128 * 4 * 640
    assert tier.enable and tier.hicache_ratio >= tier.working_set_tokens / 142_372
    argv = launch_commands(req, fig, pool, tier)["sglang"].argv
    assert "--enable-hierarchical-cache" in argv
    assert argv[argv.index("--hicache-ratio") + 1] == str(tier.hicache_ratio)
    small = PlanRequest(get_gpu("l4"), builtin_model("qwen3-8b"), users=500,
                        profile=SessionProfile(turns=4, think_time_s=120.0), host_kv_gib=1.0)
    off = host_tier_of(small, fig, pool)
    assert not off.enable and "fewer users" in off.why  # beyond GPU + host: no tier
