"""Key rotation: re-encrypt every sealed payload under the active key, in small batches."""

from __future__ import annotations

from collections.abc import Callable

from django.db import connection, transaction

from checkpoints import crypto
from checkpoints.models import Artifact, Checkpoint, ExternalOperation, RunnerWebhook
from checkpoints.services.artifacts import artifact_reseal
from checkpoints.services.checkpoints import envelope_seal
from checkpoints.services.reads import checkpoint_envelope

OPERATION_TABLE, OPERATION_FIELD = "external_operation", "result"
# Sealed operation columns and the field name each is bound to (runtime.services.operations).
OPERATION_COLUMNS = (("result_sealed", OPERATION_FIELD), ("request_sealed", "request"))
# The runner webhook's sealed columns (runtime.services.webhooks): one row per tenant,
# bound to it. Its signing secrets, and its URL (some receivers put a token in it).
WEBHOOK_TABLE = "runner_webhook"
WEBHOOK_COLUMNS = (("secret_sealed", "secret"), ("previous_secret_sealed", "previous_secret"))
WEBHOOK_URL_COLUMN = ("url_sealed", "url")


def _allow_rotation() -> None:
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL cairn.rotation = 'on'")


def keys_rotate(
    *, batch_size: int = 500, progress: Callable[[str, int], None] | None = None
) -> dict[str, int]:
    """Re-encrypt the store's checkpoints, artifacts, operation results, webhook signing
    secrets and webhook URLs not under the active key (``rotate_keys`` also rotates the
    LangGraph thread store's payloads and the members' chat URLs).

    Each batch is its own short transaction; the command is safe to stop and run again (a
    row is either under its old key or the new one, both readable while both are
    configured). Content and hashes never change. Returns counts per kind.
    """
    active = crypto.keyring().active_id
    totals = {"checkpoints": 0, "artifacts": 0, "operations": 0}
    report = progress or (lambda kind, done: None)

    while True:
        batch = list(Checkpoint.objects.exclude(key_id=active).order_by("pk")[:batch_size])
        if not batch:
            break
        with transaction.atomic():
            _allow_rotation()
            for checkpoint in batch:
                envelope = checkpoint_envelope(checkpoint)
                Checkpoint.objects.reseal(
                    checkpoint.pk,
                    envelope_sealed=envelope_seal(
                        tenant_id=checkpoint.tenant_id,
                        checkpoint_id=checkpoint.id,
                        envelope=envelope,
                    ),
                    key_id=active,
                )
        totals["checkpoints"] += len(batch)
        report("checkpoints", totals["checkpoints"])

    while True:
        batch = list(Artifact.objects.exclude(key_id=active).order_by("pk")[:batch_size])
        if not batch:
            break
        for artifact in batch:
            totals["artifacts"] += artifact_reseal(artifact)
        report("artifacts", totals["artifacts"])

    sealed_prefix = f"{crypto.FORMAT}.{active}."
    for column, field in OPERATION_COLUMNS:
        while True:
            batch = list(
                ExternalOperation.objects.exclude(**{column: ""})
                .exclude(**{f"{column}__startswith": sealed_prefix})
                .order_by("pk")[:batch_size]
            )
            if not batch:
                break
            with transaction.atomic():
                for operation in batch:
                    scope = dict(
                        tenant_id=operation.tenant_id,
                        table=OPERATION_TABLE,
                        row_id=operation.id,
                        field=field,
                    )
                    plain = crypto.unseal(getattr(operation, column), **scope)
                    ExternalOperation.objects.filter(pk=operation.pk).update(
                        **{column: crypto.seal(plain, **scope)}
                    )
            totals["operations"] += len(batch)
            report("operations", totals["operations"])
    totals["webhook secrets"] = _webhooks_rotate(WEBHOOK_COLUMNS, sealed_prefix)
    totals["webhook URLs"] = _webhooks_rotate((WEBHOOK_URL_COLUMN,), sealed_prefix)
    return totals


def _webhooks_rotate(columns: tuple[tuple[str, str], ...], sealed_prefix: str) -> int:
    """Re-seal these runner webhook columns where not under the active key (a row per
    tenant: one transaction per column)."""
    done = 0
    for column, field in columns:
        stale = RunnerWebhook.objects.exclude(**{column: ""}).exclude(
            **{f"{column}__startswith": sealed_prefix}
        )
        with transaction.atomic():
            for webhook in stale.select_for_update():
                scope = dict(
                    tenant_id=webhook.tenant_id,
                    table=WEBHOOK_TABLE,
                    row_id=webhook.tenant_id,
                    field=field,
                )
                plain = crypto.unseal(getattr(webhook, column), **scope)
                RunnerWebhook.objects.filter(pk=webhook.pk).update(
                    **{column: crypto.seal(plain, **scope)}
                )
                done += 1
    return done
