"""Worker heartbeats: which worker processes are alive, judged by the age of their last beat
on the database's clock, and how far each one's clock is from the database's.

Every worker process that runs Cairn's tasks beats from a thread of its own: every
``CAIRN_WORKER_HEARTBEAT_SECONDS`` (1 s) it writes ``last_seen_at = the database's time`` on
its ``WorkerHeartbeat`` row (keyed by its lease-owner name, ``worker_identity()``), and the
offset of its clock from the database's. A long step does not hold the beat up (it is a
thread), so a beat that stops means the process is gone: SIGKILLed, out of memory, its
machine lost. A worker is **dead** once its last beat is older than
``CAIRN_WORKER_DEAD_SECONDS`` (3 s), and then the rescue takes over its runs without waiting
for their leases to expire (``runtime.rescue.runs_rescue_dead_workers``, every second on the
beat). Leases keep their length: a live worker in a 45 s step holds its run as before.

Reading heartbeats (the health page, the console's workers page, the rescue) goes through
``workers_liveness`` and ``workers_dead``; the thresholds are the two settings above, so every
reader calls a worker dead at the same age.

A clock more than ``CAIRN_CLOCK_SKEW_LIMIT_SECONDS`` (2 s) off the database's is logged by
the worker (``worker clock is off the database's``, at most once a minute) and shown on the
health page. Leases do not depend on it (they are set and compared on the database's clock,
``cairn.clock``), but retry times a worker computes and what its logs say do.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from cairn import clock
from checkpoints.models import WorkerHeartbeat
from telemetry import tracing

log = logging.getLogger("cairn.runtime")

_identity: tuple[int, str] | None = None
_beat: _HeartbeatThread | None = None
_start_lock = threading.Lock()
# A measurement whose round trip took longer than this says more about the load than the
# clock: it is not recorded.
_MEASURE_MAX_ROUND_TRIP = 0.5
_SKEW_LOG_EVERY = 60.0


def worker_identity() -> str:
    """This process's lease owner name, also its heartbeat's key (one per process: prefork
    children differ)."""
    global _identity
    pid = os.getpid()
    if _identity is None or _identity[0] != pid:
        _identity = (pid, f"{socket.gethostname()}:{pid}:{secrets.token_hex(3)}")
    return _identity[1]


def _in_worker() -> bool:
    # Only a Celery worker process beats: a task called in a web process, a command or a
    # test is no worker, and holds no lease past its own call.
    from cairn.celery import app

    return bool(getattr(app.loader, "worker_initialized", False))


def heartbeat_start() -> str:
    """Start this process's heartbeat thread unless it is running (in a Celery worker
    process only); return the identity it beats for. Cheap to call before every task."""
    global _beat
    owner = worker_identity()
    if not _in_worker():
        return owner
    beat = _beat
    if beat is not None and beat.pid == os.getpid() and beat.is_alive():
        return owner
    with _start_lock:
        if _beat is None or _beat.pid != os.getpid() or not _beat.is_alive():
            _beat = _HeartbeatThread(owner)
            _beat.start()
            # The first beat before this process takes any lease: a worker killed right
            # after its first lease is then known, and known dead.
            _beat.first.wait(timeout=2 * float(settings.CAIRN_WORKER_HEARTBEAT_SECONDS) + 5)
    return owner


def heartbeat_steady_for() -> float:
    """Seconds this process's beats have reached the database without a gap longer than
    ``CAIRN_WORKER_DEAD_SECONDS`` (0 when it has no heartbeat thread or its last beat
    failed). The rescue calls other workers dead only while this is at least that long:
    right after a database outage every beat is old, the live workers' too."""
    beat = _beat
    if beat is None or beat.pid != os.getpid() or not beat.is_alive():
        return 0.0
    return beat.steady_for()


def heartbeat_beat(owner: str) -> float | None:
    """One beat (two statements): read the database's time, measuring this clock's offset
    from it, and write it as the worker's ``last_seen_at``. Returns the offset in seconds
    (this clock minus the database's), or None when the round trip was too slow to tell."""
    before = timezone.now().timestamp()
    db_time = clock.db_now()
    after = timezone.now().timestamp()
    offset = None
    if after - before <= _MEASURE_MAX_ROUND_TRIP:
        offset = round((before + after) / 2 - db_time.timestamp(), 3)
        clock.offset_record(offset)
    fields = {"last_seen_at": db_time, "hostname": socket.gethostname()[:200], "pid": os.getpid()}
    if offset is not None:
        fields["clock_offset_seconds"] = offset
    if not WorkerHeartbeat.objects.filter(worker_id=owner[:200]).update(**fields):
        WorkerHeartbeat.objects.create(worker_id=owner[:200], **fields)
    return offset


