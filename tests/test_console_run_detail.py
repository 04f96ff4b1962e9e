"""Run, checkpoint and artifact pages: what they show, who may see them, what is audited."""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from checkpoints.models import Artifact, Checkpoint, Run
from checkpoints.services.checkpoints import CommitRequest, checkpoint_commit
from console.run_reads import envelope_for_page
from tenants.access import ConsoleAccess
from tenants.models import AuditEvent
from tenants.services import Actor, permissions_of
from tests.console_data import DRAFT_TEXT, plain_run, story_run


def client_for(user) -> Client:  # noqa: ANN001
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def story(acme, bob, workflow) -> Run:  # noqa: ANN001
    return story_run(acme, bob)


def page(user, name: str, *args) -> str:  # noqa: ANN001, ANN002
    response = client_for(user).get(reverse(name, args=args))
    assert response.status_code == 200, response.status_code
    html = response.content.decode()
    assert "{#" not in html and "{%" not in html  # no template syntax leaks into the page
    return html


def test_the_run_page_shows_the_snapshot_and_budget_bars(bob, story):  # noqa: ANN001
    html = page(bob, "console:run_detail", story.pk)
    assert 'data-field="state">review<' in html
    assert 'data-field="version">3<' in html
    assert "Waiting Approval" in html
    assert "2 of 5 used · 3 left" in html  # attempts
    assert "600 of 1000 used · 400 left" in html  # tokens
    assert 'progress max="100" value="40"' in html
    assert "unlimited" in html  # cost has no limit


def test_the_run_page_shows_the_timeline_with_short_hashes(bob, story):  # noqa: ANN001
    html = page(bob, "console:run_detail", story.pk)
    sequences = re.findall(r'<tr data-sequence="(\d+)">', html)
    assert sequences == ["3", "2", "1"]
    for sequence in (1, 2, 3):
        assert reverse("console:checkpoint_detail", args=[story.pk, sequence]) in html
    for checkpoint in Checkpoint.objects.filter(run=story):
        assert f'title="{checkpoint.sha256}">{checkpoint.sha256[:12]}<' in html
    assert ">bob<" in html


def test_the_state_machine_highlights_the_path_and_the_current_state(bob, story):  # noqa: ANN001
    html = page(bob, "console:run_detail", story.pk)
    svg = re.search(r"<svg.*?</svg>", html, re.S).group(0)
    assert '<g class="node visited current" data-state="review">' in svg
    assert '<g class="node visited" data-state="collect_sources">' in svg
    assert '<g class="node" data-state="publish">' in svg
    assert 'class="edge taken"' in svg and 'data-edge="draft_answer→review"' in svg
    taken = re.findall(r'class="edge taken"[^>]*data-edge="([^"]+)"', svg)
    assert taken == ["collect_sources→draft_answer", "draft_answer→review"]
    assert "Path taken: collect_sources → draft_answer → review" in html


def test_the_evidence_lists_artifacts_validators_and_side_effects(bob, story):  # noqa: ANN001
    artifact = Artifact.objects.get(tenant=story.tenant)
    html = page(bob, "console:run_detail", story.pk)
    artifacts = re.search(r'<table id="artifacts">.*?</table>', html, re.S).group(0)
    assert "draft.txt" in artifacts and "draft" in artifacts and "text/plain" in artifacts
    assert f"{artifact.size}" in artifacts or "bytes" in artifacts
    assert artifact.sha256[:12] in artifacts
    assert "missing or mismatched" not in artifacts
    validators = re.search(r'<ul id="validators">.*?</ul>', html, re.S).group(0)
    assert "cites_sources" in validators and "under_500_words" in validators
    assert validators.count("badge-bad") == 1
    operations = re.search(r'<table id="operations">.*?</table>', html, re.S).group(0)
    assert f"publish-{story.pk}" in operations
    assert "prov-123" in operations and "Pending" in operations and "stalled" in operations


def test_opening_the_run_page_audits_the_envelope_read(bob, story):  # noqa: ANN001
    before = AuditEvent.objects.filter(run_id=story.pk, action="checkpoint.read").count()
    html = page(bob, "console:run_detail", story.pk)
    reads = AuditEvent.objects.filter(run_id=story.pk, action="checkpoint.read")
    assert reads.count() == before + 1
    assert reads.first().actor_label == "bob"
    audit = re.search(r'<table id="audit">.*?</table>', html, re.S).group(0)
    assert "checkpoint.read" in audit


