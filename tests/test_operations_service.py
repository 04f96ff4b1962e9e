"""External operations: reservation by idempotency key, the status machine, sealing,
operator outcomes, stalled operations."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from cairn.errors import (
    IdempotencyKeyReused,
    InvalidRequest,
    OperationStateConflict,
    RunNotActive,
    SecretInEnvelope,
)
from checkpoints import crypto
from checkpoints.models import ExternalOperation, OperationStatus, Run, RunStatus
from checkpoints.services.workflows import workflow_register
from runtime.services.operations import (
    operation_attempt,
    operation_confirm,
    operation_fail,
    operation_mark_pending,
    operation_mark_unknown,
    operation_record_outcome,
    operation_request,
    operation_reserve,
    operation_result,
    operations_stalled,
    request_fingerprint,
)
from runtime.services.runs import run_create
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.factories import SIMPLE_DEFINITION

pytestmark = pytest.mark.django_db

WORKER = Actor.system("worker-1")


def reserve(run, key="k-1", fingerprint="f" * 64, **kwargs):  # noqa: ANN001, ANN003, ANN201
    params = {"action": "publish", "target": "blog/post", "request_fingerprint": fingerprint}
    params.update(kwargs)
    return operation_reserve(
        tenant=run.tenant, run_id=run.id, idempotency_key=key, actor=WORKER, **params
    )


def settle(operation, to: str) -> ExternalOperation:  # noqa: ANN001
    if to == "pending":
        return operation_mark_pending(operation_id=operation.id, actor=WORKER)
    if to == "confirmed":
        return operation_confirm(
            operation_id=operation.id, provider_operation_id="pub_1", result={}, actor=WORKER
        )
    if to == "failed":
        return operation_fail(operation_id=operation.id, reason="refused", actor=WORKER)
    return operation_mark_unknown(operation_id=operation.id, actor=WORKER)


def test_it_reserves_a_key_once_and_answers_the_same_request_with_the_same_record(run):
    first, created = reserve(run, request={"title": "Why?"})
    again, created_again = reserve(run, request={"title": "Why?"})
    assert (created, created_again) == (True, False)
    assert again.pk == first.pk and again.status == OperationStatus.RESERVED
    assert ExternalOperation.objects.count() == 1
    assert AuditEvent.objects.filter(action="operation.reserved").count() == 1


def test_it_refuses_the_same_key_for_another_request(run):
    reserve(run)
    with pytest.raises(IdempotencyKeyReused) as caught:
        reserve(run, fingerprint="e" * 64)
    assert "k-1" in caught.value.detail
    with pytest.raises(IdempotencyKeyReused):
        reserve(run, target="blog/another-post")
    assert ExternalOperation.objects.count() == 1


def test_a_key_is_unique_per_tenant_so_another_tenant_can_neither_see_nor_squat_it(
    run, acme, globex, bob, charlie
):
    workflow_register(
        tenant=globex, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
    )
    theirs = run_create(
        tenant=globex, workflow_type="research", execution="external", actor=Actor(user=charlie)
    )
    # globex reserves the key first: acme's reservation of the same key is acme's own.
    their_operation, created = reserve(theirs)
    assert created
    mine, created = reserve(run)
    assert created and mine.pk != their_operation.pk
    # Each tenant's key still names one request of one run, and says nothing of the other.
    with pytest.raises(IdempotencyKeyReused) as caught:
        reserve(theirs, fingerprint="e" * 64)
    assert "acme" not in caught.value.detail and str(run.id) not in caught.value.detail
    mine_too = run_create(
        tenant=acme, workflow_type="research", execution="external", actor=Actor(user=bob)
    )
    with pytest.raises(IdempotencyKeyReused):
        reserve(mine_too)
    assert ExternalOperation.objects.filter(idempotency_key="k-1").count() == 2


def test_the_fingerprint_is_stable_and_names_the_whole_request():
    one = request_fingerprint(action="publish", target="t", request={"a": 1, "b": [1, 2]})
    same = request_fingerprint(action="publish", target="t", request={"b": [1, 2], "a": 1})
    other = request_fingerprint(action="publish", target="t", request={"a": 2, "b": [1, 2]})
    assert one == same != other and len(one) == 64


@pytest.mark.parametrize(
    "key",
    ["", "x" * 201, "a/b", "has space", "tab\tkey"],
    ids=["empty", "long", "slash", "sp", "tab"],
)
def test_it_refuses_a_key_that_cannot_name_an_operation(run, key: str):
    with pytest.raises(InvalidRequest) as caught:
        reserve(run, key=key)
    assert "idempotency_key" in caught.value.fields


def test_it_refuses_a_credential_in_the_request_and_seals_the_rest(run):
    with pytest.raises(SecretInEnvelope):
        reserve(run, request={"api_key": "sk-abcdefghijklmnopqrstuvwxyz123456"})
    operation, _ = reserve(run, request={"title": "Why?", "api_key": "env:PUBLISHING_KEY"})
    stored = ExternalOperation.objects.get(pk=operation.pk)
    assert "Why?" not in stored.request_sealed
    assert operation_request(stored) == {"title": "Why?", "api_key": "env:PUBLISHING_KEY"}


def test_it_reserves_nothing_for_a_finished_run(run):
    Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
    with pytest.raises(RunNotActive):
        reserve(run)


def test_it_reserves_nothing_for_a_run_being_cancelled_but_answers_an_earlier_key(run, bob):
    from runtime.services.cancel import run_cancel

    earlier, _ = reserve(run, key="earlier")
    cancelling = run_cancel(
        tenant=run.tenant, run_id=run.id, reason="stop", actor=Actor(user=bob), settle=False
    )
    assert cancelling.status == RunStatus.CANCELLING
    with pytest.raises(RunNotActive) as refused:
        reserve(run, key="later")
    assert refused.value.detail == "The run is being cancelled; it reserves no new operations."
    assert not ExternalOperation.objects.filter(idempotency_key="later").exists()
    again, created = reserve(run, key="earlier")  # a retried reservation is still answered
    assert (again.pk, created) == (earlier.pk, False)


def test_a_confirmed_result_is_sealed_to_its_row(run):
    operation, _ = reserve(run)
    operation_mark_pending(operation_id=operation.id, actor=WORKER)
    operation_confirm(
        operation_id=operation.id,
        provider_operation_id="pub_123",
        result={"url": "/published/why"},
        actor=WORKER,
    )
    stored = ExternalOperation.objects.get(pk=operation.pk)
    assert stored.status == OperationStatus.CONFIRMED
    assert stored.provider_operation_id == "pub_123"
    assert "/published/why" not in stored.result_sealed
    assert operation_result(stored) == {"url": "/published/why"}
    other, _ = reserve(run, key="k-2")
    other.result_sealed = stored.result_sealed
    with pytest.raises(crypto.DecryptionError):
        operation_result(other)


LEGAL = {
    ("reserved", "pending"),
    ("reserved", "confirmed"),
    ("reserved", "failed"),
    ("reserved", "unknown"),
    ("pending", "confirmed"),
    ("pending", "failed"),
    ("pending", "unknown"),
    ("unknown", "confirmed"),
    ("unknown", "failed"),
}
PATHS = {
    "reserved": [],
    "pending": ["pending"],
    "unknown": ["pending", "unknown"],
    "confirmed": ["pending", "confirmed"],
    "failed": ["pending", "failed"],
}


@pytest.mark.parametrize("start", list(PATHS))
@pytest.mark.parametrize("to", ["pending", "confirmed", "failed", "unknown"])
def test_the_status_machine_allows_only_its_moves(run, start: str, to: str):
    operation, _ = reserve(run)
    for step in PATHS[start]:
        operation = settle(operation, step)
    if (start, to) in LEGAL or start == to:
        assert settle(operation, to).status == to
    else:
        with pytest.raises(OperationStateConflict):
            settle(operation, to)
        assert ExternalOperation.objects.get(pk=operation.pk).status == start


def test_a_confirmation_cannot_be_replaced_by_another(run):
    operation, _ = reserve(run)
    settle(operation, "confirmed")
    again = operation_confirm(
        operation_id=operation.id, provider_operation_id="pub_1", result={}, actor=WORKER
    )
    assert again.status == OperationStatus.CONFIRMED
    with pytest.raises(OperationStateConflict) as caught:
        operation_confirm(
            operation_id=operation.id, provider_operation_id="pub_2", result={}, actor=WORKER
        )
    assert "final" in caught.value.detail
    assert ExternalOperation.objects.get(pk=operation.pk).provider_operation_id == "pub_1"
    assert AuditEvent.objects.filter(action="operation.confirmed").count() == 1


def test_attempts_count_calls_to_a_pending_operation_only(run):
    operation, _ = reserve(run)
    with pytest.raises(OperationStateConflict):
        operation_attempt(operation_id=operation.id)
    settle(operation, "pending")
    operation_attempt(operation_id=operation.id, note="sending")
    assert operation_attempt(operation_id=operation.id).attempts == 2


def test_an_operator_records_the_outcome_of_an_ambiguous_operation_with_a_reason(run, bob):
    operation, _ = reserve(run)
    settle(operation, "pending")
    settle(operation, "unknown")
    operator = Actor(user=bob, ip="127.0.0.1")
    with pytest.raises(InvalidRequest):
        operation_record_outcome(
            tenant=run.tenant,
            run_id=run.id,
            idempotency_key="k-1",
            outcome="confirmed",
            provider_operation_id="pub_9",
            reason=" ",
            actor=operator,
        )
    settled = operation_record_outcome(
        tenant=run.tenant,
        run_id=run.id,
        idempotency_key="k-1",
        outcome="confirmed",
        provider_operation_id="pub_9",
        reason="found it in the provider's dashboard",
        actor=operator,
    )
    assert (settled.status, settled.provider_operation_id) == ("confirmed", "pub_9")
    event = AuditEvent.objects.get(action="operation.outcome_recorded")
    assert (event.actor, event.reason) == (bob, "found it in the provider's dashboard")
    assert event.details["from"] == "unknown" and event.details["to"] == "confirmed"
    with pytest.raises(OperationStateConflict):
        operation_record_outcome(
            tenant=run.tenant,
            run_id=run.id,
            idempotency_key="k-1",
            outcome="failed",
            reason="changed my mind",
            actor=operator,
        )


@pytest.mark.parametrize("outcome", ["failed", "confirmed"])
def test_an_operator_records_the_outcome_of_a_reserved_operation(run, bob, outcome: str):
    reserve(run)
    settled = operation_record_outcome(
        tenant=run.tenant,
        run_id=run.id,
        idempotency_key="k-1",
        outcome=outcome,
        provider_operation_id="pub_3" if outcome == "confirmed" else "",
        reason="the provider's log shows what happened to k-1",
        actor=Actor(user=bob),
    )
    assert settled.status == outcome
    event = AuditEvent.objects.get(action="operation.outcome_recorded")
    assert event.actor == bob
    assert (event.details["from"], event.details["to"]) == ("reserved", outcome)


def test_stalled_operations_are_those_pending_longer_than_the_threshold(run, settings):
    settings.CAIRN_STALLED_OPERATION_SECONDS = 600
    old, _ = reserve(run, key="old")
    recent, _ = reserve(run, key="recent")
    done, _ = reserve(run, key="done")
    waiting, _ = reserve(run, key="reserved-only")
    for operation in (old, recent, done):
        settle(operation, "pending")
    settle(done, "confirmed")
    an_hour_ago = timezone.now() - timedelta(hours=1)
    ExternalOperation.objects.filter(idempotency_key__in=["old", "done", "reserved-only"]).update(
        created_at=an_hour_ago, updated_at=an_hour_ago
    )
    assert [o.idempotency_key for o in operations_stalled()] == ["old"]
    assert [o.idempotency_key for o in operations_stalled(tenant=run.tenant)] == ["old"]
    assert list(operations_stalled(older_than=timedelta(hours=2))) == []
    assert {o.idempotency_key for o in operations_stalled(older_than=timedelta(0))} == {
        "old",
        "recent",
    }


def test_settling_the_last_open_operation_finishes_a_cancel(run, bob):
    from runtime.services.cancel import run_cancel

    operation, _ = reserve(run)
    settle(operation, "pending")
    cancelling = run_cancel(tenant=run.tenant, run_id=run.id, reason="stop", actor=Actor(user=bob))
    assert cancelling.status == RunStatus.CANCELLING
    settle(operation, "unknown")
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLING
    operation_record_outcome(
        tenant=run.tenant,
        run_id=run.id,
        idempotency_key="k-1",
        outcome="failed",
        reason="the provider has no such publication",
        actor=Actor(user=bob),
    )
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED


def test_key_rotation_reseals_an_operations_request_and_result(run, settings):
    from checkpoints.crypto import key_id_of, new_key_spec
    from checkpoints.services.keys import keys_rotate

    operation, _ = reserve(run, request={"title": "Why?"})
    settle(operation, "pending")
    operation_confirm(
        operation_id=operation.id, provider_operation_id="pub_1", result={"url": "/p"}, actor=WORKER
    )
    old_spec, new_spec = settings.CAIRN_ENCRYPTION_KEYS, new_key_spec("k2")
    settings.CAIRN_ENCRYPTION_KEYS = f"{new_spec},{old_spec}"
    assert keys_rotate(batch_size=1)["operations"] == 2
    settings.CAIRN_ENCRYPTION_KEYS = new_spec  # the old key is gone
    stored = ExternalOperation.objects.get(pk=operation.pk)
    assert {key_id_of(stored.request_sealed), key_id_of(stored.result_sealed)} == {"k2"}
    assert operation_request(stored) == {"title": "Why?"}
    assert operation_result(stored) == {"url": "/p"}
    assert keys_rotate()["operations"] == 0
