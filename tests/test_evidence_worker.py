"""Signed evidence of a run Cairn's workers drove (issue 27, item 5): the demo run asks for
approval, a reviewer approves, a real worker publishes through the publishing service, and
the bundle verifies offline, its effect covered by the approval of the draft that shipped."""

from __future__ import annotations

import json

import pytest

from approvals.evidence_verify import load_public_key, verify
from approvals.models import ApprovalRequest, ApprovalStatus
from approvals.signing import evidence_signing_key
from checkpoints.models import Run, RunStatus
from tests.approvals_support import decide, start_demo
from tests.evidence_support import bundle_of
from tests.worker_fixtures import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]


def test_a_worker_run_that_published_after_its_approval_exports_evidence_that_verifies(
    acme, alice, bob, carol, worker_factory, publishing_service, settings, tmp_path
):  # noqa: ANN001
    settings.CAIRN_EVIDENCE_KEY_FILE = tmp_path / "home" / "evidence_signing_key.pem"
    settings.CAIRN_EVIDENCE_KEY_GENERATE = True
    run = start_demo(acme, bob)
    worker_factory("w1")
    request = wait_for(
        lambda: ApprovalRequest.objects.filter(run=run, status=ApprovalStatus.PENDING).first(),
        what="the demo run to ask for approval",
        timeout=180,
    )
    decide(request, carol, comment="sourced")
    wait_for(
        lambda: Run.objects.filter(pk=run.pk, status=RunStatus.SUCCEEDED).exists(),
        what="the run to publish and succeed",
        timeout=180,
    )
    data = bundle_of(run, alice)
    assert verify(data, load_public_key(evidence_signing_key().public_pem)) == []
    payload = json.loads(data)["payload"]
    (publish,) = [op for op in payload["operations"] if op["action"] == "publish"]
    assert publish["status"] == "confirmed" and publish["provider_operation_id"]
    shipped = next(
        c for c in payload["checkpoints"] if c["sequence"] == publish["checkpoint_sequence"]
    )
    assert shipped["state"] == "publish"
    assert request.artifact_sha256 in shipped["artifacts"]
    (approval,) = payload["approvals"]
    assert approval["id"] == str(request.pk) and approval["status"] == "consumed"
    assert [d["reviewer"] for d in approval["decisions"]] == ["carol"]
