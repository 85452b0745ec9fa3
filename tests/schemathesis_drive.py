"""Schemathesis over a running server's own /openapi.json, as both the simserver's and the
gateway's tests drive it (tests/simserver/test_schemathesis.py says why `from_url` +
`as_strategy` + `@given` rather than the pytest loader).

Bounding: generated chat requests may omit max_tokens (the default is the rest of the context)
or ask a huge one; every case to a generating route is bounded before it is sent: integer
max_tokens / max_completion_tokens above CAP become CAP and absent ones are set to CAP. Values
that are not integers (or are below 1) are left as generated, so validation is still exercised.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

CAP = 8
GENERATING = ("/v1/chat/completions", "/v1/completions")


def bound(body: Any) -> Any:
    if not isinstance(body, dict):
        return body
    body = dict(body)
    for key in ("max_tokens", "max_completion_tokens"):
        v = body.get(key)
        if v is None or (isinstance(v, int) and not isinstance(v, bool) and v > CAP):
            body[key] = CAP
    return body


def drive_schema(url: str, mode: GenerationMode, examples: int,
                 check_answer: Callable[[Any, requests.Response], None], *,
                 headers: dict[str, str] | None = None, path_regex: str | None = None,
                 timeout: float = 30.0) -> dict[str, int]:
    """`examples` generated cases of `mode` (optionally only the paths matching `path_regex`),
    each sent with `headers` and its answer handed to `check_answer(case, response)`; returns
    how many answers each "METHOD PATH STATUS" got."""
    schema = schemathesis.openapi.from_url(url + "/openapi.json")
    if path_regex is not None:
        schema = schema.include(path_regex=path_regex)
    seen: dict[str, int] = {}
    session = requests.Session()

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(case=schema.as_strategy(generation_mode=mode))
    def check(case: Any) -> None:
        if case.path in GENERATING:
            case.body = bound(case.body)
        response = case.call(base_url=url, session=session, headers=headers, timeout=timeout)
        key = f"{case.method} {case.path} {response.status_code}"
        seen[key] = seen.get(key, 0) + 1
        check_answer(case, response)

    try:
        check()
    finally:
        session.close()
    return seen
