"""The web process hands a request with a small body to Django's thread pool once and takes
the whole answer back once (``cairn.wsgi_bridge``), where a2wsgi crossed between the loop
and the thread for every message. Django sees the same request either way; a streamed
answer is iterated and closed on the thread that made it; a client that goes away
mid-body is a 400 to nobody. Driven through ``cairn.asgi.Application`` as uvicorn drives
it, on a real event loop and thread pool; the real server's tests (chunked bodies, long
polls, the PHP runner) run the same code behind gunicorn."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.handlers.wsgi import WSGIRequest
from django.http import HttpResponse, StreamingHttpResponse
from hypothesis import given, settings
from hypothesis import strategies as st

import cairn.asgi
from cairn import wsgi_bridge
from cairn.asgi import Application
from tests.web_server import web_server  # noqa: F401

Message = dict[str, Any]


def scope_of(method: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> dict:
    declared = [(b"content-length", str(len(body)).encode())] if body else []
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": "/api/v1/runs/x",
        "raw_path": b"/api/v1/runs/x",
        "query_string": b"a=1&b=%C3%A9",
        "root_path": "",
        "headers": [(b"host", b"127.0.0.1:8000"), *headers, *declared],
        "client": ("10.0.0.7", 51234),
        "server": ("127.0.0.1", 8000),
    }


def serve(app: Any, scope: dict, pieces: list[bytes], *, gone: bool = False) -> list[Message]:
    """``app``'s messages for a request whose body arrives in ``pieces`` (then the client
    goes away, when ``gone``)."""
    messages: list[Message] = []
    inbox = [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1 or gone}
        for i, piece in enumerate(pieces or [b""])
    ]

    async def receive() -> Message:
        return inbox.pop(0) if inbox else {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        messages.append(message)

    asyncio.run(app(scope, receive, send))
    return messages


class Seen:
    """A WSGI application that keeps what Django's request would see, and answers JSON."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self.body = b""
        self.thread = 0

    def __call__(self, environ: dict, start_response: Any) -> Any:
        request = WSGIRequest(environ)
        self.body = request.body
        self.meta = {
            k: v for k, v in request.META.items() if isinstance(v, str) and k != "wsgi.input"
        }
        self.meta["wsgi.input_terminated"] = environ.get("wsgi.input_terminated")
        self.meta["path"], self.meta["GET"] = request.path, dict(request.GET)
        self.thread = threading.get_ident()
        response = HttpResponse(json.dumps({"got": len(self.body)}), status=201)
        response["Content-Type"] = "application/json"
        start_response(f"{response.status_code} Created", [(k, v) for k, v in response.items()])
        return response


def both_routes(body: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[Seen, Seen]:
    """What Django saw of one request served on the short hand-over and on a2wsgi's."""
    short, streamed = Seen(), Seen()
    serve(Application(short), scope_of("POST", body, headers), [body])
    a2 = Application(streamed)
    original = cairn.asgi.body_buffered
    cairn.asgi.body_buffered = lambda scope: False
    try:
        serve(a2, scope_of("POST", body, headers), [body])
    finally:
        cairn.asgi.body_buffered = original
    return short, streamed


def test_a_small_request_crosses_to_the_thread_once_and_back_once(monkeypatch):
    crossings = []
    real = asyncio.run_coroutine_threadsafe

    def counted(coroutine: Any, loop: Any) -> Any:
        crossings.append(coroutine)
        return real(coroutine, loop)

    monkeypatch.setattr(asyncio, "run_coroutine_threadsafe", counted)
    seen = Seen()
    body = json.dumps({"expected_version": 3, "envelope": {"x": "y" * 2000}}).encode()
    messages = serve(Application(seen), scope_of("POST", body, []), [body[:700], body[700:]])
    # No message went from the thread to the loop: the answer came back whole.
    assert crossings == []
    assert seen.body == body
    assert [m["type"] for m in messages] == ["http.response.start", "http.response.body"]
    assert messages[0]["status"] == 201
    assert json.loads(messages[1]["body"]) == {"got": len(body)}
    assert not messages[1].get("more_body", False)


@settings(max_examples=60, deadline=None)
@given(
    body=st.binary(max_size=3000),
    headers=st.lists(
        st.tuples(
            st.sampled_from([b"authorization", b"x-cairn-a", b"accept", b"content-type"]),
            st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=20).map(
                lambda s: s.strip().encode()
            ),
        ),
        max_size=4,
    ),
)
def test_django_sees_the_same_request_on_either_route(body, headers):
    short, streamed = both_routes(body, headers)
    assert short.body == streamed.body == body
    assert short.meta == streamed.meta
    assert short.meta["wsgi.input_terminated"] is True  # a chunked body can be read
    assert short.meta["REMOTE_ADDR"] == "10.0.0.7" and short.meta["GET"] == {
        "a": ["1"],
        "b": ["é"],
    }


