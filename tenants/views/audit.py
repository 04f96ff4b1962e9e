"""The audit log page (operators and admins: on call, an operator reads what happened):
filter, page through, export as CSV or JSON lines."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, QueryDict, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from tenants import roles
from tenants.access import console_view
from tenants.audit import (
    audit_actions,
    audit_csv,
    audit_events,
    audit_export_record,
    audit_jsonl,
    audit_page,
)
from tenants.forms import AuditFilterForm

PAGE_SIZE = 50
EXPORTS = {
    "csv": (audit_csv, "text/csv; charset=utf-8"),
    "jsonl": (audit_jsonl, "application/x-ndjson"),
}


def _filters(request: HttpRequest) -> tuple[AuditFilterForm, dict]:
    """The form, and the filters it could read: an invalid one shows its error and is left
    out; the others still apply."""
    form = AuditFilterForm(request.GET or None, actions=audit_actions(request.console.tenant))
    if not form.is_bound:
        return form, {}
    form.is_valid()
    # Django keeps the cleaned value of every field that passed, and only those.
    return form, dict(form.cleaned_data)


def _query(form: AuditFilterForm) -> str:
    """The query string of the filters that apply (for the pager and the export links)."""
    query = QueryDict(mutable=True)
    if form.is_bound:
        for name in form.fields:
            value = form.data.get(name, "")
            if name not in form.errors and value:
                query[name] = value
    return query.urlencode()


def _before(request: HttpRequest) -> int | None:
    raw = request.GET.get("before", "")
    return int(raw) if raw.isdigit() and len(raw) < 19 else None


@require_GET
@console_view(roles.OPERATE)
def audit_log(request: HttpRequest) -> HttpResponse:
    form, filters = _filters(request)
    rows = audit_events(tenant=request.console.tenant, filters=filters)
    page = audit_page(rows, before=_before(request), size=PAGE_SIZE)
    context = {
        "form": form,
        "page": page,
        "filter_query": _query(form),
        "left_out": [form[name].label for name in form.fields if name in form.errors],
        "paged": _before(request) is not None,
    }
    return render(request, "tenants/audit.html", context, status=400 if form.errors else 200)


@require_GET
@console_view(roles.OPERATE)
def audit_export(request: HttpRequest, export_format: str) -> HttpResponse:
    form, filters = _filters(request)
    if form.errors:
        # An export never leaves a filter out: it would hand over more than was asked for.
        return render(
            request,
            "tenants/audit.html",
            {"form": form, "page": None, "filter_query": "", "export_refused": True},
            status=400,
        )
    tenant = request.console.tenant
    audit_export_record(
        tenant=tenant, actor=request.console.actor, export_format=export_format, filters=filters
    )
    produce, content_type = EXPORTS[export_format]
    stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
    response = StreamingHttpResponse(
        produce(audit_events(tenant=tenant, filters=filters)), content_type=content_type
    )
    response["Content-Disposition"] = (
        f'attachment; filename="cairn-audit-{tenant.slug}-{stamp}.{export_format}"'
    )
    response["Cache-Control"] = "no-store"
    return response
