"""The fast path, pinned by counting: a commit is one statement on PostgreSQL (one
transaction of plain statements on SQLite), a worker step in the lean loop is one read and
one commit, and a worker that continues a run publishes no command it executes itself.
A commit or a step that gains a statement fails here."""

from __future__ import annotations

import uuid
import zlib
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from cairn.errors import ConcurrentCheckpointWrite
from checkpoints import crypto
from checkpoints import envelope as env
from checkpoints.models import Checkpoint, OutboxMessage, Run, RunStatus
from checkpoints.services import outbox
from checkpoints.services.checkpoints import CommitRequest, WorkerLoop, checkpoint_commit
from checkpoints.services.commit_sql import RunHead
from checkpoints.services.integrity import run_verify
from checkpoints.services.reads import checkpoint_envelope, run_get
from runtime.lease import LeaseKeeper
from runtime.registry import workflows_sync
from runtime.services.leases import lease_acquire
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.factories import ENVELOPE_GROUPS
from tests.runtime_support import advance
from tests.runtime_workflows import NOOP_STEPS
from tests.worker_fixtures import wait_for

ACTOR = Actor.system("test")
LAST = []
# Statements of one commit, BEGIN and COMMIT included where the commit opens them.
COMMIT_STATEMENTS = {"postgresql": 1, "sqlite": 5}
# A step in the lean loop: its read, and its commit (which also marks the command it
# carried out itself as done: one more statement on SQLite, inside the same statement on
# PostgreSQL).
LEAN_STEP_STATEMENTS = {"postgresql": 2, "sqlite": 7}


def _external_run(tenant):  # noqa: ANN001, ANN202
    return run_create(tenant=tenant, workflow_type="research", execution="external", actor=ACTOR)


def _commit(tenant, run_id, version, *, head=None, state="draft_answer"):  # noqa: ANN001, ANN202
    return checkpoint_commit(
        tenant=tenant,
        run_id=run_id,
        head=head,
        request=CommitRequest(
            expected_version=version, state=state, step=state, envelope=ENVELOPE_GROUPS, actor=ACTOR
        ),
    )


def _writes(queries) -> list[str]:  # noqa: ANN001
    return [q["sql"][:40] for q in queries.captured_queries]


@pytest.fixture(autouse=True)
def _latency_buffered(settings):  # noqa: ANN001
    # Production buffers commit-latency samples (one INSERT every few seconds, not per
    # commit); the test settings flush at once, which would count here.
    settings.CAIRN_METRICS_FLUSH_SECONDS = 3600


@pytest.mark.django_db(transaction=True)
def test_a_commit_given_its_head_is_one_statement_and_without_it_two(acme, workflow):
    run = _external_run(acme)
    head = RunHead.of(Run.objects.select_related("workflow").get(pk=run.pk))
    with CaptureQueriesContext(connection) as queries:
        first = _commit(acme, run.pk, run.version, head=head)
    assert len(queries) == COMMIT_STATEMENTS[connection.vendor], _writes(queries)
    with CaptureQueriesContext(connection) as queries:
        _commit(acme, run.pk, first.run_version, state="review")
    # Without a head the commit reads it first: one statement more, never an ORM query.
    assert len(queries) == COMMIT_STATEMENTS[connection.vendor] + 1, _writes(queries)
    run.refresh_from_db()
    assert run.checkpoint_sequence == 3 and run.version == first.run_version + 1
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]
    assert OutboxMessage.objects.filter(run=run, kind="run.checkpointed").count() == 2


@pytest.mark.postgres
def test_on_postgresql_the_commit_is_one_round_trip_on_a_prepared_statement(
    postgres_only, acme, workflow
):
    run = _external_run(acme)
    result = _commit(acme, run.pk, run.version)
    with CaptureQueriesContext(connection) as queries:
        _commit(acme, run.pk, result.run_version, head=result.head, state="review")
    # No BEGIN and no COMMIT: one statement outside a transaction is one round trip.
    assert [q["sql"].lstrip().split()[0] for q in queries.captured_queries] == ["WITH"]
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%%moved%%'"
        )
        assert cursor.fetchone()[0] == 1