def test_a_streamed_answer_is_made_and_closed_on_one_thread():
    threads: list[int] = []
    closed: list[int] = []

    class Chunks:
        def __iter__(self) -> Iterator[bytes]:
            for part in (b"one,", b"", b"two,", b"three"):
                threads.append(threading.get_ident())
                yield part

        def close(self) -> None:
            closed.append(threading.get_ident())

    def app(environ: dict, start_response: Any) -> Any:
        threads.append(threading.get_ident())
        response = StreamingHttpResponse(Chunks(), content_type="text/csv")
        start_response("200 OK", list(response.items()))
        return response

    messages = serve(Application(app), scope_of("GET", b"", []), [])
    assert len(set(threads + closed)) == 1 and closed, (threads, closed)
    assert threads[0] != threading.get_ident()  # the pool's, not the loop's
    assert messages[0] == {
        "type": "http.response.start",
        "status": 200,
        "headers": [(b"content-type", b"text/csv")],
    }
    assert b"".join(m.get("body", b"") for m in messages[1:]) == b"one,two,three"
    assert [m.get("more_body", False) for m in messages[1:]] == [True, True, True, False]


def test_a_client_gone_mid_body_is_a_400_and_the_application_never_reads_a_shorter_body():
    seen = Seen()

    def app(environ: dict, start_response: Any) -> Any:
        try:
            return seen(environ, start_response)
        except wsgi_bridge.ClientDisconnected:
            start_response("400 Bad Request", [])
            return HttpResponse(status=400)

    messages = serve(Application(app), scope_of("POST", b"x" * 1000, []), [b'{"a": 1'], gone=True)
    assert seen.body == b""  # never read as a whole, shorter body
    assert messages[0]["status"] == 400


def test_a_large_or_chunked_body_goes_to_the_thread_as_it_is_read():
    big = b"z" * (wsgi_bridge.BUFFERED_BODY_BYTES + 1)
    assert not wsgi_bridge.body_buffered(scope_of("POST", big, []))
    chunked = scope_of("POST", b"", [(b"transfer-encoding", b"chunked")])
    assert not wsgi_bridge.body_buffered(chunked)
    assert wsgi_bridge.body_buffered(scope_of("POST", b"a" * 100, []))
    assert wsgi_bridge.body_buffered(scope_of("GET", b"", []))
    seen = Seen()
    messages = serve(Application(seen), scope_of("POST", big, []), [big[:5000], big[5000:]])
    assert seen.body == big and messages[0]["status"] == 201


@pytest.mark.parametrize("size", [0, 1, wsgi_bridge.BUFFERED_BODY_BYTES])
def test_a_body_at_the_edges_arrives_whole(size):
    body = b"q" * size
    seen = Seen()
    serve(Application(seen), scope_of("POST", body, []), [body])
    assert seen.body == body


@pytest.mark.django_db(transaction=True)
def test_a_client_slow_to_send_its_small_body_holds_no_thread(web_server):  # noqa: F811
    # One thread in the pool. A client sends its headers and part of a small body, then
    # stalls: the loop waits for the rest, and the thread answers everybody else meanwhile.
    server = web_server(threads=1)
    slow = socket.create_connection((server.host, server.port), timeout=30)
    body = json.dumps({"workflow_type": "research", "inputs": {"q": "x" * 500}}).encode()
    slow.sendall(
        b"POST /api/v1/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body[:100]
    )
    time.sleep(0.5)  # the partial request is in
    started = time.monotonic()
    with urllib.request.urlopen(f"{server.url}/login/", timeout=10) as login:  # noqa: S310
        assert login.status == 200
    assert time.monotonic() - started < 3.0
    slow.sendall(body[100:])
    answer = b""
    while chunk := slow.recv(65536):
        answer += chunk
    slow.close()
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]  # no token: read whole, refused
