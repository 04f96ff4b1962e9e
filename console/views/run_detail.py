"""The run page: snapshot, timeline, state machine, evidence, approvals, audit, forks."""

from __future__ import annotations

import json
from uuid import UUID

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.urls import reverse

from approvals.services.evidence import run_evidence_export
from cairn.errors import CairnError, NotFound
from checkpoints.crypto import MissingKeyError
from checkpoints.services.artifacts import artifact_read
from checkpoints.services.integrity import run_head_problem
from console import run_reads
from console.conditional import conditional
from console.machine import machine_drawing
from runtime.services.actions import FINISHED
from runtime.services.operations import operation_read
from telemetry.tracing import trace_url
from tenants import roles
from tenants.access import console_view

VIEWER_MAX_BYTES = 256 * 1024
TEXT_MEDIA = ("text/", "application/json", "application/xml", "application/x-ndjson")


def _snapshot_context(run) -> dict:  # noqa: ANN001
    # The poll carries the version the page shows (``seen``): once the run has moved past
    # it, the poll brings every card up to date and carries the new version from then on.
    return {
        "run": run,
        "budgets": run_reads.budget_bars(run),
        "refresh_seconds": settings.CAIRN_CONSOLE_REFRESH_SECONDS,
        "seen_version": run.version,
        "moved_from": None,
        # A finished run does not move again: its page stops polling.
        "polling": run.status not in FINISHED,
    }


@console_view(roles.OPERATE)
def run_detail(request: HttpRequest, run_id: UUID) -> HttpResponse:
    access = request.console
    run = run_reads.run_for_page(tenant=access.tenant, run_id=run_id)
    return render(request, "console/run_detail.html", _page_context(request, run))


def _page_context(request: HttpRequest, run) -> dict:  # noqa: ANN001
    """Everything the run page shows of ``run``, for the page and for the poll that sees
    the run move (the pages of checkpoints and audit events the request's query names)."""
    access = request.console
    definition = run.workflow.definition
    envelope, envelope_error = None, ""
    if run.checkpoint_sequence:
        envelope, envelope_error = run_reads.envelope_for_page(
            access, run_id=run.pk, sequence=run.checkpoint_sequence
        )
        if envelope is not None:
            # The snapshot shows the run's row: say so when it is not what the head seals.
            forged = run_head_problem(run, envelope)
            envelope_error = f"Integrity failure: {forged}." if forged else ""
    evidence = (envelope or {}).get("evidence") or {}
    audit_events, audit_next = run_reads.audit_trail(run, request.GET.get("audit_before"))
    checkpoints, checkpoints_next = run_reads.timeline(run, request.GET.get("checkpoints_before"))
    approvals_for_run = run_reads.optional_selector("approvals.selectors", "approvals_for_run")
    standing_for_run = run_reads.optional_selector(
        "approvals.selectors", "approval_standing_for_run"
    )
    context = {
        **_snapshot_context(run),
        "access": access,
        "checkpoints": checkpoints,
        "checkpoints_next": checkpoints_next,
        "checkpoints_paged": bool(request.GET.get("checkpoints_before")),
        # One reverse for up to TIMELINE_LIMIT links: the sequence is the URL's last part.
        "checkpoint_url_prefix": reverse("console:checkpoint_detail", args=[run.pk, 0])[:-2],
        "timeline_limit": run_reads.TIMELINE_LIMIT,
        "machine": machine_drawing(definition, run_reads.states_visited(run), run.state),
        "workflow_states": definition["states"],
        "workflow_steps": _steps(definition),
        "envelope_error": envelope_error,
        "artifacts": run_reads.artifacts_referenced(access.tenant, evidence.get("artifacts", [])),
        "validators": evidence.get("validators", []),
        "tool_results": evidence.get("tool_results", []),
        "operations": run_reads.operations(run),
        "approvals_available": approvals_for_run is not None,
        "approvals": (
            list(approvals_for_run(tenant=access.tenant, run=run)) if approvals_for_run else []
        ),
        # At an approval state: the request that lets the run pass, or why none does.
        "approval_standing": (
            standing_for_run(run=run, evidence=evidence) if standing_for_run else None
        ),
        "audit_events": audit_events,
        "audit_next": audit_next,
        "audit_paged": bool(request.GET.get("audit_before")),
        "audit_limit": run_reads.AUDIT_LIMIT,
        "forks": list(run_reads.forks(run)),
        # Legal holds are the admins' (the retention page's); the run page offers one.
        "can_hold": access.can(roles.ADMIN),
        "trace_url": trace_url(settings.CAIRN_TRACE_URL_TEMPLATE, run.trace_context),
    }
    return context


