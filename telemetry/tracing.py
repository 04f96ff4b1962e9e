"""Traces: every run a trace, exported over OpenTelemetry to whatever the team already
watches (Jaeger, Tempo, Langfuse, Phoenix, Datadog, a collector).

Configured only by the standard ``OTEL_*`` variables, and off unless
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or
``OTEL_TRACES_EXPORTER`` is set; ``OTEL_SDK_DISABLED=true`` or ``OTEL_TRACES_EXPORTER=none``
turns it off again. Off, every helper here is a no-op that allocates nothing: no provider,
no instrumentation, no thread.

On, each process (web, worker, scheduler) exports its own spans, and the official Django,
Celery and psycopg instrumentations add the request, task and query spans. What ties a run
together across processes, queues and crashes is the trace context stored with the run
(``Run.trace_context``, written once by the run's start) and carried by the outbox into
every command's message headers: a worker that takes a run over after another was killed
starts its spans in the same trace.

What spans may carry is ids, names, counts, hashes and outcomes. Never a payload value (an
input, an output, a prompt, a completion, an effect's request or result, a reason written
from them) and never a credential: exceptions are recorded by type only.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode

log = logging.getLogger("cairn.tracing")

# --- attribute names ------------------------------------------------------------------------
RUN_ID = "cairn.run.id"
TENANT = "cairn.tenant"
WORKFLOW_TYPE = "cairn.workflow.type"
WORKFLOW_VERSION = "cairn.workflow.version"
WORKER = "cairn.worker"
RUN_STATUS = "cairn.run.status"
RESTORE_COUNT = "cairn.run.restore_count"
OUTCOME = "cairn.outcome"
STEP = "cairn.step.name"
ATTEMPT = "cairn.step.attempt"
SEQUENCE = "cairn.checkpoint.sequence"
SHA256 = "cairn.checkpoint.sha256"
STATE = "cairn.checkpoint.state"
EXPECTED_VERSION = "cairn.commit.expected_version"
ERROR_CODE = "cairn.error.code"
ERROR_TYPE = "error.type"
COST = "cairn.model.cost"
EFFECT_ACTION = "cairn.effect.action"
EFFECT_KEY = "cairn.effect.idempotency_key"
EFFECT_PROVIDER = "cairn.effect.provider"
EFFECT_OPERATION_ID = "cairn.effect.provider_operation_id"
EFFECT_REPLAYED = "cairn.effect.replayed"

# The spans Cairn itself writes (the instrumentations add HTTP, task and query spans).
RUN_START_SPAN = "cairn.run.start"
ADVANCE_SPAN = "cairn.run.advance"
STEP_SPAN = "cairn.step"
COMMIT_SPAN = "cairn.checkpoint.commit"
EFFECT_SPAN = "cairn.effect"
RESTORE_EVENT = "cairn.restore"
APPROVAL_EVENT = "cairn.approval"
RECONCILE_EVENT = "cairn.reconcile"

INSTRUMENTATIONS = ("django", "celery", "psycopg")
# Scrapes and static files are not worth a trace each (OTEL_PYTHON_DJANGO_EXCLUDED_URLS
# replaces this list).
DEFAULT_EXCLUDED_URLS = "/metrics,/static/"

_tracer: trace.Tracer | None = None
# The step span that records its own commit (so the commit opens no span of its own).
_recording_commits: ContextVar[Span | None] = ContextVar("cairn_step_span", default=None)


class TracingMisconfigured(Exception):
    """An OTEL_* variable asks for something this installation cannot do."""


# --- configuration --------------------------------------------------------------------------
def exporter_names(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The span exporters the environment asks for; [] means tracing is off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = environ.get("OTEL_TRACES_EXPORTER", "").strip()
    if not raw:
        endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or environ.get(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        )
        return ["otlp"] if endpoint else []
    names = [name.strip().lower() for name in raw.split(",") if name.strip()]
    return [] if "none" in names else list(dict.fromkeys(names))


def _exporter(name: str, environ: Mapping[str, str]):  # noqa: ANN202
    from importlib.metadata import entry_points

    entry_name = name
    if name == "otlp":
        protocol = (
            environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        ).strip()
        entry_name = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}.get(protocol)
        if entry_name is None:
            raise TracingMisconfigured(
                f"OTEL_EXPORTER_OTLP_PROTOCOL is '{protocol}'; Cairn exports traces over "
                "'http/protobuf' (port 4318) or, with opentelemetry-exporter-otlp-proto-grpc "
                "installed, 'grpc'."
            )
    found = list(entry_points(group="opentelemetry_traces_exporter", name=entry_name))
    if not found and name == "otlp":
        raise TracingMisconfigured(
            f"OTEL_EXPORTER_OTLP_PROTOCOL is '{protocol}', which needs the package "
            "opentelemetry-exporter-otlp-proto-grpc; it is not installed. Use http/protobuf "
            "(the collector's port 4318), or install that package."
        )
    if not found:
        installed = sorted(e.name for e in entry_points(group="opentelemetry_traces_exporter"))
        raise TracingMisconfigured(
            f"OTEL_TRACES_EXPORTER asks for '{name}' ({entry_name}), which no installed package "
            f"provides (installed: {', '.join(installed)}). Use otlp over http/protobuf, or "
            "install the exporter's package."
        )
    return found[0].load()()


def tracing_configure(environ: Mapping[str, str] = os.environ) -> bool:
    """Set up this process's tracer provider, exporters and instrumentations from the
    ``OTEL_*`` environment, once. Returns whether tracing is on. Raises TracingMisconfigured
    with a sentence when the environment names an exporter or protocol that is not there."""
    global _tracer
    if _tracer is not None:
        return True
    names = exporter_names(environ)
    if not names:
        return False
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    exporters = [_exporter(name, environ) for name in names]
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "cairn"}))
    # The sampler (OTEL_TRACES_SAMPLER, _ARG) and the batching (OTEL_BSP_*) come from the
    # environment inside the SDK; a parent-based sampler keeps a run's spans together.
    provider = TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _instrument(environ)
    _tracer = trace.get_tracer("cairn")
    log.info("tracing on", extra={"exporters": names})
    return True


def _instrument(environ: Mapping[str, str]) -> None:
    from opentelemetry.instrumentation.propagators import (
        TraceResponsePropagator,
        set_global_response_propagator,
    )

    disabled = {
        name.strip().lower()
        for name in environ.get("OTEL_PYTHON_DISABLED_INSTRUMENTATIONS", "").split(",")
    }
    # Responses carry the server span's context (``traceresponse``), so a runner can link its
    # own trace to the request Cairn answered.
    set_global_response_propagator(TraceResponsePropagator())
    if "django" not in disabled:
        from opentelemetry.instrumentation.django import DjangoInstrumentor

        excluded = None
        if not (
            environ.get("OTEL_PYTHON_DJANGO_EXCLUDED_URLS")
            or environ.get("OTEL_PYTHON_EXCLUDED_URLS")
        ):
            excluded = DEFAULT_EXCLUDED_URLS
        DjangoInstrumentor().instrument(excluded_urls=excluded, request_hook=_request_without_query)
    if "celery" not in disabled:
        from opentelemetry.instrumentation.celery import CeleryInstrumentor

        CeleryInstrumentor().instrument()
    if "psycopg" not in disabled:
        from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

        # Django opens its connections with psycopg.connect, which this wraps; the commit's
        # own prepared statement is covered by the commit span instead.
        PsycopgInstrumentor().instrument()


def _request_without_query(span: Span, request: Any) -> None:
    """The request span keeps the path, never the query string: a console search or a
    filter can carry text from a run's inputs."""
    if not span.is_recording() or not request.META.get("QUERY_STRING"):
        return
    attributes = getattr(span, "attributes", None) or {}
    for key in ("http.url", "http.target", "url.full"):
        value = attributes.get(key)
        if isinstance(value, str):
            span.set_attribute(key, value.split("?", 1)[0])
    if "url.query" in attributes:
        span.set_attribute("url.query", "")