def test_the_artifact_viewer_escapes_content_and_audits_the_read(bob, story):  # noqa: ANN001
    artifact = Artifact.objects.get(tenant=story.tenant)
    url = reverse("console:artifact_view", args=[story.pk, artifact.pk])
    response = client_for(bob).get(url, HTTP_HX_REQUEST="true")
    fragment = response.content.decode()
    assert "<script>alert" not in fragment
    assert "&lt;script&gt;alert(&#x27;draft&#x27;)&lt;/script&gt;" in fragment
    assert "The answer is 42." in fragment
    assert "<html" not in fragment  # an htmx swap gets the viewer only
    assert AuditEvent.objects.filter(action="artifact.read", target=str(artifact.pk)).exists()
    full = client_for(bob).get(url).content.decode()
    assert "<html" in full and "The answer is 42." in full
    assert DRAFT_TEXT.splitlines()[1] in full


def test_the_artifact_viewer_shows_only_an_artifact_the_run_names(bob, acme, story):  # noqa: ANN001
    # The read is audited against the run in the address: another run's artifact of the
    # same tenant must not be read (and recorded) under it.
    other = plain_run(acme, bob)
    artifact = Artifact.objects.get(tenant=story.tenant)
    reads = AuditEvent.objects.filter(action="artifact.read")
    before = reads.count()
    url = reverse("console:artifact_view", args=[other.pk, artifact.pk])
    assert client_for(bob).get(url).status_code == 404
    assert reads.count() == before


def test_the_snapshot_poll_returns_only_the_fresh_snapshot(bob, story):  # noqa: ANN001
    Run.objects.filter(pk=story.pk).update(restore_count=4)
    response = client_for(bob).get(
        reverse("console:run_snapshot", args=[story.pk]), HTTP_HX_REQUEST="true"
    )
    fragment = response.content.decode()
    assert fragment.lstrip().startswith('<section id="run-snapshot"')
    assert 'data-field="restore_count">4<' in fragment


def test_the_page_leaves_a_slot_for_the_operator_actions(bob, story):  # noqa: ANN001
    html = page(bob, "console:run_detail", story.pk)
    assert '<section id="run-actions"' in html


def test_a_fork_links_to_its_parent_and_the_parent_lists_its_forks(bob, acme, story):  # noqa: ANN001
    source = Checkpoint.objects.get(run=story, sequence=2)
    fork = plain_run(acme, bob)
    Run.objects.filter(pk=fork.pk).update(forked_from_run=story, forked_from_checkpoint=source)
    fork_html = page(bob, "console:run_detail", fork.pk)
    parent_box = re.search(r'<p class="card" id="fork-parent">.*?</p>', fork_html, re.S).group(0)
    assert reverse("console:run_detail", args=[story.pk]) in parent_box
    assert reverse("console:checkpoint_detail", args=[story.pk, 2]) in parent_box
    parent_html = page(bob, "console:run_detail", story.pk)
    forks = re.search(r'<ul id="forks">.*?</ul>', parent_html, re.S).group(0)
    assert reverse("console:run_detail", args=[fork.pk]) in forks
    assert "from checkpoint #2" in forks


def test_the_checkpoint_page_groups_the_envelope_and_diffs_its_parent(bob, story):  # noqa: ANN001
    html = page(bob, "console:checkpoint_detail", story.pk, 3)
    for group in (
        "identity",
        "position",
        "inputs",
        "evidence",
        "side_effects",
        "budgets",
        "control",
        "compatibility",
    ):
        assert f'id="group-{group}"' in html
    position = re.search(r'id="group-position".*?</section>', html, re.S).group(0)
    assert 'data-change="changed"' in position
    assert "position.state" not in position  # paths are relative to the group
    assert re.search(
        r"<td class=\"mono\">state .*?&quot;draft_answer&quot;.*?&quot;review&quot;", position, re.S
    )
    evidence = re.search(r'id="group-evidence".*?</section>', html, re.S).group(0)
    assert 'data-change="added"' in evidence and "cites_sources" in evidence
    inputs = re.search(r'id="group-inputs".*?</section>', html, re.S).group(0)
    assert "Unchanged since the parent." in inputs
    assert "Verified: 3 checkpoints" in html


def test_the_first_checkpoint_has_no_parent_to_compare(bob, story):  # noqa: ANN001
    html = page(bob, "console:checkpoint_detail", story.pk, 1)
    assert "No parent to compare with." in html


def test_the_checkpoint_page_reports_a_damaged_history(bob, story):  # noqa: ANN001
    # Checkpoints cannot be altered (PostgreSQL refuses it), so damage what can be:
    # the stored artifact and the run's head hash.
    from django.core.files.storage import default_storage

    artifact = Artifact.objects.get(tenant=story.tenant)
    with default_storage.open(artifact.storage_name, "wb") as handle:
        handle.write(b"garbage")
    Run.objects.filter(pk=story.pk).update(latest_checkpoint_sha256="0" * 64)
    html = page(bob, "console:checkpoint_detail", story.pk, 3)
    assert "Verification failed (2 problems)" in html
    assert f"checkpoint 3: Artifact {artifact.pk} cannot be read" in html
    assert "the run&#x27;s latest hash is not the last checkpoint&#x27;s hash" in html


