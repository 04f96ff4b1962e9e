"""The health page: what an admin watches to catch stuck, looping or orphaned work."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from checkpoints.models import ACTIVE_STATUSES, Run, RunStatus
from console.conditional import conditional
from console.run_reads import optional_selector
from console.selectors import stalled_operations, status_and_paused_counts
from runtime.heartbeats import workers_liveness, workers_tally
from runtime.queues import queues_backlog, runs_waiting_retry
from tenants import roles
from tenants.access import console_view

LIST_LIMIT = 20
DEFAULT_RESTORES = 3


def _restore_threshold(request: HttpRequest) -> int:
    try:
        return max(0, int(request.GET.get("restored_more_than", DEFAULT_RESTORES)))
    except ValueError:
        return DEFAULT_RESTORES


@console_view(roles.OPERATE)
def health(request: HttpRequest) -> HttpResponse:
    tenant = request.console.tenant
    now = timezone.now()
    runs = Run.objects.filter(tenant=tenant)
    counts, paused = status_and_paused_counts(runs)
    active = runs.filter(status__in=ACTIVE_STATUSES)
    # The active runs whose head checkpoint is oldest: the stuck-est runs (the run's row
    # says when its head was written; a partial index walks them oldest first).
    oldest = list(
        active.filter(latest_checkpoint_at__isnull=False)
        .only("id", "checkpoint_sequence", "state", "latest_checkpoint_at")
        .order_by("latest_checkpoint_at")[:LIST_LIMIT]
    )
    threshold = _restore_threshold(request)
    restored = runs.filter(restore_count__gt=threshold)
    stalled = stalled_operations(tenant).defer("request_sealed", "result_sealed")
    expired_selector = optional_selector("approvals.selectors", "requests_for_tenant")
    expired = (
        list(expired_selector(tenant, status="expired").order_by("-expires_at")[:LIST_LIMIT])
        if expired_selector
        else None
    )
    # Live or dead by the age of each worker's last beat, as the rescue judges it.
    workers = workers_liveness(limit=LIST_LIMIT)
    live, dead = workers_tally()
    retrying = runs_waiting_retry(tenant=tenant)
    context = {
        "counts": [(s, label, counts[s]) for s, label in RunStatus.choices],
        "total": sum(counts.values()),
        "paused_count": paused,
        "oldest": oldest,
        "restore_threshold": threshold,
        "restored": list(restored.order_by("-restore_count", "-pk")[:LIST_LIMIT]),
        "restored_count": restored.count(),
        "stalled": list(stalled.order_by("created_at")[:LIST_LIMIT]),
        "stalled_count": stalled.count(),
        "expired_approvals": expired,
        "workers": workers,
        "workers_recent": live,
        "workers_dead": dead,
        "queues": queues_backlog(tenant=tenant, now=now),
        "retrying": list(retrying[:LIST_LIMIT]),
        "retrying_count": counts[RunStatus.WAITING_RETRY],
        "workers_clock_off": sum(1 for w in workers if w.clock_off),
        "worker_dead_seconds": settings.CAIRN_WORKER_DEAD_SECONDS,
        "clock_skew_limit": settings.CAIRN_CLOCK_SKEW_LIMIT_SECONDS,
        "now": now,
        "refresh_seconds": settings.CAIRN_CONSOLE_REFRESH_SECONDS,
    }
    if request.htmx:
        # The page's poll: its cards alone, a 304 while nothing changed.
        return conditional(request, render(request, "console/health.html#cards", context))
    return render(request, "console/health.html", context)
