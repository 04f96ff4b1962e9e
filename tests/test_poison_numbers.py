"""Poison numbers: a whole-number float beyond ±(2^53 − 1) and below 1e21 (``1e20``,
``9007199254740993.0``) is refused on every write path, because RFC 8785 writes it as an
integer that every later read then refuses (from 1e21 on it writes ``1e+21``, which reads
back as the same float); and a row written before this check (verify,
the API's reads, the console's pages) is reported as an integrity problem, never a 500 or
an undocumented 422."""

from __future__ import annotations

import pytest

from cairn.errors import InvalidEnvelope
from checkpoints import envelope as env
from checkpoints.models import Checkpoint, ExternalOperation, Run
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from runtime.services.operations import operation_confirm, operation_reserve
from runtime.services.runs import run_create
from tenants.services import Actor

POISON = ["1e20", "9007199254740993.0", "-1.5e20", "9007199254740992.0", "9.99e20"]


def _raw(api, method: str, path: str, body: str):  # noqa: ANN001, ANN202
    return api.generic(method, path, body.encode(), content_type="application/json")


@pytest.fixture
def api(api_as, bob, acme, workflow):  # noqa: ANN001
    return api_as(bob, acme)


@pytest.mark.django_db
@pytest.mark.parametrize("number", POISON)
def test_every_api_write_path_refuses_a_whole_float_beyond_2_53(api, run, number):  # noqa: ANN001
    operation, _ = operation_reserve(
        tenant=run.tenant,
        run_id=run.id,
        idempotency_key="k-1",
        action="publish",
        target="t",
        request_fingerprint="f",
        actor=Actor.system("t"),
    )
    runs, checkpoints = Run.objects.count(), Checkpoint.objects.count()
    writes = {
        "run inputs": (
            "POST",
            "/api/v1/runs",
            f'{{"workflow_type": "research", "inputs": {{"n": {number}}}}}',
        ),
        "commit": (
            "POST",
            f"/api/v1/runs/{run.id}/checkpoints",
            f'{{"expected_version": {run.version}, "state": "draft_answer", '
            f'"envelope": {{"inputs": {{"n": [{number}]}}}}}}',
        ),
        "commit budgets": (
            "POST",
            f"/api/v1/runs/{run.id}/checkpoints",
            f'{{"expected_version": {run.version}, "state": "draft_answer", '
            f'"envelope": {{"budgets": {{"cost_used": {number}}}}}}}',
        ),
        "fork patch": (
            "POST",
            f"/api/v1/runs/{run.id}/actions/fork",
            f'{{"from_sequence": 1, "reason": "r", "inputs_patch": {{"n": {number}}}}}',
        ),
        "operation result": (
            "POST",
            f"/api/v1/runs/{run.id}/operations/k-1/confirm",
            f'{{"provider_operation_id": "p-1", "result": {{"n": {number}}}}}',
        ),
    }
    for what, (method, path, body) in writes.items():
        answer = _raw(api, method, path, body)
        assert answer.status_code == 400, (what, answer.content)
        refusal = answer.json()
        assert refusal["code"] == "invalid_request", (what, refusal)
        assert "2^53" in refusal["detail"], (what, refusal)
    assert (Run.objects.count(), Checkpoint.objects.count()) == (runs, checkpoints)
    # 1e21 and beyond are written with an exponent and read back as the same float.
    assert (
        _raw(api, *writes["commit"][:2], writes["commit"][2].replace(number, "1e21")).status_code
        == 201
    )
    assert ExternalOperation.objects.get(pk=operation.pk).status == "reserved"


