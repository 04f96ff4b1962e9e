"""POST /api/v1/bulk-actions (dry run and real) and GET /api/v1/bulk-actions/{id}: the same
rules, roles and tenant walls as the single-run actions (issue 29, item 3)."""

from __future__ import annotations

import uuid

import pytest
import yaml
from openapi_spec_validator import validate

from checkpoints.models import BulkAction, Run, RunStatus
from runtime.services.bulk import bulk_action_process
from runtime.services.cancel import run_cancel
from tenants.models import AuditEvent
from tenants.services import Actor
from tests.actions_support import worker_run

pytestmark = pytest.mark.django_db
URL = "/api/v1/bulk-actions"


@pytest.fixture(autouse=True)
def _no_dispatch(settings):  # noqa: ANN001
    settings.CAIRN_DISPATCH_ON_COMMIT = False


@pytest.fixture
def api(api_as, bob, acme):  # noqa: ANN001
    return api_as(bob, acme)


def test_a_dry_run_answers_the_count_and_each_refusal_and_writes_nothing(api, acme, bob):
    live = [worker_run(acme, bob) for _ in range(2)]
    gone = worker_run(acme, bob)
    run_cancel(tenant=acme, run_id=gone.pk, reason="gone", actor=Actor(user=bob))
    response = api.post(
        URL,
        {
            "action": "cancel",
            "reason": "clean up",
            "run_ids": [str(r.pk) for r in [*live, gone]],
            "dry_run": True,
        },
        format="json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["dry_run"], body["total"], body["actionable"], body["refused"]) == (
        True,
        3,
        2,
        1,
    )
    assert body["refusals"] == [
        {
            "run_id": str(gone.pk),
            "reason": "The run is already cancelled; there is nothing to cancel.",
        }
    ]
    assert not BulkAction.objects.exists()
    assert not AuditEvent.objects.filter(action="runs.bulk_action").exists()


def test_a_bulk_action_by_the_lists_filter_is_accepted_then_read_back(api, acme, bob):
    running = [worker_run(acme, bob) for _ in range(3)]
    other = worker_run(acme, bob)
    Run.objects.filter(pk=other.pk).update(status=RunStatus.PAUSED_FOR_REVIEW)
    response = api.post(
        URL,
        {"action": "pause", "reason": "incident 42", "filter": {"status": "running"}},
        format="json",
    )
    assert response.status_code == 202, response.json()
    body = response.json()
    assert (body["status"], body["total"], body["done"], body["action"]) == (
        "queued",
        3,
        0,
        "pause",
    )
    assert body["selection"] == {"filter": {"status": "running"}}
    assert body["actor"] == "bob"
    bulk_action_process(bulk_action_id=body["id"])
    read = api.get(f"{URL}/{body['id']}").json()
    assert (read["status"], read["done"], read["refused"]) == ("finished", 3, 0)
    assert set(Run.objects.filter(paused=True).values_list("pk", flat=True)) == {
        r.pk for r in running
    }
    assert api.get(f"{URL}/{body['id']}/refusals").json()["results"] == []
    assert [a["id"] for a in api.get(URL).json()["results"]] == [body["id"]]


def test_the_refusals_are_a_page_with_their_reasons(api, acme, bob):
    running = worker_run(acme, bob)
    missing = uuid.uuid4()
    body = api.post(
        URL,
        {"action": "resume", "reason": "go", "run_ids": [str(running.pk), str(missing)]},
        format="json",
    ).json()
    bulk_action_process(bulk_action_id=body["id"])
    page = api.get(f"{URL}/{body['id']}/refusals", {"limit": 1}).json()
    assert page["results"] == [
        {
            "run_id": str(running.pk),
            "reason": "The run is already running; there is nothing to resume.",
        }
    ]
    assert page["next"]
    rest = api.get(page["next"]).json()
    assert rest["results"] == [{"run_id": str(missing), "reason": "No such run."}]


