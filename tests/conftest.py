"""Suite-wide collection rules.

`make test` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`). The
reliability suite's checks run one after another on one worker, as they do alone: each starts
its own Redis, replicas and gateways and pushes them to 10x overload, and its report
(out/reliability.json) is the rows of one session. Every other test may run beside any other,
so the wall-clock checks (parity, overload, sweeps) hold with the rest of the suite beside them.

pytest is pinned at 9.1.1 (requirements.lock): pytest-xdist 3.8 groups a test by renaming its
nodeid, which pytest 9.2 no longer reads, so under 9.2 every group spread over both workers
(checked with six tests of one group: 9.2 ran them on gw0 and gw1, 9.1.1 on one).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import chatfleet

RELIABILITY = Path(__file__).parent / "reliability"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if RELIABILITY in item.path.parents:
            item.add_marker(pytest.mark.xdist_group("reliability"))


def native_mode() -> str:
    """Which twin core this run tests: the compiled modules, or their sources and why."""
    status = chatfleet.NATIVE
    return ("chatfleet twin core: " + ("compiled (mypyc)" if status.compiled
                                       else f"Python ({status.reason})"))


def pytest_report_header() -> str:
    return native_mode()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The mode again under the results: the suite's -q leaves the header out."""
    terminalreporter.write_line(native_mode())
