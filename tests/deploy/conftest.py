"""Keeps tests/deploy/test_image.py on one pytest-xdist worker.

The module marks itself `xdist_group("image")` so that `--dist loadgroup` runs it on one
worker and builds the image once. pytest-xdist 3.8 groups by renaming each item's nodeid
(`item._nodeid = nodeid + "@group"`), which pytest 9.2 no longer reads (its nodeid comes
from `item._id`), so the marker alone does nothing here and the module's tests spread over
both workers: the second worker's fixture then waits on the build's lock for minutes. This
hook does the renaming pytest 9.2 reads, for that module only; where the pair is fixed (or
pytest's internals move) it does nothing and the lock still keeps the build single. The
same defect leaves the reliability suite's group (tests/conftest.py) spread too.
"""

from __future__ import annotations

from pathlib import Path

import pytest

IMAGE_TESTS = Path(__file__).with_name("test_image.py")


@pytest.hookimpl(trylast=True)  # after xdist's own renaming
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):
        return
    try:
        from _pytest.nodeid import coerce_node_id  # pytest 9.2's structured nodeids
    except ImportError:
        return
    for item in items:
        if item.path == IMAGE_TESTS and "@" not in item.nodeid and hasattr(item, "_id"):
            item._id = coerce_node_id(f"{item.nodeid}@image")
