"""Traces over HTTP and through the outbox, and how tracing is switched on.

A runner's ``traceparent`` joins the commits it makes to its own trace and every response
carries Cairn's span of it (``traceresponse``), on a real gunicorn exporting to a real OTLP
receiver; a command carries its run's trace in its message headers whoever publishes it;
only the standard OTEL_* variables turn tracing on."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from kombu import Connection

from checkpoints.models import OutboxMessage, Run
from checkpoints.services.outbox import outbox_dispatch
from runtime.rescue import runs_rescue
from telemetry import tracing
from telemetry.otlp_receiver import OtlpReceiver
from tenants.services import Actor, token_issue
from tests.web_server import web_server  # noqa: F401
from tests.worker_fixtures import wait_for

MARKER = "PLAINTEXT-MARKER-9e2b"
OPENING = ("5c1e3d2a9b8f47e6a1d0c3b2a1f0e9d8", "1a2b3c4d5e6f7a8b")
STEP = ("0123456789abcdef0123456789abcdef", "fedcba9876543210")


def traceparent(ids: tuple[str, str]) -> str:
    return f"00-{ids[0]}-{ids[1]}-01"


def call(url: str, method: str, headers: dict, body: dict | None = None):  # noqa: ANN201
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", **headers},
        method=method,
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:  # noqa: S310 - loopback
            return answer.status, answer.headers, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, refused.headers, json.loads(refused.read())


@pytest.mark.django_db(transaction=True)
def test_a_runners_traceparent_joins_its_commits_and_responses_carry_cairns(
    acme,
    bob,
    workflow,
    web_server,  # noqa: F811
):
    _, secret = token_issue(tenant=acme, user=bob, actor=Actor.system("test"))
    auth = {"Authorization": f"Bearer {secret}"}
    with OtlpReceiver() as receiver:
        server = web_server(
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "50"}
        )
        status, headers, run = call(
            f"{server.url}/api/v1/runs",
            "POST",
            {**auth, "traceparent": traceparent(OPENING)},
            {"workflow_type": "research", "execution": "external", "inputs": {"q": MARKER}},
        )
        assert status == 201, run
        assert headers["traceresponse"].startswith(f"00-{OPENING[0]}-")
        # The runner's step, in a trace of its own: Cairn's commit joins that one.
        commit = {"expected_version": 1, "state": "draft_answer", "step": "draft_answer"}
        envelope = {"evidence": {"outputs": {"draft_answer": {"text": MARKER}}}}
        status, headers, body = call(
            f"{server.url}/api/v1/runs/{run['id']}/checkpoints",
            "POST",
            {**auth, "traceparent": traceparent(STEP)},
            {**commit, "envelope": envelope},
        )
        assert status == 201, body
        assert headers["traceresponse"].startswith(f"00-{STEP[0]}-")
        # The same commit again is stale: refused, and its span says so by its code.
        status, headers, refused = call(
            f"{server.url}/api/v1/runs/{run['id']}/checkpoints",
            "POST",
            {**auth, "traceparent": traceparent(STEP)},
            {**commit, "envelope": envelope},
        )
        assert status == 409 and refused["code"] == "concurrent_checkpoint_write"
        # A query string is not kept in the request's span (it can carry a run's text).
        status, _, _ = call(f"{server.url}/api/v1/runs/{run['id']}?note={MARKER}", "GET", auth)
        assert status == 200
        wait_for(
            lambda: (
                len(tracing_spans(receiver, tracing.COMMIT_SPAN)) == 2
                and any(
                    s["kind"] == "server" and s["name"].startswith("GET") for s in receiver.spans()
                )
            ),
            what="the commits' and the read's spans",
        )
        spans = receiver.spans()

    start = tracing_spans(receiver, tracing.RUN_START_SPAN, spans)
    assert [s["trace_id"] for s in start] == [OPENING[0]]
    accepted, stale = sorted(
        tracing_spans(receiver, tracing.COMMIT_SPAN, spans), key=lambda s: s["start_ns"]
    )
    for span in (accepted, stale):
        assert span["trace_id"] == STEP[0]
        server_span = next(s for s in spans if s["span_id"] == span["parent_span_id"])
        assert server_span["kind"] == "server" and server_span["parent_span_id"] == STEP[1]
        assert span["attributes"]["cairn.run.id"] == run["id"]
    assert accepted["attributes"]["cairn.checkpoint.sequence"] == body["sequence"] == 2
    assert accepted["attributes"]["cairn.checkpoint.sha256"] == body["sha256"]
    assert accepted["status"] == "unset"
    assert stale["status"] == "error"
    assert stale["attributes"]["cairn.error.code"] == "concurrent_checkpoint_write"
    for span in spans:
        text = json.dumps([span["name"], span["attributes"], span["events"]])
        assert MARKER not in text and secret not in text, span["name"]


def tracing_spans(receiver: OtlpReceiver, name: str, spans: list | None = None) -> list[dict]:
    return [s for s in (receiver.spans() if spans is None else spans) if s["name"] == name]


@pytest.mark.django_db(transaction=True)
def test_every_command_of_a_run_carries_its_trace_whoever_publishes_it(acme, bob, settings):
    """The dispatcher publishes each command with its run's trace context in the message
    headers: the first command, and the rescue's after a worker died."""
    from cairn.celery import app
    from runtime.services.runs import run_create

    settings.CAIRN_DISPATCH_ON_COMMIT = False
    with Connection(app.conf.broker_url) as connection:  # the process's in-memory broker
        connection.SimpleQueue("celery").clear()  # what earlier tests left in it
    run = run_create(
        tenant=acme, workflow_type="research", inputs={"question": MARKER}, actor=Actor(user=bob)
    )
    assert tracing.trace_id_of(run.trace_context)  # stored at the start, tracing or not
    assert outbox_dispatch() == 1
    Run.objects.filter(pk=run.pk).update(
        lease_owner="a dead worker", lease_expires_at=run.created_at
    )
    assert runs_rescue() == 1
    assert outbox_dispatch() == 1
    assert OutboxMessage.objects.filter(run=run, sent_at__isnull=True).count() == 0
    with Connection(app.conf.broker_url) as connection:
        queue = connection.SimpleQueue("celery")
        headers = [queue.get(timeout=5).headers for _ in range(2)]
        queue.close()
    assert [h["task"] for h in headers] == ["checkpoints.run_advance"] * 2
    assert [h["traceparent"] for h in headers] == [run.trace_context] * 2


