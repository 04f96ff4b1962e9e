"""Local HTTP receivers for outbound tests: a runner's webhook endpoint on loopback that
records every request it gets, can fail the first few, or answers with a redirect."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class Receiver(ThreadingHTTPServer):
    """Records (method, path, headers, body) of each request; fails the first
    ``fail_first`` with a 503; with ``redirect_to`` answers every request 302 to it."""

    def __init__(self, fail_first: int = 0, redirect_to: str = "", host: str = "127.0.0.1"):
        self.fail_first = fail_first
        self.redirect_to = redirect_to
        self.seen: list[tuple[str, str, dict, bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # noqa: ANN002
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                receiver.seen.append((self.command, self.path, dict(self.headers), body))
                if receiver.redirect_to:
                    self.send_response(302)
                    self.send_header("Location", receiver.redirect_to)
                else:
                    failing = len(receiver.seen) <= receiver.fail_first
                    self.send_response(503 if failing else 204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            do_POST = do_GET = do_PUT = _answer  # noqa: N815

        super().__init__((host, 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    @property
    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.port}/hooks/cairn"

    @property
    def bodies(self) -> list[bytes]:
        return [body for _, _, _, body in self.seen]

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


@pytest.fixture
def receivers() -> Iterator:
    """receivers(**kwargs) → a started Receiver; all are stopped when the test ends."""
    started: list[Receiver] = []

    def start(**kwargs) -> Receiver:  # noqa: ANN003
        started.append(Receiver(**kwargs))
        return started[-1]

    yield start
    for receiver in started:
        receiver.stop()
