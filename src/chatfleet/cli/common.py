"""Shared pieces of the command line: spec lookup, clean errors, printing JSON."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console

from chatfleet.core.errors import ChatfleetError
from chatfleet.core.specs import GPU, Model, SpecError, builtin_model, get_gpu, model_from_config
from chatfleet.io import dumps

console = Console(stderr=True)
# tables are wide: keep them whole when stdout is a pipe or a file
out = Console(width=None if sys.stdout.isatty() else 160)


def uncalibrated_note(gpu: str) -> str:
    """The line every text answer prints under figures the twin or the pool sizing gives for a
    card no measurement is behind (every card but the L4; JSON says `calibrated: false`)."""
    return (f"uncalibrated: the twin and the pool sizing have no {gpu} measurement: they apply "
            f"the L4's fitted constants to the {gpu} datasheet (docs/calibration.md#other-gpus); "
            "`chatfleet twin calibrate` fits a profile from a live sweep")


@contextmanager
def progress_bars() -> Iterator[Callable[[str, int, int], None]]:
    """A callback `(what, done, total)` that keeps one bar per `what` on stderr, for long work
    (plan, demo) that reports its own progress."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        tasks: dict[str, Any] = {}

        def update(what: str, done: int, total: int) -> None:
            if what not in tasks:
                tasks[what] = bar.add_task(what, total=total)
            bar.update(tasks[what], completed=done, total=total)

        yield update


def fail(message: str, code: int = 2) -> NoReturn:
    console.print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


@contextmanager
def clean_errors() -> Iterator[None]:
    """Bad input (a `ChatfleetError`) becomes a one-line error and exit status 2, never a
    traceback. Any other exception, a `ValueError` from numpy or `int("x")` included, is a bug
    and keeps its traceback."""
    try:
        yield
    except ChatfleetError as exc:
        fail(str(exc))
    except UnicodeDecodeError as exc:  # a file read as text that is not (a binary file)
        fail(f"not UTF-8 text: {exc}")
    except FileNotFoundError as exc:
        fail(f"file not found: {exc.filename}")
    except KeyboardInterrupt:
        console.print("interrupted: finished results are kept")
        raise typer.Exit(130) from None


def load_gpu(name: str) -> GPU:
    return get_gpu(name)


def load_model(name_or_path: str) -> Model:
    """A built-in model name, or the path of a Hugging Face config.json (or its folder)."""
    p = Path(name_or_path)
    if p.is_dir():
        p = p / "config.json"
    if p.suffix == ".json" or p.exists():
        if not p.exists():
            raise SpecError(f"no config.json at {p}")
        try:
            cfg = json.loads(p.read_text())
        except json.JSONDecodeError as exc:
            raise SpecError(f"{p} is not valid JSON: {exc}") from exc
        if not isinstance(cfg, dict):
            raise SpecError(f"{p} does not hold a JSON object")
        return model_from_config(p.parent.name or p.stem, cfg)
    return builtin_model(name_or_path)


def parse_list(text: str, cast: Callable[[str], Any], what: str) -> list[Any]:
    try:
        values = [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"{what} must be a comma-separated list of numbers, not {text!r}")
    if not values:
        fail(f"{what} is empty")
    if any(v <= 0 for v in values):
        fail(f"every {what} must be positive")
    return values


def print_json(doc: Any) -> None:
    sys.stdout.write(dumps(doc).decode() + "\n")
