"""A runner's commit (``POST /runs/{id}/checkpoints``) takes a short path when it is the
plain case: a bearer token whose member may operate, a JSON body the commit serializer
would accept as it stands. No DRF request, negotiation, authentication or rendering runs
for it (docs/performance.md, "The HTTP commit, by layer"). Everything else, every refusal
before the commit included, goes through DRF's view as before, so the documented contract
is DRF's by construction; the short path only has to agree with it where it answers.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from rest_framework.views import APIView

from api import commit_route
from api.serializers import CheckpointCommitSerializer
from runtime.services.runs import run_create
from tenants.services import Actor, token_issue
from tests.factories import ENVELOPE_GROUPS

pytestmark = pytest.mark.django_db


@pytest.fixture
def runner(acme, bob, workflow):  # noqa: ANN001, ANN201
    """An external run and the operator token its runner commits with."""
    run = run_create(
        tenant=acme, workflow_type="research", execution="external", actor=Actor.system("t")
    )
    _, secret = token_issue(tenant=acme, user=bob, actor=Actor.system("t"))
    return run, secret


def _post(client, run_id, body, secret, **extra):  # noqa: ANN001, ANN003, ANN202
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"HTTP_AUTHORIZATION": f"Bearer {secret}"} if secret else {}
    return client.post(
        f"/api/v1/runs/{run_id}/checkpoints",
        data=data,
        content_type=extra.pop("content_type", "application/json"),
        **headers,
        **extra,
    )


def _answer(response) -> tuple:  # noqa: ANN001
    headers = {
        name: response.headers.get(name)
        for name in ("Content-Type", "Allow", "Vary", "WWW-Authenticate", "Retry-After")
    }
    return response.status_code, json.loads(response.content), headers


@pytest.mark.parametrize("accept", [None, "application/json", "application/json, text/plain, */*"])
def test_a_plain_commit_runs_none_of_drfs_request_machinery(client, runner, monkeypatch, accept):
    run, secret = runner
    extra = {} if accept is None else {"HTTP_ACCEPT": accept}
    entered = []
    original = APIView.initial

    def initial(self, request, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        entered.append(type(self).__name__)
        return original(self, request, *args, **kwargs)

    monkeypatch.setattr(APIView, "initial", initial)
    body = {"expected_version": run.version, "state": "draft_answer", "step": "d"}
    response = _post(client, run.pk, {**body, "envelope": ENVELOPE_GROUPS}, secret, **extra)
    assert response.status_code == 201, response.content
    assert entered == []
    assert json.loads(response.content)["run_version"] == run.version + 1


def _through_drf(monkeypatch):  # noqa: ANN001, ANN202
    monkeypatch.setattr(commit_route, "commit_answer", lambda *args, **kwargs: None)


def test_the_short_path_answers_a_commit_as_drfs_view_does(client, runner, monkeypatch):
    run, secret = runner
    body = {"expected_version": run.version, "state": "draft_answer", "step": "d"}
    short = _answer(_post(client, run.pk, {**body, "envelope": ENVELOPE_GROUPS}, secret))
    with monkeypatch.context() as patched:
        _through_drf(patched)
        body = {"expected_version": run.version + 1, "state": "review", "step": "r"}
        drf = _answer(_post(client, run.pk, {**body, "envelope": ENVELOPE_GROUPS}, secret))
    assert short[0] == drf[0] == 201
    assert short[2] == drf[2]
    assert set(short[1]) == set(drf[1])
    assert drf[1]["sequence"] == short[1]["sequence"] + 1
    assert drf[1]["parent_sha256"] == short[1]["sha256"]


REFUSALS = {
    "a stale version": lambda run: {"expected_version": run.version + 5, "state": "draft_answer"},
    "an illegal move": lambda run: {"expected_version": run.version, "state": "publish"},
    "a secret in the envelope": lambda run: {
        "expected_version": run.version,
        "state": "draft_answer",
        "envelope": {
            **ENVELOPE_GROUPS,
            "evidence": {**ENVELOPE_GROUPS["evidence"], "outputs": {"key": "sk-" + "a1" * 12}},
        },
    },
    "an unknown field": lambda run: {"expected_version": run.version, "state": "x", "nope": 1},
    "a state with spaces round it": lambda run: {"expected_version": run.version, "state": " x"},
    "a string version": lambda run: {"expected_version": str(run.version), "state": "x"},
    "a body that is not an object": lambda run: [1, 2],
    "invalid JSON": lambda run: b'{"expected_version": ',
    "NaN": lambda run: b'{"expected_version": NaN, "state": "x", "envelope": {}}',
    "an integer too large for JSON": lambda run: (
        b'{"expected_version": 1, "state": "draft_answer", "envelope": '
        b'{"evidence": {"n": 123456789012345678901234567890}}}'
    ),
}


@pytest.mark.parametrize("refusal", list(REFUSALS))
def test_every_refusal_is_drfs_own_answer(client, runner, monkeypatch, refusal):
    run, secret = runner
    body = REFUSALS[refusal](run)
    if isinstance(body, dict):
        body.setdefault("envelope", ENVELOPE_GROUPS)
    short = _answer(_post(client, run.pk, body, secret))
    with monkeypatch.context() as patched:
        _through_drf(patched)
        drf = _answer(_post(client, run.pk, body, secret))
    assert 400 <= short[0] < 500, short
    assert short == drf
    run.refresh_from_db()
    assert run.checkpoint_sequence == 1  # nothing was written


@pytest.mark.parametrize(
    "request_kind",
    [
        "no token",
        "an unknown token",
        "a reviewer's token",
        "another tenant's run",
        "form data",
        "a client that takes only HTML",
    ],
)
def test_every_refusal_before_the_commit_is_drfs_own_answer(
    client, runner, monkeypatch, request_kind, acme, globex, carol, charlie
):
    run, secret = runner
    body = {"expected_version": run.version, "state": "draft_answer", "envelope": ENVELOPE_GROUPS}
    extra = {}
    if request_kind == "no token":
        secret = ""
    elif request_kind == "an unknown token":
        secret = secret[:-4] + "0000"
    elif request_kind == "a reviewer's token":
        _, secret = token_issue(tenant=acme, user=carol, actor=Actor.system("t"))
    elif request_kind == "another tenant's run":
        _, secret = token_issue(tenant=globex, user=charlie, actor=Actor.system("t"))
    elif request_kind == "form data":
        extra = {"content_type": "application/x-www-form-urlencoded"}
    else:
        extra = {"HTTP_ACCEPT": "text/html"}
    short = _answer(_post(client, run.pk, body, secret, **extra))
    with monkeypatch.context() as patched:
        _through_drf(patched)
        drf = _answer(_post(client, run.pk, body, secret, **extra))
    assert 400 <= short[0] < 500, short
    assert short == drf
    run.refresh_from_db()
    assert run.checkpoint_sequence == 1


# --- the short path's parse agrees with the serializer -----------------------------------
_text = st.one_of(
    st.sampled_from(["", " ", "draft", " draft", "draft ", "a\x00b", "\ud800", "x" * 101]),
    st.text(max_size=120),
)
_value = st.one_of(
    _text,
    st.integers(min_value=-3, max_value=2**60),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.lists(st.integers(), max_size=2),
)
_fields = sorted(CheckpointCommitSerializer().fields) + ["extra"]
_bodies = st.dictionaries(
    st.sampled_from(_fields),
    st.one_of(_value, st.sampled_from(["running", "failed", "succeeded", "waiting_approval"])),
    max_size=len(_fields),
)


@hsettings(max_examples=400, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(_bodies, _value))
def test_what_the_short_path_accepts_the_serializer_accepts_as_the_same_values(body):
    parsed = commit_route.commit_body(body)
    if parsed is None:
        return  # DRF's view decides
    serializer = CheckpointCommitSerializer(data=body)
    assert serializer.is_valid(), (body, serializer.errors)
    assert parsed == dict(serializer.validated_data)


@given(
    version=st.integers(min_value=1, max_value=2**53 - 1),
    state=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=100),
    step=st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=100),
    optional=st.fixed_dictionaries(
        {},
        optional={
            "status": st.sampled_from(["running", "failed", "succeeded"]),
            "status_reason": st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E)),
            "lease_owner": st.text(
                st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=200
            ),
            "code_version": st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E)),
        },
    ),
)
def test_the_short_path_takes_every_plain_commit_body(version, state, step, optional):
    body = {"expected_version": version, "state": state, "step": step, "envelope": {}, **optional}
    parsed = commit_route.commit_body(body)
    serializer = CheckpointCommitSerializer(data=body)
    assert serializer.is_valid(), serializer.errors
    assert parsed == dict(serializer.validated_data)