def test_a_stale_head_writes_nothing_and_is_decided_on_the_run_as_it_is(acme, workflow):
    run = _external_run(acme)
    stale = RunHead.of(Run.objects.select_related("workflow").get(pk=run.pk))
    winner = _commit(acme, run.pk, run.version)
    # The loser holds the head it read: it is refused as a fresh read would refuse it.
    with pytest.raises(ConcurrentCheckpointWrite):
        _commit(acme, run.pk, run.version, head=stale)
    assert Checkpoint.objects.filter(run=run).count() == 2
    # A head whose usage is stale (a lease's charge moved it, not the version): re-read,
    # written, and the envelope carries the usage the run has.
    Run.objects.filter(pk=run.pk).update(budget_used={"attempts_used": 3})
    result = _commit(acme, run.pk, winner.run_version, head=winner.head, state="review")
    assert (
        checkpoint_envelope(Checkpoint.objects.get(pk=result.checkpoint_id))["budgets"][
            "attempts_used"
        ]
        == 3
    )
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]


def test_envelopes_are_compressed_before_encryption_and_old_rows_still_read(acme, workflow):
    run = _external_run(acme)
    big = {
        **ENVELOPE_GROUPS,
        "evidence": {**ENVELOPE_GROUPS["evidence"], "outputs": {"text": "agent notes " * 4000}},
    }
    result = checkpoint_commit(
        tenant=acme,
        run_id=run.pk,
        request=CommitRequest(
            expected_version=run.version, state="draft_answer", envelope=big, actor=ACTOR
        ),
    )
    checkpoint = Checkpoint.objects.get(pk=result.checkpoint_id)
    assert crypto.is_compressed(checkpoint.envelope_sealed)
    plain = env.canonical_json(checkpoint_envelope(checkpoint))
    assert len(checkpoint.envelope_sealed) < len(plain) / 5
    # A row sealed before compression (format v1) reads the same.
    old = crypto.seal(
        plain, tenant_id=acme.id, table="checkpoint", row_id=checkpoint.id, field="envelope"
    )
    assert old.startswith("v1.")
    assert (
        crypto.unseal(
            old, tenant_id=acme.id, table="checkpoint", row_id=checkpoint.id, field="envelope"
        )
        == plain
    )
    # Tampering with a compressed row fails authentication, never decompresses junk.
    # A character in the middle of the ciphertext carries six data bits; the last ones of a
    # padded base64 text may carry only padding, and a flip there changed nothing (flaky).
    head, cipher = checkpoint.envelope_sealed.rsplit(".", 1)
    middle = len(cipher) // 2
    swapped = "A" if cipher[middle] != "A" else "B"
    flipped = f"{head}.{cipher[:middle]}{swapped}{cipher[middle + 1 :]}"
    with pytest.raises(crypto.DecryptionError):
        crypto.unseal(
            flipped, tenant_id=acme.id, table="checkpoint", row_id=checkpoint.id, field="envelope"
        )
    assert zlib.decompress(zlib.compress(plain, crypto.ZLIB_LEVEL)) == plain


@pytest.fixture
def noop_six(db):  # noqa: ANN001
    workflows_sync()  # tests.runtime_workflows (imported above) declares noop_six


def _worker_run(tenant):  # noqa: ANN001, ANN202
    return run_create(tenant=tenant, workflow_type="noop_six", execution="worker", actor=ACTOR)


