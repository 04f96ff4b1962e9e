"""/metrics keeps its names: every family, TYPE, HELP, label name and enumerated label value
is the one recorded in tests/fixtures/metrics_families.json (see tests/metrics_golden.py),
since dashboards and alert rules are written against them."""

from __future__ import annotations

import json

import pytest

from tests.metrics_golden import FIXTURE, exposition_families, seed_every_series

pytestmark = pytest.mark.django_db


def test_the_exposition_serves_the_recorded_families_and_labels(
    client, settings, acme, globex, bob, charlie
):  # noqa: ANN001
    golden = json.loads(FIXTURE.read_text())
    seed_every_series(settings=settings, acme=acme, globex=globex, bob=bob, charlie=charlie)
    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == golden["content_type"]
    families = exposition_families(response.content.decode())
    assert [f["name"] for f in families] == [f["name"] for f in golden["families"]]
    for served, recorded in zip(families, golden["families"], strict=True):
        assert served == recorded, served["name"]


def test_every_family_is_announced_on_an_empty_database(client, settings, db):  # noqa: ANN001
    """Without data every family is still announced (HELP and TYPE); only the per-tenant
    ones have no sample, the others serve zeros."""
    settings.CAIRN_STALLED_OPERATION_SECONDS = 600
    golden = json.loads(FIXTURE.read_text())
    families = exposition_families(client.get("/metrics").content.decode())
    assert [(f["name"], f["type"], f["help"]) for f in families] == [
        (f["name"], f["type"], f["help"]) for f in golden["families"]
    ]
    without_samples = {f["name"] for f in families if not f["samples"]}
    assert without_samples == {
        "cairn_runs",
        "cairn_stalled_operations",
        "cairn_approvals",
        "cairn_approval_time_left_seconds",
        "cairn_active_run_restores_max",
    }
