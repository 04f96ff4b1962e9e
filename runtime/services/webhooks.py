"""Signed webhooks for runners: the outbox's events about externally driven runs, delivered
to the tenant's URL, signed the Standard Webhooks way, retried with backoff until the
receiver says 2xx.

Nothing here touches the commit: every event is already an outbox message written in its
own transaction (``run.checkpointed``, ``run.resumed``, ``approval.decided``,
``run.cancel_requested``). The sweep turns the tenant's new messages into deliveries
(advancing the webhook's ``delivered_through`` cursor in the same transaction), each with
its body made once from the message as it was written, then sends the due ones. A message
that is not available yet (a retry's checkpoint, ``available_at`` in the future) is
delivered when it comes due: that is the "retry is due" announcement.

Each POST carries the body and the Standard Webhooks headers (https://www.standardwebhooks.com):

    webhook-id: <outbox message id>     webhook-timestamp: <unix seconds of this attempt>
    webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body"> [v1,<previous key's>]
    X-Cairn-Event: <kind>

so a receiver verifies with any Standard Webhooks library, refuses stale timestamps
(replays), and treats deliveries as at-least-once (the id makes a repeat recognisable).

The URL goes through ``cairn.outbound`` (checked when it is set and again at each
delivery; no redirects). It is stored sealed, as the secrets are: a receiver may put a
token in it, and the audit trail keeps only its origin. The signing key is one Cairn
generates for the tenant (shown once, stored encrypted, rotated with an overlap during
which both keys sign), or a secret reference a deployment admin registered for the tenant
(``tenants.secret_refs``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from cairn.errors import InvalidRequest, NotFound
from cairn.outbound import (
    DestinationRefused,
    MaybeSent,
    NotSent,
    destination_check,
    outbound_send,
    url_origin,
)
from cairn.secrets import SecretUnavailable, secret_resolve
from checkpoints import crypto
from checkpoints.models import Execution, OutboxMessage, RunnerWebhook, WebhookDelivery
from checkpoints.services.keys import WEBHOOK_COLUMNS, WEBHOOK_TABLE, WEBHOOK_URL_COLUMN
from tenants.models import Tenant
from tenants.secret_refs import tenant_secret_ref_allowed
from tenants.services import Actor, audit_record

log = logging.getLogger("cairn.webhooks")

EVENT_KINDS = ("run.checkpointed", "run.resumed", "approval.decided", "run.cancel_requested")
TIMEOUT_SECONDS = 5
CLAIM_SECONDS = 30
MAX_BACKOFF_SECONDS = 600
SECRET_PREFIX = "whsec_"
# What the signing keys are sealed as (associated data of their AES-GCM seal); key
# rotation re-seals them (checkpoints.services.keys).
SECRET_TABLE = WEBHOOK_TABLE
(_, SECRET_FIELD), (_, PREVIOUS_FIELD) = WEBHOOK_COLUMNS
_, URL_FIELD = WEBHOOK_URL_COLUMN
DEFAULT_OVERLAP_SECONDS = 24 * 3600
MAX_OVERLAP_SECONDS = 7 * 24 * 3600


def backoff_seconds(attempts: int) -> int:
    """2, 4, 8, … seconds after each failed attempt, at most ten minutes."""
    return min(MAX_BACKOFF_SECONDS, 2 ** max(1, attempts))


def _key_of(secret: str) -> bytes:
    """The HMAC key a secret stands for: a ``whsec_`` secret is base64 (as every Standard
    Webhooks library reads it); any other referenced secret is its UTF-8 bytes."""
    if secret.startswith(SECRET_PREFIX):
        return base64.b64decode(secret[len(SECRET_PREFIX) :] + "==")
    return secret.encode()


def webhook_sign(*, secrets_: list[str], message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` header: one ``v1,<base64>`` per key, space-separated."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    return " ".join(
        "v1," + base64.b64encode(hmac.new(_key_of(s), signed, hashlib.sha256).digest()).decode()
        for s in secrets_
    )


def _new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()


def _seal(tenant_id: object, field: str, secret: str) -> str:
    return crypto.seal(
        secret.encode(), tenant_id=tenant_id, table=SECRET_TABLE, row_id=tenant_id, field=field
    )


def _unseal(tenant_id: object, field: str, sealed: str) -> str:
    return crypto.unseal(
        sealed, tenant_id=tenant_id, table=SECRET_TABLE, row_id=tenant_id, field=field
    ).decode()


def webhook_url_seal(*, tenant_id: object, url: str) -> str:
    """The sealed form of a tenant's webhook URL, bound to the tenant's row."""
    return _seal(tenant_id, URL_FIELD, url)


def webhook_url_of(webhook: RunnerWebhook) -> str:
    """The webhook's URL in the clear; raises DecryptionError or MissingKeyError rather than
    return a URL not sealed for this tenant."""
    return _unseal(webhook.tenant_id, URL_FIELD, webhook.url_sealed)


def webhook_url_shown(webhook: RunnerWebhook) -> str:
    """The URL for the admin's page: whole (they set it), or ``crypto.UNREADABLE`` when it
    cannot be unsealed here; setting it again replaces it."""
    try:
        return webhook_url_of(webhook)
    except (crypto.DecryptionError, crypto.MissingKeyError):
        return crypto.UNREADABLE


@dataclass(frozen=True)
class WebhookChange:
    """The webhook after a change, and the signing secret when one was just generated:
    shown to the admin this once, never again."""

    webhook: RunnerWebhook
    secret: str | None = None


def _url_check(url: object) -> str:
    try:
        destination_check(url)
    except DestinationRefused as refusal:
        raise InvalidRequest(str(refusal), fields={"url": "not a destination Cairn may call"})
    return str(url)


def webhook_set(
    *, tenant: Tenant, url: str, actor: Actor, secret_ref: str | None = None
) -> WebhookChange:
    """Point the tenant's runner webhook at ``url``. Without ``secret_ref`` deliveries are
    signed with a secret Cairn generates (on the first set, or when leaving a reference;
    returned once); with it, under the secret that reference names, which must be one a
    deployment admin registered for this tenant. Events from now on are delivered (earlier
    ones are not replayed). Atomic with its audit event.

    Raises InvalidRequest: a URL ``cairn.outbound`` refuses (not http(s), userinfo, an
    internal address), or a reference not registered for the tenant."""
    url = _url_check(url)
    if secret_ref is not None and not tenant_secret_ref_allowed(
        tenant=tenant, reference=secret_ref
    ):
        raise InvalidRequest(
            "secret_ref names a secret that is not registered for this tenant. Leave it out "
            "and Cairn generates the signing secret, or ask the deployment's admin to "
            "register the reference (manage.py secret_refs).",
            fields={"secret_ref": "not registered for this tenant"},
        )
    generated = None
    now = timezone.now()
    with transaction.atomic():
        latest = (
            OutboxMessage.objects.filter(tenant=tenant)
            .order_by("-id")
            .values_list("id", flat=True)
            .first()
            or 0
        )
        webhook = RunnerWebhook.objects.select_for_update().filter(tenant=tenant).first()
        if webhook is None:
            webhook = RunnerWebhook(tenant=tenant, delivered_through=latest)
        webhook.url_sealed = webhook_url_seal(tenant_id=tenant.pk, url=url)
        webhook.secret_ref = secret_ref or ""
        if secret_ref is not None:
            webhook.secret_sealed = webhook.previous_secret_sealed = ""
            webhook.secret_created_at = webhook.previous_secret_expires_at = None
        elif not webhook.secret_sealed:
            generated = _new_secret()
            webhook.secret_sealed = _seal(tenant.pk, SECRET_FIELD, generated)
            webhook.secret_created_at = now
        webhook.save()
        audit_record(
            tenant=tenant,
            actor=actor,
            action="webhook.set",
            target=url_origin(url)[:200],
            details={"secret_ref": secret_ref, "secret_generated": generated is not None},
        )
    return WebhookChange(webhook, generated)


def _readable_secret(tenant_id: object, sealed: str) -> str:
    """The current secret, or "" when there is none or it cannot be unsealed: a secret that
    cannot be read signs nothing, so a rotation replaces it with no overlap."""
    try:
        return _unseal(tenant_id, SECRET_FIELD, sealed) if sealed else ""
    except (crypto.DecryptionError, crypto.MissingKeyError):
        return ""


def webhook_secret_rotate(
    *, tenant: Tenant, actor: Actor, overlap_seconds: int = DEFAULT_OVERLAP_SECONDS
) -> WebhookChange:
    """A new generated signing secret (returned once); the current one keeps signing beside
    it for ``overlap_seconds``, so receivers can switch without missing a delivery (a current
    secret that cannot be unsealed is replaced with no overlap). Atomic with its audit
    event.

    Raises NotFound (no webhook) or InvalidRequest (the webhook signs with a registered
    reference: that secret is rotated where it is kept; or an overlap out of range)."""
    if not isinstance(overlap_seconds, int) or not 0 <= overlap_seconds <= MAX_OVERLAP_SECONDS:
        raise InvalidRequest(
            f"overlap_seconds is 0 to {MAX_OVERLAP_SECONDS}.",
            fields={"overlap_seconds": f"0-{MAX_OVERLAP_SECONDS}"},
        )
    secret = _new_secret()
    now = timezone.now()
    with transaction.atomic():
        webhook = RunnerWebhook.objects.select_for_update().filter(tenant=tenant).first()
        if webhook is None:
            raise NotFound("No webhook is set; PUT /api/v1/webhook first.")
        if webhook.secret_ref:
            raise InvalidRequest(
                f"This webhook signs with the registered reference {webhook.secret_ref}; "
                "rotate that secret where it is kept, or set the webhook without secret_ref "
                "to have Cairn generate one."
            )
        current = _readable_secret(tenant.pk, webhook.secret_sealed) if overlap_seconds else ""
        if current:
            webhook.previous_secret_sealed = _seal(tenant.pk, PREVIOUS_FIELD, current)
            webhook.previous_secret_expires_at = now + timedelta(seconds=overlap_seconds)
        else:
            webhook.previous_secret_sealed, webhook.previous_secret_expires_at = "", None
        webhook.secret_sealed = _seal(tenant.pk, SECRET_FIELD, secret)
        webhook.secret_created_at = now
        webhook.save()
        audit_record(
            tenant=tenant,
            actor=actor,
            action="webhook.secret_rotated",
            details={"overlap_seconds": overlap_seconds},
        )
    return WebhookChange(webhook, secret)


def webhook_remove(*, tenant: Tenant, actor: Actor) -> bool:
    """Stop delivering; undelivered deliveries are dropped. Returns whether one was set."""
    with transaction.atomic():
        removed, _ = RunnerWebhook.objects.filter(tenant=tenant).delete()
        WebhookDelivery.objects.filter(tenant=tenant, delivered_at__isnull=True).delete()
        if removed:
            audit_record(tenant=tenant, actor=actor, action="webhook.removed")
    return bool(removed)


def _signing_secrets(webhook: RunnerWebhook, now: datetime) -> list[str]:
    """The secrets a delivery is signed with now: the current one, and the previous one
    while its overlap lasts. Raises SecretUnavailable."""
    if webhook.secret_ref:
        if not tenant_secret_ref_allowed(tenant=webhook.tenant, reference=webhook.secret_ref):
            raise SecretUnavailable(f"{webhook.secret_ref} is no longer registered for this tenant")
        return [secret_resolve(webhook.secret_ref)]
    if not webhook.secret_sealed:
        raise SecretUnavailable("the webhook has no signing secret; set it again")
    keys = [_unseal(webhook.tenant_id, SECRET_FIELD, webhook.secret_sealed)]
    expires = webhook.previous_secret_expires_at
    if webhook.previous_secret_sealed and expires is not None and expires > now:
        keys.append(_unseal(webhook.tenant_id, PREVIOUS_FIELD, webhook.previous_secret_sealed))
    return keys


def _collect(webhook: RunnerWebhook) -> int:
    """Turn the tenant's new outbox events into deliveries, each with its body made now,
    once, from the message as it was written; one transaction."""
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
            .select_related("tenant")
            .order_by("id")[:500]
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
                            message_id=message.id,
                            next_attempt_at=max(message.available_at or now, now),
                            body=webhook_body(message).decode(),
                        )
                        for message in messages
                    ]
                )
        except IntegrityError:
            return 0  # another sweep collected them first
        RunnerWebhook.objects.filter(pk=locked.pk).update(delivered_through=messages[-1].id)
        return len(messages)


def webhook_body(message: OutboxMessage) -> bytes:
    """The delivery's JSON, made only of what the event's row says (it is never updated),
    so every attempt sends the same bytes whatever the run does meanwhile."""
    payload: dict[str, Any] = {
        "id": message.id,
        "kind": message.kind,
        "tenant": message.tenant.slug,
        "run_id": str(message.run_id),
        "payload": message.payload,
        "created_at": message.created_at.isoformat(),
    }
    return json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()


def _send(webhook: RunnerWebhook, delivery: WebhookDelivery) -> str | None:
    """POST one event; None when the receiver answered 2xx, else what went wrong. A sealed
    column that cannot be opened fails this tenant's delivery, never the sweep."""
    now = timezone.now()
    try:
        url = webhook_url_of(webhook)
    except (crypto.DecryptionError, crypto.MissingKeyError) as exc:
        return f"the URL cannot be decrypted: {exc}; set the webhook again"[:500]
    try:
        keys = _signing_secrets(webhook, now)
    except SecretUnavailable as exc:
        return f"the signing secret is unavailable: {exc}"
    except (crypto.DecryptionError, crypto.MissingKeyError) as exc:
        return f"the signing secret cannot be decrypted: {exc}"[:500]
    body = delivery.body.encode() if delivery.body else webhook_body(delivery.message)
    message_id = str(delivery.message_id)
    timestamp = int(now.timestamp())
    headers = {
        "Content-Type": "application/json",
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": webhook_sign(
            secrets_=keys, message_id=message_id, timestamp=timestamp, body=body
        ),
        "X-Cairn-Event": delivery.message.kind,
    }
    try:
        answer = outbound_send("POST", url, body=body, headers=headers, timeout=TIMEOUT_SECONDS)
    except NotSent as error:  # a refused destination too: checked again at each delivery
        return f"not sent: {error}"[:500]
    except MaybeSent as error:
        return f"no answer: {error}"[:500]
    if 200 <= answer.status < 300:
        return None
    if 300 <= answer.status < 400:
        return f"answered {answer.status} (redirects are not followed)"
    return f"answered {answer.status}"


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
    hooks = {w.tenant_id: w for w in RunnerWebhook.objects.select_related("tenant")}
    candidates = (
        WebhookDelivery.objects.filter(due, tenant_id__in=list(hooks))
        .select_related("message", "message__tenant")
        .order_by("id")[:limit]
    )
    for delivery in candidates:
        claimed = WebhookDelivery.objects.filter(due, pk=delivery.pk).update(
            next_attempt_at=now + timedelta(seconds=CLAIM_SECONDS), attempts=F("attempts") + 1
        )
        if claimed != 1:
            continue
        problem = _send(hooks[delivery.tenant_id], delivery)
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
