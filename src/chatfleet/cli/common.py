"""Shared pieces of the command line: spec lookup, clean errors, printing JSON."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand

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
def sigint_deferred() -> Iterator[None]:
    """A SIGINT that arrives during the block is acted on as the block ends (its
    KeyboardInterrupt raised there). A handler that notes it stands in meanwhile: masking the
    signal would not do, since any other thread may take it and Python then runs the handler
    in the main thread at once. Outside the main thread (where no handler can be set) the
    block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            if callable(previous):
                previous(signal.SIGINT, None)
            elif previous == signal.SIG_DFL:
                os.kill(os.getpid(), signal.SIGINT)


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
            # Ctrl-C waits until the bar's lock is released: a KeyboardInterrupt raised in the
            # middle of rich's `with self._lock:` can leave the lock held, and the bar's
            # refresh thread, which the exit joins, then waits for it forever
            with sigint_deferred():
                if what not in tasks:
                    tasks[what] = bar.add_task(what, total=total)
                bar.update(tasks[what], completed=done, total=total)

        yield update


class Command(TyperCommand):
    """A chatfleet command: a float flag given as nan or inf (which its parser takes as numbers)
    is refused as a usage error (exit 2) before the command runs, since no flag means either.
    Every command is registered with `cls=Command`."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        param: Any
        for param in self.params:
            value = ctx.params.get(param.name)
            values = value if isinstance(value, (list, tuple)) else (value,)
            if any(isinstance(v, float) and not math.isfinite(v) for v in values):
                raise typer.BadParameter(f"{value} is not a finite number: give a number",
                                         ctx=ctx, param=param)
        return rest


def fail(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, never wrapped (a long path stays whole, for the terminal to wrap
    and the user to copy) and never read as markup (a message may quote brackets)."""
    console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
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
        fail(f"not UTF-8 text: a file given is binary or in another encoding ({exc.reason} "
             f"at byte {exc.start})")
    except FileNotFoundError as exc:
        fail(f"file not found: {exc.filename}")
    except OSError as exc:  # a path given that is a folder, not a folder, or not ours to use
        if exc.filename is None:
            raise
        fail(path_error(exc))
    except KeyboardInterrupt:
        console.print("interrupted: finished results are kept")
        raise typer.Exit(130) from None


def path_error(exc: OSError) -> str:
    """The one line for a file operation that failed on a path the user gave."""
    path = exc.filename2 or exc.filename
    if isinstance(exc, IsADirectoryError):
        return f"{path} is a folder: give the path of a file"
    if isinstance(exc, NotADirectoryError):
        return f"{path}: part of the path is a file, not a folder"
    if isinstance(exc, PermissionError):
        return f"{path}: permission denied: give a path you may read or write"
    return f"cannot use {path}: {exc.strerror or exc}"


def check_output_file(path: Path | None, flag: str) -> None:
    """Before any work: an output file that cannot be written is one line now, not an error
    once the work is done (and its results lost)."""
    if path is None:
        return
    if path.is_dir():
        fail(f"{flag} {path} is a folder: give the path of a file")
    _check_writable(path.parent, f"{flag} {path}")


def check_output_dir(path: Path, flag: str) -> None:
    """Before any work: a folder to write into must be one, or be one we can make."""
    if path.exists() and not path.is_dir():
        fail(f"{flag} {path} is a file, not a folder: give a folder")
    _check_writable(path, f"{flag} {path}")


def _check_writable(folder: Path, given: str) -> None:
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        fail(f"{given}: {existing} is a file, not a folder")
    try:  # a file made and removed at once: os.access says yes to root even under /proc
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        fail(f"{given}: cannot write in {existing} ({exc.strerror or exc}): give a folder you "
             "may write to")


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
    if any(not (math.isfinite(v) and v > 0) for v in values):
        fail(f"every {what} must be a positive number, not {text!r}")
    return values


def print_json(doc: Any) -> None:
    sys.stdout.write(dumps(doc).decode() + "\n")
