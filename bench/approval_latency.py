"""Decision to next step: from a reviewer's approve to the worker starting the step after
the approval state (issue 27, item 6).

Run by bench/run.py (case ``approval``) once per set-up, each in a process of its own, so
each configures Cairn from its environment as a deployment would:

    python bench/approval_latency.py embedded   # SQLite, filesystem broker, a fresh CAIRN_HOME
    python bench/approval_latency.py postgres   # DATABASE_URL and CELERY_BROKER_URL as given

It starts one worker and no beat: nothing sweeps, so a decision whose command depended on a
sweep would never be carried out, and the round would time out. Each round starts a run of
``bench_approval`` (bench/noop_workflow.py), waits for its approval request, approves it
through ``approval_decide`` (what the review page and the API call), and reads when the step
after the approval state started (the step writes ``time.time()`` first thing). Prints one
JSON line: ``{"setup", "samples_ms", "note"}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = int(os.environ.get("BENCH_APPROVAL_ROUNDS", "30"))


def _environment(setup: str, home: Path, started: Path) -> dict[str, str]:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "cairn.settings",
        "CAIRN_HOME": str(home),
        "CAIRN_WORKFLOW_MODULES": "bench.noop_workflow",
        "CAIRN_DISPATCH_ON_COMMIT": "1",
        "CAIRN_LOG_LEVEL": "WARNING",
        "BENCH_STARTED_DIR": str(started),
        "PYTHONPATH": str(ROOT),
    }
    if setup == "embedded":
        for name in ("DATABASE_URL", "CELERY_BROKER_URL", "CAIRN_ENCRYPTION_KEYS"):
            env.pop(name, None)
    elif not env.get("DATABASE_URL") or not env.get("CELERY_BROKER_URL"):
        raise SystemExit("postgres: set DATABASE_URL and CELERY_BROKER_URL")
    return env


def _worker(env: dict[str, str], log: Path) -> subprocess.Popen:
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
            f"approval-{os.getpid()}@bench",
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=ROOT,
        env=env,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _wait(predicate, timeout: float, what: str):  # noqa: ANN001, ANN202
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.002)
    raise RuntimeError(f"timed out waiting for {what}")


def main(setup: str) -> int:
    scratch = Path(tempfile.mkdtemp(prefix=f"cairn-bench-approval-{setup}-"))
    started = scratch / "started"
    started.mkdir()
    env = _environment(setup, scratch / "home", started)
    os.environ.clear()
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from approvals.models import ApprovalRequest, ApprovalStatus
    from approvals.services import approval_decide
    from checkpoints.models import Run, RunStatus
    from runtime.registry import workflows_sync
    from runtime.services.runs import run_create
    from tenants.models import Tenant
    from tenants.services import Actor, member_set_role

    workflows_sync()
    tenant, _ = Tenant.objects.get_or_create(slug="bench-approval", defaults={"name": "Bench"})
    from django.contrib.auth import get_user_model

    rita, _ = get_user_model().objects.get_or_create(username="rita")
    member_set_role(tenant=tenant, user=rita, role="reviewer", actor=Actor.system("bench"))
    worker = _worker(env, scratch / "worker.log")
    samples: list[float] = []
    try:
        for index in range(ROUNDS + 2):  # two to warm the worker up, not counted
            run = run_create(
                tenant=tenant,
                workflow_type="bench_approval",
                execution="worker",
                actor=Actor.system("bench"),
            )
            request = _wait(
                lambda run=run: ApprovalRequest.objects.filter(
                    run=run, status=ApprovalStatus.PENDING
                ).first(),
                120,
                "the run to ask for approval",
            )
            # The worker is idle again: it let the run go when it reached the approval state.
            _wait(
                lambda run=run: Run.objects.filter(pk=run.pk, lease_owner="").exists(),
                60,
                "the worker to release the run",
            )
            decided = time.time()
            approval_decide(
                tenant=tenant,
                request_id=request.pk,
                decision="approve",
                artifact_sha256=request.artifact_sha256,
                actor=Actor(user=rita),
            )
            note = started / str(run.pk)
            _wait(note.exists, 30, "the step after the approval to start")
            if index >= 2:
                samples.append((float(note.read_text()) - decided) * 1000)
            _wait(
                lambda run=run: Run.objects.filter(pk=run.pk, status=RunStatus.SUCCEEDED).exists(),
                60,
                "the run to finish",
            )
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    from django.conf import settings

    print(
        json.dumps(
            {
                "setup": setup,
                "samples_ms": samples,
                "note": f"{settings.DATABASES['default']['ENGINE'].rsplit('.', 1)[-1]}, "
                f"broker {settings.CELERY_BROKER_URL.split(':', 1)[0]}, one solo worker, "
                "no beat",
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1] if len(sys.argv) > 1 else "embedded"))
