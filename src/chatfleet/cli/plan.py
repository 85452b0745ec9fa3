"""`chatfleet plan`: KV pool sizing for a model on a GPU at given precisions."""

from __future__ import annotations

import typer
from rich.table import Table

from chatfleet.cli.common import clean_errors, load_gpu, load_model, out, print_json
from chatfleet.core.memory import plan_pool


def plan(
    gpu: str = typer.Option(
        "l4", help="GPU: l4, a10g, l40s, a100-40gb, a100-80gb, h100-sxm, h200."),
    model: str = typer.Option("qwen3-8b", help="Built-in model name or path to a config.json."),
    weights: str = typer.Option("bf16", help="Weight precision: bf16 or fp8."),
    kv_cache: str = typer.Option("bf16", "--kv-cache", help="KV cache precision: bf16 or fp8."),
    mem_fraction: float | None = typer.Option(
        None, help="SGLang's --mem-fraction-static; default: SGLang's rule for the card."),
    request_tokens: int = typer.Option(640, help="Tokens one request adds (input + output)."),
    system_prompt_tokens: int = typer.Option(2048, help="Tokens of the shared system prompt."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """Size the KV pool the way SGLang does and count the requests and prompts that fit."""
    with clean_errors():
        p = plan_pool(load_gpu(gpu), load_model(model), weights, kv_cache,
                      mem_fraction=mem_fraction, request_tokens=request_tokens,
                      system_prompt_tokens=system_prompt_tokens)
    doc = p.to_json()
    if as_json:
        print_json(doc)
        return
    cal = "" if p.calibrated else " [yellow](uncalibrated: figures from datasheet, not measured)[/]"
    t = Table(title=f"KV pool: {p.model} on {p.gpu}, weights {p.weights}, KV {p.kv_cache}{cal}")
    t.add_column("figure")
    t.add_column("value", justify="right")
    rows = [
        ("visible memory", f"{p.visible_gib:.3f} GiB"),
        ("free before weights (P)", f"{p.free_gib:.3f} GiB"),
        ("mem_fraction_static (m)", f"{p.mem_fraction_static:.3f}"),
        ("weights (W)", f"{p.weights_gib:.3f} GiB"),
        ("KV bytes per token", f"{p.kv_bytes_per_token:,}"),
        ("KV pool", f"{p.kv_pool_tokens:,} tokens"),
        ("chunked prefill / CUDA-graph max batch",
         f"{p.chunked_prefill_size} / {p.cuda_graph_max_bs}"),
        (f"requests that fit ({p.request_tokens} tokens each, one shared prompt cached)",
         f"{p.requests_fit:,}"),
        (f"shared prompts that fit ({p.system_prompt_tokens} tokens each)", f"{p.prompts_fit:,}"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    out.print(t)
