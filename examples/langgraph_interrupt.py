"""A LangGraph graph with a human interrupt, checkpointed into Cairn.

research → draft → review (interrupt: a person approves the draft) → publish

Every step is a Cairn checkpoint of the thread's run, so the process can be killed at any
moment: running it again continues from the last checkpoint, never from the start. While
the graph waits, the run shows as waiting_approval in the console, with an approval request
for the draft that a reviewer decides there.

    .venv/bin/python examples/langgraph_interrupt.py run --thread demo-1
    .venv/bin/python examples/langgraph_interrupt.py show --thread demo-1
    .venv/bin/python examples/langgraph_interrupt.py resume --thread demo-1  # console decides
    .venv/bin/python examples/langgraph_interrupt.py resume --thread demo-1 --answer approve

Needs `pip install .[langgraph]` and a tenant (`make run` creates "demo").
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any, TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "cairn.settings")

import django  # noqa: E402

django.setup()

from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402

from langgraph_store.saver import CairnSaver  # noqa: E402
from langgraph_store.selectors import thread_head_run  # noqa: E402

ACTION = "publish"
# Each checkpoint is in Cairn before the next step starts, so a crash loses no finished step
# (LangGraph's default, "async", writes checkpoints while the next step already runs).
DURABILITY = "sync"
WORK_SECONDS = 0.0  # how long the draft step "calls the model" (set by --work-seconds)


class State(TypedDict, total=False):
    topic: str
    notes: str
    draft: str
    decision: str
    published: str
    log: Annotated[list[str], operator.add]


def research(state: State) -> State:
    return {"notes": f"three sourced facts about {state['topic']}", "log": ["research"]}


def draft(state: State) -> State:
    print(f"draft: working ({WORK_SECONDS:g}s)", flush=True)
    time.sleep(WORK_SECONDS)
    return {"draft": f"# {state['topic']}\n\nBased on {state['notes']}.", "log": ["draft"]}


def review(state: State) -> State:
    decision = interrupt({"question": "Publish this draft?", "draft": state["draft"]})
    return {"decision": decision, "log": ["review"]}


def publish(state: State) -> State:
    published = state["draft"] if state["decision"] == "approve" else ""
    return {"published": published, "log": ["publish"]}


def build_graph(saver: CairnSaver):  # noqa: ANN201
    builder = StateGraph(State)
    for name, node in (("research", research), ("draft", draft), ("review", review)):
        builder.add_node(name, node)
    builder.add_node("publish", publish)
    builder.add_edge(START, "research")
    builder.add_edge("research", "draft")
    builder.add_edge("draft", "review")
    builder.add_edge("review", "publish")
    builder.add_edge("publish", END)
    return builder.compile(checkpointer=saver)


def request_approval(saver: CairnSaver, thread_id: str, draft_text: str) -> str:
    """Put the draft under review in Cairn: an artifact and an approval request for it."""
    from approvals.services.requests import approval_request_create
    from checkpoints.models import ArtifactKind
    from checkpoints.services.artifacts import artifact_store

    run = thread_head_run(tenant=saver.tenant, thread_id=thread_id)
    artifact, _ = artifact_store(
        tenant=saver.tenant,
        data=draft_text.encode(),
        media_type="text/markdown",
        kind=ArtifactKind.DRAFT,
    )
    request = approval_request_create(
        tenant=saver.tenant,
        run_id=run.id,
        artifact_id=artifact.id,
        artifact_sha256=artifact.sha256,
        action=ACTION,
        actor=saver.actor,
    )
    return str(request.pk)


def console_decision(saver: CairnSaver, thread_id: str) -> str | None:
    """ "approve" or "reject" when a reviewer decided in the console, else None."""
    from approvals.models import ApprovalRequest, ApprovalStatus
    from approvals.services.gate import approval_consume

    run = thread_head_run(tenant=saver.tenant, thread_id=thread_id)
    request = ApprovalRequest.objects.filter(run=run, action=ACTION).order_by("-created_at").first()
    if request is None or request.status in (ApprovalStatus.PENDING, ApprovalStatus.EXPIRED):
        return None
    if request.status == ApprovalStatus.APPROVED:
        # Used exactly once, for the run version it was given for.
        approval_consume(
            run=run,
            request_id=request.pk,
            action=ACTION,
            artifact_sha256=request.artifact_sha256,
            actor=saver.actor,
        )
    approved = (ApprovalStatus.APPROVED, ApprovalStatus.CONSUMED)
    return "approve" if request.status in approved else "reject"


def report_waiting(saver: CairnSaver, thread_id: str, values: dict[str, Any]) -> None:
    request_id = request_approval(saver, thread_id, values["draft"])
    run = thread_head_run(tenant=saver.tenant, thread_id=thread_id)
    print(
        f"waiting: Publish this draft? run {run.id} is {run.status} "
        f"(approval request {request_id})",
        flush=True,
    )


def command_run(graph, saver: CairnSaver, args: argparse.Namespace) -> int:  # noqa: ANN001
    config = {"configurable": {"thread_id": args.thread}}
    snapshot = graph.get_state(config)
    if snapshot.interrupts:
        print("waiting: the thread already waits for a decision; use `resume`", flush=True)
        return 0
    if not snapshot.values:
        graph.invoke({"topic": args.topic, "log": []}, config, durability=DURABILITY)
    elif snapshot.next:
        print(f"continuing from Cairn before: {', '.join(snapshot.next)}", flush=True)
        graph.invoke(None, config, durability=DURABILITY)
    snapshot = graph.get_state(config)
    if snapshot.interrupts:
        report_waiting(saver, args.thread, snapshot.values)
        if args.hold:
            print("holding: this process now only waits; kill it, then `resume`", flush=True)
            while True:
                time.sleep(60)
        return 0
    print("done: " + json.dumps(snapshot.values, sort_keys=True), flush=True)
    return 0


def command_resume(graph, saver: CairnSaver, args: argparse.Namespace) -> int:  # noqa: ANN001
    config = {"configurable": {"thread_id": args.thread}}
    if not graph.get_state(config).interrupts:
        print("not waiting: nothing to resume", flush=True)
        return 1
    answer = args.answer or console_decision(saver, args.thread)
    if answer is None:
        print("waiting: no decision in the console yet", flush=True)
        return 3
    run = thread_head_run(tenant=saver.tenant, thread_id=args.thread)
    if run.is_terminal:
        print(f"ended: the run is {run.status} ({run.status_reason})", flush=True)
        return 4
    graph.invoke(Command(resume=answer), config, durability=DURABILITY)
    print("done: " + json.dumps(graph.get_state(config).values, sort_keys=True), flush=True)
    return 0


def command_show(graph, saver: CairnSaver, args: argparse.Namespace) -> int:  # noqa: ANN001
    config = {"configurable": {"thread_id": args.thread}}
    snapshot = graph.get_state(config)
    run = thread_head_run(tenant=saver.tenant, thread_id=args.thread)
    if run is None:
        print(f"unknown: no thread {args.thread}", flush=True)
        return 1
    print(
        json.dumps(
            {
                "run": str(run.id),
                "status": run.status,
                "cairn_checkpoints": run.checkpoint_sequence,
                "next": list(snapshot.next),
                "values": snapshot.values,
            },
            indent=2,
            sort_keys=True,
        ),
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    global WORK_SECONDS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["run", "resume", "show"])
    parser.add_argument("--thread", required=True)
    parser.add_argument("--tenant", default=os.environ.get("CAIRN_TENANT", "demo"))
    parser.add_argument("--topic", default="durable agents")
    parser.add_argument("--answer", choices=["approve", "reject"])
    parser.add_argument("--work-seconds", type=float, default=0.0)
    parser.add_argument("--hold", action="store_true", help="stay alive while waiting")
    args = parser.parse_args(argv)
    WORK_SECONDS = args.work_seconds
    saver = CairnSaver(tenant=args.tenant)
    graph = build_graph(saver)
    command = {"run": command_run, "resume": command_resume, "show": command_show}
    return command[args.command](graph, saver, args)


if __name__ == "__main__":
    sys.exit(main())
