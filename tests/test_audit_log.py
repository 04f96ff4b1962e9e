"""The audit log page: admins browse and filter it, page through it, and export it as CSV
or JSON lines (streamed, the export itself recorded)."""

from __future__ import annotations

import csv
import io
import json
import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from tenants.models import AuditEvent
from tenants.services import Actor, audit_record
from tests.markup_support import markup_problems


def client_for(user) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def log(acme, globex, bob):  # noqa: ANN001
    """A known log: 60 reads of one run by bob, a cancel by bob, a formula-looking reason,
    and an event of another tenant."""
    run_id = uuid.uuid4()
    for index in range(60):
        audit_record(
            tenant=acme,
            actor=Actor(user=bob, ip="10.0.0.7"),
            action="checkpoint.read",
            run_id=run_id,
            target=f"checkpoint {index}",
        )
    audit_record(
        tenant=acme,
        actor=Actor(user=bob),
        action="run.cancelled",
        run_id=run_id,
        reason='=HYPERLINK("http://evil")',
        details={"from": "running"},
    )
    audit_record(tenant=acme, actor=Actor.system("worker-1"), action="run.resumed")
    audit_record(tenant=globex, actor=Actor.system("globex-only"), action="run.resumed")
    return run_id


def rows_of(html: str) -> list[str]:
    return re.findall(r'<tr id="event-(\d+)"', html)


def test_operators_and_admins_see_the_audit_log(alice, bob, carol, charlie, log):  # noqa: ANN001
    assert client_for(alice).get("/audit/").status_code == 200
    # An operator on call reads what happened (and exports it); a reviewer does not.
    assert client_for(bob).get("/audit/").status_code == 200
    assert client_for(bob).get("/audit/export.csv").status_code == 200
    assert client_for(carol).get("/audit/").status_code == 403
    assert client_for(carol).get("/audit/export.csv").status_code == 403
    # Charlie is admin of globex: he sees globex's log, never acme's.
    html = client_for(charlie).get("/audit/").content.decode()
    assert "globex-only" in html and "worker-1" not in html


def test_the_log_pages_newest_first_by_keyset(alice, log):  # noqa: ANN001
    admin = client_for(alice)
    first = admin.get("/audit/").content.decode()
    ids = [int(i) for i in rows_of(first)]
    assert len(ids) == 50
    assert ids == sorted(ids, reverse=True)
    older = re.search(r'href="\?before=(\d+)" rel="next"', first).group(1)
    second = admin.get(f"/audit/?before={older}").content.decode()
    more = [int(i) for i in rows_of(second)]
    assert max(more) < min(ids)
    total = AuditEvent.objects.filter(tenant__slug="acme").count()
    assert len(ids) + len(more) == total
    assert 'rel="next"' not in second


def test_the_filters_narrow_by_action_actor_run_and_time(alice, acme, log):  # noqa: ANN001
    admin = client_for(alice)
    by_action = admin.get("/audit/", {"action": "run.cancelled"}).content.decode()
    assert len(rows_of(by_action)) == 1
    assert len(rows_of(admin.get("/audit/", {"actor": "worker-1"}).content.decode())) == 1
    by_run = admin.get("/audit/", {"run": str(log), "action": "checkpoint.read"})
    assert len(rows_of(by_run.content.decode())) == 50  # first page of 60
    nothing = admin.get("/audit/", {"run": str(uuid.uuid4())}).content.decode()
    assert rows_of(nothing) == [] and "No events match" in nothing
    AuditEvent.objects.filter(action="run.resumed").update(
        created_at=timezone.now() - timedelta(days=3)
    )
    since = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    recent = admin.get("/audit/", {"since": since, "action": "run.resumed"}).content.decode()
    assert rows_of(recent) == []
    until = admin.get("/audit/", {"until": since, "action": "run.resumed"}).content.decode()
    assert len(rows_of(until)) == 1


def test_a_bad_filter_is_a_400_with_the_field_named(alice, log):  # noqa: ANN001
    response = client_for(alice).get("/audit/", {"run": "not-a-uuid", "since": "yesterday"})
    assert response.status_code == 400
    assert b'id="id_run_error"' in response.content
    assert b'id="id_since_error"' in response.content
    refused = client_for(alice).get("/audit/export.csv", {"run": "x"})
    assert refused.status_code == 400
    assert b"Nothing was exported" in refused.content


def export_links(html: str) -> dict[str, str]:
    return dict(re.findall(r'<a id="export-(csv|jsonl)" href="([^"]+)"', html))