def test_a_lean_step_is_one_read_and_one_commit(acme, noop_six, settings):
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    run = _worker_run(acme)
    run.refresh_from_db()
    statements = []
    from runtime import executor

    real = executor._Advance.next_step

    def counted(self, restored):  # noqa: ANN001, ANN202
        # From the end of one step's commit to the end of the next: the read and the commit.
        with CaptureQueriesContext(connection) as queries:
            outcome = real(self, restored)
        statements.append(len(queries))
        LAST[:] = _writes(queries)
        return outcome

    # Counting around each turn of the loop: the lean turns also do their read here.
    real_still_ours = executor._Advance.still_ours

    def still_ours(self):  # noqa: ANN001, ANN202
        with CaptureQueriesContext(connection) as queries:
            real_still_ours(self)
        statements.append(len(queries))

    executor._Advance.next_step = counted
    executor._Advance.still_ours = still_ours
    try:
        assert advance(run) == "succeeded"
    finally:
        executor._Advance.next_step = real
        executor._Advance.still_ours = real_still_ours
    # statements: [first step, read 2, step 2, read 3, step 3, …, read 6, step 6]
    reads, lean_steps = statements[1::2], statements[2::2]
    assert reads == [1] * 5
    # Steps 2-5 also mark the previous step's command done; step 6 ends the run (its
    # command is recorded as sent: a resume of a finished run has no consumer).
    per_step = [r + s for r, s in zip(reads, lean_steps, strict=True)]
    expected = LEAN_STEP_STATEMENTS[connection.vendor]
    assert per_step[:4] == [expected] * 4, (per_step, LAST)
    assert per_step[4] == expected, per_step
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.checkpoint_sequence == 7
    assert run.budget_used["attempts_used"] == 6  # one attempt per step, prepaid or not
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]


def test_a_worker_that_continues_publishes_none_of_its_own_commands(acme, noop_six, settings):
    settings.CAIRN_DISPATCH_ON_COMMIT = True
    run = _worker_run(acme)
    outbox.outbox_dispatch()  # the run's first command, as the dispatcher would send it
    assert advance(run) == "succeeded"
    messages = list(OutboxMessage.objects.filter(run=run, kind="run.resume").order_by("id"))
    # Every step's command was written with its checkpoint, and none was published: no
    # dispatcher claim was ever made on them (attempts counts claims), all are done.
    step_commands = messages[1:]
    assert len(step_commands) == len(NOOP_STEPS)
    assert all(m.sent_at is not None and m.attempts == 0 for m in step_commands)
    assert outbox.outbox_dispatch() == 0


def _continuing_commit(acme, run, *, with_head: bool = False, charge_next_attempt: bool = False):  # noqa: ANN001, ANN202
    """Worker "w" leases the run (its genesis command already sent) and commits n1 → n2 as
    a worker that goes on with the run itself."""
    OutboxMessage.objects.filter(run=run).update(sent_at=timezone.now())
    lease = lease_acquire(
        tenant=acme, run_id=run.pk, owner="w", ttl_seconds=60, expected_version=run.version
    )
    head = RunHead.of(Run.objects.select_related("workflow").get(pk=run.pk)) if with_head else None
    return checkpoint_commit(
        tenant=acme,
        run_id=run.pk,
        head=head,
        request=CommitRequest(
            expected_version=lease.run_version,
            state="n2",
            step="n1",
            envelope={**ENVELOPE_GROUPS, "budgets": {"attempts_used": 1}},
            actor=ACTOR,
            lease_owner="w",
            worker=WorkerLoop(charge_next_attempt=charge_next_attempt),
        ),
    )


def test_a_command_taken_by_a_worker_is_left_to_the_sweep_if_the_worker_dies(
    acme, noop_six, settings
):
    settings.CAIRN_DISPATCH_ON_COMMIT = True
    run = _worker_run(acme)
    result = _continuing_commit(acme, run, with_head=True, charge_next_attempt=True)
    taken = OutboxMessage.objects.get(pk=result.outbox_id)
    assert taken.sent_at is None and taken.claimed_until > timezone.now() + timedelta(seconds=50)
    run.refresh_from_db()
    assert run.budget_used["attempts_used"] == 2  # the next step's attempt, charged ahead
    assert run.lease_expires_at > timezone.now() + timedelta(seconds=50)  # renewed too
    # The worker dies here. Until its claim lapses nobody publishes the command…
    assert outbox.outbox_dispatch() == 0
    # …then the sweep does, once, as for any claim of a dead dispatcher.
    OutboxMessage.objects.filter(pk=taken.pk).update(
        claimed_until=timezone.now() - timedelta(seconds=1)
    )
    assert outbox.outbox_dispatch() == 1
    taken.refresh_from_db()
    assert taken.sent_at is not None


