"""The Kubernetes objects of a fleet: the cluster options (`K8sOptions`), each SGLang replica's
Deployment and Service, the gateways and their config, Redis.

Each SGLang replica gets its own Deployment and ClusterIP Service (sglang-0, sglang-1, ...):
the gateway keeps each session on the replica that holds its prefix, so it needs one stable
address per replica; one Service over all replicas would load-balance and scatter sessions.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from chatfleet import __version__
from chatfleet.deploy import image
from chatfleet.deploy.k8s.plan import SGLANG_PORT, DeployError, DeployPlan
from chatfleet.gateway.config import ConfigError, parse_config

GATEWAY_PORT = image.PORT  # the port the image declares
REDIS_PORT = 6379
DEFAULT_IMAGE_SGLANG = "lmsysorg/sglang:v0.5.23"
# the release's image; `chatfleet deploy k8s` names the one `make image` tags in its checkout
DEFAULT_IMAGE_CHATFLEET = image.reference(__version__)
DEFAULT_IMAGE_REDIS = "redis:7.4"
# GKE's node label for the accelerator of a node pool (other clouds name it differently)
L4_NODE_SELECTOR = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
PART_OF = "chatfleet"
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, slots=True)
class K8sOptions:
    namespace: str = "chatfleet"
    gateways: int = 2
    image_sglang: str = DEFAULT_IMAGE_SGLANG
    image_chatfleet: str = DEFAULT_IMAGE_CHATFLEET
    image_redis: str = DEFAULT_IMAGE_REDIS

    def check(self) -> K8sOptions:
        if not _DNS_LABEL.match(self.namespace):
            raise DeployError(f"--namespace {self.namespace!r} is not a DNS label (a-z, 0-9 "
                              "and -, at most 63)")
        if self.gateways < 1:
            raise DeployError("--gateways must be at least 1")
        for flag, ref in (("--image-sglang", self.image_sglang),
                          ("--image-chatfleet", self.image_chatfleet)):
            if not ref or any(c.isspace() for c in ref):
                raise DeployError(f"{flag} {ref!r} is not an image reference")
        return self


def container_command(argv: Sequence[str]) -> list[str]:
    """The plan's SGLang command for the container: listening on 0.0.0.0:30000, and `python3`
    (the SGLang image has no `python`)."""
    out = list(argv)
    if out and out[0] == "python":
        out[0] = "python3"
    for flag, value in (("--host", "0.0.0.0"), ("--port", str(SGLANG_PORT))):
        if flag in out:
            i = out.index(flag)
            if i + 1 >= len(out):
                raise DeployError(f"launch.sglang.argv: {flag} has no value")
            out[i + 1] = value
        else:
            out += [flag, value]
    return out


def replica_name(i: int) -> str:
    return f"sglang-{i}"


def object_meta(name: str, ns: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if labels:
        meta["labels"] = dict(labels)
    return meta


def app_labels(app: str, instance: str | None = None) -> dict[str, str]:
    labels = {"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": PART_OF}
    if instance is not None:
        labels["app.kubernetes.io/instance"] = instance
    return labels


def _scrape(port: int) -> dict[str, str]:
    return {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
            "prometheus.io/path": "/metrics"}


def _http_probe(path: str, period: int, timeout: int, failures: int) -> dict[str, Any]:
    return {"httpGet": {"path": path, "port": "http"}, "periodSeconds": period,
            "timeoutSeconds": timeout, "failureThreshold": failures}


def _service(name: str, ns: str, labels: Mapping[str, str], selector: Mapping[str, str],
             port: int, port_name: str = "http") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Service", "metadata": object_meta(name, ns, labels),
            "spec": {"type": "ClusterIP", "selector": dict(selector),
                     "ports": [{"name": port_name, "port": port, "targetPort": port_name,
                                "protocol": "TCP"}]}}


def sglang_replica(i: int, plan: DeployPlan, opts: K8sOptions) -> list[dict[str, Any]]:
    """A HF-cache claim, a Deployment of one pod on one L4, and its own Service."""
    ns, name = opts.namespace, replica_name(i)
    labels = app_labels("sglang", name)
    cache = f"hf-cache-{name}"
    env = [{"name": "HF_HOME", "value": "/root/.cache/huggingface"},
           *({"name": k, "value": v} for k, v in sorted(plan.env.items()))]
    container = {
        "name": "sglang", "image": opts.image_sglang,
        "command": container_command(plan.argv), "env": env,
        "ports": [{"name": "http", "containerPort": SGLANG_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "4", "memory": "20Gi"},
                      "limits": {"memory": "26Gi", "nvidia.com/gpu": 1}},
        # weights download and load, then CUDA-graph capture: up to 20 minutes on a cold cache
        "startupProbe": _http_probe("/health", 10, 5, 120),
        "readinessProbe": _http_probe("/health", 5, 5, 3),
        "livenessProbe": _http_probe("/health", 15, 10, 4),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "hf-cache", "mountPath": "/root/.cache/huggingface"}],
    }
    pod = {"metadata": {"labels": labels, "annotations": _scrape(SGLANG_PORT)},
           "spec": {"nodeSelector": dict(L4_NODE_SELECTOR), "tolerations": [GPU_TOLERATION],
                    "terminationGracePeriodSeconds": 60, "containers": [container],
                    "volumes": [{"name": "dshm",
                                 "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}},
                                {"name": "hf-cache",
                                 "persistentVolumeClaim": {"claimName": cache}}]}}
    return [
        {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
         "metadata": object_meta(cache, ns, labels),
         "spec": {"accessModes": ["ReadWriteOnce"],
                  "resources": {"requests": {"storage": "30Gi"}}}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": object_meta(name, ns, labels),
         # one GPU each and a claim that one node mounts: the old pod goes before the new one
         "spec": {"replicas": 1, "strategy": {"type": "Recreate"},
                  "selector": {"matchLabels": {"app.kubernetes.io/name": "sglang",
                                               "app.kubernetes.io/instance": name}},
                  "template": pod}},
        _service(name, ns, labels, {"app.kubernetes.io/name": "sglang",
                                    "app.kubernetes.io/instance": name}, SGLANG_PORT),
    ]


def gateway_config(plan: DeployPlan) -> dict[str, Any]:
    """The plan's gateway config with the replicas pointed at the sglang-i Services, checked
    by the gateway's own parser."""
    replicas = [{"name": replica_name(i), "url": f"http://{replica_name(i)}:{SGLANG_PORT}"}
                for i in range(plan.replicas)]
    cfg = {"replicas": replicas, **{k: copy.deepcopy(v) for k, v in
                                    plan.gateway_config.items() if k != "replicas"}}
    try:
        parse_config(cfg)
    except ConfigError as exc:
        raise DeployError(f"gateway_config: {exc}") from exc
    return cfg


