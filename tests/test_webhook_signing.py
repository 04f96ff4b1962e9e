"""Webhook signatures a receiver can trust: Standard Webhooks headers verified by the
``standardwebhooks`` library, a signing secret Cairn generates (shown once, stored
encrypted, rotated with an overlap), secret references only as a deployment admin
registered them for the tenant, and the same bytes on every attempt."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from standardwebhooks import Webhook, WebhookVerificationError

from checkpoints import crypto
from checkpoints.crypto import key_id_of, new_key_spec
from checkpoints.models import RunnerWebhook, WebhookDelivery
from checkpoints.services.keys import keys_rotate
from checkpoints.services.workflows import workflow_register
from runtime.services.runs import run_create
from runtime.services.webhooks import webhooks_deliver
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.approvals_support import move
from tests.factories import SIMPLE_DEFINITION, stored_column


def _set(client, **body):  # noqa: ANN001, ANN003, ANN202
    return client.put("/api/v1/webhook", body, format="json")


def _due_again() -> None:
    WebhookDelivery.objects.filter(delivered_at__isnull=True).update(
        next_attempt_at=timezone.now() - timedelta(seconds=1)
    )


@pytest.mark.django_db(transaction=True)
def test_a_delivery_verifies_with_the_standard_webhooks_library_and_a_replay_does_not(
    api_as, alice, acme, run, receivers
):  # noqa: ANN001
    receiver = receivers()
    client = api_as(alice, acme)
    answer = _set(client, url=receiver.url)
    assert answer.status_code == 200 and answer["Cache-Control"] == "no-store"
    secret = answer.json()["secret"]
    assert secret.startswith("whsec_") and answer.json()["signing"] == "generated"
    # Shown once: never again, and not stored in the clear.
    assert client.get("/api/v1/webhook").json()["secret"] is None
    assert _set(client, url=receiver.url).json()["secret"] is None
    row = RunnerWebhook.objects.get(tenant=acme)
    assert secret not in row.secret_sealed and secret[6:] not in row.secret_sealed
    assert not any(secret in json.dumps(e.details) for e in AuditEvent.objects.all())
    move(run, "draft_answer")
    assert webhooks_deliver() == 1
    [(method, _, headers, body)] = receiver.seen
    assert Webhook(secret).verify(body, headers)["kind"] == "run.checkpointed"
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body.replace(b"checkpointed", b"cancelled...."), headers)
    stale = {**headers, "webhook-timestamp": str(int(headers["webhook-timestamp"]) - 600)}
    with pytest.raises(WebhookVerificationError):  # the old timestamp is part of the MAC
        Webhook(secret).verify(body, stale)


@pytest.mark.django_db(transaction=True)
def test_a_rotation_signs_with_both_secrets_during_the_overlap_then_only_the_new(
    api_as, alice, acme, run, receivers
):  # noqa: ANN001
    receiver = receivers()
    client = api_as(alice, acme)
    old = _set(client, url=receiver.url).json()["secret"]
    rotated = client.post("/api/v1/webhook/secret", {"overlap_seconds": 3600}, format="json")
    assert rotated.status_code == 200, rotated.json()
    new = rotated.json()["secret"]
    assert new != old and rotated.json()["previous_secret_expires_at"] is not None
    assert AuditEvent.objects.filter(action="webhook.secret_rotated").count() == 1
    move(run, "draft_answer")
    assert webhooks_deliver() == 1
    _, _, headers, body = receiver.seen[-1]
    assert len(headers["webhook-signature"].split(" ")) == 2
    Webhook(old).verify(body, headers)
    Webhook(new).verify(body, headers)
    RunnerWebhook.objects.filter(tenant=acme).update(
        previous_secret_expires_at=timezone.now() - timedelta(seconds=1)
    )
    move(run, "review")
    assert webhooks_deliver() == 1
    _, _, headers, body = receiver.seen[-1]
    Webhook(new).verify(body, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(old).verify(body, headers)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "reference",
    ["env:DJANGO_SECRET_KEY", "env:DATABASE_URL", "file:../../../etc/passwd", "env:GLOBEX_KEY"],
)
def test_a_tenant_names_only_secret_references_registered_for_it(
    api_as, alice, acme, globex, reference
):  # noqa: ANN001
    call_command("secret_refs", "globex", "add", "env:GLOBEX_KEY")
    answer = _set(api_as(alice, acme), url="http://127.0.0.1:1/h", secret_ref=reference)
    assert answer.status_code == 400, answer.json()
    assert answer.json()["fields"] == {"secret_ref": "not registered for this tenant"}
    assert not RunnerWebhook.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_registered_reference_signs_until_it_is_unregistered(
    api_as, alice, acme, run, receivers, monkeypatch
):  # noqa: ANN001
    monkeypatch.setenv("ACME_HOOK_KEY", "whsec_" + "QUNNRS1ob29rLWtleS0xMjM0NTY3ODkw")
    call_command("secret_refs", "acme", "add", "env:ACME_HOOK_KEY")
    receiver = receivers()
    answer = _set(api_as(alice, acme), url=receiver.url, secret_ref="env:ACME_HOOK_KEY")
    assert answer.status_code == 200, answer.json()
    assert (answer.json()["signing"], answer.json()["secret"]) == ("reference", None)
    move(run, "draft_answer")
    assert webhooks_deliver() == 1
    _, _, headers, body = receiver.seen[0]
    Webhook("whsec_" + "QUNNRS1ob29rLWtleS0xMjM0NTY3ODkw").verify(body, headers)
    call_command("secret_refs", "acme", "remove", "env:ACME_HOOK_KEY")
    move(run, "review")
    assert webhooks_deliver() == 0
    assert "no longer registered" in WebhookDelivery.objects.get(delivered_at=None).last_error


@pytest.mark.django_db(transaction=True)
def test_every_attempt_sends_the_bytes_of_the_event_as_it_was_written(
    api_as, alice, acme, run, receivers
):  # noqa: ANN001
    receiver = receivers(fail_first=1)
    _set(api_as(alice, acme), url=receiver.url)
    move(run, "draft_answer")
    assert webhooks_deliver() == 0  # the first attempt fails
    move(run, "review")  # the run moves on before the retry
    _due_again()
    assert webhooks_deliver() == 2
    first, retry, later = receiver.bodies
    assert first == retry != later
    assert json.loads(first)["payload"]["expected_version"] == 2


@pytest.mark.django_db(transaction=True)
def test_key_rotation_reseals_the_signing_secrets(api_as, alice, acme, run, receivers, settings):  # noqa: ANN001
    receiver = receivers()
    client = api_as(alice, acme)
    old = _set(client, url=receiver.url).json()["secret"]
    new = client.post("/api/v1/webhook/secret", {}, format="json").json()["secret"]
    old_spec, new_spec = settings.CAIRN_ENCRYPTION_KEYS, new_key_spec("k2")
    settings.CAIRN_ENCRYPTION_KEYS = f"{new_spec},{old_spec}"
    assert keys_rotate()["webhook secrets"] == 2
    settings.CAIRN_ENCRYPTION_KEYS = new_spec  # the old key is gone
    row = RunnerWebhook.objects.get(tenant=acme)
    assert {key_id_of(row.secret_sealed), key_id_of(row.previous_secret_sealed)} == {"k2"}
    move(run, "draft_answer")
    assert webhooks_deliver() == 1
    _, _, headers, body = receiver.seen[0]
    Webhook(new).verify(body, headers)
    Webhook(old).verify(body, headers)  # the default overlap is a day


# --- the URL, sealed at rest -------------------------------------------------------------
# Some receivers put a token in the URL's path: the URL is then a credential of its own.
TOKEN_PATH = "/hooks/a-secret-token"


def _stored_url(tenant) -> str:  # noqa: ANN001
    return stored_column(RunnerWebhook, "url_sealed", tenant)


def _external_run(tenant, user):  # noqa: ANN001, ANN202
    workflow_register(
        tenant=tenant, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
    )
    return run_create(
        tenant=tenant,
        workflow_type="research",
        inputs={"question": "why?"},
        execution="external",
        actor=Actor(user=user),
    )


@pytest.mark.django_db(transaction=True)
def test_a_webhook_url_is_stored_sealed_bound_to_its_tenant_and_still_delivers(
    api_as, alice, acme, run, receivers
):  # noqa: ANN001
    receiver = receivers()
    url = f"http://127.0.0.1:{receiver.port}{TOKEN_PATH}"
    client = api_as(alice, acme)
    assert _set(client, url=url).status_code == 200
    stored = _stored_url(acme)
    assert "a-secret-token" not in stored and "127.0.0.1" not in stored
    assert stored.startswith(f"{crypto.FORMAT}.{crypto.keyring().active_id}.")
    # The admin who set it reads it back whole; the audit trail keeps only its origin.
    assert client.get("/api/v1/webhook").json()["url"] == url
    assert not any("a-secret-token" in e.target + json.dumps(e.details)
                   for e in AuditEvent.objects.all())  # fmt: skip
    client.post("/api/v1/webhook/secret", {}, format="json")
    assert not any("a-secret-token" in e.target for e in AuditEvent.objects.all())
    move(run, "draft_answer")
    assert webhooks_deliver() == 1
    assert [path for _, path, _, _ in receiver.seen] == [TOKEN_PATH]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("column", ["url_sealed", "secret_sealed"])
def test_a_webhook_whose_seal_cannot_be_opened_fails_its_own_deliveries_not_the_sweep(
    api_as, alice, acme, charlie, globex, run, receivers, column
):  # noqa: ANN001
    """A seal copied from another tenant's row (or damaged, or under a key gone) opens for
    no one: that tenant's deliveries record why, every other tenant's still go out, and
    the admin's page opens."""
    ours, theirs = receivers(), receivers()
    _set(api_as(alice, acme), url=ours.url)
    _set(api_as(charlie, globex), url=theirs.url)
    copied = getattr(RunnerWebhook.objects.get(tenant=globex), column)
    RunnerWebhook.objects.filter(tenant=acme).update(**{column: copied})
    move(run, "draft_answer")
    move(_external_run(globex, charlie), "draft_answer")
    assert webhooks_deliver() == 1  # globex's; acme's waits with its reason
    assert len(theirs.seen) == 1 and ours.seen == []
    failed = WebhookDelivery.objects.get(tenant=acme)
    assert failed.delivered_at is None and "cannot be decrypted" in failed.last_error
    page = api_as(alice, acme).get("/api/v1/webhook")
    assert page.status_code == 200
    if column == "url_sealed":
        assert page.json()["url"] == crypto.UNREADABLE
    # Setting the URL again mends an unreadable URL; a new secret mends an unreadable one.
    _set(api_as(alice, acme), url=ours.url)
    if column == "secret_sealed":
        rotated = api_as(alice, acme).post("/api/v1/webhook/secret", {}, format="json")
        assert rotated.status_code == 200 and rotated.json()["previous_secret_expires_at"] is None
    _due_again()
    assert webhooks_deliver() == 1 and len(ours.seen) == 1


