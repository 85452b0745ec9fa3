"""Schemathesis over the server's own /openapi.json: no generated request, valid or not, gets a
5xx, and every one is answered in bounded time.

How it is driven: the schema is loaded with ``schemathesis.openapi.from_url`` from the running
server, and its Hypothesis strategies (``as_strategy``, positive and negative generation modes)
are run with ``@given``. ``schemathesis.pytest.from_fixture`` (the lazy loader that a server
started by a fixture needs for ``@schema.parametrize()``) fails on this pytest (9.x has no
``Function._nodeid``, which schemathesis 4.32's lazy loader sets), and ``from_url`` at import time
would need a server running during collection.

Bounding (tests/schemathesis_drive.py): generated chat requests may omit max_tokens or ask
ignore_eos with a huge max_tokens; at time scale 20 such a stream runs for minutes, so every
generating case is bounded to 8 tokens before it is sent; values that are not integers are left
as generated, so the server's validation is still exercised.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from chatfleet.simserver.server import RunningServer, serve_in_thread
from tests.schemathesis_drive import drive_schema
from tests.waiting import wait_for

from .conftest import HTTP_TIMEOUT, config, engine_is_idle


@pytest.fixture(scope="module")
def st_server() -> Iterator[RunningServer]:
    with serve_in_thread(config()) as srv:
        yield srv


def no_server_error(case: Any, response: requests.Response) -> None:
    assert response.status_code < 500, (case.method, case.path, case.body,
                                        response.text[:500])
    case.validate_response(response, checks=[not_a_server_error])


def run_mode(url: str, mode: GenerationMode, examples: int) -> dict[str, int]:
    return drive_schema(url, mode, examples, no_server_error, timeout=HTTP_TIMEOUT)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_errors(st_server: RunningServer, mode: GenerationMode) -> None:
    url = st_server.urls[0]
    seen = run_mode(url, mode, 150)
    # the run reached the generating routes, not only the trivial GETs
    assert any(k.startswith("POST /v1/chat/completions") for k in seen), seen
    assert any(k.startswith("POST /v1/completions") for k in seen), seen
    if mode is GenerationMode.POSITIVE:
        assert any(k.endswith(" 200") and "/v1/c" in k for k in seen), seen
    else:
        assert any(k.endswith(" 400") for k in seen), seen
    # nothing is left running
    assert wait_for(lambda: engine_is_idle(st_server), 10)
