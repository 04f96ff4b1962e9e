"""A checkpoint's ``side_effects`` are the run's own operations as they stand: an entry
naming a key the run never reserved, another tenant's or another run's key, or
``confirmed`` without (or with another) provider id is refused with 422 and nothing is
written; entries that match the rows, and a fork's inherited entries, are accepted."""

from __future__ import annotations

import pytest

from checkpoints.models import Checkpoint
from checkpoints.services.workflows import workflow_register
from runtime.services.operations import operation_confirm, operation_reserve
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.factories import SIMPLE_DEFINITION

pytestmark = pytest.mark.django_db


def reserve(run, key: str):  # noqa: ANN001, ANN201
    operation, _ = operation_reserve(
        tenant=run.tenant,
        run_id=run.id,
        idempotency_key=key,
        action="publish",
        target="t",
        request_fingerprint="f",
        actor=Actor.system("t"),
    )
    return operation


def commit(api, run, entries):  # noqa: ANN001, ANN201
    run.refresh_from_db()
    return api.post(
        f"/api/v1/runs/{run.id}/checkpoints",
        {
            "expected_version": run.version,
            "state": "draft_answer",
            "envelope": {"side_effects": entries},
        },
        format="json",
    )


def entry(key: str, status: str = "reserved", provider_id: str | None = None) -> dict:
    return {
        "idempotency_key": key,
        "action": "publish",
        "target": "t",
        "status": status,
        "provider_operation_id": provider_id,
    }


def test_claims_the_rows_do_not_back_are_refused(api_as, bob, acme, globex, charlie, run):  # noqa: ANN001
    api = api_as(bob, acme)
    mine = reserve(run, "mine")
    other_run = run_create(
        tenant=acme, workflow_type="research", execution="external", actor=Actor(user=bob)
    )
    reserve(other_run, "another-run")
    workflow_register(
        tenant=globex, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
    )
    theirs = run_create(
        tenant=globex, workflow_type="research", execution="external", actor=Actor(user=charlie)
    )
    reserve(theirs, "theirs")
    for claim in (
        entry("never-reserved"),
        entry("another-run"),
        entry("theirs"),
        entry("mine", "confirmed"),
        entry("mine", "confirmed", "pub-1"),
    ):
        answer = commit(api, run, [claim])
        assert answer.status_code == 422, (claim, answer.content)
        assert answer.json()["code"] == "invalid_envelope"
        assert list(answer.json()["fields"]) == ["side_effects.0"]
    assert Checkpoint.objects.filter(run=run).count() == 1
    operation_confirm(
        operation_id=mine.id, provider_operation_id="pub-1", result={}, actor=Actor.system("t")
    )
    assert commit(api, run, [entry("mine", "confirmed", "pub-2")]).status_code == 422
    assert commit(api, run, [entry("mine", "confirmed", "pub-1")]).status_code == 201
