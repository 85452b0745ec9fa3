"""The command line: figures, JSON, and clean errors for bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.cli.common import sigint_deferred

runner = CliRunner()


def run(*args: str) -> tuple[int, str]:
    res = runner.invoke(app, list(args))
    return res.exit_code, res.output


def test_plan_json_reproduces_both_l4_pools_within_half_a_percent() -> None:
    pools = {}
    for prec in ("bf16", "fp8"):
        code, out = run("plan", "--gpu", "l4", "--model", "qwen3-8b", "--weights", prec,
                        "--kv-cache", prec, "--json")
        assert code == 0, out
        doc = json.loads(out)
        assert {"kv_pool_tokens", "weights_gib", "kv_bytes_per_token", "requests_fit",
                "prompts_fit"} <= doc.keys()
        pools[prec] = doc["kv_pool_tokens"]
        assert doc["calibrated"] is True
    assert pools["bf16"] == pytest.approx(24094, rel=0.005)
    assert pools["fp8"] == pytest.approx(142369, rel=0.005)


def test_plan_mixed_precision_sits_between_the_pure_ones() -> None:
    docs = {}
    for w, kv in (("bf16", "bf16"), ("fp8", "bf16"), ("bf16", "fp8"), ("fp8", "fp8")):
        code, out = run("plan", "--weights", w, "--kv-cache", kv, "--json")
        assert code == 0
        docs[(w, kv)] = json.loads(out)
    low = docs[("bf16", "bf16")]["kv_pool_tokens"]
    high = docs[("fp8", "fp8")]["kv_pool_tokens"]
    for key in (("fp8", "bf16"), ("bf16", "fp8")):
        assert low < docs[key]["kv_pool_tokens"] < high
        assert docs[key]["mem_fraction_static"] == docs[("bf16", "bf16")]["mem_fraction_static"]


def test_plan_table_marks_other_gpus_uncalibrated() -> None:
    code, out = run("plan", "--gpu", "a100-80gb")
    assert code == 0
    assert "uncalibrated" in out
    code, out = run("plan", "--gpu", "h100-sxm", "--json")
    assert json.loads(out)["calibrated"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("plan", "--gpu", "t1000"), "unknown GPU"),
        (("plan", "--model", "llama-99b"), "unknown model"),
        (("plan", "--weights", "int4"), "precision"),
        (("plan", "--request-tokens", "0"), "positive"),
        (("plan", "--mem-fraction", "1.5"), "between 0 and 1"),
        (("plan", "--request-tokens", "100000000"), "smaller than one request"),
    ],
)
def test_plan_bad_input_is_a_clear_error(args: tuple[str, ...], message: str) -> None:
    code, out = run(*args)
    assert code == 2
    assert message in out
    assert "Traceback" not in out


def test_plan_reads_a_config_json_and_rejects_one_missing_fields(tmp_path: Path) -> None:
    small = {"num_hidden_layers": 16, "hidden_size": 2048, "intermediate_size": 8192,
             "num_attention_heads": 16, "num_key_value_heads": 8, "vocab_size": 32000}
    good = tmp_path / "small" / "config.json"
    good.parent.mkdir()
    good.write_text(json.dumps(small))
    code, out = run("plan", "--model", str(good), "--json")
    assert code == 0, out
    doc = json.loads(out)
    # 16 layers x 8 kv heads x 128 head_dim x 2 x 2 bytes
    assert doc["kv_bytes_per_token"] == 16 * 8 * 128 * 2 * 2
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"hidden_size": 4096}))
    code, out = run("plan", "--model", str(bad))
    assert code == 2
    assert "lacks required fields" in out
    code, out = run("plan", "--model", str(tmp_path / "missing.json"))
    assert code == 2


def test_twin_sweep_writes_the_contract_and_prints_the_knee(tmp_path: Path) -> None:
    out_file = tmp_path / "sweep.json"
    code, out = run("twin", "sweep", "--weights", "fp8", "--kv-cache", "fp8",
                    "--concurrency", "1,8,64", "--lengths", "uniform", "--range-ratio", "0.5",
                    "--range-convention", "vllm", "--duration", "120", "--warmup", "10",
                    "--json", str(out_file))
    assert code == 0, out
    assert "knee" in out
    doc = json.loads(out_file.read_text())
    assert doc["schema"] == "chatfleet.sweep/1"
    assert [p["load"]["concurrency"] for p in doc["points"]] == [1, 8, 64]
    assert [p["seed"] for p in doc["points"]] == [1, 2, 3]
    assert doc["knee"]["meets"] in (1, 8)
    assert doc["target"]["engine"] == "twin"
    assert doc["workload"]["lengths"]["convention"] == "vllm"


def test_twin_sweep_open_loop_rates(tmp_path: Path) -> None:
    code, out = run("twin", "sweep", "--concurrency", "", "--rate", "0.2,0.5",
                    "--arrival", "gamma:0.5", "--duration", "120", "--warmup", "0",
                    "--print-json")
    assert code == 0, out
    doc = json.loads(out)
    assert [p["load"]["rate_rps"] for p in doc["points"]] == [0.2, 0.5]
    assert doc["knee_rate"]["meets"] is not None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--concurrency", "0"), "positive"),
        (("--concurrency", "four"), "comma-separated"),
        (("--input-len", "0"), "positive"),
        (("--lengths", "zipf"), "unknown --lengths"),
        (("--pool-tokens", "1000"), "KV pool"),
        (("--eviction", "random"), "policy"),
        (("--rate", "1", "--arrival", "gamma:x"), "bad arrival"),
        (("--gpu", "t4"), "unknown GPU"),
        (("--lengths", "file"), "--length-file"),
        (("--group-draw", "random"), "unknown --group-draw 'random'"),
    ],
)
def test_twin_sweep_bad_input_is_a_clear_error(args: tuple[str, ...], message: str) -> None:
    code, out = run("twin", "sweep", "--duration", "10", *args)
    assert code == 2, out
    assert message in out
    assert "Traceback" not in out


def test_twin_sweep_draws_prompt_groups_per_user_or_per_request() -> None:
    def point(draw: str) -> tuple[dict[str, object], dict[str, float]]:
        code, out = run("twin", "sweep", "--weights", "fp8", "--kv-cache", "fp8",
                        "--pool-tokens", "12288", "--system-prompt-tokens", "512",
                        "--input-len", "64", "--output-len", "32", "--concurrency", "16",
                        "--prompt-groups", "64", "--group-draw", draw, "--duration", "60",
                        "--warmup", "5", "--print-json")
        assert code == 0, out
        doc = json.loads(out)
        return doc["workload"], doc["points"][0]

    (w_user, p_user), (w_request, p_request) = point("user"), point("request")
    assert (w_user["group_draw"], w_request["group_draw"]) == ("user", "request")
    # 16 pinned users keep 16 prefixes cached; 64 drawn per request outgrow the pool
    assert p_request["cached_token_share"] < 0.6 * p_user["cached_token_share"]


def test_live_sweep_rejects_a_bad_group_draw_before_it_sends_anything(tmp_path: Path) -> None:
    code, out = run("sweep", "--target", "http://127.0.0.1:9", "--engine", "simserver",
                    "--model", "qwen3-8b", "--out", str(tmp_path / "s"),
                    "--group-draw", "per-user")
    assert code == 2, out
    assert "unknown --group-draw 'per-user'" in out
    assert "Traceback" not in out
    assert not (tmp_path / "s").exists()


def test_twin_sweep_takes_a_user_length_file(tmp_path: Path) -> None:
    f = tmp_path / "lengths.jsonl"
    f.write_text('{"input_len": 100, "output_len": 20}\n{"input_len": 300, "output_len": 40}\n')
    code, out = run("twin", "sweep", "--lengths", "file", "--length-file", str(f),
                    "--concurrency", "2", "--duration", "30", "--warmup", "0", "--print-json")
    assert code == 0, out
    assert json.loads(out)["workload"]["lengths"]["num_pairs"] == 2


def test_twin_sweep_as_a_fleet_behind_the_gateway_core() -> None:
    code, out = run("twin", "sweep", "--weights", "fp8", "--kv-cache", "fp8", "--replicas", "2",
                    "--cap", "8", "--queue-depth", "8", "--concurrency", "8,48",
                    "--duration", "60", "--warmup", "5", "--print-json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["target"]["fleet"]["cap"] == 8
    assert [p["fleet"]["max_in_flight"] for p in doc["points"]][-1] == [8, 8]
    assert doc["points"][-1]["requests"]["shed"] > 0
    assert doc["recommended_cap"] is not None and doc["recommended_cap"] <= 8


# --- bad input is a ChatfleetError (one line, exit 2); any other ValueError is a bug ----------


def _bad_files(tmp: Path) -> None:
    (tmp / "binary.dat").write_bytes(b"\x7fELF\x02\x01\x01\x00\xd0\x9f\xff")
    (tmp / "zero.jsonl").write_text('{"input_len": 0, "output_len": 3}\n')
    (tmp / "trace.jsonl").write_text('{"session": 1, "turn": 0, "time": -1, '
                                     '"prompt_tokens": 5}\n')
    (tmp / "profile.json").write_text('{"schema": "not-a-profile"}')
    (tmp / "sweep.json").write_text('{"schema": "chatfleet.sweep/1", "target": {}, '
                                    '"points": []}')
    # a sweep the plan can read, and copies of it each missing what the plan reads
    ok = _sweep_doc()
    (tmp / "sweep-ok.json").write_text(json.dumps(ok))
    (tmp / "sweep-notarget.json").write_text(json.dumps(
        {k: v for k, v in ok.items() if k != "target"}))
    (tmp / "sweep-noweights.json").write_text(json.dumps({**ok, "target": {"gpu": "l4"}}))
    (tmp / "sweep-points.json").write_text(json.dumps({**ok, "points": [{"load": "closed"}]}))
    (tmp / "sweep-figures.json").write_text(json.dumps(
        {**ok, "points": [{k: v for k, v in pt.items() if k != "goodput_rps"}
                          for pt in ok["points"]]}))
    (tmp / "sweep-knee.json").write_text(json.dumps({**ok, "knee": {"meets": 3, "fails": 4}}))
    (tmp / "accuracy.json").write_text(json.dumps(
        {"schema": "chatfleet.accuracy/1", "targets": {"bf16": 0.9}}))
    (tmp / "profile-nocal.json").write_text('{"schema": "chatfleet.profile/1", "gpu": "l4"}')
    (tmp / "trace-huge.jsonl").write_text('{"session": 1, "turn": 0, "time": 0, '
                                          '"prompt_tokens": 100000000000}\n')


def _sweep_doc() -> dict[str, object]:
    """The smallest chatfleet.sweep/1 document with what the plan reads: two closed-loop
    points with their figures, the knee at the first."""
    def point(users: int) -> dict[str, object]:
        return {"load": {"mode": "closed", "concurrency": users}, "valid": True,
                "goodput_rps": 1.0, "output_tok_s": 40.0, "ttft_ms": {"p50": 200, "p99": 400},
                "tpot_ms": {"p50": 50, "p99": 60}}

    return {"schema": "chatfleet.sweep/1", "target": {"gpu": "l4", "weights": "bf16",
                                                      "kv_cache": "bf16"},
            "workload": {}, "slo": {}, "points": [point(1), point(2)],
            "knee": {"meets": 1, "fails": 2}, "knee_rate": {"meets": None, "fails": None}}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("twin", "sweep", "--itl-stat", "median"), "itl_stat must be one of"),
        (("twin", "sweep", "--attainment", "0"), "attainment must be in (0, 1]"),
        (("twin", "sweep", "--max-running-requests", "0"), "the engine cap must be at least 1"),
        (("twin", "sweep", "--schedule-policy", "sjf"), "unknown schedule policy 'sjf'"),
        (("twin", "sweep", "--cap-margin", "-1"), "cap_margin_steps must be >= 0"),
        (("twin", "sweep", "--cap", "4", "--hop-ms", "-1"), "hop_s must not be negative"),
        (("twin", "sweep", "--cap", "4", "--prefill-reserve-ms", "5000"),
         "prefill_reserve_s < ttft_budget_s"),
        (("twin", "sweep", "--profile", "{tmp}/profile.json"), "is not a chatfleet.profile/1"),
        (("twin", "sweep", "--lengths", "file", "--length-file", "{tmp}/zero.jsonl"),
         "input_len must be a positive integer"),
        (("twin", "sweep", "--lengths", "file", "--length-file", "{tmp}/binary.dat"),
         "not UTF-8 text"),
        (("twin", "calibrate", "--from", "{tmp}/sweep.json", "--out", "{tmp}/p.json"),
         "pass --gpu, --weights and --kv-cache"),
        (("plan", "--users", "10", "--slo-ttft-ms", "-1"), "ttft_ms must be a positive"),
        (("cache", "--trace", "{tmp}/trace.jsonl"), "'time' must be a number of seconds"),
        (("sweep", "--target", "http://127.0.0.1:9", "--engine", "simserver", "--model", "m",
          "--out", "{tmp}/s", "--telemetry", "thermometer"), "unknown telemetry source"),
        (("gateway", "--replica", "http://127.0.0.1:9", "--cap", "4", "--state", "etcd"),
         "--state must be memory or redis"),
        # sweep documents missing what the plan and the fit read: one line, not a KeyError
        (("plan", "--users", "10", "--sweep", "{tmp}/sweep-notarget.json"),
         "target.weights and target.kv_cache are needed"),
        (("plan", "--users", "10", "--sweep", "{tmp}/sweep-noweights.json"),
         "target.weights and target.kv_cache are needed"),
        (("plan", "--users", "10", "--sweep", "{tmp}/sweep-points.json"),
         "a sweep point needs a load"),
        (("plan", "--users", "10", "--sweep", "{tmp}/sweep-figures.json"),
         "goodput_rps, output_tok_s, ttft_ms and tpot_ms (p50, p99) must be numbers"),
        (("plan", "--users", "10", "--sweep", "{tmp}/sweep-knee.json", "--cap-margin", "1"),
         "knee.meets 3 is not one of its valid closed-loop points"),
        (("plan", "--users", "10", "--sweep", "{tmp}/binary.dat"), "not UTF-8 text"),
        (("plan", "--users", "10", "--sweep", "{tmp}/sweep-ok.json", "--accuracy",
          "{tmp}/accuracy.json"), "every target must be an object"),
        (("twin", "calibrate", "--from", "{tmp}/sweep-points.json", "--out", "{tmp}/p.json"),
         "a sweep point needs a load"),
        (("twin", "calibrate", "--from", "{tmp}/sweep-ok.json", "--out", "{tmp}/p.json",
          "--gemm-eff", "0"), "--gemm-eff 0.0: a share of the card's peak FLOPS"),
        # sizes that would make the work unbounded (memory, time) or mean nothing
        (("plan", "--users", "2000000"), "at most 1,000,000"),
        (("plan", "--users", "10", "--engine-model", "vllm", "--eviction", "lfu"),
         "--eviction lfu is SGLang's radix policy"),
        (("twin", "sweep", "--rate", "inf"), "every --rate must be a positive number"),
        (("twin", "sweep", "--rate", "1", "--arrival", "gamma:nan"),
         "the gamma burstiness must be a positive number"),
        (("twin", "sweep", "--pool-tokens", "0"), "the KV pool must hold at least one token"),
        (("twin", "sweep", "--engine-model", "vllm", "--max-running-requests", "0"),
         "the engine cap must be at least 1"),
        (("twin", "sweep", "--replicas", "0"), "--replicas and --cap must be at least 1"),
        (("twin", "sweep", "--cap", "0"), "--replicas and --cap must be at least 1"),
        (("cache", "--trace", "{tmp}/trace-huge.jsonl"), "more than the model's context"),
        (("cache", "--user-tokens", "100000000"), "--user-tokens 100000000 is more than"),
        # files that are folders, folders that are files, profiles without their constants
        (("twin", "sweep", "--lengths", "file", "--length-file", "{tmp}"),
         "is a folder: give the path of a file"),
        (("twin", "sweep", "--profile", "{tmp}/profile-nocal.json"), "no 'calibration' object"),
        (("cache", "--trace", "{tmp}"), "is a folder: give the path of a file"),
        # outputs that cannot be written are refused before the work, not after it
        (("plan", "--users", "10", "--sweep", "{tmp}/sweep-ok.json", "--out", "{tmp}"),
         "is a folder: give the path of a file"),
        (("twin", "sweep", "--json", "{tmp}"), "is a folder: give the path of a file"),
        (("cache", "--out", "{tmp}/binary.dat/c.json"), "binary.dat is a file, not a folder"),
        (("demo", "--out", "{tmp}/binary.dat"), "is a file, not a folder: give a folder"),
        (("accuracy", "--target", "a=http://127.0.0.1:9", "--out", "{tmp}"),
         "is a folder: give the path of a file"),
        (("sweep", "--target", "http://127.0.0.1:9", "--engine", "simserver", "--model", "m",
          "--lengths", "fixed", "--out", "{tmp}/binary.dat"), "is a file, not a folder"),
        # a target that answers nothing: one line before the sweep, not a sweep of failures
        (("sweep", "--target", "http://127.0.0.1:9", "--engine", "simserver", "--model", "m",
          "--lengths", "fixed", "--concurrency", "1", "--duration", "2", "--warmup", "0",
          "--out", "{tmp}/s"), "cannot reach --target http://127.0.0.1:9"),
    ],
)
@pytest.mark.timeout(60)
def test_bad_input_anywhere_is_one_error_line_and_exit_2(tmp_path: Path, args: tuple[str, ...],
                                                         message: str) -> None:
    _bad_files(tmp_path)
    res = runner.invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert res.exit_code == 2, (res.output, res.exception)
    out = " ".join(res.output.split())  # rich wraps long lines
    assert out.count("error:") == 1, out
    assert message in out.partition("error:")[2]
    assert "Traceback" not in out


@pytest.mark.parametrize("args", [
    ("plan", "--users", "10", "--duration", "nan"),
    ("twin", "sweep", "--concurrency", "1", "--duration", "5", "--warmup", "0",
     "--think-time", "inf"),
    ("twin", "sweep", "--concurrency", "1", "--cap", "4", "--hop-ms", "nan"),
    ("twin", "calibrate", "--from", "{tmp}/x.json", "--out", "{tmp}/p.json", "--gemm-eff",
     "nan"),
    ("cache", "--sessions", "4", "--arrival-gap", "-inf"),
    ("demo", "--no-live", "--out", "{tmp}/demo", "--live-seconds", "nan"),
    ("sweep", "--target", "http://127.0.0.1:9", "--engine", "simserver", "--model", "m",
     "--out", "{tmp}/s", "--duration", "inf"),
])
@pytest.mark.timeout(60)
def test_a_float_flag_given_nan_or_inf_is_a_usage_error(tmp_path: Path,
                                                        args: tuple[str, ...]) -> None:
    """Every command's float flags take numbers only: nan and inf, which the flag parser
    takes as floats, are refused before the command runs."""
    res = runner.invoke(app, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert res.exit_code == 2, (res.output, res.exception)
    assert "is not a finite number" in " ".join(res.output.split())
    assert "Traceback" not in res.output


@pytest.mark.timeout(60)
def test_a_live_sweep_of_a_server_that_is_not_an_engine_is_refused_before_it_runs(
        tmp_path: Path) -> None:
    """A target that answers 404 for /v1/models (a wrong port or path) once ran a whole
    sweep of failed requests and exited 0."""
    from tests.processes import not_an_engine

    with not_an_engine() as url:
        code, out = run("sweep", "--target", url, "--engine", "simserver", "--model", "m",
                        "--lengths", "fixed", "--concurrency", "1", "--duration", "2",
                        "--warmup", "0", "--out", str(tmp_path / "s"))
    text = " ".join(out.split())
    assert code == 2, out
    assert text.count("error:") == 1 and "answers 404 for /v1/models" in text, text
    assert not (tmp_path / "s" / "runs.jsonl").exists()


def test_clean_errors_turns_a_path_the_user_gave_into_one_line(tmp_path: Path) -> None:
    """An OSError about a file (a folder given as a file, a file in the path) is the user's
    input; one without a file name (a socket's) is not, and keeps its traceback."""
    import typer

    from chatfleet.cli.common import clean_errors

    for exc in (IsADirectoryError(21, "Is a directory", str(tmp_path)),
                NotADirectoryError(20, "Not a directory", str(tmp_path / "file" / "x")),
                PermissionError(13, "Permission denied", str(tmp_path / "theirs"))):
        with pytest.raises(typer.Exit) as exit_info, clean_errors():
            raise exc
        assert exit_info.value.exit_code == 2
    with pytest.raises(ConnectionRefusedError), clean_errors():
        raise ConnectionRefusedError(111, "Connection refused")


def test_a_value_error_that_is_not_bad_input_keeps_its_traceback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug (here `int("x")` inside the pool sizing) is not disguised as a user error."""
    import chatfleet.cli.plan as plan_cli

    def broken(*args: object, **kwargs: object) -> None:
        int("x")

    monkeypatch.setattr(plan_cli, "plan_pool", broken)
    res = runner.invoke(app, ["plan"])
    assert res.exit_code != 2
    assert type(res.exception) is ValueError
    assert "error:" not in res.output


def test_clean_errors_turns_only_chatfleet_errors_into_exit_2() -> None:
    import typer

    from chatfleet.cli.common import clean_errors
    from chatfleet.core.errors import ChatfleetError
    from chatfleet.core.specs import SpecError

    for user_error in (ChatfleetError("bad flag"), SpecError("unknown GPU")):
        with pytest.raises(typer.Exit) as exit_info, clean_errors():
            raise user_error
        assert exit_info.value.exit_code == 2
    with pytest.raises(ValueError, match="not a user error"), clean_errors():
        raise ValueError("not a user error")


def test_each_flag_default_is_read_from_its_one_home() -> None:
    """The run window, the SLO, the reference lengths and the gateway's queue come from the
    module or dataclass that owns them, so a flag cannot drift from the code's default."""
    import typer.main

    from chatfleet.bench.sweep_config import LiveSweepConfig
    from chatfleet.core import defaults
    from chatfleet.core.fleet.fleet import FleetSettings
    from chatfleet.core.slo import SLO
    from chatfleet.core.workload import LengthSpec, WorkloadConfig
    from chatfleet.gateway.config import GatewayConfig
    from chatfleet.twin.fleet import FleetConfig
    from chatfleet.twin.sweep import TwinSweep

    root = typer.main.get_command(app)

    def flag_defaults(*path: str) -> dict[str, object]:
        cmd = root
        for name in path:
            cmd = cmd.commands[name]  # type: ignore[attr-defined]
        return {p.name: p.default for p in cmd.params if p.name is not None}

    slo, lengths = SLO(), LengthSpec()
    for path in (("twin", "sweep"), ("sweep",), ("plan",)):
        got = flag_defaults(*path)
        assert (got["slo_ttft_ms"], got["slo_tpot_ms"], got["itl_stat"], got["attainment"]) == (
            slo.ttft_ms, slo.tpot_ms, slo.itl_stat, slo.attainment), path
        assert (got["duration"], got["warmup"], got["seed"]) == (
            defaults.DURATION_S, defaults.WARMUP_S, defaults.SEED), path
        assert got["system_prompt_tokens"] == WorkloadConfig().system_prompt_tokens, path
        assert (got["input_len"], got["output_len"]) == (lengths.input_len, lengths.output_len)
    assert flag_defaults("sweep")["drain"] == defaults.DRAIN_S
    assert flag_defaults("sweep")["cooldown_max"] == defaults.COOLDOWN_MAX_S
    assert flag_defaults("twin", "sweep")["queue_depth"] == FleetSettings().queue_depth
    fleet = FleetSettings()
    for cfg in (GatewayConfig(), FleetConfig(replicas=1, cap=1)):
        assert (cfg.queue_depth, cfg.ttft_budget_s, cfg.prefill_reserve_s) == (
            fleet.queue_depth, fleet.ttft_budget_s, fleet.prefill_reserve_s)
    live = LiveSweepConfig([], "sglang", "m", [], WorkloadConfig(), Path("."))
    twin = TwinSweep(None, WorkloadConfig(), slo)  # type: ignore[arg-type]
    assert (live.drain_s, live.cooldown_max_s) == (defaults.DRAIN_S, defaults.COOLDOWN_MAX_S)
    for run in (live, twin):
        assert (run.duration_s, run.warmup_s, run.seed) == (
            defaults.DURATION_S, defaults.WARMUP_S, defaults.SEED)


def test_an_error_is_one_line_however_long_its_path(tmp_path: Path) -> None:
    """The console is 80 columns wide when stderr is not a terminal: a long path was wrapped,
    sometimes at the comma after it ('t.jsonl\\n, line 2'), and the error took three lines."""
    missing = tmp_path / ("x" * 150) / "t.jsonl"
    res = runner.invoke(app, ["cache", "--trace", str(missing)])
    assert res.exit_code == 2
    assert res.output.count("\n") == 1 and str(missing) in res.output, res.output


def test_a_ctrl_c_during_a_progress_update_waits_for_the_updates_end() -> None:
    """The progress bar's updates defer SIGINT (a KeyboardInterrupt inside rich's lock could
    leave it held, and the bar's exit would wait for its refresh thread forever)."""
    class Interrupted(Exception):
        pass

    def interrupt(*_: object) -> None:
        raise Interrupted

    before = signal.signal(signal.SIGINT, interrupt)
    inside = False
    try:
        with pytest.raises(Interrupted), sigint_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(100_000))  # bytecode runs: an unblocked signal would stop it here
            inside = True
    finally:
        signal.signal(signal.SIGINT, before)
    assert inside


@pytest.mark.parametrize(("given", "kept"), [(None, "1"), ("4", "4")])
def test_the_command_line_keeps_openblas_to_one_thread_unless_told(given: str | None,
                                                                     kept: str) -> None:
    # OpenBLAS's helper threads spin for CPU at numpy's import, in the plan's workers too
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    if given is not None:
        env["OPENBLAS_NUM_THREADS"] = given
    code = ("import os, chatfleet.cli, numpy; "  # a native thread is a task of the process
            "print(os.environ['OPENBLAS_NUM_THREADS'], len(os.listdir('/proc/self/task')))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, timeout=60).stdout.split()
    assert out[0] == kept
    if kept == "1":
        assert out[1] == "1"  # numpy started no helper thread
