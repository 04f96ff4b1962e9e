"""Case 7: decision to next step. The time from a reviewer's approve to the worker starting
the step after the approval state, p50 and p99, on the embedded default (SQLite, the
filesystem broker) and on PostgreSQL with Redis; each set-up in a process of its own
(bench/approval_latency.py), one worker, no beat."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.common import BENCH_DB, QUICK, REDIS_URL, ROOT, Measurement, db_url, recreate_database

# Set by the bench for its own process (production mode, its database, its key): the
# embedded set-up starts from what a fresh checkout has instead.
BENCH_ONLY = (
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "CAIRN_ENCRYPTION_KEYS",
    "CAIRN_ENV",
    "DJANGO_DEBUG",
    "DJANGO_SECRET_KEY",
    "DJANGO_SECURE_SSL_REDIRECT",
    "CAIRN_HOME",
)


def _run(setup: str, environment: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "approval_latency.py"), setup],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if done.returncode != 0:
        raise RuntimeError(f"approval latency ({setup}) failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def approval_case() -> list[Measurement]:
    rounds = "10" if QUICK else "50"
    database = BENCH_DB + "_approval"
    recreate_database(database)
    embedded = {k: v for k, v in os.environ.items() if k not in BENCH_ONLY}
    postgres = {
        **os.environ,
        "DATABASE_URL": db_url(database),
        "CELERY_BROKER_URL": REDIS_URL,
    }
    results = []
    for setup, environment, label in (
        ("embedded", embedded, "embedded default (SQLite, filesystem broker)"),
        ("postgres", postgres, "PostgreSQL and Redis"),
    ):
        environment = {**environment, "BENCH_APPROVAL_ROUNDS": rounds}
        answer = _run(setup, environment)
        measurement = Measurement(
            "approval", "cairn", f"approve → next step, {label}", samples=answer["samples_ms"]
        )
        measurement.note = (
            f"{label}: p50 {measurement.median:.0f} ms, p99 {measurement.p99:.0f} ms over "
            f"{len(answer['samples_ms'])} approvals; {answer['note']}"
        )
        print(f"  {measurement.note}", flush=True)
        results.append(measurement)
    return results
