import os

from celery import Celery, bootsteps
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


def _wake_for_ready_callbacks(hub) -> None:  # noqa: ANN001 - kombu's Hub
    # Called by the hub just before it polls. Callbacks that became ready while the hub ran
    # its ready ones (kombu 5.7's create_loop) wait for that poll, up to 10 s, unless
    # something wakes it, and the loop's own thread never does (Hub.call_soon wakes it only
    # from other threads). One of them is a task's acknowledgement (acks_late): with a
    # prefetch of one the broker holds the next message until it arrives, so a worker sat
    # idle for up to 10 s between messages while its queue filled (on RabbitMQ; Redis's
    # transport was not seen to stall: tests/test_worker_event_loop.py). Waking the poller
    # makes the poll return at once and the hub run them. kombu's waker is private API:
    # without one (kombu before 5.7) this does nothing.
    waker = getattr(hub, "_waker", None)
    if waker is not None and getattr(hub, "_ready", None):
        waker.wake()


class _WakeForReadyCallbacks(bootsteps.StartStopStep):
    """The worker's event loop runs a ready callback (an acknowledgement) at once, never
    after its next poll (see _wake_for_ready_callbacks)."""

    requires = ("celery.worker.components:Hub",)

    def start(self, worker) -> None:  # noqa: ANN001
        hub = getattr(worker, "hub", None)
        if hub is not None:  # None without the event loop (filesystem broker, solo synloop)
            hub.on_tick.add(self._wake)
            self._hub = hub

    def _wake(self) -> None:
        _wake_for_ready_callbacks(self._hub)


app.steps["worker"].add(_WakeForReadyCallbacks)
