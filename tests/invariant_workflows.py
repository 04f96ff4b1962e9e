"""The workflow the approval-invariant tests drive in this process: the smallest one with an
approval state in front of an effect.

``gated_publish``: ``draft`` (stores a draft artifact) → ``review`` (approval of ``publish``
for the draft, a rejection ends in ``rejected``) → ``publish`` (an effect through the local
publishing service that ships the draft and names its sha256) → ``done``.
"""

from __future__ import annotations

from typing import Any

from runtime import StepContext, Workflow
from runtime.effects import effect_perform

gated_publish = Workflow("gated_publish", version="1")


@gated_publish.step("draft", next="review")
def draft(ctx: StepContext) -> dict[str, Any]:
    # Each attempt writes other bytes, so a retried draft is a new artifact to review.
    ref = ctx.store_artifact(
        "draft", f"# {ctx.inputs.get('title', 'Cairns')}\n\nattempt {ctx.attempts_used}\n"
    )
    return {"draft_sha256": ref["sha256"]}


gated_publish.approval("review", next="publish", rejected="rejected", artifact="draft")


@gated_publish.effect("publish", next="done", action="publish")
def publish(ctx: StepContext) -> dict[str, Any]:
    draft_ref = ctx.artifact_ref("draft")
    done = effect_perform(
        ctx,
        target=f"gated/{ctx.run_id}",
        request={"body": ctx.artifact_text("draft"), "draft_sha256": draft_ref["sha256"]},
    )
    return {
        "provider_operation_id": done.provider_operation_id,
        "draft_sha256": draft_ref["sha256"],
    }


gated_publish.terminal("done", "rejected")