def test_opening_a_checkpoint_audits_both_decrypting_reads(bob, story):  # noqa: ANN001
    page(bob, "console:checkpoint_detail", story.pk, 3)
    targets = set(
        AuditEvent.objects.filter(run_id=story.pk, action="checkpoint.read").values_list(
            "target", flat=True
        )
    )
    assert {"checkpoint 3", "checkpoint 2"} <= targets


def test_a_missing_checkpoint_is_a_404(bob, story):  # noqa: ANN001
    response = client_for(bob).get(reverse("console:checkpoint_detail", args=[story.pk, 99]))
    assert response.status_code == 404


RUN_PAGES = [
    "console:run_detail",
    "console:run_snapshot",
    "console:checkpoint_detail",
    "console:artifact_view",
]


def _args(name: str, run: Run) -> list:
    if name == "console:checkpoint_detail":
        return [run.pk, 1]
    if name == "console:artifact_view":
        return [run.pk, Artifact.objects.get(tenant=run.tenant).pk]
    return [run.pk]


@pytest.mark.parametrize("name", RUN_PAGES)
@pytest.mark.parametrize(
    ("who", "status"), [("alice", 200), ("bob", 200), ("carol", 403), ("charlie", 404)]
)
def test_who_may_open_a_run_page(request, story, name, who, status):  # noqa: ANN001
    """Another tenant's run does not exist for you (404); your own tenant's run is refused
    when your role does not allow it (403)."""
    user = request.getfixturevalue(who)
    response = client_for(user).get(reverse(name, args=_args(name, story)))
    assert response.status_code == status


def test_an_anonymous_visitor_is_sent_to_sign_in_from_a_run_page(story):  # noqa: ANN001
    response = Client().get(reverse("console:run_detail", args=[story.pk]))
    assert response.status_code == 302 and "/login/" in response["Location"]


def _count(user, url: str) -> int:  # noqa: ANN001
    client = client_for(user)
    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured.captured_queries)


def test_the_run_page_query_count_does_not_grow_with_history(bob, acme, story):  # noqa: ANN001
    url = reverse("console:run_detail", args=[story.pk])
    few = _count(bob, url)
    from checkpoints.models import ExternalOperation, OperationStatus
    from checkpoints.services.artifacts import artifact_store

    run = Run.objects.get(pk=story.pk)
    refs = []
    for index in range(15):
        artifact, _ = artifact_store(
            tenant=acme, data=f"doc {index}".encode(), media_type="text/plain", kind="source"
        )
        refs.append({"id": str(artifact.pk), "sha256": artifact.sha256})
        ExternalOperation.objects.create(
            tenant=acme,
            run=run,
            idempotency_key=f"k{index}",
            action="send",
            target="t",
            request_fingerprint="f",
            status=OperationStatus.CONFIRMED,
        )
    for index in range(15):
        checkpoint_commit(
            tenant=acme,
            run_id=run.pk,
            request=CommitRequest(
                expected_version=run.version + index,
                state="review",
                step=f"s{index}",
                envelope={
                    "evidence": {
                        "artifacts": refs,
                        "validators": [{"name": f"v{index}", "passed": True}],
                    }
                },
                actor=Actor(user=bob),
            ),
        )
        fork = plain_run(acme, bob)
        Run.objects.filter(pk=fork.pk).update(forked_from_run=run)
    assert _count(bob, url) == few
    html = client_for(bob).get(url).content.decode()
    assert len(re.findall(r'<tr data-sequence="', html)) == 18


def test_the_checkpoint_page_query_count_is_bounded_by_the_chain_not_the_content(
    bob,
    acme,
    story,  # noqa: ANN001
):
    url = reverse("console:checkpoint_detail", args=[story.pk, 3])
    assert _count(bob, url) == _count(bob, url)


def test_a_page_reads_an_envelope_audited_or_says_why_it_cannot(acme, bob, story):  # noqa: ANN001
    access = ConsoleAccess(
        tenant=acme, permissions=permissions_of(user=bob, tenant=acme), actor=Actor(user=bob)
    )
    envelope, error = envelope_for_page(access, run_id=story.pk, sequence=1)
    assert (envelope["identity"]["sequence"], error) == (1, "")
    assert AuditEvent.objects.filter(action="checkpoint.read", target="checkpoint 1").exists()
    missing, error = envelope_for_page(access, run_id=story.pk, sequence=999)
    assert (missing, error) == (None, "The run has no checkpoint 999.")
