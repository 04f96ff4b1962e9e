"""Reconciliation: ask the provider by key, record what it says, pause only for what it
cannot tell; never call perform."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from checkpoints.models import Execution, ExternalOperation, Run, RunStatus
from runtime import hooks
from runtime.providers import registry
from runtime.providers.base import EffectRequest, ProviderResult
from runtime.providers.http import HttpProvider
from runtime.rescue import runs_rescue
from runtime.services.operations import (
    operation_mark_pending,
    operation_mark_unknown,
    operation_reserve,
)
from runtime.services.reconcile import run_reconcile
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.publishing import free_port

pytestmark = pytest.mark.django_db

RECONCILER = Actor.system("reconciler")


@pytest.fixture
def service(settings, publishing_service):  # noqa: ANN001, ANN201
    settings.CAIRN_PUBLISHING_URL = publishing_service.url
    settings.CAIRN_PUBLISHING_TOKEN_REF = ""
    settings.CAIRN_PROVIDER_TIMEOUT_SECONDS = 1.0
    return publishing_service


def pending(run, key: str, *, provider: str = "publishing") -> ExternalOperation:  # noqa: ANN001
    operation, _ = operation_reserve(
        tenant=run.tenant,
        run_id=run.id,
        idempotency_key=key,
        action="publish",
        target=f"blog/{key}",
        request_fingerprint="f" * 64,
        provider=provider,
        actor=RECONCILER,
    )
    return operation_mark_pending(operation_id=operation.id, actor=RECONCILER)


def publish_directly(service, key: str) -> str:  # noqa: ANN001
    """What a worker that died right after the provider accepted had done."""
    done = HttpProvider(name="publishing", base_url=service.url).perform(
        key=key, request=EffectRequest(action="publish", target=f"blog/{key}")
    )
    return done.provider_operation_id


def status(key: str) -> str:
    return ExternalOperation.objects.get(idempotency_key=key).status


def test_it_records_what_the_provider_knows_and_calls_nothing(run, service):
    pending(run, "sent")
    pending(run, "never-sent")
    provider_id = publish_directly(service, "sent")
    report = run_reconcile(run=run, actor=RECONCILER)
    assert (report.confirmed, report.not_found, report.unknown) == (["sent"], ["never-sent"], [])
    assert report.pause_reason is None and report.retry_reason is None
    confirmed = ExternalOperation.objects.get(idempotency_key="sent")
    assert (confirmed.status, confirmed.provider_operation_id) == ("confirmed", provider_id)
    # Not found stays pending: the effect step sends it again under the same key.
    assert status("never-sent") == "pending"
    assert "no record" in ExternalOperation.objects.get(idempotency_key="never-sent").reason
    assert service.stats()["perform_requests"] == {"sent": 1}
    assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING


def test_a_provider_that_cannot_tell_makes_the_operation_unknown_and_names_it(run, service):
    pending(run, "ambiguous")
    publish_directly(service, "ambiguous")
    service.faults(lookup="nolookup")
    report = run_reconcile(run=run, actor=RECONCILER)
    assert report.unknown == ["ambiguous"]
    assert status("ambiguous") == "unknown"
    assert "ambiguous" in report.pause_reason and "cannot tell" in report.pause_reason
    # The restore hook turns that into the reason the run is paused with.
    assert "ambiguous" in hooks.operations_reconcile(run=run, envelope={})


def test_an_unknown_operation_is_settled_once_the_provider_can_tell(run, service):
    operation = pending(run, "later")
    operation_mark_unknown(operation_id=operation.id, actor=RECONCILER, reason="timed out")
    provider_id = publish_directly(service, "later")
    report = run_reconcile(run=run, actor=RECONCILER)
    assert report.confirmed == ["later"] and report.pause_reason is None
    settled = ExternalOperation.objects.get(pk=operation.pk)
    assert settled.provider_operation_id == provider_id
    event = AuditEvent.objects.filter(action="operation.outcome_recorded").get()
    assert (event.actor_label, event.details["from"]) == ("reconciler", "unknown")


def test_an_unknown_operation_the_provider_never_saw_still_needs_a_person(run, service):
    operation = pending(run, "gone")
    operation_mark_unknown(operation_id=operation.id, actor=RECONCILER)
    report = run_reconcile(run=run, actor=RECONCILER)
    assert report.unknown == ["gone"]
    assert status("gone") == "unknown"


def test_an_unreachable_provider_leaves_the_operation_pending_to_ask_again(run, settings):
    settings.CAIRN_PUBLISHING_URL = f"http://127.0.0.1:{free_port()}"
    pending(run, "offline")
    report = run_reconcile(run=run, actor=RECONCILER)
    assert report.unavailable == ["offline"] and report.pause_reason is None
    assert "offline" in report.retry_reason
    assert status("offline") == "pending"


def test_an_operation_without_a_known_adapter_cannot_be_told(run):
    pending(run, "external", provider="")
    pending(run, "mystery", provider="no-such-adapter")
    report = run_reconcile(run=run, actor=RECONCILER)
    assert report.unknown == ["external", "mystery"]
    assert "no provider adapter" in report.pause_reason


class StatusSpy:
    """A fake provider (fakes are for external providers only): it notes the run's status
    while it is being asked, and confirms everything."""

    name = "spy"
    seen: list[str] = []

    def perform(self, *, key: str, request: EffectRequest) -> ProviderResult:
        raise AssertionError("reconciliation never performs")

    def lookup(self, *, key: str, client_reference: str = "") -> ProviderResult:
        StatusSpy.seen.append(Run.objects.values_list("status", flat=True).get())
        return ProviderResult.confirmed(f"spy-{key}", {})


@pytest.fixture
def spy(monkeypatch):  # noqa: ANN001, ANN201
    monkeypatch.setitem(registry._FACTORIES, "spy", StatusSpy)
    monkeypatch.setattr(StatusSpy, "seen", [])
    return StatusSpy


def test_the_run_is_reconciling_while_the_provider_is_asked_then_as_before(run, spy):
    pending(run, "watched", provider="spy")
    run_reconcile(run=run, actor=RECONCILER)
    assert spy.seen == [RunStatus.RECONCILING]
    assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING


def test_a_run_with_nothing_open_is_not_touched(run, django_assert_num_queries):
    with django_assert_num_queries(1):
        report = run_reconcile(run=run, actor=RECONCILER)
    assert report.pause_reason is None and report.confirmed == []


def test_a_run_left_reconciling_by_a_dead_worker_is_rescued_and_runs_on(run, spy):
    pending(run, "orphan", provider="spy")
    Run.objects.filter(pk=run.pk).update(
        execution=Execution.WORKER,
        status=RunStatus.RECONCILING,
        lease_owner="dead-worker",
        lease_expires_at=timezone.now() - timedelta(seconds=1),
    )
    assert runs_rescue() == 1
    run.refresh_from_db()
    run_reconcile(run=run, actor=RECONCILER)
    assert Run.objects.get(pk=run.pk).status == RunStatus.RUNNING
    assert status("orphan") == "confirmed"
