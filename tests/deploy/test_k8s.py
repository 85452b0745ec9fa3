"""`chatfleet deploy k8s`: the committed example set is what the generator writes, every object
passes the Kubernetes schemas (kubernetes-validate, offline, strict), the Prometheus files pass
promtool, and every dashboard query reads metrics that really exist."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from chatfleet.cli import app
from chatfleet.deploy.k8s import monitoring
from chatfleet.gateway.config import parse_config
from chatfleet.gateway.metrics import GatewayMetrics, Gauges, exposition, registry

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "deploy" / "k8s"
# the command that wrote deploy/k8s (docs/deploy.md says the same); the release's image, as
# the default names the image of the checkout's commit (tests/deploy/test_image_files.py)
EXAMPLE_ARGS = ["deploy", "k8s", "--cap", "16", "--weights", "fp8", "--kv-cache", "fp8",
                "--replicas", "4", "--gateways", "2", "--image-chatfleet", "chatfleet:0.1.0"]
# an older Kubernetes minor and the newest schema the package ships
K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (Debian package prometheus; make "
    "system-deps installs it as root)")

# the keys `chatfleet plan --json` emits (issue 6), with values as it would give them
PLAN = {
    "recommendation": {"precision": "fp8", "users_per_card": 16, "gateway_cap": 12,
                       "replicas": 3, "cards": 3, "weights": "fp8", "kv_cache": "fp8"},
    "launch": {
        "sglang": {"argv": ["python", "-m", "sglang.launch_server", "--model-path",
                            "Qwen/Qwen3-8B-FP8", "--host", "127.0.0.1", "--port", "30000",
                            "--kv-cache-dtype", "fp8_e4m3", "--max-running-requests", "12",
                            "--enable-metrics", "--enable-cache-report"],
                   "env": {"SGLANG_EXAMPLE": "1"}, "notes": ["a note"]},
        "vllm": {"argv": ["vllm", "serve", "Qwen/Qwen3-8B-FP8"], "env": {}, "notes": []}},
    "gateway_config": {"cap": 12, "queue_depth": 24, "ttft_budget_s": 1.0,
                       "replicas": [{"name": "placeholder", "url": "http://10.0.0.1:30000"}],
                       "routing": {"gpu": "l4", "weights": "fp8", "kv_cache": "fp8",
                                   "shared_prefix_tokens": 2048}},
    "kv_pool_tokens": 142369,
}


def generate(out: Path, *args: str) -> dict[str, Any]:
    res = CliRunner().invoke(app, [*args, "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def objects(folder: Path) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d
            for f in sorted(folder.glob("*.yaml")) for d in docs(f)}


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("k8s")
    generate(out, *EXAMPLE_ARGS)
    return out


def test_committed_example_is_what_the_generator_writes(example: Path) -> None:
    made = sorted(p.relative_to(example) for p in example.rglob("*") if p.is_file())
    committed = sorted(p.relative_to(EXAMPLE) for p in EXAMPLE.rglob("*") if p.is_file())
    assert made == committed, "deploy/k8s differs in its files: regenerate it (docs/deploy.md)"
    for rel in made:
        assert (EXAMPLE / rel).read_text() == (example / rel).read_text(), (
            f"deploy/k8s/{rel} drifted from the generator: regenerate it (docs/deploy.md)")


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_object_passes_the_kubernetes_schemas(example: Path, version: str) -> None:
    checked = []
    for f in sorted(example.glob("*.yaml")):
        for d in docs(f):
            kubernetes_validate.validate(d, version, strict=True)  # raises with the path
            checked.append(d["kind"])
    assert sorted(set(checked)) == ["ConfigMap", "Deployment", "Namespace",
                                    "PersistentVolumeClaim", "Service"]
    assert checked.count("Deployment") == 4 + 2  # sglang-0..3, redis, the gateway


def test_a_broken_object_fails_the_schema_check() -> None:
    """The validator is not a no-op: a wrong type and an unknown field are caught."""
    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
           "spec": {"ports": [{"port": "http"}]}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[0], strict=True)
    unknown = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}, "sepc": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(unknown, K8S_VERSIONS[0], strict=True)


def test_one_service_per_replica_and_the_gateway_config_points_at_them(example: Path) -> None:
    objs = objects(example)
    cm = objs[("ConfigMap", "chatfleet-gateway")]
    cfg = parse_config(yaml.safe_load(cm["data"]["gateway.yaml"]))  # the gateway's own parser
    assert cfg.cap == 16
    assert [(r.name, r.url) for r in cfg.replicas] == [
        (f"sglang-{i}", f"http://sglang-{i}:30000") for i in range(4)]
    for i in range(4):
        svc = objs[("Service", f"sglang-{i}")]
        dep = objs[("Deployment", f"sglang-{i}")]
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        # this Service selects this replica's pod and no other replica's
        for j in range(4):
            other = objs[("Deployment", f"sglang-{j}")]["spec"]["template"]["metadata"]["labels"]
            selected = all(other.get(k) == v for k, v in svc["spec"]["selector"].items())
            assert selected == (i == j)
        assert all(pod_labels.get(k) == v
                   for k, v in dep["spec"]["selector"]["matchLabels"].items())
        assert svc["spec"]["ports"][0]["port"] == 30000
    gw = objs[("Deployment", "chatfleet-gateway")]
    assert gw["spec"]["replicas"] == 2
    [c] = gw["spec"]["template"]["spec"]["containers"]
    # the gateways know how many share Redis (their fallback share is cap // 2), and a rollout
    # never runs a third beside them
    assert c["command"] == ["chatfleet", "gateway", "--config", "/etc/chatfleet/gateway.yaml",
                            "--state", "redis://redis:6379/0", "--gateways", "2",
                            "--host", "0.0.0.0", "--port", "8080"]
    assert gw["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert ("Service", "redis") in objs and ("Service", "chatfleet-gateway") in objs
    redis_cmd = objs[("Deployment", "redis")]["spec"]["template"]["spec"]["containers"][0]
    assert redis_cmd["command"] == ["redis-server", "--save", "", "--appendonly", "no"]


def test_sglang_pods_ask_for_one_l4_and_serve_the_planned_command(example: Path) -> None:
    dep = objects(example)[("Deployment", "sglang-2")]
    pod = dep["spec"]["template"]
    spec = pod["spec"]
    [c] = spec["containers"]
    cmd = c["command"]
    assert cmd[:3] == ["python3", "-m", "sglang.launch_server"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"
    assert cmd[cmd.index("--port") + 1] == "30000"
    assert cmd[cmd.index("--max-running-requests") + 1] == "16"  # the engine cap = the cap
    assert cmd[cmd.index("--model-path") + 1] == "Qwen/Qwen3-8B-FP8"
    assert cmd[cmd.index("--kv-cache-dtype") + 1] == "fp8_e4m3"
    assert "--enable-metrics" in cmd
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert spec["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists",
            "effect": "NoSchedule"} in spec["tolerations"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health"
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # weights load
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert mounts["dshm"] == "/dev/shm" and volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["hf-cache"]["persistentVolumeClaim"]["claimName"] == "hf-cache-sglang-2"
    ann = pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert int(ann["prometheus.io/port"]) == c["ports"][0]["containerPort"] == 30000
    assert dep["spec"]["strategy"]["type"] == "Recreate"


def test_a_plan_file_supplies_the_command_cap_replicas_and_gateway_config(
        tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    doc = generate(tmp_path / "out", "deploy", "k8s", "--plan", str(plan), "--gateways", "3",
                   "--namespace", "serving")
    assert (doc["replicas"], doc["cap"], doc["gateways"]) == (3, 12, 3)
    objs = objects(tmp_path / "out")
    assert ("Deployment", "sglang-2") in objs and ("Deployment", "sglang-3") not in objs
    c = objs[("Deployment", "sglang-0")]["spec"]["template"]["spec"]["containers"][0]
    argv = PLAN["launch"]["sglang"]["argv"]  # type: ignore[index]
    assert c["command"] == ["python3", *argv[1:6], "0.0.0.0", *argv[7:]]
    assert {"name": "SGLANG_EXAMPLE", "value": "1"} in c["env"]
    assert all(o["metadata"].get("namespace", "serving") == "serving" for o in objs.values())
    raw = yaml.safe_load(objs[("ConfigMap", "chatfleet-gateway")]["data"]["gateway.yaml"])
    assert raw["queue_depth"] == 24 and raw["routing"]["shared_prefix_tokens"] == 2048
    assert [r["name"] for r in raw["replicas"]] == ["sglang-0", "sglang-1", "sglang-2"]
    # --replicas overrides the plan's recommendation
    doc = generate(tmp_path / "out5", "deploy", "k8s", "--plan", str(plan), "--replicas", "5")
    assert doc["replicas"] == 5
    assert ("Deployment", "sglang-4") in objects(tmp_path / "out5")


@pytest.mark.parametrize(("drop", "message"), [
    ("launch", "launch.sglang.argv"),
    ("recommendation", "recommendation.gateway_cap"),
    ("gateway_config", "gateway_config"),
])
def test_a_plan_without_its_keys_is_a_clear_error(tmp_path: Path, drop: str,
                                                  message: str) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({k: v for k, v in PLAN.items() if k != drop}))
    res = CliRunner().invoke(app, ["deploy", "k8s", "--plan", str(plan), "--out",
                                   str(tmp_path / "out")])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "message"), [
    ([], "--cap, --weights, --kv-cache"),
    (["--cap", "16", "--weights", "fp8"], "--kv-cache"),
    (["--cap", "0", "--weights", "fp8", "--kv-cache", "fp8"], "--cap"),
    (["--cap", "8", "--weights", "int3", "--kv-cache", "fp8"], "int3"),
    (["--cap", "8", "--weights", "fp8", "--kv-cache", "fp8", "--namespace", "Bad_NS"],
     "--namespace"),
    (["--cap", "8", "--weights", "fp8", "--kv-cache", "fp8", "--gateways", "0"], "--gateways"),
    (["--cap", "8", "--weights", "fp8", "--kv-cache", "fp8", "--replicas", "0"], "--replicas"),
    (["--cap", "8", "--weights", "fp8", "--kv-cache", "fp8", "--model", "llama"], "llama"),
    (["--plan", "/no/such/plan.json"], "/no/such/plan.json"),
])
def test_bad_input_exits_2_with_a_message(tmp_path: Path, args: list[str],
                                          message: str) -> None:
    res = CliRunner().invoke(app, ["deploy", "k8s", *args, "--out", str(tmp_path / "o")])
    assert res.exit_code == 2, res.output
    assert message in " ".join(res.output.split()), res.output
    assert "Traceback" not in res.output


@pytest.mark.parametrize(("content", "message"), [
    (b"\x7fELF\x02\x01\x01\x00\xd0\x9f\xff", "not UTF-8 text"),
    (b"launch: [python]\n", "is not valid JSON"),
    (b"[1, 2, 3]", "the top level must be an object"),
    (b'{"schema": "chatfleet.sweep/1", "points": []}', "missing launch.sglang.argv"),
])
def test_a_plan_file_that_is_not_a_plan_is_one_line(tmp_path: Path, content: bytes,
                                                    message: str) -> None:
    """A binary, non-JSON or wrong-schema --plan file is one line and exit 2 (a binary one
    was a UnicodeDecodeError traceback), and nothing is written."""
    plan = tmp_path / "plan.json"
    plan.write_bytes(content)
    res = CliRunner().invoke(app, ["deploy", "k8s", "--plan", str(plan), "--out",
                                   str(tmp_path / "out")])
    assert res.exit_code == 2, (res.output, res.exception)
    text = " ".join(res.output.split())
    assert text.count("error:") == 1 and message in text, text
    assert "Traceback" not in res.output
    assert not (tmp_path / "out").exists()


def test_an_out_that_is_a_file_is_refused_before_writing(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.write_text("keep me")
    res = CliRunner().invoke(app, ["deploy", "k8s", "--cap", "8", "--weights", "fp8",
                                   "--kv-cache", "fp8", "--out", str(target)])
    assert res.exit_code == 2, (res.output, res.exception)
    assert "is a file, not a folder" in " ".join(res.output.split())
    assert target.read_text() == "keep me"


def test_plan_and_flags_together_are_refused(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(PLAN))
    res = CliRunner().invoke(app, ["deploy", "k8s", "--plan", str(plan), "--cap", "4",
                                   "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "--cap" in res.output


# --- Prometheus and Grafana --------------------------------------------------------------------
def gateway_metric_names() -> set[str]:
    """Every sample name a gateway's /metrics page carries (each family given a sample)."""
    m = GatewayMetrics()
    m.requests["ok"] += 1
    m.shed["queue_full"] += 1
    m.upstream_failures["r"] += 1
    m.ejections["r"] += 1
    m.ttft.observe(0.1)
    m.itl.observe(0.01)
    gauges = Gauges(queue_depth=1, in_flight={"r": 1}, caps={"r": 4}, shares={"r": 4},
                    healthy={"r": True},
                    sessions=1, routes={"hit": 1}, state_up=1, others={"r": 0})
    text = exposition(registry(m, lambda: gauges)).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def test_every_dashboard_query_reads_metrics_that_exist(example: Path) -> None:
    dash = json.loads((example / "monitoring" / "grafana-dashboard.json").read_text())
    known = gateway_metric_names() | monitoring.sglang_metric_names()
    used: set[str] = set()
    for ref, expr in monitoring.dashboard_exprs(dash):
        names = monitoring.metric_names(expr)
        assert names, f"panel {ref} reads no chatfleet or SGLang metric: {expr}"
        assert names <= known, f"panel {ref}: {sorted(names - known)} do not exist"
        used |= names
    for wanted in ("chatfleet_gateway_ttft_seconds_bucket", "chatfleet_gateway_in_flight",
                   "chatfleet_gateway_cap", "chatfleet_gateway_shed_total",
                   "chatfleet_gateway_queue_depth", "chatfleet_gateway_upstream_failures_total",
                   "chatfleet_gateway_replica_healthy", "chatfleet_gateway_state_up",
                   "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:token_usage",
                   "sglang:cache_hit_rate"):
        assert wanted in used, f"the dashboard has no panel on {wanted}"
    # the ConfigMap carries the same dashboard
    cm = objects(example)[("ConfigMap", "grafana-dashboard-chatfleet")]
    assert json.loads(cm["data"]["chatfleet.json"]) == dash
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60,
                          check=False)


