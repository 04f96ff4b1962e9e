"""The approvals port is wired by the setting, not by imports: the store and the engine reach
approvals only through the implementation ``CAIRN_APPROVALS_PORT`` names.

A stub port here stands at the seam itself (the setting names it instead of the approvals
app), so these tests prove the lower layers call through the port. The real approvals
behind the port are proved by the approval, commit-rules, cancel, retry and runner tests.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import override_settings

import approvals.port
from cairn.errors import ApprovalClosed, ApprovalRequired
from checkpoints.approvals_port import ApprovalOutcome, ApprovalUse, approvals_port
from checkpoints.models import Checkpoint, Run, RunStatus
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from runtime import hooks
from runtime.definition import ApprovalSpec
from runtime.services.cancel import run_cancel
from runtime.services.runner import run_next_command
from tenants.services import Actor
from tests.approvals_support import at_review, draft

pytestmark = pytest.mark.django_db

STUB_PATH = "tests.test_approvals_port.STUB"


class StubPort:
    """Answers every approvals operation as told and records each call (with whether a
    transaction was open), so a test sees what the lower layers asked."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.use = ApprovalUse(uuid.uuid4(), "publish", "0" * 64)
        self.consume_refusal: Exception | None = None
        self.approved: uuid.UUID | None = None
        self.outcome = ApprovalOutcome("approved", "stub says yes")

    def _record(self, name: str, **kwargs: Any) -> None:
        self.calls.append((name, {**kwargs, "in_transaction": connection.in_atomic_block}))

    def commit_approval_check(self, **kwargs: Any) -> ApprovalUse | None:
        self._record("commit_approval_check", **kwargs)
        return self.use

    def commit_approval_consume(self, **kwargs: Any) -> None:
        self._record("commit_approval_consume", **kwargs)
        if self.consume_refusal is not None:
            raise self.consume_refusal

    def restore_approval_outcome(self, **kwargs: Any) -> ApprovalOutcome:
        self._record("restore_approval_outcome", **kwargs)
        return self.outcome

    def approval_requests_close(self, **kwargs: Any) -> int:
        self._record("approval_requests_close", **kwargs)
        return 0

    def approved_request_id(self, **kwargs: Any) -> uuid.UUID | None:
        self._record("approved_request_id", **kwargs)
        return self.approved

    def runs_with_unused_decision(self, *, runs: Any) -> Any:
        self._record("runs_with_unused_decision", runs=runs)
        return runs.none()

    def approval_awaited(self, **kwargs: Any) -> None:
        self._record("approval_awaited", **kwargs)
        return None

    def approvals_consumed(self, **kwargs: Any) -> list:
        self._record("approvals_consumed", **kwargs)
        return []


STUB = StubPort()


class HalfAPort:
    """Has the commit's operations only: not an approvals port."""

    def commit_approval_check(self, **kwargs: Any) -> None:
        return None

    def commit_approval_consume(self, **kwargs: Any) -> None:
        return None


HALF = HalfAPort()


@pytest.fixture
def stub():  # noqa: ANN201
    STUB.reset()
    with override_settings(CAIRN_APPROVALS_PORT=STUB_PATH):
        yield STUB
    STUB.reset()


def _evidence(artifact) -> dict:  # noqa: ANN001
    return {
        "artifacts": [{"id": str(artifact.id), "sha256": artifact.sha256, "name": "draft"}],
        "validators": [],
    }


def _leave_review(run: Run, artifact) -> None:  # noqa: ANN001
    run.refresh_from_db()
    checkpoint_commit(
        tenant=run.tenant,
        run_id=run.id,
        request=CommitRequest(
            expected_version=run.version,
            state="publish",
            step="review",
            envelope={"evidence": _evidence(artifact)},
            actor=Actor.system("worker w1"),
        ),
    )


def _names(port: StubPort) -> list[str]:
    return [name for name, _ in port.calls]


def test_the_project_wires_the_approvals_app_and_an_override_rewires_it(settings):  # noqa: ANN001
    assert settings.CAIRN_APPROVALS_PORT == "approvals.port.port"
    assert approvals_port() is approvals.port.port
    with override_settings(CAIRN_APPROVALS_PORT=STUB_PATH):
        assert approvals_port() is STUB
    assert approvals_port() is approvals.port.port  # cached per value, not once for all


@pytest.mark.django_db(transaction=True)  # so "inside a transaction" means the commit's
def test_a_commit_leaving_an_approval_state_checks_and_consumes_through_the_port(run, acme, stub):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(run, artifact)
    assert stub.calls == []  # entering an approval state asks approvals nothing
    left_version = run.version
    # No request exists: the approvals app would refuse (approval_required); the stub
    # allows it, so the store decided nothing on its own.
    _leave_review(run, artifact)
    assert _names(stub) == ["commit_approval_check", "commit_approval_consume"]
    check, consume = (kwargs for _, kwargs in stub.calls)
    assert (check["run"].state, check["run"].version, check["state"]) == (
        "review",
        left_version,
        "publish",
    )
    assert check["evidence"]["artifacts"][0]["sha256"] == artifact.sha256
    assert consume["use"] == stub.use
    assert consume["run"].version == left_version
    assert consume["in_transaction"] is True  # inside the commit's transaction
    run.refresh_from_db()
    assert (run.state, run.version) == ("publish", left_version + 1)


