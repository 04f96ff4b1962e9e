"""gunicorn's configuration for Cairn's web process, in every mode: ``make run``
(``cairn_up``) and production (docs/deployment.md) start the same server with this file:

    gunicorn -c python:cairn.gunicorn cairn.wsgi:application

gthread workers: each process serves ``threads`` requests at once, so a slow request (a
long-poll on ``GET /runs/{id}/next?wait=``, capped per tenant by CAIRN_WAITS_PER_TENANT, an
artifact upload) does not hold the others up. gunicorn's own settings and environment
still apply on top (``--bind``, ``--workers`` or ``WEB_CONCURRENCY``, ``GUNICORN_CMD_ARGS``).
"""

bind = ["127.0.0.1:8000"]
worker_class = "gthread"
threads = 16
# A long-poll answers within 30 seconds; gthread workers report alive while their threads
# work, so this only ends a worker whose main loop is stuck.
timeout = 60
# Behind a proxy (TLS ends there), keep-alive between it and gunicorn saves a handshake per
# request; a runner's keep-alive connection occupies no thread while idle.
keepalive = 5
