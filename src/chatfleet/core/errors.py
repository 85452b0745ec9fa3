"""The one base of chatfleet's user errors.

`ChatfleetError` is bad input: a flag, a file or a config that chatfleet cannot use, with a
message that names it and says what to do. The command line prints that message as one line
and exits 2; any other exception is a bug and keeps its traceback. It subclasses `ValueError`
so that callers that catch `ValueError` keep working.
"""

from __future__ import annotations


class ChatfleetError(ValueError):
    """Input chatfleet cannot use, with the flag, key or file named (one line, exit 2)."""
