"""Every writer that builds on a run's head is refused when that head was tampered with, by
the commit's own statement: the HTTP commit, the worker, the operator's resume and retry,
and the LangGraph saver. A fork builds on the checkpoint it is made from (refused when that
checkpoint's row is not its sealed self), and a cancel, which builds on nothing, stays the
way to end a tampered run. Each refusal writes nothing.

The tampering is what an attacker with database access can do without breaking a hash: a
run row's position or chain link moved, or the head checkpoint's clear position changed
(on PostgreSQL past the immutability trigger)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata

from cairn.errors import CairnError
from checkpoints.models import Checkpoint, Run, RunStatus
from langgraph_store.saver import CairnSaver
from langgraph_store.selectors import thread_runs
from runtime import executor
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.actions_support import advance as commit_into
from tests.actions_support import worker_run
from tests.factories import forge_checkpoint
from tests.runtime_support import advance as worker_advance
from tests.runtime_support import start

pytestmark = pytest.mark.django_db(transaction=True)


def tamper(run_id: object, how: str) -> None:
    run = Run.objects.get(pk=run_id)
    if how == "run_position":
        Run.objects.filter(pk=run.pk).update(step="forged")
    elif how == "run_chain_link":
        Run.objects.filter(pk=run.pk).update(latest_checkpoint_sha256="0" * 64)
    else:  # "head_checkpoint_row"
        forge_checkpoint(Checkpoint.objects.get(pk=run.latest_checkpoint_id), step="forged")


TAMPERS = ["run_position", "run_chain_link", "head_checkpoint_row"]


def _http_commit(ctx) -> tuple[object, Callable[[], str]]:  # noqa: ANN001
    ctx.workflow_fixture()
    run = run_create(
        tenant=ctx.acme, workflow_type="research", execution="external", actor=ctx.actor
    )
    run = commit_into(run, ctx.bob, "draft_answer")

    def attempt() -> str:
        response = ctx.api.post(
            f"/api/v1/runs/{run.pk}/checkpoints",
            {"expected_version": run.version, "state": "review", "step": "r", "envelope": {}},
            format="json",
        )
        return response.json().get("code", str(response.status_code))

    return run.pk, attempt


def _worker(ctx) -> tuple[object, Callable[[], str]]:  # noqa: ANN001
    ctx.settings.CAIRN_STEPS_PER_TASK = 1
    run = start(ctx.acme, "research")
    how = ctx.how

    def attempt() -> str:
        real = executor._Advance.next_step

        def tampered_after_restore(self, restored):  # noqa: ANN001, ANN202
            # The restore saw an intact head; the head is tampered with while the step runs.
            tamper(run.pk, how)
            return real(self, restored)

        ctx.monkeypatch.setattr(executor._Advance, "next_step", tampered_after_restore)
        outcome = worker_advance(run)
        ctx.monkeypatch.setattr(executor._Advance, "next_step", real)
        run.refresh_from_db()
        assert outcome == "paused" and run.status == RunStatus.PAUSED_FOR_REVIEW, outcome
        # The worker pauses the run with the refusal it got, named by its code's sentence.
        return "integrity_failure" if "Integrity failure" in run.status_reason else outcome

    return run.pk, attempt


def _action(name: str, body: Callable[[Run], dict], *, status: str = "") -> Callable:
    def make(ctx) -> tuple[object, Callable[[], str]]:  # noqa: ANN001
        run = worker_run(ctx.acme, ctx.bob)
        run = commit_into(run, ctx.bob, "draft_answer", **({"status": status} if status else {}))

        def attempt() -> str:
            response = ctx.api.post(
                f"/api/v1/runs/{run.pk}/actions/{name}", body(run), format="json"
            )
            payload = response.json()
            return payload.get("code", str(response.status_code))

        return run.pk, attempt

    return make


def _langgraph(ctx) -> tuple[object, Callable[[], str]]:  # noqa: ANN001
    saver = CairnSaver(tenant="acme")
    config = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
    stored = saver.put(config, generate_checkpoint(), generate_metadata(), {})
    [run] = thread_runs(tenant=ctx.acme, thread_id="t1")

    def attempt() -> str:
        try:
            saver.put(stored, generate_checkpoint(), generate_metadata(step=2), {})
        except CairnError as exc:
            return exc.code
        return "written"

    return run.pk, attempt


REFUSING = {
    "http_commit": _http_commit,
    "worker": _worker,
    "resume": _action(
        "resume", lambda run: {"expected_version": run.version}, status="paused_for_review"
    ),
    "retry": _action(
        "retry", lambda run: {"step": "draft", "reason": "again", "expected_version": run.version}
    ),
    "langgraph_saver": _langgraph,
}


class Ctx:
    def __init__(self, **values: object) -> None:
        self.__dict__.update(values)


@pytest.fixture
def ctx(request, acme, bob, api_as, settings, monkeypatch):  # noqa: ANN001
    return Ctx(
        acme=acme,
        bob=bob,
        api=api_as(bob, acme),
        actor=Actor(user=bob),
        settings=settings,
        monkeypatch=monkeypatch,
        workflow_fixture=lambda: request.getfixturevalue("workflow"),
    )


def _written(run_id: object) -> tuple[int, int, str]:
    run = Run.objects.get(pk=run_id)
    return Checkpoint.objects.filter(run_id=run_id).count(), run.checkpoint_sequence, run.state


@pytest.mark.parametrize("how", TAMPERS)
@pytest.mark.parametrize("writer", sorted(REFUSING))
def test_every_writer_is_refused_on_a_tampered_head_and_writes_nothing(ctx, writer, how):  # noqa: ANN001
    ctx.how = how
    run_id, attempt = REFUSING[writer](ctx)
    if writer != "worker":
        tamper(run_id, how)
    before = _written(run_id)
    assert attempt() == "integrity_failure"
    assert _written(run_id) == before


@pytest.mark.parametrize("writer", sorted(REFUSING))
def test_every_writer_writes_on_an_intact_head(ctx, writer):  # noqa: ANN001
    ctx.how = None
    run_id, attempt = REFUSING[writer](ctx)
    if writer == "worker":
        assert worker_advance(Run.objects.get(pk=run_id)) != "paused"
        return
    assert attempt() not in ("integrity_failure", "409", "500")


def test_a_fork_from_a_checkpoint_whose_row_was_altered_is_refused(ctx):  # noqa: ANN001
    run = commit_into(worker_run(ctx.acme, ctx.bob), ctx.bob, "draft_answer")
    tamper(run.pk, "head_checkpoint_row")
    response = ctx.api.post(
        f"/api/v1/runs/{run.pk}/actions/fork",
        {"from_sequence": run.checkpoint_sequence, "reason": "branch"},
        format="json",
    )
    assert response.status_code == 409 and response.json()["code"] == "integrity_failure"
    assert Run.objects.filter(forked_from_run=run).count() == 0


def test_a_tampered_run_can_still_be_cancelled(ctx):  # noqa: ANN001
    run = commit_into(worker_run(ctx.acme, ctx.bob), ctx.bob, "draft_answer")
    tamper(run.pk, "run_position")
    response = ctx.api.post(
        f"/api/v1/runs/{run.pk}/actions/cancel", {"reason": "tampered"}, format="json"
    )
    assert response.status_code == 200, response.content
    assert Run.objects.get(pk=run.pk).status == RunStatus.CANCELLED
