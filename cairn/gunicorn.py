"""gunicorn's configuration for Cairn's web process, in every mode: ``make run``
(``cairn_up``) and production (docs/deployment.md) start the same server with this file:

    gunicorn -c python:cairn.gunicorn cairn.asgi:application

Each worker process runs uvicorn's event loop (``Worker`` below) serving ``cairn.asgi``:
Django's application on a pool of ``threads`` threads, so a slow request (an artifact
upload) does not hold the others up, and long-polls (``GET /runs/{id}/next?wait=``) that
sleep on the event loop holding no thread, capped per tenant by CAIRN_WAITS_PER_TENANT.
gunicorn's own settings and environment still apply on top (``--bind``, ``--workers`` or
``WEB_CONCURRENCY``, ``--threads``, ``GUNICORN_CMD_ARGS``).
"""

from typing import Any, ClassVar

from uvicorn_worker import UvicornWorker


class Worker(UvicornWorker):
    """uvicorn's gunicorn worker, as Cairn runs it:

    - no lifespan events (the application has none);
    - no ``Server`` header;
    - no rewriting of the client's address or scheme from ``X-Forwarded-*``: the proxy in
      front sets the address, and Django's SECURE_PROXY_SSL_HEADER reads the scheme, as
      with gunicorn's own workers;
    - the application's thread pool sized by gunicorn's ``threads``.
    """

    CONFIG_KWARGS: ClassVar[dict[str, Any]] = {
        "loop": "auto",
        "http": "auto",
        "lifespan": "off",
        "server_header": False,
        "proxy_headers": False,
    }

    def load_wsgi(self) -> None:
        super().load_wsgi()
        if hasattr(self.wsgi, "threads"):
            self.wsgi.threads = self.cfg.threads


bind = ["127.0.0.1:8000"]
worker_class = "cairn.gunicorn.Worker"
threads = 16
# A long-poll answers within 30 seconds and sleeps on the event loop, which reports alive
# meanwhile, so this only ends a worker whose loop is stuck.
timeout = 60
# Behind a proxy (TLS ends there), keep-alive between it and gunicorn saves a handshake per
# request; a runner's keep-alive connection occupies no thread while idle.
keepalive = 5
