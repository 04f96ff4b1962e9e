"""/metrics: every figure the issue names, and who may read them."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from approvals.models import ApprovalRequest
from checkpoints.models import ExternalOperation, OperationStatus, OutboxMessage, Run, RunStatus
from checkpoints.services.outbox import outbox_enqueue
from observability.metrics import metrics_text
from retention.policies import PolicyInput, retention_policy_save
from retention.services import retention_apply
from telemetry.counters import counters_rollup
from telemetry.latency import latency_rollup
from telemetry.models import CommitLatencySample
from tenants.services import Actor
from tests.retention_support import artifact, build

pytestmark = pytest.mark.django_db

SAMPLE = re.compile(r"^([a-z_]+)(?:\{([^}]*)\})? (\S+)$")
LABEL = re.compile(r'[a-z_]+="[^"]*"')


def parse(text: str) -> dict[str, float]:
    """{'name{labels}': value} for every sample line, the labels in alphabetical order (the
    order of a sample's labels carries no meaning); fails on a malformed line."""
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, f"not an exposition line: {line!r}"
        name, labels, value = match.groups()
        pairs = LABEL.findall(labels or "")
        assert ",".join(pairs) == (labels or ""), f"malformed labels: {line!r}"
        samples[name + ("{" + ",".join(sorted(pairs)) + "}" if pairs else "")] = float(value)
    return samples


def scrape(client, **extra) -> dict[str, float]:  # noqa: ANN001, ANN003
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    return parse(response.content.decode())


@pytest.fixture
def estate(acme, globex, bob, workflow):  # noqa: ANN001, ANN201
    runs = {
        "running": build(acme, bob, status=RunStatus.RUNNING, length=3),
        "restored": build(acme, bob, status=RunStatus.WAITING_RETRY, length=3),
        "done": build(acme, bob, status=RunStatus.SUCCEEDED, length=4),
        "failed": build(acme, bob, status=RunStatus.FAILED, length=3),
    }
    Run.objects.filter(pk=runs["restored"].run.pk).update(restore_count=7)
    Run.objects.filter(pk=runs["failed"].run.pk).update(restore_count=2)
    return runs


def _operation(run, key: str, age: timedelta, status=OperationStatus.PENDING):  # noqa: ANN001, ANN202
    op = ExternalOperation.objects.create(
        tenant_id=run.tenant_id,
        run=run,
        idempotency_key=key,
        action="publish",
        target="blog",
        request_fingerprint="f" * 64,
        status=status,
    )
    ExternalOperation.objects.filter(pk=op.pk).update(
        created_at=timezone.now() - age, updated_at=timezone.now() - age
    )
    return op


def test_it_serves_runs_by_status_and_restores(client, estate):
    samples = scrape(client)
    assert samples['cairn_runs{status="running",tenant="acme"}'] == 1
    assert samples['cairn_runs{status="waiting_retry",tenant="acme"}'] == 1
    assert samples['cairn_runs{status="succeeded",tenant="acme"}'] == 1
    assert samples['cairn_runs{status="cancelled",tenant="acme"}'] == 0
    assert samples["cairn_restores_total"] == 9
    assert samples["cairn_run_restores_max"] == 7


def test_it_serves_the_checkpoint_age_of_active_runs(client, estate):
    samples = scrape(client)
    assert samples["cairn_active_checkpoint_age_seconds_count"] == 2  # running, waiting_retry
    assert samples['cairn_active_checkpoint_age_seconds_bucket{le="+Inf"}'] == 2
    assert samples['cairn_active_checkpoint_age_seconds_bucket{le="60"}'] == 2
    # Two hours on, both heads are older than an hour but younger than six.
    later = parse(metrics_text(now=timezone.now() + timedelta(hours=2)))
    assert later['cairn_active_checkpoint_age_seconds_bucket{le="3600"}'] == 0
    assert later['cairn_active_checkpoint_age_seconds_bucket{le="21600"}'] == 2
    assert later["cairn_active_checkpoint_age_seconds_sum"] >= 2 * 7200


def test_it_counts_stalled_operations_per_tenant(client, settings, estate):
    settings.CAIRN_STALLED_OPERATION_SECONDS = 600
    run = estate["running"].run
    _operation(run, "old", timedelta(minutes=30))
    _operation(run, "fresh", timedelta(minutes=1))
    _operation(run, "done", timedelta(hours=2), status=OperationStatus.CONFIRMED)
    assert scrape(client)['cairn_stalled_operations{tenant="acme"}'] == 1


def test_it_counts_approvals_waiting_and_expired(client, acme, estate):
    run = estate["running"].run
    Run.objects.filter(pk=run.pk).update(status=RunStatus.WAITING_APPROVAL)
    finished = estate["done"].run
    draft = artifact(acme, b"draft under review")
    now = timezone.now()
    for on, action, status, expires in (
        (run, "publish", "pending", now + timedelta(hours=1)),  # waiting
        (run, "send", "pending", now - timedelta(minutes=1)),  # expired, not swept yet
        (run, "archive", "expired", now - timedelta(hours=1)),  # expired
        (run, "print", "approved", now + timedelta(hours=1)),  # neither
        # Left pending on a run that finished: nobody waits for it.
        (finished, "publish", "pending", now + timedelta(hours=1)),
    ):
        ApprovalRequest.objects.create(
            tenant=acme,
            run=on,
            run_version=run.version,
            checkpoint_sequence=run.checkpoint_sequence,
            artifact=draft,
            artifact_sha256=draft.sha256,
            action=action,
            requester_label="worker",
            status=status,
            expires_at=expires,
        )
    samples = scrape(client)
    assert samples['cairn_approvals{state="waiting",tenant="acme"}'] == 1
    assert samples['cairn_approvals{state="expired",tenant="acme"}'] == 2


def test_it_serves_the_outbox_lag(client, estate):
    stuck = estate["running"].run
    outbox_enqueue(run=stuck, kind="run.resume", payload={"run_id": str(stuck.pk)})
    oldest = OutboxMessage.objects.filter(sent_at__isnull=True).order_by("id").first()
    OutboxMessage.objects.filter(pk=oldest.pk).update(
        created_at=timezone.now() - timedelta(seconds=300)
    )
    lag = scrape(client)["cairn_outbox_lag_seconds"]
    assert 300 <= lag < 3600
    OutboxMessage.objects.update(sent_at=timezone.now())
    assert scrape(client)["cairn_outbox_lag_seconds"] == 0


def test_the_commit_latency_histogram_counts_every_commit_and_survives_rollup(client, estate):
    commits = sum(history.length - 1 for history in estate.values())
    samples = scrape(client)
    assert samples["cairn_checkpoint_commit_seconds_count"] == commits
    assert samples['cairn_checkpoint_commit_seconds_bucket{le="+Inf"}'] == commits
    buckets = [v for k, v in samples.items() if k.startswith("cairn_checkpoint_commit_seconds_b")]
    assert buckets == sorted(buckets)
    assert samples["cairn_checkpoint_commit_seconds_sum"] > 0
    CommitLatencySample.objects.update(created_at=timezone.now() - timedelta(minutes=5))
    assert latency_rollup() == commits
    assert not CommitLatencySample.objects.exists()
    after = scrape(client)
    latency = {k: v for k, v in samples.items() if k.startswith("cairn_checkpoint_commit")}
    assert {k: after[k] for k in latency} == pytest.approx(latency)


def test_retention_deletions_are_counted_and_survive_rollup(client, acme, estate):
    before = scrape(client)
    assert before['cairn_retention_deleted_total{kind="checkpoint"}'] == 0
    retention_policy_save(
        tenant=acme, data=PolicyInput(intermediate_days=30), actor=Actor.system("test")
    )
    report = retention_apply()
    samples = scrape(client)
    assert samples['cairn_retention_deleted_total{kind="checkpoint"}'] == report.checkpoints > 0
    assert samples['cairn_retention_deleted_bytes_total{kind="checkpoint"}'] == report.bytes
    assert counters_rollup() > 0
    rolled = scrape(client)
    assert rolled['cairn_retention_deleted_total{kind="checkpoint"}'] == report.checkpoints


def test_an_unauthorised_caller_is_refused(client, settings, estate):
    settings.CAIRN_METRICS_TOKEN = "metrics-secret-token"
    outside = {"REMOTE_ADDR": "203.0.113.9"}
    response = client.get("/metrics", **outside)
    assert response.status_code == 403
    assert b"cairn_runs" not in response.content
    response = client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong", **outside)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    # A wrong token is refused even from an allowed network.
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.post("/metrics").status_code == 405
    scrape(client, HTTP_AUTHORIZATION="Bearer metrics-secret-token", **outside)


def test_only_the_configured_networks_are_allowed_without_a_token(client, settings, estate):
    settings.CAIRN_METRICS_TOKEN = ""
    settings.CAIRN_METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8"]
    assert client.get("/metrics").status_code == 403  # 127.0.0.1 is no longer allowed
    scrape(client, REMOTE_ADDR="10.1.2.3")
    # Without a configured token, any presented token is wrong.
    response = client.get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer ")
    assert response.status_code == 401


def test_a_bad_network_setting_is_reported_by_the_system_checks(settings):
    from observability.checks import metrics_networks_check

    settings.CAIRN_METRICS_ALLOWED_NETWORKS = ["10.0.0.0/8", "not-a-network"]
    assert [e.id for e in metrics_networks_check(None)] == ["cairn.E101"]


def test_latency_samples_are_buffered_and_written_in_one_insert(settings, db):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from telemetry.latency import commit_latency_record, latency_flush

    settings.CAIRN_METRICS_FLUSH_SECONDS = 3600
    latency_flush()
    with CaptureQueriesContext(connection) as captured:
        for value in (0.01, 0.02, 0.03):
            commit_latency_record(seconds=value)
    assert not captured.captured_queries  # measuring adds no write to a commit
    with CaptureQueriesContext(connection) as captured:
        assert latency_flush() == 3
    assert len(captured.captured_queries) == 1
    assert sorted(CommitLatencySample.objects.values_list("seconds", flat=True)) == [
        0.01,
        0.02,
        0.03,
    ]


def test_a_full_buffer_is_written_in_one_statement_built_without_the_orm(settings, db, monkeypatch):
    # The commit that fills the buffer writes it: a thousand model instances and an INSERT
    # compiled for them (three, past SQLite's 999 parameters) cost that commit about 20 ms.
    from django.db import connection
    from django.db.models.sql.compiler import SQLCompiler, SQLInsertCompiler
    from django.test.utils import CaptureQueriesContext

    from telemetry.latency import MAX_PENDING, commit_latency_record, latency_flush

    settings.CAIRN_METRICS_FLUSH_SECONDS = 3600
    latency_flush()
    values = [i / 1000 for i in range(MAX_PENDING - 1)]
    for value in values:
        commit_latency_record(seconds=value)
    compiled = []
    for compiler in (SQLCompiler, SQLInsertCompiler):

        def counted(self, *args, original=compiler.as_sql, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
            compiled.append(self.query.model.__name__)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(compiler, "as_sql", counted)
    with CaptureQueriesContext(connection) as captured:
        commit_latency_record(seconds=0.5)  # the thousandth: due, so it flushes
    monkeypatch.undo()
    assert len(captured.captured_queries) == 1, [q["sql"][:80] for q in captured]
    assert compiled == []
    stored = list(CommitLatencySample.objects.values_list("seconds", "created_at"))
    assert sorted(seconds for seconds, _ in stored) == sorted([*values, 0.5])
    assert all(created is not None for _, created in stored)
