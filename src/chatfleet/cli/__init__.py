"""The `chatfleet` command line."""

from chatfleet.cli.app import app, main

__all__ = ["app", "main"]