@needs_promtool
def test_dashboard_queries_pass_promtool_check_rules(tmp_path: Path, example: Path) -> None:
    dash = json.loads((example / "monitoring" / "grafana-dashboard.json").read_text())
    rules = tmp_path / "dashboard-rules.yml"
    doc = monitoring.dashboard_rules(dash)
    rules.write_text(yaml.safe_dump(doc))
    res = promtool("check", "rules", str(rules))
    assert res.returncode == 0, res.stdout + res.stderr
    n = len(monitoring.dashboard_exprs(dash))
    assert f"SUCCESS: {n} rules found" in res.stdout + res.stderr
    # and promtool does reject a broken query, so the check means something
    doc["groups"][0]["rules"][0]["expr"] = "sum by (le (rate(x[5m]))"
    rules.write_text(yaml.safe_dump(doc))
    assert promtool("check", "rules", str(rules)).returncode != 0


def without_kubernetes_sd(cfg: dict[str, Any]) -> dict[str, Any]:
    """The scrape config with each kubernetes_sd_configs swapped for a static target: all else
    (globals, relabelling, regexes) stays for promtool to check."""
    jobs = []
    for job in cfg["scrape_configs"]:
        job = dict(job)
        job.pop("kubernetes_sd_configs")
        job["static_configs"] = [{"targets": ["127.0.0.1:9"]}]
        jobs.append(job)
    return {**cfg, "scrape_configs": jobs}


