"""The floor under every HTTP row: an ASGI application that reads the request and answers
204 with nothing, served by the same gunicorn and uvicorn worker as Cairn
(``cairn/gunicorn.py``). What a request costs before Django, DRF or a database does
anything: the socket, uvicorn's HTTP parsing, the event loop and the bench's client."""

from __future__ import annotations

from typing import Any


async def application(scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})
