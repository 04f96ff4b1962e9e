"""Operator actions in the console: form → confirmation of what will happen → the service.

Every action form carries the run version the page showed. The confirmation step and the
service both refuse a version that moved, with a sentence and a link to reload, so an
operator never acts on a run they have not seen. Views only parse, call services and
render; the rules live in ``checkpoints.services``, each action's parts in
``console.action_specs``.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django_htmx.http import HttpResponseClientRedirect

from cairn.errors import CairnError, ConcurrentCheckpointWrite, NotFound
from checkpoints.models import ExternalOperation, Run, RunStatus
from console import run_reads
from console.action_specs import ACTIONS, Spec, outcome_spec
from runtime.services.actions import grant_refusal, resume_refusal
from runtime.services.cancel import cancel_refusal
from runtime.services.pause import pause_refusal, unpause_refusal
from runtime.services.retry import retry_run_refusal
from tenants import roles
from tenants.access import ConsoleAccess, console_view


# --- which actions a run offers (no queries: the run page's operations are passed in) --------
def actions_available(run: Run, operations: list[ExternalOperation]) -> dict[str, Any]:
    status = run.status
    # Each offer asks the function the service raises its refusal from (one rule, one place):
    # the panel never offers what the server would refuse. Rows only, no query.
    offered = {
        # A worker run waiting for approval is decided by its request, not resumed here.
        "resume": resume_refusal(run) is None and status != RunStatus.WAITING_APPROVAL,
        "cancel": cancel_refusal(run) is None,
        "retry": retry_run_refusal(run) is None,
        "fork": run.checkpoint_sequence > 0,
        "pause": not pause_refusal(run),
        "unpause": not unpause_refusal(run),
        "grant_budget": grant_refusal(run) is None,
    }
    no_worker = status in (RunStatus.CANCELLING, RunStatus.PAUSED_FOR_REVIEW, RunStatus.FAILED)
    # Pending and reserved ones are a worker's business while one may still send them; a
    # cancelling run waits for them, also when their provider cannot be asked.
    ambiguous = [
        op
        for op in operations
        if op.status == "unknown"
        or (op.status == "pending" and (no_worker or getattr(op, "is_stalled", False)))
        or (op.status == "reserved" and no_worker)
    ]
    return {
        "actions": [(name, ACTIONS[name].label) for name, ok in offered.items() if ok],
        "ambiguous_operations": ambiguous,
    }


# --- the flow -------------------------------------------------------------------------------
def _stale_message(seen: int, run: Run) -> str:
    return (
        f"This run changed since you loaded the page: you saw version {seen}, it is now at "
        f"version {run.version}. Nothing was done. Reload the run to see what changed, then "
        "decide again."
    )


def _render(request: HttpRequest, context: dict[str, Any]) -> HttpResponse:
    template = "console/actions/action.html"
    if request.htmx:
        template += "#body"
    return render(request, template, context)


def _flow(
    request: HttpRequest,
    *,
    run: Run,
    spec: Spec,
    url: str,
    form_kwargs: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> HttpResponse:
    access: ConsoleAccess = request.console
    form_kwargs = {"run": run, **(form_kwargs or {})}
    context: dict[str, Any] = {"run": run, "spec": spec, "url": url, **(extra or {})}
    if request.method == "GET":
        initial = {"version": request.GET.get("version") or run.version}
        if request.GET.get("from_sequence"):
            initial["from_sequence"] = request.GET["from_sequence"]
        if request.GET.get("step"):
            initial["step"] = request.GET["step"]
        context.update(step="form", form=spec.form(initial=initial, **form_kwargs))
        return _render(request, context)
    form = spec.form(request.POST, **form_kwargs)
    context.update(step="form", form=form)
    seen = request.POST.get("version", "")
    if seen.isdigit() and len(seen) < 19 and int(seen) != run.version:
        # Refused before anything else is checked: the form was made for another version.
        context.update(error=_stale_message(int(seen), run), stale=True)
        return _render(request, context)
    if not form.is_valid() or "edit" in request.POST:
        return _render(request, context)
    data = form.cleaned_data
    if data["version"] != run.version:
        context.update(error=_stale_message(data["version"], run), stale=True)
        return _render(request, context)
    if request.POST.get("confirm") != "1":
        try:
            context.update(step="confirm", summary=spec.summary(run, data, access))
        except CairnError as exc:
            context.update(error=exc.detail)
        return _render(request, context)
    try:
        shown, message = spec.perform(run, data, access)
    except ConcurrentCheckpointWrite:
        run.refresh_from_db()
        context.update(error=_stale_message(data["version"], run), stale=True)
        return _render(request, context)
    except CairnError as exc:
        if isinstance(exc, NotFound):
            raise Http404(exc.detail)
        context.update(error=exc.detail)
        return _render(request, context)
    messages.success(request, message)
    target = reverse("console:run_detail", args=[shown.pk])
    return HttpResponseClientRedirect(target) if request.htmx else redirect(target)


@console_view(roles.OPERATE)
def run_action(request: HttpRequest, run_id: UUID, action: str) -> HttpResponse:
    spec = ACTIONS.get(action)
    if spec is None:
        raise Http404("No such action.")
    run = run_reads.run_for_page(tenant=request.console.tenant, run_id=run_id)
    url = reverse("console:run_action", args=[run.pk, action])
    return _flow(request, run=run, spec=spec, url=url)


@console_view(roles.OPERATE)
def operation_outcome(request: HttpRequest, run_id: UUID, key: str) -> HttpResponse:
    run = run_reads.run_for_page(tenant=request.console.tenant, run_id=run_id)
    operation = ExternalOperation.objects.filter(
        tenant=request.console.tenant, run=run, idempotency_key=key
    ).first()
    if operation is None:
        raise Http404("The run has no such operation.")
    url = reverse("console:operation_outcome", args=[run.pk, key])
    return _flow(
        request,
        run=run,
        spec=outcome_spec(operation),
        url=url,
        extra={"operation": operation},
    )
