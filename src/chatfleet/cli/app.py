"""`chatfleet`: the root command and its sub-commands.

The sub-commands are loaded on demand: `COMMANDS` names each one's module, and the module is
imported only when its command runs, its help is asked for, or `commands[name]` is read. So
`chatfleet --help` imports none of them and stays fast, while every command module imports
what it runs at its top, like any other module. `chatfleet --help` lists each command with
its `summary`, the first paragraph of the command's own help (a test keeps the two equal).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import typer
import typer.main
from typer import _click as click  # typer vendors click: TyperGroup takes these classes
from typer.core import TyperCommand, TyperGroup

from chatfleet import __version__


@dataclass(frozen=True, slots=True)
class CommandSpec:
    """One sub-command of `chatfleet`: `module.attr` is a typer command function, or a
    `typer.Typer` for a group of commands (twin, deploy)."""

    name: str
    module: str
    attr: str
    summary: str


COMMANDS: tuple[CommandSpec, ...] = (
    CommandSpec("demo", "chatfleet.cli.demo", "demo",
                "Answer the question for Qwen3-8B on L4 with the twin (no GPU needed), prove it "
                "live on\nsimserver replicas behind the gateway, and write the HTML report."),
    CommandSpec("plan", "chatfleet.cli.plan", "plan",
                "Size the KV pool the way SGLang (or vLLM) does; with --users, answer how many "
                "users fit\non a card, which precision to serve, which caps, how many cards, and "
                "how to launch it."),
    CommandSpec("simserver", "chatfleet.cli.simserver", "simserver",
                "Serve the engine model over HTTP in wall-clock time, as SGLang (or vLLM) would "
                "on that\nGPU."),
    CommandSpec("sweep", "chatfleet.cli.sweep", "sweep",
                "Measure the knee against live engines, with the method automated."),
    CommandSpec("gateway", "chatfleet.cli.gateway", "gateway",
                "Serve replicas behind a cap at the knee, one queue with 429 + Retry-After, "
                "session\naffinity and a byte-identical shared prompt."),
    CommandSpec("report", "chatfleet.cli.report", "report",
                "Write DIR/report.html (self-contained, inline SVG plots) and DIR/report.md."),
    CommandSpec("telemetry-agent", "chatfleet.cli.agent", "telemetry_agent",
                "Serve this host's GPU telemetry (NVML) as JSON: GET /telemetry, GET /health."),
    CommandSpec("cache", "chatfleet.cli.cache", "cache",
                "Replay a multi-turn trace through the radix prefix cache for each pool size, "
                "eviction\npolicy and host-tier size: hit rate per turn, evictions of prefixes "
                "that come back, TTFT."),
    CommandSpec("accuracy", "chatfleet.cli.accuracy", "accuracy",
                "Accuracy of each target on GSM8K or your prompts, with intervals and a paired "
                "test."),
    CommandSpec("launch", "chatfleet.cli.launch", "launch",
                "Run Redis, M replicas and N gateways here; stop them all, in reverse order, on "
                "Ctrl-C\nor SIGTERM."),
    CommandSpec("twin", "chatfleet.cli.twin", "twin_app",
                "The engine twin: SGLang or vLLM on a given GPU, in virtual time."),
    CommandSpec("deploy", "chatfleet.cli.deploy", "deploy_app",
                "Deployment files: Kubernetes manifests, Prometheus, Grafana."),
)


def load_command(spec: CommandSpec) -> click.Command:
    """The click command typer builds for the spec's function or group, as `chatfleet`'s own
    sub-command (imports its module)."""
    from chatfleet.cli.common import Command  # with the command's module, not for --help

    target = getattr(importlib.import_module(spec.module), spec.attr)
    holder = typer.Typer()
    if isinstance(target, typer.Typer):
        holder.add_typer(target, name=spec.name)  # its commands name cls=Command themselves
    else:
        holder.command(spec.name, cls=Command)(target)
    return typer.main.get_group(holder).commands[spec.name]


class Commands(MutableMapping[str, click.Command]):
    """The root's sub-commands by name: a command is loaded the first time it is read, and
    `listed` gives a stand-in with its summary for the help page, loading nothing."""

    def __init__(self, specs: tuple[CommandSpec, ...]) -> None:
        self.specs = {s.name: s for s in specs}
        self.loaded: dict[str, click.Command] = {}

    def listed(self, name: str) -> click.Command | None:
        if name in self.loaded:
            return self.loaded[name]
        spec = self.specs.get(name)
        return TyperCommand(name, short_help=spec.summary) if spec is not None else None

    def __getitem__(self, name: str) -> click.Command:
        if name not in self.loaded:
            self.loaded[name] = load_command(self.specs[name])
        return self.loaded[name]

    def __setitem__(self, name: str, cmd: click.Command) -> None:
        self.loaded[name] = cmd
        self.specs.setdefault(name, CommandSpec(name, "", "", cmd.help or ""))

    def __delitem__(self, name: str) -> None:
        del self.specs[name]
        self.loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self.specs)

    def __len__(self) -> int:
        return len(self.specs)


class LazyGroup(TyperGroup):
    """`chatfleet`'s root group over `Commands`: the help page lists the summaries; running a
    command (or its --help) loads it."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        commands = Commands(COMMANDS)
        for name, cmd in self.commands.items():  # any registered on the Typer itself
            commands[name] = cmd
        self.commands = commands

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        assert isinstance(self.commands, Commands)
        return self.commands.listed(cmd_name)

    def resolve_command(self, ctx: click.Context, args: list[str]
                        ) -> tuple[str | None, click.Command | None, list[str]]:
        name, cmd, rest = super().resolve_command(ctx, args)
        if name is not None and cmd is not None:
            cmd = self.commands[name]
        return name, cmd, rest


app = typer.Typer(
    name="chatfleet",
    cls=LazyGroup,
    help="Size, measure and serve an open chat model on a fleet of small GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from chatfleet import NATIVE

        print(f"chatfleet {__version__}")
        print(f"twin core: {'compiled (mypyc)' if NATIVE.compiled else 'Python: ' + NATIVE.reason}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """chatfleet: plan, measure, serve, what-if, check."""


def main() -> None:
    app()
