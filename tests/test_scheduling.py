"""Periodic jobs are safe with two schedulers: each job's run starts only by winning its
claim (scheduling.services), with real concurrent claimants and two real ``celery beat``."""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from collections import Counter
from datetime import datetime, timedelta
from itertools import pairwise

import pytest
from django.db import connection
from django.utils import timezone

from scheduling.models import PeriodicJob
from scheduling.services import MIN_GAP, periodic_job_run
from tests.beat_settings import BEAT_SECONDS, CELERY_BEAT_SCHEDULE
from tests.scaleout_support import process
from tests.worker_fixtures import database_env, wait_for

JOB = "checkpoints.outbox_sweep"


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_claimants_start_the_job_once():
    ran: list[str] = []
    outcomes: list = [None] * 20
    barrier = threading.Barrier(20)

    def claimant(index: int) -> None:
        try:
            barrier.wait(timeout=30)
            outcomes[index] = periodic_job_run(
                name=JOB,
                every=60,
                holder=f"w{index}",
                job=lambda: ran.append(f"w{index}") or time.sleep(0.2) or "ran",
            )
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test inspects
            outcomes[index] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=claimant, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert Counter(outcomes) == {"ran": 1, None: 19}, outcomes
    job = PeriodicJob.objects.get(name=JOB)
    assert (job.runs, job.skipped, job.holder) == (1, 19, ran[0])
    assert job.running_until is None  # released when the run ended


@pytest.mark.django_db
def test_a_second_run_inside_the_interval_is_skipped_and_one_after_it_runs():
    assert periodic_job_run(name=JOB, every=60, holder="a", job=lambda: 1) == 1
    assert periodic_job_run(name=JOB, every=60, holder="b", job=lambda: 2) is None
    PeriodicJob.objects.filter(name=JOB).update(
        last_started_at=timezone.now() - timedelta(seconds=60 * MIN_GAP + 1)
    )
    assert periodic_job_run(name=JOB, every=60, holder="b", job=lambda: 3) == 3


@pytest.mark.django_db
def test_a_run_whose_worker_died_holds_the_job_until_its_lease_passes():
    long_ago = timezone.now() - timedelta(hours=1)
    PeriodicJob.objects.create(
        name=JOB, last_started_at=long_ago, running_until=timezone.now() + timedelta(minutes=1)
    )
    assert periodic_job_run(name=JOB, every=5, holder="b", job=lambda: "ran") is None
    PeriodicJob.objects.filter(name=JOB).update(running_until=timezone.now())
    assert periodic_job_run(name=JOB, every=5, holder="b", job=lambda: "ran") == "ran"


@pytest.mark.django_db
def test_a_job_that_raises_releases_its_claim():
    def boom() -> None:
        raise RuntimeError("job failed")

    with pytest.raises(RuntimeError):
        periodic_job_run(name=JOB, every=0, holder="a", job=boom)
    assert PeriodicJob.objects.get(name=JOB).running_until is None


_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}): ")


def _longest_pause(log: str) -> str:
    """The longest stretch between two consecutive timed lines of a worker's log (or since
    its last line)."""
    times = [
        datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f")
        for match in map(_LOG_TIME.match, log.splitlines())
        if match
    ]
    if not times:
        return "no timed lines"
    # The log's times are local, as datetime.now() is; the silence since its last line too.
    gap, before = max((b - a, a) for a, b in pairwise([*times, datetime.now()]))
    return f"{gap.total_seconds():.1f} s after {before:%H:%M:%S.%f}"


def _queue_depth(broker) -> str:  # noqa: ANN001
    from cairn.celery import app

    queue = broker.env.get("CAIRN_TASK_QUEUE") or app.conf.task_default_queue
    try:
        with app.connection_for_write() as conn:
            ok = conn.default_channel.queue_declare(queue=queue, passive=True)
        return f"{ok.message_count} ready, {ok.consumer_count} consumer(s) on {queue}"
    except Exception as exc:  # noqa: BLE001 - a diagnostic only
        return f"unknown ({exc!r})"


