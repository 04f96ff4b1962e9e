"""The chaos rehearsal's workflow (tests/chaos_rehearsal.py; loaded by its workers through
CAIRN_WORKFLOW_MODULES): the demo ``research`` workflow, an approval then a publication, with
each step taking ``CAIRN_CHAOS_STEP_SECONDS`` (0.3 s), as a model call would, so the faults
find work in flight rather than idle workers."""

from __future__ import annotations

import os
import time
from typing import Any

from runtime import StepContext, Workflow
from runtime.demo import research


def _slow(fn):  # noqa: ANN001, ANN202
    def step(ctx: StepContext) -> Any:
        time.sleep(float(os.environ.get("CAIRN_CHAOS_STEP_SECONDS", "0.3")))
        return fn(ctx)

    return step


research_slow = Workflow("research_slow", version="1")
for _state in research.states:
    if _state in research.steps:
        _spec = research.steps[_state]
        research_slow.add_step(
            _state,
            _slow(_spec.fn),
            next=_spec.next,
            name=_spec.name,
            effect_action=_spec.effect_action,
        )
    elif _state in research.approvals:
        _approval = research.approvals[_state]
        research_slow.approval(
            _state,
            next=_approval.next,
            rejected=_approval.rejected,
            artifact=_approval.artifact,
            action=_approval.action,
        )
    else:
        research_slow.terminal(_state)
