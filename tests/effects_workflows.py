"""The workflow the side-effect tests run (in the test process and on worker subprocesses,
which load it through CAIRN_WORKFLOW_MODULES).

``effects_demo``: prepare → publish (an external effect through the local publishing
service) → announce → done. Every step appends a line to ``<count_dir>/<step>.runs`` each
time its function runs, so a test can tell which steps ran again after a crash.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from runtime import StepContext, Workflow
from runtime.effects import effect_job, effect_perform

effects_demo = Workflow("effects_demo", version="1")


def _count(ctx: StepContext, step: str) -> None:
    with open(Path(ctx.inputs["count_dir"]) / f"{step}.runs", "a") as handle:
        handle.write(f"{os.getpid()}\n")


def runs_of(count_dir: Path, step: str) -> int:
    path = count_dir / f"{step}.runs"
    return path.read_text().count("\n") if path.exists() else 0


def target_of(run_id: object) -> str:
    return f"effects-demo/{run_id}"


@effects_demo.step("prepare", next="publish")
def prepare(ctx: StepContext) -> dict[str, Any]:
    _count(ctx, "prepare")
    ref = ctx.store_artifact("draft", f"# {ctx.inputs['title']}\n\nCairns mark the way.\n")
    return {"draft_sha256": ref["sha256"]}


@effects_demo.effect("publish", next="announce", action="publish")
def publish(ctx: StepContext) -> dict[str, Any]:
    _count(ctx, "publish")
    done = effect_perform(
        ctx,
        target=target_of(ctx.run_id),
        request={
            "title": ctx.inputs["title"],
            "body": ctx.artifact_text("draft"),
            "draft_sha256": ctx.output_of("prepare")["draft_sha256"],
        },
    )
    return {"provider_operation_id": done.provider_operation_id, "replayed": done.replayed}


@effects_demo.step("announce", next="done")
def announce(ctx: StepContext) -> dict[str, Any]:
    _count(ctx, "announce")
    return {"announced": ctx.output_of("publish")["provider_operation_id"]}


effects_demo.terminal("done")


# ``jobs_demo``: prepare → publish (a long-running tool: submit a job, record its id, poll
# it) → done. The job runs on the local publishing service for as long as it says.
jobs_demo = Workflow("jobs_demo", version="1")


@jobs_demo.step("prepare", next="publish")
def jobs_prepare(ctx: StepContext) -> dict[str, Any]:
    _count(ctx, "prepare")
    ref = ctx.store_artifact("draft", f"# {ctx.inputs['title']}\n\nA long job.\n")
    return {"draft_sha256": ref["sha256"]}


@jobs_demo.effect("publish", next="done", action="publish")
def jobs_publish(ctx: StepContext) -> dict[str, Any]:
    _count(ctx, "publish")
    done = effect_job(
        ctx,
        target=target_of(ctx.run_id),
        request={"title": ctx.inputs["title"], "body": ctx.artifact_text("draft")},
        poll_seconds=0.3,
    )
    return {"provider_operation_id": done.provider_operation_id, "replayed": done.replayed}


jobs_demo.terminal("done")