def test_a_consumption_the_port_refuses_writes_nothing(run, acme, stub):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(run, artifact)
    before = (run.version, run.checkpoint_sequence, run.state)
    stub.consume_refusal = ApprovalClosed("The approval is consumed; it cannot be used.")
    with pytest.raises(ApprovalClosed):
        _leave_review(run, artifact)
    run.refresh_from_db()
    assert (run.version, run.checkpoint_sequence, run.state) == before
    assert Checkpoint.objects.filter(run=run).count() == run.checkpoint_sequence


def test_the_restore_gate_asks_the_port(run, stub):  # noqa: ANN001
    spec = ApprovalSpec(
        state="review", next="publish", rejected=None, artifact="draft", action="publish"
    )
    envelope = {"evidence": {"artifacts": []}}
    assert hooks.approval_gate(run=run, spec=spec, envelope=envelope) is stub.outcome
    assert _names(stub) == ["restore_approval_outcome"]
    (_, kwargs) = stub.calls[0]
    assert (kwargs["run"], kwargs["spec"], kwargs["envelope"]) == (run, spec, envelope)


def test_a_runner_is_told_of_the_approved_request_the_port_names(run, acme, stub):  # noqa: ANN001
    run = at_review(run, draft(acme))
    assert run.status == RunStatus.WAITING_APPROVAL
    assert run_next_command(run=run).command == "wait"
    stub.approved = uuid.uuid4()
    answer = run_next_command(run=run)
    assert (answer.command, answer.due) == ("approval_decided", True)
    assert answer.approval_request_id == str(stub.approved)
    assert _names(stub) == ["approved_request_id", "approved_request_id"]


@pytest.mark.django_db(transaction=True)  # so "inside a transaction" means the cancel's
def test_cancelling_closes_the_runs_requests_through_the_port(run, bob, stub):  # noqa: ANN001
    run_cancel(tenant=run.tenant, run_id=run.id, reason="wrong question", actor=Actor(user=bob))
    assert _names(stub) == ["approval_requests_close"]
    (_, kwargs) = stub.calls[0]
    assert kwargs["run"].pk == run.pk
    assert kwargs["reason"] == "The run was cancelled by bob: wrong question"
    assert "status" not in kwargs  # closed, the default: the run will not ask again
    assert kwargs["in_transaction"] is True  # in the transaction that moves the run
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED


@pytest.mark.parametrize(
    ("path", "sentence"),
    [
        ("", "CAIRN_APPROVALS_PORT is not set"),
        (
            "approvals.no_such_module.port",
            "CAIRN_APPROVALS_PORT names 'approvals.no_such_module.port', which cannot be imported",
        ),
        ("approvals.port.no_such_port", "which cannot be imported"),
        (
            "tests.test_approvals_port.HALF",
            "CAIRN_APPROVALS_PORT names 'tests.test_approvals_port.HALF', which lacks the "
            "approvals operation(s) restore_approval_outcome, approval_requests_close, "
            "approved_request_id, runs_with_unused_decision, approval_awaited",
        ),
    ],
)
def test_a_misconfigured_port_fails_with_a_sentence_naming_the_setting(
    path: str, sentence: str, run, acme
):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(run, artifact)
    with override_settings(CAIRN_APPROVALS_PORT=path):
        with pytest.raises(ImproperlyConfigured) as refused:
            approvals_port()
        assert sentence in str(refused.value)
        # The commit that needs approvals fails loudly instead of deciding without them.
        with pytest.raises(ImproperlyConfigured):
            _leave_review(run, artifact)
    run.refresh_from_db()
    assert run.state == "review"


def test_with_the_approvals_app_behind_the_port_the_same_commit_is_refused(run, acme):  # noqa: ANN001
    artifact = draft(acme)
    run = at_review(run, artifact)
    with pytest.raises(ApprovalRequired):
        _leave_review(run, artifact)


def test_a_misconfigured_port_is_reported_by_the_system_checks():
    from django.core.checks import run_checks

    assert not [e for e in run_checks() if e.id == "cairn.E102"]
    with override_settings(CAIRN_APPROVALS_PORT="approvals.port.no_such_port"):
        errors = [e for e in run_checks() if e.id == "cairn.E102"]
    assert len(errors) == 1
    assert "CAIRN_APPROVALS_PORT names 'approvals.port.no_such_port'" in errors[0].msg
