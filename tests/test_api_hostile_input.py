"""Input that once reached a 500 or slipped past a check (found by probing the running API):
numbers JSON cannot carry exactly, hostile nesting, lone surrogates, hand-made cursors,
envelope groups of the wrong shape, credentials in an operation's target, names a workflow
cannot have, and budgets without bound. Each is a 4xx with a sentence, and writes nothing."""

from __future__ import annotations

import base64

import pytest

from checkpoints.models import Checkpoint, ExternalOperation, Run, WorkflowDefinition
from checkpoints.services.budgets import BUDGET_LIMIT_MAX
from tests.api_support import every_list, new_run

pytestmark = pytest.mark.django_db

HUGE = 2**60


@pytest.fixture
def api(api_as, bob, acme, workflow):  # noqa: ANN001
    return api_as(bob, acme)


def raw_post(api, path: str, body: str):  # noqa: ANN001, ANN201
    return api.generic("POST", path, body.encode("utf-8"), content_type="application/json")


def refused(response, status: int, code: str) -> dict:  # noqa: ANN001
    assert response.status_code == status, response.content
    body = response.json()
    assert body["code"] == code and body["detail"].endswith("."), body
    return body


@pytest.mark.parametrize(
    "body",
    [
        f'{{"workflow_type": "research", "execution": "external", "inputs": {{"n": {HUGE}}}}}',
        '{"workflow_type": "research", "execution": "external", "inputs": {"n": 1e999}}',
        '{"workflow_type": "research", "execution": "external", "inputs": {"a": "\\ud800"}}',
        '{"workflow_type": "research", "execution": "external", "inputs": {"\\udfff": 1}}',
        '{"workflow_type": "research", "execution": "external", "inputs": '
        + '{"a": ' * 80
        + "1"
        + "}" * 80
        + "}",
        "[" * 100_000 + "]" * 100_000,
    ],
    ids=["integer-past-2^53", "infinite", "lone-surrogate", "surrogate-key", "deep", "deeper"],
)
def test_it_refuses_json_cairn_cannot_store_exactly(api, body):
    body_json = refused(raw_post(api, "/api/v1/runs", body), 400, "invalid_request")
    assert "JSON" in body_json["detail"]
    assert Run.objects.count() == 0


def test_numbers_within_range_and_paired_surrogates_are_fine(api):
    body = (
        '{"workflow_type": "research", "execution": "external", '
        f'"inputs": {{"n": {2**53 - 1}, "emoji": "\\ud83d\\ude00", "x": 1.5}}}}'
    )
    response = raw_post(api, "/api/v1/runs", body)
    assert response.status_code == 201, response.content


def test_a_budget_past_its_bound_is_refused_at_creation_and_by_a_grant(api):
    refused(
        api.post(
            "/api/v1/runs",
            {"workflow_type": "research", "budget": {"max_attempts": BUDGET_LIMIT_MAX + 1}},
            format="json",
        ),
        400,
        "invalid_request",
    )
    run = new_run(api, max_attempts=3, max_cost=1.0)
    grant = f"/api/v1/runs/{run['id']}/actions/grant_budget"
    refused(
        api.post(grant, {"attempts": HUGE, "reason": "more"}, format="json"),
        400,
        "invalid_request",
    )
    # Each grant is within bounds; together they would pass the bound.
    ok = api.post(grant, {"cost": float(BUDGET_LIMIT_MAX) - 1, "reason": "more"}, format="json")
    assert ok.status_code == 200, ok.content
    body = refused(
        api.post(grant, {"cost": 10.0, "reason": "more"}, format="json"), 400, "invalid_request"
    )
    assert "at most" in body["detail"]
    limits = Run.objects.get(pk=run["id"]).budget_limits
    assert (limits["max_attempts"], limits["max_cost"]) == (3, float(BUDGET_LIMIT_MAX))
    # The run still takes checkpoints (a huge limit once made every commit fail).
    commit = api.post(
        f"/api/v1/runs/{run['id']}/checkpoints",
        {"expected_version": 2, "state": "draft_answer", "envelope": {}},
        format="json",
    )
    assert commit.status_code == 201, commit.content


