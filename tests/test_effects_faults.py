"""Every fault mode of the local publishing service, through the real runtime (executor,
restore, reconciliation) in this process: each run ends confirmed with exactly one
publication, or paused for review with a reason naming the operation; never two effects.
"""

from __future__ import annotations

import pytest

from checkpoints.models import Checkpoint, ExternalOperation, Run, RunStatus
from checkpoints.services.integrity import run_verify
from checkpoints.services.reads import checkpoint_envelope
from runtime import Workflow
from runtime.effects import effect_perform
from runtime.executor import run_advance
from runtime.services.cancel import run_cancel
from runtime.services.operations import operation_reserve
from runtime.services.runs import run_create
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.effects_workflows import effects_demo, runs_of, target_of
from tests.publishing import free_port

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def service(settings, publishing_service):  # noqa: ANN001, ANN201
    settings.CAIRN_PUBLISHING_URL = publishing_service.url
    settings.CAIRN_PUBLISHING_TOKEN_REF = ""
    settings.CAIRN_PROVIDER_TIMEOUT_SECONDS = 1.0
    settings.CAIRN_RETRY_DELAY_SECONDS = 0
    return publishing_service


@pytest.fixture
def count_dir(tmp_path):  # noqa: ANN001, ANN201
    path = tmp_path / "counts"
    path.mkdir()
    return path


def start(tenant, count_dir) -> Run:  # noqa: ANN001
    assert effects_demo.workflow_type == "effects_demo"
    return run_create(
        tenant=tenant,
        workflow_type="effects_demo",
        inputs={"title": "Why build cairns?", "count_dir": str(count_dir)},
        budget={"max_attempts": 10},
        actor=Actor.system("test"),
    )


def advance(run: Run) -> Run:
    """One worker turn in this process: restore, then steps until the run waits or ends."""
    current = Run.objects.get(pk=run.pk)
    run_advance(run_id=current.pk, expected_version=current.version, owner="test-worker")
    return Run.objects.get(pk=run.pk)


def only_operation(run: Run) -> ExternalOperation:
    return ExternalOperation.objects.get(run=run)


def assert_published_once(service, run: Run) -> dict:  # noqa: ANN001
    stats = service.stats()
    assert stats["publications"] == 1
    assert stats["by_target"] == {target_of(run.pk): 1}
    return stats


def assert_finished_confirmed(service, run: Run, count_dir) -> ExternalOperation:  # noqa: ANN001
    assert run.status == RunStatus.SUCCEEDED, run.status_reason
    stats = assert_published_once(service, run)
    operation = ExternalOperation.objects.get(run=run, status="confirmed")
    assert operation.provider_operation_id == stats["ids"][operation.idempotency_key]
    assert runs_of(count_dir, "announce") == 1
    assert runs_of(count_dir, "prepare") == 1
    assert run_verify(tenant=run.tenant, run_id=run.pk)["ok"]
    return operation


def test_a_clean_effect_commits_a_pending_then_a_confirmed_checkpoint(acme, service, count_dir):
    run = advance(start(acme, count_dir))
    operation = assert_finished_confirmed(service, run, count_dir)
    assert operation.attempts == 1 and operation.provider == "publishing"
    assert (operation.step, operation.action) == ("publish", "publish")
    steps = list(
        Checkpoint.objects.filter(run=run).order_by("sequence").values_list("state", "step")
    )
    assert steps == [
        ("prepare", ""),
        ("publish", "prepare"),
        ("publish", ""),  # pending
        ("publish", ""),  # post-action
        ("announce", "publish"),
        ("done", "announce"),
    ]
    pending, confirmed, accepted = (
        checkpoint_envelope(c)
        for c in Checkpoint.objects.filter(run=run, sequence__in=[3, 4, 5]).order_by("sequence")
    )
    key = operation.idempotency_key
    assert pending["position"]["pending_action"] == key
    assert pending["side_effects"] == [
        {
            "idempotency_key": key,
            "action": "publish",
            "target": target_of(run.pk),
            "provider_operation_id": None,
            "status": "pending",
        }
    ]
    assert confirmed["position"]["pending_action"] is None
    assert confirmed["side_effects"][0]["status"] == "confirmed"
    assert confirmed["side_effects"][0]["provider_operation_id"] == operation.provider_operation_id
    assert accepted["side_effects"] == confirmed["side_effects"]
    assert accepted["evidence"]["outputs"]["publish"] == {
        "provider_operation_id": operation.provider_operation_id,
        "replayed": False,
    }
    actions = list(
        AuditEvent.objects.filter(run_id=run.pk, action__startswith="operation.")
        .order_by("id")
        .values_list("action", flat=True)
    )
    assert actions == ["operation.reserved", "operation.pending", "operation.confirmed"]


