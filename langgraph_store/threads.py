"""LangGraph threads as Cairn runs: the workflow they follow, opening a thread, its head.

A thread is recorded by one or more Cairn runs (``LangGraphBranch``): the run opened with
the thread, and a fork (``run_fork``) for each branch LangGraph starts from an older
checkpoint. The thread's row is the lock every writer of the thread takes first.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.db import IntegrityError, transaction

from cairn.errors import InvalidRequest, RunNotActive
from checkpoints.models import Checkpoint, Execution, Run, WorkflowDefinition
from checkpoints.services.workflows import workflow_register
from langgraph_store.models import (
    ID_LENGTH,
    LangGraphBranch,
    LangGraphCheckpoint,
    LangGraphThread,
)
from runtime.services.forks import run_fork
from runtime.services.runs import run_create
from tenants.models import Tenant
from tenants.services import Actor

WORKFLOW_TYPE = "langgraph"
WORKFLOW_VERSION = "1"
RUNNING, INTERRUPTED = "running", "interrupted"
# LangGraph's channel for interrupt() writes (langgraph.checkpoint.serde.types.INTERRUPT).
INTERRUPT_CHANNEL = "__interrupt__"
DEFINITION = {
    "initial": RUNNING,
    "states": [RUNNING, INTERRUPTED],
    "transitions": [[RUNNING, INTERRUPTED], [INTERRUPTED, RUNNING]],
    # An interrupt() waits for a person's answer (the run shows as waiting_approval, set by
    # the store's commits), but it is no approval state: no Cairn approval gates the graph's
    # resume, and no writer is exempt from the approval invariant.
}


def langgraph_workflow_register() -> WorkflowDefinition:
    """Register the generic workflow every LangGraph thread's runs follow (idempotent)."""
    row, _ = workflow_register(
        tenant=None,
        workflow_type=WORKFLOW_TYPE,
        version=WORKFLOW_VERSION,
        definition=DEFINITION,
        has_code=False,
    )
    return row


def check_key(value: str, what: str, limit: int = ID_LENGTH) -> None:
    if not isinstance(value, str) or len(value) > limit:
        raise InvalidRequest(
            f"The LangGraph {what} must be a string of at most {limit} characters.",
            fields={what: "too long" if isinstance(value, str) else "not a string"},
        )


def _objective(thread_id: str) -> str:
    return f"langgraph thread {thread_id}"


def inputs_group(run: Run, thread_id: str) -> dict[str, Any]:
    # The same inputs as the genesis, so an envelope diff shows no change of inputs.
    return {
        "objective_ref": run.objective_ref or None,
        "values": {"langgraph_thread_id": thread_id},
    }


def thread_versions(thread: LangGraphThread) -> dict[str, int]:
    return {
        str(pk): version
        for pk, version in Run.objects.filter(langgraph_branch__thread=thread).values_list(
            "pk", "version"
        )
    }


def thread_lock(tenant: Tenant, thread_id: str) -> LangGraphThread | None:
    return (
        LangGraphThread.objects.select_for_update()
        .select_related("tenant")
        .filter(tenant=tenant, thread_id=thread_id)
        .first()
    )


def thread_open(*, tenant: Tenant, thread_id: str, actor: Actor) -> tuple[LangGraphThread, bool]:
    """Lock the thread's row, creating the thread and its first run when it is new.

    Call inside the caller's transaction; returns (thread, created). Two writers creating
    one thread at once end with one thread: the loser finds the winner's row.
    """
    thread = thread_lock(tenant, thread_id)
    if thread is not None:
        return thread, False
    check_key(thread_id, "thread_id")
    langgraph_workflow_register()
    try:
        with transaction.atomic():
            run = run_create(
                tenant=tenant,
                workflow_type=WORKFLOW_TYPE,
                workflow_version=WORKFLOW_VERSION,
                inputs={"langgraph_thread_id": thread_id},
                objective_ref=_objective(thread_id),
                execution=Execution.EXTERNAL,
                actor=actor,
            )
            thread = LangGraphThread.objects.create(tenant=tenant, thread_id=thread_id, run=run)
            LangGraphBranch.objects.create(run=run, tenant=tenant, thread=thread)
    except IntegrityError:
        thread = thread_lock(tenant, thread_id)
        if thread is None:
            raise
        return thread, False
    return thread, True


def head_run_id(thread: LangGraphThread) -> uuid.UUID:
    """The run of the thread's latest root checkpoint: where a put without a parent goes."""
    latest = (
        LangGraphCheckpoint.objects.filter(thread=thread, checkpoint_ns="")
        .order_by("-checkpoint_id")
        .values_list("run_id", flat=True)
        .first()
    )
    return latest or thread.run_id


def branch_fork(*, thread: LangGraphThread, parent: LangGraphCheckpoint, actor: Actor) -> Run:
    """A Cairn fork (``run_fork``) of the parent's run, from the Cairn checkpoint that
    recorded the parent; the branch continues in it. Raises RunNotActive when that run
    ended (an operator's cancel stops the thread's branching too)."""
    source_run = Run.objects.only("status").get(pk=parent.run_id)
    if source_run.is_terminal:
        raise RunNotActive(
            f"The run of LangGraph checkpoint {parent.checkpoint_id} is {source_run.status}; "
            "the thread cannot branch from it."
        )
    source = Checkpoint.objects.only("sequence").get(pk=parent.cairn_checkpoint_id)
    run = run_fork(
        tenant=thread.tenant,
        run_id=parent.run_id,
        from_sequence=source.sequence,
        reason=f"LangGraph branch from checkpoint {parent.checkpoint_id} "
        "(update_state or a replay from an older checkpoint)",
        actor=actor,
    ).run
    LangGraphBranch.objects.create(
        run=run,
        tenant_id=thread.tenant_id,
        thread=thread,
        forked_from_checkpoint_id=parent.checkpoint_id,
    )
    return run
