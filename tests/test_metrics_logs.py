"""Structured logs: one JSON line per transition, with run, tenant, sequence, state, step,
on stdout."""

from __future__ import annotations

import io
import json
import logging

import pytest
from django.conf import settings

from cairn.errors import IllegalTransition
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from runtime.services.runs import run_create
from tenants.services import Actor

pytestmark = pytest.mark.django_db(transaction=True)
FIELDS = {"run", "tenant", "sequence", "state", "step"}


@pytest.fixture
def log_lines():  # noqa: ANN201
    """What the configured cairn handler writes, captured from its own stream."""
    handler = logging.getLogger("cairn").handlers[0]
    buffer = io.StringIO()
    previous = handler.setStream(buffer)
    try:
        yield lambda: [json.loads(line) for line in buffer.getvalue().splitlines()]
    finally:
        handler.setStream(previous)


def test_the_log_handler_writes_json_to_stdout():
    handler = settings.LOGGING["handlers"]["console"]
    assert handler["stream"] == "ext://sys.stdout"
    assert settings.LOGGING["formatters"]["json"]["()"] == "cairn.logging.JsonFormatter"


def test_each_transition_is_one_json_line(log_lines, acme, bob, workflow):
    actor = Actor(user=bob)
    run = run_create(tenant=acme, workflow_type="research", execution="external", actor=actor)
    for version, state in enumerate(["draft_answer", "review"], start=1):
        checkpoint_commit(
            tenant=acme,
            run_id=run.id,
            request=CommitRequest(
                expected_version=version, state=state, step=state, envelope={}, actor=actor
            ),
        )
    with pytest.raises(IllegalTransition):
        checkpoint_commit(
            tenant=acme,
            run_id=run.id,
            request=CommitRequest(expected_version=3, state="done", envelope={}, actor=actor),
        )
    transitions = [line for line in log_lines() if FIELDS <= set(line)]
    assert [(t["message"], t["sequence"], t["state"], t["step"]) for t in transitions] == [
        ("run started", 1, "collect_sources", ""),
        ("checkpoint committed", 2, "draft_answer", "draft_answer"),
        ("checkpoint committed", 3, "review", "review"),
    ]
    assert {t["run"] for t in transitions} == {str(run.id)}
    assert {t["tenant"] for t in transitions} == {"acme"}
    assert all(t["level"] == "INFO" and t["time"] for t in transitions)


def test_a_line_written_inside_a_span_carries_its_trace_and_span_ids(log_lines):
    from opentelemetry.sdk.trace import TracerProvider

    log = logging.getLogger("cairn.test")
    tracer = TracerProvider().get_tracer("test")  # a provider of its own: nothing global
    log.info("before the span")
    with tracer.start_as_current_span("outer") as outer:
        log.info("in the outer span")
        with tracer.start_as_current_span("inner") as inner:
            log.info("in the inner span")
    log.info("after the span")
    lines = {line["message"]: line for line in log_lines()}
    for message, span in (("in the outer span", outer), ("in the inner span", inner)):
        context = span.get_span_context()
        assert lines[message]["trace_id"] == f"{context.trace_id:032x}"
        assert lines[message]["span_id"] == f"{context.span_id:016x}"
    for message in ("before the span", "after the span"):
        assert "trace_id" not in lines[message] and "span_id" not in lines[message]