def test_another_tenants_run_ids_are_not_found_and_its_bulk_actions_404(
    api, api_as, acme, bob, globex, charlie
):
    theirs = worker_run(globex, charlie)
    body = api.post(
        URL,
        {"action": "cancel", "reason": "x", "run_ids": [str(theirs.pk)], "dry_run": True},
        format="json",
    ).json()
    assert body["refusals"] == [{"run_id": str(theirs.pk), "reason": "No such run."}]
    mine = api.post(
        URL,
        {"action": "cancel", "reason": "x", "run_ids": [str(worker_run(acme, bob).pk)]},
        format="json",
    ).json()
    other = api_as(charlie, globex)
    for url in (f"{URL}/{mine['id']}", f"{URL}/{mine['id']}/refusals"):
        response = other.get(url)
        assert response.status_code == 404 and response.json()["code"] == "not_found"
    assert other.get(URL).json()["results"] == []
    theirs.refresh_from_db()
    assert theirs.status == RunStatus.RUNNING


def test_a_reviewer_may_not_start_a_bulk_action(api_as, carol, acme, bob):
    run = worker_run(acme, bob)
    response = api_as(carol, acme).post(
        URL, {"action": "cancel", "reason": "x", "run_ids": [str(run.pk)]}, format="json"
    )
    assert response.status_code == 403
    assert not BulkAction.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"action": "cancel", "run_ids": ["RUN"]}, "reason"),
        ({"action": "cancel", "reason": " ", "run_ids": ["RUN"]}, "reason"),
        ({"action": "fork", "reason": "x", "run_ids": ["RUN"]}, "action"),
        ({"action": "retry", "reason": "x", "run_ids": ["RUN"]}, "step"),
        ({"action": "cancel", "reason": "x"}, "run_ids"),
        ({"action": "cancel", "reason": "x", "run_ids": ["RUN"], "filter": {}}, "run_ids"),
        ({"action": "cancel", "reason": "x", "run_ids": []}, "run_ids"),
        ({"action": "cancel", "reason": "x", "filter": {"status": "nope"}}, "filter"),
        ({"action": "cancel", "reason": "x", "run_ids": ["not-a-uuid"]}, "run_ids"),
    ],
)
def test_bad_input_is_400_with_the_field_and_writes_nothing(api, acme, bob, body, field):
    run = worker_run(acme, bob)
    body = {
        k: ([str(run.pk) if x == "RUN" else x for x in v] if k == "run_ids" else v)
        for k, v in body.items()
    }
    response = api.post(URL, body, format="json")
    assert response.status_code == 400, response.json()
    fields = response.json().get("fields", {})
    assert field in {name.split(".")[0] for name in fields}, response.json()
    assert not BulkAction.objects.exists()


def test_a_selection_past_the_cap_is_400_with_a_sentence(api, acme, bob, settings):
    settings.CAIRN_BULK_ACTION_MAX_RUNS = 2
    for _ in range(3):
        worker_run(acme, bob)
    response = api.post(
        URL, {"action": "cancel", "reason": "x", "filter": {"status": "running"}}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["detail"].startswith("The selection holds 3 runs")
    assert "CAIRN_BULK_ACTION_MAX_RUNS" in response.json()["detail"]
    assert not BulkAction.objects.exists()


def test_an_unknown_bulk_action_is_404(api):
    assert api.get(f"{URL}/{uuid.uuid4()}").status_code == 404


def test_the_schema_describes_bulk_actions(client):
    document = yaml.safe_load(client.get("/api/v1/schema").content)
    validate(document)
    paths = document["paths"]
    assert set(paths[URL]) >= {"get", "post"}
    assert {"200", "202", "400", "403"} <= set(paths[URL]["post"]["responses"])
    assert "get" in paths[URL + "/{bulk_action_id}"]
    assert "get" in paths[URL + "/{bulk_action_id}/refusals"]