def test_the_returned_head_carries_the_lease_the_database_wrote(acme, noop_six):
    """The renewed expiry is the one the statement set on the database's clock (read back
    from the write), not this process's estimate of it."""
    run = _worker_run(acme)
    result = _continuing_commit(acme, run, with_head=True)
    stored = Run.objects.values_list("lease_owner", "lease_expires_at").get(pk=run.pk)
    assert (result.head.lease_owner, result.head.lease_expires_at) == stored


def test_release_marks_the_command_the_worker_carried_out_as_done(acme, noop_six):
    run = _worker_run(acme)
    run = run_get(tenant=acme, run_id=run.pk)
    keeper = LeaseKeeper(run=run, owner="w", version=run.version, ttl_seconds=60)
    message = OutboxMessage.objects.filter(run=run).first()
    keeper.taken_outbox_id = message.pk
    keeper.release()
    message.refresh_from_db()
    assert message.sent_at is not None


@pytest.mark.django_db(transaction=True)
def test_a_six_step_run_on_a_real_worker_leaves_no_stale_task_queued(
    acme, noop_six, worker_factory, broker, settings
):
    from cairn.celery import app

    settings.CAIRN_DISPATCH_ON_COMMIT = True
    worker_factory("w1")
    for _ in range(2):
        run = _worker_run(acme)
        wait_for(
            lambda run=run: Run.objects.filter(pk=run.pk, status=RunStatus.SUCCEEDED).exists(),
            what="the six-step run to succeed",
        )
        assert OutboxMessage.objects.filter(run=run, sent_at__isnull=True).count() == 0
        published = OutboxMessage.objects.filter(run=run, attempts__gt=0).count()
        assert published == 1  # the run's first command; the worker did the rest itself
        if broker.url.startswith("redis"):
            with app.connection_for_write() as conn:
                assert conn.default_channel.client.llen("celery") == 0


FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-3, max_value=3),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=3),
    st.sampled_from(["", "a", "0" * 64, str(uuid.UUID(int=7)), "2026-01-01T00:00:00+00:00"]),
    st.lists(st.none(), max_size=1),
    st.dictionaries(st.sampled_from(["id", "sha256", "name", "passed"]), st.none(), max_size=2),
)


def _valid_envelope() -> dict:
    return {
        "schema_version": 2,
        "identity": {
            "run_id": str(uuid.UUID(int=1)),
            "workflow_type": "w",
            "workflow_version": "1",
            "checkpoint_id": str(uuid.UUID(int=2)),
            "parent_checkpoint_id": None,
            "sequence": 1,
            "parent_sha256": "",
        },
        "position": {"state": "s", "step": "", "transition_version": 1, "pending_action": None},
        "inputs": {},
        "evidence": {"artifacts": [], "validators": []},
        "side_effects": [],
        "budgets": {"attempts_used": 0, "max_cost": None, "deadline": None},
        "control": {},
        "compatibility": {
            "envelope_schema_version": 2,
            "workflow_code_version": "",
            "serializer_version": env.SERIALIZER_VERSION,
        },
    }


PATHS = [
    ("identity", "sequence"),
    ("identity", "parent_sha256"),
    ("identity", "parent_checkpoint_id"),
    ("identity", "run_id"),
    ("position", "step"),
    ("position", "pending_action"),
    ("budgets", "attempts_used"),
    ("budgets", "max_cost"),
    ("budgets", "max_attempts"),
    ("budgets", "deadline"),
    ("control", "approval_request_id"),
    ("evidence", "artifacts"),
    ("evidence", "validators"),
    ("side_effects",),
    ("inputs",),
    ("schema_version",),
]


@hsettings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(edits=st.lists(st.tuples(st.sampled_from(PATHS), FIELD_VALUES), max_size=3))
def test_the_compiled_schema_gives_the_verdict_jsonschema_gives(edits):
    envelope = _valid_envelope()
    for path, value in edits:
        target = envelope
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    try:
        env._compiled(envelope)
        fast = True
    except Exception:  # noqa: BLE001 - any refusal is a refusal
        fast = False
    assert fast == env._validator.is_valid(envelope)