def test_tracing_is_off_unless_the_standard_variables_turn_it_on():
    assert tracing.exporter_names({}) == []
    assert tracing.exporter_names({"OTEL_SERVICE_NAME": "cairn"}) == []
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert tracing.exporter_names(endpoint) == ["otlp"]
    assert tracing.exporter_names({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://x"}) == ["otlp"]
    assert tracing.exporter_names({"OTEL_TRACES_EXPORTER": "console,otlp"}) == ["console", "otlp"]
    assert tracing.exporter_names({**endpoint, "OTEL_TRACES_EXPORTER": "none"}) == []
    assert tracing.exporter_names({**endpoint, "OTEL_SDK_DISABLED": "true"}) == []


def test_an_exporter_this_installation_lacks_is_named_in_a_sentence():
    with pytest.raises(tracing.TracingMisconfigured, match="'grpc'"):
        tracing._exporter("otlp", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    with pytest.raises(tracing.TracingMisconfigured, match="http/json"):
        tracing._exporter("otlp", {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    with pytest.raises(tracing.TracingMisconfigured, match="'zipkin'.*installed: console"):
        tracing._exporter("zipkin", {})
    assert type(tracing._exporter("otlp", {})).__name__ == "OTLPSpanExporter"


def test_the_trace_link_fills_in_the_trace_id_and_nothing_else():
    stored = traceparent(OPENING)
    grafana = 'https://grafana/explore?left={"queries":[{"query":"{trace_id}"}]}'
    assert tracing.trace_url(grafana, stored) == grafana.replace("{trace_id}", OPENING[0])
    assert tracing.trace_url("http://jaeger:16686/trace/{trace_id}", stored).endswith(OPENING[0])
    assert tracing.trace_url("", stored) == ""
    assert tracing.trace_url("http://jaeger/trace/{trace_id}", "") == ""
    assert tracing.trace_url("http://jaeger/trace/{trace_id}", "00-zz-1-01") == ""
    assert tracing.trace_url("javascript:alert('{trace_id}')", stored) == ""


@pytest.mark.django_db
def test_the_run_page_links_to_the_runs_trace_only_with_a_template(
    client, settings, acme, bob, workflow
):  # noqa: ANN001
    from django.urls import reverse

    from runtime.services.runs import run_create

    run = run_create(
        tenant=acme, workflow_type="research", execution="external", actor=Actor(user=bob)
    )
    client.force_login(bob)
    url = reverse("console:run_detail", args=[run.pk])
    settings.CAIRN_TRACE_URL_TEMPLATE = ""
    assert 'id="run-trace"' not in client.get(url).content.decode()
    settings.CAIRN_TRACE_URL_TEMPLATE = "http://jaeger.example:16686/trace/{trace_id}"
    html = client.get(url).content.decode()
    trace_id = tracing.trace_id_of(run.trace_context)
    assert len(trace_id) == 32
    assert f'href="http://jaeger.example:16686/trace/{trace_id}" id="run-trace"' in html


def test_a_trace_link_template_that_cannot_work_is_reported_at_start_up(settings):
    from observability.checks import trace_url_template_check

    for broken in ("jaeger:16686/trace/{trace_id}", "http://jaeger:16686/search"):
        settings.CAIRN_TRACE_URL_TEMPLATE = broken
        assert [e.id for e in trace_url_template_check(None)] == ["cairn.E102"]
    settings.CAIRN_TRACE_URL_TEMPLATE = "https://tempo.example/trace/{trace_id}"
    assert trace_url_template_check(None) == []
