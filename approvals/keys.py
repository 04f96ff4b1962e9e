"""Key rotation for the approvals app's sealed rows: part of ``manage.py rotate_keys``.

Members' chat URLs (a Slack-compatible URL is its own credential) are re-sealed under the
active key, bound to the same row; the URL never changes. One short transaction per
batch, so the rotation can be stopped and run again.
"""

from __future__ import annotations

from collections.abc import Callable

from django.db import transaction

from approvals.models import NotificationPreference
from approvals.services.preferences import chat_url_of, chat_url_seal
from checkpoints import crypto


def approvals_keys_rotate(
    *, batch_size: int = 500, progress: Callable[[str, int], None] | None = None
) -> int:
    """Re-seal every chat URL not under the active key; returns how many. Raises
    DecryptionError or MissingKeyError for one that cannot be read (its batch is not
    written)."""
    active_prefix = f"{crypto.FORMAT}.{crypto.keyring().active_id}."
    report = progress or (lambda kind, done: None)
    stale = NotificationPreference.objects.exclude(chat_url_sealed="").exclude(
        chat_url_sealed__startswith=active_prefix
    )
    done = 0
    while True:
        batch = list(stale.order_by("pk")[:batch_size])
        if not batch:
            return done
        with transaction.atomic():
            for row in batch:
                NotificationPreference.objects.filter(pk=row.pk).update(
                    chat_url_sealed=chat_url_seal(row, chat_url_of(row))
                )
        done += len(batch)
        report("chat URLs", done)
