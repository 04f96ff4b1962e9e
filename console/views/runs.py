"""The runs page: filters in the URL, keyset pages, counts per status, live rows."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime

from django.conf import settings
from django.http import HttpRequest, HttpResponse, QueryDict
from django.shortcuts import render
from django.utils import timezone

from checkpoints.models import Run, RunStatus
from console.conditional import conditional
from console.forms import RunFilterForm
from console.selectors import (
    SORTS,
    keyset_page,
    runs_matching,
    status_and_paused_counts,
    with_row_facts,
)
from tenants import roles
from tenants.access import console_view

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


# What the rows poll carries besides the page's filters.
ROWS_PARAMS = ("ids", "cursor", "new_after", "live")


def _live_new(filters: dict, cursor: str | None) -> bool:
    """New runs join the rows live only on the first page in newest-first order: elsewhere
    they would not belong on the page (and the page would jump under the reader)."""
    return not cursor and filters.get("sort") == "-created"


def _rows_query(params: QueryDict, rows: Iterable[Run], live_new: bool) -> str:
    """The rows poll's query string: the page's filters, the visible ids and, when new runs
    may join, the creation time of the newest row seen."""
    query = params.copy()
    for name in ROWS_PARAMS:
        query.pop(name, None)
    rows = list(rows)
    query["ids"] = ",".join(str(run.pk) for run in rows)
    if live_new:
        newest = max((run.created_at for run in rows), default=None) or timezone.now()
        query["new_after"] = newest.isoformat()
        query["live"] = "1"
    return query.urlencode()


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
        "current_paused": bool(filters.get("paused")),
        "sort_headers": _sort_headers(filters["sort"]),
        "refresh_seconds": settings.CAIRN_CONSOLE_REFRESH_SECONDS,
    }
    live_new = _live_new(filters, request.GET.get("cursor"))
    context.update(live_new=live_new, rows_query=_rows_query(request.GET, page.rows, live_new))
    return render(request, "console/runs.html", context)


@console_view(roles.OPERATE)
def run_counts(request: HttpRequest) -> HttpResponse:
    """Runs per status under the page's filters, except the status filter itself, so each
    chip says what clicking it would show."""
    tenant = request.console.tenant
    filters = RunFilterForm(request.GET or None, tenant=tenant).filters()
    counts, paused = status_and_paused_counts(
        runs_matching(tenant, {**filters, "status": "", "paused": False})
    )
    context = {
        "counts": counts,
        "paused_count": paused,
        "current_paused": bool(filters.get("paused")),
        "total": sum(counts.values()),
        "status_choices": [(status, label, counts[status]) for status, label in RunStatus.choices],
        "current_status": filters.get("status") or "",
        "refresh_seconds": settings.CAIRN_CONSOLE_REFRESH_SECONDS,
    }
    return conditional(request, render(request, "console/runs.html#counts", context))


@console_view(roles.OPERATE)
def run_rows(request: HttpRequest) -> HttpResponse:
    """Fresh copies of the rows the page shows (htmx polls this), in the page's order.

    Only the visible rows are refreshed, so a page never jumps under the reader; on the
    first page in newest-first order (``live``), runs matching the page's filters that were
    created after the newest row seen (``new_after``) are added at the top.
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
    live_new = request.GET.get("live") == "1"
    after = _parse_time(request.GET.get("new_after", "")) if live_new else None
    if after is not None:
        filters = RunFilterForm(request.GET, tenant=tenant).filters()
        fresh = list(
            with_row_facts(
                runs_matching(tenant, filters).filter(created_at__gt=after).exclude(pk__in=ids),
                tenant,
            ).order_by("-created_at", "-id")[:PAGE_SIZE]
        )
        for run in fresh:
            run.is_new = True
        rows = (fresh + rows)[:MAX_REFRESH_IDS]
    context = {
        "rows": rows,
        "live_new": live_new,
        "rows_query": _rows_query(request.GET, rows, live_new),
        "refresh_seconds": settings.CAIRN_CONSOLE_REFRESH_SECONDS,
    }
    return conditional(request, render(request, "console/runs.html#rows", context))


def _parse_time(raw: str) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(raw[:40])
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None