def _cursor(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize("position", ["p=abc", "p=2026-13-99", "o=1&p=x"])
def test_a_hand_made_cursor_is_bad_input_on_every_list(api, position):
    for path in every_list(new_run(api)):
        response = api.get(path, {"cursor": _cursor(position)})
        assert response.status_code == 400, (path, response.content)
        assert response.json()["code"] == "invalid_request"
        assert "cursor" in response.json()["fields"]
        assert api.get(path, {"cursor": "zzz"}).status_code == 400, path


@pytest.mark.parametrize(
    "query",
    [
        {"state": "a\x00b"},
        {"workflow_type": "\x00"},
        {"status": "running\x00"},
        {"cursor": "\x00"},
        {"limit": "5\x00"},
        {"x\x00": "1"},
    ],
    ids=["state", "workflow_type", "status", "cursor", "limit", "key"],
)
def test_a_nul_in_the_query_string_is_bad_input_on_every_list(api, query):
    """PostgreSQL cannot compare a text column with a string holding NUL: once a 500."""
    run = new_run(api)
    # The reviewer's queue too: the query string is refused before anyone's role is read.
    others = ["/api/v1/approvals", f"/api/v1/runs/{run['id']}/actions/fork/preview"]
    for path in [*every_list(run), *others]:
        body = refused(api.get(path, query), 400, "invalid_request")
        assert "NUL" in body["detail"], body


def test_a_nul_in_a_console_filter_is_bad_input(client, bob):  # noqa: ANN001
    client.force_login(bob)
    response = client.get("/runs/", {"q": "run\x00", "state": "draft"})
    assert response.status_code == 400
    assert "NUL" in response.content.decode()
    assert client.get("/runs/", {"q": "run"}).status_code == 200


@pytest.mark.parametrize(
    ("envelope", "field"),
    [
        ({"evidence": "junk"}, "evidence"),
        ({"budgets": "x"}, "budgets"),
        ({"side_effects": {"k": 1}}, "side_effects"),
        ({"control": [1]}, "control"),
    ],
)
def test_an_envelope_group_of_the_wrong_shape_is_an_invalid_envelope(api, envelope, field):
    run = new_run(api)
    body = refused(
        api.post(
            f"/api/v1/runs/{run['id']}/checkpoints",
            {"expected_version": 1, "state": "draft_answer", "envelope": envelope},
            format="json",
        ),
        422,
        "invalid_envelope",
    )
    assert field in body["fields"]
    assert Checkpoint.objects.filter(run_id=run["id"]).count() == 1


def test_a_usage_counter_left_out_of_budgets_stays_where_the_run_has_it(api):
    run = new_run(api, max_tokens=1000)
    first = api.post(
        f"/api/v1/runs/{run['id']}/checkpoints",
        {
            "expected_version": 1,
            "state": "draft_answer",
            "envelope": {"budgets": {"attempts_used": 2, "tokens_used": 10}},
        },
        format="json",
    )
    assert first.status_code == 201, first.content
    second = api.post(
        f"/api/v1/runs/{run['id']}/checkpoints",
        {"expected_version": 2, "state": "review", "envelope": {"budgets": {"tokens_used": 40}}},
        format="json",
    )
    assert second.status_code == 201, second.content
    used = Run.objects.get(pk=run["id"]).budget_used
    assert (used["attempts_used"], used["tokens_used"]) == (2, 40)


@pytest.mark.parametrize("value", ["²", "٣", "0", "-1", "1.5", "9" * 40, ""])
def test_the_fork_preview_takes_only_a_plain_checkpoint_number(api, value):
    run = new_run(api)
    response = api.get(f"/api/v1/runs/{run['id']}/actions/fork/preview", {"from_sequence": value})
    refused(response, 400, "invalid_request")


@pytest.mark.parametrize(
    "field",
    [
        {"target": "https://publisher:hunter22@example.com/posts"},
        {"client_reference": "https://publisher:hunter22@example.com/ref"},
    ],
)
def test_an_operation_cannot_carry_a_credential_in_what_is_stored_in_clear(api, field):
    run = new_run(api)
    body = {
        "idempotency_key": "k-secret",
        "action": "publish",
        "target": "posts",
        "request_fingerprint": "fp",
        **field,
    }
    response = api.post(f"/api/v1/runs/{run['id']}/operations", body, format="json")
    refused(response, 422, "secret_in_envelope")
    assert not ExternalOperation.objects.exists()


@pytest.mark.parametrize(
    ("workflow_type", "version"),
    [("t" * 101, "1"), ("ok", "v" * 51), ("nul%00x", "1"), ("ok", "1%20beta")],
)
def test_a_workflow_type_or_version_that_is_not_a_name_is_refused(api, workflow_type, version):
    before = WorkflowDefinition.objects.count()
    response = api.put(
        f"/api/v1/workflows/{workflow_type}/versions/{version}",
        {"initial": "a", "states": ["a"], "transitions": [], "terminal": ["a"]},
        format="json",
    )
    refused(response, 400, "invalid_request")
    assert WorkflowDefinition.objects.count() == before


def test_the_schema_describes_every_list_as_a_page(api):
    schema = api.get("/api/v1/schema", {"format": "json"}).json()
    for path in (
        "/api/v1/runs/{run_id}/checkpoints",
        "/api/v1/runs/{run_id}/operations",
        "/api/v1/runs/{run_id}/approvals",
        "/api/v1/approvals",
        "/api/v1/runs",
    ):
        get = schema["paths"][path]["get"]
        assert {"cursor", "limit"} <= {p["name"] for p in get.get("parameters", [])}, path
        ref = get["responses"]["200"]["content"]["application/json"]["schema"]["$ref"]
        page = schema["components"]["schemas"][ref.rsplit("/", 1)[-1]]
        assert {"next", "results"} <= set(page["properties"]), path


def test_no_view_builds_an_error_body_by_hand():
    # One way to refuse: a view raises a CairnError and api.errors renders it, so every
    # refusal has the documented shape (and its Retry-After, its log line) by construction.
    import re
    from pathlib import Path

    api_package = Path(__file__).resolve().parent.parent / "api"
    by_hand = re.compile(r"""["']code["']\s*:\s*["']""")
    built = [
        f"{path.relative_to(api_package.parent)}:{number}"
        for path in sorted(api_package.rglob("*.py"))
        if path.name != "errors.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if by_hand.search(line)
    ]
    assert built == []


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("get", "/api/v1/runs?paused=maybe", None, "paused"),
        ("get", "/api/v1/runs?status=asleep", None, "status"),
        ("delete", "/api/v1/runs/{run}/lease", None, "owner"),
        ("put", "/api/v1/workflows/listed/versions/1", ["not", "an", "object"], None),
        ("get", "/api/v1/runs/{run}/actions/fork/preview", None, "from_sequence"),
    ],
    ids=["paused", "status", "lease-owner", "definition-not-an-object", "fork-preview"],
)
def test_each_parameter_refusal_is_a_400_with_a_sentence(api, method, path, body, field):
    run = new_run(api)
    response = getattr(api, method)(path.format(run=run["id"]), body, format="json")
    answer = refused(response, 400, "invalid_request")
    assert set(answer) <= {"code", "detail", "fields"}
    if field:
        assert answer["fields"] == {field: answer["fields"][field]} and answer["fields"][field]
