"""The approval invariant under random interleavings (issue 24): a Hypothesis state machine.

It drives runs of ``gated_publish`` (draft → review, an approval of ``publish`` → publish, an
effect through the local publishing service → done) with whatever a hostile operator, a
runner and Cairn's own processes may do, in any order: API commits into any state with any
status (with or without the lease, keeping or swapping the draft), approval requests for any
action and artifact, decisions by anyone (the starter too), expiry, cancel, resume, retry,
fork, grant, the rescue sweep, worker steps, and history written directly as older Cairn
wrote it. After every step it asserts:

- nothing reached the provider that no consumed approval of its run binds (same action, and
  the draft it shipped is the approved artifact);
- ``verify`` is ok for a run exactly when the invariant holds on its chain (an oracle written
  apart from the code: tests/invariant_support.py), and names each checkpoint that breaks it.

It runs on SQLite and, with DATABASE_URL, on PostgreSQL, in CI: 12 examples of 25 steps,
300 steps in all (long examples, so that a move and what follows it meet).
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from approvals.models import LIVE_STATUSES, ApprovalDecision, ApprovalRequest, ApprovalStatus
from approvals.services.expiry import approval_expire_due
from checkpoints.models import Checkpoint, OutboxMessage, Run, RunStatus
from checkpoints.services.artifacts import artifact_store
from checkpoints.services.integrity import run_verify
from checkpoints.services.reads import checkpoint_envelope
from runtime.executor import run_advance
from runtime.registry import workflows_sync
from runtime.rescue import runs_rescue
from runtime.services.runs import run_create
from tenants.services import Actor, member_set_role
from tests.factories import UserFactory
from tests.invariant_support import invariant_breaks, shipped_unapproved
from tests.runtime_support import checkpoint_write_raw

pytestmark = pytest.mark.django_db

# Weighted towards the moves a hostile operator tries: past review, failing the run, and
# then taking it on.
STATES = ["publish"] * 3 + ["review", "draft", "rejected", "done"]
STATUSES = ["failed"] * 3 + [None, "waiting_retry", "succeeded"]
GOING_ON = ["resume", "resume", "retry publish", "grant", "retry draft", "cancel"]
REVIEWS = [
    "approve carol",
    "ask publish",
    "approve alice",
    "ask delete",
    "ask publish other",
    "reject carol",
    "approve dave",
    "expire",
]
EXAMPLES, STEPS = 12, 25


def build_machine(world: dict) -> type[RuleBasedStateMachine]:
    tenant, service = world["tenant"], world["service"]
    api, people = world["api"], world["people"]

    class ApprovalInvariant(RuleBasedStateMachine):
        runs = Bundle("runs")

        def __init__(self) -> None:
            super().__init__()
            self.mine: list[str] = []
            self.drafts = 0

        # --- helpers ------------------------------------------------------------------
        def _run(self, pk: str) -> Run:
            return Run.objects.get(pk=pk)

        def _call(self, who: str, method: str, path: str, body: dict | None = None):  # noqa: ANN202
            answer = getattr(api[who], method)(f"/api/v1/{path}", body or {}, format="json")
            assert answer.status_code < 500, answer.content  # a refusal, never a crash
            return answer

        def _other_draft(self):  # noqa: ANN202
            self.drafts += 1
            artifact, _ = artifact_store(
                tenant=tenant,
                data=f"# An unreviewed draft {self.drafts} {timezone.now()}\n".encode(),
                media_type="text/markdown",
                kind="draft",
            )
            return artifact

        # --- rules --------------------------------------------------------------------
        @initialize(target=runs)
        def start(self) -> str:
            run = run_create(
                tenant=tenant,
                workflow_type="gated_publish",
                inputs={"title": "Cairns"},
                budget={"max_attempts": 40},
                actor=Actor(user=people["alice"]),
            )
            self.mine.append(str(run.pk))
            self.work(str(run.pk))
            return str(run.pk)

        @rule(run=runs)
        def work(self, run: str) -> None:
            current = self._run(run)
            run_advance(run_id=current.pk, expected_version=current.version, owner="machine")

        @rule(
            run=runs,
            state=st.sampled_from(STATES),
            status=st.sampled_from(STATUSES),
            leased=st.booleans(),
            swap=st.booleans(),
        )
        def api_commit(self, run: str, state: str, status, leased: bool, swap: bool) -> None:  # noqa: ANN001
            current = self._run(run)
            body: dict = {
                "expected_version": current.version,
                "state": state,
                "step": state,
                "envelope": {},
            }
            if status:
                body["status"] = status
            if swap:
                head = checkpoint_envelope(Checkpoint.objects.get(pk=current.latest_checkpoint_id))
                other = self._other_draft()
                refs = [
                    r for r in head["evidence"].get("artifacts", []) if r.get("name") != "draft"
                ]
                refs.append({"id": str(other.id), "sha256": other.sha256, "name": "draft"})
                body["envelope"] = {"evidence": {**head["evidence"], "artifacts": refs}}
            if leased:
                lease = {"owner": "script", "ttl_seconds": 30, "expected_version": current.version}
                if self._call("bob", "post", f"runs/{run}/lease", lease).status_code != 200:
                    return
                body["lease_owner"] = "script"
            self._call("bob", "post", f"runs/{run}/checkpoints", body)
            if leased:
                api["bob"].delete(f"/api/v1/runs/{run}/lease?owner=script")

        @rule(run=runs, move=st.sampled_from(REVIEWS))
        def review(self, run: str, move: str) -> None:
            """Bob asks (for publish or another action, for the draft or another artifact);
            someone decides the newest pending request (alice started the run); or the
            approvals run past their expiry and the sweep expires them."""
            verb, _, detail = move.partition(" ")
            if verb == "ask":
                self._ask(run, action=detail.split()[0], other="other" in detail)
            elif verb == "expire":
                ApprovalRequest.objects.filter(run_id=run, status__in=LIVE_STATUSES).update(
                    expires_at=timezone.now() - timedelta(seconds=1)
                )
                approval_expire_due()
            else:
                self._decide(run, decision=verb, who=detail)
            self.work(run)

        def _ask(self, run: str, *, action: str, other: bool) -> None:
            current = self._run(run)
            head = checkpoint_envelope(Checkpoint.objects.get(pk=current.latest_checkpoint_id))
            refs = [r for r in head["evidence"].get("artifacts", []) if r.get("name") == "draft"]
            if other or not refs:
                artifact = self._other_draft()
                ref = {"id": str(artifact.id), "sha256": artifact.sha256}
            else:
                ref = refs[-1]
            body = {"artifact_id": ref["id"], "artifact_sha256": ref["sha256"], "action": action}
            self._call("bob", "post", f"runs/{run}/approvals", body)

        def _decide(self, run: str, *, decision: str, who: str) -> None:
            request = (
                ApprovalRequest.objects.filter(run_id=run, status=ApprovalStatus.PENDING)
                .order_by("-created_at")
                .first()
            )
            if request is None:
                return
            body = {"decision": decision, "artifact_sha256": request.artifact_sha256}
            body["comment"] = "no" if decision == "reject" else ""
            self._call(who, "post", f"approvals/{request.pk}/decision", body)

        @rule(run=runs, action=st.sampled_from(GOING_ON))
        def operator(self, run: str, action: str) -> None:
            """An operator action; one that queues the run's next command is followed by the
            worker taking it."""
            current = self._run(run)
            verb, _, step = action.partition(" ")
            body = {
                "resume": {"expected_version": current.version},
                "retry": {"step": step, "reason": "again"},
                "grant": {"attempts": 5, "reason": "more"},
                "cancel": {"reason": "stop"},
            }[verb]
            path = "grant_budget" if verb == "grant" else verb
            self._call("bob", "post", f"runs/{run}/actions/{path}", body)
            self.work(run)

        @rule(target=runs, run=runs, back=st.integers(min_value=0, max_value=4))
        def fork(self, run: str, back: int):  # noqa: ANN201
            sequence = max(1, self._run(run).checkpoint_sequence - back)
            body = {"from_sequence": sequence, "reason": "try again"}
            answer = self._call("bob", "post", f"runs/{run}/actions/fork", body)
            if answer.status_code != 201:
                return multiple()
            self.mine.append(answer.json()["id"])
            return answer.json()["id"]

        @rule(run=runs)
        def rescue(self, run: str) -> None:
            """The beat's rescue sweep after the run's worker died (its lease lapsed and its
            command was lost), and the worker that takes the run then."""
            Run.objects.filter(pk=run, lease_owner="").update(
                lease_owner="dead-worker", lease_expires_at=timezone.now() - timedelta(seconds=1)
            )
            OutboxMessage.objects.filter(run_id=run, sent_at__isnull=True).update(
                sent_at=timezone.now() - timedelta(hours=1)
            )
            runs_rescue()
            self.work(run)

        @precondition(lambda self: self.mine)
        @rule(run=runs, status=st.sampled_from([RunStatus.FAILED, RunStatus.RUNNING]))
        def older_cairn_crosses(self, run: str, status: str) -> None:
            """The rows older Cairn wrote for a commit out of review with no approval."""
            current = self._run(run)
            if current.state != "review":
                return
            head = checkpoint_envelope(Checkpoint.objects.get(pk=current.latest_checkpoint_id))
            checkpoint_write_raw(
                current, head, state="publish", step="", schema_version=head["schema_version"]
            )
            Run.objects.filter(pk=run).update(status=status, lease_owner="")

        def teardown(self) -> None:
            """End this example's runs, so the sweeps of the next examples (which see every
            run of the database) are not handed this one's."""
            Run.objects.filter(pk__in=self.mine).update(
                status=RunStatus.CANCELLED, lease_owner="", lease_expires_at=None
            )
            OutboxMessage.objects.filter(run_id__in=self.mine, sent_at__isnull=True).update(
                sent_at=timezone.now()
            )
            ApprovalRequest.objects.filter(run_id__in=self.mine, status__in=LIVE_STATUSES).update(
                status=ApprovalStatus.CLOSED
            )

        # --- after every step ---------------------------------------------------------
        @invariant()
        def nothing_ships_without_a_consumed_approval_of_it(self) -> None:
            assert shipped_unapproved(service, self.mine) == []

        @invariant()
        def no_one_involved_approves(self) -> None:
            """Four eyes: alice starts every run (and the runtime raises its requests in her
            name), bob raises the rest; neither's approval may be recorded."""
            involved = ApprovalDecision.objects.filter(
                request__run_id__in=self.mine, decision="approve", approver=people["alice"]
            )
            assert not involved.exists()

        @invariant()
        def verify_is_ok_exactly_when_the_invariant_holds(self) -> None:
            for pk in self.mine:
                run = self._run(pk)
                breaks = invariant_breaks(run)
                report = run_verify(tenant=tenant, run_id=pk)
                assert report["ok"] == (not breaks), (breaks, report["problems"])
                for sequence in breaks:
                    assert any(f"checkpoint {sequence} " in p for p in report["problems"])

    return ApprovalInvariant


@pytest.fixture
def world(acme, alice, bob, carol, api_as, settings, publishing_service):  # noqa: ANN001, ANN201
    import tests.invariant_workflows  # noqa: F401  (declares gated_publish)

    settings.CAIRN_PUBLISHING_URL = publishing_service.url
    settings.CAIRN_PUBLISHING_TOKEN_REF = ""
    settings.CAIRN_RETRY_DELAY_SECONDS = 0
    settings.CAIRN_STEPS_PER_TASK = 3
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    workflows_sync()
    dave = UserFactory(username="dave")
    member_set_role(tenant=acme, user=dave, role="reviewer", actor=Actor.system("test"))
    people = {"alice": alice, "bob": bob, "carol": carol, "dave": dave}
    return {
        "tenant": acme,
        "service": publishing_service,
        "people": people,
        "api": {name: api_as(user, acme) for name, user in people.items()},
    }


def test_no_interleaving_ships_an_unapproved_effect_and_verify_tells_the_truth(world):  # noqa: ANN001
    run_state_machine_as_test(
        build_machine(world),
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