def test_an_invalid_filter_is_left_out_and_says_so_while_the_others_apply(alice, log):  # noqa: ANN001
    admin = client_for(alice)
    response = admin.get("/audit/", {"action": "run.cancelled", "run": "not-hex!"})
    html = response.content.decode()
    assert response.status_code == 400
    assert len(rows_of(html)) == 1  # the action filter still applies
    assert re.search(r'id="filters-left-out">[^<]*\(Run id\)', html)
    links = export_links(html)
    assert set(links) == {"csv", "jsonl"}
    for link in links.values():
        assert "action=run.cancelled" in link and "run=" not in link
    download = admin.get(links["csv"].replace("&amp;", "&"))
    assert download.status_code == 200
    assert len(b"".join(download.streaming_content).decode().splitlines()) == 2  # header + 1


def test_the_pager_carries_only_the_filters_that_apply(alice, log):  # noqa: ANN001
    html = (
        client_for(alice)
        .get("/audit/", {"action": "checkpoint.read", "since": "yesterday"})
        .content.decode()
    )
    older = re.search(r'<a href="\?([^"]+)" rel="next">', html).group(1)
    assert older.startswith("action=checkpoint.read&amp;before=")
    assert "since" not in older


def test_the_run_filter_takes_the_id_prefix_the_table_shows(alice, log):  # noqa: ANN001
    admin = client_for(alice)
    full = rows_of(
        admin.get("/audit/", {"run": str(log), "action": "run.cancelled"}).content.decode()
    )
    assert len(full) == 1
    for typed in (str(log)[:8], str(log)[:8].upper(), str(log)[:13], str(log).replace("-", "")):
        with CaptureQueriesContext(connection) as queries:
            response = admin.get("/audit/", {"run": typed, "action": "run.cancelled"})
        assert response.status_code == 200, typed
        assert rows_of(response.content.decode()) == full, typed
        events_sql = [
            q["sql"] for q in queries if "tenants_auditevent" in q["sql"] and "run_id" in q["sql"]
        ]
        # A range on the column, which its index answers (no cast, no LIKE).
        assert events_sql and not any("LIKE" in sql or "CAST" in sql for sql in events_sql)
    other = "0000" if not str(log).startswith("0000") else "ffff"
    assert rows_of(admin.get("/audit/", {"run": other}).content.decode()) == []
    for typed in ("abc", "xyz12345", "0" * 33):
        assert admin.get("/audit/", {"run": typed}).status_code == 400, typed


def test_the_filter_hints_are_shown_and_every_reference_on_the_page_resolves(alice, log):  # noqa: ANN001
    admin = client_for(alice)
    html = admin.get("/audit/").content.decode()
    assert 'aria-describedby="id_actor_helptext"' in html
    assert re.search(r'id="id_actor_helptext">username or worker<', html)
    assert markup_problems(html) == []
    invalid = admin.get("/audit/", {"run": "x", "since": "yesterday"}).content.decode()
    assert 'aria-describedby="id_run_helptext id_run_error"' in invalid
    assert markup_problems(invalid) == []


def test_the_details_column_shows_compact_json(alice, log):  # noqa: ANN001
    html = client_for(alice).get("/audit/", {"action": "run.cancelled"}).content.decode()
    assert "{&quot;from&quot;:&quot;running&quot;}" in html
    assert "&#x27;from&#x27;" not in html


def test_the_csv_export_streams_the_filtered_log_with_formulas_defused(alice, acme, log):  # noqa: ANN001
    response = client_for(alice).get("/audit/export.csv", {"run": str(log)})
    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith('attachment; filename="cairn-audit-acme-')
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(rows) == 61
    cancel = next(row for row in rows if row["action"] == "run.cancelled")
    assert cancel["reason"] == '\'=HYPERLINK("http://evil")'
    assert json.loads(cancel["details"]) == {"from": "running"}
    assert cancel["actor"] == "bob" and cancel["run_id"] == str(log)
    exported = AuditEvent.objects.get(tenant=acme, action="audit.exported")
    assert (exported.actor_label, exported.target) == ("alice", "csv")
    assert exported.details == {"run": str(log)}


def test_the_json_lines_export_has_one_object_per_event(alice, acme, log):  # noqa: ANN001
    response = client_for(alice).get("/audit/export.jsonl", {"actor": "bob"})
    assert response["Content-Type"] == "application/x-ndjson"
    lines = b"".join(response.streaming_content).decode().splitlines()
    events = [json.loads(line) for line in lines]
    assert len(events) == 61
    assert {e["actor"] for e in events} == {"bob"}
    assert events[0]["id"] > events[-1]["id"]
    assert set(events[0]) == {
        "id",
        "created_at",
        "action",
        "actor",
        "run_id",
        "target",
        "reason",
        "ip",
        "details",
    }
    assert events[-1]["ip"] == "10.0.0.7"
    assert events[0]["created_at"].endswith("Z")


def test_the_export_is_a_fixed_number_of_queries_however_long_the_log(
    alice, acme, log, django_assert_max_num_queries
):  # noqa: ANN001
    admin = client_for(alice)
    with django_assert_max_num_queries(12):
        response = admin.get("/audit/export.jsonl")
        assert len(b"".join(response.streaming_content).splitlines()) > 60