@needs_promtool
def test_prometheus_config_passes_promtool_check_config(tmp_path: Path,
                                                        example: Path) -> None:
    path = example / "monitoring" / "prometheus.yml"
    cfg = yaml.safe_load(path.read_text())
    assert cfg == yaml.safe_load(
        objects(example)[("ConfigMap", "prometheus-config")]["data"]["prometheus.yml"])
    for job in cfg["scrape_configs"]:  # what promtool may not know: checked here
        assert job["kubernetes_sd_configs"] == [{"role": "pod",
                                                 "namespaces": {"names": ["chatfleet"]}}]
    res = promtool("check", "config", str(path))
    if "kubernetes_sd_configs not found" in res.stdout + res.stderr:
        # Debian's prometheus is built without Kubernetes service discovery
        swapped = tmp_path / "prometheus.yml"
        swapped.write_text(yaml.safe_dump(without_kubernetes_sd(cfg)))
        res = promtool("check", "config", str(swapped))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout + res.stderr


@pytest.mark.timeout(300)
def test_the_real_plan_document_deploys(tmp_path: Path) -> None:
    """`chatfleet plan --users N --json` (short twin sweeps) feeds `deploy k8s --plan`: the
    contract between the two commands, end to end, schemas included."""
    res = CliRunner().invoke(app, ["plan", "--users", "64", "--json", "--duration", "60",
                                   "--warmup", "10", "--grid", "4,8,16,24,32",
                                   "--rates", "1,2"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    plan = tmp_path / "plan.json"
    plan.write_text(res.stdout)
    made = generate(tmp_path / "out", "deploy", "k8s", "--plan", str(plan))
    rec = doc["recommendation"]
    assert (made["replicas"], made["cap"]) == (rec["replicas"], rec["gateway_cap"])
    objs = objects(tmp_path / "out")
    for obj in objs.values():
        kubernetes_validate.validate(obj, K8S_VERSIONS[0], strict=True)
    c = objs[("Deployment", "sglang-0")]["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][3:] == doc["launch"]["sglang"]["argv"][3:]  # host/port already set
    cfg = parse_config(yaml.safe_load(
        objs[("ConfigMap", "chatfleet-gateway")]["data"]["gateway.yaml"]))
    assert cfg.cap == rec["gateway_cap"] and len(cfg.replicas) == rec["replicas"]
