"""Cancel and reconciliation: a cancel waits until every operation that may be in flight is
settled, asking the provider first and a person when the provider cannot tell."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from checkpoints.models import OperationStatus, RunStatus
from runtime.providers import registry
from runtime.providers.base import Outcome, ProviderResult
from runtime.services.cancel import run_cancel, runs_cancel_sweep
from runtime.services.cancel_finish import run_cancel_complete
from runtime.services.leases import lease_acquire
from runtime.services.operations import operation_record_outcome
from tenants.services import Actor
from tests.actions_support import audit_events, operation, worker_run

pytestmark = pytest.mark.django_db


class FakeProvider:
    """An external provider whose lookup answers what the test says (by key)."""

    name = "fake-cancel"

    def __init__(self) -> None:
        self.answers: dict[str, ProviderResult] = {}
        self.performed: list[str] = []

    def perform(self, *, key, request):  # noqa: ANN001, ANN201
        self.performed.append(key)
        raise AssertionError("a cancel must never perform an operation")

    def lookup(self, *, key: str, client_reference: str = "") -> ProviderResult:
        return self.answers.get(key, ProviderResult(Outcome.NOT_FOUND, reason="no such key"))


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    fake = FakeProvider()
    registry.provider_register(fake.name, lambda: fake)
    yield fake
    registry._FACTORIES.pop(fake.name, None)


@pytest.fixture
def wrun(acme, bob):  # noqa: ANN001
    return worker_run(acme, bob)


def op(run, key: str, status: str):  # noqa: ANN001, ANN201
    row = operation(run, key, status)
    row.provider = FakeProvider.name
    row.save(update_fields=["provider"])
    return row


def cancel(run, bob):  # noqa: ANN001, ANN201
    return run_cancel(tenant=run.tenant, run_id=run.id, reason="stop it", actor=Actor(user=bob))


def test_a_pending_operation_the_provider_confirms_is_settled_and_the_cancel_completes(
    wrun, bob, provider
):
    pending = op(wrun, "pub-1", "pending")
    provider.answers["pub-1"] = ProviderResult.confirmed("prov-9", {"url": "https://x"})
    run = cancel(wrun, bob)
    pending.refresh_from_db()
    assert (pending.status, pending.provider_operation_id) == ("confirmed", "prov-9")
    assert run.status == RunStatus.CANCELLED
    assert [
        e.action
        for e in audit_events(run, "run.cancel") + audit_events(run, "run.cancel_completed")
    ] == ["run.cancel", "run.cancel_completed"]
    assert provider.performed == []


def test_a_reserved_operation_the_provider_never_saw_is_failed_when_no_worker_holds_the_lease(
    wrun, bob, provider
):
    reserved = op(wrun, "pub-1", "reserved")
    run = cancel(wrun, bob)
    reserved.refresh_from_db()
    assert reserved.status == OperationStatus.FAILED
    assert "cancelled before this operation was performed" in reserved.reason
    assert run.status == RunStatus.CANCELLED


def test_while_a_worker_holds_the_lease_not_found_is_not_trusted(wrun, bob, provider):
    lease_acquire(
        tenant=wrun.tenant, run_id=wrun.id, owner="w1", ttl_seconds=60, expected_version=1
    )
    pending = op(wrun, "pub-1", "pending")
    run = cancel(wrun, bob)
    pending.refresh_from_db()
    # The worker may be sending it right now: it stays open and the run keeps waiting.
    assert (pending.status, run.status) == ("pending", RunStatus.CANCELLING)


def test_an_outcome_nobody_can_tell_waits_for_a_person(wrun, bob, provider):
    op(wrun, "pub-1", "reserved")
    provider.answers["pub-1"] = ProviderResult(Outcome.UNKNOWN, reason="the provider timed out")
    run = cancel(wrun, bob)
    assert run.status == RunStatus.CANCELLING
    settled = operation_record_outcome(
        tenant=run.tenant,
        run_id=run.id,
        idempotency_key="pub-1",
        outcome="failed",
        reason="support says it was never published",
        actor=Actor(user=bob),
    )
    assert settled.status == "failed"
    # Settling the last open operation finished the cancel in the same transaction.
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    (done,) = audit_events(run, "run.cancel_completed")
    assert done.actor == bob
    assert not run_cancel_complete(tenant=run.tenant, run_id=run.id, actor=Actor(user=bob))


def test_the_sweep_finishes_once_an_unavailable_provider_answers(acme, bob, provider):
    first, second = worker_run(acme, bob), worker_run(acme, bob)
    op(first, "a", "pending")
    op(second, "b", "pending")
    unavailable = ProviderResult(Outcome.UNAVAILABLE, reason="connection refused")
    provider.answers.update(a=unavailable, b=unavailable)
    assert cancel(first, bob).status == RunStatus.CANCELLING
    assert cancel(second, bob).status == RunStatus.CANCELLING
    assert runs_cancel_sweep() == 0
    provider.answers["a"] = ProviderResult(Outcome.FAILED, reason="rejected")
    assert runs_cancel_sweep() == 1
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, second.status) == (RunStatus.CANCELLED, RunStatus.CANCELLING)


def test_a_reserved_operation_whose_provider_is_unavailable_is_settled_by_a_person(
    wrun, bob, provider
):
    op(wrun, "pub-1", "reserved")
    provider.answers["pub-1"] = ProviderResult(Outcome.UNAVAILABLE, reason="connection refused")
    run = cancel(wrun, bob)
    assert run.status == RunStatus.CANCELLING
    assert runs_cancel_sweep() == 0  # the sweep cannot settle it either
    settled = operation_record_outcome(
        tenant=run.tenant,
        run_id=run.id,
        idempotency_key="pub-1",
        outcome="failed",
        reason="it was never sent: the worker was stopped before the call",
        actor=Actor(user=bob),
    )
    assert settled.status == OperationStatus.FAILED
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    (recorded,) = audit_events(run, "operation.outcome_recorded")
    assert (recorded.actor, recorded.details["from"]) == (bob, "reserved")
