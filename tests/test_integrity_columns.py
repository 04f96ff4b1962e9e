"""The clear, indexed position columns (state, step, sequence, the head's id) are checked
against the sealed envelope: a row altered in the database, which breaks no hash, is an
integrity failure for ``verify``, the history reads (API and console) and the next commit
of an external run, and pauses a worker's run on restore. The rows are altered with SQL as
an attacker with database access would (on PostgreSQL with the immutability trigger off)."""

from __future__ import annotations

import pytest

from checkpoints.models import Checkpoint, Run, RunStatus
from tests.api_support import new_run
from tests.factories import forge_checkpoint
from tests.runtime_support import advance, start

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(api_as, bob, acme, workflow):  # noqa: ANN001
    return api_as(bob, acme)


def external_run_at_review(api) -> dict:  # noqa: ANN001
    run = new_run(api)
    for version, state in ((1, "draft_answer"), (2, "review")):
        response = api.post(
            f"/api/v1/runs/{run['id']}/checkpoints",
            {"expected_version": version, "state": state, "step": state, "envelope": {}},
            format="json",
        )
        assert response.status_code == 201, response.content
    return run


def test_verify_and_the_history_refuse_a_checkpoint_row_whose_position_was_altered(
    api, client, bob
):  # noqa: ANN001
    run = external_run_at_review(api)
    second = Checkpoint.objects.get(run_id=run["id"], sequence=2)
    forge_checkpoint(second, state="done", step="evil")
    verify = api.get(f"/api/v1/runs/{run['id']}/verify").json()
    assert verify["ok"] is False
    assert any("checkpoint 2" in p and "state 'done'" in p for p in verify["problems"]), verify
    for path in (
        f"/api/v1/runs/{run['id']}/checkpoints",
        f"/api/v1/runs/{run['id']}/checkpoints/2",
    ):
        response = api.get(path)
        assert response.status_code == 409, (path, response.content)
        body = response.json()
        assert body["code"] == "integrity_failure" and "step 'evil'" in body["detail"], body
    # The other checkpoints still read; the console's checkpoint page names the failure.
    assert api.get(f"/api/v1/runs/{run['id']}/checkpoints/1").status_code == 200
    client.force_login(bob)
    page = client.get(f"/runs/{run['id']}/checkpoints/2/").content.decode()
    assert "Integrity failure" in page and "evil" in page


def test_an_external_run_whose_state_was_forged_accepts_no_commit_from_it(api, client, bob):  # noqa: ANN001
    run = external_run_at_review(api)
    # At review the run may go to publish only with an approval; forged to publish, the
    # next commit would be "publish → done" without anyone approving.
    Run.objects.filter(pk=run["id"]).update(state="publish", step="publish")
    before = Checkpoint.objects.filter(run_id=run["id"]).count()
    response = api.post(
        f"/api/v1/runs/{run['id']}/checkpoints",
        {"expected_version": 3, "state": "done", "step": "done", "envelope": {}},
        format="json",
    )
    assert response.status_code == 409, response.content
    body = response.json()
    assert body["code"] == "integrity_failure" and "state 'publish'" in body["detail"], body
    assert Checkpoint.objects.filter(run_id=run["id"]).count() == before
    forged = Run.objects.get(pk=run["id"])
    assert (forged.version, forged.status) == (3, RunStatus.WAITING_APPROVAL)
    verify = api.get(f"/api/v1/runs/{run['id']}/verify").json()
    assert not verify["ok"] and any(
        "the run's row says state 'publish'" in p for p in verify["problems"]
    )
    client.force_login(bob)
    assert "Integrity failure" in client.get(f"/runs/{run['id']}/").content.decode()


def test_an_unaltered_run_verifies_and_commits(api):  # noqa: ANN001
    run = external_run_at_review(api)
    assert api.get(f"/api/v1/runs/{run['id']}/verify").json()["ok"] is True
    assert api.get(f"/api/v1/runs/{run['id']}/checkpoints").status_code == 200
    response = api.post(
        f"/api/v1/runs/{run['id']}/checkpoints",
        {
            "expected_version": 3,
            "state": "rejected",
            "step": "review",
            "envelope": {},
            "status": "failed",  # leaving an approval state unapproved only ends the run
        },
        format="json",
    )
    assert response.status_code == 201, response.content


def test_a_worker_pauses_a_run_whose_head_checkpoint_row_was_altered(acme, settings):  # noqa: ANN001
    settings.CAIRN_STEPS_PER_TASK = 1
    run = start(acme, "research")
    advance(run)
    run.refresh_from_db()
    head = Checkpoint.objects.get(run=run, sequence=run.checkpoint_sequence)
    forge_checkpoint(head, step="evil")
    assert advance(run) == "paused"
    run.refresh_from_db()
    assert run.status == RunStatus.PAUSED_FOR_REVIEW
    assert "step 'evil'" in run.status_reason
    assert Checkpoint.objects.filter(run=run).count() == head.sequence
