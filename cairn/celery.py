import os

from celery import Celery
from celery.signals import task_postrun, task_prerun

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cairn.settings")

app = Celery("cairn")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

# Celery's Django fixup closes every database connection before and after every task unless
# this is set, so each run.resume paid a new PostgreSQL connection and prepared the commit
# statement again (docs/performance.md). Its count is never reached; instead a worker treats
# its connections as Django treats a web request's: closed around each task only when they
# are unusable (an error left them broken) or older than CONN_MAX_AGE.
app.conf["CELERY_DB_REUSE_MAX"] = 2**62  # the fixup reads this name


def _close_old_connections(**_kwargs: object) -> None:
    from django.db import close_old_connections

    close_old_connections()


task_prerun.connect(_close_old_connections, weak=False)
task_postrun.connect(_close_old_connections, weak=False)
