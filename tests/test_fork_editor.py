"""The fork editor (issue 29, item 5): the form starts from the checkpoint's input values,
the confirmation shows each change before → after and warns on names no step reads, and a
patch that would change nothing (or is shaped like the inputs group) is refused the same way
by the service, the API and the console."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from cairn.errors import InvalidRequest
from checkpoints.models import Run
from runtime.definition import Workflow, registry_remove
from runtime.input_reads import inputs_read
from runtime.services.forks import inputs_patch_between, run_fork, run_fork_review
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.actions_support import advance, worker_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def wrun(acme, bob):  # noqa: ANN001
    run = worker_run(acme, bob, inputs={"question": "why?", "lang": "en"})
    return advance(advance(run, bob, "draft_answer"), bob, "review")


@pytest.fixture
def console(bob) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(bob)
    return client


@pytest.fixture
def reading():  # noqa: ANN201
    """A coded workflow whose steps read "question" and "depth" by name."""
    wf = Workflow("fork_reads", version="1")

    @wf.step("ask", next="answer")
    def ask(ctx: Any) -> dict[str, Any]:
        return {"q": ctx.inputs["question"]}

    @wf.step("answer", next="done")
    def answer(ctx: Any) -> dict[str, Any]:
        return {"depth": ctx.inputs.get("depth", 1)}

    wf.terminal("done")
    yield wf
    registry_remove("fork_reads", "1")


def fork_post(api, run, body: dict) -> Any:  # noqa: ANN001
    return api.post(f"/api/v1/runs/{run.id}/actions/fork", {"reason": "try", **body}, format="json")


def form_post(client, run, **data):  # noqa: ANN001, ANN003, ANN201
    body = {"version": run.version, "reason": "because", **data}
    return client.post(f"/runs/{run.pk}/actions/fork/", body)


def test_a_patch_shaped_like_the_inputs_group_is_refused_not_ignored(acme, bob, wrun):
    with pytest.raises(InvalidRequest) as refused:
        run_fork(
            tenant=acme,
            run_id=wrun.pk,
            from_sequence=1,
            inputs_patch={"values": {"lang": "de"}},
            reason="German",
            actor=Actor(user=bob),
        )
    assert 'not {"values": {"lang": "de"}}' in refused.value.detail
    assert refused.value.fields == {
        "inputs_patch": "a patch of the input values, without a values wrapper"
    }
    assert not Run.objects.filter(forked_from_run=wrun).exists()


def test_the_api_refuses_the_same_shapes_as_the_service(api_as, acme, bob, wrun):
    api = api_as(bob, acme)
    wrapped = fork_post(api, wrun, {"from_sequence": 1, "inputs_patch": {"values": {"lang": "de"}}})
    assert (wrapped.status_code, wrapped.json()["code"]) == (400, "invalid_request")
    assert "inputs_patch" in wrapped.json()["fields"]
    same = fork_post(api, wrun, {"from_sequence": 1, "inputs_patch": {"lang": "en"}})
    assert (same.status_code, same.json()["code"]) == (400, "invalid_request")
    assert "The patch changes nothing" in same.json()["detail"]
    assert same.json()["fields"] == {"inputs_patch": "changes nothing"}
    removing_nothing = fork_post(api, wrun, {"from_sequence": 1, "inputs_patch": {"nope": None}})
    assert removing_nothing.status_code == 400
    assert not Run.objects.filter(forked_from_run=wrun).exists()
    # No patch, or an empty one, forks with the same inputs on purpose.
    for body in ({"from_sequence": 1}, {"from_sequence": 1, "inputs_patch": {}}):
        assert fork_post(api, wrun, body).status_code == 201
    changed = fork_post(api, wrun, {"from_sequence": 1, "inputs_patch": {"lang": "de"}})
    assert changed.status_code == 201, changed.json()
    assert changed.json()["unread_inputs"] == []  # "coded" has no code here: cannot tell


def test_a_run_with_an_input_named_values_may_patch_it(acme, bob):
    run = worker_run(acme, bob, inputs={"values": {"a": 1}})
    result = run_fork(
        tenant=acme,
        run_id=run.pk,
        from_sequence=1,
        inputs_patch={"values": {"a": 2}},
        reason="a is 2",
        actor=Actor(user=bob),
    )
    assert result.run.forked_from_run_id == run.pk


def test_the_review_lists_each_change_and_the_names_no_step_reads(acme, bob, reading):
    run = run_create(
        tenant=acme,
        workflow_type="fork_reads",
        inputs={"question": "why?", "depth": 1, "old": "x"},
        execution="worker",
        actor=Actor(user=bob),
    )
    review = run_fork_review(
        tenant=acme,
        run_id=run.pk,
        from_sequence=1,
        inputs_patch={"depth": 3, "lang": "de", "old": None},
    )
    assert [(c.key, c.before, c.after, c.added, c.removed) for c in review.changes] == [
        ("depth", 1, 3, False, False),
        ("lang", None, "de", True, False),
        ("old", "x", None, False, True),
    ]
    assert (review.unread, review.reads_known) == (["lang"], True)


def test_inputs_read_names_the_demo_keys_and_says_when_it_cannot_tell(reading):
    assert inputs_read("research", "1") == {"question", "sources"}
    assert inputs_read("fork_reads", "1") == {"question", "depth"}
    assert inputs_read("no_such_workflow", "1") is None


def test_the_patch_between_two_value_sets_is_a_merge_patch():
    before = {"a": 1, "b": {"c": 2}, "gone": True}
    after = {"a": 1, "b": {"c": 3}, "new": [1]}
    assert inputs_patch_between(before, after) == {"b": {"c": 3}, "gone": None, "new": [1]}


def test_the_fork_form_starts_from_the_checkpoints_input_values(console, wrun):
    html = console.get(f"/runs/{wrun.pk}/actions/fork/?from_sequence=1").content.decode()
    assert "Inputs at the checkpoint" in html
    assert "&quot;lang&quot;: &quot;en&quot;" in html
    assert "objective_ref" not in html  # the values, not the whole inputs group


def test_the_confirmation_shows_before_and_after_of_each_change(console, wrun):
    edited = json.dumps({"question": "why?", "lang": "de"})
    html = form_post(console, wrun, from_sequence=1, inputs=edited).content.decode()
    assert 'data-change="lang"' in html
    assert "&quot;en&quot; → &quot;de&quot;" in html
    response = form_post(console, wrun, from_sequence=1, inputs=edited, confirm="1")
    fork = Run.objects.get(forked_from_run=wrun)
    assert response["Location"] == f"/runs/{fork.pk}/"


def test_unchanged_inputs_say_no_change_in_a_sentence(console, wrun):
    same = json.dumps({"lang": "en", "question": "why?"})
    html = form_post(console, wrun, from_sequence=1, inputs=same).content.decode()
    assert "No input changes: the fork starts with the same inputs as checkpoint #1" in html


def test_the_console_warns_on_names_no_step_reads(console, acme, bob, reading):
    run = run_create(
        tenant=acme,
        workflow_type="fork_reads",
        inputs={"question": "why?"},
        execution="worker",
        actor=Actor(user=bob),
    )
    edited = json.dumps({"question": "why?", "langauge": "de"})
    html = form_post(console, run, from_sequence=1, inputs=edited).content.decode()
    assert 'data-unread="langauge"' in html
    assert "No step of fork_reads@1 reads" in html
