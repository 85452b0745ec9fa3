"""`chatfleet deploy ...`: deployment files (docs/deploy.md)."""

from __future__ import annotations

from pathlib import Path

import typer

from chatfleet.cli.common import (
    Command,
    check_output_dir,
    clean_errors,
    console,
    fail,
    out,
    print_json,
)
from chatfleet.deploy import image
from chatfleet.deploy.k8s.files import manifests, write
from chatfleet.deploy.k8s.objects import DEFAULT_IMAGE_CHATFLEET, DEFAULT_IMAGE_SGLANG, K8sOptions
from chatfleet.deploy.k8s.plan import plan_from_file, plan_from_flags

deploy_app = typer.Typer(help="Deployment files: Kubernetes manifests, Prometheus, Grafana.",
                         no_args_is_help=True)


@deploy_app.command("k8s", cls=Command)
def k8s(
    out_dir: Path = typer.Option(..., "--out", help="Folder to write the files into."),
    plan: Path | None = typer.Option(None, help="A `chatfleet plan --json` document: the "
                                     "SGLang command, the cap, the replicas and the gateway "
                                     "config come from it."),
    gateways: int = typer.Option(2, help="Gateway pods."),
    replicas: int | None = typer.Option(None, help="SGLang replicas, one L4 each (default: the "
                                        "plan's recommendation; 2 without a plan)."),
    namespace: str = typer.Option("chatfleet", help="Kubernetes namespace."),
    image_sglang: str = typer.Option(DEFAULT_IMAGE_SGLANG, help="SGLang image."),
    image_chatfleet: str | None = typer.Option(
        None, help="Image with chatfleet installed (the gateway). Default: the image `make "
        "image` tags in the checkout chatfleet runs from (chatfleet:VERSION-COMMIT), else "
        f"{DEFAULT_IMAGE_CHATFLEET}."),
    cap: int | None = typer.Option(None, help="Without --plan: requests in flight per replica "
                                   "(the knee), also SGLang's --max-running-requests."),
    weights: str | None = typer.Option(None, help="Without --plan: bf16 or fp8."),
    kv_cache: str | None = typer.Option(None, "--kv-cache", help="Without --plan: bf16 or fp8."),
    gpu: str = typer.Option("l4", help="Without --plan: the GPU the pool is sized for."),
    model: str = typer.Option("qwen3-8b", help="Without --plan: built-in model name."),
    model_path: str | None = typer.Option(None, help="Without --plan: the checkpoint (default "
                                          "Qwen/Qwen3-8B, or Qwen/Qwen3-8B-FP8 for fp8 "
                                          "weights)."),
    queue_depth: int | None = typer.Option(None, help="Without --plan: the gateway's queue "
                                           "depth (default: the gateway's)."),
    as_json: bool = typer.Option(False, "--json", help="Print the files written as JSON."),
) -> None:
    """Kubernetes manifests for SGLang on L4 nodes behind the gateway, with Redis, a
    Prometheus scrape config and a Grafana dashboard."""
    with clean_errors():  # a DeployError, a binary or missing file: one line, exit 2
        check_output_dir(out_dir, "--out")
        if plan is not None:
            given = [f for f, v in (("--cap", cap), ("--weights", weights),
                                    ("--kv-cache", kv_cache), ("--model-path", model_path),
                                    ("--queue-depth", queue_depth)) if v is not None]
            if given:
                fail(f"{', '.join(given)}: the plan sets these; drop them or drop --plan")
            p = plan_from_file(plan, replicas)
        else:
            missing = [f for f, v in (("--cap", cap), ("--weights", weights),
                                      ("--kv-cache", kv_cache)) if v is None]
            if missing:
                fail(f"without --plan, give {', '.join(missing)} (or --plan PLAN.json from "
                     "`chatfleet plan --json`)")
            assert cap is not None and weights is not None and kv_cache is not None
            p = plan_from_flags(cap=cap, weights=weights, kv_cache=kv_cache,
                                replicas=2 if replicas is None else replicas, gpu=gpu,
                                model=model, model_path=model_path, queue_depth=queue_depth)
        if image_chatfleet is None:
            image_chatfleet = image.default_reference()
        opts = K8sOptions(namespace=namespace, gateways=gateways, image_sglang=image_sglang,
                          image_chatfleet=image_chatfleet)
        files = manifests(p, opts)
        paths = write(out_dir, files)
    if as_json:
        print_json({"out": str(out_dir), "files": [str(x) for x in paths],
                    "replicas": p.replicas, "gateways": gateways, "cap": p.cap,
                    "namespace": namespace, "source": p.source})
        return
    for x in paths:
        out.print(str(x), highlight=False)
    console.print(f"{p.replicas} SGLang replicas (cap {p.cap} each) and {gateways} gateways in "
                  f"namespace {namespace}: kubectl apply -f {out_dir}")
