"""The console's retention page (admins): policies with a live preview, and legal holds.

Thin: parse the form, call ``retention.policies`` / ``retention.services``, render.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from cairn.errors import CairnError, InvalidRequest, NotFound
from checkpoints.models import Run
from retention.models import RetentionPolicy
from retention.policies import (
    PERIODS,
    RUN_PREFIX_MIN,
    PolicyInput,
    legal_hold_set,
    policy_build,
    policy_scope_check,
    policy_scopes,
    policy_validate,
    retention_policy_delete,
    retention_policy_save,
    run_id_resolve,
)
from retention.services import retention_preview
from tenants import roles
from tenants.access import console_view
from tenants.models import AuditEvent, Tenant

LABELS = {
    "workflow_type": "Applies to",
    "intermediate_days": "Keep intermediate checkpoints of finished runs (days)",
    "model_context_days": "Keep model_context artifacts (days)",
    "failed_run_days": "Keep the full history of failed runs (days)",
    "run_expiry_days": "Delete whole runs (days after they ended)",
}
# The legal hold form names what it holds; a request without ``scope`` is a run's (never the
# tenant's), so no blank or missing field can widen a hold to the whole tenant.
HOLD_SCOPES = ("tenant", "run")


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


def _problems(errors: dict[str, str]) -> list[str]:
    return [f"{LABELS[k]}: {v}" if k in LABELS else v for k, v in errors.items()]


def _refused(exc: CairnError) -> dict[str, str]:
    """A refusal's field errors, or its sentence when it names no field."""
    return exc.fields or {"": exc.detail}


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
    refusal: dict[str, str] | None = None,
    confirm: dict[str, str] | None = None,
    status: int = 200,
) -> HttpResponse:
    """The whole page. ``data`` is the policy being edited (by default the saved one of the
    scope in ``?workflow_type=``); ``refusal`` (``where``, ``message`` and the typed
    ``run_id``/``reason``) is shown in the section whose request was refused."""
    tenant: Tenant = request.console.tenant
    tenant.refresh_from_db(fields=["legal_hold"])
    policies = list(RetentionPolicy.objects.filter(tenant=tenant).order_by("workflow_type"))
    scopes = policy_scopes(tenant=tenant)
    if data is None:
        chosen = (request.GET.get("workflow_type") or "").strip()
        if chosen and chosen not in scopes:
            refusal = {
                "where": "scope",
                "message": f"There is no workflow of type \u201c{chosen[:100]}\u201d in this "
                "tenant; the default policy is shown instead.",
            }
            status, chosen = 404, ""
        saved = next((p for p in policies if p.workflow_type == chosen), None)
        data = PolicyInput(
            workflow_type=chosen, **{n: getattr(saved, n) if saved else None for n in PERIODS}
        )
    preview = None
    if not errors:
        try:
            policy_validate(data)
            policy_scope_check(tenant=tenant, workflow_type=data.workflow_type)
            preview = retention_preview(policy_build(tenant=tenant, data=data))
        except InvalidRequest:
            preview = None
    context = {
        "tenant": tenant,
        "policies": policies,
        "data": data,
        "fields": _fields(data, errors or {}),
        "errors": _problems(errors or {}),
        "refusal": refusal or {},
        "workflow_types": scopes,
        "preview": preview,
        "held_runs": _held_runs(tenant),
        "tenant_hold": _last_hold_event(tenant, None) if tenant.legal_hold else None,
        "confirm": confirm or {},
        # The run id field asks the browser for what run_id_resolve accepts: a prefix of at
        # least RUN_PREFIX_MIN hex digits (dashes allowed after the first), or the full id.
        "run_prefix_min": RUN_PREFIX_MIN,
        "run_prefix_pattern": rf"\s*[0-9a-fA-F][0-9a-fA-F\-]{{{RUN_PREFIX_MIN - 1},35}}\s*",
    }
    return render(request, "retention/page.html", context, status=status)


def _last_hold_event(tenant: Tenant, run_id: object) -> AuditEvent | None:
    """The newest ``retention.legal_hold_on`` event of the tenant (``run_id`` None) or run."""
    events = AuditEvent.objects.filter(tenant=tenant, action="retention.legal_hold_on")
    events = events.filter(target="tenant") if run_id is None else events.filter(run_id=run_id)
    return events.order_by("-id").first()


def _held_runs(tenant: Tenant) -> list[Run]:
    """The held runs (50 newest), each with ``hold_event``: who put it on hold, when, why."""
    runs = list(
        Run.objects.filter(tenant=tenant, legal_hold=True)
        .only("pk", "workflow_type", "status", "updated_at")
        .order_by("-updated_at")[:50]
    )
    events: dict[object, AuditEvent] = {}
    for event in AuditEvent.objects.filter(
        tenant=tenant, action="retention.legal_hold_on", run_id__in=[r.pk for r in runs]
    ).order_by("id"):
        events[event.run_id] = event  # the newest wins
    for run in runs:
        run.hold_event = events.get(run.pk)
    return runs


