"""Django's WSGI application called from the event loop (``cairn.asgi``) with one hand-over
to the thread pool and one back, for a request whose body is small.

a2wsgi crosses between the loop and the thread for every message: the body's read, the
response's start, each chunk and the end, four round trips for a plain JSON answer, each
waking a thread and the loop (docs/performance.md, "The server's hop"). Here a small body
(a declared length of at most ``BUFFERED_BODY_BYTES``, or none) is read on the loop before
the thread is asked; the thread runs the application and hands back the whole answer. A
streamed answer (``StreamingHttpResponse``, a file) is sent chunk by chunk from the same
thread, as a2wsgi sends it, so a generator that reads the database runs on the thread
whose connection it holds. A larger or chunked body goes to a2wsgi, which reads it from
the thread as the application asks, so the loop never holds a large upload.

The WSGI environment is a2wsgi's (``build_environ``): both routes give Django the same
request. A client that goes away before its body ended gets what a2wsgi's reader gives it,
``ClientDisconnected`` on the read (a 400 to nobody, nothing stored).
"""

from __future__ import annotations

import asyncio
import contextvars
import io
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from a2wsgi.wsgi import build_environ
from django.core.exceptions import BadRequest

Message = dict[str, Any]
# Bodies up to this are read on the loop before the application runs (a commit, a
# decision, a form); the loop holds at most this much per request waiting for a thread.
BUFFERED_BODY_BYTES = 64 * 1024


class ClientDisconnected(BadRequest):
    """The client went away before its request body ended: a 400 (Django's BadRequest, not
    an OSError, which Django would turn into an UnreadablePostError and a 500), answered to
    nobody."""


class _CutShort(io.RawIOBase):
    """The input of a request whose client went away mid-body: any read says so."""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        raise ClientDisconnected("the client went away before its request body ended")


def body_buffered(scope: dict) -> bool:
    """Whether the request's body is small enough to read on the loop: none, or a declared
    length of at most ``BUFFERED_BODY_BYTES``; not a chunked one."""
    declared = 0
    for name, value in scope["headers"]:
        if name == b"transfer-encoding":
            return False
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                return False  # malformed; uvicorn refuses it before this, a2wsgi if not
    return 0 <= declared <= BUFFERED_BODY_BYTES


async def body_read(receive: Any) -> bytes | None:
    """The whole request body, or None when the client went away before it ended."""
    parts = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


class _Answer:
    """What the thread hands back: the status line's code, the headers and, for a whole
    answer, its body (None when the thread sent a streamed answer itself)."""

    __slots__ = ("body", "headers", "status")

    def __init__(self) -> None:
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: bytes | None = None


def _start_response(answer: _Answer) -> Callable:
    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        answer.status = int(status.split(" ", 1)[0])
        answer.headers = [
            (name.strip().encode("latin1").lower(), value.strip().encode("latin1"))
            for name, value in headers
        ]
        return _no_write

    return start_response


def _no_write(_chunk: bytes) -> None:
    # WSGI's legacy write(); Django never calls it.
    raise NotImplementedError("write() is not supported: return the body instead")


def _call(wsgi: Any, environ: dict, loop: asyncio.AbstractEventLoop, send: Any) -> _Answer:
    """The application's answer, in a pool thread. A whole answer (Django's HttpResponse,
    ``streaming`` False) comes back joined; a streamed one is sent from here, chunk by chunk
    on the loop, and iterated and closed on this thread."""
    answer = _Answer()
    iterable: Iterable[bytes] = wsgi(environ, _start_response(answer))
    try:
        if getattr(iterable, "streaming", True) is False:
            answer.body = b"".join(iterable)
            return answer

        def sent(message: Message) -> None:
            asyncio.run_coroutine_threadsafe(send(message), loop).result()

        sent({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
        for chunk in iterable:
            if chunk:
                sent({"type": "http.response.body", "body": chunk, "more_body": True})
        sent({"type": "http.response.body", "body": b""})
        return answer
    finally:
        close = getattr(iterable, "close", None)
        if close is not None:
            close()  # Django's request_finished: this thread's connections are tidied


async def served_buffered(
    wsgi: Any, executor: ThreadPoolExecutor, scope: dict, receive: Any, send: Any
) -> None:
    """Serve one request whose body ``body_buffered`` allows, on ``executor``. ``wsgi`` is
    told that its input ends where the body does (``wsgi.input_terminated``, which
    ``cairn.asgi`` sets for both routes)."""
    body = await body_read(receive)
    stream = io.BytesIO(body) if body is not None else io.BufferedReader(_CutShort())
    environ = build_environ(scope, stream)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    call = contextvars.copy_context().run
    answer = await loop.run_in_executor(executor, call, _call, wsgi, environ, loop, send)
    if answer.body is None:
        return  # streamed from the thread
    await send({"type": "http.response.start", "status": answer.status, "headers": answer.headers})
    await send({"type": "http.response.body", "body": answer.body})
