"""The runs page: filters in the URL, keyset pages, counts per status, live rows."""

from __future__ import annotations

import uuid

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from checkpoints.models import Run, RunStatus
from console.access import console_view
from console.forms import RunFilterForm
from console.selectors import (
    SORTS,
    keyset_page,
    runs_matching,
    status_counts,
    with_row_facts,
)
from tenants import roles

PAGE_SIZE = 50
MAX_REFRESH_IDS = 200


def _sort_headers(current: str) -> dict[str, dict[str, str]]:
    """For each sortable column: the sort its header link sets and its aria-sort now."""
    headers = {}
    for key in SORTS:
        if current == f"-{key}":
            headers[key] = {"next": key, "aria": "descending"}
        elif current == key:
            headers[key] = {"next": f"-{key}", "aria": "ascending"}
        else:
            headers[key] = {"next": f"-{key}", "aria": "none"}
    return headers


@console_view(roles.OPERATE)
def runs(request: HttpRequest) -> HttpResponse:
    tenant = request.console.tenant
    form = RunFilterForm(request.GET or None, tenant=tenant)
    filters = form.filters()
    page = keyset_page(
        with_row_facts(runs_matching(tenant, filters), tenant),
        sort=filters["sort"],
        cursor=request.GET.get("cursor"),
        size=PAGE_SIZE,
    )
    context = {
        "form": form,
        "page": page,
        "rows": page.rows,
        "counts": None,  # loaded by htmx from run_counts
        "status_choices": [(status, label, None) for status, label in RunStatus.choices],
        "current_status": filters.get("status") or "",
        "sort_headers": _sort_headers(filters["sort"]),
        "refresh_seconds": settings.CAIRN_CONSOLE_REFRESH_SECONDS,
    }
    return render(request, "console/runs.html", context)


@console_view(roles.OPERATE)
def run_counts(request: HttpRequest) -> HttpResponse:
    """Runs per status under the page's filters, except the status filter itself, so each
    chip says what clicking it would show."""
    tenant = request.console.tenant
    filters = RunFilterForm(request.GET or None, tenant=tenant).filters()
    counts = status_counts(runs_matching(tenant, {**filters, "status": ""}))
    context = {
        "counts": counts,
        "total": sum(counts.values()),
        "status_choices": [(status, label, counts[status]) for status, label in RunStatus.choices],
        "current_status": filters.get("status") or "",
    }
    return render(request, "console/runs.html#counts", context)


@console_view(roles.OPERATE)
def run_rows(request: HttpRequest) -> HttpResponse:
    """Fresh copies of the rows the page shows (htmx polls this), in the page's order.

    Only the visible rows are refreshed, so a page never jumps under the reader; new
    runs appear on the next load.
    """
    ids: list[uuid.UUID] = []
    for raw in request.GET.get("ids", "").split(",")[:MAX_REFRESH_IDS]:
        try:
            ids.append(uuid.UUID(raw))
        except ValueError:
            continue
    tenant = request.console.tenant
    found = {
        run.pk: run for run in with_row_facts(Run.objects.filter(tenant=tenant, pk__in=ids), tenant)
    }
    rows = [found[pk] for pk in ids if pk in found]
    return render(
        request,
        "console/runs.html#rows",
        {"rows": rows, "refresh_seconds": settings.CAIRN_CONSOLE_REFRESH_SECONDS},
    )
