"""Workflows for the step-overhead benchmark (loaded by bench workers via
CAIRN_WORKFLOW_MODULES): six steps that do nothing, and the same with a hold in step 3 so
the benchmark can kill the worker there."""

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
