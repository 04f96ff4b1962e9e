"""Retention benchmark (not a test): the job over a million checkpoints on PostgreSQL.

    .venv/bin/python bench/retention_bench.py [--runs 10000] [--per-run 100] [--committers 4]

Seeds a scratch database (``cairn_retention_bench`` on BENCH_PG_SERVER, recreated each
time) with ``--runs`` finished runs of ``--per-run`` checkpoints each, ended 60 days ago,
under a policy that keeps intermediate checkpoints 30 days: the job removes all but the
genesis, one evidence checkpoint and the final one of each. The bulk rows are written with
INSERT … SELECT generate_series and carry placeholder ciphertext of a realistic size (the
job never decrypts); a few finished runs made through the real services check that
``run_verify`` still passes afterwards.

While ``manage.py apply_retention`` runs in a subprocess, ``--committers`` threads keep
committing checkpoints to their own active runs through ``checkpoint_commit``. Reported:

- rows deleted per second (checkpoints removed / wall time of the job);
- the longest commit of an active run while the job ran, next to the same figure measured
  just before without the job (the difference is what the job cost a committer);
- how often a committer's backend was seen blocked by the job's backend
  (``pg_blocking_pids``, sampled every 20 ms): the job never locks an active run, so 0;
- how long the console's preview of the policy takes over the whole store.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, recreate_database, setup_django  # noqa: E402

DB_NAME = os.environ.get("RETENTION_BENCH_DB", "cairn_retention_bench")
JOB_APP = "cairn-retention-bench-job"
ENVELOPE_BYTES = 1400  # a small real envelope, sealed and base64-encoded


def seed_bulk(tenant, workflow, runs: int, per_run: int) -> None:  # noqa: ANN001
    from django.db import connection

    from checkpoints.models import Checkpoint, Run

    run_t, cp_t = Run._meta.db_table, Checkpoint._meta.db_table
    sha = "md5(r.id::text || {s}) || md5({s} || r.id::text)"
    with connection.cursor() as cur:
        started = time.perf_counter()
        cur.execute(
            f"""
            INSERT INTO {run_t} (id, tenant_id, workflow_id, workflow_type, workflow_version,
                execution, objective_ref, state, step, status, status_reason, version,
                checkpoint_sequence, latest_checkpoint_sha256, lease_owner, restore_count,
                budget_limits, budget_used, legal_hold, created_at, updated_at)
            SELECT gen_random_uuid(), %s, %s, 'research', '1', 'external', 'bulk-' || n,
                'done', 'step', (ARRAY['succeeded', 'failed', 'cancelled'])[1 + n %% 3], '',
                %s, %s, '', '', 0, '{{}}'::jsonb, '{{}}'::jsonb, false,
                now() - interval '61 days', now() - interval '60 days'
            FROM generate_series(1, %s) AS n
            """,
            [tenant.pk, workflow.pk, per_run + 1, per_run, runs],
        )
        cur.execute(
            f"""
            INSERT INTO {cp_t} (id, tenant_id, run_id, sequence, state, step, schema_version,
                envelope_sealed, key_id, sha256, parent_sha256, actor, is_evidence, created_at)
            SELECT gen_random_uuid(), r.tenant_id, r.id, s, 'collect_sources', 'step', 2,
                repeat('x', %s), 'bench', {sha.format(s="s")},
                CASE WHEN s = 1 THEN '' ELSE {sha.format(s="(s - 1)")} END,
                'bench', s = 1 OR s = %s, r.created_at + (s || ' seconds')::interval
            FROM {run_t} r CROSS JOIN generate_series(1, %s) AS s
            WHERE r.tenant_id = %s
            """,
            [ENVELOPE_BYTES, per_run // 2, per_run, tenant.pk],
        )
        cur.execute(
            f"""
            UPDATE {run_t} r SET latest_checkpoint_id = c.id, latest_checkpoint_sha256 = c.sha256
            FROM {cp_t} c WHERE c.run_id = r.id AND c.sequence = r.checkpoint_sequence
            """
        )
        for table in (run_t, cp_t):
            cur.execute(f"VACUUM ANALYZE {table}")
    print(f"  {runs} runs, {runs * per_run} checkpoints in {time.perf_counter() - started:.0f} s")


def real_runs(tenant, user, *, count: int, length: int, finished: bool) -> list:  # noqa: ANN001
    from datetime import timedelta

    from django.utils import timezone

    from checkpoints.models import Run
    from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
    from runtime.services.runs import run_create
    from tenants.services import Actor

    actor = Actor(user=user)
    made = []
    for index in range(count):
        run = run_create(
            tenant=tenant,
            workflow_type="research",
            inputs={"n": index},
            execution="external",
            actor=actor,
        )
        for sequence in range(2, length + 1):
            last = finished and sequence == length
            checkpoint_commit(
                tenant=tenant,
                run_id=run.pk,
                request=CommitRequest(
                    expected_version=sequence - 1,
                    state="collect_sources",
                    step=f"s{sequence}",
                    envelope={},
                    actor=actor,
                    status="succeeded" if last else None,
                ),
            )
        if finished:
            Run.objects.filter(pk=run.pk).update(updated_at=timezone.now() - timedelta(days=60))
        made.append(Run.objects.get(pk=run.pk))
    return made


class Committers:
    """Threads committing to their own active run until stopped; durations in seconds."""

    def __init__(self, tenant, user, runs: list) -> None:  # noqa: ANN001
        self.tenant, self.user, self.runs = tenant, user, runs
        self.stop = threading.Event()
        self.durations: list[list[float]] = [[] for _ in runs]
        self.pids: list[int] = []
        self.lock = threading.Lock()

    def _loop(self, index: int) -> None:
        from django.db import connection

        from checkpoints.models import Run
        from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
        from tenants.services import Actor

        with connection.cursor() as cur:
            cur.execute("SELECT pg_backend_pid()")
            with self.lock:
                self.pids.append(cur.fetchone()[0])
        run = self.runs[index]
        version = Run.objects.get(pk=run.pk).version
        actor = Actor(user=self.user)
        while not self.stop.is_set():
            started = time.perf_counter()
            checkpoint_commit(
                tenant=self.tenant,
                run_id=run.pk,
                request=CommitRequest(
                    expected_version=version,
                    state="collect_sources",
                    step="tick",
                    envelope={},
                    actor=actor,
                ),
            )
            self.durations[index].append(time.perf_counter() - started)
            version += 1
        connection.close()

    def run_while(self, work) -> list[float]:  # noqa: ANN001
        threads = [threading.Thread(target=self._loop, args=(i,)) for i in range(len(self.runs))]
        for thread in threads:
            thread.start()
        try:
            work()
        finally:
            self.stop.set()
            for thread in threads:
                thread.join()
        return [d for per_run in self.durations for d in per_run]


def blocked_by_job(pids: list[int]) -> int:
    """Committer backends currently waiting on a lock the job's backend holds."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            """
            SELECT count(*) FROM pg_stat_activity w, pg_stat_activity j
            WHERE w.pid = ANY(%s) AND j.application_name = %s
              AND j.pid = ANY(pg_blocking_pids(w.pid))
            """,
            [pids, JOB_APP],
        )
        return cur.fetchone()[0]


def summary(durations: list[float]) -> dict[str, float]:
    ordered = sorted(durations)
    return {
        "commits": len(ordered),
        "median_ms": round(statistics.median(ordered) * 1000, 2) if ordered else 0,
        "p99_ms": round(ordered[int(len(ordered) * 0.99) - 1] * 1000, 2) if ordered else 0,
        "max_ms": round(ordered[-1] * 1000, 2) if ordered else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--per-run", type=int, default=100)
    parser.add_argument("--committers", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=500)
    parser.add_argument("--baseline-seconds", type=float, default=20.0)
    args = parser.parse_args()

    print(f"Recreating {DB_NAME} and migrating…", flush=True)
    recreate_database(DB_NAME)
    setup_django(DB_NAME, home=ROOT / "var" / "retention-bench", CELERY_BROKER_URL="memory://")
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from django.contrib.auth import get_user_model

    from checkpoints.models import Checkpoint
    from checkpoints.services.integrity import run_verify
    from checkpoints.services.workflows import workflow_register
    from retention.policies import PolicyInput, retention_policy_save
    from tenants.services import Actor, tenant_create
    from tests.factories import SIMPLE_DEFINITION

    tenant, _ = tenant_create(slug="bench", owner_username="bench-admin")
    user = get_user_model().objects.get(username="bench-admin")
    workflow, _ = workflow_register(
        tenant=tenant, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
    )
    print("Seeding…", flush=True)
    seed_bulk(tenant, workflow, args.runs, args.per_run)
    checked = real_runs(tenant, user, count=10, length=12, finished=True)
    active = real_runs(tenant, user, count=args.committers, length=2, finished=False)
    retention_policy_save(
        tenant=tenant, data=PolicyInput(intermediate_days=30), actor=Actor.system("bench")
    )
    print(f"Baseline: {args.committers} committers, {args.baseline_seconds:.0f} s…", flush=True)
    baseline = Committers(tenant, user, active).run_while(lambda: time.sleep(args.baseline_seconds))

    from retention.models import RetentionPolicy
    from retention.services import retention_preview

    started = time.perf_counter()
    preview = retention_preview(RetentionPolicy.objects.get(tenant=tenant))
    preview_seconds = time.perf_counter() - started
    before = Checkpoint.objects.count()
    print("Retention job with committers…", flush=True)
    env = {**os.environ, "PGAPPNAME": JOB_APP, "DJANGO_SETTINGS_MODULE": "cairn.settings"}
    committers = Committers(tenant, user, active)
    job_report: dict[str, object] = {}
    blocked_samples = []

    def job() -> None:
        # The job's progress goes to a file: a pipe nobody reads would fill up and stall it.
        output = ROOT / "var" / "retention-bench-job.log"
        output.parent.mkdir(exist_ok=True)
        started = time.perf_counter()
        with output.open("w") as sink:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "manage.py",
                    "apply_retention",
                    "--batch-size",
                    str(args.batch_size),
                ],
                cwd=ROOT,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                text=True,
            )
            while process.poll() is None:
                if committers.pids:
                    blocked_samples.append(blocked_by_job(committers.pids))
                time.sleep(0.02)
        job_report["seconds"] = time.perf_counter() - started
        job_report["returncode"] = process.returncode
        lines = output.read_text().strip().splitlines()
        job_report["summary"] = next(
            (line for line in reversed(lines) if line.startswith("Retention")), lines[-1:]
        )

    during = committers.run_while(job)
    after = Checkpoint.objects.count()
    deleted = before + sum(len(d) for d in committers.durations) - after
    verified = all(run_verify(tenant=tenant, run_id=run.pk)["ok"] for run in checked)
    result = {
        "checkpoints_before": before,
        "checkpoints_deleted": deleted,
        "job_seconds": round(job_report["seconds"], 1),
        "rows_deleted_per_second": round(deleted / job_report["seconds"]),
        "job_returncode": job_report["returncode"],
        "job_summary": job_report["summary"],
        "commits_without_job": summary(baseline),
        "commits_during_job": summary(during),
        "committer_seen_blocked_by_job": sum(blocked_samples),
        "blocked_samples_taken": len(blocked_samples),
        "verify_ok_after_compaction": verified,
        "preview_seconds": round(preview_seconds, 2),
        "preview_checkpoints": preview.checkpoints,
        "batch_size": args.batch_size,
        "committers": args.committers,
    }
    print(json.dumps(result, indent=2))
    out = ROOT / "bench" / "results" / "retention.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
