"""Signed webhooks for runners: the outbox's events about externally driven runs, delivered
to the tenant's URL, HMAC-SHA256 signed, retried with backoff until the receiver says 2xx.

Nothing here touches the commit: every event is already an outbox message written in its
own transaction (``run.checkpointed``, ``run.resumed``, ``approval.decided``,
``run.cancel_requested``). The sweep turns the tenant's new messages into deliveries
(advancing the webhook's ``delivered_through`` cursor in the same transaction), then sends
the due ones. A message that is not available yet (a retry's checkpoint, ``available_at``
in the future) is delivered when it comes due: that is the "retry is due" announcement.

Each POST carries the JSON body and these headers:

    X-Cairn-Event: <kind>            X-Cairn-Delivery: <outbox message id>
    X-Cairn-Signature: sha256=<hex HMAC-SHA256 of the exact body under the tenant's secret>

A receiver must treat deliveries as at-least-once (the id makes a repeat recognisable).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import urllib.error
import urllib.request
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from cairn.errors import InvalidRequest
from cairn.secrets import SecretUnavailable, secret_resolve
from checkpoints.models import Execution, OutboxMessage, RunnerWebhook, WebhookDelivery
from tenants.models import Tenant
from tenants.services import Actor, audit_record

log = logging.getLogger("cairn.webhooks")

EVENT_KINDS = ("run.checkpointed", "run.resumed", "approval.decided", "run.cancel_requested")
TIMEOUT_SECONDS = 5
CLAIM_SECONDS = 30
MAX_BACKOFF_SECONDS = 600


def backoff_seconds(attempts: int) -> int:
    """2, 4, 8, … seconds after each failed attempt, at most ten minutes."""
    return min(MAX_BACKOFF_SECONDS, 2 ** max(1, attempts))


def webhook_sign(*, secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def webhook_set(*, tenant: Tenant, url: str, secret_ref: str, actor: Actor) -> RunnerWebhook:
    """Point the tenant's runner webhook at ``url``, signed under the secret ``secret_ref``
    names. Events from now on are delivered (earlier ones are not replayed). Atomic with
    its audit event. Raises InvalidRequest (not an http(s) URL, or not a secret reference:
    the secret itself is never accepted)."""
    if not isinstance(url, str) or not url.startswith(("http://", "https://")) or len(url) > 500:
        raise InvalidRequest("url must be an http(s) URL.", fields={"url": "an http(s) URL"})
    scheme, sep, name = (secret_ref or "").partition(":")
    if scheme not in ("env", "file") or not sep or not name or len(secret_ref) > 200:
        raise InvalidRequest(
            "secret_ref names the signing secret (env:NAME or file:NAME); the secret itself is "
            "never sent or stored.",
            fields={"secret_ref": "env:NAME or file:NAME"},
        )
    with transaction.atomic():
        latest = (
            OutboxMessage.objects.filter(tenant=tenant)
            .order_by("-id")
            .values_list("id", flat=True)
            .first()
            or 0
        )
        webhook, created = RunnerWebhook.objects.select_for_update().get_or_create(
            tenant=tenant,
            defaults={"url": url, "secret_ref": secret_ref, "delivered_through": latest},
        )
        if not created:
            webhook.url, webhook.secret_ref = url, secret_ref
            webhook.save(update_fields=["url", "secret_ref", "updated_at"])
        audit_record(
            tenant=tenant,
            actor=actor,
            action="webhook.set",
            target=url[:200],
            details={"secret_ref": secret_ref},
        )
    return webhook


def webhook_remove(*, tenant: Tenant, actor: Actor) -> bool:
    """Stop delivering; undelivered deliveries are dropped. Returns whether one was set."""
    with transaction.atomic():
        removed, _ = RunnerWebhook.objects.filter(tenant=tenant).delete()
        WebhookDelivery.objects.filter(tenant=tenant, delivered_at__isnull=True).delete()
        if removed:
            audit_record(tenant=tenant, actor=actor, action="webhook.removed")
    return bool(removed)


def _collect(webhook: RunnerWebhook) -> int:
    """Turn the tenant's new outbox events into deliveries; one transaction."""
    with transaction.atomic():
        locked = RunnerWebhook.objects.select_for_update().filter(pk=webhook.pk).first()
        if locked is None:
            return 0
        messages = list(
            OutboxMessage.objects.filter(
                tenant_id=locked.tenant_id,
                id__gt=locked.delivered_through,
                kind__in=EVENT_KINDS,
                run__execution=Execution.EXTERNAL,
            )
            .order_by("id")
            .values_list("id", "available_at")[:500]
        )
        if not messages:
            return 0
        now = timezone.now()
        try:
            with transaction.atomic():
                WebhookDelivery.objects.bulk_create(
                    [
                        WebhookDelivery(
                            tenant_id=locked.tenant_id,
                            message_id=message_id,
                            next_attempt_at=max(available or now, now),
                        )
                        for message_id, available in messages
                    ]
                )
        except IntegrityError:
            return 0  # another sweep collected them first
        RunnerWebhook.objects.filter(pk=locked.pk).update(delivered_through=messages[-1][0])
        return len(messages)


