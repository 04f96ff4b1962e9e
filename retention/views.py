"""The console's retention page (admins): policies with a live preview, and legal holds.

Thin: parse the form, call ``retention.policies`` / ``retention.services``, render.
"""

from __future__ import annotations

from uuid import UUID

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from checkpoints.errors import CairnError, InvalidRequest
from checkpoints.models import Run
from console.access import console_view
from retention.models import RetentionPolicy
from retention.policies import (
    PERIODS,
    PolicyInput,
    legal_hold_set,
    policy_build,
    policy_validate,
    retention_policy_delete,
    retention_policy_save,
)
from retention.services import retention_preview
from tenants import roles
from tenants.models import Tenant

LABELS = {
    "intermediate_days": "Keep intermediate checkpoints of finished runs (days)",
    "model_context_days": "Keep model_context artifacts (days)",
    "failed_run_days": "Keep the full history of failed runs (days)",
    "run_expiry_days": "Delete whole runs (days after they ended)",
}


def _parse(post: dict) -> tuple[PolicyInput, dict[str, str]]:
    """The submitted policy, and the fields that are not numbers. Blank means forever."""
    errors: dict[str, str] = {}
    values: dict[str, int | None] = {}
    for name in PERIODS:
        raw = (post.get(name) or "").strip()
        if not raw:
            values[name] = None
            continue
        try:
            values[name] = int(raw)
        except ValueError:
            errors[name] = "a whole number of days, or empty for forever"
            values[name] = None
    workflow_type = (post.get("workflow_type") or "").strip()
    return PolicyInput(workflow_type=workflow_type, **values), errors


def _workflow_types(tenant: Tenant) -> list[str]:
    return sorted(
        set(Run.objects.filter(tenant=tenant).values_list("workflow_type", flat=True).distinct())
        | set(
            RetentionPolicy.objects.filter(tenant=tenant)
            .exclude(workflow_type="")
            .values_list("workflow_type", flat=True)
        )
    )


def _fields(data: PolicyInput, errors: dict[str, str]) -> list[dict[str, object]]:
    return [
        {"name": n, "label": LABELS[n], "value": getattr(data, n), "error": errors.get(n)}
        for n in PERIODS
    ]


def _page(
    request: HttpRequest,
    *,
    data: PolicyInput | None = None,
    errors: dict[str, str] | None = None,
    status: int = 200,
) -> HttpResponse:
    tenant: Tenant = request.console.tenant
    tenant.refresh_from_db(fields=["legal_hold"])
    policies = list(RetentionPolicy.objects.filter(tenant=tenant).order_by("workflow_type"))
    if data is None:
        chosen = request.GET.get("workflow_type", "")
        saved = next((p for p in policies if p.workflow_type == chosen), None)
        data = PolicyInput(
            workflow_type=chosen, **{n: getattr(saved, n) if saved else None for n in PERIODS}
        )
    preview = None
    if not errors:
        try:
            policy_validate(data)
            preview = retention_preview(policy_build(tenant=tenant, data=data))
        except InvalidRequest:
            preview = None
    context = {
        "tenant": tenant,
        "policies": policies,
        "data": data,
        "fields": _fields(data, errors or {}),
        "errors": errors or {},
        "workflow_types": _workflow_types(tenant),
        "preview": preview,
        "held_runs": list(
            Run.objects.filter(tenant=tenant, legal_hold=True)
            .only("pk", "workflow_type", "status", "updated_at")
            .order_by("-updated_at")[:50]
        ),
    }
    return render(request, "retention/page.html", context, status=status)


@console_view(roles.ADMIN)
def retention_page(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _page(request)
    data, errors = _parse(request.POST)
    if errors:
        return _page(request, data=data, errors=errors, status=422)
    try:
        retention_policy_save(tenant=request.console.tenant, data=data, actor=request.console.actor)
    except InvalidRequest as exc:
        return _page(request, data=data, errors=exc.fields or {"": exc.detail}, status=422)
    scope = data.workflow_type or "the default"
    messages.success(request, f"Retention policy for {scope} saved.")
    return redirect(f"{request.path}?workflow_type={data.workflow_type}")


@console_view(roles.ADMIN)
@require_POST
def retention_preview_partial(request: HttpRequest) -> HttpResponse:
    """The preview of the policy as currently typed (htmx), without saving anything."""
    data, errors = _parse(request.POST)
    preview, problem = None, ""
    if errors:
        problem = "; ".join(f"{LABELS[k]}: {v}" for k, v in errors.items())
    else:
        try:
            policy_validate(data)
            preview = retention_preview(policy_build(tenant=request.console.tenant, data=data))
        except InvalidRequest as exc:
            problem = "; ".join((exc.fields or {"": exc.detail}).values())
    return render(
        request, "retention/_preview.html", {"preview": preview, "problem": problem, "data": data}
    )


@console_view(roles.ADMIN)
@require_POST
def retention_policy_remove(request: HttpRequest) -> HttpResponse:
    workflow_type = (request.POST.get("workflow_type") or "").strip()
    if retention_policy_delete(
        tenant=request.console.tenant, workflow_type=workflow_type, actor=request.console.actor
    ):
        messages.success(request, f"Policy for {workflow_type or 'the default'} removed.")
    return redirect("console:retention")


@console_view(roles.ADMIN)
@require_POST
def retention_hold(request: HttpRequest) -> HttpResponse:
    """Put the tenant or one run on legal hold, or release it."""
    on = request.POST.get("on") == "1"
    reason = (request.POST.get("reason") or "").strip()[:2000]
    raw_run = (request.POST.get("run_id") or "").strip()
    try:
        run_id = UUID(raw_run) if raw_run else None
    except ValueError:
        messages.error(request, f"'{raw_run}' is not a run id.")
        return redirect("console:retention")
    try:
        legal_hold_set(
            tenant=request.console.tenant,
            run_id=run_id,
            on=on,
            reason=reason,
            actor=request.console.actor,
        )
    except CairnError as exc:
        messages.error(request, exc.detail)
        return redirect("console:retention")
    what = f"Run {str(run_id)[:8]}" if run_id else "The tenant"
    messages.success(request, f"{what} is {'on legal hold' if on else 'released from legal hold'}.")
    return redirect("console:retention")
