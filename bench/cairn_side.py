"""Cairn's side of the benchmarks: a tenant, a one-state workflow, runs, and commits."""

from __future__ import annotations

import base64
import json
import uuid

from bench.common import payload

WORKFLOW = {
    "initial": "s",
    "states": ["s", "done"],
    "transitions": [["s", "done"]],
    "terminal": ["done"],
}


def tenant():  # noqa: ANN201
    from checkpoints.services.workflows import workflow_register
    from tenants.models import Tenant

    row, _ = Tenant.objects.get_or_create(slug="bench", defaults={"name": "Bench"})
    workflow_register(tenant=row, workflow_type="bench", version="1", definition=WORKFLOW)
    return row


def new_run(tenant):  # noqa: ANN001, ANN201
    from runtime.services.runs import run_create
    from tenants.services import Actor

    return run_create(
        tenant=tenant, workflow_type="bench", execution="external", actor=Actor.system("bench")
    )


def groups(state: dict) -> dict:
    """Every writable group, so a commit never needs to read its parent."""
    return {
        "inputs": {},
        "evidence": {"artifacts": [], "validators": [], "outputs": {"state": state}},
        "side_effects": [],
        "budgets": {},
        "control": {},
    }


class Committer:
    """Commits successive checkpoints to one run through ``checkpoint_commit``, passing the
    head its previous commit returned (as the worker does, and any caller that chains
    commits). With ``pass_head=False`` each commit reads the run first, as an HTTP client's
    commit does."""

    def __init__(self, tenant, size: int, *, pass_head: bool = True) -> None:  # noqa: ANN001
        from tenants.services import Actor

        self.tenant = tenant
        self.run = new_run(tenant)
        self.version = self.run.version
        self.groups = groups(payload(size))
        self.actor = Actor.system("bench")
        self.pass_head = pass_head
        self.head = None

    def __call__(self, _index: int = 0) -> None:
        from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit

        result = checkpoint_commit(
            tenant=self.tenant,
            run_id=self.run.id,
            head=self.head,
            request=CommitRequest(
                expected_version=self.version,
                state="s",
                step="s",
                envelope=self.groups,
                actor=self.actor,
            ),
        )
        self.version = result.run_version
        if self.pass_head:
            self.head = result.head


class RawCommitter:
    """The floor: the commit's three writes (run version update, checkpoint insert, outbox
    insert) in one transaction with raw psycopg on server-side prepared statements: five
    round trips (BEGIN, UPDATE, INSERT, INSERT, COMMIT). It does not read the run (Cairn
    needs the run's head for the version, lease, transition and parent-hash checks), and it
    stores the uncompressed envelope's bytes without validation, hashing or encryption."""

    def __init__(self, tenant, size: int, dsn: str) -> None:  # noqa: ANN001
        import psycopg

        from checkpoints.envelope import canonical_json

        self.conn = psycopg.connect(dsn, prepare_threshold=0)
        self.tenant_id = tenant.id
        self.run = new_run(tenant)
        self.version = self.run.version
        self.sequence = self.run.checkpoint_sequence
        body = canonical_json(groups(payload(size)))
        self.sealed = "v1.bench." + base64.urlsafe_b64encode(body + b"\0" * 28).decode()
        self.sha = "0" * 64

    def __call__(self, _index: int = 0) -> None:
        checkpoint_id = uuid.uuid4()
        with self.conn.transaction():
            cur = self.conn.execute(
                "UPDATE checkpoints_run SET version = version + 1, checkpoint_sequence = %s, "
                "latest_checkpoint_id = %s, latest_checkpoint_sha256 = %s, state = 's', "
                "step = 's', status = 'running', status_reason = '', next_eligible_at = NULL, "
                "budget_used = %s, updated_at = now() WHERE id = %s AND version = %s",
                [
                    self.sequence + 1,
                    checkpoint_id,
                    self.sha,
                    '{"attempts_used": 0}',
                    self.run.id,
                    self.version,
                ],
            )
            if cur.rowcount != 1:
                raise RuntimeError("lost the version race")
            self.conn.execute(
                "INSERT INTO checkpoints_checkpoint (id, tenant_id, run_id, sequence, parent_id, "
                "state, step, schema_version, envelope_sealed, key_id, sha256, parent_sha256, "
                "actor, is_evidence, created_at) VALUES (%s, %s, %s, %s, NULL, 's', 's', 2, %s, "
                "'bench', %s, %s, 'bench', false, now())",
                [
                    checkpoint_id,
                    self.tenant_id,
                    self.run.id,
                    self.sequence + 1,
                    self.sealed,
                    self.sha,
                    self.sha,
                ],
            )
            self.conn.execute(
                "INSERT INTO checkpoints_outboxmessage (tenant_id, run_id, kind, payload, "
                "created_at, sent_at, attempts) "
                "VALUES (%s, %s, 'run.checkpointed', %s, now(), now(), 0)",
                [self.tenant_id, self.run.id, json.dumps({"expected_version": self.version + 1})],
            )
        self.version += 1
        self.sequence += 1

    def close(self) -> None:
        self.conn.close()


RAW_CTE = """
WITH moved AS (
    UPDATE checkpoints_run SET version = version + 1, checkpoint_sequence = %(seq)s,
        latest_checkpoint_id = %(cp)s, latest_checkpoint_sha256 = %(sha)s, state = 's',
        step = 's', status = 'running', status_reason = '', next_eligible_at = NULL,
        budget_used = %(used)s::jsonb, updated_at = now()
     WHERE id = %(run)s AND version = %(version)s
    RETURNING id, tenant_id
), inserted AS (
    INSERT INTO checkpoints_checkpoint (id, tenant_id, run_id, sequence, parent_id, state,
        step, schema_version, envelope_sealed, key_id, sha256, parent_sha256, actor,
        is_evidence, created_at)
    SELECT %(cp)s, tenant_id, id, %(seq)s, NULL, 's', 's', 2, %(sealed)s, 'bench', %(sha)s,
        %(sha)s, 'bench', false, now() FROM moved
    RETURNING id
), queued AS (
    INSERT INTO checkpoints_outboxmessage (tenant_id, run_id, kind, payload, created_at,
        sent_at, attempts)
    SELECT tenant_id, id, 'run.checkpointed', %(payload)s::jsonb, now(), now(), 0 FROM moved
    RETURNING id
)
SELECT count(*) FROM inserted
"""


class RawCteCommitter(RawCommitter):
    """The physical floor: the same three writes as one data-modifying CTE on a prepared
    statement, in autocommit: one round trip, one transaction."""

    def __init__(self, tenant, size: int, dsn: str) -> None:  # noqa: ANN001
        super().__init__(tenant, size, dsn)
        self.conn.autocommit = True

    def __call__(self, _index: int = 0) -> None:
        checkpoint_id = uuid.uuid4()
        row = self.conn.execute(
            RAW_CTE,
            {
                "seq": self.sequence + 1,
                "cp": checkpoint_id,
                "sha": self.sha,
                "used": '{"attempts_used": 0}',
                "run": self.run.id,
                "version": self.version,
                "sealed": self.sealed,
                "payload": json.dumps({"expected_version": self.version + 1}),
            },
        ).fetchone()
        if row[0] != 1:
            raise RuntimeError("lost the version race")
        self.version += 1
        self.sequence += 1
