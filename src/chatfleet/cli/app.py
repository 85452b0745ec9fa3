"""`chatfleet`: the root command and its sub-commands."""

from __future__ import annotations

import typer

from chatfleet import __version__
from chatfleet.cli.accuracy import accuracy
from chatfleet.cli.agent import telemetry_agent
from chatfleet.cli.cache import cache
from chatfleet.cli.common import Command
from chatfleet.cli.demo import demo
from chatfleet.cli.deploy import deploy_app
from chatfleet.cli.gateway import gateway
from chatfleet.cli.launch import launch
from chatfleet.cli.plan import plan
from chatfleet.cli.report import report
from chatfleet.cli.simserver import simserver
from chatfleet.cli.sweep import sweep
from chatfleet.cli.twin import twin_app

app = typer.Typer(
    name="chatfleet",
    help="Size, measure and serve an open chat model on a fleet of small GPUs.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("demo", cls=Command)(demo)
app.command("plan", cls=Command)(plan)
app.command("simserver", cls=Command)(simserver)
app.command("sweep", cls=Command)(sweep)
app.command("gateway", cls=Command)(gateway)
app.command("report", cls=Command)(report)
app.command("telemetry-agent", cls=Command)(telemetry_agent)
app.command("cache", cls=Command)(cache)
app.command("accuracy", cls=Command)(accuracy)
app.add_typer(twin_app, name="twin")
app.command("launch", cls=Command)(launch)
app.add_typer(deploy_app, name="deploy")


def _version(value: bool) -> None:
    if value:
        print(f"chatfleet {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """chatfleet: plan, measure, serve, what-if, check."""


def main() -> None:
    app()
