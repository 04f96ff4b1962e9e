"""Real worker processes whose clock is two minutes off, under Debian's ``faketime``: one
ahead does not take a healthy worker's lease in the middle of a step, one behind keeps its
own lease for the whole step (nobody else runs it meanwhile), and each says in its log, and
on its heartbeat for the health page, how far its clock is from the database's.

PostgreSQL only: the database's clock must be another process's (SQLite's is the worker's
own, so faketime would move it too). The lease is the shipped minute.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import tests.runtime_workflows  # noqa: F401 - declares research_gated in this process too
from checkpoints.models import Checkpoint, Run, WorkerHeartbeat
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.worker_fixtures import wait_for

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.worker,
    pytest.mark.django_db(transaction=True),
]

SHIPPED = {"CAIRN_LEASE_SECONDS": "60"}
# Only the wall clock is off (a drifted machine); tests/faketime_site works around
# libfaketime 0.9.10's time.sleep on Python 3.11.
SKEWED = {
    **SHIPPED,
    "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    "PYTHONPATH": str(Path(__file__).resolve().parent / "faketime_site"),
}


def faketime(offset: str) -> list[str]:
    return ["faketime", "-f", offset]


@pytest.fixture
def gated(acme, broker, tmp_path):  # noqa: ANN001, ANN201
    """A research run that will hold in extract_claims until the test lets it go."""
    gate = tmp_path / "gate"
    gate.mkdir()
    (gate / "extract_claims.hold").write_text("hold")
    run = run_create(
        tenant=acme,
        workflow_type="research_gated",
        inputs={"question": "q", "gate_dir": str(gate)},
        budget={"max_attempts": 20},
        actor=Actor.system("test"),
    )
    return run, gate


def entered(gate: Path) -> None:
    wait_for((gate / "extract_claims.entered").exists, what="a worker to enter the step")


def command_to_the_idle_worker(run: Run) -> None:
    """The run's command again (a duplicate, a rescue): the one idle worker takes it."""
    from cairn.celery import app

    run.refresh_from_db()
    app.send_task(
        "checkpoints.run_advance",
        kwargs={"run_id": str(run.pk), "expected_version": run.version},
    )


def finished_by_the_one_worker(run: Run, gate: Path, owner_pid: int) -> None:
    (gate / "extract_claims.hold").unlink()
    wait_for(
        lambda: Checkpoint.objects.filter(run=run, state="draft_answer").exists(),
        what="the step's commit",
    )
    run.refresh_from_db()
    assert run.restore_count == 0  # nobody took it over
    assert (gate / "extract_claims.runs").read_text().split() == [str(owner_pid)]


def offset_of(pid: int, *, under_wrapper: bool = False) -> float:
    """The clock offset the worker's heartbeat measured (``under_wrapper``: ``pid`` is the
    faketime wrapper's, and the worker is its child)."""
    pids = [pid]
    if under_wrapper:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        pids = [int(child) for child in children]
    return wait_for(
        lambda: (
            WorkerHeartbeat.objects.filter(pid__in=pids)
            .values_list("clock_offset_seconds", flat=True)
            .first()
        ),
        what="the worker's heartbeat",
    )


def test_a_worker_two_minutes_ahead_does_not_take_a_healthy_workers_lease(gated, worker_factory):  # noqa: ANN001
    run, gate = gated
    healthy = worker_factory("healthy", env=SHIPPED)
    entered(gate)
    fast = worker_factory("fast", env=SKEWED, wrap=faketime("+120s"))
    command_to_the_idle_worker(run)
    wait_for(
        lambda: "run leased by another worker; backing off" in fast.log(),
        what="the fast worker to back off",
    )
    owner = int((gate / "extract_claims.entered").read_text())
    finished_by_the_one_worker(run, gate, owner)
    assert healthy.alive
    # Its heartbeat (by the celery process's pid, under the faketime wrapper) says so too.
    assert 118 < offset_of(fast.process.pid, under_wrapper=True) < 122
    assert "worker clock is off the database's by +12" in fast.log()


def test_a_worker_two_minutes_behind_keeps_its_lease_for_the_whole_step(gated, worker_factory):  # noqa: ANN001
    run, gate = gated
    slow = worker_factory("slow", env=SKEWED, wrap=faketime("-120s"))
    entered(gate)
    other = worker_factory("other", env=SHIPPED)
    command_to_the_idle_worker(run)
    wait_for(
        lambda: "run leased by another worker; backing off" in other.log(),
        what="the other worker to back off",
    )
    owner = int((gate / "extract_claims.entered").read_text())
    finished_by_the_one_worker(run, gate, owner)
    assert -122 < offset_of(owner) < -118
    assert "worker clock is off the database's by -12" in slow.log()
