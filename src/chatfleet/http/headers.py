"""The `Server` header both servers send: a name, no versions. aiohttp's default names
Python's and aiohttp's versions (`Python/3.11 aiohttp/3.14.5`), which tells a scanner which
published flaws to try."""

from __future__ import annotations

from aiohttp import web

SERVER = "chatfleet"


async def _name_server(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = SERVER


def name_server(app: web.Application) -> None:
    """Every answer of `app` says `Server: chatfleet` (aiohttp only sets its default when
    the header is not there yet)."""
    app.on_response_prepare.append(_name_server)
