"""Workflows the worker tests run (loaded by test workers via CAIRN_WORKFLOW_MODULES).

``research_gated`` is the demo research workflow with a gate in front of every step: the
step records each execution in ``<gate_dir>/<step>.runs``, spends model tokens, and when
``<gate_dir>/<step>.hold`` exists it writes ``<step>.entered`` and blocks until the hold
file is removed. A test can so kill a worker exactly in the middle of a chosen step.
``research_quorum`` is the demo with a quorum of two reviewers of the group 'legal' at its
approval state.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from runtime import StepContext, Workflow
from runtime.demo import research


def _gated(fn, name: str):  # noqa: ANN001, ANN202
    def step(ctx: StepContext) -> Any:
        gate = Path(ctx.inputs["gate_dir"])
        with open(gate / f"{name}.runs", "a") as handle:
            handle.write(f"{os.getpid()}\n")
        ctx.model.complete(prompt=f"before {name}")  # usage spent before a possible crash
        hold = gate / f"{name}.hold"
        if hold.exists():
            (gate / f"{name}.entered").write_text(str(os.getpid()))
            while hold.exists():
                time.sleep(0.05)
        return fn(ctx)

    return step


def _research_copy(name: str, *, step=None, **approval) -> Workflow:  # noqa: ANN001
    """The demo research workflow under another name: each step's function passed through
    ``step(fn, name)`` when given, the approval state declared with ``approval`` added."""
    copy = Workflow(name, version="1")
    for state in research.states:
        if state in research.steps:
            spec = research.steps[state]
            copy.add_step(
                state,
                step(spec.fn, spec.name) if step else spec.fn,
                next=spec.next,
                name=spec.name,
                effect_action=spec.effect_action,
            )
        elif state in research.approvals:
            gate = research.approvals[state]
            copy.approval(
                state,
                next=gate.next,
                rejected=gate.rejected,
                artifact=gate.artifact,
                action=gate.action,
                **approval,
            )
        else:
            copy.terminal(state)
    return copy


research_gated = _research_copy("research_gated", step=_gated)

GATED_STEPS = [s for s in research.states if s in research.steps][:4]

# The demo research workflow whose approval the reviewer group 'legal' decides, two of them
# (tests/browser/test_approve_with_edits_browser.py).
research_quorum = _research_copy("research_quorum", reviewers={"group": "legal"}, quorum=2)

# Six steps that do nothing: what a step costs the runtime itself (tests/test_fast_path.py).
noop_six = Workflow("noop_six", version="1")
NOOP_STEPS = [f"n{i}" for i in range(1, 7)]
for _index, _state in enumerate(NOOP_STEPS):
    noop_six.add_step(_state, lambda ctx: {}, next=(NOOP_STEPS + ["done"])[_index + 1])
noop_six.terminal("done")
