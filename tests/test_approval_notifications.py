"""Reviewers are told (issue 27, item 4): when a request is raised, each person who may
decide it gets an email through Django's SMTP backend (a real SMTP server on loopback,
aiosmtpd) and/or a chat message to their Slack-compatible incoming webhook (through
``cairn.outbound``), as their preferences say, each linking to the review page. Delivery
goes through the outbox: at least once, never twice for one request and recipient."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from django.utils import timezone

from approvals.models import (
    ApprovalDecision,
    ApprovalNotification,
    ApprovalRequest,
    NotificationPreference,
)
from approvals.notify import notification_deliver, notifications_plan, notifications_remind_due
from approvals.services.preferences import (
    chat_url_of,
    notification_preferences_get,
    notification_preferences_set,
)
from cairn.errors import InvalidRequest
from checkpoints import crypto
from checkpoints.models import OutboxMessage
from tenants.models import AuditEvent
from tenants.services import Actor, member_set_role
from tests.approvals_support import (
    ask,
    at_review,
    decide,
    deliver_all,
    draft,
    legal_quorum_request,
    worker_run,
)
from tests.factories import UserFactory, stored_column
from tests.smtp_support import PUBLIC_URL, free_port

pytestmark = pytest.mark.django_db


def _member(username: str, tenant, role: str):  # noqa: ANN001, ANN202
    user = UserFactory(username=username, email=f"{username}@example.org")
    member_set_role(tenant=tenant, user=user, role=role, actor=Actor.system("test"))
    return user


@pytest.fixture
def rita(acme):  # noqa: ANN001
    return _member("rita", acme, "reviewer")


@pytest.fixture
def sam(acme):  # noqa: ANN001
    return _member("sam", acme, "reviewer")


@pytest.fixture
def pending(acme, alice, bob, carol, rita, sam):  # noqa: ANN001
    """A quorum-2 request for the group 'legal' (rita, sam); carol is a reviewer outside it."""
    carol.email = "carol@example.org"
    carol.save()
    return legal_quorum_request(acme, alice, bob, [rita, sam])


# --- email ---------------------------------------------------------------------------------
def test_raising_a_request_emails_each_reviewer_who_may_decide_it(smtp, pending):  # noqa: ANN001
    assert OutboxMessage.objects.filter(
        kind="approval.notify", payload__request_id=str(pending.pk)
    ).exists()
    deliver_all()
    assert sorted(r[0] for r, _ in smtp.messages) == ["rita@example.org", "sam@example.org"]
    assert smtp.to("carol@example.org") == []  # a reviewer outside the group
    assert smtp.to("bob@example.org") == []  # four eyes: he started the run and asked
    message = smtp.to("rita@example.org")[0]
    assert "publish" in message["Subject"]
    body = message.get_payload(decode=True).decode()
    link = f"{PUBLIC_URL}/approvals/{pending.pk}/"
    assert link in body
    assert "0 of 2" in body
    assert message["Message-ID"].endswith("@cairn.notifications>")


def test_each_recipient_is_told_once_however_often_the_outbox_repeats_itself(smtp, pending):  # noqa: ANN001
    deliver_all()
    # The dispatcher publishes the plan again, and every delivery twice (at least once).
    assert notifications_plan(request_id=pending.pk) == 0
    for row in ApprovalNotification.objects.all():
        assert notification_deliver(notification_id=row.pk) == "skipped"
    deliver_all()
    assert len(smtp.messages) == 2
    assert ApprovalNotification.objects.filter(sent_at__isnull=False).count() == 2


def test_a_failed_delivery_is_retried_through_the_outbox_and_sent_once(settings, smtp, pending):  # noqa: ANN001
    port = settings.EMAIL_PORT
    settings.EMAIL_PORT = free_port()  # nothing listens there
    done = deliver_all()
    assert done["failed"] >= 2 and smtp.messages == []
    failed = ApprovalNotification.objects.filter(sent_at__isnull=True)
    assert failed.count() == 2
    assert all("ConnectionRefused" in row.last_error for row in failed)
    assert all(row.attempts >= 1 for row in failed)
    # The retries are outbox messages due later; once the server answers, each is sent once.
    ApprovalNotification.objects.update(attempts=0)
    settings.EMAIL_PORT = port
    for row in ApprovalNotification.objects.all():
        notification_deliver(notification_id=row.pk)
    deliver_all()
    assert sorted(r[0] for r, _ in smtp.messages) == ["rita@example.org", "sam@example.org"]


def test_the_link_opens_the_review_page_and_decides_nothing(smtp, pending, rita):  # noqa: ANN001
    deliver_all()
    body = smtp.to("rita@example.org")[0].get_payload(decode=True).decode()
    path = next(w for w in body.split() if w.startswith(PUBLIC_URL))[len(PUBLIC_URL) :]
    client = Client()
    client.force_login(rita)
    page = client.get(path)
    assert page.status_code == 200
    assert not ApprovalDecision.objects.filter(request=pending).exists()
    pending.refresh_from_db()
    assert pending.status == "pending"


def test_a_member_who_turns_email_off_gets_none(smtp, acme, rita, sam, alice, bob, carol):  # noqa: ANN001
    notification_preferences_set(tenant=acme, user=rita, email=False, actor=Actor(user=rita))
    artifact = draft(acme)
    run = worker_run(acme, bob)
    ask(at_review(run, artifact), artifact, bob)
    deliver_all()
    assert smtp.to("rita@example.org") == []
    assert smtp.to("sam@example.org") and smtp.to("carol@example.org")


# --- chat ----------------------------------------------------------------------------------
def test_a_chat_message_goes_to_the_members_incoming_webhook(smtp, acme, rita, pending, receivers):  # noqa: ANN001
    hook = receivers()
    notification_preferences_set(
        tenant=acme, user=rita, chat=True, chat_url=hook.url, actor=Actor(user=rita)
    )
    # The request was raised before rita chose chat: plan again, as a repeat would.
    notifications_plan(request_id=pending.pk)
    deliver_all()
    assert len(hook.seen) == 1
    method, _, headers, body = hook.seen[0]
    assert method == "POST" and headers["Content-Type"] == "application/json"
    text = json.loads(body)["text"]
    assert f"{PUBLIC_URL}/approvals/{pending.pk}/" in text
    notifications_plan(request_id=pending.pk)
    deliver_all()
    assert len(hook.seen) == 1  # never twice


HOOK_PATH = "/services/T000/B000/a-secret-token"


def _stored(tenant) -> str:  # noqa: ANN001
    return stored_column(NotificationPreference, "chat_url_sealed", tenant)


def test_a_chat_url_is_stored_sealed_and_still_delivers(smtp, acme, rita, pending, receivers):  # noqa: ANN001
    hook = receivers()
    url = f"http://127.0.0.1:{hook.port}{HOOK_PATH}"
    notification_preferences_set(
        tenant=acme, user=rita, chat=True, chat_url=url, actor=Actor(user=rita)
    )
    stored = _stored(acme)
    assert "a-secret-token" not in stored and "127.0.0.1" not in stored
    assert stored.startswith(f"{crypto.FORMAT}.{crypto.keyring().active_id}.")
    notifications_plan(request_id=pending.pk)
    deliver_all()
    assert [path for _, path, _, _ in hook.seen] == [HOOK_PATH]
    # Copied onto another member's row, the sealed URL does not open: it is bound to its row.
    tom = _member("tom", acme, "reviewer")
    NotificationPreference.objects.create(tenant=acme, user=tom, chat_url_sealed=stored)
    with pytest.raises(crypto.DecryptionError):
        chat_url_of(NotificationPreference.objects.get(tenant=acme, user=tom))
    assert notification_preferences_get(tenant=acme, user=tom).chat_url_shown == crypto.UNREADABLE


def test_a_chat_url_under_a_key_no_longer_configured_is_shown_unreadable_not_a_500(
    settings, acme, rita, receivers
):  # noqa: ANN001
    url = f"http://127.0.0.1:{receivers().port}{HOOK_PATH}"
    notification_preferences_set(
        tenant=acme, user=rita, chat=True, chat_url=url, actor=Actor(user=rita)
    )
    settings.CAIRN_ENCRYPTION_KEYS = crypto.new_key_spec("k-other")  # the old key is gone
    client = Client()
    client.force_login(rita)
    page = client.get("/approvals/notifications/")
    assert page.status_code == 200 and crypto.UNREADABLE in page.content.decode()
    # Setting it again replaces it under the key now configured.
    notification_preferences_set(tenant=acme, user=rita, chat_url=url, actor=Actor(user=rita))
    assert notification_preferences_get(tenant=acme, user=rita).chat_url_shown.startswith("http")


def test_rotate_keys_re_seals_chat_urls(settings, capsys, acme, rita, receivers):  # noqa: ANN001
    url = f"http://127.0.0.1:{receivers().port}{HOOK_PATH}"
    notification_preferences_set(
        tenant=acme, user=rita, chat=True, chat_url=url, actor=Actor(user=rita)
    )
    old_spec = settings.CAIRN_ENCRYPTION_KEYS
    new_spec = crypto.new_key_spec("k-chat")
    settings.CAIRN_ENCRYPTION_KEYS = f"{new_spec},{old_spec}"
    call_command("rotate_keys")
    assert "chat URLs 1" in capsys.readouterr().out
    assert _stored(acme).startswith(f"{crypto.FORMAT}.k-chat.")
    settings.CAIRN_ENCRYPTION_KEYS = new_spec  # the old key can go
    assert notification_preferences_get(tenant=acme, user=rita).chat_url_set
    call_command("rotate_keys")
    assert "chat URLs 0" in capsys.readouterr().out


BEFORE_SEALING = [("approvals", "0007_approve_with_edits")]


@pytest.mark.django_db(transaction=True)
def test_chat_urls_stored_before_are_sealed_by_the_migration(acme, rita, receivers):  # noqa: ANN001
    url = f"http://127.0.0.1:{receivers().port}{HOOK_PATH}"
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE_SEALING)
    old = executor.loader.project_state(BEFORE_SEALING).apps.get_model(
        "approvals", "NotificationPreference"
    )
    try:
        old.objects.create(tenant_id=acme.pk, user_id=rita.pk, chat=True, chat_url=url)
    finally:
        latest = MigrationExecutor(connection)
        latest.migrate(latest.loader.graph.leaf_nodes())
    stored = _stored(acme)
    assert "a-secret-token" not in stored and stored.startswith(f"{crypto.FORMAT}.")
    shown = notification_preferences_get(tenant=acme, user=rita)
    assert shown.chat and shown.chat_url_set and shown.chat_url_shown == "http://127.0.0.1/…"
    assert chat_url_of(NotificationPreference.objects.get(tenant=acme, user=rita)) == url


def test_a_chat_url_the_outbound_checks_refuse_is_refused_with_a_sentence(acme, rita):  # noqa: ANN001
    for url in ("http://169.254.169.254/latest", "http://localhost:6379/", "ftp://x.example/"):
        with pytest.raises(InvalidRequest) as raised:
            notification_preferences_set(
                tenant=acme, user=rita, chat=True, chat_url=url, actor=Actor(user=rita)
            )
        assert raised.value.fields["chat_url"]
    with pytest.raises(InvalidRequest) as raised:
        notification_preferences_set(tenant=acme, user=rita, chat=True, actor=Actor(user=rita))
    assert "incoming-webhook URL" in raised.value.detail


# --- preferences: the API and the console -------------------------------------------------
def test_a_member_reads_and_sets_their_preferences_through_the_api(api_as, acme, rita, receivers):  # noqa: ANN001
    api = api_as(rita, acme)
    assert api.get("/api/v1/account/notifications").json() == {
        "email": True,
        "chat": False,
        "chat_url": None,
        "email_address": "rita@example.org",
    }
    hook = receivers()
    changed = api.put(
        "/api/v1/account/notifications",
        {"email": False, "chat": True, "chat_url": hook.url},
        format="json",
    )
    assert changed.status_code == 200, changed.content
    shown = changed.json()
    assert shown["email"] is False and shown["chat"] is True
    assert shown["chat_url"] == "http://127.0.0.1/…"  # the rest of the URL is its secret
    bad = api.put(
        "/api/v1/account/notifications",
        {"chat": True, "chat_url": "http://169.254.169.254/"},
        format="json",
    )
    assert bad.status_code == 400 and bad.json()["fields"]["chat_url"]
    event = AuditEvent.objects.filter(action="notification.preferences").last()
    assert event.target == "rita" and hook.url not in json.dumps(event.details)


def test_a_member_sets_their_preferences_in_the_console(acme, rita):  # noqa: ANN001
    client = Client()
    client.force_login(rita)
    page = client.get("/approvals/notifications/")
    assert page.status_code == 200 and b'name="email"' in page.content
    saved = client.post("/approvals/notifications/", {"chat_url": ""}, follow=True)
    assert saved.status_code == 200
    assert b"Email" in saved.content
    assert notification_preferences_get(tenant=acme, user=rita).email is False
    refused = client.post(
        "/approvals/notifications/", {"chat": "on", "chat_url": "http://169.254.169.254/"}
    )
    assert refused.status_code == 400


# --- about to expire ------------------------------------------------------------------------
def test_reviewers_are_reminded_once_when_a_request_is_about_to_expire(smtp, pending):  # noqa: ANN001
    deliver_all()
    assert notifications_remind_due() == 0  # a day left: not yet
    soon = timezone.now() + timedelta(minutes=30)
    ApprovalRequest.objects.filter(pk=pending.pk).update(expires_at=soon)
    assert notifications_remind_due() == 1
    assert notifications_remind_due() == 0  # once per request
    deliver_all()
    for address in ("rita@example.org", "sam@example.org"):
        subjects = [m["Subject"] for m in smtp.to(address)]
        assert len(subjects) == 2 and "expires at" in subjects[1]
        body = smtp.to(address)[1].get_payload(decode=True).decode()
        assert f"{PUBLIC_URL}/approvals/{pending.pk}/" in body


def test_a_decided_request_is_not_reminded(smtp, pending, rita, sam):  # noqa: ANN001
    decide(pending, rita)
    decide(pending, sam)
    soon = timezone.now() + timedelta(minutes=30)
    ApprovalRequest.objects.filter(pk=pending.pk).update(expires_at=soon)
    assert notifications_remind_due() == 0
