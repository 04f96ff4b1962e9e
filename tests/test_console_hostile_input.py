"""Every query parameter and form field of the console, given hostile values one at a time
(numbers past any column, the calendar's ends, text that is not a date, an id or JSON,
markup, very long text): the answer is a page or a refusal, never a 500. Probing like this
found a runs filter ending on 9999-12-31 that was one."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.approvals_support import ask, at_review, draft

pytestmark = pytest.mark.django_db

HOSTILE = [
    "",
    "-1",
    "1.5",
    "1e999",
    "nan",
    "-inf",
    str(2**70),
    "abc",
    "2026-13-45",
    "0001-01-01",
    "9999-12-31",
    "9999-12-31T23:59",
    "00000000-0000-0000-0000-000000000000",
    '{"a": 1}',
    "[1]",
    "'\"<b>x</b>",
    "💥",
    "a" * 5000,
]


def signed_in(user) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def rows(acme, run, bob):  # noqa: ANN001, ANN201
    """The run at its approval state with bob's request pending."""
    artifact = draft(acme)
    return run, ask(at_review(run, artifact), artifact, bob)


PAGES = {
    "/runs/": "q status workflow_type workflow_version state created_from created_to "
    "updated_from updated_to restored_more_than stalled waiting_approval sort cursor",
    "/runs/rows/": "ids cursor sort",
    "/runs/counts/": "workflow_type status created_to",
    "/runs/{run}/": "seen",
    "/runs/{run}/snapshot/": "seen",
    "/runs/{run}/actions/fork/": "version from_sequence",
    "/runs/{run}/actions/retry/": "version step",
    "/health/": "restored_more_than",
    "/audit/": "before action actor run since until",
    "/audit/export.csv": "action actor run since until",
    "/retention/": "workflow_type",
    "/approvals/": "status cursor",
}

FORMS = {
    "/runs/{run}/actions/cancel/": "version reason confirm",
    "/runs/{run}/actions/resume/": "version reason confirm",
    "/runs/{run}/actions/retry/": "version reason step confirm",
    "/runs/{run}/actions/fork/": "version reason from_sequence inputs confirm",
    "/runs/{run}/actions/grant_budget/": "version reason attempts tokens cost deadline confirm",
    "/retention/": "workflow_type intermediate_days model_context_days failed_days expire_days",
    "/retention/preview/": "intermediate_days model_context_days failed_days expire_days",
    "/retention/hold/": "scope on reason run_id",
    "/members/invite": "username email role run",
    "/members/grants": "username run",
    "/tenant/": "tenant",
}


@pytest.mark.parametrize("page", sorted(PAGES))
def test_no_query_parameter_value_breaks_a_page(alice, rows, page):
    run, _ = rows
    client, url = signed_in(alice), page.format(run=run.pk)
    for name in PAGES[page].split():
        for value in HOSTILE:
            status = client.get(url, {name: value}).status_code
            assert status < 500, (url, name, value[:40], status)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_no_field_value_breaks_a_form(alice, rows, form):
    run, _ = rows
    client, url = signed_in(alice), form.format(run=run.pk)
    valid = {"version": str(run.version), "reason": "probing", "confirm": "1"}
    for name in FORMS[form].split():
        for value in HOSTILE:
            status = client.post(url, {**valid, name: value}).status_code
            assert status < 500, (url, name, value[:40], status)


def test_no_field_value_breaks_the_decision_form(carol, rows):
    _, request = rows
    client, url = signed_in(carol), f"/approvals/{request.pk}/decision"
    for name in ("decision", "artifact_sha256", "comment"):
        for value in HOSTILE:
            body = {"decision": "reject", "artifact_sha256": request.artifact_sha256, name: value}
            status = client.post(url, body).status_code
            assert status < 500, (url, name, value[:40], status)