class _HeartbeatThread(threading.Thread):
    def __init__(self, owner: str) -> None:
        super().__init__(name="cairn-heartbeat", daemon=True)
        self.owner = owner
        self.pid = os.getpid()
        self._steady_since: float | None = None
        self._last_ok = 0.0
        self._skew_logged = 0.0
        self.first = threading.Event()

    def steady_for(self) -> float:
        now = time.monotonic()
        if self._steady_since is None or now - self._last_ok > settings.CAIRN_WORKER_DEAD_SECONDS:
            return 0.0
        return now - self._steady_since

    def run(self) -> None:
        # A beat is a protocol statement, as a lease renewal is: not traced one by one (a
        # statement span each second, each the root of a trace of its own, would tell
        # nothing the heartbeat table and the workers gauge do not).
        with tracing.protocol_statements():
            self._beat_forever()

    def _beat_forever(self) -> None:
        interval = float(settings.CAIRN_WORKER_HEARTBEAT_SECONDS)
        try:
            while True:
                started = time.monotonic()
                try:
                    offset = heartbeat_beat(self.owner)
                except Exception:  # the database is away: beat again at the next interval
                    self._steady_since = None
                    log.warning("worker heartbeat failed", exc_info=True)
                    connection.close()  # reconnect at the next beat
                else:
                    now = time.monotonic()
                    if self._steady_since is None or now - self._last_ok > (
                        settings.CAIRN_WORKER_DEAD_SECONDS
                    ):
                        self._steady_since = now
                    self._last_ok = now
                    self._say_skew(offset, now)
                finally:
                    self.first.set()
                time.sleep(max(0.0, interval - (time.monotonic() - started)))
        finally:
            connection.close()

    def _say_skew(self, offset: float | None, now: float) -> None:
        limit = settings.CAIRN_CLOCK_SKEW_LIMIT_SECONDS
        if offset is None or abs(offset) <= limit or now - self._skew_logged < _SKEW_LOG_EVERY:
            return
        self._skew_logged = now
        log.warning(
            "worker clock is off the database's by %+.1f s (the bound is %s s): synchronise "
            "this machine's clock (NTP); leases are safe, retry times and log times are not",
            offset,
            limit,
            extra={"worker": self.owner, "clock_offset_seconds": offset, "bound": limit},
        )


# --- reading heartbeats ----------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerLiveness:
    """One worker process as its heartbeat shows it."""

    worker_id: str
    hostname: str
    pid: int | None
    started_at: datetime
    last_seen_at: datetime
    age_seconds: float  # since its last beat, on the database's clock
    live: bool  # beat within CAIRN_WORKER_DEAD_SECONDS
    clock_offset_seconds: float | None  # its clock minus the database's
    clock_off: bool  # beyond CAIRN_CLOCK_SKEW_LIMIT_SECONDS


def workers_liveness(*, limit: int = 100) -> list[WorkerLiveness]:
    """The most recently seen worker processes, newest first, each live or dead by the age
    of its last beat (two statements: the database's time, the rows)."""
    now = clock.db_now()
    dead_after = settings.CAIRN_WORKER_DEAD_SECONDS
    skew = settings.CAIRN_CLOCK_SKEW_LIMIT_SECONDS
    rows = WorkerHeartbeat.objects.order_by("-last_seen_at")[:limit]
    result = []
    for row in rows:
        age = max(0.0, (now - row.last_seen_at).total_seconds())
        offset = row.clock_offset_seconds
        result.append(
            WorkerLiveness(
                worker_id=row.worker_id,
                hostname=row.hostname,
                pid=row.pid,
                started_at=row.started_at,
                last_seen_at=row.last_seen_at,
                age_seconds=age,
                live=age <= dead_after,
                clock_offset_seconds=offset,
                clock_off=offset is not None and abs(offset) > skew,
            )
        )
    return result


def workers_dead() -> list[str]:
    """The workers that stopped beating recently enough to still hold leases: last seen more
    than ``CAIRN_WORKER_DEAD_SECONDS`` ago, and less than a lease period before that (an
    older one's leases have expired by themselves). One statement, on the database's clock."""
    dead_after = timedelta(seconds=settings.CAIRN_WORKER_DEAD_SECONDS)
    window = dead_after + timedelta(seconds=settings.CAIRN_LEASE_SECONDS)
    return list(
        WorkerHeartbeat.objects.filter(
            last_seen_at__lt=Now() - dead_after, last_seen_at__gte=Now() - window
        ).values_list("worker_id", flat=True)
    )


WORKERS_REMEMBERED = timedelta(days=1)


def workers_tally(*, now: datetime | None = None) -> tuple[int, int]:
    """How many workers seen within a day are live and how many dead, by the same age rule
    as ``workers_liveness`` (one statement; at ``now``, or the database's time when None)."""
    from django.db.models import Count, Q

    at = Now() if now is None else now
    dead_after = timedelta(seconds=settings.CAIRN_WORKER_DEAD_SECONDS)
    seen = WorkerHeartbeat.objects.filter(last_seen_at__gte=at - WORKERS_REMEMBERED).aggregate(
        live=Count("pk", filter=Q(last_seen_at__gte=at - dead_after)), seen=Count("pk")
    )
    return seen["live"], seen["seen"] - seen["live"]