@pytest.mark.django_db(transaction=True)
def test_key_rotation_reseals_the_webhook_url(api_as, alice, acme, run, receivers, settings):  # noqa: ANN001
    receiver = receivers()
    _set(api_as(alice, acme), url=receiver.url)
    old_spec, new_spec = settings.CAIRN_ENCRYPTION_KEYS, new_key_spec("k3")
    settings.CAIRN_ENCRYPTION_KEYS = f"{new_spec},{old_spec}"
    assert keys_rotate()["webhook URLs"] == 1
    settings.CAIRN_ENCRYPTION_KEYS = new_spec  # the old key is gone
    assert key_id_of(RunnerWebhook.objects.get(tenant=acme).url_sealed) == "k3"
    assert keys_rotate()["webhook URLs"] == 0
    move(run, "draft_answer")
    assert webhooks_deliver() == 1 and len(receiver.seen) == 1


BEFORE_URL_SEALING = [("checkpoints", "0017_run_latest_checkpoint_at")]


@pytest.mark.django_db(transaction=True)
def test_webhook_urls_stored_before_are_sealed_by_the_migration(api_as, alice, acme, receivers):  # noqa: ANN001
    url = f"http://127.0.0.1:{receivers().port}{TOKEN_PATH}"
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE_URL_SEALING)
    old = executor.loader.project_state(BEFORE_URL_SEALING).apps.get_model(
        "checkpoints", "RunnerWebhook"
    )
    try:
        old.objects.create(tenant_id=acme.pk, url=url)
    finally:
        latest = MigrationExecutor(connection)
        latest.migrate(latest.loader.graph.leaf_nodes())
    stored = _stored_url(acme)
    assert "a-secret-token" not in stored and stored.startswith(f"{crypto.FORMAT}.")
    assert api_as(alice, acme).get("/api/v1/webhook").json()["url"] == url
