"""Reviewers are told: when a request is raised, and once more when it is about to expire
(``notifications_remind_due``, less than ``CAIRN_APPROVAL_REMIND_SECONDS`` left), each
person who may decide it gets an email (Django's email backend) and/or a chat message (a
Slack-compatible incoming webhook, through ``cairn.outbound``), as their preferences say,
each linking to the review page.

The path is the outbox's, so it is at least once and never twice:

1. ``request_insert`` writes an ``approval.notify`` outbox message in the request's own
   transaction: if the request exists, so does the intent to tell its reviewers.
2. ``notifications_plan`` (its task) picks the recipients, the people whose queue shows
   the request (``review_queue``: the declared reviewers, no four-eyes conflict), and
   inserts one ``ApprovalNotification`` per request, recipient, channel and event (a
   unique key) with an ``approval.deliver`` outbox message per new row, in one
   transaction. Planned again (a republished message), it finds the rows and adds nothing.
3. ``notification_deliver`` claims the row with one conditional UPDATE (unsent and not
   claimed by a live deliverer), sends, and marks it sent. A second delivery of the same
   row finds it sent or claimed and sends nothing. A failure releases the claim, records
   the reason and schedules the next attempt through the outbox (backoff), at most
   ``MAX_ATTEMPTS`` times. A deliverer that dies between the server accepting the message
   and the mark leaves a claim that expires: that message is sent again (the email keeps
   its ``Message-ID``, so a mail client shows it once).

The link opens the review page; it decides nothing (a decision is a POST with the form's
CSRF token and the sha256 shown on that page).
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta
from uuid import UUID

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.mail import EmailMessage, get_connection
from django.db import transaction
from django.db.models import F, Q
from django.urls import reverse
from django.utils import timezone

from approvals.models import (
    ApprovalNotification,
    ApprovalRequest,
    ApprovalStatus,
    NotificationChannel,
    NotificationPreference,
)
from approvals.selectors import review_queue
from approvals.services.preferences import chat_url_of
from approvals.services.standing import quorum_progress, reviewers_label
from cairn.outbound import outbound_send
from cairn.secrets import secret_resolve
from checkpoints.services.outbox import outbox_enqueue
from tenants.models import RunGrant, TenantUserObjectPermission

log = logging.getLogger("cairn.approvals.notify")

PLAN_KIND = "approval.notify"
DELIVER_KIND = "approval.deliver"
CLAIM_SECONDS = 60
MAX_ATTEMPTS = 8
MAX_BACKOFF_SECONDS = 900


def review_link(request: ApprovalRequest) -> str:
    """The review page's absolute URL (``CAIRN_PUBLIC_URL`` + the page's path)."""
    base = settings.CAIRN_PUBLIC_URL.rstrip("/")
    return base + reverse("approvals:review", args=[request.pk])


def notification_recipients(request: ApprovalRequest) -> list[AbstractBaseUser]:
    """The people whose review queue shows ``request``: the tenant's members and the run's
    grant holders for whom ``review_queue`` keeps it (declared reviewers, review scope,
    four eyes, not yet decided)."""
    members = TenantUserObjectPermission.objects.filter(content_object=request.tenant_id)
    granted = RunGrant.objects.filter(run_id=request.run_id)
    users = get_user_model().objects.filter(
        Q(pk__in=members.values("user_id")) | Q(pk__in=granted.values("user_id")), is_active=True
    )
    return [
        user
        for user in users.order_by("pk")
        if review_queue(tenant=request.tenant, user=user).filter(pk=request.pk).exists()
    ]


def notifications_plan(*, request_id: UUID | str, event: str = "requested") -> int:
    """One notification per recipient and channel their preferences choose, each with its
    delivery in the outbox; returns how many were new. Idempotent (the unique key)."""
    with transaction.atomic():
        request = (
            ApprovalRequest.objects.select_related("run", "tenant").filter(pk=request_id).first()
        )
        if request is None or request.status != ApprovalStatus.PENDING:
            return 0
        recipients = notification_recipients(request)
        chosen = {
            row.user_id: row
            for row in NotificationPreference.objects.filter(
                tenant=request.tenant, user__in=[u.pk for u in recipients]
            )
        }
        new = 0
        for user in recipients:
            pref = chosen.get(user.pk)
            channels = []
            email = pref.email if pref else True
            if email and user.email and settings.CAIRN_EMAIL_NOTIFICATIONS:
                channels.append(NotificationChannel.EMAIL)
            if pref is not None and pref.chat and pref.chat_url_sealed:
                channels.append(NotificationChannel.CHAT)
            for channel in channels:
                row, created = ApprovalNotification.objects.get_or_create(
                    request=request,
                    user=user,
                    channel=channel,
                    event=event,
                    defaults={"tenant_id": request.tenant_id},
                )
                if created:
                    new += 1
                    outbox_enqueue(
                        run=request.run,
                        kind=DELIVER_KIND,
                        payload={"notification_id": str(row.pk)},
                    )
        return new


def notifications_remind_due(*, now: datetime | None = None, limit: int = 500) -> int:
    """Plan the "expiring" notification of each pending request with less than
    ``CAIRN_APPROVAL_REMIND_SECONDS`` left, once per request (``reminded_at``, set with a
    conditional UPDATE in the transaction that writes the outbox message). Returns how many
    requests were marked; the periodic expiry task calls it."""
    seconds = settings.CAIRN_APPROVAL_REMIND_SECONDS
    if seconds <= 0:
        return 0
    now = now or timezone.now()
    due = ApprovalRequest.objects.filter(
        status=ApprovalStatus.PENDING,
        reminded_at__isnull=True,
        expires_at__gt=now,
        expires_at__lte=now + timedelta(seconds=seconds),
    ).select_related("run")
    marked = 0
    for request in due.order_by("expires_at")[:limit]:
        with transaction.atomic():
            won = ApprovalRequest.objects.filter(pk=request.pk, reminded_at__isnull=True).update(
                reminded_at=now
            )
            if won:
                marked += 1
                outbox_enqueue(
                    run=request.run,
                    kind=PLAN_KIND,
                    payload={"request_id": str(request.pk), "event": "expiring"},
                )
    return marked


def _text(row: ApprovalNotification) -> tuple[str, str]:
    request, run = row.request, row.request.run
    subject = f"[Cairn] Approval of '{request.action}' waits for you ({request.tenant.slug})"
    if row.event == "expiring":
        subject = (
            f"[Cairn] Approval of '{request.action}' expires at "
            f"{request.expires_at:%H:%M} UTC ({request.tenant.slug})"
        )
    body = (
        f"{request.requester_label} asks for approval of '{request.action}' on run {run.pk} "
        f"({run.workflow_type}).\n"
        f"Artifact sha256: {request.artifact_sha256}\n"
        f"Decided by: {reviewers_label(request)}; quorum {quorum_progress(request)}.\n"
        f"Expires at {request.expires_at:%Y-%m-%d %H:%M:%S} UTC.\n\n"
        f"Review it here (opening the page decides nothing): {review_link(request)}\n"
    )
    return subject, body


def _send(row: ApprovalNotification) -> None:
    subject, body = _text(row)
    if row.channel == NotificationChannel.EMAIL:
        ref = settings.CAIRN_EMAIL_PASSWORD_REF
        connection = get_connection(password=secret_resolve(ref)) if ref else None
        EmailMessage(
            subject,
            body,
            settings.DEFAULT_FROM_EMAIL,
            [row.user.email],
            headers={"Message-ID": f"<{row.pk}@cairn.notifications>"},
            connection=connection,
        ).send(fail_silently=False)
        return
    pref = NotificationPreference.objects.get(tenant_id=row.tenant_id, user_id=row.user_id)
    payload = {"text": f"*{subject}*\n{body}"}
    answer = outbound_send(
        "POST",
        chat_url_of(pref),
        body=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    if not 200 <= answer.status < 300:
        raise RuntimeError(f"the chat webhook answered {answer.status}")


def notification_deliver(*, notification_id: UUID | str) -> str:
    """Send one notification unless it was sent or another deliverer holds it: "sent",
    "skipped" or "failed" (the next attempt is scheduled through the outbox)."""
    now = timezone.now()
    claimed = (
        ApprovalNotification.objects.filter(pk=notification_id, sent_at__isnull=True)
        .filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=now))
        .update(claimed_until=now + timedelta(seconds=CLAIM_SECONDS), attempts=F("attempts") + 1)
    )
    if not claimed:
        return "skipped"
    row = ApprovalNotification.objects.select_related(
        "request", "request__run", "request__tenant", "user"
    ).get(pk=notification_id)
    rows = ApprovalNotification.objects.filter(pk=row.pk)
    if row.request.status != ApprovalStatus.PENDING:
        rows.update(
            sent_at=timezone.now(),
            claimed_until=None,
            last_error=f"not sent: the request is {row.request.status}",
        )
        return "skipped"
    try:
        _send(row)
    except Exception as error:  # an SMTP, HTTP or destination failure: retried later
        reason = f"{type(error).__name__}: {error}"[:500]
        with transaction.atomic():
            rows.update(claimed_until=None, last_error=reason)
            if row.attempts < MAX_ATTEMPTS:
                delay = min(MAX_BACKOFF_SECONDS, 2**row.attempts)
                outbox_enqueue(
                    run=row.request.run,
                    kind=DELIVER_KIND,
                    payload={"notification_id": str(row.pk)},
                    available_at=timezone.now() + timedelta(seconds=delay),
                )
        log.warning(
            "approval notification not delivered",
            extra={"notification": str(row.pk), "channel": row.channel, "error": reason},
        )
        return "failed"
    rows.update(sent_at=timezone.now(), claimed_until=None, last_error="")
    log.info(
        "approval notification delivered",
        extra={"notification": str(row.pk), "channel": row.channel, "request": str(row.request_id)},
    )
    return "sent"
