"""Runs whose evidence bundles the evidence tests export: approved and published, quorum of
two, rejected; each driven through the services as a runner would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from approvals.services.evidence import run_evidence_export
from checkpoints.models import Run
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from runtime.services.operations import (
    operation_confirm,
    operation_envelope_entry,
    operation_mark_pending,
    operation_reserve,
)
from runtime.services.runs import run_create
from tenants.models import Tenant
from tenants.services import Actor, member_set_role
from tests.approvals_support import ask, at_review, decide, draft
from tests.factories import UserFactory

RUNNER = Actor.system("test runner")


def _commit(run: Run, state: str, groups: dict) -> Run:
    run.refresh_from_db()
    checkpoint_commit(
        tenant=run.tenant,
        run_id=run.id,
        request=CommitRequest(
            expected_version=run.version, state=state, step=state, envelope=groups, actor=RUNNER
        ),
    )
    run.refresh_from_db()
    return run


def reviewer(tenant: Tenant, username: str):  # noqa: ANN201
    user = UserFactory(username=username)
    member_set_role(tenant=tenant, user=user, role="reviewer", actor=Actor.system("test"))
    return user


def evidence_of(artifact) -> dict:  # noqa: ANN001
    return {
        "artifacts": [{"id": str(artifact.id), "sha256": artifact.sha256, "name": "draft"}],
        "validators": [],
    }


def published_run(
    tenant: Tenant,
    requester,  # noqa: ANN001
    reviewers: list,
    *,
    text: str = "# Cairns\n\nStones that mark a route.\n",
    comment: str = "",
) -> Run:
    """An external run that asks for approval of a draft, is approved by ``reviewers`` (the
    quorum is their number), publishes the draft once and ends."""
    run = run_create(
        tenant=tenant,
        workflow_type="research",
        inputs={"question": "why?"},
        execution="external",
        actor=Actor(user=requester),
    )
    artifact = draft(tenant, text)
    at_review(run, artifact)
    request = ask(run, artifact, requester, required_approvals=len(reviewers))
    for reviewer in reviewers:
        decide(request, reviewer, comment=comment)
    evidence = evidence_of(artifact)
    run = _commit(run, "publish", {"evidence": evidence})
    operation, _ = operation_reserve(
        tenant=tenant,
        run_id=run.id,
        idempotency_key=f"publish-{run.id}",
        action="publish",
        target="blog/cairns",
        request_fingerprint="f" * 64,
        step="publish",
        provider="blog",
        actor=RUNNER,
    )
    operation = operation_mark_pending(operation_id=operation.id, actor=RUNNER)
    run = _commit(
        run,
        "publish",
        {"evidence": evidence, "side_effects": [operation_envelope_entry(operation)]},
    )
    operation = operation_confirm(
        operation_id=operation.id,
        provider_operation_id="post-42",
        result={"ok": True},
        actor=RUNNER,
    )
    return _commit(
        run,
        "done",
        {
            "evidence": evidence,
            "side_effects": [operation_envelope_entry(operation)],
            "control": {"status": "succeeded"},
        },
    )


def rejected_run(tenant: Tenant, requester, reviewer) -> Run:  # noqa: ANN001
    run = run_create(
        tenant=tenant,
        workflow_type="research",
        inputs={"question": "why not?"},
        execution="external",
        actor=Actor(user=requester),
    )
    artifact = draft(tenant, "a draft nobody wants\n")
    at_review(run, artifact)
    request = ask(run, artifact, requester)
    decide(request, reviewer, "reject", comment="Not sourced.")  # the run fails at review
    run.refresh_from_db()
    return run


def bundle_of(run: Run, user) -> bytes:  # noqa: ANN001
    return run_evidence_export(tenant=run.tenant, run_id=run.id, actor=Actor(user=user)).data


def verify_offline(bundle: Path, key: Path) -> subprocess.CompletedProcess:
    """``python -m approvals.evidence_verify bundle --public-key key``, as a third party
    runs it: a separate process."""
    return subprocess.run(
        [sys.executable, "-m", "approvals.evidence_verify", str(bundle), "--public-key", str(key)],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )


def evidence_downloaded_and_checked(page, run_url: str, tmp_path: Path, run_id: object) -> Path:  # noqa: ANN001
    """In the browser, download the run's signed evidence from its page; it verifies
    offline (a separate process, the published public key), and a copy with one byte
    flipped does not. Returns the downloaded bundle."""
    from approvals.signing import evidence_signing_key

    page.goto(run_url)
    with page.expect_download() as download:
        page.get_by_role("link", name="Download signed evidence").click()
    bundle = tmp_path / download.value.suggested_filename
    download.value.save_as(bundle)
    key = tmp_path / "evidence-key.pem"
    key.write_text(evidence_signing_key().public_pem)
    good = verify_offline(bundle, key)
    assert good.returncode == 0, good.stdout + good.stderr
    assert f"VERIFIED: run {run_id}" in good.stdout
    data = bytearray(bundle.read_bytes())
    data[len(data) // 3] ^= 0x04
    tampered = tmp_path / f"tampered-{bundle.name}"
    tampered.write_bytes(bytes(data))
    bad = verify_offline(tampered, key)
    assert bad.returncode == 1 and "NOT VERIFIED" in bad.stdout
    return bundle
