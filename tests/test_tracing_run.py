"""Every run a trace, end to end on real processes: a runner starts the demo workflow over
HTTP (gunicorn) inside its own trace, a real Celery worker is SIGKILLed in the middle of a
step, a second worker takes the run over, a reviewer approves the draft, the second worker
publishes it; every process exports over OTLP/HTTP to a real receiver on loopback, which
decodes what it gets with opentelemetry-proto.

The trace is the runner's, from the run's start to its publication: steps of both workers,
model calls with their tokens, the publish effect with the provider's id, the restore that
followed the crash, the approval wait; and no span, attribute or event holds the text the
run was given, nor the bearer token it was started with."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from approvals.models import ApprovalRequest, ApprovalStatus
from checkpoints.models import ExternalOperation, Run, RunStatus
from runtime.rescue import runs_rescue
from telemetry.otlp_receiver import OtlpReceiver
from tenants.services import Actor, token_issue
from tests.approvals_support import decide
from tests.runtime_workflows import GATED_STEPS
from tests.web_server import web_server  # noqa: F401
from tests.worker_fixtures import TEST_WORKFLOW_MODULES, wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# In the run's inputs, hence in its prompts, its draft and the request the effect publishes.
MARKER = "PLAINTEXT-MARKER-4c1d"
RUNNER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
RUNNER_SPAN = "00f067aa0ba902b7"


def tracing_env(receiver: OtlpReceiver) -> dict[str, str]:
    """The standard OTEL_* variables, and nothing else, turn tracing on."""
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_SERVICE_NAME": "cairn-test",
        # Export within 50 ms of a span's end, so a worker about to be killed has shipped
        # the steps it finished (a real deployment loses up to OTEL_BSP_SCHEDULE_DELAY).
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }


def post(url: str, body: dict, headers: dict[str, str]) -> tuple[int, dict, dict]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - loopback
        return answer.status, dict(answer.headers), json.loads(answer.read())


def exported_before_the_kill(spans: list[dict], finished: list[str]) -> bool:
    """The steps the first worker finished are exported, and so is the model call the doomed
    step made before it blocked: a chat span whose parent (that step's own span, which never
    ends) is not among them."""
    known = {s["span_id"] for s in spans}
    steps = {s["attributes"].get("cairn.step.name") for s in spans}
    orphans = [s for s in spans_named(spans, "chat ") if s["parent_span_id"] not in known]
    return steps >= set(finished) and len(orphans) == 1


def spans_named(spans: list[dict], prefix: str) -> list[dict]:
    return [span for span in spans if span["name"].startswith(prefix)]


def test_a_run_killed_mid_step_and_finished_by_a_second_worker_is_one_trace(
    acme,
    bob,
    carol,
    broker,
    worker_factory,
    web_server,  # noqa: F811
    publishing_service,
    tmp_path: Path,
):
    gate = tmp_path / "gate"
    gate.mkdir()
    doomed_step = GATED_STEPS[2]  # draft_answer: two steps done before the kill
    (gate / f"{doomed_step}.hold").touch()
    _, secret = token_issue(tenant=acme, user=bob, actor=Actor.system("test"))
    with OtlpReceiver() as receiver:
        env = tracing_env(receiver)
        # The web server publishes the run's first command to the test's broker.
        server = web_server(
            env={**env, **broker.env, "CAIRN_WORKFLOW_MODULES": TEST_WORKFLOW_MODULES}
        )
        status, headers, body = post(
            f"{server.url}/api/v1/runs",
            {
                "workflow_type": "research_gated",
                "inputs": {"question": f"Why build cairns? {MARKER}", "gate_dir": str(gate)},
                "budget": {"max_attempts": 20, "max_tokens": 100000, "max_cost": 10.0},
            },
            {
                "Authorization": f"Bearer {secret}",
                "traceparent": f"00-{RUNNER_TRACE}-{RUNNER_SPAN}-01",
            },
        )
        assert status == 201, body
        # The response carries Cairn's own span of the runner's trace.
        assert headers["traceresponse"].startswith(f"00-{RUNNER_TRACE}-")
        run = Run.objects.get(pk=body["id"])
        assert run.trace_context.split("-")[1] == RUNNER_TRACE

        first = worker_factory("first", env=env)
        wait_for(lambda: (gate / f"{doomed_step}.entered").exists(), what="the doomed step")
        finished_first = GATED_STEPS[:2]
        wait_for(
            lambda: exported_before_the_kill(receiver.spans(), finished_first),
            what="the first worker's finished steps (and the doomed one's model call) exported",
        )
        first.kill()
        (gate / f"{doomed_step}.hold").unlink()
        wait_for(
            lambda: Run.objects.get(pk=run.pk).lease_expires_at < timezone.now(),
            what="the dead worker's lease to expire",
        )
        assert runs_rescue() == 1
        second = worker_factory("second", env=env)
        request = wait_for(
            lambda: ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING).first(),
            what="the run to ask for approval",
            timeout=120,
        )
        decide(request, carol)  # in this process, which does not trace: the command carries it
        wait_for(
            lambda: Run.objects.filter(pk=run.pk, status=RunStatus.SUCCEEDED).exists(),
            what="the run to publish and succeed",
            timeout=120,
        )
        operation = ExternalOperation.objects.get(run=run, action="publish")
        wait_for(
            lambda: any(
                s["attributes"].get("cairn.effect.provider_operation_id") for s in receiver.spans()
            ),
            what="the publish effect's span",
        )
        wait_for(
            lambda: (
                spans_named(receiver.spans(), "cairn.step publish")
                and any(
                    s["attributes"].get("cairn.outcome") == "succeeded"
                    for s in spans_named(receiver.spans(), "run/checkpoints.run_advance")
                )
            ),
            what="the last task's spans",
        )
        spans = receiver.spans()

    run_id = str(run.pk)
    ours = [s for s in spans if s["attributes"].get("cairn.run.id") == run_id]
    # One trace for the run: every span naming it, and every task span carrying its
    # commands (on the web server, both workers, and the publication from this process).
    assert {s["trace_id"] for s in ours} == {RUNNER_TRACE}
    # Each task's span is the Celery instrumentation's, with Cairn's attributes on it.
    tasks = spans_named(spans, "run/checkpoints.run_advance")
    assert len(tasks) >= 2 and {s["trace_id"] for s in tasks} == {RUNNER_TRACE}
    assert {s["attributes"]["cairn.run.id"] for s in tasks} == {run_id}
    assert not spans_named(spans, "cairn.run.advance")
    start = spans_named(ours, "cairn.run.start")
    assert len(start) == 1
    request_span = next(s for s in spans if s["span_id"] == start[0]["parent_span_id"])
    assert request_span["kind"] == "server" and request_span["parent_span_id"] == RUNNER_SPAN

    # Step spans from both workers, each the run's step under the run's start.
    steps = spans_named(ours, "cairn.step ")
    by_worker: dict[str, set[str]] = {}
    for step in steps:
        by_worker.setdefault(step["attributes"]["cairn.worker"], set()).add(
            step["attributes"]["cairn.step.name"]
        )
        assert step["parent_span_id"] == start[0]["span_id"]
        assert step["links"], "a step links to the task that ran it"
    assert len(by_worker) == 2, by_worker
    first_steps, second_steps = sorted(by_worker.values(), key=len)
    assert first_steps == set(finished_first)
    assert {doomed_step, "validate_citations", "publish"} <= second_steps
    committed = [s for s in steps if "cairn.checkpoint.sequence" in s["attributes"]]
    assert len(committed) == len(steps)
    assert all(len(s["attributes"]["cairn.checkpoint.sha256"]) == 64 for s in committed)
    assert len({s["attributes"]["cairn.checkpoint.sequence"] for s in committed}) == len(steps)

    # GenAI spans: the operation, the model and the tokens, from both workers' steps.
    calls = [s for s in spans if s["attributes"].get("gen_ai.operation.name") == "chat"]
    assert calls and {s["trace_id"] for s in calls} == {RUNNER_TRACE}
    for call in calls:
        attributes = call["attributes"]
        assert attributes["gen_ai.request.model"] == "local-deterministic-1"
        assert attributes["gen_ai.usage.input_tokens"] > 0
        assert attributes["gen_ai.usage.output_tokens"] > 0
        assert attributes["cairn.model.cost"] >= 0
    step_ids = {s["span_id"]: s["attributes"]["cairn.worker"] for s in steps}
    callers = [step_ids.get(c["parent_span_id"]) for c in calls]
    assert set(callers) - {None} == set(by_worker)
    # The killed attempt's own span never ended, so it was never exported; the model call
    # it made before the kill was, and is in the trace all the same.
    assert callers.count(None) == 1

    # The publish effect's span, with the provider's operation id.
    effect = spans_named(ours, "cairn.effect publish")
    assert len(effect) == 1
    assert effect[0]["attributes"]["cairn.effect.provider_operation_id"] == (
        operation.provider_operation_id
    )
    assert effect[0]["attributes"]["cairn.effect.idempotency_key"] == operation.idempotency_key
    assert effect[0]["attributes"]["cairn.outcome"] == "confirmed"

    # The second worker's restore is an event with its checks; the approval wait another.
    restores = [e for s in ours for e in s["events"] if e["name"] == "cairn.restore"]
    took_over = [e for e in restores if e["attributes"]["cairn.restore.took_over"]]
    assert len(took_over) == 1
    assert took_over[0]["attributes"]["cairn.restore.checks"][:3] == ["lease", "load", "integrity"]
    assert took_over[0]["attributes"]["cairn.run.restore_count"] == 1
    decisions = [
        e["attributes"]["cairn.approval.decision"]
        for s in ours
        for e in s["events"]
        if e["name"] == "cairn.approval"
    ]
    assert decisions[0] == "wait" and decisions[-1] == "approved"
    # A step's own commit is recorded by its span; the effect's pending and post-action
    # checkpoints are commits of their own inside the effect's span.
    effect_commits = [
        s
        for s in spans_named(ours, "cairn.checkpoint.commit")
        if s["parent_span_id"] == effect[0]["span_id"]
    ]
    assert len(effect_commits) == 2
    sequences = sorted(s["attributes"]["cairn.checkpoint.sequence"] for s in effect_commits)
    published = spans_named(ours, "cairn.step publish")[0]["attributes"]
    assert sequences == [published["cairn.checkpoint.sequence"] - i for i in (2, 1)]
    if connection.vendor == "postgresql":
        # The psycopg instrumentation traces a step's own queries (the effect's ledger),
        # not the protocol's statements (the lease, its renewals and charges, the restore's
        # reads), which the task's span and the restore's event time.
        queries = [s for s in spans if "db.statement" in s["attributes"]]
        assert any(q["parent_span_id"] == effect[0]["span_id"] for q in queries)
        lease = [q for q in queries if '"lease_expires_at" =' in q["attributes"]["db.statement"]]
        assert not lease, [q["attributes"]["db.statement"][:80] for q in lease]
    step_span_ids = {s["span_id"] for s in steps}
    commits = spans_named(ours, "cairn.checkpoint.commit")
    assert not [c for c in commits if c["parent_span_id"] in step_span_ids]

    # Nothing the run was given, and no credential, in any span of any process.
    for span in spans:
        text = json.dumps(
            [span["name"], span["attributes"], span["events"], span["resource"]], default=str
        )
        assert MARKER not in text, span["name"]
        assert secret not in text, span["name"]

    # The workers' JSON log lines written in a step carry that step's trace and span.
    lines = [json.loads(line) for line in second.log().splitlines() if line.startswith("{")]
    started = [line for line in lines if line.get("message") == "step started"]
    assert started and all(line["trace_id"] == RUNNER_TRACE for line in started)
    assert {line["span_id"] for line in started} <= {s["span_id"] for s in steps}
