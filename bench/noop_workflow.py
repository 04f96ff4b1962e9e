"""Workflows for the step-overhead benchmark (loaded by bench workers via
CAIRN_WORKFLOW_MODULES): six steps that do nothing, and the same with a hold in step 3 so
the benchmark can kill the worker there; and one that waits at an approval state, whose next
step notes when it started (bench/approval_latency.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from runtime import StepContext, Workflow

STEPS = [f"step{i}" for i in range(1, 7)]


def _noop(ctx: StepContext) -> dict:
    return {}


def _hold_in_step3(ctx: StepContext) -> dict:
    hold = Path(os.environ.get("BENCH_HOLD_FILE", "/nonexistent"))
    if hold.exists():
        Path(str(hold) + ".entered").write_text(str(os.getpid()))
        while hold.exists():
            time.sleep(0.01)
    return {}


def _declare(name: str, third, steps: int = 6) -> Workflow:  # noqa: ANN001
    workflow = Workflow(name, version="1")
    states = STEPS[:steps]
    for index, state in enumerate(states):
        fn = third if state == "step3" else _noop
        workflow.add_step(state, fn, next=states[index + 1] if index < steps - 1 else "done")
    workflow.terminal("done")
    return workflow


bench_noop = _declare("bench_noop", _noop)
bench_hold = _declare("bench_hold", _hold_in_step3)
# Three steps: the difference to bench_noop is three lean steps (the per-step counts).
bench_noop3 = _declare("bench_noop3", _noop, steps=3)


def _draft(ctx: StepContext) -> dict:
    ctx.store_artifact("draft", f"draft of {ctx.run_id}\n", kind="draft")
    return {}


def _note_start(ctx: StepContext) -> dict:
    """The first thing the step after the approval does: write the time it started (file
    BENCH_STARTED_DIR/<run id>, renamed into place so a reader never sees half of it)."""
    started = time.time()
    folder = os.environ.get("BENCH_STARTED_DIR")
    if folder:
        partial = Path(folder, f".{ctx.run_id}")
        partial.write_text(repr(started))
        partial.rename(Path(folder, str(ctx.run_id)))
    return {}


bench_approval = Workflow("bench_approval", version="1")
bench_approval.add_step("draft", _draft, next="review")
bench_approval.approval(
    "review", next="after", rejected="rejected", artifact="draft", action="go_on"
)
bench_approval.add_step("after", _note_start, next="done")
bench_approval.terminal("done", "rejected")
