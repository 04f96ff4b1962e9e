"""The web process's application, in every mode: ``make run`` and production start the same
server, gunicorn with ``cairn/gunicorn.py``, whose worker serves this on uvicorn's event loop.

Every request runs Django's WSGI application (``cairn.wsgi``) on a fixed pool of threads
(``threads`` in ``cairn/gunicorn.py``, per process); each thread keeps its database
connection between requests, as gthread's threads did. A request with a small body (or
none) is handed to the pool once, its body read first (``cairn.wsgi_bridge``); a larger or
chunked one goes through a2wsgi, which the thread reads it from as Django asks.

A long-poll, ``GET /api/v1/runs/{id}/next?wait=N``, holds a thread only while its view
looks. When the answer is not due, the view hands the wait over
(``runtime.services.runner.WaitHandoff``, with the tenant's wait slot) and this loop sleeps
on the run's change notification with no thread. When woken (or when a retry comes due,
or at the notifications' safety re-check) it looks again in the pool. When the answer is
due or the wait is over, it asks the view again with ``wait=0``, so the answer is rendered,
authenticated and refused exactly as every other answer is. A client that goes away ends
its wait and frees its slot.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from a2wsgi import WSGIMiddleware

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cairn.settings")

from django.db import close_old_connections  # noqa: E402
from django.urls import Resolver404, resolve  # noqa: E402

from cairn.wsgi import application as wsgi_application  # noqa: E402 (sets Django up)
from cairn.wsgi_bridge import ClientDisconnected, body_buffered, served_buffered  # noqa: E402
from checkpoints.services.changes import LoopWake, run_change_subscribed  # noqa: E402
from runtime.services.runner import RunWait, WaitHandoff, run_wait_look  # noqa: E402

Message = dict[str, Any]
WAIT_ROUTE = "api:run-next"
DEFAULT_THREADS = 16


def _waited_run(scope: dict) -> str | None:
    """The run a long-poll waits on, when ``scope`` is one (Django's own URL resolving
    decides, so the rule is the one that routes the request)."""
    if scope["method"] != "GET" or b"wait=" not in scope["query_string"]:
        return None
    try:
        match = resolve(scope["path"])
    except Resolver404:
        return None
    return str(match.kwargs["run_id"]) if match.view_name == WAIT_ROUTE else None


def _look(wait: RunWait) -> RunWait | None:
    """One look at the run, in a pool thread, bracketed like a request (a connection that
    failed or outlived CONN_MAX_AGE is replaced). None when the look failed: the view's
    answer of now then says why, in the API's own terms (a deleted run is a 404)."""
    close_old_connections()
    try:
        return run_wait_look(wait=wait)
    except Exception:  # noqa: BLE001 - the view renders the refusal; see above
        return None
    finally:
        close_old_connections()


async def _client_gone(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


def _terminated(wsgi: Any) -> Any:
    """The WSGI application, told that its input ends where the body does
    (``wsgi.input_terminated``): uvicorn decoded any chunks and a2wsgi's input returns
    b"" at the end, so a chunked body is read (cairn.middleware.ChunkedBodyMiddleware)."""

    def application(environ: dict, start_response: Any) -> Any:
        environ["wsgi.input_terminated"] = True
        return wsgi(environ, start_response)

    return application


def _whole_bodies(receive: Any) -> Any:
    """``receive``, but a client gone before its body ended raises ClientDisconnected in
    the reader: a2wsgi would hand the application b"" (the body's end), and a truncated
    upload would be read as a whole, shorter one. It is a 400 written to nobody, and nothing
    is stored."""
    ended = False

    async def receive_whole() -> Message:
        nonlocal ended
        message = await receive()
        if message["type"] == "http.request":
            ended = not message.get("more_body", False)
        elif not ended:
            raise ClientDisconnected("the client went away before its request body ended")
        return message

    return receive_whole


class Application:
    """Django's WSGI application on a pool of ``threads`` threads, and its long-polls on
    the event loop. ``threads`` may be set until the first request (the worker sets it from
    gunicorn's ``threads``)."""

    def __init__(self, wsgi: Any, threads: int = DEFAULT_THREADS) -> None:
        self.wsgi = _terminated(wsgi)  # one application for both routes
        self.threads = threads
        self._served: WSGIMiddleware | None = None

    @property
    def served(self) -> WSGIMiddleware:
        if self._served is None:
            self._served = WSGIMiddleware(self.wsgi, workers=self.threads)
        return self._served

    async def _serve(self, scope: dict, receive: Any, send: Any) -> None:
        """One request to Django, on the pool: in one hand-over when its body is small."""
        if body_buffered(scope):
            await served_buffered(self.wsgi, self.served.executor, scope, receive, send)
        else:
            await self.served(scope, _whole_bodies(receive), send)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.served(scope, receive, send)
            return
        run_id = _waited_run(scope)
        if run_id is None:
            await self._serve(scope, receive, send)
            return
        wake = LoopWake(asyncio.get_running_loop())
        handoff = WaitHandoff()
        # Subscribed before the view's first look: a change after it always wakes this wait.
        with run_change_subscribed(run_id, wake):
            answer = await self._answer({**scope, WaitHandoff.SCOPE_KEY: handoff}, receive)
            wait = handoff.wait
            if wait is not None:
                try:
                    if not await self._sleep(wait, wake, receive):
                        return  # the client went away: nobody to answer
                    answer = await self._answer({**scope, "query_string": b"wait=0"}, _no_body)
                finally:
                    wait.slot.release()  # type: ignore[union-attr]
        for message in answer:
            await send(message)

    async def _answer(self, scope: dict, receive: Any) -> list[Message]:
        """The view's whole response, kept to be sent (or dropped) afterwards."""
        messages: list[Message] = []

        async def keep(message: Message) -> None:
            messages.append(message)

        await self._serve(scope, receive, keep)
        return messages

    async def _sleep(self, wait: RunWait, wake: LoopWake, receive: Any) -> bool:
        """Sleep and look until the answer is due or the wait is over (True), or until the
        client goes away (False)."""
        loop = asyncio.get_running_loop()
        gone = asyncio.ensure_future(_client_gone(receive))
        try:
            while (timeout := wait.sleep_seconds()) > 0:
                woken = asyncio.ensure_future(wake.wait(timeout))
                await asyncio.wait({woken, gone}, return_when=asyncio.FIRST_COMPLETED)
                if gone.done():
                    woken.cancel()
                    return False
                looked = await loop.run_in_executor(self.served.executor, _look, wait)
                if looked is None or looked.answer.due:
                    break
                wait = looked
            return True
        finally:
            gone.cancel()


application = Application(wsgi_application)