def _body(message: OutboxMessage) -> bytes:
    run = message.run
    payload: dict[str, Any] = {
        "id": message.id,
        "kind": message.kind,
        "tenant": message.tenant.slug,
        "run_id": str(message.run_id),
        "run": {"version": run.version, "status": run.status, "state": run.state},
        "payload": message.payload,
        "created_at": message.created_at.isoformat(),
    }
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


def _send(webhook: RunnerWebhook, message: OutboxMessage) -> str | None:
    """POST one event; None when the receiver answered 2xx, else what went wrong."""
    try:
        secret = secret_resolve(webhook.secret_ref)
    except SecretUnavailable as exc:
        return f"the signing secret is unavailable: {exc}"
    body = _body(message)
    request = urllib.request.Request(
        webhook.url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "X-Cairn-Event": message.kind,
            "X-Cairn-Delivery": str(message.id),
            "X-Cairn-Signature": webhook_sign(secret=secret, body=body),
        },
    )
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_SECONDS) as answer:  # noqa: S310
            return None if 200 <= answer.status < 300 else f"answered {answer.status}"
    except urllib.error.HTTPError as error:
        return f"answered {error.code}"
    except (urllib.error.URLError, OSError, ValueError) as error:
        return f"{type(error).__name__}: {error}"[:500]


def webhooks_deliver(*, limit: int = 200) -> int:
    """Collect new events and send every due delivery; return how many were delivered.

    A delivery is claimed with a conditional UPDATE (due and undelivered), so two sweeps
    never send one at the same moment. A failure is retried after ``backoff_seconds``;
    deliveries of one tenant go out oldest first. Never raises for a receiver's answer."""
    for webhook in RunnerWebhook.objects.all():
        _collect(webhook)
    now = timezone.now()
    due = Q(delivered_at__isnull=True, next_attempt_at__lte=now)
    delivered = 0
    hooks = {w.tenant_id: w for w in RunnerWebhook.objects.all()}
    candidates = (
        WebhookDelivery.objects.filter(due, tenant_id__in=list(hooks))
        .select_related("message", "message__run", "message__tenant")
        .order_by("id")[:limit]
    )
    for delivery in candidates:
        claimed = WebhookDelivery.objects.filter(due, pk=delivery.pk).update(
            next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS), attempts=F("attempts") + 1
        )
        if claimed != 1:
            continue
        problem = _send(hooks[delivery.tenant_id], delivery.message)
        if problem is None:
            WebhookDelivery.objects.filter(pk=delivery.pk).update(
                delivered_at=timezone.now(), last_error=""
            )
            delivered += 1
            continue
        attempts = delivery.attempts + 1
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            next_attempt_at=timezone.now() + timedelta(seconds=backoff_seconds(attempts)),
            last_error=problem,
        )
        log.warning(
            "webhook delivery failed",
            extra={"outbox_id": delivery.message_id, "attempts": attempts, "why": problem},
        )
    return delivered
