"""What a traced worker exports for a run, and nothing besides: the spans `make bench`'s
tracing case pays for (docs/performance.md, "What tracing costs").

A real worker exports over OTLP/HTTP to a real receiver on loopback. A six-step run of
steps that do nothing is one task span and six step spans, all in the run's trace; the
worker's heartbeat (a protocol statement every second, as the lease's renewals are) opens
no trace of its own."""

from __future__ import annotations

import pytest

from checkpoints.models import Run, RunStatus, WorkerHeartbeat
from runtime.services.runs import run_create
from telemetry.otlp_receiver import OtlpReceiver
from tenants.services import Actor
from tests.runtime_workflows import NOOP_STEPS
from tests.worker_fixtures import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

SERVICE = "cairn-cost-test"


def test_a_traced_six_step_run_is_seven_spans_and_heartbeats_trace_nothing(
    acme, broker, worker_factory
):
    with OtlpReceiver() as receiver:
        worker_factory(
            "traced",
            env={
                "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                "OTEL_SERVICE_NAME": SERVICE,
                "OTEL_BSP_SCHEDULE_DELAY": "50",
                "CAIRN_WORKER_HEARTBEAT_SECONDS": "0.2",
                "CAIRN_LOG_LEVEL": "WARNING",
            },
        )
        run = run_create(
            tenant=acme, workflow_type="noop_six", execution="worker", actor=Actor.system("t")
        )
        wait_for(
            lambda: Run.objects.filter(pk=run.pk, status=RunStatus.SUCCEEDED).exists(),
            what="the six-step run to succeed",
            timeout=60,
        )
        beat = WorkerHeartbeat.objects.get()
        # Several beats after the run, each one a statement the worker made outside any span.
        wait_for(
            lambda: (
                WorkerHeartbeat.objects.filter(
                    pk=beat.pk, last_seen_at__gt=beat.last_seen_at
                ).count()
                and len(_worker_spans(receiver)) >= 7
            ),
            what="a later heartbeat and the run's spans exported",
        )
        first = WorkerHeartbeat.objects.get().last_seen_at
        wait_for(
            lambda: WorkerHeartbeat.objects.get().last_seen_at > first,
            what="one more heartbeat",
        )
        spans = _worker_spans(receiver)

    names = sorted(span["name"] for span in spans)
    assert names == sorted(
        ["run/checkpoints.run_advance", *(f"cairn.step {step}" for step in NOOP_STEPS)]
    ), names
    assert {span["trace_id"] for span in spans} == {run.trace_context.split("-")[1]}
    # No statement span at all: the steps make no queries of their own, and the protocol's
    # (the lease, the restore, the heartbeat) are not traced one by one.
    assert not [s for s in spans if "db.statement" in s["attributes"]]


def _worker_spans(receiver: OtlpReceiver) -> list[dict]:
    return [s for s in receiver.spans() if s["resource"].get("service.name") == SERVICE]