def tracing_on() -> bool:
    return _tracer is not None


# --- trace context --------------------------------------------------------------------------
def traceparent_of(context: trace.SpanContext) -> str:
    """W3C ``traceparent`` of a span context."""
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


@functools.lru_cache(maxsize=1024)  # a worker parses its runs' contexts at every step
def _parsed(traceparent: str) -> trace.SpanContext | None:
    parts = (traceparent or "").split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16 or len(parts[3]) != 2:
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return trace.SpanContext(
        trace_id, span_id, is_remote=True, trace_flags=trace.TraceFlags(flags & 0x01)
    )


@functools.lru_cache(maxsize=1024)
def _run_context(traceparent: str) -> otel_context.Context | None:
    """The context whose current span is the run's stored one (immutable: reused for every
    step of the run)."""
    stored = _parsed(traceparent)
    return None if stored is None else trace.set_span_in_context(trace.NonRecordingSpan(stored))


def trace_id_of(traceparent: str) -> str:
    """The 32 hex digits of the trace a stored ``traceparent`` names ('' when none)."""
    context = _parsed(traceparent)
    return f"{context.trace_id:032x}" if context else ""


def run_trace_start(
    *, run_id: object, tenant: str, workflow_type: str, workflow_version: str
) -> str:
    """The trace context a new run keeps for its whole life, as a ``traceparent``.

    With tracing on, it is the context of a ``cairn.run.start`` span opened (and ended) in
    the current context, so a run started by a runner's request (its ``traceparent``) lives
    in the runner's trace. With tracing off, a fresh sampled context: a worker that traces
    later still puts all of the run's spans in one trace."""
    if _tracer is None:
        return f"00-{secrets.randbits(128) or 1:032x}-{secrets.randbits(64) or 1:016x}-01"
    attributes = {
        RUN_ID: str(run_id),
        TENANT: tenant,
        WORKFLOW_TYPE: workflow_type,
        WORKFLOW_VERSION: workflow_version,
    }
    with _tracer.start_as_current_span(RUN_START_SPAN, attributes=attributes) as span:
        return traceparent_of(span.get_span_context())