def test_the_rescue_supersedes_a_dead_workers_taken_command_with_one_of_its_own(
    acme, noop_six, settings
):
    from runtime.rescue import runs_rescue

    run = _worker_run(acme)
    result = _continuing_commit(acme, run)
    # While the worker's lease lives, its taken command keeps the rescue away.
    assert runs_rescue() == 0
    # The worker dies: its lease and its claim lapse together.
    past = timezone.now() - timedelta(seconds=1)
    Run.objects.filter(pk=run.pk).update(lease_expires_at=past)
    OutboxMessage.objects.filter(pk=result.outbox_id).update(claimed_until=past)
    assert runs_rescue() == 1
    unsent = OutboxMessage.objects.filter(run=run, kind="run.resume", sent_at__isnull=True)
    assert unsent.count() == 1
    assert unsent.get().pk != result.outbox_id  # the rescue's own, at the run's version
    assert unsent.get().payload["expected_version"] == result.run_version


# A task's whole life on a six-step run. On PostgreSQL: the run read, the lease, the full
# validated restore of checkpoint 1 (its checkpoint and its operations), the first attempt's
# charge, six commits (the last also releases the lease) and five lean reads. SQLite's
# commits add their BEGIN, COMMIT and separate writes.
TASK_STATEMENTS = {"postgresql": 16, "sqlite": 45}


@pytest.mark.django_db(transaction=True)
def test_a_task_runs_six_steps_in_a_pinned_number_of_statements(acme, noop_six, settings):
    from runtime import executor

    settings.CAIRN_DISPATCH_ON_COMMIT = False
    run = _worker_run(acme)
    run.refresh_from_db()
    with CaptureQueriesContext(connection) as queries:
        outcome = executor.run_advance(run_id=run.pk, expected_version=run.version, owner="w")
    assert outcome == "succeeded"
    LAST[:] = [q["sql"][:60] for q in queries.captured_queries]
    assert len(queries) == TASK_STATEMENTS[connection.vendor], LAST
    run.refresh_from_db()
    assert run.budget_used["attempts_used"] == 6 and run.lease_owner == ""
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]


def _keeper(tenant, run):  # noqa: ANN001, ANN202
    lease = lease_acquire(
        tenant=tenant, run_id=run.pk, owner="w", ttl_seconds=30, expected_version=run.version
    )
    run.refresh_from_db()
    return LeaseKeeper(run=run, owner="w", version=lease.run_version, ttl_seconds=30)


@pytest.mark.django_db(transaction=True)
def test_a_charge_is_one_statement_when_the_usage_is_the_one_the_worker_wrote(acme, noop_six):
    run = _worker_run(acme)
    keeper = _keeper(acme, run)
    with CaptureQueriesContext(connection) as queries:
        used = keeper.charge(attempts_used=1, tokens_used=5)
    assert len(queries) == 1, _writes(queries)
    run.refresh_from_db()
    assert run.budget_used == used and used["attempts_used"] == 1 and used["tokens_used"] == 5


@pytest.mark.django_db(transaction=True)
def test_a_charge_on_usage_the_worker_did_not_write_adds_to_the_runs_usage(acme, noop_six):
    run = _worker_run(acme)
    keeper = _keeper(acme, run)
    # Usage written behind the keeper's back (as by another writer's commit) is never lost.
    Run.objects.filter(pk=run.pk).update(
        budget_used={"attempts_used": 3, "tokens_used": 7, "cost_used": 0, "elapsed_seconds": 0}
    )
    used = keeper.charge(attempts_used=1)
    run.refresh_from_db()
    assert run.budget_used == used and used["attempts_used"] == 4 and used["tokens_used"] == 7


