"""The crash matrix: a real worker process is SIGKILLed at each boundary of the side-effect
protocol while it publishes to the real local publishing service; a new worker resumes.

Whatever the boundary, the provider saw exactly one effect, the operation ends confirmed
with the provider's id stored, and no step after the effect runs again.
"""

from __future__ import annotations

import pytest

from checkpoints.models import Checkpoint, ExternalOperation, Run, RunStatus
from checkpoints.services.integrity import run_verify
from runtime.effects import BOUNDARIES
from tests.effects_workflows import runs_of, target_of
from tests.publishing import rescue_with_a_new_worker, run_killed_at
from tests.worker_fixtures import wait_for

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

# What the dying worker leaves behind at each boundary: the operation's status and how
# many publications the provider already holds.
AT_CRASH = {
    "reserved": ("reserved", 0),
    "pending": ("pending", 0),
    "accepted": ("pending", 1),
    "stored": ("confirmed", 1),
    "checkpointed": ("confirmed", 1),
}
CHECKPOINTS = [
    ("prepare", ""),
    ("publish", "prepare"),
    ("publish", ""),  # the pending checkpoint
    ("publish", ""),  # the post-action checkpoint
    ("announce", "publish"),
    ("done", "announce"),
]


def test_the_matrix_covers_every_boundary_of_the_protocol():
    assert tuple(AT_CRASH) == BOUNDARIES


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_worker_killed_at_each_boundary_is_resumed_with_exactly_one_effect(
    boundary: str,
    acme,  # noqa: ANN001
    worker_factory,  # noqa: ANN001
    publishing_service,  # noqa: ANN001
    tmp_path,  # noqa: ANN001
):
    run, count_dir, env = run_killed_at(
        boundary,
        tenant=acme,
        workflow_type="effects_demo",
        title="Why build cairns?",
        service=publishing_service,
        worker_factory=worker_factory,
        tmp_path=tmp_path,
    )
    operation = ExternalOperation.objects.get(run=run)
    assert (operation.status, publishing_service.stats()["publications"]) == AT_CRASH[boundary]
    at_crash = Run.objects.get(pk=run.pk)
    assert (at_crash.status, at_crash.state) == (RunStatus.RUNNING, "publish")

    rescue_with_a_new_worker(run, worker_factory=worker_factory, env=env)
    wait_for(
        lambda: Run.objects.get(pk=run.pk).status == RunStatus.SUCCEEDED,
        what=f"the run to finish after a crash at {boundary}",
    )
    run = Run.objects.get(pk=run.pk)

    stats = publishing_service.stats()
    assert stats["publications"] == 1
    assert stats["by_target"] == {target_of(run.pk): 1}
    assert stats["perform_requests"] == {operation.idempotency_key: 1}
    operation.refresh_from_db()
    assert operation.status == "confirmed"
    assert operation.provider_operation_id == stats["ids"][operation.idempotency_key]
    assert ExternalOperation.objects.filter(run=run).count() == 1
    # Nothing before the effect ran again, nothing after it repeated.
    assert (
        list(Checkpoint.objects.filter(run=run).order_by("sequence").values_list("state", "step"))
        == CHECKPOINTS
    )
    assert (runs_of(count_dir, "prepare"), runs_of(count_dir, "announce")) == (1, 1)
    assert runs_of(count_dir, "publish") == 2  # killed, then resumed
    assert run.restore_count == 1
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]
