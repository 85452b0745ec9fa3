"""What Prometheus scrapes (the gateways and the SGLang replicas, found by pod discovery) and the
Grafana dashboard, with the helpers its checks use: the metric names every query reads, and
every query as a recording rule that `promtool check rules` parses."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from chatfleet.engines.sglang import SGLANG_METRICS


def _pod_job(name: str, app: str, ns: str, extra: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "job_name": name,
        "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [ns]}}],
        "relabel_configs": [
            {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
             "regex": app, "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
             "regex": "true", "action": "keep"},
            {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
             "regex": "(.+)", "target_label": "__metrics_path__"},
            {"source_labels": ["__address__",
                               "__meta_kubernetes_pod_annotation_prometheus_io_port"],
             "regex": r"([^:]+)(?::\d+)?;(\d+)", "replacement": "$1:$2",
             "target_label": "__address__"},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            *extra,
        ],
    }


def prometheus_config(ns: str) -> dict[str, Any]:
    """Scrape the gateways and the SGLang replicas found by pod discovery and their
    prometheus.io annotations. SGLang's series get replica="sglang-i", the name the gateway
    gives the same replica, so that both line up on one dashboard."""
    return {
        "global": {"scrape_interval": "15s", "evaluation_interval": "15s"},
        "scrape_configs": [
            _pod_job("chatfleet-gateway", "chatfleet-gateway", ns, []),
            _pod_job("sglang", "sglang", ns, [
                {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
                 "target_label": "replica"}]),
        ],
    }


RATE = "$__rate_interval"  # Grafana's; the rules check puts a real window in its place

# (title, unit, description, [(expr, legend)], threshold or None)
PANELS: tuple[tuple[str, str, str, tuple[tuple[str, str], ...], float | None], ...] = (
    ("Gateway TTFT p50 / p99 (queueing included)", "s",
     "From the gateway's TTFT histogram, all gateways together. The target is 1 s.",
     ((f"histogram_quantile(0.5, sum by (le) (rate(chatfleet_gateway_ttft_seconds_bucket"
       f"[{RATE}])))", "p50"),
      (f"histogram_quantile(0.99, sum by (le) (rate(chatfleet_gateway_ttft_seconds_bucket"
       f"[{RATE}])))", "p99")), 1.0),
    ("Gateway inter-chunk latency p99", "s",
     "Gaps between relayed chunks, all gateways together. The target is 100 ms per token.",
     ((f"histogram_quantile(0.99, sum by (le) (rate(chatfleet_gateway_itl_seconds_bucket"
       f"[{RATE}])))", "p99"),), 0.1),
    ("In flight per replica against the cap", "short",
     "Requests in flight on each replica, summed over the gateways, and the fleet-wide cap.",
     (("sum by (replica) (chatfleet_gateway_in_flight)", "{{replica}} in flight"),
      ("max by (replica) (chatfleet_gateway_cap)", "{{replica}} cap")), None),
    ("Requests by outcome", "reqps", "ok, shed, error, cancelled, timeout, rejected.",
     ((f"sum by (outcome) (rate(chatfleet_gateway_requests_total[{RATE}]))", "{{outcome}}"),),
     None),
    ("Shed rate (429) by reason", "reqps",
     "Requests answered 429 + Retry-After: queue full or past the TTFT budget.",
     ((f"sum by (reason) (rate(chatfleet_gateway_shed_total[{RATE}]))", "{{reason}}"),), None),
    ("Queue depth per gateway", "short", "Requests waiting for a slot, per gateway pod.",
     (("sum by (pod) (chatfleet_gateway_queue_depth)", "{{pod}}"),), None),
    ("Upstream failures and ejections per replica", "short",
     "Failed exchanges with a replica (per second) and ejections (in the window).",
     ((f"sum by (replica) (rate(chatfleet_gateway_upstream_failures_total[{RATE}]))",
       "{{replica}} failures/s"),
      (f"sum by (replica) (increase(chatfleet_gateway_ejections_total[{RATE}]))",
       "{{replica}} ejections")), None),
    ("Replica health and shared state", "short",
     "1: the replica takes requests (0: ejected, on any gateway); state_up 0: a gateway "
     "cannot reach Redis and runs its share of each cap.",
     (("min by (replica) (chatfleet_gateway_replica_healthy)", "{{replica}} healthy"),
      ("min by (pod) (chatfleet_gateway_state_up)", "{{pod}} state_up")), None),
    ("SGLang running requests", "short", "sglang:num_running_reqs per replica.",
     (("sum by (replica) (sglang:num_running_reqs)", "{{replica}}"),), None),
    ("SGLang queued requests", "short",
     "sglang:num_queue_reqs per replica: above zero, the engine is the one choosing who waits.",
     (("sum by (replica) (sglang:num_queue_reqs)", "{{replica}}"),), None),
    ("SGLang KV pool usage", "percentunit", "sglang:token_usage per replica.",
     (("max by (replica) (sglang:token_usage)", "{{replica}}"),), None),
    ("SGLang prefix cache hit rate", "percentunit", "sglang:cache_hit_rate per replica.",
     (("max by (replica) (sglang:cache_hit_rate)", "{{replica}}"),), None),
)


def dashboard() -> dict[str, Any]:
    """The Grafana dashboard (JSON model, Prometheus data source chosen at import)."""
    panels: list[dict[str, Any]] = []
    ds = {"type": "prometheus", "uid": "${datasource}"}
    for n, (title, unit, description, targets, threshold) in enumerate(PANELS):
        defaults: dict[str, Any] = {"unit": unit}
        if threshold is not None:
            defaults["thresholds"] = {"mode": "absolute", "steps": [
                {"color": "green", "value": None}, {"color": "red", "value": threshold}]}
            defaults["custom"] = {"thresholdsStyle": {"mode": "line"}}
        panels.append({
            "id": n + 1, "type": "timeseries", "title": title, "description": description,
            "datasource": ds,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (n % 2), "y": 8 * (n // 2)},
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "targets": [{"refId": chr(ord("A") + k), "expr": expr, "legendFormat": legend,
                         "datasource": ds}
                        for k, (expr, legend) in enumerate(targets)],
        })
    return {
        "title": "chatfleet: gateway and SGLang replicas", "uid": "chatfleet",
        "tags": ["chatfleet"], "schemaVersion": 39, "version": 1, "editable": True,
        "timezone": "browser", "refresh": "30s", "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "label": "Prometheus",
                                 "type": "datasource", "query": "prometheus"}]},
        "panels": panels,
    }


def dashboard_exprs(dash: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(panel/refId, PromQL) of every query of the dashboard."""
    return [(f"{p['id']}{t['refId']}", str(t["expr"]))
            for p in dash["panels"] for t in p["targets"]]


def dashboard_rules(dash: Mapping[str, Any], window: str = "5m") -> dict[str, Any]:
    """Every dashboard query as a recording rule, Grafana's $__rate_interval replaced by a
    real window, so that `promtool check rules` parses each one."""
    return {"groups": [{"name": "chatfleet-dashboard-queries", "rules": [
        {"record": f"chatfleet_dashboard:panel_{ref.lower()}",
         "expr": expr.replace(RATE, window)}
        for ref, expr in dashboard_exprs(dash)]}]}


def metric_names(expr: str) -> set[str]:
    """The chatfleet and SGLang metric names a PromQL expression reads."""
    return set(re.findall(r"\b(?:chatfleet_gateway_\w+|sglang:\w+)", expr))


def sglang_metric_names() -> set[str]:
    """Every name in SGLANG_METRICS (the names the harness reads from SGLang's /metrics)."""
    return {name for f in fields(SGLANG_METRICS) for name in getattr(SGLANG_METRICS, f.name)}
