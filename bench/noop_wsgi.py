"""The server's hand-over, measured alone: a WSGI application that reads the request and
answers 204 with nothing, served by ``cairn.asgi`` as Django is (the event loop hands it to
the thread pool and takes the answer back, ``cairn/wsgi_bridge.py``). What a request costs
before Django does anything, beside ``bench/noop_asgi.py``, which never leaves the loop."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cairn.settings")

from cairn.asgi import Application  # noqa: E402


class _Nothing(list):
    """An answer of no bytes that says it is whole, as Django's HttpResponse does."""

    streaming = False


def _nothing(environ: dict, start_response: Any) -> _Nothing:
    environ["wsgi.input"].read()
    start_response("204 No Content", [])
    return _Nothing()


application = Application(_nothing)
