"""Each member's notification preferences: email and/or a chat message when an approval
request waits for them. Checked and audited here; the console page and the API call it."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from approvals.models import NotificationPreference
from cairn.errors import InvalidRequest
from cairn.outbound import DestinationRefused, NotSent, destination_check, url_origin
from checkpoints import crypto
from tenants.models import Tenant
from tenants.services import Actor, audit_record


@dataclass(frozen=True)
class Preferences:
    """What a member chose (the defaults when they chose nothing). ``chat_url_shown`` is
    the chat URL's origin only: the rest of a Slack-compatible URL is its secret."""

    email: bool
    chat: bool
    chat_url_set: bool
    chat_url_shown: str
    email_address: str


# What a sealed chat URL is bound to (checkpoints.crypto): the tenant, this table, the row.
CHAT_URL_TABLE, CHAT_URL_FIELD = "notification_preference", "chat_url"


def _chat_url_scope(row: NotificationPreference) -> dict[str, object]:
    return {
        "tenant_id": row.tenant_id,
        "table": CHAT_URL_TABLE,
        "row_id": row.pk,
        "field": CHAT_URL_FIELD,
    }


def chat_url_seal(row: NotificationPreference, url: str) -> str:
    """The sealed form of ``url`` for this saved row ("" stays "": no URL)."""
    return crypto.seal(url.encode(), **_chat_url_scope(row)) if url else ""


def chat_url_of(row: NotificationPreference) -> str:
    """The row's chat URL in the clear ("" when none); raises DecryptionError or
    MissingKeyError rather than return a URL not sealed for this row."""
    sealed = row.chat_url_sealed
    return crypto.unseal(sealed, **_chat_url_scope(row)).decode() if sealed else ""


def notification_preferences_get(*, tenant: Tenant, user: AbstractBaseUser) -> Preferences:
    row = NotificationPreference.objects.filter(tenant=tenant, user=user).first()
    if row is None:
        return Preferences(True, False, False, "", user.email or "")
    try:
        url = chat_url_of(row)
    except (crypto.DecryptionError, crypto.MissingKeyError):
        # Under a key no longer configured, or not sealed for this row: the page still
        # opens and says so, and setting the URL again replaces it.
        return Preferences(row.email, row.chat, True, crypto.UNREADABLE, user.email or "")
    return Preferences(row.email, row.chat, bool(url), url_origin(url), user.email or "")


def notification_preferences_set(
    *,
    tenant: Tenant,
    user: AbstractBaseUser,
    actor: Actor,
    email: bool | None = None,
    chat: bool | None = None,
    chat_url: str | None = None,
) -> Preferences:
    """Change what is given (None: unchanged; ``chat_url=""`` forgets the URL). A chat URL
    must pass the outbound destination check (``cairn.outbound``) now, and is checked again
    at every delivery. Chat needs a URL. Raises InvalidRequest with ``fields``; audited as
    ``notification.preferences`` (never with the URL)."""
    problems: dict[str, str] = {}
    if chat_url:
        chat_url = chat_url.strip()
        try:
            destination_check(chat_url)
        except DestinationRefused as refused:
            problems["chat_url"] = str(refused)
        except NotSent as unusable:
            problems["chat_url"] = f"cannot be reached: {unusable}"
        if len(chat_url) > 500:
            problems["chat_url"] = "at most 500 characters"
    if problems:
        raise InvalidRequest("That chat URL cannot be used; nothing was changed.", fields=problems)
    with transaction.atomic():
        # The row exists before its URL is sealed: the seal is bound to the row's id.
        row, _ = NotificationPreference.objects.select_for_update().get_or_create(
            tenant=tenant, user=user
        )
        if email is not None:
            row.email = email
        if chat is not None:
            row.chat = chat
        if chat_url is not None:
            row.chat_url_sealed = chat_url_seal(row, chat_url)
        if row.chat and not row.chat_url_sealed:
            raise InvalidRequest(
                "Chat messages need a Slack-compatible incoming-webhook URL; nothing was changed.",
                fields={"chat_url": "required for chat messages"},
            )
        row.save()
        audit_record(
            tenant=tenant,
            actor=actor,
            action="notification.preferences",
            target=user.get_username(),
            details={
                "email": row.email,
                "chat": row.chat,
                "chat_url_set": bool(row.chat_url_sealed),
            },
        )
    return notification_preferences_get(tenant=tenant, user=user)