@pytest.mark.django_db(transaction=True)
def test_a_charge_under_a_lost_lease_writes_nothing(acme, noop_six):
    from runtime.errors import LeaseLost

    run = _worker_run(acme)
    keeper = _keeper(acme, run)
    Run.objects.filter(pk=run.pk).update(lease_owner="someone-else")
    with pytest.raises(LeaseLost):
        keeper.charge(attempts_used=1)
    run.refresh_from_db()
    assert run.budget_used.get("attempts_used", 0) == 0


@pytest.mark.django_db(transaction=True)
def test_dispatching_a_command_is_a_claim_and_a_mark(acme, noop_six, settings, monkeypatch):
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    run = _worker_run(acme)
    message = OutboxMessage.objects.get(run=run, kind="run.resume")
    sent = []
    monkeypatch.setattr(outbox, "_publish", lambda m: sent.append((m.id, m.kind, m.payload)))
    with CaptureQueriesContext(connection) as queries:
        assert outbox.outbox_dispatch(message_ids=[message.id]) == 1
    assert len(queries) == 2, _writes(queries)  # the claim returns what it publishes
    assert sent == [(message.id, "run.resume", {"run_id": str(run.pk), "expected_version": 1})]
    message.refresh_from_db()
    assert message.sent_at is not None and message.attempts == 1
    assert outbox.outbox_dispatch(message_ids=[message.id]) == 0  # sent: never again


@pytest.mark.django_db(transaction=True)
def test_a_broker_failure_leaves_the_command_for_the_sweep(acme, noop_six, settings, monkeypatch):
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    run = _worker_run(acme)

    def down(message):  # noqa: ANN001, ANN202
        raise ConnectionError("broker down")

    monkeypatch.setattr(outbox, "_publish", down)
    assert outbox.outbox_dispatch() == 0
    message = OutboxMessage.objects.get(run=run, kind="run.resume")
    assert message.sent_at is None and message.claimed_until is None
    monkeypatch.setattr(outbox, "_publish", lambda m: None)
    assert outbox.outbox_dispatch() == 1