@pytest.mark.parametrize("fault", ["drop", "timeout"])
def test_an_accepted_request_whose_answer_is_lost_is_confirmed_by_lookup_once(
    acme, service, count_dir, fault: str
):
    service.faults(fault)
    run = advance(start(acme, count_dir))
    operation = assert_finished_confirmed(service, run, count_dir)
    assert operation.attempts == 1
    assert service.stats()["perform_requests"] == {operation.idempotency_key: 1}


def test_a_failure_before_accepting_is_sent_again_under_the_same_key(acme, service, count_dir):
    service.faults("fail")
    run = advance(start(acme, count_dir))
    assert run.status == RunStatus.WAITING_RETRY
    operation = only_operation(run)
    assert operation.status == "pending"
    assert "no record" in operation.reason
    assert service.stats()["publications"] == 0
    run = advance(run)
    again = assert_finished_confirmed(service, run, count_dir)
    assert (again.pk, again.attempts) == (operation.pk, 2)


def test_an_unreachable_provider_is_retried_and_never_called_twice(
    acme, service, count_dir, settings
):
    settings.CAIRN_PUBLISHING_URL = f"http://127.0.0.1:{free_port()}"
    run = advance(start(acme, count_dir))
    assert run.status == RunStatus.WAITING_RETRY
    assert "refused the connection" in run.status_reason
    operation = only_operation(run)
    assert operation.status == "pending" and operation.attempts == 1
    settings.CAIRN_PUBLISHING_URL = service.url
    run = advance(run)
    assert assert_finished_confirmed(service, run, count_dir).pk == operation.pk


def test_a_provider_without_lookup_is_not_asked_when_the_answer_arrives(acme, service, count_dir):
    service.faults(lookup="nolookup")
    run = advance(start(acme, count_dir))
    assert_finished_confirmed(service, run, count_dir)


def _paused_on_an_unknown_outcome(service, acme, count_dir, fault: str) -> Run:  # noqa: ANN001
    service.faults(fault, lookup="nolookup")
    run = advance(start(acme, count_dir))
    operation = only_operation(run)
    assert (run.status, operation.status) == (RunStatus.WAITING_RETRY, "unknown")
    run = advance(run)  # the restore reconciles, and the provider still cannot tell
    assert run.status == RunStatus.PAUSED_FOR_REVIEW
    assert operation.idempotency_key in run.status_reason
    assert "cannot be told" in run.status_reason
    assert only_operation(run).status == "unknown"
    assert advance(run).status == RunStatus.PAUSED_FOR_REVIEW  # a stray command changes nothing
    # While nobody knows the outcome the provider got the request at most once (a failure
    # before accepting records none), never again.
    stats = service.stats()
    assert set(stats["perform_requests"]) <= {operation.idempotency_key}
    assert stats["perform_requests"].get(operation.idempotency_key, 0) <= 1
    assert stats["publications"] <= 1
    return run


@pytest.mark.parametrize("fault", ["drop", "timeout"])
def test_an_ambiguity_the_provider_cannot_resolve_waits_for_an_operator(
    acme, service, count_dir, api_as, bob, fault: str
):
    run = _paused_on_an_unknown_outcome(service, acme, count_dir, fault)
    operation = only_operation(run)
    provider_id = service.stats()["ids"][operation.idempotency_key]  # what the operator finds
    client = api_as(bob, acme)
    recorded = client.post(
        f"/api/v1/runs/{run.pk}/operations/{operation.idempotency_key}/confirm",
        {"provider_operation_id": provider_id, "reason": "seen on the publishing site"},
        format="json",
    )
    assert recorded.status_code == 200, recorded.json()
    resumed = client.post(
        f"/api/v1/runs/{run.pk}/actions/resume", {"expected_version": run.version}, format="json"
    )
    assert resumed.status_code == 200, resumed.json()
    run = advance(run)
    operation = assert_finished_confirmed(service, run, count_dir)
    assert operation.provider_operation_id == provider_id
    assert service.stats()["perform_requests"] == {operation.idempotency_key: 1}
    assert AuditEvent.objects.filter(action="operation.outcome_recorded", actor=bob).exists()


def test_an_operator_who_finds_nothing_published_lets_the_step_send_a_new_request(
    acme, service, count_dir, api_as, bob
):
    run = _paused_on_an_unknown_outcome(service, acme, count_dir, "fail")
    first = only_operation(run)
    assert service.stats()["publications"] == 0
    client = api_as(bob, acme)
    client.post(
        f"/api/v1/runs/{run.pk}/operations/{first.idempotency_key}/fail",
        {"reason": "nothing on the publishing site"},
        format="json",
    )
    client.post(
        f"/api/v1/runs/{run.pk}/actions/resume", {"expected_version": run.version}, format="json"
    )
    run = advance(run)
    second = assert_finished_confirmed(service, run, count_dir)
    assert second.idempotency_key == first.idempotency_key[:-1] + "2"
    assert ExternalOperation.objects.get(pk=first.pk).status == "failed"


