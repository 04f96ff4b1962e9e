"""Console benchmark (not a test): server time of the runs list and the run page with a
hundred thousand runs of ten checkpoints each, on PostgreSQL.

    .venv/bin/python bench/console_bench.py [--runs 100000] [--checkpoints 10] [--rounds 30]

Seeds a scratch database (``cairn_console_bench`` on BENCH_PG_SERVER, recreated each time)
with INSERT … SELECT generate_series, so a million checkpoints take seconds, not an hour.
The bulk rows carry placeholder ciphertext; the runs whose pages are timed are made through
the real services (run_create + checkpoint_commit, ten checkpoints) so their envelopes
decrypt and their reads are audited as in production. Time is measured in-process with
Django's test client around the whole request (middleware, queries, templates), and the
median is reported; the target is under 150 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, recreate_database, setup_django  # noqa: E402

DB_NAME = os.environ.get("CONSOLE_BENCH_DB", "cairn_console_bench")
TARGET_MS = 150.0

STATUSES = [
    ("running", 40),
    ("waiting_approval", 8),
    ("waiting_retry", 4),
    ("reconciling", 2),
    ("paused_for_review", 1),
    ("succeeded", 35),
    ("failed", 6),
    ("cancelled", 4),
]
STATES = ["collect_sources", "draft_answer", "review", "publish", "done", "rejected"]


def status_case_sql() -> str:
    """A CASE over (n % 100) that spreads the statuses by the weights above."""
    parts, upper = [], 0
    for status, weight in STATUSES:
        upper += weight
        parts.append(f"WHEN n %% 100 < {upper} THEN '{status}'")
    return "CASE " + " ".join(parts) + " END"


def seed_bulk(tenant, workflow, runs: int, checkpoints: int) -> None:  # noqa: ANN001
    from django.db import connection

    from checkpoints.models import Checkpoint, ExternalOperation, Run

    run_t, cp_t, op_t = (
        Run._meta.db_table,
        Checkpoint._meta.db_table,
        ExternalOperation._meta.db_table,
    )
    states = "ARRAY[" + ",".join(f"'{s}'" for s in STATES) + "]"
    with connection.cursor() as cur:
        started = time.perf_counter()
        cur.execute(
            f"""
            INSERT INTO {run_t} (id, tenant_id, workflow_id, workflow_type, workflow_version,
                execution, objective_ref, state, step, status, status_reason, version,
                checkpoint_sequence, latest_checkpoint_sha256, lease_owner, restore_count,
                budget_limits, budget_used, legal_hold, trace_context, paused, pause_reason,
                created_at, updated_at)
            SELECT gen_random_uuid(), %s, %s, 'research', '1', 'external',
                'ticket-' || n, ({states})[1 + n %% 6], 'step', {status_case_sql()}, '', %s,
                %s, md5(n::text) || md5((n + 1)::text), '', (n %% 13)::int,
                '{{"max_attempts": 10, "max_tokens": 100000}}'::jsonb,
                '{{"attempts_used": 3, "tokens_used": 4200}}'::jsonb, false, '',
                n %% 500 = 0, CASE WHEN n %% 500 = 0 THEN 'bench: held' ELSE '' END,
                now() - (n || ' seconds')::interval, now() - ((n / 2) || ' seconds')::interval
            FROM generate_series(1, %s) AS n
            """,
            [tenant.pk, workflow.pk, checkpoints + 1, checkpoints, runs],
        )
        print(f"  {runs} runs in {time.perf_counter() - started:.1f} s", flush=True)
        started = time.perf_counter()
        cur.execute(
            f"""
            INSERT INTO {cp_t} (id, tenant_id, run_id, sequence, state, step, schema_version,
                envelope_sealed, key_id, sha256, parent_sha256, actor, is_evidence, created_at)
            SELECT gen_random_uuid(), r.tenant_id, r.id, s, r.state, 'step', 2,
                'bulk-placeholder', 'bench', md5(r.id::text || s) || md5(s || r.id::text),
                '', 'bench-worker', s = 1, r.created_at + (s || ' seconds')::interval
            FROM {run_t} r CROSS JOIN generate_series(1, %s) AS s
            WHERE r.tenant_id = %s
            """,
            [checkpoints, tenant.pk],
        )
        print(f"  {runs * checkpoints} checkpoints in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        cur.execute(
            f"""
            UPDATE {run_t} r SET latest_checkpoint_id = c.id, latest_checkpoint_at = c.created_at
            FROM {cp_t} c WHERE c.run_id = r.id AND c.sequence = r.checkpoint_sequence
            """
        )
        # One run in fifty has a side effect pending for an hour (stalled).
        cur.execute(
            f"""
            INSERT INTO {op_t} (id, tenant_id, run_id, step, idempotency_key, action, target,
                request_fingerprint, provider, request_sealed, client_reference, status,
                provider_operation_id, provider_job_id, result_sealed, reason, attempts,
                created_at, updated_at)
            SELECT gen_random_uuid(), r.tenant_id, r.id, 'publish', 'bench-' || r.id, 'publish',
                't', 'f', 'blog', '', '', 'pending', '', '', '', '', 1,
                now() - interval '1 hour', now() - interval '1 hour'
            FROM {run_t} r WHERE r.tenant_id = %s AND r.restore_count = 7
                AND r.status IN ('running', 'reconciling')
            """,
            [tenant.pk],
        )
        print(f"  heads and operations in {time.perf_counter() - started:.1f} s")
        # What autovacuum would have done on a live system: statistics and a visibility map
        # (index-only scans for the counts).
        for table in (run_t, cp_t, op_t):
            cur.execute(f"VACUUM ANALYZE {table}")


def seed_real_runs(tenant, user, count: int, checkpoints: int) -> list:  # noqa: ANN001
    """Runs made through the services, with evidence, whose pages are timed."""
    from django.utils import timezone

    from checkpoints.services.artifacts import artifact_store
    from checkpoints.services.checkpoints import CommitRequest, StepAttempt, checkpoint_commit
    from runtime.services.runs import run_create
    from tenants.services import Actor

    actor = Actor(user=user)
    made = []
    for index in range(count):
        run = run_create(
            tenant=tenant,
            workflow_type="research",
            inputs={"question": f"q{index}"},
            objective_ref=f"real-{index}",
            budget={"max_attempts": 20, "max_tokens": 100000},
            execution="external",
            actor=actor,
        )
        draft, _ = artifact_store(
            tenant=tenant, data=f"draft {index}".encode(), media_type="text/plain", kind="draft"
        )
        state, version = "collect_sources", 1
        for sequence in range(2, checkpoints + 1):
            state = "draft_answer" if sequence < checkpoints else "review"
            checkpoint_commit(
                tenant=tenant,
                run_id=run.pk,
                request=CommitRequest(
                    expected_version=version,
                    state=state,
                    step=f"step-{sequence}",
                    envelope={
                        "evidence": {
                            "artifacts": [{"id": str(draft.pk), "sha256": draft.sha256}],
                            "validators": [{"name": "ok", "passed": True}],
                        },
                        "budgets": {"attempts_used": sequence, "tokens_used": 100 * sequence},
                    },
                    actor=actor,
                    # Step history, as a worker's step records it (the timeline shows it).
                    attempt=StepAttempt(
                        number=sequence,
                        step=f"step-{sequence}",
                        worker="bench-worker",
                        started_at=timezone.now(),
                        duration_ms=40 + sequence,
                        outcome="committed",
                        model_calls=(
                            {
                                "model": "bench-model",
                                "provider": "bench",
                                "input_tokens": 60,
                                "output_tokens": 40,
                                "cost": 0.0002,
                                "prompt": {"id": str(draft.pk), "sha256": draft.sha256},
                                "response": {"id": str(draft.pk), "sha256": draft.sha256},
                            },
                        ),
                    ),
                ),
            )
            version += 1
        made.append(run)
    return made


def median_ms(client, url: str, rounds: int, **params) -> tuple[float, float, int]:  # noqa: ANN001, ANN003
    """Median wall time and median CPU time of this process (Python only, no database)."""
    response = client.get(url, params)  # warm-up: connection, template loading
    assert response.status_code == 200, (url, response.status_code, response.content[-2000:])
    wall, cpu = [], []
    for _ in range(rounds):
        started, started_cpu = time.perf_counter(), time.process_time()
        response = client.get(url, params)
        wall.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
        assert response.status_code == 200
    return statistics.median(wall), statistics.median(cpu), len(response.content)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--checkpoints", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--real-runs", type=int, default=5)
    parser.add_argument(
        "--reuse", action="store_true", help="measure the database seeded by the last run"
    )
    args = parser.parse_args()

    if not args.reuse:
        recreate_database(DB_NAME)
    setup_django(
        DB_NAME,
        home=ROOT / "var" / "console-bench",
        DJANGO_DEBUG="false",
        DJANGO_ALLOWED_HOSTS="testserver",
        CELERY_BROKER_URL="memory://",
    )
    from django.core.management import call_command
    from django.test import Client
    from django.urls import reverse

    # Production settings serve static files from the manifest: build it, as a deploy does.
    call_command("collectstatic", interactive=False, verbosity=0)

    from checkpoints.models import Run
    from checkpoints.services.workflows import workflow_register
    from tenants.services import Actor, member_set_role
    from tests.factories import SIMPLE_DEFINITION, TenantFactory, UserFactory

    if args.reuse:
        tenant = TenantFactory(slug="bench")
        user = UserFactory(username="operator")
        real = list(Run.objects.filter(tenant=tenant, objective_ref__startswith="real-"))
        args.runs = Run.objects.filter(tenant=tenant).count() - len(real)
    else:
        call_command("migrate", verbosity=0)
        tenant = TenantFactory(slug="bench")
        user = UserFactory(username="operator")
        member_set_role(tenant=tenant, user=user, role="operator", actor=Actor.system("bench"))
        workflow, _ = workflow_register(
            tenant=tenant, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
        )
        print(f"Seeding {args.runs} runs × {args.checkpoints} checkpoints on {DB_NAME}…")
        seed_bulk(tenant, workflow, args.runs, args.checkpoints)
        real = seed_real_runs(tenant, user, args.real_runs, args.checkpoints)

    client = Client()
    client.force_login(user)
    runs_url = reverse("console:runs")
    cases = [
        ("runs list, first page", runs_url, {}),
        (
            "runs list, filtered (status + workflow, by updated)",
            runs_url,
            {"status": "waiting_approval", "workflow_type": "research", "sort": "-updated"},
        ),
        (
            "runs list, filtered (restored > 10, stalled ops)",
            runs_url,
            {"restored_more_than": 5, "stalled": "on"},
        ),
        ("runs list, search objective", runs_url, {"q": "ticket-4242"}),
        ("status counts (htmx fragment), unfiltered", reverse("console:run_counts"), {}),
        (
            "status counts (htmx fragment), workflow filter",
            reverse("console:run_counts"),
            {"workflow_type": "research", "status": "running"},
        ),
        ("rows refresh (htmx poll, 50 rows)", reverse("console:run_rows"), {"ids": None}),
        ("run detail (10 checkpoints)", reverse("console:run_detail", args=[real[0].pk]), {}),
        (
            "run snapshot poll, run moved (every card)",
            reverse("console:run_snapshot", args=[real[0].pk]),
            {"seen": 1},
        ),
        (
            "bulk action page, selection by filter",
            reverse("console:bulk_new"),
            {"q": "ticket-424"},
        ),
        ("health", reverse("console:health"), {}),
        (
            "checkpoint detail (diff + chain check)",
            reverse("console:checkpoint_detail", args=[real[0].pk, args.checkpoints]),
            {},
        ),
    ]
    # A deep page: follow the next cursor a few times, then time that page.
    from console.selectors import keyset_page, runs_matching, with_row_facts

    page = None
    for _ in range(20):
        page = keyset_page(
            with_row_facts(runs_matching(tenant, {}), tenant),
            sort="-created",
            cursor=page.next_cursor if page else None,
            size=50,
        )
    cases.insert(1, ("runs list, page 21 (keyset)", runs_url, {"cursor": page.next_cursor}))
    for _, _, params in cases:
        if params.get("ids", 0) is None:
            params["ids"] = ",".join(str(run.pk) for run in page.rows)

    print(f"\nMedian server time over {args.rounds} requests (target < {TARGET_MS:.0f} ms):")
    print(f"load average before measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    worst = 0.0
    for name, url, params in cases:
        ms, cpu, size = median_ms(client, url, args.rounds, **params)
        worst = max(worst, ms)
        flag = "ok" if ms < TARGET_MS else "OVER"
        print(f"  {name:<52} {ms:7.1f} ms (python {cpu:5.1f} ms) {size / 1024:4.0f} KiB  {flag}")
    print(f"\nworst median {worst:.1f} ms; scale {args.runs} runs × {args.checkpoints} checkpoints")
    print(f"load average while measuring: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
