"""Long-running tools: the provider's job id is recorded before anyone polls, and a worker
that is killed while it polls is followed by one that observes the same job; the provider
sees one submission. Also the job API over HTTP (``PUT …/operations/{key}/job``)."""

from __future__ import annotations

import pytest

from checkpoints.models import ExternalOperation, Run, RunStatus
from checkpoints.services.integrity import run_verify
from runtime.effects import JOB_BOUNDARIES
from tests.effects_workflows import runs_of, target_of
from tests.publishing import rescue_with_a_new_worker, run_killed_at
from tests.worker_fixtures import wait_for


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("boundary", JOB_BOUNDARIES)
def test_a_worker_killed_while_it_polls_a_job_is_followed_by_one_observing_the_same_job(
    boundary: str,
    acme,  # noqa: ANN001
    worker_factory,  # noqa: ANN001
    publishing_service,  # noqa: ANN001
    tmp_path,  # noqa: ANN001
):
    publishing_service.restart("--job-seconds", "8")  # still running when the rescuer comes
    run, count_dir, env = run_killed_at(
        boundary,
        tenant=acme,
        workflow_type="jobs_demo",
        title="A long publication",
        service=publishing_service,
        worker_factory=worker_factory,
        tmp_path=tmp_path,
    )
    operation = ExternalOperation.objects.get(run=run)
    # The job id was durable before the first poll.
    assert operation.status == "pending" and operation.provider_job_id.startswith("job_")
    stats = publishing_service.stats()
    assert stats["job_submissions"] == {operation.idempotency_key: 1}
    assert stats["publications"] == 0  # the job is still running
    polls_before = stats["job_polls"].get(operation.provider_job_id, 0)
    assert polls_before == (1 if boundary == "polling" else 0)

    rescue_with_a_new_worker(run, worker_factory=worker_factory, env=env)
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status == RunStatus.SUCCEEDED,
        what=f"the run to finish after a crash at {boundary}",
        timeout=90,
    )
    stats = publishing_service.stats()
    # One submission, one job, one publication; the rescuer only observed.
    assert stats["job_submissions"] == {operation.idempotency_key: 1}
    assert stats["jobs"] == 1
    assert stats["publications"] == 1
    assert stats["by_target"] == {target_of(run.pk): 1}
    assert stats["job_polls"][operation.provider_job_id] >= polls_before + 1
    operation.refresh_from_db()
    assert operation.status == "confirmed"
    assert operation.provider_operation_id == stats["ids"][operation.idempotency_key]
    assert runs_of(count_dir, "publish") == 2  # killed, then resumed
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]


def _ops(run, key: str = "", verb: str = "") -> str:  # noqa: ANN001
    url = f"/api/v1/runs/{run.id}/operations"
    return url + (f"/{key}" if key else "") + (f"/{verb}" if verb else "")


@pytest.mark.django_db
def test_a_runner_records_a_job_id_once_and_a_second_job_is_refused(run, api_as, bob, acme):  # noqa: ANN001
    client = api_as(bob, acme)
    reserved = client.post(
        _ops(run),
        {
            "idempotency_key": "render-1",
            "action": "render",
            "target": "video/1",
            "request_fingerprint": "a" * 64,
        },
        format="json",
    )
    assert reserved.status_code == 201
    recorded = client.put(_ops(run, "render-1", "job"), {"job_id": "job_abc"}, format="json")
    assert recorded.status_code == 200, recorded.json()
    assert (recorded.json()["provider_job_id"], recorded.json()["status"]) == ("job_abc", "pending")
    again = client.put(_ops(run, "render-1", "job"), {"job_id": "job_abc"}, format="json")
    assert again.status_code == 200  # a retried call is harmless
    second = client.put(_ops(run, "render-1", "job"), {"job_id": "job_other"}, format="json")
    assert second.status_code == 409
    assert second.json()["code"] == "operation_state_conflict"
    assert "job_abc" in second.json()["detail"]
    assert ExternalOperation.objects.get(idempotency_key="render-1").provider_job_id == "job_abc"
    confirmed = client.post(
        _ops(run, "render-1", "confirm"), {"provider_operation_id": "pub_1"}, format="json"
    )
    assert confirmed.status_code == 200
    late = client.put(_ops(run, "render-1", "job"), {"job_id": "job_late"}, format="json")
    assert late.status_code == 409


@pytest.mark.django_db
@pytest.mark.parametrize("body", [{}, {"job_id": ""}, {"job_id": "x" * 201}, {"job_id": "a\x01"}])
def test_a_job_id_that_is_not_one_is_a_400(run, api_as, bob, acme, body):  # noqa: ANN001
    client = api_as(bob, acme)
    client.post(
        _ops(run),
        {"idempotency_key": "k1", "action": "a", "target": "t", "request_fingerprint": "a" * 64},
        format="json",
    )
    answer = client.put(_ops(run, "k1", "job"), body, format="json")
    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_request"
    assert ExternalOperation.objects.get(idempotency_key="k1").provider_job_id == ""


@pytest.mark.django_db
def test_another_tenants_operation_job_is_a_404(run, api_as, bob, acme, charlie, globex):  # noqa: ANN001
    api_as(bob, acme).post(
        _ops(run),
        {"idempotency_key": "k2", "action": "a", "target": "t", "request_fingerprint": "a" * 64},
        format="json",
    )
    answer = api_as(charlie, globex).put(_ops(run, "k2", "job"), {"job_id": "j"}, format="json")
    assert answer.status_code == 404
    assert ExternalOperation.objects.get(idempotency_key="k2").provider_job_id == ""