@console_view(roles.ADMIN)
def retention_page(request: HttpRequest) -> HttpResponse:
    """GET: the policy of the scope in ``?workflow_type=``. POST: save the policy of the
    scope the form was loaded for (its hidden ``workflow_type``)."""
    if request.method != "POST":
        return _page(request)
    data, errors = _parse(request.POST)
    if errors:
        return _page(request, data=data, errors=errors, status=422)
    try:
        retention_policy_save(tenant=request.console.tenant, data=data, actor=request.console.actor)
    except InvalidRequest as exc:
        return _page(request, data=data, errors=_refused(exc), status=422)
    scope = data.workflow_type or "the default"
    messages.success(request, f"Retention policy for {scope} saved.")
    return redirect(f"{request.path}?{urlencode({'workflow_type': data.workflow_type})}")


@console_view(roles.ADMIN)
@require_POST
def retention_preview_partial(request: HttpRequest) -> HttpResponse:
    """The preview of the policy as currently typed (htmx), without saving anything.

    A refusal answers the same partial with the reason inside it, and a 422."""
    data, errors = _parse(request.POST)
    preview, problem = None, ""
    if errors:
        problem = "; ".join(_problems(errors))
    else:
        try:
            policy_validate(data)
            policy_scope_check(tenant=request.console.tenant, workflow_type=data.workflow_type)
            preview = retention_preview(policy_build(tenant=request.console.tenant, data=data))
        except InvalidRequest as exc:
            problem = "; ".join(_refused(exc).values())
    return render(
        request,
        "retention/_preview.html",
        {"preview": preview, "problem": problem, "data": data},
        status=422 if problem else 200,
    )


@console_view(roles.ADMIN)
@require_POST
def retention_policy_remove(request: HttpRequest) -> HttpResponse:
    workflow_type = (request.POST.get("workflow_type") or "").strip()
    scope = workflow_type or "the default"
    if request.POST.get("confirm") != "1":
        # Removing a policy changes what is deleted: say what, and ask once more.
        fallback = (
            "the runs of this workflow fall back to the default policy"
            if workflow_type
            else "runs without a policy of their own are then kept forever"
        )
        return _page(
            request,
            confirm={
                "kind": "remove",
                "workflow_type": workflow_type,
                "message": f"Remove the retention policy for {scope[:100]}? After that, "
                f"{fallback}.",
            },
        )
    if not retention_policy_delete(
        tenant=request.console.tenant, workflow_type=workflow_type, actor=request.console.actor
    ):
        message = f"There is no saved policy for {scope[:100]} to remove; nothing was changed."
        return _page(request, refusal={"where": "remove", "message": message}, status=404)
    messages.success(request, f"Policy for {scope} removed.")
    return redirect("console:retention")


@console_view(roles.ADMIN)
@require_POST
def retention_hold(request: HttpRequest) -> HttpResponse:
    """Put the tenant (``scope=tenant``) or one run (``scope=run``, the default, with
    ``run_id``) on legal hold (``on=1``) or release it (``on=0``)."""
    scope = request.POST.get("scope") or "run"
    on = request.POST.get("on")
    reason = (request.POST.get("reason") or "").strip()[:2000]
    raw_run = (request.POST.get("run_id") or "").strip()
    # Where the page shows a refusal: by the typed run id, by the list of held runs (a
    # release), by the tenant's hold, or at the top for a form it does not understand.
    where = "page"
    if scope == "tenant":
        where = "tenant"
    elif scope == "run" and on in ("0", "1"):
        where = "release" if on == "0" else "run"
    try:
        if scope not in HOLD_SCOPES or on not in ("0", "1"):
            raise InvalidRequest("The legal hold form was not understood; nothing was changed.")
        run_id = (
            None
            if scope == "tenant"
            else run_id_resolve(tenant=request.console.tenant, run_id=raw_run)
        )
        confirmed = request.POST.get("confirm") == "1"
        if on == "0" and (not confirmed or not reason):
            # A release lets retention delete again: it is confirmed, with a reason.
            what = "the tenant" if run_id is None else f"run {str(run_id)[:8]}"
            return _page(
                request,
                confirm={
                    "kind": "release",
                    "scope": scope,
                    "run_id": "" if run_id is None else str(run_id),
                    "reason": reason,
                    "error": "Give a reason: it is recorded in the audit log." if confirmed else "",
                    "message": f"Release {what} from legal hold? The retention policies then "
                    "apply to it again, and what they say is due is deleted on the next pass.",
                },
                status=422 if confirmed else 200,
            )
        if not reason:
            raise InvalidRequest(
                "Give a reason: it is recorded with the legal hold in the audit log. Nothing "
                "was changed."
            )
        legal_hold_set(
            tenant=request.console.tenant,
            run_id=run_id,
            on=on == "1",
            reason=reason,
            actor=request.console.actor,
        )
    except CairnError as exc:
        refusal = {
            "where": where,
            "message": exc.detail,
            "run_id": raw_run[:100],
            "reason": reason,
        }
        return _page(request, refusal=refusal, status=404 if isinstance(exc, NotFound) else 422)
    what = "The tenant" if run_id is None else f"Run {str(run_id)[:8]}"
    state = "on legal hold" if on == "1" else "released from legal hold"
    messages.success(request, f"{what} is {state}.")
    return redirect("console:retention")
