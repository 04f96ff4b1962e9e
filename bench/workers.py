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

MODULES = "checkpoints.runtime.demo,bench.noop_workflow"


def _worker(name: str, log_dir: Path, lease_seconds: int) -> subprocess.Popen:
    env = {
        **os.environ,
        "CAIRN_WORKFLOW_MODULES": MODULES,
        "CELERY_BROKER_URL": REDIS_URL,
        "CAIRN_LEASE_SECONDS": str(lease_seconds),
        "CAIRN_DISPATCH_ON_COMMIT": "1",
        "PYTHONPATH": str(ROOT),
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


def _wait(predicate, timeout: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return False


def worker_case(tenant, dbos) -> list[Measurement]:  # noqa: ANN001
    from django.conf import settings

    import bench.noop_workflow  # noqa: F401 - declares the workflows in this process too
    from checkpoints.models import Checkpoint, Run
    from checkpoints.runtime.registry import workflows_sync
    from checkpoints.runtime.rescue import runs_rescue
    from checkpoints.services.runs import run_create
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
    worker = _worker("w1", logs, lease_seconds=30)
    try:
        # Warm the worker (imports, connections) with one run before measuring.
        warm = run_create(
            tenant=tenant, workflow_type="bench_noop", execution="worker", actor=actor
        )
        _wait(lambda: Run.objects.get(pk=warm.pk).status == "succeeded", 120)
        per_step = []
        for _ in range(runs):
            start = time.perf_counter()
            run = run_create(
                tenant=tenant, workflow_type="bench_noop", execution="worker", actor=actor
            )
            _wait(lambda run=run: Run.objects.filter(pk=run.pk, status="succeeded").exists(), 60)
            per_step.append((time.perf_counter() - start) * 1000 / 6)
        results.append(
            Measurement(
                "steps",
                "cairn",
                "per step, six-step run on a worker",
                samples=per_step,
                note="includes the broker hop that starts the run",
            )
        )
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        dbos.workflow(6, 64)
        samples.append((time.perf_counter() - start) * 1000 / 6)
    results.append(
        Measurement("steps", "dbos", "per step, six-step workflow in process", samples=samples)
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