@pytest.mark.postgres
def test_racing_dispatchers_publish_each_command_once(
    postgres_only, acme, noop_six, settings, monkeypatch
):
    import threading

    from django.db import connections

    settings.CAIRN_DISPATCH_ON_COMMIT = False
    runs = [_worker_run(acme) for _ in range(30)]
    published, lock = [], threading.Lock()

    def record(message):  # noqa: ANN001, ANN202
        with lock:
            published.append(message.id)

    monkeypatch.setattr(outbox, "_publish", record)
    start = threading.Barrier(6)

    def dispatcher() -> None:
        try:
            start.wait()
            for _ in range(3):
                outbox.outbox_dispatch()
        finally:
            connections.close_all()

    threads = [threading.Thread(target=dispatcher) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(published) == sorted(
        OutboxMessage.objects.filter(run__in=runs, kind="run.resume").values_list("id", flat=True)
    )
    assert len(published) == len(set(published)) == 30


def _commit_releasing(tenant, run, version, **fields):  # noqa: ANN001, ANN003, ANN202
    return checkpoint_commit(
        tenant=tenant,
        run_id=run.pk,
        request=CommitRequest(
            expected_version=version,
            state="collect_sources",
            envelope=ENVELOPE_GROUPS,
            actor=ACTOR,
            lease_owner="w",
            worker=WorkerLoop(),
            **fields,
        ),
    )


@pytest.mark.django_db(transaction=True)
def test_a_commit_that_stops_the_run_releases_the_writers_lease_and_no_one_elses(acme, workflow):
    run = _external_run(acme)
    lease_acquire(tenant=acme, run_id=run.pk, owner="w", ttl_seconds=30, expected_version=1)
    kept = _commit_releasing(acme, run, 1)
    run.refresh_from_db()
    assert run.lease_owner == "w" and kept.head.lease_owner == "w"  # still running: kept
    # Another owner's lapsed lease is not this writer's to release.
    Run.objects.filter(pk=run.pk).update(
        lease_owner="other", lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    failing = {"status": RunStatus.FAILED, "status_reason": "gave up"}
    ended = _commit_releasing(acme, run, kept.run_version, **failing)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.lease_owner == "other"
    assert ended.head.lease_owner == "other"
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, lease_owner="w")
    run.refresh_from_db()
    ended = _commit_releasing(acme, run, run.version, **failing)
    run.refresh_from_db()
    assert run.lease_owner == "" and run.lease_expires_at is None
    assert ended.head.lease_owner == "" and ended.head.lease_expires_at is None


# A worker run's start: the workflow's row, then BEGIN, three inserts (the run already
# pointing at its checkpoint 1, the checkpoint, the first command) and COMMIT.
RUN_CREATE_STATEMENTS = {"postgresql": 6, "sqlite": 6}


@pytest.mark.django_db(transaction=True)
def test_a_run_starts_in_a_pinned_number_of_statements(acme, noop_six, settings):
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    _worker_run(acme)  # the workflow's registration for this tenant, once
    with CaptureQueriesContext(connection) as queries:
        run = _worker_run(acme)
    LAST[:] = [q["sql"][:60] for q in queries.captured_queries]
    assert len(queries) == RUN_CREATE_STATEMENTS[connection.vendor], LAST
    run.refresh_from_db()
    checkpoint = Checkpoint.objects.get(run=run)
    assert (run.latest_checkpoint_id, run.latest_checkpoint_sha256) == (
        checkpoint.id,
        checkpoint.sha256,
    )
    assert run.budget_used["attempts_used"] == 0
    assert run_verify(tenant=acme, run_id=run.pk)["ok"]


# Statements of one HTTP commit (POST /runs/{id}/checkpoints) with a bearer token: the
# token with its member, tenant and permissions (one query, kept for the permission check),
# the head (with its integrity check) and the commit. Old main: 7 and 11; then 4 and 8.
HTTP_COMMIT_STATEMENTS = {"postgresql": 2, "sqlite": 6}


@pytest.mark.django_db(transaction=True)
def test_an_http_commit_reads_the_head_once_and_opens_no_envelope(acme, bob, workflow, api_as):
    api = api_as(bob, acme)
    run = _external_run(acme)
    url = f"/api/v1/runs/{run.pk}/checkpoints"
    first = {"expected_version": run.version, "state": "draft_answer", "step": "d"}
    # The first request of a token also records its use; the pin is for the steady state.
    assert api.post(url, {**first, "envelope": ENVELOPE_GROUPS}, format="json").status_code == 201
    body = {"expected_version": run.version + 1, "state": "review", "step": "r"}
    with CaptureQueriesContext(connection) as queries:
        response = api.post(url, {**body, "envelope": ENVELOPE_GROUPS}, format="json")
    assert response.status_code == 201, response.content
    LAST[:] = [" ".join(q["sql"].split())[:80] for q in queries.captured_queries]
    assert len(queries) == HTTP_COMMIT_STATEMENTS[connection.vendor], LAST
    # No checkpoint row is read to be decrypted: the integrity check is in the commit.
    checkpoint = Checkpoint._meta.db_table
    assert not [q for q in LAST if q.startswith("SELECT") and f'FROM "{checkpoint}"' in q], LAST


@pytest.mark.postgres
def test_on_postgresql_the_commits_integrity_check_probes_the_head_by_its_key(
    postgres_only, acme, workflow
):
    from cairn import clock
    from checkpoints.services import commit_sql
    from checkpoints.services.checkpoints import _commit_plan

    run = _external_run(acme)
    result = _commit(acme, run.pk, run.version)
    request = CommitRequest(
        expected_version=result.run_version,
        state="review",
        step="review",
        envelope=ENVELOPE_GROUPS,
        actor=ACTOR,
    )
    write = _commit_plan(acme, result.head, request, lease_now=clock.now()).write
    params = commit_sql._commit_params(write, embedded=False)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + commit_sql._PG_COMMIT, params)
        plan = "\n".join(line for (line,) in cursor.fetchall())
        transaction.set_rollback(True)
    # Correlated only through the run's columns, the head check hashed the whole table.
    assert f"Seq Scan on {Checkpoint._meta.db_table}" not in plan, plan