def _two_beats_state(names: set[str], worker, tmp_path, broker) -> str:  # noqa: ANN001
    """What a two-beats run looked like when its wait timed out: per job what each beat
    sent, what the worker took and what the claims counted."""
    log = worker.log()
    received = Counter(re.findall(r"Task ([\w.]+)\[[^\]]+\] received", log))
    sent = {
        side: Counter(
            re.findall(
                r"Sending due task \S+ \(([\w.]+)\)",
                (tmp_path / f"beat-{side}.log").read_text(errors="replace"),
            )
        )
        for side in ("a", "b")
    }
    jobs = {job.name: job for job in PeriodicJob.objects.all()}
    lines = []
    for name in sorted(names):
        job = jobs.get(name)
        runs, skipped = (job.runs, job.skipped) if job else (0, 0)
        missing = [label for label, count in (("run", runs), ("skip", skipped)) if not count]
        lines.append(
            f"  {name}: sent a={sent['a'][name]} b={sent['b'][name]}, "
            f"worker took {received[name]}, runs={runs} skipped={skipped}"
            + (f"  <- no {' and no '.join(missing)}" if missing else "")
        )
    return "\n".join(
        [
            f"worker alive={worker.alive}, took {sum(received.values())} messages, "
            f"longest pause in its log: {_longest_pause(log)}; "
            f"queue: {_queue_depth(broker)}",
            *lines,
        ]
    )


@pytest.mark.worker
def test_two_real_beats_start_each_job_once_per_interval(broker, worker_factory, tmp_path):
    env_extra = {"DJANGO_SETTINGS_MODULE": "tests.beat_settings"}
    worker = worker_factory(name="w1", env=env_extra)

    env = {
        **os.environ,
        "CAIRN_MEDIA_ROOT": str(tmp_path / "media"),
        **broker.env,
        **database_env(),
        **env_extra,
    }
    beat = [sys.executable, "-m", "celery", "-A", "cairn", "beat", "--loglevel", "INFO"]
    names = {entry["task"] for entry in CELERY_BEAT_SCHEDULE.values()}
    started = time.monotonic()
    with (
        process([*beat, "-s", str(tmp_path / "beat-a")], env=env, log=tmp_path / "beat-a.log"),
        process([*beat, "-s", str(tmp_path / "beat-b")], env=env, log=tmp_path / "beat-b.log"),
    ):
        # Both beats send every job each second. A job's message that lost its claim is a
        # skip, so every job showing a skip proves the second scheduler's messages arrived
        # and were refused (without the claim no job ever skips and this wait fails). The
        # worker drains the messages one at a time, so how many it has taken by a given
        # moment depends on the machine: the wait is on the condition, not on a count.
        wait_for(
            lambda: (
                {job.name for job in PeriodicJob.objects.filter(runs__gte=1, skipped__gte=1)}
                == names
            ),
            what="every job run once and refused to the other scheduler at least once",
            timeout=120,
            detail=lambda: _two_beats_state(names, worker, tmp_path, broker),
        )
        time.sleep(4 * BEAT_SECONDS)
    elapsed = time.monotonic() - started
    assert worker.alive
    received = Counter(re.findall(r"Task ([\w.]+)\[[^\]]+\] received", worker.log()))
    jobs = {job.name: job for job in PeriodicJob.objects.all()}
    assert set(jobs) == names
    bound = elapsed / (MIN_GAP * BEAT_SECONDS) + 1
    for name, job in jobs.items():
        # Every message the worker took either ran its job or was refused its claim …
        assert job.runs + job.skipped <= received[name], (name, job.runs, job.skipped)
        # … and however many arrived, each job started at most once per (MIN_GAP of an)
        # interval, where two unguarded schedulers would start it about twice as often.
        assert 1 <= job.runs <= bound, (name, job.runs, bound)


@pytest.mark.django_db
def test_a_job_sent_by_hand_outside_the_schedule_runs_each_time(settings):
    settings.CELERY_BEAT_SCHEDULE = {}
    assert periodic_job_run(name=JOB, holder="a", job=lambda: 1) == 1
    assert periodic_job_run(name=JOB, holder="a", job=lambda: 2) == 2