def _steps(definition: dict) -> list[str]:
    """Step names a retry can name: the declared steps, else the states themselves."""
    steps = definition.get("steps") or {}
    return list(dict.fromkeys(steps.values())) if steps else list(definition["states"])


@console_view(roles.OPERATE)
def run_snapshot(request: HttpRequest, run_id: UUID) -> HttpResponse:
    """The snapshot panel alone, polled by htmx so status and budgets stay current."""
    run = run_reads.run_for_page(tenant=request.console.tenant, run_id=run_id)
    seen = request.GET.get("seen", "")
    seen_version = int(seen) if seen.isascii() and seen.isdigit() and len(seen) < 19 else None
    if seen_version is None or seen_version == run.version:
        # Nothing moved: the snapshot alone, and the cards below (an open form among them)
        # are left as they are. A poll that finds nothing new costs a 304 without a body.
        body = render_to_string("console/run_detail.html#snapshot", _snapshot_context(run), request)
        return conditional(request, HttpResponse(body))
    # The run moved on: every card, out of band, as the page would show it now.
    context = {**_page_context(request, run), "moved_from": seen_version}
    body = render_to_string("console/run_detail.html#snapshot", context, request)
    for card in ("actions", "live"):
        body += render_to_string(
            f"console/run_detail.html#{card}", {**context, "oob": True}, request
        )
    return conditional(request, HttpResponse(body))


@console_view(roles.OPERATE)
def artifact_view(request: HttpRequest, run_id: UUID, artifact_id: UUID) -> HttpResponse:
    """Show an artifact's content as escaped text (audited); binary content is not shown."""
    access = request.console
    run = run_reads.run_for_page(tenant=access.tenant, run_id=run_id)
    # The read is audited against this run: it must be one of the run's own artifacts.
    if not run_reads.run_names_artifact(run, artifact_id):
        raise Http404("No checkpoint of this run names that artifact.")
    artifact, data, error = None, b"", ""
    try:
        artifact, data = artifact_read(
            tenant=access.tenant, artifact_id=artifact_id, actor=access.actor, run_id=run.pk
        )
    except CairnError as exc:
        if exc.status == 404:
            raise Http404(exc.detail)
        error = exc.detail
    text, truncated = None, False
    if artifact is not None and (artifact.media_type.startswith(TEXT_MEDIA) or _is_utf8(data)):
        truncated = len(data) > VIEWER_MAX_BYTES
        text = data[:VIEWER_MAX_BYTES].decode("utf-8", errors="replace")
    context = {
        "run": run,
        "artifact": artifact,
        "text": text,
        "truncated": truncated,
        "viewer_max_bytes": VIEWER_MAX_BYTES,
        "error": error,
    }
    template = "console/artifact.html#viewer" if request.htmx else "console/artifact.html"
    return render(request, template, context)


@console_view(roles.OPERATE)
def operation_view(request: HttpRequest, run_id: UUID, operation_id: UUID) -> HttpResponse:
    """One side effect of the run: what was sent and what the provider answered (the
    demo's publication, say), decrypted and escaped; the read is audited."""
    access = request.console
    run = run_reads.run_for_page(tenant=access.tenant, run_id=run_id)
    read, error = None, ""
    try:
        read = operation_read(
            tenant=access.tenant, run_id=run.pk, operation_id=operation_id, actor=access.actor
        )
    except NotFound as exc:
        raise Http404(exc.detail)
    except MissingKeyError as exc:
        error = (
            f"This operation is sealed under encryption key '{exc.key_id}', which this "
            "server does not have: add it to CAIRN_ENCRYPTION_KEYS (or the key file)."
        )
    context = {"run": run, "read": read, "error": error}
    if read is not None:
        context["request_json"] = _pretty(read.request)
        context["result_json"] = _pretty(read.result)
    return render(request, "console/operation.html", context)


def _pretty(value: object) -> str | None:
    return None if value is None else json.dumps(value, indent=2, sort_keys=True)


@console_view(roles.OPERATE)
def evidence_download(request: HttpRequest, run_id: UUID) -> HttpResponse:
    """The run's signed evidence bundle as a file (the API's bytes; the export is
    audited). A refusal (no signing key, an envelope that cannot be decrypted) is its
    sentence, never a half-written file."""
    access = request.console
    try:
        bundle = run_evidence_export(tenant=access.tenant, run_id=run_id, actor=access.actor)
    except CairnError as exc:
        if exc.status == 404:
            raise Http404(exc.detail)
        return HttpResponse(exc.detail, status=exc.status, content_type="text/plain")
    response = HttpResponse(bundle.data, content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{bundle.filename}"'
    return response


def _is_utf8(data: bytes) -> bool:
    try:
        data[:VIEWER_MAX_BYTES].decode("utf-8")
    except UnicodeDecodeError:
        return False
    return b"\x00" not in data[:4096]