@pytest.mark.django_db
@pytest.mark.parametrize("number", [1e20, 9007199254740993.0, -(2.0**60)])
def test_every_service_write_path_refuses_it_too(run, acme, bob, number):  # noqa: ANN001
    """Python steps, the LangGraph saver and the console write through the services."""
    with pytest.raises(InvalidEnvelope, match="2\\^53"):
        run_create(
            tenant=acme,
            workflow_type="research",
            inputs={"n": number},
            execution="external",
            actor=Actor(user=bob),
        )
    with pytest.raises(InvalidEnvelope, match="2\\^53"):
        checkpoint_commit(
            tenant=acme,
            run_id=run.id,
            request=CommitRequest(
                expected_version=run.version,
                state="draft_answer",
                envelope={"inputs": {"deep": [{"n": number}]}},
                actor=Actor(user=bob),
            ),
        )
    operation, _ = operation_reserve(
        tenant=acme,
        run_id=run.id,
        idempotency_key="k-1",
        action="publish",
        target="t",
        request_fingerprint="f",
        actor=Actor.system("t"),
    )
    with pytest.raises(InvalidEnvelope, match="2\\^53"):
        operation_confirm(
            operation_id=operation.id,
            provider_operation_id="p-1",
            result={"n": number},
            actor=Actor.system("t"),
        )
    assert Checkpoint.objects.filter(run=run).count() == 1
    assert ExternalOperation.objects.get(pk=operation.pk).status == "reserved"


@pytest.mark.django_db
def test_the_console_fork_form_refuses_it(client, bob, run):  # noqa: ANN001
    client.force_login(bob)
    answer = client.post(
        f"/runs/{run.id}/actions/fork/",
        {
            "from_sequence": "1",
            "inputs": '{"n": 1e20}',
            "reason": "r",
            "version": run.version,
            "confirm": "1",
        },
    )
    assert "2^53" in answer.content.decode()
    assert Run.objects.count() == 1


@pytest.fixture
def poisoned(run, bob, monkeypatch):  # noqa: ANN001
    """A checkpoint written before the check: RFC 8785 stored 1e20 as an integer."""
    with monkeypatch.context() as patch:
        patch.setattr(env, "json_problem", lambda value, where="": None)
        checkpoint_commit(
            tenant=run.tenant,
            run_id=run.id,
            request=CommitRequest(
                expected_version=run.version,
                state="draft_answer",
                step="draft_answer",
                envelope={"inputs": {"values": {"question": "why?", "n": 1e20}}},
                actor=Actor(user=bob),
            ),
        )
    run.refresh_from_db()
    return run


@pytest.mark.django_db
def test_an_existing_poisoned_checkpoint_is_an_integrity_problem_never_a_500(
    api, client, bob, poisoned
):  # noqa: ANN001
    verify = api.get(f"/api/v1/runs/{poisoned.id}/verify")
    assert verify.status_code == 200, verify.content
    assert verify.json()["ok"] is False
    assert any("checkpoint 2" in p and "2^53" in p for p in verify.json()["problems"])
    client.force_login(bob)
    for path in (
        f"/runs/{poisoned.id}/checkpoints/2/",
        f"/runs/{poisoned.id}/",
        f"/runs/{poisoned.id}/snapshot/",
        f"/runs/{poisoned.id}/checkpoints/1/",
    ):
        page = client.get(path)
        assert page.status_code == 200, (path, page.status_code)
    page = client.get(f"/runs/{poisoned.id}/checkpoints/2/").content.decode()
    assert "Integrity" in page and "2^53" in page
    # The head cannot be checked against its hash: reading it is a 409 naming it, not an
    # undocumented 422.
    api_read = api.get(f"/api/v1/runs/{poisoned.id}/checkpoints/2")
    assert api_read.status_code == 409 and "2^53" in api_read.json()["detail"]
    fork = api.post(
        f"/api/v1/runs/{poisoned.id}/actions/fork",
        {"from_sequence": 2, "reason": "replace n", "inputs_patch": {"n": "1e20"}},
        format="json",
    )
    assert fork.status_code == 201, fork.content
    # The run is no dead end either: a commit checks the head's position and hash in its own
    # statement without opening its envelope, so it goes on past it, and verify still names
    # the checkpoint it cannot check.
    commit = api.post(
        f"/api/v1/runs/{poisoned.id}/checkpoints",
        {"expected_version": poisoned.version, "state": "review", "envelope": {"inputs": {}}},
        format="json",
    )
    assert commit.status_code == 201, commit.content
    verify = api.get(f"/api/v1/runs/{poisoned.id}/verify").json()
    assert verify["ok"] is False
    assert any("checkpoint 2" in p and "2^53" in p for p in verify["problems"])