def test_a_step_that_would_send_a_different_request_under_its_key_fails_unsent(
    acme, service, count_dir
):
    from runtime.effects import effect_key

    run = start(acme, count_dir)
    key = effect_key(run_id=run.pk, step="publish", action="publish", target=target_of(run.pk))
    operation_reserve(
        tenant=acme,
        run_id=run.pk,
        idempotency_key=key,
        action="publish",
        target=target_of(run.pk),
        request_fingerprint="0" * 64,  # what an earlier run of the step had asked for
        actor=Actor.system("earlier attempt"),
    )
    run = advance(run)
    assert run.status == RunStatus.FAILED
    assert "different request" in run.status_reason
    assert service.stats()["publications"] == 0


def _latest_side_effects(run: Run) -> list[dict]:
    latest = Checkpoint.objects.get(run=run, sequence=run.checkpoint_sequence)
    return checkpoint_envelope(latest)["side_effects"]


def test_a_retry_checkpoint_after_the_pending_checkpoint_still_lists_the_operation(
    acme, service, count_dir
):
    service.faults("fail")
    run = advance(start(acme, count_dir))
    assert run.status == RunStatus.WAITING_RETRY
    operation = only_operation(run)
    assert _latest_side_effects(run) == [
        {
            "idempotency_key": operation.idempotency_key,
            "action": "publish",
            "target": target_of(run.pk),
            "provider_operation_id": None,
            "status": "pending",
        }
    ]


def test_a_failure_checkpoint_lists_the_operation_as_the_operations_table_has_it(
    acme, service, count_dir
):
    service.faults("drop", lookup="nolookup")
    run = advance(start(acme, count_dir))
    operation = only_operation(run)
    assert (run.status, operation.status) == (RunStatus.WAITING_RETRY, "unknown")
    # The pending checkpoint said "pending"; the retry checkpoint says what is known now.
    assert [(e["idempotency_key"], e["status"]) for e in _latest_side_effects(run)] == [
        (operation.idempotency_key, "unknown")
    ]


def test_a_run_failed_by_its_last_attempt_keeps_the_pending_operation_in_its_history(
    acme, service, count_dir
):
    service.faults("fail")
    run = run_create(
        tenant=acme,
        workflow_type="effects_demo",
        inputs={"title": "One try", "count_dir": str(count_dir)},
        budget={"max_attempts": 2},  # prepare and one attempt of publish
        actor=Actor.system("test"),
    )
    run = advance(run)
    assert run.status == RunStatus.FAILED, run.status_reason
    assert "budget exhausted" in run.status_reason
    assert [(e["idempotency_key"], e["status"]) for e in _latest_side_effects(run)] == [
        (only_operation(run).idempotency_key, "pending")
    ]


interrupted = Workflow("interrupted", version="1")


@interrupted.effect("publish", next="done", action="publish")
def publish_after_a_cancel(ctx):  # noqa: ANN001, ANN201
    # An operator cancels while the step runs, before its effect is reserved.
    run_cancel(
        tenant=ctx.tenant,
        run_id=ctx.run_id,
        reason="wrong audience",
        actor=Actor.system("operator"),
        settle=False,
    )
    effect_perform(ctx, target="blog/interrupted", request={"title": "Never sent"})
    return {}


interrupted.terminal("done")


def test_an_effect_of_a_run_cancelled_mid_step_is_never_reserved_nor_sent(acme, service, caplog):
    run = run_create(
        tenant=acme, workflow_type="interrupted", inputs={}, actor=Actor.system("test")
    )
    # Another operation still open, so the cancel waits in ``cancelling``.
    operation_reserve(
        tenant=acme,
        run_id=run.pk,
        idempotency_key=f"earlier-{run.pk}",
        action="publish",
        target="blog/earlier",
        request_fingerprint="e" * 64,
        actor=Actor.system("an earlier caller"),
    )
    outcome = run_advance(run_id=run.pk, expected_version=run.version, owner="test-worker")
    assert outcome == "lease_lost"
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLING
    assert list(ExternalOperation.objects.filter(run=run).values_list("target", flat=True)) == [
        "blog/earlier"
    ]
    assert service.stats()["publications"] == 0
    assert not [r for r in caplog.records if r.getMessage() == "step raised"]