def gateway(plan: DeployPlan, opts: K8sOptions) -> list[dict[str, Any]]:
    ns = opts.namespace
    labels = app_labels("chatfleet-gateway")
    selector = {"app.kubernetes.io/name": "chatfleet-gateway"}
    text = yaml.safe_dump(gateway_config(plan), sort_keys=False, width=100)
    container = {
        "name": "gateway", "image": opts.image_chatfleet,
        "command": ["chatfleet", "gateway", "--config", "/etc/chatfleet/gateway.yaml",
                    "--state", f"redis://redis:{REDIS_PORT}/0",
                    "--gateways", str(opts.gateways), "--host", "0.0.0.0",
                    "--port", str(GATEWAY_PORT)],
        "ports": [{"name": "http", "containerPort": GATEWAY_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "1", "memory": "512Mi"},
                      "limits": {"memory": "1Gi"}},
        "readinessProbe": _http_probe("/ready", 5, 2, 3),
        "livenessProbe": _http_probe(image.HEALTH_PATH, 10, 5, 3),
        "volumeMounts": [{"name": "config", "mountPath": "/etc/chatfleet", "readOnly": True}],
    }
    return [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": object_meta("chatfleet-gateway", ns, labels),
         "data": {"gateway.yaml": text}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": object_meta("chatfleet-gateway", ns, labels),
         "spec": {"replicas": opts.gateways, "selector": {"matchLabels": selector},
                  # never more gateways than --gateways: each may serve cap // N of every
                  # replica while Redis is unreachable (docs/gateway.md), so a rollout
                  # replaces a pod instead of adding one first
                  "strategy": {"type": "RollingUpdate",
                               "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
                  "template": {
                      "metadata": {"labels": labels, "annotations": _scrape(GATEWAY_PORT)},
                      "spec": {
                          "terminationGracePeriodSeconds": 60,
                          "topologySpreadConstraints": [{
                              "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                              "whenUnsatisfiable": "ScheduleAnyway",
                              "labelSelector": {"matchLabels": selector}}],
                          "containers": [container],
                          "volumes": [{"name": "config",
                                       "configMap": {"name": "chatfleet-gateway"}}]}}}},
        _service("chatfleet-gateway", ns, labels, selector, GATEWAY_PORT),
    ]


def redis(opts: K8sOptions) -> list[dict[str, Any]]:
    """One Redis, nothing persisted: the gateways re-assert their leases and sessions when it
    comes back empty."""
    ns = opts.namespace
    labels = app_labels("redis")
    selector = {"app.kubernetes.io/name": "redis"}
    container = {
        "name": "redis", "image": opts.image_redis,
        "command": ["redis-server", "--save", "", "--appendonly", "no"],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                      "limits": {"memory": "512Mi"}},
        "readinessProbe": {"tcpSocket": {"port": REDIS_PORT}, "periodSeconds": 5},
        "livenessProbe": {"exec": {"command": ["redis-cli", "ping"]}, "periodSeconds": 10,
                          "timeoutSeconds": 5},
    }
    return [
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": object_meta("redis", ns, labels),
         "spec": {"replicas": 1, "selector": {"matchLabels": selector},
                  "template": {"metadata": {"labels": labels},
                               "spec": {"containers": [container]}}}},
        _service("redis", ns, labels, selector, REDIS_PORT, "redis"),
    ]
