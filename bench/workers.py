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
    name: str, log_dir: Path, lease_seconds: int | None, database_url: str | None = None
) -> subprocess.Popen:
    """A solo worker; ``lease_seconds=None`` keeps the shipped lease."""
    env = {
        **os.environ,
        "CAIRN_WORKFLOW_MODULES": MODULES,
        "CELERY_BROKER_URL": REDIS_URL,
        **({"CAIRN_LEASE_SECONDS": str(lease_seconds)} if lease_seconds else {}),
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
    from checkpoints.models import OutboxMessage
    from runtime.registry import workflows_sync
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

    results += takeover_case(tenant, logs)
    return results


def _beat(log_dir: Path) -> subprocess.Popen:
    """``celery beat`` with the shipped schedule (the dead-worker rescue every second)."""
    env = {**os.environ, "CELERY_BROKER_URL": REDIS_URL, "PYTHONPATH": str(ROOT)}
    log = open(log_dir / "beat.log", "w")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "cairn",
            "beat",
            "-s",
            str(log_dir / "beat-schedule"),
            "--loglevel",
            "WARNING",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _beating_steadily(proc: subprocess.Popen, seconds: float) -> bool:
    """Whether the worker process has beaten for ``seconds`` (its first task, from the
    beat, starts its heartbeat)."""
    from checkpoints.models import WorkerHeartbeat

    row = WorkerHeartbeat.objects.filter(pid=proc.pid).values_list("started_at", flat=True)
    started = row.first()
    return started is not None and time.time() - started.timestamp() >= seconds


def takeover_case(tenant, logs: Path | None = None) -> list[Measurement]:  # noqa: ANN001
    """Kill to next step with the product as shipped: the default lease (60 s), worker
    heartbeats and the beat's schedule; nothing here calls the rescue. A worker is SIGKILLed
    in step 3 of a run; the time is until another worker has committed that step again."""
    from django.conf import settings

    import bench.noop_workflow  # noqa: F401 - declares the workflows in this process too
    from checkpoints.models import Checkpoint
    from runtime.registry import workflows_sync
    from runtime.services.runs import run_create
    from tenants.services import Actor

    settings.CAIRN_DISPATCH_ON_COMMIT = True
    settings.CELERY_BROKER_URL = REDIS_URL
    from cairn.celery import app

    app.conf.broker_url = REDIS_URL
    workflows_sync()
    _purge()
    logs = logs or Path(tempfile.mkdtemp(prefix="cairn-bench-takeover-"))
    hold = logs / "hold"
    os.environ["BENCH_HOLD_FILE"] = str(hold)
    steady = settings.CAIRN_WORKER_DEAD_SECONDS  # the rescue trusts a steady heartbeat only
    beat = _beat(logs)
    workers = [_worker(f"shipped{i}", logs, lease_seconds=None) for i in range(2)]
    takeovers = []
    try:
        for attempt in range(2 if QUICK else 7):
            alive = list(workers)
            if not _wait(
                lambda alive=alive: all(_beating_steadily(w, steady + 1) for w in alive), 120
            ):
                raise RuntimeError("the workers never beat steadily")
            hold.write_text("hold")
            run = run_create(
                tenant=tenant,
                workflow_type="bench_hold",
                execution="worker",
                actor=Actor.system("bench"),
            )
            if not _wait(lambda: Path(str(hold) + ".entered").exists(), 60):
                raise RuntimeError("no worker reached step 3")
            owner = int(Path(str(hold) + ".entered").read_text())
            Path(str(hold) + ".entered").unlink()
            doomed = next(w for w in workers if w.pid == owner)
            os.killpg(doomed.pid, signal.SIGKILL)
            killed = time.perf_counter()
            hold.unlink()  # the step may now finish when it runs again
            doomed.wait(timeout=30)
            if not _wait(
                lambda run=run: Checkpoint.objects.filter(run_id=run.pk, state="step4").exists(),
                120,
            ):
                raise RuntimeError("no worker took the run over")
            takeovers.append((time.perf_counter() - killed) * 1000)
            print(f"  take-over {attempt + 1}: {takeovers[-1]:.0f} ms", flush=True)
            workers = [w for w in workers if w is not doomed]
            workers.append(_worker(f"shipped-next{attempt}", logs, lease_seconds=None))
    finally:
        for proc in (*workers, beat):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    return [
        Measurement(
            "steps",
            "cairn",
            "kill to next step (shipped: lease 60 s, beat)",
            samples=takeovers,
            note="as shipped: the default lease, heartbeats every second, a worker silent for "
            f"{steady:g} s is dead and the beat's rescue (every second) re-queues its runs; "
            "nothing calls the rescue by hand",
        )
    ]


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