def message_headers(traceparent: str) -> dict[str, str] | None:
    """Headers for a command's message: its run's trace context, so the worker that
    executes it (instrumented by the Celery instrumentation) starts in the run's trace even
    when the publishing process does not trace."""
    return {"traceparent": traceparent} if _parsed(traceparent) else None


@contextmanager
def run_context(traceparent: str) -> Iterator[None]:
    """Make the run's stored trace context the current one (publishing its command)."""
    parent = _run_context(traceparent) if _tracer is not None else None
    if parent is None:
        yield
        return
    token = otel_context.attach(parent)
    try:
        yield
    finally:
        otel_context.detach(token)


def trace_url(template: str, traceparent: str) -> str:
    """``template`` with ``{trace_id}`` replaced by the run's trace id ('' without either,
    and for a template that is not an http(s) URL: a link never runs script). A plain
    replacement: a Grafana Explore URL holds JSON braces of its own."""
    trace_id = trace_id_of(traceparent)
    if not trace_id or not template.startswith(("https://", "http://")):
        return ""
    return template.replace("{trace_id}", trace_id)


# --- spans ----------------------------------------------------------------------------------
class _Span:
    """A span made current for a ``with`` block (a plain class: this runs for every step,
    model call and effect, and a generator-based context manager costs more). Failures are
    recorded by type and code only: an exception's message may quote a payload."""

    __slots__ = ("name", "attributes", "kind", "parent", "records_commits", "span", "tokens")

    def __init__(
        self,
        name: str,
        attributes: dict[str, Any],
        kind: SpanKind = SpanKind.INTERNAL,
        *,
        parent: str = "",
        records_commits: bool = False,
    ) -> None:
        self.name, self.attributes, self.kind = name, attributes, kind
        self.parent, self.records_commits = parent, records_commits

    def __enter__(self) -> Span:
        context, links = None, None
        if self.parent:
            context = _run_context(self.parent)
        if context is not None:
            # Under the run's own context, linked to the span current here (the task's).
            here = trace.get_current_span().get_span_context()
            links = [trace.Link(here)] if here.is_valid else None
        span = self.span = _tracer.start_span(
            self.name,
            context=context,
            kind=self.kind,
            attributes=self.attributes,
            links=links,
            record_exception=False,
        )
        self.tokens = (
            otel_context.attach(trace.set_span_in_context(span)),
            _recording_commits.set(span) if self.records_commits else None,
        )
        return span

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> None:
        context_token, commits_token = self.tokens
        if commits_token is not None:
            _recording_commits.reset(commits_token)
        otel_context.detach(context_token)
        if exc is not None:
            failed(self.span, exc)
        self.span.end()


_NO_SPAN = nullcontext(INVALID_SPAN)


def _span(
    name: str,
    attributes: dict[str, Any],
    kind: SpanKind = SpanKind.INTERNAL,
    *,
    parent: str = "",
    records_commits: bool = False,
) -> _Span | nullcontext:
    if _tracer is None:
        return _NO_SPAN
    return _Span(name, attributes, kind, parent=parent, records_commits=records_commits)


def failed(span: Span, exc: BaseException) -> None:
    """Mark ``span`` failed by ``exc``'s type and code only (never its message)."""
    if not span.is_recording():
        return
    span.set_attribute(ERROR_TYPE, type(exc).__name__)
    code = getattr(exc, "code", None)
    if isinstance(code, str):
        span.set_attribute(ERROR_CODE, code)
    span.set_status(Status(StatusCode.ERROR, type(exc).__name__))


def advance_span(*, run_id: object, worker: str) -> Any:
    """One ``run.resume`` carried out by a worker, its restore an event of it. That is the
    task's own span (the Celery instrumentation's ``run/checkpoints.run_advance``), which
    gets Cairn's attributes: a second span saying the same would cost as much again. Only
    without one (that instrumentation disabled, a direct call) is ``cairn.run.advance``
    opened."""
    if _tracer is None:
        return _NO_SPAN
    attributes = {RUN_ID: str(run_id), WORKER: worker}
    task = trace.get_current_span()
    if task.is_recording() and getattr(task, "kind", None) is SpanKind.CONSUMER:
        task.set_attributes(attributes)
        return nullcontext(task)
    return _Span(ADVANCE_SPAN, attributes)


