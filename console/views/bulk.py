"""Bulk actions in the console: the runs the list's filter selects (or the ticked ones) →
the action and a reason → a dry run (the count, each refusal and its reason) → confirm →
a page whose progress bar follows the background work, then the summary of refusals.

The selection travels in the query string, as the runs list's filters do: ``run=<id>`` for
each ticked run, otherwise the list's own filters, read by the list's own form and
``console.selectors.runs_matching``. The rules and the work are ``runtime.services.bulk``'s.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.conf import settings
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse

from cairn.errors import CairnError, NotFound
from checkpoints.models import BulkActionRunOutcome, BulkActionStatus
from console.forms import RunFilterForm
from console.forms_actions import BulkActionForm
from console.selectors import runs_matching
from runtime.services.bulk import (
    LABELS,
    bulk_action_get,
    bulk_action_plan,
    bulk_action_refusals,
    bulk_action_start,
    bulk_actions_of,
    bulk_max_runs,
    bulk_selection,
)
from tenants import roles
from tenants.access import console_view

REFUSALS_PER_PAGE = 50
HISTORY_PER_PAGE = 50
# The dry run lists this many refused runs under each reason (the count says how many).
SAMPLE_PER_REASON = 20


def _selection(request: HttpRequest) -> tuple[list[Any], dict[str, Any], str]:
    """(run ids, the selection as recorded, a sentence saying how they were chosen).
    Raises InvalidRequest past the cap."""
    ticked = request.GET.getlist("run")
    if ticked:
        # More than the cap is the service's refusal to give; one more is enough to get it.
        return ticked[: bulk_max_runs() + 1], {"ticked": True}, "the runs you ticked"
    tenant = request.console.tenant
    form = RunFilterForm(request.GET or None, tenant=tenant)
    filters = form.filters()
    ids = bulk_selection(runs_matching(tenant, filters))
    given = {
        name: request.GET[name]
        for name in form.fields
        if name != "sort" and request.GET.get(name) and not form.errors.get(name)
    }
    described = (
        "the runs matching the filters ("
        + "; ".join(f"{form.fields[k].label or k}: {v}" for k, v in given.items())
        + ")"
        if given
        else "every run (no filter)"
    )
    return ids, {"filter": given}, described


@console_view(roles.OPERATE)
def bulk_new(request: HttpRequest) -> HttpResponse:
    tenant = request.console.tenant
    context: dict[str, Any] = {"query": request.GET.urlencode(), "step": "form"}
    try:
        ids, selection, described = _selection(request)
    except CairnError as exc:
        context.update(selection_error=exc.detail)
        return render(request, "console/bulk_new.html", context, status=400)
    form = BulkActionForm(request.POST or None)
    context.update(form=form, count=len(ids), described=described)
    if request.method != "POST" or not form.is_valid() or "edit" in request.POST:
        return render(request, "console/bulk_new.html", context)
    data = form.cleaned_data
    try:
        if request.POST.get("confirm") == "1":
            bulk = bulk_action_start(
                tenant=tenant,
                actor=request.console.actor,
                action=data["action"],
                reason=data["reason"],
                run_ids=ids,
                selection=selection,
                step=data.get("step") or "",
            )
            messages.success(request, f"{LABELS[bulk.action]} of {bulk.total} runs queued.")
            return redirect("console:bulk_detail", bulk_action_id=bulk.pk)
        plan = bulk_action_plan(
            tenant=tenant, action=data["action"], run_ids=ids, step=data.get("step") or ""
        )
    except CairnError as exc:
        for name, problem in (exc.fields or {}).items():
            if name in form.fields:
                form.add_error(name, problem if name != "reason" else exc.detail)
        context.update(error=exc.detail)
        return render(request, "console/bulk_new.html", context)
    by_reason = {}
    for pk, reason in plan.refusals:
        by_reason.setdefault(reason, []).append(pk)
    context.update(
        step="confirm",
        plan=plan,
        label=LABELS[plan.action],
        refusal_groups=[
            (reason, len(pks), pks[:SAMPLE_PER_REASON])
            for reason, pks in sorted(by_reason.items(), key=lambda item: -len(item[1]))
        ],
    )
    return render(request, "console/bulk_new.html", context)


def _bulk(request: HttpRequest, bulk_action_id: UUID):  # noqa: ANN202
    try:
        return bulk_action_get(tenant=request.console.tenant, bulk_action_id=bulk_action_id)
    except NotFound as exc:
        raise Http404(exc.detail)


def _progress_context(request: HttpRequest, bulk: Any) -> dict[str, Any]:
    processed = bulk.done + bulk.refused
    return {
        "bulk": bulk,
        "label": LABELS.get(bulk.action, bulk.action),
        "processed": processed,
        "percent": (100 * processed // bulk.total) if bulk.total else 100,
        "finished": bulk.status == BulkActionStatus.FINISHED,
        "refresh_seconds": settings.CAIRN_CONSOLE_REFRESH_SECONDS,
    }


@console_view(roles.OPERATE)
def bulk_detail(request: HttpRequest, bulk_action_id: UUID) -> HttpResponse:
    bulk = _bulk(request, bulk_action_id)
    context = _progress_context(request, bulk)
    refusals = Paginator(bulk_action_refusals(bulk), REFUSALS_PER_PAGE)
    context.update(
        refusals=refusals.get_page(request.GET.get("page")),
        pending=bulk.runs.filter(outcome=BulkActionRunOutcome.PENDING).count(),
        url=reverse("console:bulk_detail", args=[bulk.pk]),
    )
    return render(request, "console/bulk_detail.html", context)


@console_view(roles.OPERATE)
def bulk_progress(request: HttpRequest, bulk_action_id: UUID) -> HttpResponse:
    """The progress card alone (htmx polls it until the action is finished)."""
    bulk = _bulk(request, bulk_action_id)
    context = _progress_context(request, bulk)
    response = render(request, "console/bulk_detail.html#progress", context)
    if context["finished"] and request.htmx and request.GET.get("live") == "1":
        # The whole page once: the summary of refusals appears with the final count.
        response["HX-Refresh"] = "true"
    return response


@console_view(roles.OPERATE)
def bulk_history(request: HttpRequest) -> HttpResponse:
    """The tenant's past bulk actions, newest first, a page at a time."""
    page = Paginator(bulk_actions_of(tenant=request.console.tenant), HISTORY_PER_PAGE).get_page(
        request.GET.get("page")
    )
    for bulk in page:
        bulk.label = LABELS.get(bulk.action, bulk.action)
    return render(request, "console/bulk_history.html", {"actions": page})
