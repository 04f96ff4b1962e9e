"""The alert rules and the dashboard that ship with Cairn, checked by Prometheus's own tool.

``promtool`` (Debian's ``prometheus`` package, ``make prometheus-deps``) checks that
``/metrics`` is valid exposition, that the rules file loads, and fires each alert with
``promtool test rules`` against what ``/metrics`` served for a real scenario: runs,
leases, operations, approvals, the outbox and worker heartbeats written by Cairn's own
services, scraped two hours on. The same rules stay quiet on a healthy scrape. The Grafana
dashboard's every query parses as PromQL and names only families ``/metrics`` serves."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from django.utils import timezone

from approvals.services import approval_request_create
from checkpoints.models import Run
from checkpoints.services.workflows import workflow_register
from observability.metrics import metrics_text
from runtime.heartbeats import heartbeat_beat
from runtime.services.leases import lease_acquire
from runtime.services.operations import operation_mark_pending, operation_reserve
from runtime.services.runs import run_create
from tenants.services import Actor
from tests.approvals_support import at_review, draft
from tests.factories import SIMPLE_DEFINITION
from tests.metrics_golden import exposition_families, seed_every_series

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "observability" / "prometheus" / "cairn-rules.yml"
DASHBOARD = ROOT / "observability" / "grafana" / "cairn-dashboard.json"
LATER = timedelta(hours=2)
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*\})?) (\S+)$")
ACTOR = Actor.system("test")
FLOW = "reviewed"  # external runs with an approval state (the demo "research" has code)


@pytest.fixture
def flow(acme):  # noqa: ANN001, ANN201
    return workflow_register(
        tenant=acme, workflow_type=FLOW, version="1", definition=SIMPLE_DEFINITION
    )


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    path = shutil.which("promtool")
    assert path, "promtool is missing: `make prometheus-deps` installs Debian's prometheus"
    return subprocess.run(
        [path, *args], input=stdin, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_exposition_passes_promtool_check_metrics(client, settings, acme, globex, bob, charlie):
    seed_every_series(settings=settings, acme=acme, globex=globex, bob=bob, charlie=charlie)
    text = client.get("/metrics").content.decode()
    checked = promtool("check", "metrics", stdin=text)
    assert checked.returncode == 0 and not checked.stdout.strip(), checked.stdout + checked.stderr


def test_the_rules_file_passes_promtool_check_rules():
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 7 rules found" in checked.stdout


def _heartbeat(owner: str) -> None:
    heartbeat_beat(owner)


def _quiet(acme, bob) -> Run:  # noqa: ANN001
    """A healthy estate: a running run that just checkpointed, a live worker, and a run
    waiting for a decision that expires in two hours and ten minutes."""
    run_create(tenant=acme, workflow_type=FLOW, execution="external", actor=Actor(user=bob))
    _heartbeat("worker-a:1:aaaaaa")
    waiting = run_create(
        tenant=acme, workflow_type=FLOW, execution="external", actor=Actor(user=bob)
    )
    artifact = draft(acme)
    at_review(waiting, artifact)
    approval_request_create(
        tenant=acme,
        run_id=waiting.pk,
        artifact_id=artifact.pk,
        artifact_sha256=artifact.sha256,
        action="publish",
        actor=Actor(user=bob),
        expires_at=timezone.now() + LATER + timedelta(minutes=10),
    )
    return waiting


def _troubled(acme, bob, settings) -> None:  # noqa: ANN001
    """What goes wrong, each through the services that write it: a worker that crashes a
    run again and again, then dies holding it; a side effect sent and never confirmed; a
    command the dispatcher never published (scraped two hours on, so the workers have gone
    silent and the running runs have not checkpointed since)."""
    crashing = run_create(
        tenant=acme, workflow_type=FLOW, execution="external", actor=Actor(user=bob)
    )
    for attempt in range(5):  # the first lease, then four take-overs of an expired one
        lease_acquire(
            tenant=acme,
            run_id=crashing.pk,
            owner=f"worker-{attempt}",
            ttl_seconds=60,
            expected_version=crashing.version,
        )
        if attempt < 4:  # the lease runs out: its worker died
            Run.objects.filter(pk=crashing.pk).update(
                lease_expires_at=timezone.now() - timedelta(seconds=1)
            )
    assert Run.objects.get(pk=crashing.pk).restore_count == 4
    operation, _ = operation_reserve(
        tenant=acme,
        run_id=crashing.pk,
        idempotency_key=f"cairn.{crashing.pk}.publish.1",
        action="publish",
        target="blog/why",
        request_fingerprint="f" * 64,
        actor=ACTOR,
    )
    operation_mark_pending(operation_id=operation.pk, actor=ACTOR)
    settings.CAIRN_DISPATCH_ON_COMMIT = False
    # The demo's research run, for Cairn's workers: its first command is never published.
    run_create(tenant=acme, workflow_type="research", actor=Actor(user=bob))


def _series(exposition: str) -> list[dict[str, str]]:
    """Every sample of a scrape as a promtool input series, constant over the test."""
    series = []
    for line in exposition.splitlines():
        if line.startswith("#") or not line:
            continue
        match = SAMPLE.match(line)
        assert match, line
        series.append({"series": match[1], "values": f"{float(match[2])!r}+0x30"})
    return series


def _rules() -> dict[str, dict]:
    return {rule["alert"]: rule for rule in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]}


def _alert(rules: dict[str, dict], name: str, **labels: str) -> dict:
    """The alert promtool must find: the rule's labels and the series', and its
    annotations with the labels filled in."""
    rule = rules[name]
    annotations = {
        key: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels[m[1]], text)
        for key, text in rule["annotations"].items()
    }
    return {"exp_labels": {**rule["labels"], **labels}, "exp_annotations": annotations}


def test_each_alert_fires_on_a_real_scenario_and_none_on_a_quiet_one(
    acme, bob, flow, settings, tmp_path
):  # noqa: ANN001
    settings.CAIRN_STALLED_OPERATION_SECONDS = 600
    _quiet(acme, bob)
    _heartbeat("worker-a:1:aaaaaa")  # live at the scrape (dead after a few seconds' silence)
    quiet = metrics_text()
    _troubled(acme, bob, settings)
    troubled = metrics_text(now=timezone.now() + LATER)
    rules = _rules()
    expected = {
        "CairnCheckpointAge": [_alert(rules, "CairnCheckpointAge", status="running")],
        "CairnRunRestoredRepeatedly": [_alert(rules, "CairnRunRestoredRepeatedly", tenant="acme")],
        "CairnStalledOperations": [_alert(rules, "CairnStalledOperations", tenant="acme")],
        "CairnApprovalExpiringSoon": [_alert(rules, "CairnApprovalExpiringSoon", tenant="acme")],
        "CairnOutboxBacklog": [_alert(rules, "CairnOutboxBacklog")],
        "CairnWorkerDied": [_alert(rules, "CairnWorkerDied")],
        "CairnWorkersSilent": [_alert(rules, "CairnWorkersSilent", state="alive")],
    }
    assert set(expected) == set(rules), "every rule is fired by the scenario"
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": "a troubled estate",
                "interval": "1m",
                "input_series": _series(troubled),
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": name, "exp_alerts": alerts}
                    for name, alerts in expected.items()
                ],
            },
            {
                "name": "a healthy estate",
                "interval": "1m",
                "input_series": _series(quiet),
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": name, "exp_alerts": []} for name in rules
                ],
            },
        ],
    }
    path = tmp_path / "cairn-rules.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    tested = promtool("test", "rules", str(path))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def _dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel.get("targets", [])]


def test_the_dashboard_queries_parse_and_name_only_served_families(
    client, settings, acme, globex, bob, charlie, tmp_path
):  # noqa: ANN001
    dashboard = json.loads(DASHBOARD.read_text())
    queries = _dashboard_queries()
    assert len(queries) >= 10
    # Grafana's variables, as Grafana would substitute them.
    plain = [
        q.replace("$__rate_interval", "5m").replace("$tenant", ".*").replace("${tenant}", ".*")
        for q in queries
    ]
    recording = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": q} for i, q in enumerate(plain)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(recording))
    checked = promtool("check", "rules", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    seed_every_series(settings=settings, acme=acme, globex=globex, bob=bob, charlie=charlie)
    families = {f["name"] for f in exposition_families(client.get("/metrics").content.decode())}
    served = families | {
        f"{name}_{part}" for name in families for part in ("bucket", "sum", "count")
    }
    named = set(re.findall(r"\bcairn_[a-z_]+", " ".join(queries)))
    assert named <= served, named - served
    # Every family is on the dashboard, and the tenant variable lists the tenants.
    assert {
        n.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count") for n in named
    } == (families)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert "tenant" in variables and "cairn_runs" in variables["tenant"]["query"]["query"]
