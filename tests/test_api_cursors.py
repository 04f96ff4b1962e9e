"""A cursor is opaque and signed: only one the API issued (in ``next`` or ``previous``)
moves a page; anything else, including text base64 ignores such as ``%%%``, is a 400."""

from __future__ import annotations

import base64

import pytest

from tests.test_api_hostile_input import every_list, new_run

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(api_as, bob, acme, workflow):  # noqa: ANN001
    return api_as(bob, acme)


@pytest.mark.parametrize(
    "raw",
    [
        "%25%25%25",  # "%%%": base64 skips every character, DRF read it as the first page
        "",
        "%3D%3D%3D%3D",  # "===="
        base64.b64encode(b"o=1").decode(),  # well-formed, but not one the API signed
        base64.b64encode(b"").decode() + "%3Aforged",
    ],
    ids=["percent-signs", "empty", "padding", "unsigned", "forged-signature"],
)
def test_a_cursor_the_api_did_not_issue_is_a_400_on_every_list(api, raw):  # noqa: ANN001
    for path in every_list(new_run(api)):
        response = api.get(f"{path}?cursor={raw}")
        assert response.status_code == 400, (path, raw, response.content)
        body = response.json()
        assert body["code"] == "invalid_request" and "cursor" in body["fields"], body


def test_the_cursors_the_api_issues_page_forward_and_back(api):  # noqa: ANN001
    for _ in range(5):
        new_run(api)
    first = api.get("/api/v1/runs", {"limit": 2}).json()
    assert first["next"], first
    second = api.get(first["next"]).json()
    third = api.get(second["next"]).json()
    back = api.get(second["previous"]).json()
    ids = [r["id"] for page in (first, second, third) for r in page["results"]]
    assert len(ids) == len(set(ids)) == 5
    assert [r["id"] for r in back["results"]] == [r["id"] for r in first["results"]]
