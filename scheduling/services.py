"""Claims that make every periodic job safe with any number of schedulers.

``celery beat`` sends each scheduled job on its own clock; two beats (a redeploy overlap,
two hosts) send every job twice. A job's task runs the job only after it claims the job's
``PeriodicJob`` row with one conditional UPDATE: the claim succeeds when no run is in
progress (``running_until`` passed) and the last run started at least ``MIN_GAP`` of the
job's interval ago. On PostgreSQL the UPDATE takes the row lock, on SQLite the database's
write lock (IMMEDIATE transactions): either way exactly one concurrent claimant wins, and the
others count a skip. A claim is released when the run ends; a run whose process died holds
the job until its lease (``running_until``) passes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from scheduling.models import PeriodicJob

T = TypeVar("T")
# A run starts at most once per this fraction of the job's interval, whatever the number of
# schedulers; the slack lets one scheduler's late message through.
MIN_GAP = 0.8
logger = logging.getLogger("cairn.scheduling")


def job_interval(task_name: str) -> float:
    """The job's interval in seconds, from CELERY_BEAT_SCHEDULE (0 when it is not there)."""
    for entry in settings.CELERY_BEAT_SCHEDULE.values():
        if entry["task"] == task_name:
            schedule = entry["schedule"]
            if isinstance(schedule, timedelta):
                return schedule.total_seconds()
            return float(schedule)
    # Not scheduled (sent by hand): every call may run, one at a time.
    return 0.0


def _lease(every: float) -> timedelta:
    return timedelta(seconds=2 * every + settings.CAIRN_PERIODIC_JOB_LEASE_SECONDS)


def periodic_job_claim(*, name: str, every: float, holder: str) -> bool:
    """Claim job ``name`` for one run; True when this caller won and must run it.

    Atomic: one conditional UPDATE. Never raises for a lost race (it counts a skip)."""
    now = timezone.now()
    try:
        with transaction.atomic():
            PeriodicJob.objects.get_or_create(name=name)
    except IntegrityError:
        pass  # created by a concurrent claimant
    won = (
        PeriodicJob.objects.filter(name=name)
        .filter(
            Q(last_started_at__isnull=True)
            | Q(last_started_at__lte=now - timedelta(seconds=MIN_GAP * every))
        )
        .filter(Q(running_until__isnull=True) | Q(running_until__lt=now))
        .update(
            last_started_at=now,
            running_until=now + _lease(every),
            holder=holder[:200],
            runs=F("runs") + 1,
        )
    )
    if not won:
        PeriodicJob.objects.filter(name=name).update(skipped=F("skipped") + 1)
    return bool(won)


def periodic_job_release(*, name: str, holder: str) -> None:
    PeriodicJob.objects.filter(name=name, holder=holder[:200]).update(running_until=None)


def periodic_job_run(
    *, name: str, job: Callable[[], T], holder: str, every: float | None = None
) -> T | None:
    """Run ``job`` if this caller claims it (see periodic_job_claim); None when skipped.

    The claim is released when the job returns or raises."""
    interval = job_interval(name) if every is None else every
    if not periodic_job_claim(name=name, every=interval, holder=holder):
        logger.info("periodic job %s skipped: claimed by another run", name)
        return None
    try:
        return job()
    finally:
        periodic_job_release(name=name, holder=holder)
