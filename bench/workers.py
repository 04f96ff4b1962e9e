"""Case 4: end-to-end step overhead on Cairn workers (Celery, Redis broker) against DBOS's
in-process steps, and the time from a killed worker to the next step on another."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import QUICK, REDIS_URL, ROOT, Measurement

MODULES = "runtime.demo,bench.noop_workflow"


def _worker(
    name: str, log_dir: Path, lease_seconds: int, database_url: str | None = None
) -> subprocess.Popen:
    env = {
        **os.environ,
        "CAIRN_WORKFLOW_MODULES": MODULES,
        "CELERY_BROKER_URL": REDIS_URL,
        "CAIRN_LEASE_SECONDS": str(lease_seconds),
        "CAIRN_DISPATCH_ON_COMMIT": "1",
        "PYTHONPATH": str(ROOT),
        **({"DATABASE_URL": database_url} if database_url else {}),
    }
    log = open(log_dir / f"{name}.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "cairn",
            "worker",
            "--pool",
            "solo",
            "--hostname",
            f"{name}@bench",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _purge() -> None:
    from cairn.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge("celery")


def _queued() -> int:
    """Tasks waiting in the broker's queue (Redis list ``celery``)."""
    from cairn.celery import app

    with app.connection_for_write() as conn:
        return conn.default_channel.client.llen("celery")


def _finished(run_id) -> bool:  # noqa: ANN001
    from checkpoints.models import Run

    return Run.objects.filter(pk=run_id, status="succeeded", lease_owner="").exists()


def _wait(predicate, timeout: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return False


def worker_case(tenant, dbos_dsn: str) -> list[Measurement]:  # noqa: ANN001
    from django.conf import settings

    import bench.noop_workflow  # noqa: F401 - declares the workflows in this process too
    from bench.dbos_proc import DbosProcess
    from checkpoints.models import Checkpoint, OutboxMessage
    from runtime.registry import workflows_sync
    from runtime.rescue import runs_rescue
    from runtime.services.runs import run_create
    from tenants.services import Actor

    settings.CAIRN_DISPATCH_ON_COMMIT = True
    settings.CELERY_BROKER_URL = REDIS_URL
    from cairn.celery import app

    app.conf.broker_url = REDIS_URL
    workflows_sync()
    _purge()
    logs = Path(tempfile.mkdtemp(prefix="cairn-bench-workers-"))
    actor = Actor.system("bench")
    runs = 10 if QUICK else 40
    results = []

    def start(workflow_type: str = "bench_noop"):  # noqa: ANN202
        return run_create(
            tenant=tenant, workflow_type=workflow_type, execution="worker", actor=actor
        )

    worker = _worker("w1", logs, lease_seconds=30)
    try:
        # Warm the worker (imports, connections) with one run before measuring.
        warm = start()
        _wait(lambda: _finished(warm.pk), 120)
        per_step, stale = [], 0
        for _ in range(runs):
            begin = time.perf_counter()
            run = start()
            _wait(lambda run=run: _finished(run.pk), 60)
            per_step.append((time.perf_counter() - begin) * 1000 / 6)
            # Between runs nothing may be queued: the worker executes its own commands.
            stale += _queued()
            stale += OutboxMessage.objects.filter(run_id=run.pk, attempts__gt=0).count() - 1
        if stale:
            raise RuntimeError(f"{stale} stale tasks were queued between the step runs")
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    counts = _step_counts(logs, start)
    if True:
        results.append(
            Measurement(
                "steps",
                "cairn",
                "per step, six-step run on a worker",
                samples=per_step,
                note="includes the broker hop that starts the run; no stale task queued "
                f"between runs (checked after each of {runs} runs)",
            ).counted(counts["per step of a six-step run"])
        )
        results.append(
            Measurement(
                "steps",
                "cairn",
                "lean step (counts only)",
                samples=[float("nan")],
                note="a lean step: six-step minus three-step run, over three steps",
            ).counted(counts["lean step"])
        )
    with DbosProcess(dbos_dsn) as dbos:
        dbos.call("workflows", 3, 6, 64)
        samples = dbos.call("workflows", runs, 6, 64)
    results.append(
        Measurement(
            "steps",
            "dbos",
            "per step, six-step workflow in process",
            samples=samples,
            note="DBOS in its own process, started for this case only",
        )
    )

    # Kill-to-next-step: a worker dies in step 3; another takes over once the lease expires.
    lease = 2
    hold = logs / "hold"
    os.environ["BENCH_HOLD_FILE"] = str(hold)
    takeovers = []
    for attempt in range(2 if QUICK else 5):
        hold.write_text("hold")
        first = _worker(f"first{attempt}", logs, lease_seconds=lease)
        second = None
        try:
            run = run_create(
                tenant=tenant, workflow_type="bench_hold", execution="worker", actor=actor
            )
            if not _wait(lambda: Path(str(hold) + ".entered").exists(), 60):
                raise RuntimeError("the first worker never reached step 3")
            Path(str(hold) + ".entered").unlink()
            second = _worker(f"second{attempt}", logs, lease_seconds=lease)
            time.sleep(2)  # let the second worker start before the kill
            os.killpg(first.pid, signal.SIGKILL)
            killed = time.perf_counter()
            hold.unlink()  # the step may now finish when it runs again
            while not Checkpoint.objects.filter(run_id=run.pk, state="step4").exists():
                runs_rescue()  # the beat's sweep, run here every 50 ms
                time.sleep(0.05)
                if time.perf_counter() - killed > 60:
                    raise RuntimeError("no worker took the run over")
            takeovers.append((time.perf_counter() - killed) * 1000)
        finally:
            for proc in (first, second):
                if proc is not None and proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
    results.append(
        Measurement(
            "steps",
            "cairn",
            f"kill to next step (lease {lease} s)",
            samples=takeovers,
            note="bounded by the lease: a dead worker's lease must expire",
        )
    )
    return results


def _step_counts(logs: Path, start) -> dict:  # noqa: ANN001
    """Round trips, statements and transactions of a worker's six-step and three-step run,
    counted on the wire (a worker whose database connection goes through the proxy)."""
    from bench.common import BENCH_DB
    from bench.wire import CountingProxy

    with CountingProxy() as proxy:
        worker = _worker("counted", logs, lease_seconds=30, database_url=proxy.dsn(BENCH_DB))
        try:
            warm = start()
            _wait(lambda: _finished(warm.pk), 120)
            totals = {}
            for workflow_type in ("bench_noop", "bench_noop3"):
                time.sleep(0.2)
                proxy.reset()
                run = start(workflow_type)
                _wait(lambda run=run: _finished(run.pk), 60)
                time.sleep(0.2)  # the release after the last commit
                totals[workflow_type] = proxy.snapshot()
        finally:
            worker.terminate()
            worker.wait(timeout=30)
    six, three = totals["bench_noop"], totals["bench_noop3"]
    lean = type(six)(
        round_trips=(six.round_trips - three.round_trips) / 3,
        statements=(six.statements - three.statements) / 3,
        transactions=(six.transactions - three.transactions) / 3,
    )
    print(f"  worker, six-step run: {six.label()}", flush=True)
    print(f"  worker, lean step: {lean.label()}", flush=True)
    return {"per step of a six-step run": six.per(6), "lean step": lean}
