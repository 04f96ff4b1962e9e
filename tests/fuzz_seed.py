"""Rows for the Schemathesis run in CI (``.ci/fuzz_api``): on the database the settings
name, the tenant acme with alice (admin and reviewer of every request) holding a token, an
externally driven run at its approval state with bob's request pending, its draft and a
reserved operation. Prints ``NAME=value`` lines for the shell to export.

    DJANGO_SETTINGS_MODULE=cairn.settings python -m tests.fuzz_seed
"""

from __future__ import annotations

import django


def main() -> None:
    django.setup()
    from django.contrib.auth import get_user_model

    from checkpoints.services.workflows import workflow_register
    from runtime.services.operations import operation_reserve
    from runtime.services.runs import run_create
    from tenants.services import Actor, member_set_role, tenant_create, token_issue
    from tests.approvals_support import ask, at_review, draft
    from tests.factories import SIMPLE_DEFINITION

    acme, _ = tenant_create(slug="acme", owner_username="alice")
    alice = get_user_model().objects.get(username="alice")
    bob = get_user_model().objects.create(username="bob")
    member_set_role(tenant=acme, user=bob, role="operator", actor=Actor.system("fuzz"))
    workflow_register(
        tenant=acme, workflow_type="research", version="1", definition=SIMPLE_DEFINITION
    )
    run = run_create(
        tenant=acme,
        workflow_type="research",
        inputs={"question": "why?"},
        execution="external",
        actor=Actor(user=bob),
    )
    artifact = draft(acme)
    approval = ask(at_review(run, artifact), artifact, bob)
    operation_reserve(
        tenant=acme,
        run_id=run.id,
        idempotency_key="fuzz-key-1",
        action="publish",
        target="posts",
        request_fingerprint="fp",
        actor=Actor.system("fuzz"),
    )
    _, token = token_issue(tenant=acme, user=alice, actor=Actor.system("fuzz"))
    for name, value in {
        "CAIRN_FUZZ_TOKEN": token,
        "CAIRN_FUZZ_RUN_ID": run.id,
        "CAIRN_FUZZ_ARTIFACT_ID": artifact.id,
        "CAIRN_FUZZ_APPROVAL_ID": approval.id,
        "CAIRN_FUZZ_KEY": "fuzz-key-1",
    }.items():
        print(f"{name}={value}")


if __name__ == "__main__":
    main()