def step_span(*, run_id: object, step: str, attempt: int, worker: str, run_trace: str) -> Any:
    """One step attempt; ``step_ended`` adds its outcome and the checkpoint it committed (the
    step's own commit opens no span of its own: this one records it).

    Its parent is the run's own trace context (``run_trace``, stored with the run), linked
    to the task that ran it: a worker killed mid-task never ends (so never exports) its
    task's span, and the steps it finished must not hang from a span nobody will see."""
    return _span(
        f"{STEP_SPAN} {step}",
        {RUN_ID: str(run_id), STEP: step, ATTEMPT: attempt, WORKER: worker},
        parent=run_trace,
        records_commits=True,
    )


def effect_span(*, run_id: object, action: str, provider: str) -> Any:
    """One external side effect (reserve, pending checkpoint, call, confirmation)."""
    return _span(
        f"{EFFECT_SPAN} {action}",
        {RUN_ID: str(run_id), EFFECT_ACTION: action, EFFECT_PROVIDER: provider},
        SpanKind.CLIENT,
    )


def model_span(*, model: str, provider: str, max_tokens: int) -> Any:
    """One model call, named and shaped by the GenAI semantic conventions."""
    return _span(
        f"chat {model}",
        {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider,
            "gen_ai.system": provider,  # the name older backends read
            "gen_ai.request.model": model,
            "gen_ai.request.max_tokens": max_tokens,
        },
        SpanKind.CLIENT,
    )


def model_answered(
    span: Span, *, model: str, input_tokens: int, output_tokens: int, cost: float
) -> None:
    if span.is_recording():
        span.set_attributes(
            {
                "gen_ai.response.model": model,
                "gen_ai.usage.input_tokens": input_tokens,
                "gen_ai.usage.output_tokens": output_tokens,
                COST: cost,
            }
        )


def committed(result: Any, *, state: str) -> dict[str, Any]:
    """The checkpoint a commit wrote, as attributes: its sequence, sha256 and state, and
    the run's status after it. Ids and hashes only."""
    return {
        SEQUENCE: result.sequence,
        SHA256: result.sha256,
        STATE: state,
        RUN_STATUS: str(result.status),
    }


def step_ended(span: Span, *, outcome: str, checkpoint: dict[str, Any] | None) -> None:
    """What a step attempt came to, and the checkpoint it committed: one call, at its end."""
    if span.is_recording():
        span.set_attributes({OUTCOME: outcome, **(checkpoint or {})})


def protocol_statements() -> Any:
    """The block's database statements are not traced one by one (the psycopg
    instrumentation's spans are suppressed, the standard way): a worker's own protocol
    statements, which the task's span and the restore's event time and name already."""
    if _tracer is None:
        return _NO_SPAN
    from opentelemetry.instrumentation.utils import suppress_instrumentation

    return suppress_instrumentation()


def current_span() -> Span:
    return trace.get_current_span() if _tracer is not None else INVALID_SPAN


def event(name: str, attributes: dict[str, Any]) -> None:
    """A span event on the current span (restores, approval waits, reconciliation)."""
    if _tracer is None:
        return
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, {k: v for k, v in attributes.items() if v is not None})


F = TypeVar("F", bound=Callable[..., Any])


def commit_traced(commit: F) -> F:
    """A ``cairn.checkpoint.commit`` span around every call of the decorated commit made in
    a trace, for every writer alike (a runner over HTTP, an effect, an operator's action,
    the LangGraph saver in a traced application); the commit's own body is not touched. A
    refusal is recorded by its code.

    A commit joins a trace, it never starts one: called outside any trace (an untraced
    embedding application) it opens none, since a trace of one commit tells nobody
    anything. A step's own commit is recorded by the step's span instead."""

    @functools.wraps(commit)
    def traced(**kwargs: Any) -> Any:
        if _tracer is None:
            return commit(**kwargs)
        current = trace.get_current_span()
        if not current.get_span_context().is_valid or current is _recording_commits.get():
            return commit(**kwargs)
        request = kwargs["request"]  # a checkpoints CommitRequest
        state = request.state
        attributes = {
            RUN_ID: str(kwargs.get("run_id")),
            STATE: state,
            STEP: request.step,
            EXPECTED_VERSION: request.expected_version,
        }
        span = _tracer.start_span(COMMIT_SPAN, attributes=attributes, record_exception=False)
        token = otel_context.attach(trace.set_span_in_context(span))
        try:
            result = commit(**kwargs)
            if span.is_recording():
                span.set_attributes(committed(result, state=state))
            return result
        except BaseException as exc:
            failed(span, exc)
            raise
        finally:
            otel_context.detach(token)
            span.end()

    return traced  # type: ignore[return-value]
